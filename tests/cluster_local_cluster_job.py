"""Driver script for test_cluster_local_cluster: a sparkgrad cluster on Spark's local-cluster master.

local-cluster[2,1,1024] starts a master, two workers and one executor JVM per
worker (1 core each), so each node runs in its own executor process, as on a
real cluster. Prints one JSON line: {"spec", "results", "ctx", "driver", "spark"}
("spark": each node's Spark executor id and host, as its registration carried them).
"""

from __future__ import annotations

import json
import os
import sys

import cluster_nodes
from pyspark.sql import SparkSession
from sparkgrad import TFCluster


def main(out_dir: str) -> None:
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("sparkgrad-local-cluster")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.memory", "512m")
        # executors of local-cluster do not inherit the driver's environment: ship the tree's path
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        .getOrCreate()
    )
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    sc.addPyFile(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster_nodes.py"))
    try:
        cluster = TFCluster.run(
            sc, cluster_nodes.write_ctx, {"dir": out_dir}, 2, 1, reservation_timeout=90, slots_timeout=90
        )
        cluster.shutdown(timeout=90)
        ctx = [json.load(open(os.path.join(out_dir, f"ctx-{i}.json"))) for i in range(2)]
        spark_names = {n.name: [n.spark_executor, n.spark_host] for n in cluster.nodes}
        print(
            json.dumps(
                {
                    "spec": cluster.cluster_spec,
                    "results": cluster.results,
                    "ctx": ctx,
                    "driver": os.getpid(),
                    "spark": spark_names,
                }
            )
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
