"""Tables over Spark Connect: Estimator.fit, Model.transform and Model.predict_table on a Connect DataFrame.

test_spark_ml_tables.py's table and model (tests/spark_ml_tables_data.py: a string column into a
StringLookup, an id into an Embedding, numbers, a Spark ML vector, nulls in a string and a number column)
written by the Connect server's Spark and read back with ``connect.read.parquet``. The server is
test_cluster_connect's (local[4], in a process of its own; this client has no JVM), so this module runs where
that one does: the py312-spark40 leg of ``make test-matrix``. The bad inputs are spark_ml_tables_data's
``BAD_INPUTS``, which test_spark_ml_tables.py checks on classic Spark: the same error, word for word.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from spark_ml_tables_data import BAD_INPUTS, COLUMNS, WIDE_COLUMNS, model, write_table
from sparkgrad.errors import NodeFailure
from sparkgrad.nn import Adam
from test_cluster_connect import connect  # noqa: F401 - the module's Connect server and client (a fixture)

pytest.importorskip("pyarrow")
pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def shops(connect, tmp_path_factory):  # noqa: F811 - the fixture imported above
    """(train with nulls, held-out without), written by the server's Spark and read back over Connect."""
    root = tmp_path_factory.mktemp("connect-tables")
    return (
        write_table(connect, str(root / "train"), 1200, seed=1, nulls=True, wide=True),
        write_table(connect, str(root / "test"), 400, seed=2, nulls=False, wide=True),
    )


def _estimator(wide=True, **params):
    from sparkgrad.spark import Estimator

    cols = WIDE_COLUMNS if wide else COLUMNS
    base = dict(
        model=model(wide=wide), optimizer=Adam(0.02), inputCols=cols, labelCol="label", batch_size=32, num_workers=2
    )
    return Estimator(**{**base, **params})


def test_two_workers_fit_a_connect_parquet_table_from_its_files_with_every_column_kind_and_nulls(shops, tmp_path):
    """A string, a long id, an int, a double with nulls, a vector, an array<float> and binary."""
    train, test = shops
    kinds = {f.name: f.dataType.simpleString() for f in train.schema.fields}
    assert [kinds[c] for c in WIDE_COLUMNS] == ["string", "bigint", "int", "double", "vector", "array<float>", "binary"]
    cache = tmp_path / "cache"
    fitted = _estimator(epochs=4, nulls={"city": "skip", "spend": 0.0}, cache_dir=str(cache), seed=3).fit(train)
    assert not cache.exists()  # a plain Parquet scan: read from its own files, nothing written
    assert [h["rank"] for h in fitted.history] == [0, 1]
    assert fitted.history[0]["steps"] == fitted.history[1]["steps"] > 0  # allreduce: the workers stepped together
    scored = fitted.evaluate(test)
    assert scored["rows"] == 400 and scored["accuracy"] > 0.85, scored


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_over_connect_fails_fit_with_the_error_classic_spark_gives(shops, case):
    make, params, error, message = BAD_INPUTS[case]
    with pytest.raises(error, match=message) as info:
        _estimator(wide=False, epochs=1, **params).fit(make(shops[0].drop("pair", "raw")))
    if case == "null_under_error":  # raised by a worker's read: the node's failure, with its traceback, is the cause
        assert isinstance(info.value.__cause__, NodeFailure) and "Traceback" in info.value.__cause__.remote_traceback


def _rows(df, *cols):
    return sorted(tuple(r[c] for c in ("id", *cols)) for r in df.select("id", *cols).collect())


def _flat(rows):
    """Rows of (id, prediction, probability vector, rawPrediction vector) as numbers, for assert_allclose."""
    return np.array([[i, p, *prob.toArray(), *raw.toArray()] for i, p, prob, raw in rows])


def test_predict_table_over_connect_writes_what_transform_gives_from_files_or_the_cache(connect, shops, tmp_path):  # noqa: F811
    from sparkgrad.spark import Model

    scorer = Model.from_nn(model(seed=4, wide=True), inputCols=WIDE_COLUMNS)
    test = shops[1]
    cols = ("prediction", "probability", "rawPrediction")
    cache, out = tmp_path / "cache", str(tmp_path / "scores")
    # a plain scan is read from its files: no cache entry
    assert scorer.predict_table(test, out, keep=["id"], cache_dir=str(cache)) == 400
    assert not cache.exists()
    scored = connect.read.parquet(out)
    assert scored.columns == [*cols, "id"]
    want = _rows(scorer.transform(test), *cols)
    got = _rows(scored, *cols)
    assert [r[:2] for r in got] == [r[:2] for r in want] and {r[1] for r in got} == {0.0, 1.0}
    np.testing.assert_allclose(_flat(got), _flat(want), rtol=1e-6, atol=1e-7)
    # a filtered DataFrame is written to the cache once, then scored from it
    filtered = test.filter("visits >= 5")
    count = filtered.count()
    assert 0 < count < 400
    assert scorer.predict_table(filtered, out, keep=["id", "city"], cache_dir=str(cache)) == count
    assert len(os.listdir(cache)) == 1
    again = connect.read.parquet(out)
    assert again.columns == [*cols, "id", "city"]
    want = _rows(scorer.transform(filtered), *cols, "city")
    got = _rows(again, *cols, "city")
    assert [(r[0], r[1], r[4]) for r in got] == [(r[0], r[1], r[4]) for r in want]
    np.testing.assert_allclose(_flat(r[:4] for r in got), _flat(r[:4] for r in want), rtol=1e-6, atol=1e-7)
