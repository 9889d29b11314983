"""TFCluster.run over Spark Connect: a real local Connect server (local[4]) and a Connect client, no SparkContext.

The server runs in a process of its own (connect_server.py: what
``SparkSession.builder.remote("local[4]")`` starts in-process), the client
here talks to it over gRPC only, as a Databricks notebook in Standard access
mode does. The nodes run as a barrier mapInArrow stage; the rendezvous,
failures and log streaming are the classic path's (test_cluster_spark.py),
and so are the node functions (cluster_nodes.py, shipped as an artifact).
The example's own ``--connect`` (``remote("local[N]")`` in its process) runs
at the end, in both input modes.
"""

from __future__ import annotations

import glob
import json
import os
import pathlib
import re
import select
import subprocess
import sys
import threading
import time

import cluster_nodes
import numpy as np
import pytest
from cluster_checks import (
    Lines,
    check_driver_interrupt_ends_every_node,
    check_training_from_a_dataframe,
    port_closed,
    quiet,
)
from sparkgrad import InputMode, TFCluster
from sparkgrad.cluster import launch
from sparkgrad.errors import InsufficientSlotsError, NodeFailure

pyspark = pytest.importorskip("pyspark")
if int(pyspark.__version__.split(".")[0]) < 4:
    pytest.skip(
        f"pyspark {pyspark.__version__}: its pip package ships no Spark Connect server "
        "(no jars/spark-connect_*.jar: SparkConnectPlugin is not found); Connect tests need pyspark >= 4.0",
        allow_module_level=True,
    )
for _module in ("grpc", "grpc_status", "google.protobuf", "pyarrow", "pandas"):
    pytest.importorskip(_module, reason=f"Spark Connect's client needs {_module} (pip install 'pyspark[connect]')")
if not glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "spark-connect_*.jar")):
    pytest.skip("this pyspark has no jars/spark-connect_*.jar to start a local Connect server", allow_module_level=True)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]

HERE = pathlib.Path(__file__).resolve().parent
SLOTS = 4
SERVER_START_SECONDS = 120.0


def _server_port(proc: subprocess.Popen, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = proc.stdout.readline()
        if not line:  # the server died
            break
        if line.startswith("port "):
            return int(line.split()[1])
    proc.kill()
    raise RuntimeError(f"the Connect server gave no port within {timeout:g} s")


def _drain(stream) -> None:
    """Reads a child's pipe to its end, so the child never blocks on a full pipe."""
    for _ in iter(stream.readline, ""):
        pass


@pytest.fixture(scope="module")
def connect(tmp_path_factory):
    """A Connect client session on a local[4] Connect server started once for the module."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    python_dir = str(HERE.parent / "python")
    env = dict(
        os.environ,
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(p for p in (python_dir, os.environ.get("PYTHONPATH", "")) if p),
    )
    env.pop("SPARK_REMOTE", None)
    # The server's log (JVM, Connect RPCs, Python workers) goes to a file: a pipe nobody reads would fill and
    # block the server; its tail is printed when the server fails to start.
    log = tmp_path_factory.mktemp("connect") / "server.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "connect_server.py"), str(SLOTS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
        )
    try:
        try:
            port = _server_port(proc, SERVER_START_SECONDS)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}:\n{log.read_text()[-3000:]}") from None
        threading.Thread(target=_drain, args=(proc.stdout,), daemon=True).start()
        # Connect's own builder: the generic one refuses a Connect session beside a classic one in this process
        spark = ConnectSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
        spark.addArtifacts(str(HERE / "cluster_nodes.py"), pyfile=True)
        spark.addArtifacts(str(HERE / "runner_fns.py"), pyfile=True)
        yield spark
        spark.stop()
    finally:
        proc.stdin.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_connect_session_has_no_spark_context_and_is_told_apart_by_its_class(connect):
    from pyspark.errors import PySparkAttributeError
    from sparkgrad.cluster.spark import ConnectSpark, spark_session

    with pytest.raises(PySparkAttributeError):
        connect.sparkContext  # noqa: B018 - the attribute access is what raises
    session = spark_session(connect)
    assert isinstance(session, ConnectSpark)
    assert session.master == f"local[{SLOTS}]" and session.slot_count().slots == SLOTS
    assert session.default_fs() == "file://"


def test_sparkgrad_run_over_connect_returns_values_by_rank_through_the_stage_rows(connect):
    import io

    import runner_fns
    import sparkgrad

    out = io.StringIO()
    values = sparkgrad.run(
        runner_fns.describe, args=("connect",), num_proc=2, stdout=out, stderr=io.StringIO(), spark=connect
    )
    assert [(v["rank"], v["size"], v["tag"]) for v in values] == [(0, 2, "connect"), (1, 2, "connect")]
    assert "rank 1: stdout line of connect from 1" in out.getvalue().splitlines()
    assert sparkgrad.HorovodRunner(np=2, spark=connect).run(runner_fns.hvd_main) == {"rank": 0, "size": 2, "scaled": 2}


def test_cluster_forms_over_connect_with_roles_spec_and_streamed_logs(connect, tmp_path):
    out = Lines()
    cluster = TFCluster.run(
        connect, cluster_nodes.write_ctx, {"dir": str(tmp_path)}, 3, 1, output=out, reservation_timeout=60
    )
    cluster.shutdown(timeout=60)
    ctxs = {i: json.loads((tmp_path / f"ctx-{i}.json").read_text()) for i in range(3)}
    spec = cluster.cluster_spec
    assert set(spec) == {"ps", "worker"} and len(spec["ps"]) == 1 and len(spec["worker"]) == 2
    for i, c in ctxs.items():
        assert c["executor_id"] == i and c["cluster_spec"] == spec
        assert c["tf_config"]["task"] == {"type": c["job_name"], "index": c["task_index"]}
        assert spec[c["job_name"]][c["task_index"]] == f"127.0.0.1:{c['listener_port']}"
        assert c["defaultFS"] == "file://"
        assert c["pid"] != os.getpid()  # a Python worker of the Connect server
        assert port_closed(c["listener_port"])
    assert cluster.results == {0: "ps stopped", 1: {"task_index": 0}, 2: {"task_index": 1}}
    # log lines and prints stream to the driver prefixed with role:index, once each (no echo on a local master)
    assert sum(line == "worker:1 stdout line from worker:1" for line in out.lines) == 1
    assert any(line.startswith("ps:0 ") and "node ps:0 up on" in line for line in out.lines)
    assert sorted((m.role, m.index, m.value) for m in cluster.metrics) == [("worker", 0, 1.0), ("worker", 1, 0.5)]
    statuses = [json.loads(s) for s in cluster._launchers[0].statuses]  # one row of the mapInArrow stage per node
    assert sorted((s["executor_id"], s["status"]) for s in statuses) == [(0, "done"), (1, "done"), (2, "done")]


def test_cluster_trains_over_connect_with_a_sync_ps(connect):
    cluster = TFCluster.run(connect, cluster_nodes.train_softmax, {"mode": "sync", "steps": 30}, 3, 1, output=quiet)
    cluster.shutdown(timeout=90)
    assert cluster.results[0] == "done"
    assert all(cluster.results[i]["steps"] == list(range(1, 31)) for i in (1, 2))
    assert min(cluster.results[i]["accuracy"] for i in (1, 2)) > 0.9


def test_exception_in_map_fun_over_connect_raises_node_failure_with_remote_traceback(connect, tmp_path):
    args = {"dir": str(tmp_path), "target": "worker:1"}
    cluster = TFCluster.run(connect, cluster_nodes.raise_on_target, args, 3, 1, output=Lines(), reservation_timeout=60)
    with pytest.raises(NodeFailure) as info:
        cluster.shutdown(timeout=60)
    exc = info.value
    assert (exc.role, exc.index, exc.host, exc.executor_id) == ("worker", 1, "127.0.0.1", 2)
    assert "ValueError: boom from worker:1" in str(exc) and "raise_on_target" in exc.remote_traceback
    assert sorted(p.name for p in tmp_path.glob("stopped-*.json")) == ["stopped-0.json", "stopped-1.json"]


def test_sigkill_of_a_node_over_connect_raises_node_failure_and_stops_the_rest(connect, tmp_path):
    args = {"dir": str(tmp_path), "target": "worker:0"}
    cluster = TFCluster.run(connect, cluster_nodes.kill_target, args, 3, 1, output=Lines(), reservation_timeout=60)
    started = time.monotonic()
    with pytest.raises(NodeFailure) as info:
        cluster.shutdown(timeout=60)
    assert time.monotonic() - started < 30
    assert (info.value.role, info.value.index) == ("worker", 0) and "lost" in str(info.value)
    assert sorted(p.name for p in tmp_path.glob("stopped-*.json")) == ["stopped-0.json", "stopped-2.json"]
    for marker in tmp_path.glob("started-*.json"):
        assert port_closed(json.loads(marker.read_text())["port"], within=10.0)
    assert all(launcher.finished() for launcher in cluster._launchers)


def test_driver_interrupt_over_connect_interrupts_the_stage_and_frees_every_slot(connect, tmp_path):
    check_driver_interrupt_ends_every_node(connect, tmp_path)
    # no task of the interrupted stage holds a slot: a barrier stage of every slot starts at once
    cluster = TFCluster.run(
        connect, cluster_nodes.write_ctx, {"dir": str(tmp_path)}, SLOTS, 1, output=Lines(), reservation_timeout=30
    )
    cluster.shutdown(timeout=60)


def test_driver_interrupt_during_train_over_connect_interrupts_the_feeding_stage(connect, tmp_path):
    """The feeding job's tag is interrupted too: no feeding task is left holding a slot."""
    import _thread
    import threading

    args = {"dir": str(tmp_path), "target": "none"}
    cluster = TFCluster.run(
        connect,
        cluster_nodes.busy_until_interrupted,  # never reads its feed: the feeders block once its queue is full
        args,
        3,
        1,
        input_mode=InputMode.SPARK,
        output=Lines(),
        reservation_timeout=60,
        stop_grace=1.0,
    )
    timer = threading.Timer(3.0, _thread.interrupt_main)
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        cluster.train(connect.range(0, 10**9, numPartitions=1), feed_timeout=60)
    timer.join()
    assert time.monotonic() - started < 60
    assert all(launcher.finished() for launcher in cluster._launchers)
    cluster = TFCluster.run(
        connect, cluster_nodes.write_ctx, {"dir": str(tmp_path)}, SLOTS, 1, output=Lines(), reservation_timeout=30
    )
    cluster.shutdown(timeout=60)


def test_too_few_slots_on_connect_fail_before_any_stage_naming_the_numbers(connect, tmp_path, monkeypatch):
    from sparkgrad.cluster.spark import ConnectSpark

    def no_stage(self, n, task):
        raise AssertionError("a barrier stage was submitted although the slots could not suffice")

    monkeypatch.setattr(ConnectSpark, "run_barrier", no_stage)
    started = time.monotonic()
    with pytest.raises(
        InsufficientSlotsError, match=rf"needs 5 task slots \(5 nodes.* Spark has {SLOTS} \(master local"
    ):
        TFCluster.run(connect, cluster_nodes.write_ctx, {"dir": str(tmp_path)}, 5, 1, output=Lines())
    # InputMode.SPARK needs a feeding slot beside the 4 nodes
    with pytest.raises(InsufficientSlotsError, match=rf"needs 5 task slots \(4 nodes.*feeding.* Spark has {SLOTS}"):
        TFCluster.run(connect, cluster_nodes.write_ctx, {}, 4, 1, input_mode=InputMode.SPARK, output=Lines())
    assert time.monotonic() - started < 15  # refused before any stage: no stage start (5+ s) in it


def test_reservation_timeout_over_connect_says_where_the_driver_must_run(connect, tmp_path, monkeypatch):
    from sparkgrad.errors import RendezvousTimeout

    monkeypatch.setattr(launch, "held_executors", lambda: frozenset({2}))
    started = time.monotonic()
    with pytest.raises(RendezvousTimeout) as info:
        TFCluster.run(
            connect, cluster_nodes.write_ctx, {"dir": str(tmp_path)}, 3, 1, output=Lines(), reservation_timeout=4
        )
    assert 4 * 0.9 <= time.monotonic() - started < 30  # it waited reservation_timeout for the held node
    message = str(info.value)
    assert "missing" in message and "slots" in message
    assert "Databricks Connect client on a laptop is not reachable from the executors" in message


def test_train_feeds_a_dataframe_over_connect_through_arrow(connect):
    check_training_from_a_dataframe(connect)


def test_inference_over_connect_returns_a_dataframe_of_results_in_input_order(connect):
    df = connect.createDataFrame([(i, [float(i), 1.0]) for i in range(500)], "id long, x array<double>")
    args = {"columns": ("id", "x")}
    cluster = TFCluster.run(
        connect, cluster_nodes.infer_from_feed, args, 3, 1, input_mode=InputMode.SPARK, output=quiet
    )
    results = cluster.inference(df.coalesce(4), feed_timeout=60)
    values = [row.result for row in results.collect()]
    cluster.shutdown(timeout=90)
    assert values == [3.0 * i + 1 for i in range(500)]  # the default schema: "result double"
    assert cluster.results[1]["rows"] + cluster.results[2]["rows"] == 500


# -- the example through --connect: remote("local[N]") started by the example itself ------------------------


@pytest.fixture(scope="module")
def mnist_records(tmp_path_factory):
    from sparkgrad.examples.mnist_dist import prepare_data

    out = tmp_path_factory.mktemp("fashion-mnist")
    prepare_data(str(out), "/usr/share/datasets/fashion-mnist", shards=4)
    return out


def _run_example(*args: str, timeout: float = 600) -> str:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env.pop("SPARK_REMOTE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "sparkgrad.examples.mnist_dist", "--connect", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(700)
@pytest.mark.parametrize("mode", ["tensorflow", "spark"])
def test_mnist_dist_example_runs_over_connect_in_both_input_modes(mnist_records, tmp_path, mode):
    out = _run_example("--mode", mode, "--epochs", "1", "--data-dir", str(mnist_records), "--model-dir", str(tmp_path))
    assert f"{mode} mode, 1 ps + 2 workers" in out and "(over Spark Connect)" in out
    # tensorflow mode: every worker reads every file (1,200 steps an epoch); spark mode: each row once (600)
    assert f"global step {1200 if mode == 'tensorflow' else 600}" in out
    assert re.search(r"^worker:0 chief: step \d+, test loss", out, re.M)  # streamed, prefixed
    accuracy = float(re.search(r"^test accuracy: ([0-9.]+)$", out, re.M).group(1))
    assert accuracy >= 0.8


def test_predict_and_evaluate_tfrecords_over_connect(connect, tmp_path):
    """predict_tfrecords / evaluate_tfrecords with no SparkContext: the model rides in the closure."""
    from sparkgrad.data import FixedLenFeature, encode_example, write_records
    from sparkgrad.nn import Dense, Sequential
    from sparkgrad.spark import evaluate_tfrecords, predict_tfrecords

    rng = np.random.default_rng(11)
    x = rng.normal(size=(90, 8)).astype(np.float32)
    y = rng.integers(0, 3, 90)
    for f in range(3):
        records = [encode_example({"x": x[i], "label": np.array([y[i]]), "id": np.array([i])}) for i in range(f, 90, 3)]
        write_records(tmp_path / f"part-{f}", records)
    model = Sequential([Dense(6, activation="relu", input_shape=(8,)), Dense(3, activation="softmax")], seed=9)
    model.compile(loss="sparse_categorical_crossentropy")
    schema = {
        "x": FixedLenFeature([8], "float32"),
        "label": FixedLenFeature([], "int64"),
        "id": FixedLenFeature([], "int64"),
    }
    rows = sorted(predict_tfrecords(connect, str(tmp_path), model, schema, keep=["id"]).collect(), key=lambda r: r.id)
    np.testing.assert_allclose(np.array([r.probability for r in rows]), model.predict(x), rtol=1e-5, atol=1e-6)
    stats = evaluate_tfrecords(connect, str(tmp_path), model, schema)
    loss, accuracy = model.evaluate(x, y)
    assert stats["count"] == 90
    assert stats["loss"] == pytest.approx(loss, rel=1e-6) and stats["accuracy"] == pytest.approx(accuracy)


@pytest.mark.timeout(400)
def test_estimator_pipeline_over_connect_fits_saves_loads_and_predicts_the_same(connect, tmp_path, monkeypatch):
    """The Spark ML Pipeline test (test_spark_ml.py) on a Connect session, on 2000 Fashion-MNIST rows."""
    from sparkgrad.data.idx import FASHION_MNIST_DIR, fashion_mnist

    if not os.path.exists(os.path.join(FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz")):
        pytest.skip(f"Fashion-MNIST not installed in {FASHION_MNIST_DIR}")
    from spark_ml_data import mlp, write_parquet

    # pyspark.ml's JVM stages (VectorAssembler, StandardScaler) go through Connect only in "connect mode"
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import StandardScaler, VectorAssembler
    from pyspark.ml.functions import array_to_vector
    from sparkgrad.spark import Estimator, Model

    x, y = fashion_mnist("train")
    write_parquet(str(tmp_path / "data"), x[:2000], y[:2000], 2)
    df = connect.read.parquet(str(tmp_path / "data")).withColumn("vec", array_to_vector("pixels"))
    train, test = df.filter("id < 1600"), df.filter("id >= 1600")
    estimator = Estimator(model=mlp(), featuresCol="scaled", batch_size=32, epochs=2, num_workers=2)
    pipeline = Pipeline(
        stages=[
            VectorAssembler(inputCols=["vec"], outputCol="assembled"),
            StandardScaler(inputCol="assembled", outputCol="scaled"),
            estimator,
        ]
    )
    fitted = pipeline.fit(train)
    assert isinstance(fitted.stages[-1], Model) and fitted.stages[-1].history[0]["rows"] > 0
    before = fitted.transform(test).select("id", "prediction", "probability").orderBy("id").collect()
    accuracy = np.mean([r.prediction == label for r, label in zip(before, y[1600:2000], strict=True)])
    assert accuracy > 0.6, accuracy
    fitted.write().overwrite().save(str(tmp_path / "pipeline_model"))
    loaded = PipelineModel.load(str(tmp_path / "pipeline_model"))
    after = loaded.transform(test).select("id", "prediction", "probability").orderBy("id").collect()
    assert [r.prediction for r in after] == [r.prediction for r in before]
    np.testing.assert_array_equal([r.probability.toArray() for r in after], [r.probability.toArray() for r in before])
