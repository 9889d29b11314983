"""sparkgrad.run and HorovodRunner: values by rank, output, env, failures, on local processes and on local Spark."""

from __future__ import annotations

import io
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest
import runner_fns
import sparkgrad
from cluster_checks import alive, port_closed
from sparkgrad.cluster import launch
from sparkgrad.errors import InvalidArgumentError, NodeFailure

pytestmark = pytest.mark.timeout(120)

HERE = pathlib.Path(__file__).resolve().parent


def _gone(pids, within=5.0) -> bool:
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def _check_values(values, n, tag, env="on", processes_end=True):
    assert [v["rank"] for v in values] == list(range(n))
    assert all(v["size"] == n and v["tag"] == tag and v["env"] == env for v in values)
    assert [v["hvd"][:2] for v in values] == [[r, n] for r in range(n)]
    # one host: local ranks are the ranks, one cross rank
    assert [v["hvd"][2:] for v in values] == [[r, n, 0, 1] for r in range(n)]
    assert all(v["comm"] == values[0]["comm"] and len(v["comm"]) == n for v in values)
    for v in values:
        np.testing.assert_array_equal(v["array"], np.arange(3) * v["rank"])
    if processes_end:  # Spark keeps its Python workers for the next tasks (spark.python.worker.reuse)
        assert _gone([v["pid"] for v in values])
    assert all(port_closed(port, within=5.0) for _, port in values[0]["comm"])


def test_run_on_local_processes_returns_values_by_rank_with_prefixed_output_and_env():
    out, err = io.StringIO(), io.StringIO()
    values = sparkgrad.run(
        runner_fns.describe,
        args=("local",),
        num_proc=3,
        env={"SPARKGRAD_TEST_VAR": "on"},
        stdout=out,
        stderr=err,
        local=True,
    )
    _check_values(values, 3, "local")
    assert len({v["pid"] for v in values} | {os.getpid()}) == 4
    out_lines, err_lines = out.getvalue().splitlines(), err.getvalue().splitlines()
    for r in range(3):
        assert f"rank {r}: stdout line of local from {r}" in out_lines
        assert f"rank {r}: stderr line of local from {r}" in err_lines
    assert not any("stderr line" in line for line in out_lines)
    assert "SPARKGRAD_TEST_VAR" not in os.environ


def test_values_larger_than_a_pipe_buffer_come_back_whole():
    values = sparkgrad.run(runner_fns.big_value, args=(8 << 20,), num_proc=2, local=True)
    assert [len(v) for v in values] == [8 << 20] * 2 and [v[-1] for v in values] == [0, 1]


def test_run_prefixes_timestamps_on_request():
    out = io.StringIO()
    sparkgrad.run(
        runner_fns.describe, args=("ts",), num_proc=2, stdout=out, stderr=io.StringIO(),
        prefix_output_with_timestamp=True, local=True,
    )  # fmt: skip
    line = next(x for x in out.getvalue().splitlines() if "stdout line of ts from 1" in x)
    stamp, _, rest = line.partition(" rank 1: ")
    assert rest == "stdout line of ts from 1"
    time.strptime(stamp.split(".")[0], "%Y-%m-%d %H:%M:%S")


def test_horovod_runner_negative_np_runs_on_the_driver_and_returns_rank_0():
    assert sparkgrad.HorovodRunner(np=-2).run(runner_fns.hvd_main, scale=3) == {"rank": 0, "size": 2, "scaled": 6}
    with pytest.raises(InvalidArgumentError):
        sparkgrad.HorovodRunner(np=0)


def test_without_an_active_session_run_uses_local_processes():
    code = (
        "import runner_fns, sparkgrad\n"
        "values = sparkgrad.run(runner_fns.hvd_main, num_proc=2)\n"
        "print([v['rank'] for v in values])\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[0, 1]"


def _read_pids(pid_dir, n):
    return [int((pid_dir / f"pid-{r}").read_text()) for r in range(n) if (pid_dir / f"pid-{r}").exists()]


def test_a_raising_rank_fails_the_run_with_its_traceback_before_any_timeout(tmp_path):
    started = time.monotonic()
    with pytest.raises(NodeFailure) as info:
        sparkgrad.run(runner_fns.fail_on, args=(1, str(tmp_path)), num_proc=3, stderr=io.StringIO(), local=True)
    assert time.monotonic() - started < 30  # the other ranks would wait 60 s: it did not wait for them
    exc = info.value
    assert (exc.rank, exc.host) == (1, "127.0.0.1")
    assert str(exc).startswith("rank 1 (executor 1) on 127.0.0.1 raised ValueError: boom from rank 1")
    assert "ValueError: boom from rank 1" in exc.remote_traceback and "fail_on" in exc.remote_traceback
    assert _gone(_read_pids(tmp_path, 3))


def test_a_killed_rank_is_named_before_any_timeout(tmp_path):
    started = time.monotonic()
    with pytest.raises(NodeFailure) as info:
        sparkgrad.run(runner_fns.kill_on, args=(0, str(tmp_path)), num_proc=2, stderr=io.StringIO(), local=True)
    assert time.monotonic() - started < 30  # the other ranks would wait 60 s: it did not wait for them
    assert info.value.rank == 0 and "rank 0" in str(info.value) and "lost" in str(info.value)
    assert _gone(_read_pids(tmp_path, 2))


def test_start_timeout_bounds_the_start(monkeypatch, tmp_path):
    from sparkgrad.errors import RendezvousTimeout

    monkeypatch.setattr(launch, "held_executors", lambda: frozenset({1}))  # rank 1 never registers
    started = time.monotonic()
    with pytest.raises(RendezvousTimeout, match="waited 2 s for 2 nodes"):
        sparkgrad.run(runner_fns.fail_on, args=(-1, str(tmp_path)), num_proc=2, start_timeout=2, local=True)
    assert 2 * 0.9 <= time.monotonic() - started < 2 + 20  # it waited start_timeout, then gave up


# -- Spark ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sc(spark_context):
    spark_context.addPyFile(str(HERE / "runner_fns.py"))
    return spark_context


@pytest.mark.spark
def test_run_on_spark_returns_values_by_rank(sc, spark):
    out = io.StringIO()
    values = sparkgrad.run(
        runner_fns.describe, args=("spark",), num_proc=2, env={"SPARKGRAD_TEST_VAR": "on"}, stdout=out,
        stderr=io.StringIO(), spark=spark,
    )  # fmt: skip
    _check_values(values, 2, "spark", processes_end=False)
    assert "rank 1: stdout line of spark from 1" in out.getvalue().splitlines()


@pytest.mark.spark
def test_run_uses_the_active_session_and_horovod_runner_np_2_is_a_barrier_stage(sc):
    from pyspark.sql import SparkSession

    assert SparkSession.getActiveSession() is not None
    values = sparkgrad.run(
        runner_fns.describe, args=("active",), num_proc=2, stdout=io.StringIO(), stderr=io.StringIO()
    )
    assert all(v["pid"] != os.getpid() for v in values)  # Spark's Python workers, not local processes of this test
    assert sparkgrad.HorovodRunner(np=2).run(runner_fns.hvd_main, scale=2) == {"rank": 0, "size": 2, "scaled": 4}


@pytest.mark.spark
def test_a_raising_rank_on_spark_fails_the_run_before_any_timeout(sc, tmp_path):
    started = time.monotonic()
    with pytest.raises(NodeFailure) as info:
        sparkgrad.run(runner_fns.fail_on, args=(0, str(tmp_path)), num_proc=2, stderr=io.StringIO())
    assert time.monotonic() - started < 30  # the other ranks would wait 60 s: it did not wait for them
    assert info.value.rank == 0 and "ValueError: boom from rank 0" in info.value.remote_traceback


@pytest.mark.spark
def test_a_killed_rank_on_spark_is_named_before_any_timeout(sc, tmp_path):
    started = time.monotonic()
    with pytest.raises(NodeFailure) as info:
        sparkgrad.run(runner_fns.kill_on, args=(1, str(tmp_path)), num_proc=2, stderr=io.StringIO())
    assert time.monotonic() - started < 30  # the other ranks would wait 60 s: it did not wait for them
    assert info.value.rank == 1 and "rank 1" in str(info.value)


# -- the communicator's addresses in TFCluster -----------------------------------------------------


def _quiet(line):
    pass


def test_tfcluster_without_ps_registers_a_comm_port_per_training_node_and_with_ps_none():
    from sparkgrad import TFCluster

    cluster = TFCluster.run(None, runner_fns.tf_ports, None, 2, 0, output=_quiet)
    cluster.shutdown(timeout=60)
    assert all(n.comm_port > 0 and n.comm_port != n.port for n in cluster.nodes)
    assert [cluster.results[i]["comm"] for i in range(2)] == [[[n.host, n.comm_port] for n in cluster.nodes]] * 2
    cluster = TFCluster.run(None, runner_fns.tf_ports, None, 2, 1, output=_quiet)
    cluster.shutdown(timeout=60)
    assert [n.comm_port for n in cluster.nodes] == [0, 0]
    assert cluster.results[1] == {"comm": None}
