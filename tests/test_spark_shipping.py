"""ShippedModel: one broadcast per job on classic Spark, a per-worker cache of the built model."""

import numpy as np
import pytest
from sparkgrad.nn import Dense, Sequential


@pytest.mark.spark
def test_a_shipped_model_scores_in_tasks_and_is_built_once_per_worker(spark):
    from sparkgrad.spark import ShippedModel

    model = Sequential([Dense(3, activation="softmax", input_shape=(4,))], seed=5)
    shipped = ShippedModel(spark, model)
    x = np.arange(32, dtype=np.float32).reshape(8, 4) / 32

    def score(rows):
        import os

        from sparkgrad.spark.shipping import cached_models

        m = shipped.load()
        assert shipped.load() is m
        for r in rows:
            yield (os.getpid(), cached_models(), m.predict(np.asarray([r], np.float32))[0].tolist())

    out = spark.sparkContext.parallelize(x.tolist(), 4).mapPartitions(score).collect()
    np.testing.assert_allclose([o[2] for o in out], model.predict(x), rtol=1e-6)
    assert all(o[1] >= 1 for o in out)
    shipped.release()
