"""TensorFlowOnSpark anchor of bench_feed.py (run by an interpreter with tensorflow and tensorflowonspark).

What a TensorFlowOnSpark user does with a DataFrame: TFCluster.run(sc, main_fun,
args, 2, num_ps=0, input_mode=InputMode.SPARK) and cluster.train(df.rdd) (its
train takes RDDs, as its own TFEstimator passes them); each node's main_fun
takes DataFeed.next_batch(batch) until should_stop() and counts the rows. The
DataFrame is the Parquet file bench_feed.py wrote, cached before the timed
train. Writes ``--out`` (JSON): {"rows_per_second": [one figure per run]}.

    python bench/feed_tfos.py --data PARQUET --rows N --repeat R --batch B --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main_fun(args, ctx):
    """Runs on each TensorFlowOnSpark node: counts the rows it is fed."""
    import json
    import os

    from tensorflowonspark import TFNode

    feed = TFNode.DataFeed(ctx.mgr)
    rows = 0
    while not feed.should_stop():
        batch = feed.next_batch(args.batch)
        rows += len(batch)
    with open(os.path.join(args.out_dir, f"rows-{ctx.task_index}-{args.run}.json"), "w") as f:
        json.dump({"rows": rows}, f)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="untimed runs before the timed ones")
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    args.out_dir = os.path.dirname(os.path.abspath(args.out))

    from pyspark.sql import SparkSession
    from tensorflowonspark import TFCluster

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        # two executor processes: on local[N] every task shares one working directory, where TensorFlowOnSpark
        # keeps the executor id, so every feeding task finds the last node's queue and the other worker gets nothing
        SparkSession.builder.master("local-cluster[2,1,2048]")
        .appName("bench_feed-tfos")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.read.parquet(args.data).cache()
    df.count()
    figures = []
    for run in range(args.warmup + args.repeat):
        args.run = run
        cluster = TFCluster.run(spark.sparkContext, main_fun, args, 2, num_ps=0, input_mode=TFCluster.InputMode.SPARK)
        start = time.perf_counter()
        cluster.train(df.rdd, num_epochs=1)
        seconds = time.perf_counter() - start
        cluster.shutdown()
        got = 0
        for index in range(2):
            with open(os.path.join(args.out_dir, f"rows-{index}-{run}.json")) as f:
                got += json.load(f)["rows"]
        if got != args.rows:
            raise SystemExit(f"feed_tfos: the nodes counted {got} rows of {args.rows}")
        if run >= args.warmup:
            figures.append(args.rows / seconds)
    spark.stop()
    with open(args.out, "w") as f:
        json.dump({"rows_per_second": figures}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
