"""sparkgrad.spark.Estimator reading its training rows from Parquet files, one barrier task per worker.

A synthetic table with a known rule (tests/spark_ml_tables_data.py: a string column into a StringLookup,
an id column into an Embedding, numbers, a Spark ML vector; nulls skipped and filled) is written by
Spark and read back with ``spark.read.parquet``. The fit on ``local[2]`` runs in a process of its own
(tests/spark_ml_tables_job.py: the shared session has 4 slots); the rest use the shared session.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest
import sparkgrad
from cluster_checks import port_closed
from faults.standalone import descendants, listening_ports
from spark_ml_tables_data import BAD_INPUTS, COLUMNS, model, write_table
from sparkgrad.errors import InvalidArgumentError, NodeFailure
from sparkgrad.nn import Adam

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

# mapInArrow returns Spark ML vector columns (Model.evaluate's vector input) from pyspark 3.5 on; fit reads
# the files and runs on every leg
evaluates = pytest.mark.skipif(
    tuple(int(v) for v in pytest.importorskip("pyspark").__version__.split(".")[:2]) < (3, 5),
    reason="pyspark < 3.5: mapInArrow cannot return vector columns",
)

HERE = pathlib.Path(__file__).resolve().parent


@evaluates
def test_two_workers_fit_a_parquet_table_with_strings_and_nulls_on_two_task_slots(tmp_path):
    env = dict(os.environ)
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join([str(HERE), os.path.dirname(os.path.dirname(os.path.abspath(sparkgrad.__file__)))]),
    )
    proc = subprocess.run(
        [sys.executable, str(HERE / "spark_ml_tables_job.py"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["slots"] == 2 and not out["cache"]  # a plain Parquet scan: read from its own files
    assert [h["rank"] for h in out["history"]] == [0, 1]
    assert out["history"][0]["steps"] == out["history"][1]["steps"] > 0  # allreduce: the workers stepped together
    # every epoch, each worker trains at most its shard less the rows whose city is null
    assert 0 < sum(h["rows"] for h in out["history"]) <= 6 * (3000 - out["skipped"])
    before, after = out["before"], out["after"]
    assert after["rows"] == 600
    assert after["loss"] < before["loss"] * 0.4 and after["accuracy"] > 0.9, (before, after)


@pytest.fixture(scope="module")
def shops(spark, tmp_path_factory):
    """(train with nulls, held-out without), written by Spark and read back."""
    root = tmp_path_factory.mktemp("tables")
    return (
        write_table(spark, str(root / "train"), 1200, seed=1, nulls=True),
        write_table(spark, str(root / "test"), 400, seed=2, nulls=False),
    )


def _estimator(**params):
    from sparkgrad.spark import Estimator

    base = dict(model=model(), optimizer=Adam(0.02), inputCols=COLUMNS, labelCol="label", batch_size=32, num_workers=2)
    return Estimator(**{**base, **params})


@evaluates
def test_a_filtered_dataframe_is_written_to_the_cache_once_and_fits(shops, tmp_path):
    train, test = shops
    fitted = _estimator(
        epochs=4, nulls={"city": "skip", "spend": 0.0}, cache_dir=str(tmp_path / "cache"), mode="ps", num_ps=1
    ).fit(train.filter("visits < 8"))
    (cached,) = os.listdir(tmp_path / "cache")
    files = [n for n in os.listdir(tmp_path / "cache" / cached) if n.endswith(".parquet")]
    assert files  # the filtered rows, as Parquet
    assert fitted.evaluate(test)["accuracy"] > 0.85


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_fails_fit_with_a_specific_error(shops, case):
    """A missing column, a column of a type no input takes (before any job) and a null under the "error"
    policy (a worker's read, naming the column, file and row group); test_spark_ml_tables_connect.py checks
    the same cases over Spark Connect."""
    make, params, error, message = BAD_INPUTS[case]
    with pytest.raises(error, match=message) as e:
        _estimator(epochs=1, **params).fit(make(shops[0]))
    if case == "null_under_error":
        assert isinstance(e.value.__cause__, NodeFailure) and "Traceback" in e.value.__cause__.remote_traceback


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"nulls": {"town": "skip"}}, r"^Estimator: nulls names column 'town', which fit does not read"),
        ({"nulls": {"city": "drop"}}, r"^Estimator: nulls\['city'\] must be 'error', 'skip' or a number"),
        ({"batch_size": 700}, r"has 1200 rows; 2 workers of batch_size 700 need at least 1400"),
        ({"shuffle_buffer": -1}, r"^Estimator: shuffle_buffer must be >= 0"),
    ],
    ids=["nulls_column", "nulls_policy", "too_few_rows", "shuffle_buffer"],
)
def test_bad_table_params_fail_fit_before_the_cluster_starts(shops, params, message):
    with pytest.raises(InvalidArgumentError, match=message):
        _estimator(**params).fit(shops[0])


def _cluster_ports(lines: queue.Queue, timeout: float) -> dict[str, int]:
    """``{"worker:0": port, ...}`` from the driver's "cluster formed" line of fit's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line.startswith("sparkgrad: cluster formed: "):
            spec = json.loads(line[len("sparkgrad: cluster formed: ") :])
            return {
                f"{role}:{i}": int(a.rsplit(":", 1)[1]) for role, addrs in spec.items() for i, a in enumerate(addrs)
            }
    raise AssertionError(f"fit logged no 'cluster formed' line within {timeout:g} s")


def _pid_listening_on(port: int) -> int:
    """The process under this one (Spark's JVM, its Python daemon and workers) that listens on ``port``."""
    found = [pid for pid in descendants(os.getpid()) if port in listening_ports(pid)]
    assert len(found) == 1, (port, found)
    return found[0]


def _reads(pid: int, files: set[str], timeout: float) -> bool:
    """True once ``pid`` holds one of ``files`` open (a worker opens its shard's files for an epoch's reading)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            return False
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in files:
                    return True
            except OSError:
                continue
        time.sleep(0.02)
    return False


def test_a_worker_sigkilled_while_reading_its_shard_fails_fit_with_node_failure_and_stops_the_other(spark, shops):
    """Worker 1's process is found by its port in the "cluster formed" line and killed once it holds a file
    of the table open; fit raises the NodeFailure naming worker:1 ("lost") and worker:0 stops."""
    train = shops[0]
    files = {os.path.realpath(f[len("file:") :] if f.startswith("file:") else f) for f in train.inputFiles()}
    lines: queue.Queue = queue.Queue()

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.put(record.getMessage())

    log = logging.getLogger("sparkgrad.spark.estimator")
    handler, level = Lines(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    outcome: dict = {}

    def fit() -> None:
        try:
            # far more epochs than the test lets it run: only the kill ends this fit
            _estimator(epochs=2000, nulls={"city": "skip", "spend": 0.0}).fit(train)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=fit, daemon=True)
    victim = None
    try:
        thread.start()
        ports = _cluster_ports(lines, 90)
        assert sorted(ports) == ["worker:0", "worker:1"]
        victim, other = _pid_listening_on(ports["worker:1"]), _pid_listening_on(ports["worker:0"])
        assert victim != other
        assert _reads(victim, files, 30), "worker:1 opened none of the table's files within 30 s"
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        thread.join(60)
        assert not thread.is_alive(), "fit did not return within 60 s of the kill"
        took = time.monotonic() - killed
    finally:
        if victim is None or thread.is_alive():  # the test failed before its kill: end the fit anyway
            spark.sparkContext.cancelAllJobs()
            thread.join(60)
        log.removeHandler(handler)
        log.setLevel(level)
    exc = outcome.get("error")
    assert isinstance(exc, NodeFailure), repr(exc)
    assert (exc.role, exc.index) == ("worker", 1) and "lost" in str(exc), str(exc)
    assert took < 30, took
    assert port_closed(ports["worker:0"], within=10.0)  # the other worker stopped
