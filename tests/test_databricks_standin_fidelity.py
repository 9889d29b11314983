"""The Databricks stand-in (tests/databricks_standin.py) checked with the
official client: databricks-sdk drives the upload / import / create / run /
get-output flow against it, and its typed errors and retries see the
stand-in's error bodies and injected faults as they would a workspace's."""

from __future__ import annotations

import base64
import io

import pytest
from databricks_standin import Standin

sdk = pytest.importorskip("databricks.sdk")
from databricks.sdk.errors import NotFound, ResourceAlreadyExists  # noqa: E402
from databricks.sdk.service import jobs, workspace  # noqa: E402

NOTEBOOK = """# Databricks notebook source
dbutils.widgets.text("epochs", "1")
# COMMAND ----------
dbutils.notebook.exit("epochs=" + dbutils.widgets.get("epochs"))
"""


@pytest.fixture
def standin():
    with Standin(run_steps=0, cluster_steps=0) as s:
        yield s


@pytest.fixture
def w(standin, monkeypatch, tmp_path):
    for var in ("DATABRICKS_HOST", "DATABRICKS_TOKEN", "DATABRICKS_CONFIG_PROFILE", "DATABRICKS_CLIENT_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DATABRICKS_CONFIG_FILE", str(tmp_path / "none.cfg"))
    return sdk.WorkspaceClient(host=standin.url, token=standin.token, auth_type="pat")


def test_sdk_upload_import_create_run_and_get_output(w, standin):
    w.dbfs.upload("/FileStore/sg/model.bin", io.BytesIO(b"\x00" * (3 << 20)), overwrite=True)
    assert w.dbfs.get_status("/FileStore/sg/model.bin").file_size == 3 << 20
    assert standin.count("POST", "/api/2.0/dbfs/add-block") >= 3
    w.files.upload("/Volumes/main/default/wheels/sg.whl", io.BytesIO(b"PK-wheel"), overwrite=True)
    assert w.files.download("/Volumes/main/default/wheels/sg.whl").contents.read() == b"PK-wheel"

    w.workspace.mkdirs("/Users/me/sg")
    content = base64.b64encode(NOTEBOOK.encode()).decode()
    w.workspace.import_(
        "/Users/me/sg/train",
        content=content,
        format=workspace.ImportFormat.SOURCE,
        language=workspace.Language.PYTHON,
        overwrite=True,
    )
    with pytest.raises(ResourceAlreadyExists):
        w.workspace.import_(
            "/Users/me/sg/train",
            content=content,
            format=workspace.ImportFormat.SOURCE,
            language=workspace.Language.PYTHON,
        )
    assert w.workspace.get_status("/Users/me/sg/train").object_type == workspace.ObjectType.NOTEBOOK

    task = jobs.Task(
        task_key="main",
        notebook_task=jobs.NotebookTask(notebook_path="/Users/me/sg/train", base_parameters={"epochs": "2"}),
        existing_cluster_id="0101-standin",
    )
    job = w.jobs.create(
        name="sg-train",
        tasks=[task],
        schedule=jobs.CronSchedule(quartz_cron_expression="0 0 3 * * ?", timezone_id="UTC"),
        max_concurrent_runs=1,
    )
    assert [j.job_id for j in w.jobs.list(name="sg-train")] == [job.job_id]
    standin.inject("/jobs/runs/get", status=429, retry_after="0")  # the SDK's waiter retries it
    run = w.jobs.run_now(job.job_id, notebook_params={"epochs": "3"}).result()
    assert run.state.result_state == jobs.RunResultState.SUCCESS
    output = w.jobs.get_run_output(run.tasks[0].run_id)
    assert output.notebook_output.result == "epochs=3"


def test_sdk_maps_the_standin_error_bodies_to_its_typed_errors(w):
    with pytest.raises(NotFound):
        w.workspace.get_status("/nope")
    with pytest.raises(NotFound):
        w.dbfs.get_status("/nope")


def test_sdk_oauth_m2m_gets_a_token_from_the_standin(standin, monkeypatch, tmp_path):
    monkeypatch.delenv("DATABRICKS_TOKEN", raising=False)
    monkeypatch.setenv("DATABRICKS_CONFIG_FILE", str(tmp_path / "none.cfg"))
    w = sdk.WorkspaceClient(
        host=standin.url, client_id=standin.client_id, client_secret=standin.client_secret, auth_type="oauth-m2m"
    )
    w.dbfs.mkdirs("/x")
    assert w.dbfs.get_status("/x").is_dir
    assert standin.count("POST", "/oidc/v1/token") == 1
