"""The ``sparkgrad databricks`` subcommand: deploy, jobs, fs and workspace.

    sparkgrad databricks deploy [--config sparkgrad-deploy.toml] [--wheel W | --python X.Y] [...]
                                [--dry-run] [--run-now [--wait] [--timeout S] [--param K=V ...]]
    sparkgrad databricks jobs run JOB [--param K=V ...] [--wait] [--timeout S]   (JOB: id or name)
    sparkgrad databricks jobs status|cancel|output RUN_ID
    sparkgrad databricks jobs list [--name NAME]
    sparkgrad databricks fs cp SRC DST | ls PATH | rm [-r] PATH   (dbfs:/... or /Volumes/...)
    sparkgrad databricks workspace import LOCAL PATH [--format F] | export PATH [LOCAL]

The workspace and its credentials come from --host / --profile, the
environment or ~/.databrickscfg (sparkgrad.databricks.config); no secret is
taken as a flag. A failure prints one line, ``sparkgrad databricks ACTION:
ErrorType: message``, and exits 1; a run that ends other than SUCCESS exits 1.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Callable
from typing import Any

from sparkgrad.databricks.commands import param, params
from sparkgrad.errors import InvalidArgumentError, SparkgradError

DEFAULT_CONFIG = "sparkgrad-deploy.toml"


def _out(line: str) -> None:
    print(line, flush=True)


def add_databricks_command(sub: argparse._SubParsersAction) -> Callable[[argparse.Namespace], int]:
    p = sub.add_parser("databricks", help="deploy to a Databricks workspace; jobs, files and notebooks there")
    p.add_argument("--host", default=None, help="workspace URL (default: DATABRICKS_HOST, ~/.databrickscfg)")
    p.add_argument("--profile", default=None, help="~/.databrickscfg profile")
    p.add_argument("--poll", type=float, default=1.0, help="first wait between status polls, s (default 1)")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    d = actions.add_parser("deploy", help="upload the wheel and notebooks, install, create or update the job")
    d.add_argument("--config", default=None, help=f"settings file (default: ./{DEFAULT_CONFIG} if present)")
    d.add_argument("--wheel", default=None, help="the .whl to deploy")
    d.add_argument("--python", default=None, metavar="X.Y", help="build the wheel for this Python instead")
    d.add_argument("--job-name", dest="job_name", default=None)
    d.add_argument("--notebooks-dir", dest="notebooks_dir", default=None)
    d.add_argument("--notebook", default=None, help="the notebook the job runs (a file of --notebooks-dir)")
    d.add_argument("--workspace-dir", dest="workspace_dir", default=None, help="workspace folder for the notebooks")
    d.add_argument("--upload-dir", dest="upload_dir", default=None, help="/Volumes/..., /Workspace/... or dbfs:/...")
    d.add_argument("--cluster-id", dest="cluster_id", default=None, help="install on this cluster")
    d.add_argument("--new-cluster", dest="new_cluster", type=json.loads, default=None, help="job cluster spec, JSON")
    d.add_argument("--schedule", default=None, metavar="CRON", help="quartz cron (timezone UTC, UNPAUSED)")
    d.add_argument("--base-param", dest="base_parameters", action="append", type=param, metavar="K=V")
    d.add_argument("--max-retries", dest="max_retries", type=int, default=None)
    d.add_argument("--timeout-seconds", dest="timeout_seconds", type=int, default=None, help="the job's own limit")
    d.add_argument("--cluster-timeout", dest="cluster_timeout", type=float, default=None)
    d.add_argument("--library-timeout", dest="library_timeout", type=float, default=None)
    d.add_argument("--dry-run", action="store_true", help="print every request it would make; send none")
    _run_flags(d, "--run-now", "then run the job")

    jobs = actions.add_parser("jobs", help="run, follow, cancel and list job runs").add_subparsers(
        dest="verb", metavar="VERB", required=True
    )
    r = jobs.add_parser("run", help="start a run of a job (id or name)")
    r.add_argument("job")
    _run_flags(r, None, None)
    for verb, text in (("status", "a run's state"), ("cancel", "cancel a run"), ("output", "a run's exit value")):
        jobs.add_parser(verb, help=text).add_argument("run_id", type=int)
    jobs.add_parser("list", help="the jobs (id, name, schedule)").add_argument("--name", default=None)

    fs = actions.add_parser("fs", help="files in DBFS or a Unity Catalog volume").add_subparsers(
        dest="verb", metavar="VERB", required=True
    )
    cp = fs.add_parser("cp", help="copy a local file there, or from there to a local file")
    cp.add_argument("src")
    cp.add_argument("dst")
    cp.add_argument("--overwrite", action="store_true")
    fs.add_parser("ls", help="list a folder").add_argument("path")
    rm = fs.add_parser("rm", help="remove a file (or, with -r, a DBFS folder)")
    rm.add_argument("path")
    rm.add_argument("-r", "--recursive", action="store_true")

    ws = actions.add_parser("workspace", help="notebooks and files of the workspace").add_subparsers(
        dest="verb", metavar="VERB", required=True
    )
    imp = ws.add_parser("import", help="import a local notebook or file")
    imp.add_argument("local")
    imp.add_argument("path")
    imp.add_argument("--format", default="AUTO", choices=["AUTO", "SOURCE", "JUPYTER"])
    imp.add_argument("--language", default="PYTHON")
    imp.add_argument("--overwrite", action="store_true")
    exp = ws.add_parser("export", help="export a notebook (to stdout, or to LOCAL)")
    exp.add_argument("path")
    exp.add_argument("local", nargs="?")
    exp.add_argument("--format", default="SOURCE", choices=["SOURCE", "JUPYTER"])

    def run(args: argparse.Namespace) -> int:
        name = args.action if args.action == "deploy" else f"{args.action} {args.verb}"
        try:
            return _ACTIONS[args.action](args)
        except SparkgradError as exc:
            print(f"sparkgrad databricks {name}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return 1

    return run


def _run_flags(p: argparse.ArgumentParser, switch: str | None, text: str | None) -> None:
    if switch:
        p.add_argument(switch, dest="run_now", action="store_true", help=text)
    p.add_argument("--param", action="append", type=param, default=[], metavar="K=V", help="notebook_params")
    p.add_argument("--wait", action="store_true", help="follow the run to its end; non-zero unless SUCCESS")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the run (default 3600)")


def _client(args: argparse.Namespace):
    from sparkgrad.databricks.client import Client

    return Client(args.host, profile=args.profile, poll=args.poll)


def _start(client: Any, job_id: int, args: argparse.Namespace) -> int:
    from sparkgrad.databricks import deploy

    run_id = deploy.run_now(client, job_id, params(args.param))
    if not args.wait:
        run = client.runs_get(run_id)
        _out(f"run {run_id}: {deploy.run_page_url(client, run)}")
        return 0
    return deploy.wait_and_report(client, run_id, args.timeout, _out)


# ---- deploy ----------------------------------------------------------------------------


def _deploy(args: argparse.Namespace) -> int:
    from sparkgrad.databricks import deploy
    from sparkgrad.databricks.config import resolve_config

    path = args.config or (DEFAULT_CONFIG if pathlib.Path(DEFAULT_CONFIG).is_file() else None)
    keys = ["wheel", "python", "job_name", "notebooks_dir", "notebook", "workspace_dir", "upload_dir", "cluster_id"]
    keys += ["new_cluster", "schedule", "max_retries", "timeout_seconds", "cluster_timeout", "library_timeout"]
    overrides = {k: getattr(args, k) for k in keys}
    if args.base_parameters:
        overrides["base_parameters"] = params(args.base_parameters)
    config = deploy.load_config(path, overrides)
    if args.dry_run:
        resolved = resolve_config(args.host, profile=args.profile)
        wheel = deploy.wheel_of(config, build=False, log=_out)
        auth = f"Bearer {deploy.mask(resolved.token)}" if resolved.token else "Bearer <OAuth token>"
        deploy.print_plan(deploy.plan(config, wheel, run_now=args.run_now), resolved.host, auth, _out)
        return 0
    client = _client(args)
    done = deploy.deploy(client, config, _out)
    if not args.run_now:
        return 0
    return _start(client, done.job_id, args)


# ---- jobs ----------------------------------------------------------------------------


def _job_id(client: Any, job: str) -> int:
    from sparkgrad.databricks.deploy import jobs_named

    if job.isdigit():
        return int(job)
    found = jobs_named(client, job)
    if len(found) != 1:
        ids = ", ".join(str(j["job_id"]) for j in found)
        raise InvalidArgumentError(f"{len(found)} jobs are named {job!r}" + (f" ({ids}): give the id" if ids else ""))
    return int(found[0]["job_id"])


def _jobs(args: argparse.Namespace) -> int:
    from sparkgrad.databricks import deploy
    from sparkgrad.databricks.client import TERMINAL_RUN_STATES

    client = _client(args)
    if args.verb == "run":
        return _start(client, _job_id(client, args.job), args)
    if args.verb == "list":
        for job in client.jobs_list(name=args.name):
            s = job.get("settings", {})
            when = s.get("schedule", {})
            cron = f"  {when.get('quartz_cron_expression')} {when.get('timezone_id')} {when.get('pause_status')}"
            _out(f"{job['job_id']}  {s.get('name', '')}{cron if when else ''}")
        return 0
    if args.verb == "cancel":
        client.runs_cancel(args.run_id)
        _out(f"run {args.run_id}: cancel requested")
        return 0
    run = client.runs_get(args.run_id)
    state = run.get("state", {})
    life, result = state.get("life_cycle_state", ""), state.get("result_state", "")
    # FAILED, CANCELED, TIMEDOUT (also while TERMINATING), SKIPPED (no result_state), INTERNAL_ERROR
    ended_badly = result not in ("", "SUCCESS") or (life in TERMINAL_RUN_STATES and result != "SUCCESS")
    if args.verb == "status":
        _out(f"run {args.run_id}: {life} {result}".rstrip())
        _out(deploy.run_page_url(client, run))
        if state.get("state_message"):
            _out(state["state_message"])
        return 1 if ended_badly else 0
    output = client.runs_get_output(args.run_id)
    if output.get("error"):
        print(output["error"], file=sys.stderr)
        if output.get("error_trace"):
            print(output["error_trace"].rstrip(), file=sys.stderr)
        return 1
    if ended_badly:
        print(f"run {args.run_id} {result or life}: {state.get('state_message', '')}", file=sys.stderr)
        return 1
    _out((output.get("notebook_output") or {}).get("result", ""))
    return 0


# ---- fs and workspace ----------------------------------------------------------------


def _remote(path: str) -> bool:
    return path.startswith(("dbfs:/", "/Volumes/"))


def _fs(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.verb == "cp":
        if _remote(args.src) == _remote(args.dst):
            raise InvalidArgumentError("fs cp copies between a local file and dbfs:/... or /Volumes/...")
        if _remote(args.dst):
            dst = args.dst.rstrip("/") + "/" + pathlib.Path(args.src).name if args.dst.endswith("/") else args.dst
            put = client.files_put if dst.startswith("/Volumes/") else client.dbfs_put
            n = put(dst, args.src, overwrite=args.overwrite)
            _out(f"{args.src} -> {dst} ({n} bytes)")
            return 0
        data = client.files_get(args.src) if args.src.startswith("/Volumes/") else client.dbfs_read(args.src)
        dst = pathlib.Path(args.dst)
        if dst.is_dir():
            dst = dst / args.src.rsplit("/", 1)[1]
        if dst.exists() and not args.overwrite:
            raise InvalidArgumentError(f"{dst} exists: give --overwrite")
        dst.write_bytes(data)
        _out(f"{args.src} -> {dst} ({len(data)} bytes)")
        return 0
    if args.verb == "ls":
        if args.path.startswith("/Volumes/"):
            rows = [
                (e["path"], e.get("is_directory", False), e.get("file_size", 0))
                for e in client.directories_list(args.path)
            ]
        else:
            rows = [(e["path"], e.get("is_dir", False), e.get("file_size", 0)) for e in client.dbfs_list(args.path)]
        for path, is_dir, size in rows:
            _out(f"{'dir ' if is_dir else 'file'} {size:>12} {path}")
        return 0
    if args.path.startswith("/Volumes/"):
        client.files_delete(args.path)
    else:
        client.dbfs_delete(args.path, recursive=args.recursive)
    _out(f"removed {args.path}")
    return 0


def _workspace(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.verb == "import":
        data = pathlib.Path(args.local).read_bytes()
        client.workspace_import(args.path, data, format=args.format, language=args.language, overwrite=args.overwrite)
        _out(f"{args.local} -> {args.path} ({args.format})")
        return 0
    data = client.workspace_export(args.path, format=args.format)
    if args.local is None:
        sys.stdout.write(data.decode("utf-8", "replace"))
        return 0
    pathlib.Path(args.local).write_bytes(data)
    _out(f"{args.path} -> {args.local} ({len(data)} bytes)")
    return 0


_ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {
    "deploy": _deploy,
    "jobs": _jobs,
    "fs": _fs,
    "workspace": _workspace,
}
