"""A local Spark Connect server for test_cluster_connect, in its own process: ``python connect_server.py N``.

What ``SparkSession.builder.remote("local[N]")`` starts inside the calling
process (a local[N] Spark with the Connect plugin), started here in a process
of its own, so the tests' client has no JVM of its own, as on Databricks, and
a classic session of the same pytest run does not stand in its way. The gRPC
port is bound by the server (port 0) and printed as one line "port P"; the
server ends when its standard input closes.
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession


def main(slots: int) -> None:
    spark = (
        SparkSession.builder.master(f"local[{slots}]")
        .appName("sparkgrad-connect-tests")
        .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
        .config("spark.connect.grpc.binding.address", "127.0.0.1")
        .config("spark.connect.grpc.binding.port", "0")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.python.task.killTimeout", "2s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    service = getattr(spark.sparkContext._jvm.org.apache.spark.sql.connect.service, "SparkConnectService$")
    print(f"port {getattr(service, 'MODULE$').localPort()}", flush=True)
    sys.stdin.read()  # until the test process closes the pipe (or dies)
    spark.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]))
