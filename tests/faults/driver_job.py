"""The driver of test_driver_killed, run as its own process: a 3-node ps cluster on the standalone master
given as argv[1], training until stopped (at most fault_nodes.RUN_SECONDS); the test SIGKILLs this process."""

from __future__ import annotations

import os
import sys

import fault_nodes
from pyspark.sql import SparkSession
from sparkgrad import TFCluster


def main(master: str, out_dir: str) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    spark = (
        SparkSession.builder.master(master)
        .appName("sparkgrad-faults-driver-killed")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.python.worker.reuse", "false")
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        .getOrCreate()
    )
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    sc.addPyFile(os.path.join(here, "fault_nodes.py"))
    cluster = TFCluster.run(
        sc, fault_nodes.train_until_stopped, {"dir": out_dir}, 3, 1, reservation_timeout=90, heartbeat_timeout=5.0
    )
    print("driver: cluster running", flush=True)
    cluster.shutdown(timeout=300)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
