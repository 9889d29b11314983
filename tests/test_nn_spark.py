"""On a real (local) Spark executor, training uses spark.task.cpus threads."""

from __future__ import annotations

import pytest

pyspark = pytest.importorskip("pyspark")

pytestmark = pytest.mark.spark


def test_fit_in_a_spark_task_uses_spark_task_cpus(spark_context):
    """The shared session runs with the default spark.task.cpus = 1."""

    # defined here so that cloudpickle ships it by value (the executor cannot import tests/)
    def _train_in_task(_):
        import numpy as np
        from sparkgrad.nn import SGD, Dense, Sequential, get_num_threads
        from sparkgrad.nn.threads import spark_task_cpus

        m = Sequential([Dense(8, activation="relu", input_shape=(6,)), Dense(3)], seed=1)
        m.compile(optimizer=SGD(0.1), loss="sparse_categorical_crossentropy")
        x = np.random.default_rng(0).standard_normal((64, 6)).astype(np.float32)
        h = m.fit(x, (x[:, 0] > 0).astype(np.int64), batch_size=16, epochs=2, verbose=0)
        return [(spark_task_cpus(), get_num_threads(), len(h.history["loss"]))]

    assert spark_context.getConf().get("spark.task.cpus", "1") == "1"
    out = spark_context.parallelize(range(2), 2).mapPartitions(_train_in_task).collect()
    assert out == [(1, 1, 2), (1, 1, 2)]
