"""10,000 partitions fed (InputMode.SPARK) to one worker whose descriptor limit is 256, on the standalone cluster.

A session of its own with spark.python.worker.reuse on (Spark's default: a
fresh Python worker per task would cost this test minutes of forks and
imports); a node's process may then return to Spark's pool of idle workers,
so the leftover check asks that it hold no listening socket and no thread
but its main one (faults_spark.strays(reused=True)).
"""

from __future__ import annotations

import os

import fault_nodes
import pytest
from faults_spark import markers, quiet, session, strays, wait_executors
from sparkgrad import InputMode, TFCluster

pytestmark = [pytest.mark.spark, pytest.mark.timeout(420)]

PARTITIONS = int(os.environ.get("SPARKGRAD_FAULTS_PARTITIONS", "10000"))
NOFILE = int(os.environ.get("SPARKGRAD_FAULTS_NOFILE", "256"))


@pytest.fixture(scope="module")
def sc(standalone):
    spark = session(standalone, "sparkgrad-faults-feed", reuse_python_workers=True)
    try:
        wait_executors(spark.sparkContext, standalone, 3)
        yield spark.sparkContext
    finally:
        spark.stop()


def test_ten_thousand_partitions_to_one_worker_under_ulimit_256(sc, standalone, tmp_path, fault):
    n_parts, per_part = PARTITIONS, 3
    fault.describe(
        f"{n_parts:,} partitions fed (InputMode.SPARK) to one worker whose RLIMIT_NOFILE is {NOFILE}",
        "training finishes: every row reaches the worker, no descriptor exhaustion",
    )
    rdd = sc.parallelize(range(n_parts * per_part), n_parts)
    cluster = TFCluster.run(
        sc,
        fault_nodes.count_feed,
        {"dir": str(tmp_path), "nofile": NOFILE, "feed_timeout": 30},
        1,
        0,
        input_mode=InputMode.SPARK,
        output=quiet,
        reservation_timeout=90,
    )
    nodes = {}
    try:
        nodes = markers(tmp_path, "started", 1, 60)
        assert nodes["worker:0"]["nofile"] == NOFILE
        fault.start()
        try:
            cluster.train(rdd, num_epochs=1, feed_timeout=60)
            cluster.shutdown(timeout=120)
        except Exception as exc:
            fault.stop()
            fault.observed(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
            left = strays(standalone, nodes, reused=True)
            fault.row["leftovers"] = "none" if not left else "; ".join(left)[:300]
            raise
        seconds = fault.stop()
    finally:
        if not all(launcher.finished() for launcher in cluster._launchers):
            cluster._abort("test teardown")
    result = cluster.results[0]
    n = n_parts * per_part
    assert result["rows"] == n and result["sum"] == n * (n - 1) // 2, result
    fault.observed(f"finished in {seconds:.1f} s, {result['rows']:,} rows ({n_parts / seconds:.0f} partitions/s)")
    fault.leftovers(strays(standalone, nodes, reused=True))
