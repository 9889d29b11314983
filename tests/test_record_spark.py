"""DataFrame <-> TFRecord with a real local Spark."""

from __future__ import annotations

import os

import numpy as np
import pytest
from sparkgrad.data import (
    FixedLenFeature,
    RawBytesFeature,
    VarLenFeature,
    decode_example,
    load_tfrecords,
    save_as_tfrecords,
    tfrecord_iterator,
)
from sparkgrad.errors import SparkgradIOError

pytestmark = pytest.mark.spark


def test_round_trip_through_executors(spark, tmp_path):
    from pyspark.ml.linalg import Vectors

    rows = [(i, float(i) / 4, f"name{i}", [i, -i, 2**40], bytes([i, 255]), Vectors.dense([i, 0.5])) for i in range(50)]
    df = spark.createDataFrame(rows, ["id", "x", "name", "tags", "raw", "vec"]).repartition(3)
    out = str(tmp_path / "tfr")
    written = save_as_tfrecords(df, out, compression="GZIP")
    assert len(written) == 3 and sum(n for _, n in written) == 50
    assert sorted(os.listdir(out)) == ["_SUCCESS"] + [f"part-r-{i:05d}.gz" for i in range(3)]
    first = decode_example(next(iter(tfrecord_iterator(written[0][0], "GZIP"))))
    assert set(first) == {"id", "x", "name", "tags", "raw", "vec"} and first["vec"].dtype == np.float32

    schema = {
        "id": FixedLenFeature([], "int64"),
        "x": FixedLenFeature([], "float32"),
        "name": FixedLenFeature([], bytes),
        "tags": VarLenFeature("int64"),
        "raw": RawBytesFeature([2], "uint8"),
        "vec": FixedLenFeature([2], "float32"),
    }
    loaded = load_tfrecords(spark, out, schema, compression="GZIP")
    assert loaded.rdd.getNumPartitions() == 3
    got = sorted(loaded.collect(), key=lambda r: r.id)
    assert [r.id for r in got] == list(range(50))
    r = got[7]
    assert r.x == 7 / 4 and bytes(r.name) == b"name7" and r.tags == [7, -7, 2**40]
    assert r.raw == [7, 255] and r.vec == [7.0, 0.5]
    with pytest.raises(SparkgradIOError, match="exists"):
        save_as_tfrecords(df, out)
    assert len(save_as_tfrecords(df.limit(5), out, mode="overwrite")) >= 1


def test_nulls_are_left_out_and_defaults_fill_them(spark, tmp_path):
    df = spark.createDataFrame([(1, 2.0), (2, None)], "id long, w double").coalesce(1)
    out = str(tmp_path / "n")
    save_as_tfrecords(df, out)
    loaded = load_tfrecords(
        spark, out, {"id": FixedLenFeature([], "int64"), "w": FixedLenFeature([], "float32", default=-1.0)}
    )
    assert sorted((r.id, r.w) for r in loaded.collect()) == [(1, 2.0), (2, -1.0)]
