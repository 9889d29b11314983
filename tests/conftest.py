"""Shared fixtures. Spark fixtures start real local Spark (no mocks)."""

import os
import sys

import pytest

# MLflow 3 reports usage to its makers unless told not to: never from the tests (nor their subprocesses).
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

# The fault suite (tests/faults, `make test-faults`) starts its own standalone Spark cluster and network
# namespaces: `make test` leaves it out.
collect_ignore = [] if os.environ.get("SPARKGRAD_FAULT_SUITE") == "1" else ["faults"]


@pytest.fixture(scope="session")
def spark():
    """One real local SparkSession shared by every Spark test of the session.

    Barrier stages need a slot per node, so the master is local[4]; the driver
    and its executors bind 127.0.0.1 only.
    """
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors need this venv's sparkgrad deps
    session = (
        SparkSession.builder.master("local[4]")
        .appName("sparkgrad-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.task.killTimeout", "2s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_context(spark):
    """The SparkContext of the shared session."""
    return spark.sparkContext


@pytest.fixture(params=["isal", "zlib"])
def inflate(request, monkeypatch):
    """Runs a GZIP / ZLIB test once per inflate backend (SPARKGRAD_INFLATE is
    read each time a reader opens)."""
    from sparkgrad import _core

    if request.param == "isal" and _core.build_info()["isal"] is None:
        pytest.skip("built without ISA-L")
    monkeypatch.setenv("SPARKGRAD_INFLATE", request.param)
    return request.param


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    """A file-store MLflow tracking URI of the test's own, also in the environment (subprocesses, cluster nodes)."""
    mlflow = pytest.importorskip("mlflow")
    uri = "file:" + str(tmp_path / "mlruns")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    yield uri
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)
