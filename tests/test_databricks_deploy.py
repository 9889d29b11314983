"""``sparkgrad databricks deploy`` and the jobs / fs / workspace subcommands
against the local Databricks stand-in (tests/databricks_standin.py), run
in-process through sparkgrad.cli.main with a small prebuilt wheel (nothing
is built here)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import urllib.parse
import zipfile

import pytest
from databricks_standin import Standin
from sparkgrad import cli
from sparkgrad.databricks import Client, notebook_job

TRAIN = """# Databricks notebook source
dbutils.widgets.text("epochs", "1")
# COMMAND ----------
dbutils.notebook.exit(f"trained {dbutils.widgets.get('epochs')} epochs")
"""
PREP = """# Databricks notebook source
dbutils.notebook.exit("prepared")
"""
FAILING = """# Databricks notebook source
def step():
    raise RuntimeError("loss is NaN at step 7")
# COMMAND ----------
step()
"""
CLUSTER = "0101-standin"


@pytest.fixture
def standin():
    with Standin() as s:
        yield s


@pytest.fixture
def env(standin, monkeypatch):
    _use(monkeypatch, standin)
    return standin


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A folder with notebooks/, a wheel and a sparkgrad-deploy.toml; the current directory."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "train.py").write_text(TRAIN)
    (tmp_path / "notebooks" / "prep.py").write_text(PREP)
    (tmp_path / "notebooks" / "helper.py").write_text("x = 1\n")  # not a notebook: not imported
    wheel = tmp_path / "sparkgrad-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("sparkgrad/__init__.py", "")
        z.writestr("sparkgrad-0.1.0.dist-info/METADATA", "Name: sparkgrad\nVersion: 0.1.0\n")
    (tmp_path / "sparkgrad-deploy.toml").write_text(
        f"""
job_name = "sg-train"
wheel = "{wheel.name}"
notebooks_dir = "notebooks"
notebook = "train"
workspace_dir = "/Users/me@example.com/sg"
upload_dir = "/Volumes/main/default/libs"
cluster_id = "{CLUSTER}"
max_retries = 1
timeout_seconds = 3600

[base_parameters]
epochs = "2"

[schedule]
cron = "0 0 3 * * ?"
timezone = "Europe/Zurich"
pause_status = "PAUSED"

[email_notifications]
on_failure = ["ml-team@example.com"]
"""
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def sg(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["databricks", "--poll", "0.01", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def client_of(standin: Standin) -> Client:
    return Client(standin.url, standin.token, config_file=os.devnull, poll=0.01, allow_http_loopback=True)


def test_deploy_creates_everything_and_a_second_deploy_changes_nothing(env, project, capsys):
    code, out, err = sg(capsys, "deploy")
    assert code == 0, err
    assert "deployed: 5 changes" in out  # upload, 2 notebooks, library, job
    (job,) = env.jobs.values()
    s = job["settings"]
    assert s["name"] == "sg-train"
    assert s["schedule"] == {
        "quartz_cron_expression": "0 0 3 * * ?",
        "timezone_id": "Europe/Zurich",
        "pause_status": "PAUSED",
    }
    assert s["email_notifications"] == {"on_failure": ["ml-team@example.com"]}
    task = s["tasks"][0]
    assert task["notebook_task"]["notebook_path"] == "/Users/me@example.com/sg/train"
    assert task["notebook_task"]["base_parameters"] == {"epochs": "2"}
    assert task["existing_cluster_id"] == CLUSTER and task["max_retries"] == 1
    assert s["timeout_seconds"] == 3600 and task["timeout_seconds"] == 3600
    assert {"/Users/me@example.com/sg/train", "/Users/me@example.com/sg/prep"} <= set(env.workspace)
    assert "/Users/me@example.com/sg/helper" not in env.workspace
    (remote,) = env.volume_files
    assert remote.startswith("/Volumes/main/default/libs/") and remote.endswith("/sparkgrad-0.1.0-py3-none-any.whl")
    assert env.clusters[CLUSTER]["state"] == "RUNNING"
    assert env.clusters[CLUSTER]["libraries"][0]["status"] == "INSTALLED"

    before = env.state()
    code, out2, err = sg(capsys, "deploy")
    assert code == 0, err
    assert env.state() == before
    assert "deployed: 0 changes" in out2 and out2.count("unchanged") == 5

    # a changed notebook is imported again; a changed schedule resets the job; nothing else moves
    (project / "notebooks" / "prep.py").write_text(PREP.replace("prepared", "prepared v2"))
    code, out3, _ = sg(capsys, "deploy", "--schedule", "0 30 4 * * ?")
    assert code == 0 and "deployed: 2 changes" in out3
    assert "/Users/me@example.com/sg/prep: updated" in out3
    assert env.jobs[job["job_id"]]["settings"]["schedule"]["quartz_cron_expression"] == "0 30 4 * * ?"
    print(out)  # shown with pytest -s: the deploy output the README quotes


def test_run_now_wait_prints_the_url_each_state_and_the_exit_value(env, project, capsys):
    code, out, err = sg(capsys, "deploy", "--run-now", "--wait", "--param", "epochs=5")
    assert code == 0, err
    (job_id,) = env.jobs
    (run_id,) = env.runs
    assert f"run {run_id}: {env.url}/#job/{job_id}/run/{run_id}" in out
    lines = out.splitlines()
    states = [ln.split(None, 1)[1] for ln in lines if ln.startswith("  ") and ln[2:4].isdigit()]
    assert states == ["PENDING", "RUNNING", "TERMINATED SUCCESS"]
    assert lines[-1] == "exit value: trained 5 epochs"


def test_failed_run_exits_non_zero_with_the_error_and_its_trace(env, project, capsys):
    (project / "notebooks" / "train.py").write_text(FAILING)
    code, out, _ = sg(capsys, "deploy", "--run-now", "--wait")
    assert code == 1
    assert "TERMINATED FAILED" in out
    assert "FAILED: RuntimeError: loss is NaN at step 7" in out
    assert "Traceback (most recent call last)" in out and "in step" in out
    (run_id,) = env.runs
    code, out, err = sg(capsys, "jobs", "output", str(run_id))
    assert code == 1 and out == "" and err.startswith("RuntimeError: loss is NaN at step 7\nTraceback")


@pytest.mark.parametrize(
    ("outcome", "state", "message"),
    [
        ("TIMEDOUT", "TERMINATED TIMEDOUT", "Run timed out: it ran longer than its timeout_seconds."),
        ("CANCELED", "TERMINATED CANCELED", "Run cancelled."),
        ("SKIPPED", "SKIPPED", "Skipping this run because the limit of 1 maximum concurrent runs has been reached."),
    ],
    ids=["TIMEDOUT", "CANCELED", "SKIPPED"],
)
def test_a_timed_out_cancelled_or_skipped_run_exits_non_zero_with_its_state(
    env, project, capsys, outcome, state, message
):
    env.end_runs(outcome, times=2)
    for argv in (["deploy", "--run-now", "--wait"], ["jobs", "run", "sg-train", "--wait"]):
        code, out, err = sg(capsys, *argv)
        run_id = max(env.runs)
        assert code == 1, (argv, out, err)
        assert f"{state} ({message})" in out, argv  # the state change
        assert out.splitlines()[-1] == f"run {run_id} {outcome}: {message}", argv
        assert "exit value" not in out
        code, out, _ = sg(capsys, "jobs", "status", str(run_id))
        assert code == 1 and out.startswith(f"run {run_id}: {state}\n") and message in out
        code, out, err = sg(capsys, "jobs", "output", str(run_id))
        assert code == 1 and out == "" and err == f"run {run_id} {outcome}: {message}\n"
    assert env.run_ends == []


def test_a_run_of_a_deleted_notebook_fails_naming_it(env, project, capsys):
    notebook = "/Users/me@example.com/sg/train"
    assert sg(capsys, "deploy")[0] == 0
    client_of(env).workspace_delete(notebook)
    code, out, _ = sg(capsys, "jobs", "run", "sg-train", "--wait")
    assert code == 1 and out.splitlines()[-1] == f"run {max(env.runs)} FAILED: Notebook not found: {notebook}"
    # deploy imports it again; deleted between the deploy and the run, the run fails the same way
    original = env.jobs_call

    def delete_then(op, q, body):
        if op == "run-now":
            env.workspace.pop(notebook)
        return original(op, q, body)

    env.jobs_call = delete_then
    code, out, _ = sg(capsys, "deploy", "--run-now", "--wait")
    assert code == 1 and f"notebook  {notebook}: imported" in out
    assert f"TERMINATED FAILED (Notebook not found: {notebook})" in out
    assert out.splitlines()[-1] == f"run {max(env.runs)} FAILED: Notebook not found: {notebook}"


def test_dry_run_prints_every_request_masked_and_sends_none(env, project, capsys):
    code, out, err = sg(capsys, "deploy", "--dry-run", "--run-now")
    assert code == 0, err
    assert env.requests == []
    assert env.token not in out and f"Bearer {env.token[:4]}********" in out
    for expected in (
        "HEAD /api/2.0/fs/files/Volumes/main/default/libs/",
        "GET /api/2.0/workspace/export?path=%2FUsers%2Fme%40example.com%2Fsg%2Ftrain&format=SOURCE",
        '"content": "<',
        "POST /api/2.0/libraries/install",
        "GET /api/2.1/jobs/list?name=sg-train&limit=100",
        "POST /api/2.1/jobs/create",
        "POST /api/2.1/jobs/run-now",
    ):
        assert expected in out, expected


def _plan_requests(out: str) -> list[tuple[str, str]]:
    """(method, path) of each request line of a dry run's plan, in order."""
    rows = []
    for line in out.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] in ("check", "change"):
            rows.append((words[1], urllib.parse.unquote(words[2].split("?")[0])))
    return rows


@pytest.mark.parametrize("where", ["volume", "workspace", "dbfs"])
def test_the_dry_run_plan_is_what_a_deploy_sends(env, project, capsys, where):
    """Every (method, path) the plan lists is sent by a first deploy (and run)
    or by a second one that resets the job, and nothing else is; the first
    deploy sends them in the plan's order."""
    argv = ["--run-now"]
    if where != "volume":  # a job cluster: no cluster or library steps
        cluster = {"spark_version": "14.3.x-scala2.12", "node_type_id": "i3.xlarge", "num_workers": 1}
        upload = "/Workspace/Users/me@example.com/libs" if where == "workspace" else "dbfs:/FileStore/sg"
        argv += ["--upload-dir", upload, "--new-cluster", json.dumps(cluster)]
    if where == "dbfs":  # over 1 MB: streamed to a temporary name, then moved
        big = project / "sparkgrad-0.1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
        with zipfile.ZipFile(big, "w") as z:
            z.writestr("sparkgrad/_core.so", os.urandom(1536 << 10))
        argv += ["--wheel", str(big)]
    code, out, err = sg(capsys, "deploy", "--dry-run", *argv)
    assert code == 0 and env.requests == [], err
    planned = _plan_requests(out)
    code, _, err = sg(capsys, "deploy", "--wait", *argv)
    assert code == 0, err
    first = [(m, urllib.parse.unquote(p)) for m, p in env.requests]
    code, out, err = sg(capsys, "deploy", "--schedule", "0 30 4 * * ?", *argv[1:])
    assert code == 0 and "updated, schedule" in out, err
    second = [(m, urllib.parse.unquote(p)) for m, p in env.requests[len(first) :]]
    assert set(first) | set(second) == set(planned)
    assert set(planned) - set(first) == {("GET", "/api/2.1/jobs/get"), ("POST", "/api/2.1/jobs/reset")}
    in_first = [r for r in dict.fromkeys(planned) if r in set(first)]
    assert list(dict.fromkeys(first)) == in_first


def test_dry_run_masks_secrets_in_the_job_settings(env, project, capsys):
    cluster = {
        "spark_version": "14.3.x-scala2.12",
        "num_workers": 1,
        "spark_env_vars": {"DB_TOKEN": "dapi-s3cr3t-value"},
    }
    code, out, _ = sg(
        capsys, "deploy", "--dry-run", "--new-cluster", json.dumps(cluster), "--base-param", "password=hunter2-long"
    )
    assert code == 0 and "s3cr3t" not in out and "hunter2-long" not in out
    assert '"DB_TOKEN": "dapi********"' in out and '"password": "hunt********"' in out


def test_two_jobs_with_the_deploy_name_are_refused(env, project, capsys):
    c = client_of(env)
    ids = [c.jobs_create(notebook_job("sg-train", "/x", existing_cluster_id=CLUSTER)) for _ in range(2)]
    code, _, err = sg(capsys, "deploy")
    assert code == 1
    assert err.startswith("sparkgrad databricks deploy: StateError: 2 jobs are named 'sg-train'")
    assert f"{ids[0]}, {ids[1]}" in err
    assert all(j["settings"]["tasks"][0]["notebook_task"]["notebook_path"] == "/x" for j in env.jobs.values())


def test_a_library_that_failed_to_install_gives_the_clusters_message(env, project, capsys):
    message = "ERROR: sparkgrad-0.1.0-py3-none-any.whl is not a supported wheel on this platform."
    original = env.libraries_call

    def failing(op, q, body):  # the cluster reports every install as FAILED, with pip's message
        reply = original(op, q, body)
        for s in env.clusters[CLUSTER]["libraries"]:
            s["status"], s["messages"] = "FAILED", [message]
        return reply

    env.libraries_call = failing
    code, _, err = sg(capsys, "deploy")
    assert code == 1
    assert err.startswith("sparkgrad databricks deploy: RestError: library {'whl': '/Volumes/main/default/libs/")
    assert f"failed to install on {CLUSTER}: {message}" in err
    assert env.jobs == {}  # stopped before the job


def _use(monkeypatch, s: Standin) -> None:
    """The CLI finds the stand-in through the environment, as it would a workspace."""
    for var in ("DATABRICKS_CLIENT_ID", "DATABRICKS_CLIENT_SECRET", "DATABRICKS_CONFIG_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DATABRICKS_HOST", s.url)
    monkeypatch.setenv("DATABRICKS_TOKEN", s.token)
    monkeypatch.setenv("DATABRICKS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("SPARKGRAD_REST_ALLOW_HTTP_LOOPBACK", "1")


def test_without_host_or_credentials_the_cli_says_what_it_read_and_oauth_from_env_works(monkeypatch, tmp_path, capsys):
    for var in ("DATABRICKS_HOST", "DATABRICKS_TOKEN", "DATABRICKS_CLIENT_ID", "DATABRICKS_CLIENT_SECRET"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("DATABRICKS_CONFIG_PROFILE", raising=False)
    cfg = tmp_path / "databrickscfg"
    monkeypatch.setenv("DATABRICKS_CONFIG_FILE", str(cfg))
    for argv in (["jobs", "list"], ["fs", "ls", "dbfs:/"]):
        code, out, err = sg(capsys, *argv)
        assert code == 1 and out == ""
        assert err.startswith(
            f"sparkgrad databricks {' '.join(argv[:2])}: DatabricksConfigError: no Databricks host (DATABRICKS_HOST) "
            "and no token (DATABRICKS_TOKEN) or OAuth client (DATABRICKS_CLIENT_ID + DATABRICKS_CLIENT_SECRET); read: "
            "DATABRICKS_HOST, DATABRICKS_TOKEN, DATABRICKS_CLIENT_ID, DATABRICKS_CLIENT_SECRET, "
            f"{cfg} [DEFAULT] (no such file)"
        ), err
    with Standin() as s:  # an OAuth service principal from the environment, no token anywhere
        monkeypatch.setenv("DATABRICKS_HOST", s.url)
        monkeypatch.setenv("DATABRICKS_CLIENT_ID", s.client_id)
        monkeypatch.setenv("DATABRICKS_CLIENT_SECRET", s.client_secret)
        monkeypatch.setenv("SPARKGRAD_REST_ALLOW_HTTP_LOOPBACK", "1")
        code, out, err = sg(capsys, "fs", "ls", "dbfs:/")
        assert code == 0 and out == "", err
        assert s.count("POST", "/oidc/v1/token") == 1 and s.requests[-1] == ("GET", "/api/2.0/dbfs/list")
        monkeypatch.setenv("DATABRICKS_CLIENT_SECRET", "not-the-secret")
        code, _, err = sg(capsys, "fs", "ls", "dbfs:/")
        assert code == 1 and "HTTP 401 invalid_client" in err and "refused the credentials" in err
        assert "not-the-secret" not in err


def test_a_cluster_that_never_runs_times_out(monkeypatch, project, capsys):
    with Standin(cluster_steps=10**9) as s:
        _use(monkeypatch, s)
        code, _, err = sg(capsys, "deploy", "--cluster-timeout", "0.3")
        assert code == 1
        assert err.strip() == (
            f"sparkgrad databricks deploy: SparkgradTimeout: cluster {CLUSTER} did not reach RUNNING "
            "within 0.3 s (cluster_timeout)"
        )


def test_a_run_still_running_at_the_timeout_says_what_it_waited_for(monkeypatch, project, capsys):
    with Standin(run_steps=10**9) as s:
        _use(monkeypatch, s)
        code, out, err = sg(capsys, "deploy", "--run-now", "--wait", "--timeout", "0.3")
        assert code == 1
        (run_id,) = s.runs
        assert f"SparkgradTimeout: run {run_id} is still PENDING after 0.3 s" in err
        assert f"jobs cancel {run_id}" in err


def test_jobs_run_status_output_cancel_and_list(env, project, capsys):
    assert sg(capsys, "deploy")[0] == 0
    (job_id,) = env.jobs
    code, out, _ = sg(capsys, "jobs", "run", "sg-train", "--wait", "--param", "epochs=3")
    assert code == 0 and out.splitlines()[-1] == "exit value: trained 3 epochs"
    (run_id,) = env.runs
    code, out, _ = sg(capsys, "jobs", "status", str(run_id))
    assert code == 0 and out.startswith(f"run {run_id}: TERMINATED SUCCESS")
    assert sg(capsys, "jobs", "output", str(run_id))[1] == "trained 3 epochs\n"
    code, out, _ = sg(capsys, "jobs", "list")
    assert out == f"{job_id}  sg-train  0 0 3 * * ? Europe/Zurich PAUSED\n"
    code, out, _ = sg(capsys, "jobs", "run", str(job_id))
    second = max(env.runs)
    assert code == 0 and f"run {second}: " in out
    assert sg(capsys, "jobs", "cancel", str(second))[0] == 0
    assert env.runs[second].result == "CANCELED"
    code, out, _ = sg(capsys, "jobs", "status", str(second))
    assert code == 1 and "CANCELED" in out
    code, _, err = sg(capsys, "jobs", "run", "no-such-job")
    assert code == 1 and err.startswith("sparkgrad databricks jobs run: InvalidArgumentError: 0 jobs are named")


def test_fs_cp_ls_rm_on_dbfs_and_volumes(env, tmp_path, capsys):
    local = tmp_path / "data.bin"
    local.write_bytes(b"\x00\x01payload")
    for remote in ("dbfs:/tmp/sg/data.bin", "/Volumes/main/default/files/data.bin"):
        assert sg(capsys, "fs", "cp", str(local), remote)[0] == 0
        folder = remote.rsplit("/", 1)[0]
        code, out, _ = sg(capsys, "fs", "ls", folder)
        assert code == 0 and out.split() == ["file", "9", remote.removeprefix("dbfs:")]
        back = tmp_path / f"back-{len(remote)}.bin"
        assert sg(capsys, "fs", "cp", remote, str(back))[0] == 0
        assert back.read_bytes() == local.read_bytes()
        code, _, err = sg(capsys, "fs", "cp", str(local), remote)
        assert code == 1 and "sparkgrad databricks fs cp: RestError:" in err
        assert sg(capsys, "fs", "rm", remote)[0] == 0
        assert sg(capsys, "fs", "ls", folder)[1] == ""
    for name in ("a.bin", "sub/b.bin"):
        assert sg(capsys, "fs", "cp", str(local), f"dbfs:/tmp/sg/{name}")[0] == 0
    code, _, err = sg(capsys, "fs", "rm", "dbfs:/tmp/sg")
    assert code == 1 and "IO_ERROR" in err and "/tmp/sg/sub/b.bin" in env.dbfs  # a folder needs -r
    code, out, _ = sg(capsys, "fs", "rm", "-r", "dbfs:/tmp/sg")
    assert code == 0 and out == "removed dbfs:/tmp/sg\n"
    assert [p for p in [*env.dbfs, *env.dbfs_dirs] if p.startswith("/tmp/sg")] == []


def test_workspace_import_and_export(env, tmp_path, capsys):
    src = tmp_path / "nb.py"
    src.write_text(TRAIN)
    client_of(env).workspace_mkdirs("/Users/me")
    assert sg(capsys, "workspace", "import", str(src), "/Users/me/nb")[0] == 0
    assert env.workspace["/Users/me/nb"]["object_type"] == "NOTEBOOK"
    code, out, _ = sg(capsys, "workspace", "export", "/Users/me/nb")
    assert code == 0 and out == TRAIN
    code, _, _ = sg(capsys, "workspace", "export", "/Users/me/nb", str(tmp_path / "nb.ipynb"), "--format", "JUPYTER")
    assert code == 0 and json.loads((tmp_path / "nb.ipynb").read_text())["nbformat"] == 4
    code, _, err = sg(capsys, "workspace", "import", str(src), "/Users/me/nb")
    assert code == 1 and "RESOURCE_ALREADY_EXISTS" in err


@pytest.mark.parametrize("upload_dir", ["/Workspace/Users/me@example.com/libs", "dbfs:/FileStore/sparkgrad/wheels"])
def test_deploy_to_workspace_files_or_dbfs_with_a_job_cluster_is_idempotent(env, project, capsys, upload_dir):
    new_cluster = json.dumps({"spark_version": "14.3.x-scala2.12", "node_type_id": "i3.xlarge", "num_workers": 2})
    argv = ["deploy", "--upload-dir", upload_dir, "--new-cluster", new_cluster]
    code, out, err = sg(capsys, *argv)
    assert code == 0, err
    assert "deployed: 4 changes" in out  # upload, 2 notebooks, job: no cluster library
    (job,) = env.jobs.values()
    task = job["settings"]["tasks"][0]
    (lib,) = task["libraries"]
    assert lib["whl"].startswith(upload_dir + "/") and task["new_cluster"]["num_workers"] == 2
    if upload_dir.startswith("dbfs:"):
        assert lib["whl"].removeprefix("dbfs:") in env.dbfs
    else:
        assert env.workspace[lib["whl"].removeprefix("/Workspace")]["object_type"] == "FILE"
    before = env.state()
    code, out, _ = sg(capsys, *argv)
    assert code == 0 and "deployed: 0 changes" in out and env.state() == before


def test_dbfs_upload_is_refused_for_runtime_15_and_later(env, project, capsys):
    new_cluster = json.dumps({"spark_version": "15.4.x-scala2.12", "node_type_id": "i3.xlarge", "num_workers": 1})
    argv = ["deploy", "--upload-dir", "dbfs:/FileStore/w", "--new-cluster", new_cluster]
    code, _, err = sg(capsys, *argv)
    assert code == 1 and "InvalidArgumentError: runtime 15.4.x-scala2.12 does not install libraries from DBFS" in err
    assert env.requests == []


def test_dbfs_is_refused_for_a_runtime_15_cluster_and_a_running_cluster_is_asked_once(monkeypatch, project, capsys):
    argv = ["deploy", "--upload-dir", "dbfs:/FileStore/w"]
    with Standin(spark_version="14.3.x-scala2.12") as s:
        _use(monkeypatch, s)
        assert sg(capsys, *argv)[0] == 0  # started, waited for, installed
        n = s.count("GET", "/api/2.1/clusters/get")
        code, out, _ = sg(capsys, *argv)
        assert code == 0 and "deployed: 0 changes" in out
        assert s.count("GET", "/api/2.1/clusters/get") == n + 1  # one answer: the runtime, the state
    with Standin(spark_version="15.4.x-scala2.12") as s:
        _use(monkeypatch, s)
        code, _, err = sg(capsys, *argv)
        assert code == 1 and err.strip().endswith(
            f"InvalidArgumentError: cluster {CLUSTER} runs 15.4.x-scala2.12, which does not install libraries "
            "from DBFS (disabled from 15.0): upload to /Volumes/... or /Workspace/..."
        )
        assert s.clusters[CLUSTER]["libraries"] == [] and s.jobs == {}


def test_bad_settings_are_named(env, project, capsys):
    code, _, err = sg(capsys, "deploy", "--notebook", "trian", "--dry-run")
    assert code == 1 and "the job's notebook 'trian' is not among ['prep', 'train']" in err
    with open("sparkgrad-deploy.toml", "a") as f:
        f.write("\n[extra]\nx = 1\n")
    code, _, err = sg(capsys, "deploy")
    assert code == 1 and "unknown deploy settings ['extra']" in err
    code, _, err = sg(capsys, "deploy", "--config", "missing.toml")
    assert code == 1 and "cannot read missing.toml" in err


def test_a_job_whose_schedule_was_removed_is_reset(env, project, capsys):
    assert sg(capsys, "deploy")[0] == 0
    toml = project / "sparkgrad-deploy.toml"
    text = toml.read_text()
    toml.write_text(text[: text.index("[schedule]")] + text[text.index("[email_notifications]") :])
    code, out, _ = sg(capsys, "deploy")
    assert code == 0 and "updated, no schedule" in out
    assert "schedule" not in next(iter(env.jobs.values()))["settings"]


def test_building_the_wheel_needs_a_checkout_and_a_dry_run_builds_nothing(env, project, capsys):
    code, out, _ = sg(capsys, "deploy", "--python", "3.11", "--dry-run")
    assert code == 0 and "wheel: built for Python 3.11 by .ci/wheels.py" in out and env.requests == []
    code, _, err = sg(capsys, "deploy", "--python", "3.11")
    assert code == 1 and "builds the wheel from a sparkgrad checkout" in err


FAKE_WHEELS_PY = """
import pathlib, sys, zipfile
verb, flag, out, python = sys.argv[1:]
assert (verb, flag) == ("wheels", "--out"), sys.argv
if python == "3.9":
    sys.exit("no manylinux image for Python 3.9")
tag = "cp" + python.replace(".", "")
pathlib.Path(out).mkdir(exist_ok=True)
with zipfile.ZipFile(pathlib.Path(out) / f"sparkgrad-0.2.0-{tag}-{tag}-manylinux_2_28_x86_64.whl", "w") as z:
    z.writestr("sparkgrad/__init__.py", "built = True\\n")
"""


def test_python_builds_the_wheel_with_ci_wheels_py_and_uploads_the_one_built(env, project, capsys, monkeypatch):
    """deploy --python X.Y in a checkout: .ci/wheels.py (here a fake that
    writes a wheel) builds into dist/; the newest wheel of that tag goes up."""
    root = project.resolve()
    (root / ".ci").mkdir()
    (root / ".ci" / "wheels.py").write_text(FAKE_WHEELS_PY)
    (root / "dist").mkdir()
    stale = root / "dist" / "sparkgrad-0.1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    stale.write_bytes(b"an older build")
    os.utime(stale, (1, 1))
    (root / "notebooks" / "sub").mkdir()
    monkeypatch.chdir(root / "notebooks" / "sub")  # the checkout is found from a folder inside it
    code, out, err = sg(capsys, "deploy", "--config", str(root / "sparkgrad-deploy.toml"), "--python", "3.11")
    assert code == 0, err
    built = root / "dist" / "sparkgrad-0.2.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert f"building  {sys.executable} {root}/.ci/wheels.py wheels --out {root}/dist 3.11" in out
    (remote,) = env.volume_files
    sha = hashlib.sha256(built.read_bytes()).hexdigest()
    assert remote == f"/Volumes/main/default/libs/{sha[:16]}/{built.name}"
    assert env.volume_files[remote] == built.read_bytes()
    assert env.clusters[CLUSTER]["libraries"][0]["library"] == {"whl": remote}
    code, _, err = sg(capsys, "deploy", "--config", str(root / "sparkgrad-deploy.toml"), "--python", "3.9")
    assert code == 1 and "InvalidArgumentError: building the cp39 wheel failed:" in err
    assert "no manylinux image for Python 3.9" in err


def test_without_tomllib_or_tomli_the_file_is_refused_with_what_to_do(env, project, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tomllib", None)  # Python 3.10: no tomllib (and here no tomli)
    monkeypatch.setitem(sys.modules, "tomli", None)
    code, _, err = sg(capsys, "deploy", "--dry-run")
    assert code == 1 and "needs Python 3.11+ or the tomli package (pip install tomli); or give flags" in err
    flags = ["--wheel", "sparkgrad-0.1.0-py3-none-any.whl", "--job-name", "j", "--notebook", "train"]
    flags += ["--workspace-dir", "/Users/x", "--upload-dir", "/Volumes/a/b/c", "--cluster-id", CLUSTER]
    monkeypatch.chdir(project / "notebooks")
    code, out, err = sg(capsys, "deploy", "--dry-run", *flags[:1], "../" + flags[1], *flags[2:], "--notebooks-dir", ".")
    assert code == 0, err
    assert "POST /api/2.1/jobs/create" in out and env.requests == []
