"""The main job that ``make demo`` runs.

It grows with the project; today it starts local Spark, spreads Debian's
Fashion-MNIST over the executors and reports what each class holds, proving
that the package, its C core and Spark all work together on this machine.
"""

from __future__ import annotations

import sys

import numpy as np

import sparkgrad
from sparkgrad.data.idx import fashion_mnist


def main() -> int:
    from pyspark.sql import SparkSession

    print(f"sparkgrad {sparkgrad.__version__}; core: {sparkgrad.build_info()}")
    images, labels = fashion_mnist("train")
    spark = SparkSession.builder.master("local[2]").appName("sparkgrad-demo").getOrCreate()
    try:
        sc = spark.sparkContext
        sc.setLogLevel("ERROR")
        rows = sc.parallelize(range(len(labels)), 4).map(lambda i: (int(labels[i]), float(images[i].mean())))
        stats = rows.aggregateByKey(
            (0, 0.0), lambda a, v: (a[0] + 1, a[1] + v), lambda a, b: (a[0] + b[0], a[1] + b[1])
        )
        for label, (count, total) in sorted(stats.collect()):
            print(f"class {label}: {count} images, mean pixel {total / count:.1f}")
        assert sum(c for _, (c, _) in stats.collect()) == len(labels) == np.int64(60000)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
