"""fit(mlflow=...): what the chief logs to MLflow, read back with MlflowClient from a local file store.

MLflow 3's file store refuses to open unless MLFLOW_ALLOW_FILE_STORE=true (it steers users to a
database backend, which mlflow-skinny, the test extra's client, cannot open: no SQLAlchemy); the
tests set it. The py310-spark34 matrix leg runs them under an MLflow 2 client.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import cluster_nodes
import numpy as np
import pytest
import sparkgrad
from sparkgrad.errors import InvalidArgumentError
from sparkgrad.nn import SGD, Dense, Sequential

mlflow = pytest.importorskip("mlflow", reason="mlflow-skinny not installed (the test extra has it)")
from mlflow.tracking import MlflowClient  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _data(n=200, seed=0):
    return cluster_nodes._blobs(np.random.default_rng(seed), n)


def _model():
    model = Sequential([Dense(8, activation="relu", input_shape=(cluster_nodes.FEATURES,)), Dense(4)], seed=3)
    model.compile(optimizer=SGD(0.1))
    return model


def _runs():
    client = MlflowClient()
    experiments = client.search_experiments()
    return client.search_runs([e.experiment_id for e in experiments])


def _steps(run_id, key):
    return [(m.step, m.value) for m in sorted(MlflowClient().get_metric_history(run_id, key), key=lambda m: m.step)]


def _artifacts(run_id, path):
    return sorted(f.path for f in MlflowClient().list_artifacts(run_id, path))


def test_fit_in_an_active_run_logs_params_metrics_checkpoints_and_the_model(mlflow_store, tmp_path):
    x, y = _data()
    model = _model()
    with mlflow.start_run() as run:
        history = model.fit(
            x,
            y,
            batch_size=20,
            epochs=2,
            log_every=4,
            verbose=0,
            validation_data=_data(60, 1),
            checkpoint_dir=str(tmp_path / "ckpt"),
            keep_last=1,
            save_best_only=True,
        )
        assert mlflow.active_run().info.run_id == run.info.run_id  # the user's run is left active
    run_id = run.info.run_id
    params = MlflowClient().get_run(run_id).data.params
    assert params["model.layers"] == "2" and params["model.params"] == str(model.num_params)
    assert params["optimizer"] == "sgd" and float(params["optimizer.lr"]) == pytest.approx(0.1)
    assert (params["batch_size"], params["epochs"], params["log_every"]) == ("20", "2", "4")
    assert (params["cluster.size"], params["cluster.rank"], params["cluster.role"]) == ("1", "0", "local")
    # every log interval, at model.step: 10 steps an epoch in intervals of 4, 4 and 2
    assert [s for s, _ in _steps(run_id, "loss")] == [s["step"] for s in history.steps] == [4, 8, 10, 14, 18, 20]
    assert [v for _, v in _steps(run_id, "loss")] == pytest.approx([s["loss"] for s in history.steps])
    assert [s for s, _ in _steps(run_id, "lr")] == [4, 8, 10, 14, 18, 20]
    assert _steps(run_id, "val_accuracy") == [
        (10, pytest.approx(history.history["val_accuracy"][0])),
        (20, pytest.approx(history.history["val_accuracy"][1])),
    ]
    assert _steps(run_id, "epoch") == [(10, 1.0), (20, 2.0)]
    assert [v for _, v in _steps(run_id, "epoch_loss")] == pytest.approx(history.history["loss"])
    # every checkpoint the manager wrote, though it kept only the last on disk
    ckpts = ["checkpoints/best.sgck", "checkpoints/ckpt-0000000010.sgck", "checkpoints/ckpt-0000000020.sgck"]
    assert _artifacts(run_id, "checkpoints") == ckpts
    assert _artifacts(run_id, "model") == ["model/sequential.sgck", "model/summary.txt"]
    (tmp_path / "dl").mkdir()  # MLflow 2 wants it there already
    final = MlflowClient().download_artifacts(run_id, "model/sequential.sgck", str(tmp_path / "dl"))
    restored = _model()
    restored.load(final)
    assert np.array_equal(restored.params, model.params) and restored.step == 20
    summary = mlflow.artifacts.load_text(f"runs:/{run_id}/model/summary.txt")
    assert summary == model.summary(print_fn=None)


def test_mlflow_true_starts_a_run_and_ends_it_each_fit(mlflow_store):
    x, y = _data()
    model = _model()
    assert mlflow.active_run() is None
    model.fit(x, y, batch_size=50, epochs=1, verbose=0, mlflow=True)
    assert mlflow.active_run() is None
    model.fit(x, y, batch_size=50, epochs=1, verbose=0, mlflow=True)
    runs = sorted(_runs(), key=lambda r: r.info.start_time)
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"]
    assert [_steps(r.info.run_id, "epoch") for r in runs] == [[(4, 1.0)], [(8, 1.0)]]


def test_a_second_fit_in_the_same_run_keeps_the_first_params_and_goes_on_with_the_metrics(mlflow_store):
    x, y = _data()
    model = _model()
    with mlflow.start_run() as run:
        model.fit(x, y, batch_size=50, epochs=1, verbose=0)
        with pytest.warns(UserWarning, match="already has param batch_size='50'"):
            model.fit(x, y, batch_size=100, epochs=1, verbose=0)
    assert MlflowClient().get_run(run.info.run_id).data.params["batch_size"] == "50"
    assert [s for s, _ in _steps(run.info.run_id, "loss")] == [4, 6]


def test_a_fit_that_raises_ends_the_run_it_started_as_failed(mlflow_store):
    class Boom:
        def on_epoch_end(self, epoch, logs):
            raise RuntimeError("boom at epoch end")

    x, y = _data()
    with pytest.raises(RuntimeError, match="boom"):
        _model().fit(x, y, batch_size=50, epochs=2, verbose=0, mlflow=True, callbacks=[Boom()])
    assert mlflow.active_run() is None
    (run,) = _runs()
    assert run.info.status == "FAILED" and _steps(run.info.run_id, "loss")


def test_mlflow_false_logs_nothing_even_in_an_active_run(mlflow_store):
    x, y = _data()
    with mlflow.start_run() as run:
        _model().fit(x, y, batch_size=50, epochs=1, verbose=0, mlflow=False)
    data = MlflowClient().get_run(run.info.run_id).data
    assert data.params == {} and data.metrics == {}
    with pytest.raises(InvalidArgumentError, match="mlflow must be True, False or None"):
        _model().fit(x, y, batch_size=50, epochs=1, verbose=0, mlflow="yes")


def _python(code: str, tmp_path) -> dict:
    """Runs code in a fresh interpreter; its last stdout line is JSON."""
    script = "import json, sys\nimport numpy as np\nfrom sparkgrad.nn import Dense, Sequential\n"
    script += "x = np.random.default_rng(0).normal(size=(64, 3)).astype('float32'); y = np.arange(64) % 2\n"
    script += "model = Sequential([Dense(2, input_shape=(3,))], seed=1)\nmodel.compile()\n"
    script += textwrap.dedent(code)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_without_the_option_or_an_active_run_mlflow_is_neither_imported_nor_written(mlflow_store, tmp_path):
    seen = _python(
        """
        model.fit(x, y, epochs=1, verbose=0)
        print(json.dumps({"imported": "mlflow" in sys.modules}))
        """,
        tmp_path,
    )
    assert seen == {"imported": False}
    seen = _python(  # imported by the user, but no active run: still nothing
        """
        import mlflow
        model.fit(x, y, epochs=1, verbose=0)
        print(json.dumps({"active": mlflow.active_run() is not None}))
        """,
        tmp_path,
    )
    assert seen == {"active": False}
    assert not os.path.exists(mlflow_store[len("file:") :]) and not os.path.exists(tmp_path / "mlflow.db")


def test_mlflow_true_without_mlflow_says_what_to_install(tmp_path):
    seen = _python(
        """
        sys.modules["mlflow"] = None  # as if it were not installed: the import raises ImportError
        try:
            model.fit(x, y, epochs=1, verbose=0, mlflow=True)
        except Exception as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        """,
        tmp_path,
    )
    assert seen["error"] == "InvalidArgumentError"
    assert "fit(mlflow=True) needs MLflow" in seen["message"] and "pip install mlflow-skinny" in seen["message"]


@pytest.mark.slow
def test_a_ps_and_two_workers_with_mlflow_true_log_one_run_from_the_chief_only(mlflow_store):
    lines: list[str] = []
    cluster = sparkgrad.local.run(cluster_nodes.fit_with_mlflow, {}, 3, 1, output=lines.append)
    cluster.shutdown(timeout=90)
    results = sorted(cluster.results.values(), key=lambda r: (r["role"], r["rank"] or 0))
    # every node fitted with mlflow=True, the ps too (a node that does not train: no rank)
    assert [(r["role"], r["rank"], r["step"]) for r in results] == [
        ("ps", None, 16),
        ("worker", 0, 16),
        ("worker", 1, 16),
    ]
    # the ps and the non-chief worker never imported mlflow (the chief did: mlflow=True)
    assert [r["mlflow_imported"] for r in results] == [False, True, False]
    (run,) = _runs()
    assert run.info.status == "FINISHED"
    assert (run.data.params["cluster.size"], run.data.params["cluster.rank"]) == ("2", "0")
    assert run.data.params["cluster.role"] == "worker" and run.data.params["cluster.num_ps"] == "1"
    assert [s for s, _ in _steps(run.info.run_id, "loss")] == [4, 8, 12, 16]
    assert _artifacts(run.info.run_id, "model") == ["model/sequential.sgck", "model/summary.txt"]


@pytest.mark.slow
def test_the_chief_of_a_cluster_logs_into_the_drivers_run_named_by_mlflow_run_id(mlflow_store, monkeypatch):
    with mlflow.start_run() as run:
        monkeypatch.setenv("MLFLOW_RUN_ID", run.info.run_id)  # the nodes' mlflow.start_run() resumes it
        cluster = sparkgrad.local.run(cluster_nodes.fit_with_mlflow, {}, 2, 0, output=lambda line: None)
        cluster.shutdown(timeout=90)
    (logged,) = _runs()
    assert logged.info.run_id == run.info.run_id and logged.data.params["cluster.size"] == "2"
    assert [s for s, _ in _steps(run.info.run_id, "loss")] == [4, 8, 12, 16]  # one node's curve, not two
