"""What the anchor drivers of bench_cluster.py share (cluster_tfos.py, cluster_torch.py).

Each anchor runs in its own interpreter (TensorFlowOnSpark in a venv with
tensorflow); this module needs only pyspark and the standard library. It parses
the common options, starts the SparkSession the same way for every anchor
(warm: a Python job has run on the context already, as in a notebook; cold:
run() is the context's first job), and writes the driver's result JSON from
the per-node result files.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import json
import os
import sys
import time


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out-dir", required=True, help="where the nodes write their results")
    p.add_argument("--out", required=True, help="the driver's result (JSON)")
    p.add_argument("--samples", type=int, default=60000)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--learning-rate", type=float, default=0.07)
    p.add_argument("--cold", action="store_true", help="no Python job on the SparkContext before run()")
    p.add_argument("--seed", type=int, default=42, help="initial weights and the data's shuffle")
    return p


def start_spark(app: str, slots: int, cold: bool, conf: dict[str, str] | None = None):
    """(SparkSession on local[slots], seconds it took); executors run this interpreter."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    started = time.time()
    builder = SparkSession.builder.master(f"local[{slots}]").appName(app)
    for key, value in {"spark.ui.showConsoleProgress": "false", **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if not cold:  # a context that has run a Python job already, as in a notebook
        spark.sparkContext.parallelize(range(slots), slots).map(lambda x: x).count()
    return spark, time.time() - started


def write_result(args: argparse.Namespace, prefix: str, timings: dict[str, float], spark_seconds: float, packages):
    """Collects <out_dir>/<prefix>-*.json written by the nodes into the driver's result."""
    nodes = []
    for path in sorted(glob.glob(os.path.join(args.out_dir, f"{prefix}-*.json"))):
        with open(path) as f:
            nodes.append(json.load(f))
    out = {
        **timings,
        "spark_start_seconds": spark_seconds,
        "nodes": nodes,
        "versions": {m: importlib.metadata.version(m) for m in packages},
    }
    with open(args.out, "w") as f:
        json.dump(out, f)
    print(json.dumps(out))
    return 0


def run_torch_distributor(args: argparse.Namespace, app: str, train_fn, *fn_args) -> int:
    """The driver of a TorchDistributor anchor: a SparkSession on local[num_processes], then
    TorchDistributor(local_mode=True, CPU).run(train_fn, *fn_args) timed, then the result file."""
    from pyspark.ml.torch.distributor import TorchDistributor

    os.makedirs(args.out_dir, exist_ok=True)
    spark, spark_seconds = start_spark(app, args.num_processes, args.cold)
    t0 = time.time()
    TorchDistributor(num_processes=args.num_processes, local_mode=True, use_gpu=False).run(train_fn, *fn_args)
    t_end = time.time()
    spark.stop()
    return write_result(args, "torch", {"t0": t0, "end": t_end}, spark_seconds, ("torch", "pyspark"))


class SleepCounter:
    """Sums the time.sleep calls made from the modules under ``prefix`` while active (a framework's
    own fixed waits, e.g. in its shutdown), sleeping them as usual; other callers are not counted."""

    def __init__(self, prefix: str):
        self.prefix, self.seconds, self.calls = prefix, 0.0, 0
        self._real = time.sleep

    def _sleep(self, seconds: float) -> None:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith(self.prefix):
            self.seconds += seconds
            self.calls += 1
        self._real(seconds)

    def __enter__(self):
        time.sleep = self._sleep
        return self

    def __exit__(self, *exc):
        time.sleep = self._real
        return False
