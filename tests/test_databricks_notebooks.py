"""The notebooks in notebooks/, each run through the local runner: the Fashion-MNIST ones on a small part of
Fashion-MNIST, 03_tabular_click_model on a small synthetic click table it writes itself."""

from __future__ import annotations

import json
import os
import re
import struct

import numpy as np
import pytest
from sparkgrad.data.idx import FASHION_MNIST_DIR

NOTEBOOKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")
ROWS = "2000"  # training and test examples kept by 10_prep
needs_data = pytest.mark.skipif(not os.path.isdir(FASHION_MNIST_DIR), reason="dataset-fashion-mnist not installed")
pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def notebook(name: str) -> str:
    return os.path.join(NOTEBOOKS, name + ".py")


@pytest.fixture(scope="module")
def dbfs(tmp_path_factory):
    return tmp_path_factory.mktemp("dbfs")


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory):
    """The notebooks log to MLflow when it is installed and a tracking URI is set: a file store of this
    module's own (MLflow 3 opens one only with MLFLOW_ALLOW_FILE_STORE); None without mlflow."""
    try:
        import mlflow  # noqa: F401
    except ImportError:
        yield None
        return
    uri = "file:" + str(tmp_path_factory.mktemp("mlflow") / "mlruns")  # created by MLflow, with experiment 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        yield uri


def mlflow_run(store, run_id):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=store).get_run(run_id)


@pytest.fixture(scope="module")
def run(spark, dbfs, tmp_path_factory, mlflow_store):
    from sparkgrad.databricks import run_notebook

    def go(name, params, timeout=300, **kw):
        kw.setdefault("run_dir", str(tmp_path_factory.mktemp(name)))  # where display() saves figures
        return run_notebook(notebook(name), params, timeout, spark=spark, dbfs_root=str(dbfs), **kw)

    return go


@pytest.fixture(scope="module")
def records(run):
    """10_prep's TFRecords of the first 2000 training and test examples, at dbfs:/data/records."""
    result = run(
        "10_prep",
        {
            "input_data": f"file:{FASHION_MNIST_DIR}",
            "output_data": "dbfs:/data/records",
            "max_rows": ROWS,
            "shards": "2",
        },
    )
    return json.loads(result.exit_value)


@needs_data
def test_prep_writes_the_requested_rows_to_its_output_data(records, dbfs):
    assert records["output_data"] == "dbfs:/data/records"
    assert records["files"] == ["test.tfrecords", "train-00000-of-00002.tfrecords", "train-00001-of-00002.tfrecords"]
    assert (records["train_rows"], records["test_rows"]) == (2000, 2000)
    assert (dbfs / "data/records/test.tfrecords").is_file()


@needs_data
def test_scheduled_job_trains_in_spark_mode_and_writes_model_checkpoints_and_metrics(
    run, records, dbfs, mlflow_store, capsys
):
    # every setting away from its widget default: 1 ps + 1 worker (not 1 + 2), learning rate 0.1 (not 0.07)
    params = {"data_path": "dbfs:/data/records", "output_path": "dbfs:/jobs/run1", "epochs": "1", "mode": "spark"}
    params.update({"learning_rate": "0.1", "num_executors": "2"})
    summary = json.loads(run("02_scheduled_training_job", params).exit_value)
    assert set(summary) == {
        "output_path",
        "model",
        "checkpoints",
        "metrics",
        "learning_rate",
        "num_executors",
        "num_ps",
        "mode",
        "epochs",
        "global_step",
        "test_accuracy",
        "seconds",
        "mlflow_run_id",
    }
    assert (summary["learning_rate"], summary["num_executors"], summary["num_ps"]) == (0.1, 2, 1)
    assert summary["mode"] == "spark" and summary["global_step"] == 20  # 2000 rows, batch 100, each row fed once
    assert summary["test_accuracy"] > 0.5
    # the data was copied whole from DBFS to the driver's local disk, and that copy removed at the end
    copied = re.search(
        r"^copied dbfs:/data/records to (/\S+)/data: (\d+) files, (\d+) bytes$", capsys.readouterr().out, re.M
    )
    assert copied, "no line about the data's local copy"
    sources = [p for p in (dbfs / "data/records").iterdir() if p.is_file()]
    assert (int(copied[2]), int(copied[3])) == (len(sources), sum(p.stat().st_size for p in sources))
    assert not str(copied[1]).startswith(str(dbfs)) and not os.path.exists(copied[1])
    for path in (
        "jobs/run1/model/model.sgckpt",
        "jobs/run1/model/pixel_stats.npz",
        "jobs/run1/checkpoints/model.sgckpt",
    ):
        assert (dbfs / path).is_file(), path
    metrics = json.loads((dbfs / "jobs/run1/metrics.json").read_text())
    assert metrics["test_accuracy"] == summary["test_accuracy"] and metrics["samples"] == 2000
    if mlflow_store is None:
        assert summary["mlflow_run_id"] is None
        return
    logged = mlflow_run(mlflow_store, summary["mlflow_run_id"])
    assert logged.info.status == "FINISHED" and logged.info.run_name == "02_scheduled_training_job"
    assert logged.data.params["mode"] == "spark" and logged.data.params["num_ps"] == "1"
    assert (logged.data.params["learning_rate"], logged.data.params["num_executors"]) == ("0.1", "2")
    assert logged.data.metrics["test_accuracy"] == pytest.approx(summary["test_accuracy"])
    assert logged.data.metrics["samples"] == 2000  # (mnist_dist's metric lines come every 100 steps: none here)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_store)
    names = sorted(f.path for f in client.list_artifacts(logged.info.run_id, "model"))
    assert names == ["model/model.sgckpt", "model/pixel_stats.npz"]
    assert [f.path for f in client.list_artifacts(logged.info.run_id) if not f.is_dir] == ["metrics.json"]


@needs_data
def test_pipeline_chains_prep_train_and_evaluate_through_their_widget_arguments(run, dbfs):
    params = {
        "input_data": f"file:{FASHION_MNIST_DIR}",
        "output_data": "dbfs:/pipeline",
        "max_rows": ROWS,
        "epochs": "1",
    }
    out = json.loads(run("13_pipeline", params).exit_value)
    assert out["prep"]["output_data"] == "dbfs:/pipeline/records"
    assert out["train"]["output_data"] == "dbfs:/pipeline/model" and out["train"]["mode"] == "tensorflow"
    assert out["train"]["global_step"] == 40  # 2 workers, each reading the 2000 rows once, batch 100
    assert out["evaluate"]["rows"] == 2000 and out["evaluate"]["test_accuracy"] > 0.5
    evaluation = json.loads((dbfs / "pipeline/evaluation/evaluation.json").read_text())
    assert sum(map(sum, evaluation["confusion"])) == 2000


@needs_data
def test_quickstart_runs_with_pip_skipped_and_plots_its_metrics_and_logs_them_to_mlflow(
    run, mlflow_store, tmp_path, capsys
):
    params = {"source": f"file:{FASHION_MNIST_DIR}", "work_dir": "dbfs:/quickstart", "max_rows": ROWS, "epochs": "1"}
    lines = []
    result = run("01_quickstart", params, skip_pip=True, log=lines.append, run_dir=str(tmp_path))
    assert any("skipped cell 2: %pip install /Volumes/" in x for x in lines)
    assert result.namespace["chief"]["step"] == 40 and result.namespace["chief"]["test_accuracy"] > 0.5
    assert {m.name for m in result.namespace["cluster"].metrics} == {"loss", "accuracy"}
    assert result.namespace["output"].bar.n == 40
    # display(fig): the loss and accuracy plot, a 10 x 3.5 inch figure at 100 dpi, as a PNG in the run folder
    png = (tmp_path / "display-001.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (1000, 350)
    out = capsys.readouterr().out
    assert f"[display] figure saved to {tmp_path / 'display-001.png'}" in out
    # the live output: each node's lines, named by the node, printed above the progress bar as they came
    assert re.search(r"^worker:0 training done at global step 40; evaluating$", out, re.M)
    for node in ("worker:0", "worker:1"):
        assert re.search(rf"^{node} metric loss=\S+ step=\d+$", out, re.M), node
        assert re.search(rf"^{node} metric accuracy=\S+ step=\d+$", out, re.M), node
    if mlflow_store is not None:  # every node's metric curve, at the global step
        logged = mlflow_run(mlflow_store, result.namespace["mlflow_run"].info.run_id)
        assert logged.data.params["num_executors"] == "3" and logged.data.params["epochs"] == "1"
        assert logged.data.metrics["test_accuracy"] == pytest.approx(result.namespace["chief"]["test_accuracy"])
        assert {k for k in logged.data.metrics if "/" in k} == {
            "worker0/loss",
            "worker0/accuracy",
            "worker1/loss",
            "worker1/accuracy",
        }


@needs_data
def test_horovod_runner_notebook_trains_on_2_spark_tasks_and_evaluates_rank_0s_best_checkpoint(run, records, dbfs):
    params = {"data_path": "dbfs:/data/records", "output_path": "dbfs:/hvd", "np": "2", "epochs": "2"}
    ns = run("20_horovod_runner", params).namespace
    # HorovodRunner(np=2) on the runner's Spark session: a barrier stage of 2 tasks; allreduce keeps the ranks
    # in step: 2 epochs of 1000 rows a rank, 8 batches of 128 each
    assert ns["results"] == [{"rank": 0, "step": 16}, {"rank": 1, "step": 16}]
    assert sorted(p.name for p in (dbfs / "hvd/checkpoints").iterdir()) == ["best.sgck"]
    assert ns["test_accuracy"] > 0.3


@needs_data
@pytest.mark.timeout(900)
def test_pytorch_notebook_trains_the_same_cnn_with_hvd_torch_and_the_distributor(run, records):
    pytest.importorskip("torch")
    params = {"data_path": "dbfs:/data/records", "np": "2", "epochs": "3", "learning_rate": "0.05"}
    ns = run("21_pytorch_on_spark", params, timeout=600).namespace
    summary = ns["summary"]
    # 3 epochs of 1000 rows a rank: well above chance (0.1) for both, and the two runs end close: the same
    # start, shards and order, gradients averaged by two different rings
    assert summary["hvd_test_accuracy"] > 0.4 and summary["ddp_test_accuracy"] > 0.4, summary
    assert abs(summary["hvd_test_accuracy"] - summary["ddp_test_accuracy"]) < 0.05, summary
    assert summary["max_weight_difference"] < 1e-3, summary


@needs_data
def test_scheduled_job_rerun_with_the_same_output_resumes_from_its_checkpoint(run, records, dbfs):
    params = {"data_path": "dbfs:/data/records", "output_path": "dbfs:/jobs/resume", "epochs": "1"}
    first = json.loads(run("02_scheduled_training_job", params).exit_value)
    second = json.loads(run("02_scheduled_training_job", params).exit_value)
    assert (first["mode"], first["global_step"]) == ("tensorflow", 40)
    # The chief restores step 40 on the ps; asynchronous training lets the other worker push a gradient or
    # two before that restore, which it overwrites (mnist_dist's resume): 80 at most, never from 0 again.
    assert 75 <= second["global_step"] <= 80


def test_tabular_click_notebook_trains_from_parquet_columns_and_logs_its_auc_and_model_to_mlflow(
    run, dbfs, mlflow_store
):
    result = run("03_tabular_click_model", {"rows": "20000", "work_dir": "dbfs:/clicks"})
    summary = json.loads(result.exit_value)
    assert summary["data_path"] == "dbfs:/clicks/data"
    assert sorted(p.name for p in (dbfs / "clicks/data").iterdir()) == [f"part-0000{i}.parquet" for i in range(4)]
    assert summary["train_rows"] + summary["test_rows"] == 20000 and 3500 < summary["test_rows"] < 4500
    # The table's true probabilities give AUC 0.82 on its test split. Its device, category, cross, price,
    # position and hour effects alone (no user or site effect) rank the rows at AUC 0.74 even with their true
    # coefficients: a model that learned those columns' signal passes 0.70; no model beats the oracle.
    assert 0.79 < summary["oracle_auc"] < 0.85
    assert 0.70 < summary["test_auc"] < summary["oracle_auc"] + 0.01, summary
    if mlflow_store is None:
        assert summary["mlflow_run_id"] is None
        return
    import mlflow.pyfunc

    logged = mlflow_run(mlflow_store, summary["mlflow_run_id"])
    assert logged.info.status == "FINISHED" and logged.info.run_name == "03_tabular_click_model"
    assert (logged.data.params["rows"], logged.data.params["num_workers"]) == ("20000", "2")
    assert logged.data.metrics["test_auc"] == pytest.approx(summary["test_auc"])
    assert logged.data.metrics["oracle_auc"] == pytest.approx(summary["oracle_auc"])
    # the logged model is the fitted stage: it scores the table's own columns as the stage did in Spark
    model = mlflow.pyfunc.load_model(f"runs:/{logged.info.run_id}/model")
    inputs = result.namespace["INPUTS"]
    assert [c.name for c in model.metadata.get_input_schema().inputs] == inputs
    rows = result.namespace["scored"].limit(200).toPandas()
    want = [p[1] for p in rows["probability"]]
    np.testing.assert_allclose(model.predict(rows[inputs])[:, 0], want, rtol=1e-5, atol=1e-6)
