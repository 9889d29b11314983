"""Partitions fed (InputMode.SPARK) to one worker whose descriptor limit is 256, on the standalone cluster.

The worker is a real node (a barrier task on an executor) with its real feed
server; it sets RLIMIT_NOFILE to 256 before the feed starts, so a server
that keeps a connection per partition runs out of descriptors after ~240.

- 10,000 partitions: fed by two plain processes on the driver's host running
  the code each Spark feeding task runs (FeedTarget.feed, one connection per
  partition), then the driver's end of input, as cluster.train sends it.
  Through Spark itself 10,000 tasks take ~28 min on a 2-core machine (about 6
  tasks/s measured on this standalone cluster, PySpark's per-task floor), far
  beyond the suite's budget.
- 600 partitions through cluster.train itself (Spark tasks), still 2.3 times
  the descriptor limit.

A session of its own with spark.python.worker.reuse on (Spark's default): a
node's process may then return to Spark's pool of idle workers, so the
leftover check asks that it hold no listening socket and no thread but its
main one (faults_spark.strays(reused=True)).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fault_nodes
import pytest
from faults_spark import markers, quiet, session, strays, wait_executors
from sparkgrad import InputMode, TFCluster
from sparkgrad.cluster.feed import DEFAULT_INPUT

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

HERE = Path(__file__).resolve().parent
NOFILE = int(os.environ.get("SPARKGRAD_FAULTS_NOFILE", "256"))  # another value only to diagnose


@pytest.fixture(scope="module")
def sc(standalone):
    spark = session(standalone, "sparkgrad-faults-feed", reuse_python_workers=True)
    try:
        wait_executors(spark.sparkContext, standalone, 3)
        yield spark.sparkContext
    finally:
        spark.stop()


def _start_worker(sc, tmp_path):
    cluster = TFCluster.run(
        sc,
        fault_nodes.count_feed,
        {"dir": str(tmp_path), "nofile": NOFILE, "feed_timeout": 30, "batch": 64},
        1,
        0,
        input_mode=InputMode.SPARK,
        output=quiet,
        reservation_timeout=90,
    )
    nodes = markers(tmp_path, "started", 1, 60)
    assert nodes["worker:0"]["nofile"] == NOFILE
    return cluster, nodes


def _finish(cluster, standalone, nodes, fault, feed) -> float:
    """Runs feed() and the shutdown; on a failure records what was seen and what was left, then raises."""
    fault.start()
    try:
        try:
            feed()
            cluster.shutdown(timeout=120)
        except Exception as exc:
            fault.stop()
            fault.observed(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
            left = strays(standalone, nodes, reused=True)
            fault.row["leftovers"] = "none" if not left else "; ".join(left)[:300]
            raise
        return fault.stop()
    finally:
        if not all(launcher.finished() for launcher in cluster._launchers):
            cluster._abort("test teardown")
        cluster._close()  # idempotent: the driver's event thread and rendezvous end here at the latest


def test_ten_thousand_partitions_to_one_worker_under_ulimit_256(sc, standalone, tmp_path, fault):
    n_parts, per_part = 10_000, 3
    fault.describe(
        f"{n_parts:,} partitions (one feed connection each, from 2 feeder processes) to one worker on the "
        f"standalone cluster whose RLIMIT_NOFILE is {NOFILE}",
        "training finishes: every row reaches the worker, no descriptor exhaustion",
    )
    cluster, nodes = _start_worker(sc, tmp_path)
    (host, port), secret = cluster._feed_targets()[0], cluster._secret
    env = dict(os.environ, SG_SECRET=secret.hex(), PYTHONPATH=str(HERE.parents[1] / "python"))
    feeders: list[subprocess.Popen] = []

    def feed() -> None:
        for k in range(2):
            cmd = [sys.executable, str(HERE / "feeder.py"), host, str(port), str(k), str(n_parts), "2", str(per_part)]
            feeders.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = []
        for f in feeders:
            try:
                out, err = f.communicate(timeout=240)
            except subprocess.TimeoutExpired:
                f.kill()
                out, err = f.communicate(timeout=10)
            outs.append((f.returncode, out.strip(), err.strip().splitlines()[-1:] if err.strip() else ""))
        failed = [f"exit {code}: {err[0] if err else '?'}" for code, _, err in outs if code != 0]
        assert not failed, f"{len(failed)} of 2 feeders failed: {failed[0]}"
        assert sum(int(out) for _, out, _ in outs) == n_parts * per_part, outs
        cluster._server.send(nodes["worker:0"]["executor_id"], {"type": "feed_end", "input": DEFAULT_INPUT})

    try:
        seconds = _finish(cluster, standalone, nodes, fault, feed)
    finally:
        for f in feeders:
            if f.poll() is None:
                f.kill()
                f.wait(10)
    result = cluster.results[0]
    n = n_parts * per_part
    assert result["rows"] == n and result["sum"] == n * (n - 1) // 2, result
    fault.observed(f"finished in {seconds:.1f} s, {result['rows']:,} rows ({n_parts / seconds:.0f} partitions/s)")
    fault.leftovers(strays(standalone, nodes, reused=True))


def test_six_hundred_spark_partitions_to_one_worker_under_ulimit_256(sc, standalone, tmp_path, fault):
    n_parts, per_part = 600, 3
    fault.describe(
        f"{n_parts} partitions fed by cluster.train (Spark tasks) to one worker whose RLIMIT_NOFILE is {NOFILE}",
        "training finishes: every row reaches the worker, no descriptor exhaustion",
    )
    cluster, nodes = _start_worker(sc, tmp_path)
    rdd = sc.parallelize(range(n_parts * per_part), n_parts)
    seconds = _finish(cluster, standalone, nodes, fault, lambda: cluster.train(rdd, num_epochs=1, feed_timeout=60))
    result = cluster.results[0]
    n = n_parts * per_part
    assert result["rows"] == n and result["sum"] == n * (n - 1) // 2, result
    fault.observed(f"finished in {seconds:.1f} s, {result['rows']:,} rows")
    fault.leftovers(strays(standalone, nodes, reused=True))
