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
