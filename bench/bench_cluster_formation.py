"""Cluster formation and failure detection of sparkgrad's cluster layer, on this machine.

    python bench/bench_cluster_formation.py [--quick]

Measures, for the local launcher and for Spark local[4] (barrier stage, warm
JVM): the time from TFCluster.run() to a formed cluster (every node
registered and holding the spec) for 1 ps + 2 workers, the time of a whole
run whose map_fun returns at once (run + shutdown), and the time from a
worker's SIGKILL to NodeFailure on the driver (every other node stopped).
Each figure is the median of its runs (10 formations, 3 kills; --quick: 3 and 1)
with min and max. Writes bench/results/cluster_formation.json (rows of
system, metric, value, unit).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import sys
import tempfile
import time

import benchlib

HERE = pathlib.Path(__file__).resolve().parent


def noop(args, ctx):
    if ctx.job_name == "ps":
        from sparkgrad import TFNode

        TFNode.start_cluster_server(ctx).join(60)
    return ctx.task_index


def kill_worker_1(args, ctx):
    if ctx.job_name == "worker" and ctx.task_index == 1:
        with open(os.path.join(args, "killed_at"), "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    ctx.wait_for_stop(60)


def measure(sc, repeats: int, kills: int) -> list[dict]:
    from sparkgrad import TFCluster
    from sparkgrad.errors import NodeFailure

    system = "sparkgrad local launcher" if sc is None else "sparkgrad on Spark local[4]"
    forms, totals, detects = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        cluster = TFCluster.run(sc, noop, None, 3, 1, output=lambda line: None)
        forms.append(time.perf_counter() - start)
        cluster.shutdown(timeout=60)
        totals.append(time.perf_counter() - start)
    for _ in range(kills):
        with tempfile.TemporaryDirectory() as tmp:
            cluster = TFCluster.run(sc, kill_worker_1, tmp, 3, 1, output=lambda line: None)
            try:
                cluster.shutdown(timeout=60)
            except NodeFailure:
                detects.append(time.time() - float(open(os.path.join(tmp, "killed_at")).read()))
            else:
                raise RuntimeError(f"{system}: worker 1 was SIGKILLed but shutdown() raised no NodeFailure")
    return [
        benchlib.median_row(system, "cluster formation (run() to spec), median", forms, "s", 3),
        benchlib.median_row(system, "run + shutdown of a no-op map_fun, median", totals, "s", 3),
        benchlib.median_row(system, "SIGKILL of a worker to NodeFailure (others stopped)", detects, "s", 3),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 formations and 1 kill instead of 10 and 3")
    benchlib.add_update_flag(parser)
    args = parser.parse_args()
    meta = benchlib.metadata("cluster_formation")
    repeats, kills = (3, 1) if args.quick else (10, 3)
    sys.path.insert(0, str(HERE))  # so Spark's workers can import this module's map_funs by reference
    rows = measure(None, repeats, kills)
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        print("pyspark is not installed: Spark rows skipped", file=sys.stderr)
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        spark = (
            SparkSession.builder.master("local[4]")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        spark.sparkContext.addPyFile(__file__)
        from sparkgrad import TFCluster

        TFCluster.run(spark.sparkContext, noop, None, 3, 1, output=lambda line: None).shutdown(timeout=120)  # warm-up
        rows += measure(spark.sparkContext, repeats, kills)
        spark.stop()
    out = benchlib.results_file("cluster_formation.json", args.update)
    out.parent.mkdir(parents=True, exist_ok=True)
    benchlib.write_results(out, rows, meta)
    width = max(len(r["system"]) for r in rows)
    for r in rows:
        print(f"{r['system']:<{width}}  {r['metric']:<52} {r['value']:8.3f} {r['unit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
