"""Driver script for test_spark_ml_tables: the Estimator fits a Parquet table on local[2] (2 task slots).

Spark writes a synthetic table (a known rule decides the label; a string, an id, numbers and a Spark
ML vector; nulls in the string and a number column) and a held-out one without nulls, reads them
back with ``spark.read.parquet``, and an Estimator of 2 allreduce workers fits the first: 2 slots,
one barrier task per worker. Prints one JSON line: the held-out metrics before and after, the
workers' history and the slot count Spark had.
"""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession
from spark_ml_tables_data import COLUMNS, model, write_table


def main(root: str) -> None:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sparkgrad-tables-local2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    from sparkgrad.cluster.spark import spark_session
    from sparkgrad.nn import Adam
    from sparkgrad.spark import Estimator
    from sparkgrad.spark import Model as SparkModel

    train = write_table(spark, os.path.join(root, "train"), 3000, seed=1, nulls=True)
    test = write_table(spark, os.path.join(root, "test"), 600, seed=2, nulls=False)
    before = SparkModel.from_nn(model(), inputCols=COLUMNS).evaluate(test)
    fitted = Estimator(
        model=model(),
        optimizer=Adam(0.01),
        inputCols=COLUMNS,
        labelCol="label",
        batch_size=64,
        epochs=6,
        num_workers=2,
        mode="allreduce",
        nulls={"city": "skip", "spend": 0.0},
        cache_dir=os.path.join(root, "cache"),
        seed=5,
    ).fit(train)
    after = fitted.evaluate(test)
    skipped = train.filter("city IS NULL").count()
    print(
        json.dumps(
            {
                "slots": spark_session(spark).slot_count().slots,
                "before": before,
                "after": after,
                "history": fitted.history,
                "skipped": skipped,
                "cache": os.path.exists(os.path.join(root, "cache")),
            }
        )
    )
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
