"""Driver script for test_torch_distributor's GPU test: Distributor(use_gpu=True) on Spark's local-cluster master.

local-cluster[2,1,1024] starts two workers, each of which announces one "gpu" through a discovery script
(tests/fake_gpu.sh: the address is the script's pid, so the two differ); with spark.task.resource.gpu.amount
= 1 Spark gives each barrier task its worker's address. No GPU is touched: the ranks train nothing, they
report what CUDA_VISIBLE_DEVICES the Distributor set beside what Spark assigned. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession
from sparkgrad.torch import Distributor

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("sparkgrad-torch-gpu")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.memory", "512m")
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        .config("spark.worker.resource.gpu.amount", "1")
        .config("spark.worker.resource.gpu.discoveryScript", os.path.join(HERE, "fake_gpu.sh"))
        .config("spark.executor.resource.gpu.amount", "1")
        .config("spark.task.resource.gpu.amount", "1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    import torch_fns

    try:
        every = Distributor(num_processes=2, local_mode=False, use_gpu=True).run(torch_fns.gpu_view)
        print(json.dumps(every))
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
