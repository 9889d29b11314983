"""sparkgrad.databricks.Client (C transport csrc/rest/ + endpoints) against the
local Databricks stand-in (tests/databricks_standin.py): every endpoint, the
retry rules under injected faults, RestError's fields, configuration, OAuth
M2M, and that no secret or payload reaches a log line or an exception."""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest
from databricks_standin import MB, Standin
from sparkgrad.databricks import Client, notebook_job
from sparkgrad.databricks.config import DatabricksConfigError, OAuthM2M, resolve_config
from sparkgrad.errors import InvalidArgumentError, RestError

NOTEBOOK = """# Databricks notebook source
dbutils.widgets.text("epochs", "1")
# COMMAND ----------
epochs = int(dbutils.widgets.get("epochs"))
dbutils.notebook.exit(f"trained {epochs} epochs on {dbutils.widgets.get('data')}")
"""
FAILING_NOTEBOOK = """# Databricks notebook source
raise RuntimeError("loss is NaN")
"""


@pytest.fixture
def standin():
    with Standin() as s:
        yield s


def make_client(standin: Standin, **kw) -> Client:
    opts = {"timeout": 5.0, "budget": 10.0, "backoff": 0.05, "poll": 0.01, "allow_http_loopback": True}
    opts.update(kw)
    if "client_id" not in kw:
        opts.setdefault("token", standin.token)
    return Client(standin.url, config_file=os.devnull, **opts)


@pytest.fixture
def client(standin):
    return make_client(standin)


# ---- DBFS -----------------------------------------------------------------------------


def test_dbfs_small_put_is_one_call_and_reads_back(client, standin):
    assert client.dbfs_put("dbfs:/tmp/a.txt", b"hello") == 5
    assert standin.count("POST", "/api/2.0/dbfs/put") == 1
    assert client.dbfs_read("/tmp/a.txt") == b"hello"
    assert client.dbfs_get_status("/tmp/a.txt") == {
        "path": "/tmp/a.txt",
        "is_dir": False,
        "file_size": 5,
        "modification_time": 0,
    }
    with pytest.raises(RestError) as e:
        client.dbfs_put("/tmp/a.txt", b"x", overwrite=False)
    assert e.value.error_code == "RESOURCE_ALREADY_EXISTS" and e.value.status == 400


def test_dbfs_large_put_streams_1mb_blocks_then_moves_onto_the_name(client, standin, tmp_path):
    data = os.urandom(2 * MB + 123)
    local = tmp_path / "model.whl"
    local.write_bytes(data)
    assert client.dbfs_put("/FileStore/wheels/model.whl", local) == len(data)
    assert standin.count("POST", "/api/2.0/dbfs/add-block") == 3
    assert standin.count("POST", "/api/2.0/dbfs/move") == 1
    assert client.dbfs_read("/FileStore/wheels/model.whl") == data
    names = [f["path"] for f in client.dbfs_list("/FileStore/wheels")]
    assert names == ["/FileStore/wheels/model.whl"]


def test_dbfs_interrupted_upload_leaves_nothing_under_the_final_name(client, standin):
    client.dbfs_put("/FileStore/w.whl", b"old version")
    standin.inject("/dbfs/add-block", drop=True)  # the first block's connection drops
    with pytest.raises(RestError) as e:
        client.dbfs_put("/FileStore/w.whl", os.urandom(MB + 10))
    assert "not retried" in str(e.value)
    assert standin.count("POST", "/api/2.0/dbfs/add-block") == 1  # add-block is never repeated
    assert client.dbfs_read("/FileStore/w.whl") == b"old version"
    assert [f["path"] for f in client.dbfs_list("/FileStore")] == ["/FileStore/w.whl"]


@pytest.mark.parametrize("overwrite", [True, False])
def test_a_failed_dbfs_move_keeps_the_complete_upload_and_names_where_it_is(client, standin, overwrite):
    target = "/FileStore/w.whl" if overwrite else "/FileStore/new.whl"
    client.dbfs_put("/FileStore/w.whl", b"old version")
    data = os.urandom(MB + 10)
    standin.inject("/dbfs/move", status=503)  # after close (and, overwriting, the delete of the old file)
    with pytest.raises(RestError) as e:
        client.dbfs_put(target, data, overwrite=overwrite)
    (tmp,) = [p for p in standin.dbfs if p.startswith(f"{target}.sparkgrad-upload-")]
    assert standin.dbfs[tmp] == data  # the new version is whole, under the name the error gives
    assert (e.value.status, e.value.method, e.value.path) == (503, "POST", "/api/2.0/dbfs/move")
    assert f"the upload of {len(data)} bytes is complete at dbfs:{tmp} and stays there" in str(e.value)
    assert ("was deleted before the move" if overwrite else "was not touched") in str(e.value)
    if overwrite:  # the old version is gone, the new one is whole at tmp: never both lost
        assert target not in standin.dbfs
    else:
        assert target not in standin.dbfs and standin.dbfs["/FileStore/w.whl"] == b"old version"
    client.dbfs_move(tmp, target)  # what the error says to do
    assert client.dbfs_read(target) == data and not any(".sparkgrad-upload-" in p for p in standin.dbfs)


def test_dbfs_mkdirs_list_and_recursive_delete(client):
    client.dbfs_mkdirs("/a/b/c")
    client.dbfs_put("/a/b/f", b"1")
    assert {f["path"]: f["is_dir"] for f in client.dbfs_list("/a/b")} == {"/a/b/c": True, "/a/b/f": False}
    with pytest.raises(RestError):
        client.dbfs_delete("/a")
    client.dbfs_delete("/a", recursive=True)
    with pytest.raises(RestError) as e:
        client.dbfs_get_status("/a/b/f")
    assert (e.value.status, e.value.error_code) == (404, "RESOURCE_DOES_NOT_EXIST")


def test_standin_refuses_a_dbfs_block_over_1mb(client):
    over = base64.b64encode(b"x" * (MB + 1)).decode()
    handle = client.api("POST", "/api/2.0/dbfs/create", {"path": "/big"})["handle"]
    with pytest.raises(RestError) as e:
        client.api("POST", "/api/2.0/dbfs/add-block", {"handle": handle, "data": over})
    assert (e.value.status, e.value.error_code) == (400, "MAX_BLOCK_SIZE_EXCEEDED")
    with pytest.raises(RestError) as e:
        client.api("POST", "/api/2.0/dbfs/put", {"path": "/big2", "contents": over})
    assert (e.value.status, e.value.error_code) == (400, "MAX_BLOCK_SIZE_EXCEEDED")
    client.dbfs_put("/small", b"x")
    with pytest.raises(RestError) as e:
        client.api("GET", "/api/2.0/dbfs/read", query={"path": "/small", "length": MB + 1})
    assert (e.value.status, e.value.error_code) == (400, "MAX_READ_SIZE_EXCEEDED")


# ---- Files API --------------------------------------------------------------------------


def test_files_api_put_get_head_delete_and_directories(client):
    vol = "/Volumes/main/default/wheels"
    client.directories_create(f"{vol}/dist")
    assert client.files_put(f"{vol}/dist/sparkgrad-0.1-py3-none-any.whl", b"PK\x03\x04wheel") == 9
    assert client.files_get(f"{vol}/dist/sparkgrad-0.1-py3-none-any.whl") == b"PK\x03\x04wheel"
    head = client.files_head(f"{vol}/dist/sparkgrad-0.1-py3-none-any.whl")
    assert head["content-length"] == "9" and head["content-type"] == "application/octet-stream"
    listing = client.directories_list(f"{vol}/dist")
    assert [(c["name"], c["is_directory"]) for c in listing] == [("sparkgrad-0.1-py3-none-any.whl", False)]
    with pytest.raises(RestError) as e:
        client.files_put(f"{vol}/dist/sparkgrad-0.1-py3-none-any.whl", b"x", overwrite=False)
    assert (e.value.status, e.value.error_code) == (409, "ALREADY_EXISTS")
    with pytest.raises(RestError) as e:
        client.directories_delete(f"{vol}/dist")
    assert e.value.status == 409
    client.files_delete(f"{vol}/dist/sparkgrad-0.1-py3-none-any.whl")
    client.directories_delete(f"{vol}/dist")
    with pytest.raises(RestError) as e:
        client.files_head(f"{vol}/dist/sparkgrad-0.1-py3-none-any.whl")
    assert e.value.status == 404 and e.value.method == "HEAD"
    with pytest.raises(InvalidArgumentError):
        client.files_get("/tmp/not-a-volume")


def test_an_interrupted_volume_or_workspace_upload_fails_in_the_budget_and_shows_no_half_file(standin):
    """A PUT (or an import) cut mid-body every time: RestError within the
    budget; the name stays absent, or keeps its old content."""
    client = make_client(standin, budget=0.4)
    vol = "/Volumes/main/default/libs"
    client.files_put(f"{vol}/old.whl", b"old version")
    client.workspace_import("/Users/nb", NOTEBOOK)
    data = os.urandom(2 * MB)
    standin.inject("/fs/files/", method="PUT", drop_after=MB // 2, times=10**6)
    standin.inject("/workspace/import", drop_after=100, times=10**6)
    with pytest.raises(RestError) as e:  # without overwrite a PUT is not repeated: one attempt
        client.files_put(f"{vol}/new.whl", data, overwrite=False)
    assert e.value.attempts == 1 and "not retried" in str(e.value)
    for call in (
        lambda: client.files_put(f"{vol}/new.whl", data),
        lambda: client.files_put(f"{vol}/old.whl", data),
        lambda: client.workspace_import("/Users/nb", NOTEBOOK.replace("epochs", "steps")),
    ):
        t0 = time.monotonic()
        with pytest.raises(RestError) as e:
            call()
        assert e.value.attempts > 1 and "retry budget 0.4 s" in str(e.value) and e.value.status is None
        assert time.monotonic() - t0 < 1.0
    assert standin.count("PUT", f"/api/2.0/fs/files{vol}/old.whl") > 2
    assert standin.volume_files == {f"{vol}/old.whl": b"old version"}
    assert client.workspace_export("/Users/nb").decode() == NOTEBOOK


def test_standin_applies_nothing_of_a_body_cut_short(standin):
    """A client that dies mid-body: the stand-in, as the service, neither
    creates nor replaces anything, and answers nothing."""
    standin.volume_files["/Volumes/main/default/v/f"] = b"old"
    # a complete JSON object with trailing blanks cut: only Content-Length says it is short
    imp = json.dumps({"path": "/Users/nb", "format": "AUTO", "content": base64.b64encode(b"x").decode()})
    for method, path, ctype, body, sent in (
        (
            "PUT",
            "/api/2.0/fs/files/Volumes/main/default/v/f?overwrite=true",
            "application/octet-stream",
            b"n" * 100,
            40,
        ),
        ("PUT", "/api/2.0/fs/files/Volumes/main/default/v/g", "application/octet-stream", b"n" * 100, 40),
        ("POST", "/api/2.0/workspace/import", "application/json", imp.encode() + b" " * 50, len(imp)),
    ):
        url = urllib.parse.urlsplit(standin.url)
        with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
            head = f"{method} {path} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {standin.token}\r\n"
            head += f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
            sock.sendall(head.encode() + body[:sent])
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(1024) == b""  # closed without an answer
    assert len(standin.requests) == 3
    assert standin.volume_files == {"/Volumes/main/default/v/f": b"old"} and "/Users/nb" not in standin.workspace


def test_found_means_the_thing_is_missing_not_that_the_endpoint_is(client):
    """found(): None for RESOURCE_DOES_NOT_EXIST / NOT_FOUND and a body-less 404 to a HEAD;
    ENDPOINT_NOT_FOUND (a wrong path or workspace URL) is raised, not taken for absence."""
    from sparkgrad.databricks.client import found

    assert found(lambda: client.dbfs_get_status("/FileStore/nothing-here")) is None
    assert found(lambda: client.files_head("/Volumes/main/default/wheels/none.whl")) is None
    with pytest.raises(RestError) as e:
        found(lambda: client.request("GET", "/api/2.0/dbfs/get-statuz", query={"path": "/x"}))
    assert (e.value.status, e.value.error_code) == (404, "ENDPOINT_NOT_FOUND")


# ---- Workspace ----------------------------------------------------------------------------


def test_workspace_import_export_status_and_delete(client):
    with pytest.raises(RestError) as e:
        client.workspace_import("/Users/me@x.com/sg/train", NOTEBOOK)
    assert e.value.error_code == "RESOURCE_DOES_NOT_EXIST"  # the parent folder must exist
    client.workspace_mkdirs("/Users/me@x.com/sg")
    client.workspace_import("/Users/me@x.com/sg/train", NOTEBOOK)
    assert client.workspace_export("/Users/me@x.com/sg/train").decode() == NOTEBOOK
    status = client.workspace_get_status("/Users/me@x.com/sg/train")
    assert (status["object_type"], status["language"]) == ("NOTEBOOK", "PYTHON")
    with pytest.raises(RestError) as e:
        client.workspace_import("/Users/me@x.com/sg/train", NOTEBOOK, overwrite=False)
    assert (e.value.status, e.value.error_code) == (400, "RESOURCE_ALREADY_EXISTS")
    ipynb = json.loads(client.workspace_export("/Users/me@x.com/sg/train", format="JUPYTER"))
    client.workspace_import("/Users/me@x.com/sg/copy", json.dumps(ipynb), format="JUPYTER")
    assert client.workspace_get_status("/Users/me@x.com/sg/copy")["object_type"] == "NOTEBOOK"
    client.workspace_import("/Users/me@x.com/sg/conf.yaml", b"epochs: 1\n", format="AUTO")
    assert client.workspace_get_status("/Users/me@x.com/sg/conf.yaml")["object_type"] == "FILE"
    kinds = sorted((o["path"].rsplit("/", 1)[1], o["object_type"]) for o in client.workspace_list("/Users/me@x.com/sg"))
    assert kinds == [("conf.yaml", "FILE"), ("copy", "NOTEBOOK"), ("train", "NOTEBOOK")]
    with pytest.raises(RestError) as e:
        client.workspace_delete("/Users/me@x.com/sg")
    assert e.value.error_code == "DIRECTORY_NOT_EMPTY"
    client.workspace_delete("/Users/me@x.com/sg", recursive=True)
    with pytest.raises(RestError):
        client.workspace_get_status("/Users/me@x.com/sg/train")


def test_workspace_import_over_10mb_is_refused_by_client_and_standin(client):
    big = b"#" * (10 * MB + 1)
    with pytest.raises(InvalidArgumentError, match="10 MB"):
        client.workspace_import("/Users/big", big)
    payload = {
        "path": "/Users/big",
        "format": "SOURCE",
        "language": "PYTHON",
        "content": base64.b64encode(big).decode(),
    }
    with pytest.raises(RestError) as e:
        client.api("POST", "/api/2.0/workspace/import", payload)
    assert e.value.error_code == "MAX_NOTEBOOK_SIZE_EXCEEDED"


# ---- clusters and libraries -----------------------------------------------------------------


def test_wait_cluster_running_starts_a_terminated_cluster(client, standin):
    info = client.wait_cluster_running("0101-standin", timeout=10)
    assert info["state"] == "RUNNING"
    assert standin.count("POST", "/api/2.1/clusters/start") == 1
    with pytest.raises(RestError) as e:
        client.clusters_start("0101-standin")
    assert e.value.error_code == "INVALID_STATE"
    with pytest.raises(RestError) as e:
        client.clusters_get("nope")
    assert e.value.error_code == "INVALID_PARAMETER_VALUE"


def test_libraries_install_waits_for_installed_and_reports_failed(client):
    client.wait_cluster_running("0101-standin", timeout=10)
    whl = "/Volumes/main/default/wheels/sparkgrad-0.1-py3-none-any.whl"
    client.files_put(whl, b"PK")
    client.libraries_install("0101-standin", [{"whl": whl}])
    statuses = client.wait_libraries("0101-standin", [{"whl": whl}], timeout=10)
    assert [s["status"] for s in statuses] == ["INSTALLED"]
    egg = "dbfs:/FileStore/eggs/sparkgrad-0.1-py3.10.egg"  # runtimes before 14.0 still take eggs
    client.dbfs_put(egg, b"egg")
    client.libraries_install("0101-standin", [{"egg": egg}])
    statuses = client.wait_libraries("0101-standin", [{"egg": egg}], timeout=10)
    assert [(s["library"], s["status"]) for s in statuses] == [({"egg": egg}, "INSTALLED")]
    missing = [{"whl": "/Volumes/main/default/wheels/missing.whl"}]
    client.libraries_install("0101-standin", missing)
    with pytest.raises(RestError, match="missing.whl.* failed to install on 0101-standin"):
        client.wait_libraries("0101-standin", missing, timeout=10)


# ---- jobs and runs ----------------------------------------------------------------------------


def deploy_notebook(client: Client, path: str = "/Users/me/train", source: str = NOTEBOOK) -> str:
    client.workspace_mkdirs(path.rsplit("/", 1)[0])
    client.workspace_import(path, source)
    return path


def test_job_create_get_list_reset_run_and_output(client, standin):
    path = deploy_notebook(client)
    settings = notebook_job(
        "sg-train",
        path,
        base_parameters={"epochs": 2, "data": "/Volumes/main/default/mnist"},
        job_clusters=[{"job_cluster_key": "main", "new_cluster": {"spark_version": "15.4.x-scala2.12"}}],
        job_cluster_key="main",
        libraries=[{"whl": "/Volumes/main/default/wheels/sparkgrad.whl"}],
        quartz_cron_expression="0 0 3 * * ?",
        timezone_id="Europe/Berlin",
        email_notifications={"on_failure": ["me@x.com"]},
        max_retries=1,
        timeout_seconds=3600,
    )
    job_id = client.jobs_create(settings)
    stored = client.jobs_get(job_id)["settings"]
    assert stored["schedule"]["timezone_id"] == "Europe/Berlin"
    assert stored["timeout_seconds"] == 3600 and stored["tasks"][0]["timeout_seconds"] == 3600
    assert stored["tasks"][0]["max_retries"] == 1
    assert [j["job_id"] for j in client.jobs_list(name="sg-train")] == [job_id]
    assert client.jobs_list(name="other") == []
    client.jobs_reset(job_id, {**settings, "max_concurrent_runs": 2})
    assert client.jobs_get(job_id)["settings"]["max_concurrent_runs"] == 2

    run_id = client.jobs_run_now(job_id, notebook_params={"epochs": 5}, idempotency_token="deploy-1")
    assert client.jobs_run_now(job_id, idempotency_token="deploy-1") == run_id  # one run per token
    run = client.wait_run(run_id, timeout=10)
    assert (run["state"]["life_cycle_state"], run["state"]["result_state"]) == ("TERMINATED", "SUCCESS")
    output = client.runs_get_output(run_id)  # looks up the task run
    assert output["notebook_output"]["result"] == "trained 5 epochs on /Volumes/main/default/mnist"
    with pytest.raises(RestError, match="multiple tasks"):
        client.api("GET", "/api/2.1/jobs/runs/get-output", query={"run_id": run_id})
    assert [r["run_id"] for r in client.runs_list(job_id=job_id)] == [run_id]
    assert client.runs_list(job_id=job_id, active_only=True) == []


def test_failed_notebook_run_is_failed_with_the_error(client):
    path = deploy_notebook(client, "/Users/me/bad", FAILING_NOTEBOOK)
    run_id = client.runs_submit(
        {
            "run_name": "once",
            "tasks": [
                {"task_key": "t", "notebook_task": {"notebook_path": path}, "existing_cluster_id": "0101-standin"}
            ],
        }
    )
    run = client.wait_run(run_id, timeout=10)
    assert run["state"]["result_state"] == "FAILED"
    assert "RuntimeError: loss is NaN" in client.runs_get_output(run_id)["error"]


def test_runs_cancel_skipped_runs_and_jobs_api_22(standin):
    client = make_client(standin, jobs_api="2.2")
    path = deploy_notebook(client)
    settings = notebook_job("j", path, existing_cluster_id="0101-standin", timeout_seconds=60)
    job_id = client.jobs_create(settings)
    client.jobs_reset(job_id, {**settings, "timeout_seconds": 120})
    assert client.jobs_get(job_id)["settings"]["timeout_seconds"] == 120
    assert [j["job_id"] for j in client.jobs_list(name="j")] == [job_id]
    run_id = client.jobs_run_now(job_id)
    assert client.runs_list(job_id=job_id, active_only=True)[0]["run_id"] == run_id
    skipped = client.jobs_run_now(job_id)  # max_concurrent_runs 1 and one active: skipped at once
    assert client.runs_get(skipped)["state"] == {
        "life_cycle_state": "SKIPPED",
        "state_message": "Skipping this run because the limit of 1 maximum concurrent runs has been reached.",
        "user_cancelled_or_timedout": False,
    }
    client.runs_cancel(run_id)
    state = client.runs_get(run_id)["state"]
    assert (state["life_cycle_state"], state["result_state"], state["user_cancelled_or_timedout"]) == (
        "TERMINATED",
        "CANCELED",
        True,
    )
    nb = {"notebook_path": path, "base_parameters": {"data": "/Volumes/d"}}
    task = {"task_key": "t", "notebook_task": nb, "existing_cluster_id": "0101-standin"}
    once = client.runs_submit({"run_name": "once", "tasks": [task]}, idempotency_token="submit-1")
    assert client.wait_run(once, timeout=10)["state"]["result_state"] == "SUCCESS"
    assert client.runs_get_output(once)["notebook_output"]["result"] == "trained 1 epochs on /Volumes/d"
    for method, tail in (("POST", "create"), ("POST", "reset"), ("GET", "get"), ("GET", "list"),
                         ("POST", "run-now"), ("GET", "runs/list"), ("GET", "runs/get"), ("POST", "runs/cancel"),
                         ("POST", "runs/submit"), ("GET", "runs/get-output")):  # fmt: skip
        assert standin.count(method, f"/api/2.2/jobs/{tail}") >= 1, tail
    assert not [p for _, p in standin.requests if p.startswith("/api/2.1/jobs/")]


def test_standin_enforces_required_fields(client):
    with pytest.raises(RestError) as e:
        client.jobs_create({"name": "x", "tasks": [{"task_key": "t", "notebook_task": {}}]})
    assert (e.value.status, e.value.error_code) == (400, "INVALID_PARAMETER_VALUE")
    assert "notebook_path" in e.value.message
    with pytest.raises(RestError) as e:
        client.request("POST", "/api/2.1/jobs/create", b"{not json", content_type="application/json")
    assert e.value.error_code == "MALFORMED_REQUEST"
    with pytest.raises(RestError) as e:
        client.api("GET", "/api/2.1/jobs/create")
    assert (e.value.status, e.value.error_code) == (404, "ENDPOINT_NOT_FOUND")


def test_listings_follow_every_page(standin):
    client = make_client(standin)
    path = deploy_notebook(client)
    ids = [client.jobs_create(notebook_job(f"j{i}", path, existing_cluster_id="0101-standin")) for i in range(101)]
    assert [j["job_id"] for j in client.jobs_list()] == ids  # 100 a page at most
    assert standin.count("GET", "/api/2.1/jobs/list") == 2
    task = {"task_key": "t", "notebook_task": {"notebook_path": path}, "existing_cluster_id": "0101-standin"}
    runs = [client.runs_submit({"run_name": f"r{i}", "tasks": [task]}) for i in range(26)]
    assert [r["run_id"] for r in client.runs_list()] == runs[::-1]  # newest first, 25 a page at most
    assert standin.count("GET", "/api/2.1/jobs/runs/list") == 2
    standin.directory_page = 2  # the Files API may answer with fewer entries than page_size
    vol = "/Volumes/main/default/v"
    for i in range(5):
        client.files_put(f"{vol}/d/f{i}", b"x")
    assert [c["name"] for c in client.directories_list(f"{vol}/d")] == [f"f{i}" for i in range(5)]
    assert standin.count("GET", "/api/2.0/fs/directories/Volumes/main/default/v/d") == 3


def test_standin_wants_a_bearer_token_on_every_api_call(standin):
    from sparkgrad import _core

    transport = _core.RestClient(standin.url, allow_http_loopback=True, budget=5.0)
    for authorization, status, code in (
        (None, 401, "UNAUTHENTICATED"),
        (f"Basic {standin.token}", 401, "UNAUTHENTICATED"),
        ("Bearer dapi-unknown", 403, "PERMISSION_DENIED"),
    ):
        with pytest.raises(RestError) as e:
            transport.call("GET", "/api/2.0/dbfs/list?path=%2F", authorization=authorization, idempotent=True)
        assert (e.value.status, e.value.error_code) == (status, code), authorization
        assert "the workspace refused the credentials: check the token or the OAuth client" in str(e.value)
        assert standin.token not in str(e.value) and "dapi-unknown" not in str(e.value)
    reply = transport.call("GET", "/api/2.0/dbfs/list?path=%2F", authorization=f"Bearer {standin.token}")
    assert reply[0] == 200 and json.loads(reply[1]) == {"files": []}


# ---- retries ---------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 503])
def test_429_and_503_are_retried_after_retry_after_seconds(client, standin, status):
    client.dbfs_put("/f", b"1")
    standin.inject("/dbfs/get-status", status=status, retry_after="1")
    t0 = time.monotonic()
    assert client.dbfs_get_status("/f")["file_size"] == 1
    assert 0.9 <= time.monotonic() - t0 < 3
    assert standin.count("GET", "/api/2.0/dbfs/get-status") == 2


@pytest.mark.parametrize(
    "fault", [{"status": 503}, {"drop": True}, {"delay": 1.5}, {"status": 429, "retry_after": "0"}]
)
def test_idempotent_calls_are_retried_under_faults(standin, fault):
    client = make_client(standin, timeout=0.5)
    client.dbfs_put("/f", b"1")
    standin.inject("/dbfs/get-status", times=2, **fault)
    assert client.dbfs_get_status("/f")["file_size"] == 1
    assert standin.count("GET", "/api/2.0/dbfs/get-status") == 3


def test_retries_stop_at_the_budget(standin):
    client = make_client(standin, budget=2.5)
    standin.inject("/jobs/runs/get", status=429, retry_after="1", times=100)
    t0 = time.monotonic()
    with pytest.raises(RestError) as e:
        client.runs_get(1)
    assert time.monotonic() - t0 < 3.5
    assert e.value.status == 429 and e.value.attempts >= 2
    assert "retry budget 2.5 s" in str(e.value)
    assert e.value.retries[0] == (429, "HTTP 429", 1.0) and len(e.value.retries) == e.value.attempts - 1


@pytest.mark.parametrize("fault", [{"status": 503}, {"drop": True}])
def test_non_idempotent_post_is_not_retried(client, standin, fault):
    path = deploy_notebook(client)
    standin.inject("/jobs/create", **fault)
    with pytest.raises(RestError) as e:
        client.jobs_create(notebook_job("j", path, existing_cluster_id="0101-standin"))
    assert standin.count("POST", "/api/2.1/jobs/create") == 1
    assert e.value.attempts == 1 and e.value.method == "POST" and e.value.path == "/api/2.1/jobs/create"


def test_429_on_a_non_idempotent_post_is_retried_and_creates_one_job(client, standin):
    path = deploy_notebook(client)
    standin.inject("/jobs/create", status=429, retry_after="0")
    client.jobs_create(notebook_job("j", path, existing_cluster_id="0101-standin"))
    assert standin.count("POST", "/api/2.1/jobs/create") == 2 and len(standin.jobs) == 1


def test_run_now_with_an_idempotency_token_is_retried_and_starts_one_run(client, standin):
    path = deploy_notebook(client)
    job_id = client.jobs_create(notebook_job("j", path, existing_cluster_id="0101-standin"))
    standin.inject("/jobs/run-now", drop=True)
    client.jobs_run_now(job_id, idempotency_token="tok-1")
    assert standin.count("POST", "/api/2.1/jobs/run-now") == 2 and len(standin.runs) == 1


def test_connection_refused_is_retried_then_fails_within_the_budget():
    with Standin() as s:
        url = s.url
    client = Client(url, "dapi-x", budget=1.0, backoff=0.1, config_file=os.devnull, allow_http_loopback=True)
    t0 = time.monotonic()
    with pytest.raises(RestError) as e:
        client.jobs_create({"name": "x"})
    assert e.value.attempts > 1 and e.value.status is None and time.monotonic() - t0 < 2.5


# ---- errors and transport policy ----------------------------------------------------------------


def test_rest_error_carries_status_code_message_method_and_path(client):
    with pytest.raises(RestError) as e:
        client.workspace_get_status("/nope")
    err = e.value
    assert (err.status, err.error_code, err.method) == (404, "RESOURCE_DOES_NOT_EXIST", "GET")
    assert err.path == "/api/2.0/workspace/get-status?path=%2Fnope"
    assert err.message == "Path (/nope) doesn't exist."
    assert str(err).startswith("GET /api/2.0/workspace/get-status?path=%2Fnope: HTTP 404 RESOURCE_DOES_NOT_EXIST")


def test_refused_token_says_so_without_the_token(standin):
    client = make_client(standin, token="dapi-wrong-token-123456")
    with pytest.raises(RestError) as e:
        client.dbfs_list("/")
    assert e.value.status == 403 and "refused the credentials" in str(e.value)
    assert "dapi-wrong-token-123456" not in str(e.value)


def test_plain_http_is_refused_unless_loopback_is_allowed(standin):
    with pytest.raises(InvalidArgumentError, match="refusing plain http"):
        Client(standin.url, standin.token, config_file=os.devnull, allow_http_loopback=False)
    with pytest.raises(InvalidArgumentError, match="refusing plain http"):
        Client("http://example.com", "t", config_file=os.devnull, allow_http_loopback=True)


def test_client_defaults_are_60_s_a_request_and_a_300_s_retry_budget(standin):
    client = Client(standin.url, standin.token, config_file=os.devnull, allow_http_loopback=True)
    assert (client._transport.timeout, client._transport.budget) == (60.0, 300.0)
    assert (client.poll, client.jobs_api) == (1.0, "2.1")
    client = make_client(standin, timeout=7.5, budget=42.0)
    assert (client._transport.timeout, client._transport.budget) == (7.5, 42.0)


# ---- configuration ----------------------------------------------------------------------------------


def test_missing_config_lists_the_variables_and_files_read(tmp_path):
    cfg = tmp_path / "databrickscfg"
    with pytest.raises(DatabricksConfigError) as e:
        resolve_config(env={}, config_file=cfg, notebook_context=lambda: None)
    text = str(e.value)
    for name in ("DATABRICKS_HOST", "DATABRICKS_TOKEN", "DATABRICKS_CLIENT_ID", "DATABRICKS_CLIENT_SECRET", str(cfg)):
        assert name in text
    assert "no such file" in text and "notebook context" in text


def test_config_from_arguments_env_profile_and_notebook(tmp_path):
    cfg = tmp_path / "databrickscfg"
    cfg.write_text(
        "[DEFAULT]\nhost = adb-1.azuredatabricks.net\ntoken = dapi-file\n\n"
        "[sp]\nhost = https://h2/\nclient_id = id\nclient_secret = sec\n"
    )
    c = resolve_config(env={}, config_file=cfg, notebook_context=None)
    assert (c.host, c.token, c.auth_type) == ("https://adb-1.azuredatabricks.net", "dapi-file", "pat")
    c = resolve_config(env={"DATABRICKS_CONFIG_PROFILE": "sp"}, config_file=cfg, notebook_context=None)
    assert (c.host, c.client_id, c.auth_type) == ("https://h2", "id", "oauth-m2m")
    c = resolve_config(env={"DATABRICKS_HOST": "https://env", "DATABRICKS_TOKEN": "dapi-env"}, config_file=cfg)
    assert (c.host, c.token) == ("https://env", "dapi-env") and "DATABRICKS_TOKEN" in c.source
    c = resolve_config("https://arg", "dapi-arg", env={"DATABRICKS_TOKEN": "dapi-env"}, config_file=cfg)
    assert c.token == "dapi-arg" and "dapi-arg" not in repr(c)
    c = resolve_config(env={}, config_file=tmp_path / "none", notebook_context=lambda: ("https://nb", "dapi-nb"))
    assert (c.host, c.token, c.source) == (
        "https://nb",
        "dapi-nb",
        "host from the notebook context; token from the notebook context",
    )
    with pytest.raises(DatabricksConfigError, match=r"profile \[nope\] is not in"):
        resolve_config(profile="nope", env={}, config_file=cfg)


def test_oauth_m2m_token_is_fetched_once_and_refreshed_before_expiry(standin):
    client = make_client(standin, client_id=standin.client_id, client_secret=standin.client_secret)
    assert client.config.auth_type == "oauth-m2m"
    for _ in range(3):
        client.dbfs_mkdirs("/x")
    assert standin.count("POST", "/oidc/v1/token") == 1
    now = [0.0]
    auth = OAuthM2M(client._transport, standin.client_id, standin.client_secret, clock=lambda: now[0])
    first = auth.authorization()
    now[0] = standin.oauth_lifetime - 120  # still 2 minutes left: cached
    assert auth.authorization() == first and standin.count("POST", "/oidc/v1/token") == 2
    now[0] = standin.oauth_lifetime - 30  # within the refresh margin
    assert auth.authorization() != first and standin.count("POST", "/oidc/v1/token") == 3


def test_oauth_client_from_the_environment_is_used(standin, monkeypatch):
    monkeypatch.delenv("DATABRICKS_TOKEN", raising=False)
    monkeypatch.delenv("DATABRICKS_CONFIG_PROFILE", raising=False)
    monkeypatch.setenv("DATABRICKS_HOST", standin.url)
    monkeypatch.setenv("DATABRICKS_CLIENT_ID", standin.client_id)
    monkeypatch.setenv("DATABRICKS_CLIENT_SECRET", standin.client_secret)
    client = Client(config_file=os.devnull, allow_http_loopback=True, budget=5.0)
    assert client.config.auth_type == "oauth-m2m" and client.config.token is None
    assert "client_id from DATABRICKS_CLIENT_ID; client_secret from DATABRICKS_CLIENT_SECRET" in client.config.source
    client.dbfs_mkdirs("/x")
    client.dbfs_mkdirs("/y")
    assert standin.count("POST", "/oidc/v1/token") == 1 and len(standin.oauth_tokens) == 1


def test_oauth_refused_client_secret_is_not_shown(standin):
    client = make_client(standin, client_id=standin.client_id, client_secret="wrong-secret-value-42")
    with pytest.raises(RestError) as e:
        client.dbfs_mkdirs("/x")
    assert (e.value.status, e.value.error_code, e.value.path) == (401, "invalid_client", "/oidc/v1/token")
    assert "the workspace refused the credentials: check the token or the OAuth client" in str(e.value)
    assert "wrong-secret-value-42" not in str(e.value)
    basic = base64.b64encode(f"{standin.client_id}:wrong-secret-value-42".encode()).decode()
    assert basic not in str(e.value) and basic not in repr(e.value.__dict__)


# ---- redaction ---------------------------------------------------------------------------------------


def test_no_token_secret_or_payload_in_any_log_line_or_exception(standin, caplog, tmp_path):
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    payload = os.urandom(MB + 77)
    secrets = {standin.token, standin.client_secret, base64.b64encode(payload[:MB]).decode()[:64]}
    secrets.add(base64.b64encode(f"{standin.client_id}:{standin.client_secret}".encode()).decode())

    def attempt(fn, *args, **kw):
        try:
            fn(*args, **kw)
        except Exception as exc:  # every failure's text is checked below
            texts.append(f"{type(exc).__name__}: {exc} {exc.__dict__!r}")

    notebook_b64 = base64.b64encode(NOTEBOOK.encode()).decode()
    secrets.add(notebook_b64[:40])  # a workspace import's content, as sent

    pat = make_client(standin)
    oauth = make_client(standin, client_id=standin.client_id, client_secret=standin.client_secret)
    for c in (pat, oauth):
        attempt(c.dbfs_put, "/up/w.whl", payload)
        standin.inject("/dbfs/add-block", drop=True)
        attempt(c.dbfs_put, "/up/w2.whl", payload)
        standin.inject("/dbfs/get-status", status=429, retry_after="0")
        attempt(c.dbfs_get_status, "/up/none")
        attempt(c.workspace_import, "/nope/x", NOTEBOOK)
        standin.inject("/workspace/import", status=503)
        attempt(c.workspace_import, "/Users/x", NOTEBOOK, overwrite=False)
        attempt(c.workspace_import, "/Users/x", NOTEBOOK)  # succeeds
        attempt(c.workspace_import, "/Users/x", NOTEBOOK, overwrite=False)  # RESOURCE_ALREADY_EXISTS
        standin.inject("/workspace/import", drop=True)
        attempt(c.workspace_import, "/Users/y", NOTEBOOK, overwrite=False)
    attempt(make_client(standin, token="dapi-" + "z" * 20).dbfs_list, "/")
    attempt(make_client(standin, client_id=standin.client_id, client_secret=standin.client_secret + "x").dbfs_list, "/")
    secrets |= {"dapi-" + "z" * 20, standin.client_secret + "x"}
    assert standin.count("POST", "/oidc/v1/token") == 2  # the OAuth client's, and the refused one's
    (issued,) = standin.oauth_tokens  # the access token the OAuth client used on every call above
    secrets.add(issued)
    assert len(texts) >= 12
    lines = [r.getMessage() for r in caplog.records] + texts
    assert any("add-block" in line for line in lines)
    assert any("POST /oidc/v1/token -> 200" in line for line in lines)  # the OAuth path logged at DEBUG
    assert any("attempt 1: HTTP 429; retrying in 0.00 s" in line for line in lines)
    assert any("RESOURCE_ALREADY_EXISTS" in line for line in texts)
    for line in lines:
        for secret in secrets:
            assert secret not in line


# ---- TLS, libcurl, GIL -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loopback_cert(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


def test_tls_certificate_is_verified_against_ssl_cert_file(loopback_cert, monkeypatch):
    with Standin(tls=loopback_cert) as s:
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
        client = Client(s.url, s.token, config_file=os.devnull, budget=5.0, backoff=0.05)
        with pytest.raises(RestError) as e:
            client.dbfs_list("/")
        assert "SSL" in str(e.value) and e.value.attempts == 1  # a refused certificate is not retried
        assert s.requests == []
        monkeypatch.setenv("SSL_CERT_FILE", loopback_cert[0])
        assert client.dbfs_list("/") == []


def test_missing_libcurl_names_the_library_and_the_fix(standin):
    code = (
        "from sparkgrad.databricks import Client\n"
        f"c = Client({standin.url!r}, 'dapi-x', config_file='/dev/null', allow_http_loopback=True)\n"
        "try:\n    c.dbfs_list('/')\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
    )
    env = {**os.environ, "SPARKGRAD_LIBCURL": "/nonexistent/libcurl.so.4"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60).stdout
    assert out.startswith("RestError GET /api/2.0/dbfs/list")
    assert "needs libcurl.so.4" in out and "apt-get install libcurl4" in out


def test_the_gil_is_released_while_a_call_waits(standin, client):
    standin.inject("/dbfs/get-status", delay=0.8)
    ticks = []
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            client.dbfs_get_status("/missing")
        except BaseException as exc:  # noqa: BLE001 - checked below, in the test's thread
            outcome.append(exc)

    waiter = threading.Thread(target=call)
    waiter.start()
    t0 = time.monotonic()
    while waiter.is_alive() and time.monotonic() - t0 < 5:
        ticks.append(time.monotonic())
        time.sleep(0.01)
    waiter.join()
    assert len(outcome) == 1 and isinstance(outcome[0], RestError), outcome  # the 404 reached the caller
    assert len(ticks) > 30  # the main thread ran throughout the 0.8 s call


def test_ctrl_c_stops_a_call_that_waits(standin):
    code = (
        "import os, signal, threading, time\n"
        "from sparkgrad.databricks import Client\n"
        f"c = Client({standin.url!r}, {standin.token!r}, config_file='/dev/null', allow_http_loopback=True)\n"
        "threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
        "t0 = time.monotonic()\n"
        "try:\n    c.dbfs_get_status('/f')\nexcept KeyboardInterrupt:\n"
        "    print('interrupted after %.1f s' % (time.monotonic() - t0))\n"
    )
    standin.inject("/dbfs/get-status", delay=8.0)  # an answer that would come in 8 s ...
    standin.inject("/dbfs/list", status=429, retry_after="30", times=5)  # ... and a 30 s backoff
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.startswith("interrupted after 0.") or out.startswith("interrupted after 1.")
    out = subprocess.run(
        [sys.executable, "-c", code.replace("dbfs_get_status", "dbfs_list")], capture_output=True, text=True, timeout=60
    ).stdout
    assert out.startswith("interrupted after 0.") or out.startswith("interrupted after 1.")


def test_a_slow_answer_is_cut_at_the_budget_not_the_request_timeout(standin):
    client = make_client(standin, timeout=30.0, budget=1.0)
    standin.inject("/dbfs/get-status", delay=3.0, times=5)
    t0 = time.monotonic()
    with pytest.raises(RestError, match="Timeout was reached"):
        client.dbfs_get_status("/f")
    assert time.monotonic() - t0 < 2.0


def test_a_response_over_the_cap_fails_without_retry(standin):
    from sparkgrad import _core

    transport = _core.RestClient(standin.url, max_response=10, allow_http_loopback=True, budget=5.0)
    standin.volume_files["/Volumes/c/s/v/big"] = b"x" * 100
    with pytest.raises(RestError, match="larger than the 10-byte cap") as e:
        transport.call(
            "GET", "/api/2.0/fs/files/Volumes/c/s/v/big", authorization=f"Bearer {standin.token}", idempotent=True
        )
    assert e.value.attempts == 1


def test_idempotent_calls_reuse_one_connection_and_others_get_a_fresh_one(client, standin):
    for _ in range(5):
        client.dbfs_mkdirs("/x")
    assert len(standin.peers) == 5 and len(set(standin.peers)) == 1
    standin.inject("/dbfs/mkdirs", drop=True)  # a dropped connection is replaced
    client.dbfs_mkdirs("/x")
    assert len(set(standin.peers)) == 2
    # libcurl would resend a request whose reused connection died: a call that
    # is not safe to repeat never rides on a kept connection
    for _ in range(3):
        client.api("POST", "/api/2.0/dbfs/create", {"path": "/h", "overwrite": True})
    assert len(set(standin.peers)) == 5
