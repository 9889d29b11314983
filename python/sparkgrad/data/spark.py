"""Spark DataFrames <-> TFRecord files of tf.train.Examples.

    save_as_tfrecords(df, "/dbfs/data/train", compression="GZIP")
    df = load_tfrecords(spark, "/dbfs/data/train", schema)

Both run on the executors, one task per partition (save) or per file (load),
with sparkgrad's C writer/reader; nothing but file names and counts passes
through the driver. Paths must be visible to every executor (a local path in
local mode, ``/dbfs/...`` or ``dbfs:/...`` on Databricks).

Column types (save):  integral and boolean -> Int64List, float/double ->
FloatList, string/binary -> BytesList; arrays of those (and ML vectors) ->
lists; nulls -> the feature is left out (a FixedLen default can fill it).
Schema types (load):  FixedLen int64/float32/bytes shape [] -> long/float/
binary; other shapes (flattened), VarLen and RawBytes -> arrays.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping

import numpy as np

from sparkgrad.data.dataset import _local, expand_paths
from sparkgrad.data.example import FixedLenFeature, RawBytesFeature, Schema, VarLenFeature, as_schema
from sparkgrad.errors import InvalidArgumentError, SchemaError, SparkgradIOError

_SUFFIX = {None: "", "GZIP": ".gz", "ZLIB": ".zz"}


def _column_kinds(struct) -> dict[str, str]:
    """Column name -> "int64" | "float" | "bytes" | "vector" from a Spark StructType."""
    from pyspark.sql import types as T

    def kind(dt) -> str:
        if isinstance(dt, (T.LongType, T.IntegerType, T.ShortType, T.ByteType, T.BooleanType)):
            return "int64"
        if isinstance(dt, (T.FloatType, T.DoubleType, T.DecimalType)):
            return "float"
        if isinstance(dt, (T.StringType, T.BinaryType)):
            return "bytes"
        if isinstance(dt, T.ArrayType):
            return kind(dt.elementType)
        if type(dt).__name__ == "VectorUDT":
            return "vector"
        raise SchemaError(f"column type {dt.simpleString()} cannot be written as a tf.train.Feature")

    return {f.name: kind(f.dataType) for f in struct.fields}


def _to_value(kind: str, v):
    if kind == "vector":
        return ("float", v.toArray().astype(np.float32))
    if isinstance(v, (list, tuple)):
        if kind == "bytes":
            return ("bytes", [x.encode() if isinstance(x, str) else bytes(x) for x in v if x is not None])
        return (kind, [x for x in v if x is not None])
    if kind == "bytes":
        return ("bytes", [v.encode() if isinstance(v, str) else bytes(v)])
    return (kind, [int(v) if kind == "int64" else float(v)])


def save_as_tfrecords(df, path: str, compression: str | None = None, mode: str = "error") -> list[tuple[str, int]]:
    """Writes a DataFrame as TFRecord files of ``tf.train.Example``, one file per partition, on the executors.

    Each partition becomes ``<path>/part-r-NNNNN`` (``.gz`` or ``.zz`` with compression), written by
    sparkgrad's C writer in a Spark task; then the driver writes ``_SUCCESS``. Column types map to
    features as: integral and boolean to Int64List, float, double and decimal to FloatList, string
    and binary to BytesList, arrays of those and ML vectors to lists; a null leaves the feature out
    of that record (a FixedLenFeature default can fill it when reading).

    ```python
    save_as_tfrecords(df, "/dbfs/data/train", compression="GZIP")
    ```

    Args:
        df (pyspark.sql.DataFrame): The rows to write (classic Spark: it uses ``df.rdd``).
        path: A directory every executor can write (a local path in local mode, ``/dbfs/...`` or
            ``dbfs:/...`` on Databricks).
        compression: None, ``"ZLIB"`` or ``"GZIP"``.
        mode: ``"error"`` (``path`` must not exist) or ``"overwrite"`` (``path`` is deleted first).

    Returns:
        ``[(file, records)]`` for every file written, sorted by file.

    Raises:
        InvalidArgumentError: An unknown compression or mode.
        SparkgradIOError: ``path`` exists and mode is ``"error"``.
        SchemaError: A column type that cannot be written as a feature (maps, structs, dates).
    """
    comp = compression.upper() if compression else None
    if comp not in _SUFFIX:
        raise InvalidArgumentError(f"compression must be None, 'ZLIB' or 'GZIP', not {compression!r}")
    out = _local(path)
    if os.path.exists(out):
        if mode == "overwrite":
            shutil.rmtree(out)
        elif mode == "error":
            raise SparkgradIOError(f"{out} exists (pass mode='overwrite' to replace it)", path=out)
        else:
            raise InvalidArgumentError(f"mode must be 'error' or 'overwrite', not {mode!r}")
    os.makedirs(out)
    kinds = _column_kinds(df.schema)
    columns = list(kinds)
    suffix = _SUFFIX[comp]

    def write_partition(index: int, rows: Iterator) -> Iterator[tuple[str, int]]:
        from sparkgrad.data.example import encode_example
        from sparkgrad.data.tfrecord import TFRecordWriter

        file = os.path.join(out, f"part-r-{index:05d}{suffix}")
        n = 0
        with TFRecordWriter(file, comp) as w:
            for row in rows:
                feats = {c: _to_value(kinds[c], row[c]) for c in columns if row[c] is not None}
                w.write(encode_example(feats))
                n += 1
        yield (file, n)

    written = df.rdd.mapPartitionsWithIndex(write_partition).collect()
    open(os.path.join(out, "_SUCCESS"), "wb").close()
    return sorted(written)


def spark_schema(schema: Schema | Mapping):
    """The Spark ``StructType`` that `load_tfrecords` produces for a parsing schema.

    A FixedLenFeature of shape ``[]`` becomes a long, float or binary column; other shapes (flattened),
    VarLenFeatures and RawBytesFeatures become arrays of those (uint8 RawBytes: arrays of int).
    No column is nullable.

    Args:
        schema: A `Schema` or a dict of features.
    """
    from pyspark.sql import types as T

    base = {"int64": T.LongType(), "float32": T.FloatType(), "bytes": T.BinaryType(), "uint8": T.IntegerType()}

    def name(dtype) -> str:
        from sparkgrad.data.example import _dtype_name

        return _dtype_name(dtype)

    fields = []
    for key, spec in as_schema(schema).features.items():
        if isinstance(spec, FixedLenFeature):
            elem = base[name(spec.dtype)]
            shape = (spec.shape,) if isinstance(spec.shape, int) else tuple(spec.shape)
            dt = elem if shape == () else T.ArrayType(elem, containsNull=False)
            fields.append(T.StructField(key, dt, nullable=False))
        elif isinstance(spec, VarLenFeature):
            fields.append(T.StructField(key, T.ArrayType(base[name(spec.dtype)], containsNull=False), nullable=False))
        elif isinstance(spec, RawBytesFeature):
            fields.append(T.StructField(key, T.ArrayType(base[name(spec.dtype)], containsNull=False), nullable=False))
    return T.StructType(fields)


def _rows(batch: dict, schema: Schema) -> Iterator[tuple]:
    cols = []
    for key, spec in schema.features.items():
        v = batch[key]
        if isinstance(spec, VarLenFeature):
            values = v.values if isinstance(v.values, list) else v.values.tolist()
            splits = v.row_splits.tolist()
            cols.append([values[splits[i] : splits[i + 1]] for i in range(len(splits) - 1)])
        elif v.ndim == 1:
            cols.append(v.tolist())
        else:
            cols.append(v.reshape(v.shape[0], -1).tolist())
    return zip(*cols, strict=True)


def load_tfrecords(spark, path, schema: Schema | Mapping, compression: str | None = None, batch_size: int = 1024):
    """A DataFrame of the Examples in TFRecord files, parsed with ``schema`` on the executors.

    One Spark partition per file; nothing but file names passes through the driver. The columns are
    `spark_schema`'s.

    ```python
    df = load_tfrecords(spark, "/dbfs/data/train", schema)
    ```

    Args:
        spark (pyspark.sql.SparkSession): A classic SparkSession (it uses ``spark.sparkContext``).
        path (str | list[str]): A file, directory or glob, or a list of them, visible to every executor.
        schema: A `Schema` or a dict of features.
        compression: None, ``"ZLIB"`` or ``"GZIP"``.
        batch_size: Records parsed per C call in the tasks.

    Raises:
        SparkgradIOError: ``path`` names no files.
        SchemaError: A bad schema; when the job runs, a record that does not match it.
    """
    schema = as_schema(schema)
    files = expand_paths(path)
    struct = spark_schema(schema)
    features = schema.features

    def read_files(paths: Iterator[str]) -> Iterator[tuple]:
        from sparkgrad.data.dataset import TFRecordDataset

        for p in paths:
            for batch in TFRecordDataset([p], features, batch_size, compression=compression, prefetch=1):
                yield from _rows(batch, as_schema(features))

    rdd = spark.sparkContext.parallelize(files, len(files)).mapPartitions(read_files)
    return spark.createDataFrame(rdd, struct)
