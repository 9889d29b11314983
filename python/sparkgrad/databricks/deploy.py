"""One-command deploy of sparkgrad and its notebooks to a Databricks workspace.

    config = load_config("sparkgrad-deploy.toml", overrides)
    wheel = wheel_of(config, build=False, log=print)     # described, not built
    print_plan(plan(config, wheel), host, auth, print)   # --dry-run: every request, secrets masked
    done = deploy(client, config, print)                 # checks each step, changes only what differs
    wait_and_report(client, run_now(client, done.job_id), timeout, print)   # --run-now --wait

The steps, in order: the wheel (a given file, or built by .ci/wheels.py for
one Python), its upload to a Unity Catalog volume (Files API), workspace
files (workspace import) or DBFS (for runtimes before 15.0), under a folder
named by the first 16 hex digits of its SHA-256, so identical content is
never sent twice and a changed wheel gets a new library path (a cluster does
not reinstall a library whose path it already has); the notebooks (import
only when the exported source differs); the library on an existing cluster
(started and waited for, then installed and waited for), or attached to the
job's own cluster; the job, found by name (created if none has it, reset if
its settings differ, refused if several have it). Run twice, the second run
changes nothing.

Not here: bundles, several tasks per job, permissions, Repos, secrets.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from sparkgrad.databricks.client import DBFS_BLOCK, TERMINAL_RUN_STATES, Client, found, notebook_job
from sparkgrad.errors import InvalidArgumentError, SparkgradTimeout, StateError

NOTEBOOK_HEADER = "# Databricks notebook source"
Print = Callable[[str], None]


# ---- configuration -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Schedule:
    cron: str  # quartz, 6 or 7 fields: "0 0 3 * * ?"
    timezone: str = "UTC"
    pause_status: str = "UNPAUSED"


@dataclasses.dataclass(frozen=True)
class DeployConfig:
    """What to deploy. Exactly one of ``wheel`` (a file) or ``python`` (X.Y:
    build with .ci/wheels.py); exactly one of ``cluster_id`` or ``new_cluster``."""

    job_name: str
    workspace_dir: str  # /Users/me@example.com/sparkgrad
    upload_dir: str  # /Volumes/c/s/v/libs, /Workspace/Users/.../libs or dbfs:/FileStore/...
    notebook: str  # the job task's notebook: a file name in notebooks_dir, .py optional
    notebooks_dir: str = "notebooks"
    wheel: str | None = None
    python: str | None = None
    cluster_id: str | None = None
    new_cluster: Mapping[str, Any] | None = None
    base_parameters: Mapping[str, str] = dataclasses.field(default_factory=dict)
    schedule: Schedule | None = None
    email_notifications: Mapping[str, Any] | None = None
    max_retries: int = 0
    timeout_seconds: int = 0
    cluster_timeout: float = 1200.0  # s for the cluster to be RUNNING
    library_timeout: float = 900.0  # s for the wheel to be INSTALLED

    def __post_init__(self) -> None:
        if (self.wheel is None) == (self.python is None):
            raise InvalidArgumentError("give exactly one of wheel (a .whl file) or python (X.Y, to build one)")
        if (self.cluster_id is None) == (self.new_cluster is None):
            raise InvalidArgumentError("give exactly one of cluster_id or new_cluster")
        if not self.upload_dir.startswith(("/Volumes/", "/Workspace/", "dbfs:/")):
            raise InvalidArgumentError(
                f"upload_dir {self.upload_dir!r} must start with /Volumes/, /Workspace/ or dbfs:/"
            )
        if not self.workspace_dir.startswith("/"):
            raise InvalidArgumentError(f"workspace_dir {self.workspace_dir!r} must be absolute")
        if self.upload_dir.startswith("dbfs:/") and self.new_cluster is not None:
            version = str(self.new_cluster.get("spark_version", ""))
            _check_dbfs_runtime(version, f"runtime {version}")

    @property
    def notebook_names(self) -> list[str]:
        """The notebook source files of notebooks_dir, by name without .py."""
        folder = pathlib.Path(self.notebooks_dir)
        names = [p.stem for p in sorted(folder.glob("*.py")) if _is_notebook(p)]
        if not names:
            raise InvalidArgumentError(f"no Databricks notebook sources (*.py) in {folder}")
        if self.notebook.removesuffix(".py") not in names:
            raise InvalidArgumentError(f"the job's notebook {self.notebook!r} is not among {names} in {folder}")
        return names

    @property
    def job_notebook(self) -> str:
        return f"{self.workspace_dir.rstrip('/')}/{self.notebook.removesuffix('.py')}"


CONFIG_KEYS = {f.name for f in dataclasses.fields(DeployConfig)}
ALTERNATIVES = (("wheel", "python"), ("cluster_id", "new_cluster"))


def load_config(path: str | os.PathLike | None, overrides: Mapping[str, Any]) -> DeployConfig:
    """The DeployConfig of a sparkgrad-deploy.toml (if given) with overrides
    (flags; None values ignored) on top: an override of wheel or python,
    cluster_id or new_cluster replaces the file's other one. Relative paths
    in the file are relative to the file's folder."""
    values: dict[str, Any] = {}
    if path is not None:
        values = _read_toml(pathlib.Path(path))
        base = pathlib.Path(path).resolve().parent
        for key in ("wheel", "notebooks_dir"):
            if isinstance(values.get(key), str):
                values[key] = str(base / values[key])
    for key, value in overrides.items():
        if value is not None:
            values[key] = value
            for pair in ALTERNATIVES:  # a flag replaces the file's alternative to it
                if key in pair:
                    values.pop(pair[1 - pair.index(key)], None)
    if isinstance(values.get("schedule"), Mapping):
        values["schedule"] = Schedule(**values["schedule"])
    elif isinstance(values.get("schedule"), str):
        values["schedule"] = Schedule(values["schedule"])
    unknown = sorted(set(values) - CONFIG_KEYS)
    if unknown:
        raise InvalidArgumentError(f"unknown deploy settings {unknown} (known: {sorted(CONFIG_KEYS)})")
    missing = [k for k in ("job_name", "workspace_dir", "upload_dir", "notebook") if not values.get(k)]
    if missing:
        raise InvalidArgumentError(f"deploy needs {', '.join(missing)} (in sparkgrad-deploy.toml or as flags)")
    values["base_parameters"] = {str(k): str(v) for k, v in values.get("base_parameters", {}).items()}
    try:
        return DeployConfig(**values)
    except TypeError as exc:
        raise InvalidArgumentError(f"bad deploy settings: {exc}") from None


def _read_toml(path: pathlib.Path) -> dict[str, Any]:
    """tomllib (3.11+), else tomli if installed; on Python 3.10 without tomli
    the settings must come as flags."""
    try:
        import tomllib  # type: ignore[import-not-found]
    except ImportError:
        try:
            import tomli as tomllib  # type: ignore[import-not-found,no-redef]
        except ImportError:
            raise InvalidArgumentError(
                f"reading {path} needs Python 3.11+ or the tomli package (pip install tomli); or give flags"
            ) from None
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgumentError(f"{path} is not valid TOML: {exc}") from None
    return dict(data.get("deploy", data))


# ---- the plan ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    path: str
    payload: Mapping[str, Any] | None = None  # JSON body, content fields shown as their size
    note: str = ""
    query: Mapping[str, Any] | None = None

    def render(self) -> str:
        """The request line as the client sends it (query encoded the same way)."""
        path = self.path if not self.query else f"{self.path}?{urllib.parse.urlencode(self.query)}"
        body = f" {json.dumps(_masked(self.payload), sort_keys=True)}" if self.payload is not None else ""
        note = f"   # {self.note}" if self.note else ""
        return f"{self.method} {urllib.parse.quote(path, safe='/?=&%')}{body}{note}"


@dataclasses.dataclass(frozen=True)
class Step:
    """One thing deploy makes true: the requests that check it, then the
    ones made only when the check finds it is not so."""

    name: str
    what: str
    checks: tuple[Request, ...]
    changes: tuple[Request, ...]


@dataclasses.dataclass(frozen=True)
class Wheel:
    local: pathlib.Path | None  # None while not built yet (dry run)
    name: str
    size: int
    sha256: str
    remote: str  # where it goes: /Volumes/..., /Workspace/... or dbfs:/...


def wheel_of(config: DeployConfig, *, build: bool, log: Print) -> Wheel:
    """The wheel to deploy: the given file, or the one .ci/wheels.py builds
    for config.python (built only when build, else described)."""
    if config.wheel is not None:
        local = pathlib.Path(config.wheel)
    elif build:
        local = build_wheel(config.python or "", log)
    else:
        name = f"sparkgrad-<version>-cp{(config.python or '').replace('.', '')}-...whl"
        log(f"wheel: built for Python {config.python} by .ci/wheels.py when deploying (a dry run builds nothing)")
        return Wheel(None, name, 0, "", f"{config.upload_dir.rstrip('/')}/<sha256>/{name}")
    if not local.is_file() or local.suffix != ".whl":
        raise InvalidArgumentError(f"wheel {local} is not a .whl file")
    data = local.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    return Wheel(local, local.name, len(data), sha, f"{config.upload_dir.rstrip('/')}/{sha[:16]}/{local.name}")


def build_wheel(python: str, log: Print) -> pathlib.Path:
    """Builds the manylinux wheel for Python X.Y with .ci/wheels.py (from a
    source checkout: the current folder or one above it) into its dist/."""
    here = pathlib.Path.cwd().resolve()
    root = next((p for p in [here, *here.parents] if (p / ".ci" / "wheels.py").is_file()), None)
    if root is None:
        raise InvalidArgumentError(
            "python= builds the wheel from a sparkgrad checkout: run deploy in one, or give wheel="
        )
    cmd = [sys.executable, str(root / ".ci" / "wheels.py"), "wheels", "--out", str(root / "dist"), python]
    log(f"  building  {' '.join(cmd)}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise InvalidArgumentError(f"building the cp{python.replace('.', '')} wheel failed:\n{tail}")
    tag = "cp" + python.replace(".", "")
    built = sorted((root / "dist").glob(f"sparkgrad-*-{tag}-{tag}-*.whl"), key=lambda p: p.stat().st_mtime)
    if not built:
        raise InvalidArgumentError(f"wheels.py succeeded but no {tag} wheel is in {root / 'dist'}")
    return built[-1]


def upload_requests(wheel: Wheel) -> tuple[tuple[Request, ...], tuple[Request, ...]]:
    remote, size = wheel.remote, f"<{wheel.size} bytes>"
    if remote.startswith("/Volumes/"):
        api = f"/api/2.0/fs/files{remote}"
        return (Request("HEAD", api, note="is it there?"),), (
            Request("PUT", api, query={"overwrite": "false"}, note=size),
        )
    if remote.startswith("/Workspace/"):
        path = remote.removeprefix("/Workspace")
        check = Request("GET", "/api/2.0/workspace/get-status", query={"path": path}, note="is it there?")
        mkdirs = Request("POST", "/api/2.0/workspace/mkdirs", {"path": path.rsplit("/", 1)[0]})
        put = Request(
            "POST",
            "/api/2.0/workspace/import",
            {"path": path, "format": "AUTO", "content": size, "overwrite": False},
        )
        return (check,), (mkdirs, put)
    path = remote.removeprefix("dbfs:")
    check = Request("GET", "/api/2.0/dbfs/get-status", query={"path": path}, note="is it there?")
    if wheel.size <= DBFS_BLOCK:
        return (check,), (Request("POST", "/api/2.0/dbfs/put", {"path": path, "contents": size, "overwrite": False}),)
    blocks = -(-wheel.size // DBFS_BLOCK)
    return (check,), (
        Request("POST", "/api/2.0/dbfs/create", {"path": f"{path}.sparkgrad-upload-<random>", "overwrite": False}),
        Request("POST", "/api/2.0/dbfs/add-block", {"handle": "<handle>", "data": "<1 MB>"}, note=f"x {blocks}"),
        Request("POST", "/api/2.0/dbfs/close", {"handle": "<handle>"}),
        Request("POST", "/api/2.0/dbfs/move", {"source_path": "<temporary name>", "destination_path": path}),
    )


def job_settings(config: DeployConfig, wheel: Wheel) -> dict[str, Any]:
    schedule = config.schedule
    return notebook_job(
        config.job_name,
        config.job_notebook,
        base_parameters=config.base_parameters,
        existing_cluster_id=config.cluster_id,
        new_cluster=config.new_cluster,
        libraries=None if config.cluster_id else [{"whl": wheel.remote}],
        quartz_cron_expression=schedule.cron if schedule else None,
        timezone_id=schedule.timezone if schedule else "UTC",
        pause_status=schedule.pause_status if schedule else "UNPAUSED",
        email_notifications=config.email_notifications,
        max_retries=config.max_retries,
        timeout_seconds=config.timeout_seconds,
    )


def plan(config: DeployConfig, wheel: Wheel, *, jobs_api: str = "2.1", run_now: bool = False) -> list[Step]:
    """Every step of the deploy with the requests it makes, computed offline."""
    steps: list[Step] = []
    checks, changes = upload_requests(wheel)
    steps.append(Step("upload", wheel.remote, checks, changes))
    ws = config.workspace_dir.rstrip("/")
    steps.append(Step("folder", ws, (), (Request("POST", "/api/2.0/workspace/mkdirs", {"path": ws}),)))
    for name in config.notebook_names:
        path = f"{ws}/{name}"
        size = len(_notebook_source(config, name).encode())
        check = Request(
            "GET", "/api/2.0/workspace/export", query={"path": path, "format": "SOURCE"}, note="same source?"
        )
        imp = {"path": path, "format": "SOURCE", "language": "PYTHON", "content": f"<{size} bytes>", "overwrite": True}
        steps.append(Step("notebook", path, (check,), (Request("POST", "/api/2.0/workspace/import", imp),)))
    if config.cluster_id:
        cid = config.cluster_id
        lib = {"whl": wheel.remote}
        steps.append(
            Step(
                "cluster",
                cid,
                (Request("GET", "/api/2.1/clusters/get", query={"cluster_id": cid}, note="until RUNNING"),),
                (Request("POST", "/api/2.1/clusters/start", {"cluster_id": cid}, note="if TERMINATED"),),
            )
        )
        status = Request("GET", "/api/2.0/libraries/cluster-status", query={"cluster_id": cid}, note="installed?")
        install = Request("POST", "/api/2.0/libraries/install", {"cluster_id": cid, "libraries": [lib]})
        steps.append(
            Step("library", json.dumps(lib), (status,), (install, dataclasses.replace(status, note="until INSTALLED")))
        )
    jobs = f"/api/{jobs_api}/jobs"
    settings = job_settings(config, wheel)
    steps.append(
        Step(
            "job",
            config.job_name,
            (
                Request(
                    "GET", f"{jobs}/list", query={"name": config.job_name, "limit": 100}, note="one job of this name?"
                ),
                Request("GET", f"{jobs}/get", query={"job_id": "<id>"}, note="same settings?"),
            ),
            (
                Request("POST", f"{jobs}/create", settings, note="if no job has the name"),
                Request("POST", f"{jobs}/reset", {"job_id": "<id>", "new_settings": settings}, note="if it differs"),
            ),
        )
    )
    if run_now:
        run = (
            Request("POST", f"{jobs}/run-now", {"idempotency_token": "<random>", "job_id": "<id>"}),
            Request("GET", f"{jobs}/runs/get", query={"run_id": "<run>"}, note="until it ends"),
            Request("GET", f"{jobs}/runs/get", query={"run_id": "<run>"}, note="its task run"),
            Request("GET", f"{jobs}/runs/get-output", query={"run_id": "<task run>"}, note="exit value, error"),
        )
        steps.append(Step("run", config.job_name, (), run))
    return steps


SECRET_KEY = re.compile(r"token|secret|password|credential", re.IGNORECASE)


def _masked(value: Any, key: str = "") -> Any:
    """value with what a key names as secret (spark_env_vars' DB_TOKEN, a
    password parameter) masked; idempotency tokens are not secrets."""
    if isinstance(value, Mapping):
        return {k: _masked(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, key) for v in value]
    if isinstance(value, str) and SECRET_KEY.search(key) and key != "idempotency_token" and not value.startswith("<"):
        return mask(value)
    return value


def mask(secret: str | None) -> str:
    if not secret:
        return "<none>"
    return secret[:4] + "*" * 8 if len(secret) > 8 else "*" * 8


def print_plan(steps: Sequence[Step], host: str, auth: str, log: Print) -> None:
    log(f"dry run: nothing is sent to {host}; every request carries Authorization: {auth}")
    for step in steps:
        log(f"{step.name} {step.what}")
        for r in step.checks:
            log(f"  check   {r.render()}")
        for r in step.changes:
            log(f"  change  {r.render()}")


# ---- apply ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Deployed:
    job_id: int
    changes: int  # how many steps changed something


def deploy(client: Client, config: DeployConfig, log: Print, *, wheel: Wheel | None = None) -> Deployed:
    """Makes every step of plan(config) true, changing only what differs;
    prints one line per step."""
    log(f"deploying job {config.job_name!r} to {client.config.host}")
    if wheel is None:
        wheel = wheel_of(config, build=True, log=log)
    log(f"  wheel     {_shown(wheel.local)} ({_size(wheel.size)}, sha256 {wheel.sha256[:16]})")
    changes = 0

    def report(name: str, what: str, changed: bool, how: str = "") -> None:
        nonlocal changes
        changes += changed
        log(f"  {name:<9} {what}: {how or ('changed' if changed else 'unchanged')}")

    report("upload", wheel.remote, *_upload(client, wheel))
    ws = config.workspace_dir.rstrip("/")
    client.workspace_mkdirs(ws)
    for name in config.notebook_names:
        report("notebook", f"{ws}/{name}", *_import_notebook(client, f"{ws}/{name}", _notebook_source(config, name)))
    if config.cluster_id:
        cluster = client.clusters_get(config.cluster_id)  # once: the runtime check and the first wait
        if config.upload_dir.startswith("dbfs:/"):
            version = str(cluster.get("spark_version", ""))
            _check_dbfs_runtime(version, f"cluster {config.cluster_id} runs {version}, which")
        report("library", f"{wheel.name} on {config.cluster_id}", *_install(client, config, cluster, wheel, log))
    job_id, changed, how = _upsert_job(client, job_settings(config, wheel))
    report("job", f"{config.job_name} (job {job_id})", changed, how)
    log(f"deployed: {changes} change{'s' if changes != 1 else ''}")
    return Deployed(job_id, changes)


def _upload(client: Client, wheel: Wheel) -> tuple[bool, str]:
    local, remote = wheel.local, wheel.remote
    assert local is not None
    path = remote.removeprefix("/Workspace")

    def to_workspace() -> None:
        client.workspace_mkdirs(path.rsplit("/", 1)[0])
        client.workspace_import(path, local.read_bytes(), format="AUTO", language=None, overwrite=False)

    if remote.startswith("/Volumes/"):
        check, send = partial(client.files_head, remote), partial(client.files_put, remote, local, overwrite=False)
    elif remote.startswith("/Workspace/"):
        check, send = partial(client.workspace_get_status, path), to_workspace
    else:
        check, send = partial(client.dbfs_get_status, remote), partial(client.dbfs_put, remote, local, overwrite=False)
    if found(check) is not None:
        return False, "unchanged (same sha256)"
    # Volumes and workspace files: one PUT / one import, which the service
    # applies whole or not at all (Client.files_put); DBFS: a stream to a
    # temporary name, then a move (Client.dbfs_put). Either way a cut upload
    # shows no half wheel under its name.
    send()
    return True, f"uploaded {_size(wheel.size)}"


def _import_notebook(client: Client, path: str, source: str) -> tuple[bool, str]:
    exported = found(lambda: client.workspace_export(path))
    current = None if exported is None else exported.decode("utf-8", "replace")
    if current is not None and _same_source(current, source):
        return False, "unchanged"
    client.workspace_import(path, source, format="SOURCE", language="PYTHON", overwrite=True)
    return True, "imported" if current is None else "updated"


def _install(
    client: Client, config: DeployConfig, cluster: Mapping[str, Any], wheel: Wheel, log: Print
) -> tuple[bool, str]:
    """cluster: the cluster's clusters_get answer, just fetched."""
    cid = config.cluster_id
    assert cid is not None
    lib = {"whl": wheel.remote}
    state = cluster.get("state")
    if state != "RUNNING":
        start = " starting it," if state == "TERMINATED" else ""
        log(f"  cluster   {cid}: {state},{start} waiting up to {config.cluster_timeout:g} s for RUNNING")
    try:
        client.wait_cluster_running(cid, timeout=config.cluster_timeout, info=cluster)
    except SparkgradTimeout:
        raise SparkgradTimeout(
            f"cluster {cid} did not reach RUNNING within {config.cluster_timeout:g} s (cluster_timeout)"
        ) from None
    statuses = [s for s in client.libraries_cluster_status(cid) if s.get("library") == lib]
    if statuses and statuses[0].get("status") == "INSTALLED":
        return False, "unchanged (INSTALLED)"
    if not statuses:
        client.libraries_install(cid, [lib])
    log(f"  library   {wheel.name} on {cid}: installing, waiting up to {config.library_timeout:g} s")
    try:
        client.wait_libraries(cid, [lib], timeout=config.library_timeout)
    except SparkgradTimeout:
        raise SparkgradTimeout(
            f"{wheel.name} was not INSTALLED on cluster {cid} within {config.library_timeout:g} s (library_timeout)"
        ) from None
    return True, "installed"


def jobs_named(client: Client, name: str) -> list[dict[str, Any]]:
    """The jobs named exactly name (the service's name filter ignores case)."""
    return [j for j in client.jobs_list(name=name) if j.get("settings", {}).get("name") == name]


def _upsert_job(client: Client, settings: dict[str, Any]) -> tuple[int, bool, str]:
    name = settings["name"]
    named = jobs_named(client, name)
    if len(named) > 1:
        ids = ", ".join(str(j["job_id"]) for j in named)
        raise StateError(
            f"{len(named)} jobs are named {name!r} (job ids {ids}): deploy updates one job by name; "
            "delete or rename the others"
        )
    schedule = settings.get("schedule")
    when = ", no schedule"
    if schedule:
        when = f", schedule {schedule['quartz_cron_expression']!r} {schedule['timezone_id']} {schedule['pause_status']}"
    if not named:
        return client.jobs_create(settings), True, "created" + when
    job_id = int(named[0]["job_id"])
    current = client.jobs_get(job_id).get("settings", {})
    if _covers(current, settings) and _same_shape(current, settings):
        return job_id, False, "unchanged"
    client.jobs_reset(job_id, settings)
    return job_id, True, "updated" + when


# ---- runs ----------------------------------------------------------------------------


def run_page_url(client: Client, run: Mapping[str, Any]) -> str:
    return run.get("run_page_url") or f"{client.config.host}/#job/{run.get('job_id')}/run/{run['run_id']}"


def run_now(client: Client, job_id: int, params: Mapping[str, str] | None = None) -> int:
    return client.jobs_run_now(job_id, notebook_params=params, idempotency_token=f"sparkgrad-{uuid.uuid4().hex}")


def wait_and_report(client: Client, run_id: int, timeout: float, log: Print) -> int:
    """Follows the run, printing its page once and each state change, then
    the notebook's exit value; 0 on SUCCESS, 1 otherwise (error and trace
    printed). Still running at timeout: SparkgradTimeout saying on what."""
    last: tuple[str, str] | None = None
    run: dict[str, Any] = {}
    try:
        for n in client._polls(timeout, f"run {run_id} to end"):
            run = client.runs_get(run_id)
            if n == 0:
                log(f"run {run_id}: {run_page_url(client, run)}")
            state = run.get("state", {})
            now = (state.get("life_cycle_state", "?"), state.get("result_state", ""))
            if now != last:
                message = f" ({state['state_message']})" if state.get("state_message") else ""
                log(f"  {time.strftime('%H:%M:%S')} {' '.join(x for x in now if x)}{message}")
                last = now
            if now[0] in TERMINAL_RUN_STATES:
                break
    except SparkgradTimeout:
        state = run.get("state", {})
        raise SparkgradTimeout(
            f"run {run_id} is still {state.get('life_cycle_state', 'unknown')} after {timeout:g} s "
            f"(--timeout; waited for it to end): {run_page_url(client, run) if run else ''}; "
            f"it goes on: `sparkgrad databricks jobs cancel {run_id}` stops it"
        ) from None
    output = client.runs_get_output(run_id)
    result = run.get("state", {}).get("result_state") or run.get("state", {}).get("life_cycle_state")
    if result != "SUCCESS":  # FAILED, CANCELED, TIMEDOUT, SKIPPED, INTERNAL_ERROR, ...
        log(f"run {run_id} {result}: {output.get('error') or run.get('state', {}).get('state_message', '')}")
        if output.get("error_trace"):
            log(output["error_trace"].rstrip())
        return 1
    value = (output.get("notebook_output") or {}).get("result")
    log(f"exit value: {value if value is not None else '(none)'}")
    return 0


# ---- helpers -------------------------------------------------------------------------


def _is_notebook(path: pathlib.Path) -> bool:
    with open(path, encoding="utf-8") as f:
        return f.readline().strip() == NOTEBOOK_HEADER


def _notebook_source(config: DeployConfig, name: str) -> str:
    return (pathlib.Path(config.notebooks_dir) / f"{name}.py").read_text(encoding="utf-8")


def _same_source(a: str, b: str) -> bool:
    """Equal up to what the workspace rewrites on export: line endings,
    trailing blanks, and the blank lines around cell separators."""
    return _normal_source(a) == _normal_source(b)


def _normal_source(text: str) -> str:
    text = "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").split("\n"))
    return re.sub(r"\n*# COMMAND -{10}\n*", "\n# COMMAND ----------\n", text).strip()


def _covers(current: Any, wanted: Any) -> bool:
    """Whether current has every value of wanted (the service adds defaults of its own)."""
    if isinstance(wanted, Mapping):
        return isinstance(current, Mapping) and all(k in current and _covers(current[k], v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return isinstance(current, list) and len(current) == len(wanted) and all(map(_covers, current, wanted))
    return current == wanted


JOB_OPTIONAL = ("schedule", "email_notifications", "job_clusters")
TASK_OPTIONAL = ("libraries", "existing_cluster_id", "new_cluster", "job_cluster_key")


def _same_shape(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether the settings deploy leaves out are absent there too (a schedule
    or the task's libraries removed since the last deploy)."""
    if any((k in current) != (k in wanted) for k in JOB_OPTIONAL):
        return False
    tasks = zip(current.get("tasks", []), wanted.get("tasks", []), strict=False)  # lengths: _covers
    return all((k in c) == (k in w) for c, w in tasks for k in TASK_OPTIONAL)


def _runtime_major(spark_version: str) -> int | None:
    m = re.match(r"(\d+)\.", spark_version)
    return int(m.group(1)) if m else None


def _check_dbfs_runtime(version: str, subject: str) -> None:
    """Refuses a DBFS upload_dir for a runtime of 15.0 or later; subject
    says whose runtime ("runtime 15.4.x-scala2.12", "cluster C runs ..., which")."""
    major = _runtime_major(version)
    if major is not None and major >= 15:
        raise InvalidArgumentError(
            f"{subject} does not install libraries from DBFS (disabled from 15.0): "
            "upload to /Volumes/... or /Workspace/..."
        )


def _shown(path: pathlib.Path | None) -> str:
    """path relative to the current folder when it is under it."""
    if path is None:
        return "(not built)"
    try:
        return str(path.resolve().relative_to(pathlib.Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MB" if n >= 1 << 20 else f"{n / 1024:.1f} kB"
