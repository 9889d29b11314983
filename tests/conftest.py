"""Shared fixtures. Spark fixtures start real local Spark (no mocks)."""

import os as _os  # noqa: E402
import sys as _sys  # noqa: E402

import pytest as _pytest  # noqa: E402


@_pytest.fixture(scope="session")
def spark():
    """A real local SparkSession (master local[2], loopback only) for the whole session.

    Reuses a session another fixture already started (and then leaves stopping
    it to that fixture)."""
    _pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    _os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    _os.environ.setdefault("PYSPARK_PYTHON", _sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("sparkgrad-records-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
