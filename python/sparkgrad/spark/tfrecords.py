"""Scoring and evaluating a model over TFRecord files in Spark tasks, without the driver touching a row.

    preds = predict_tfrecords(spark, "/dbfs/mnist/test", model, mnist_schema(), keep=["label"])
    stats = evaluate_tfrecords(spark, "/dbfs/mnist/test", model, mnist_schema())  # {loss, accuracy, count}

The file list (expanded on the driver: globs, directories) becomes a
DataFrame of file indices, ``files_per_task`` files per partition
(``spark.range``: no shuffle, and it works over Spark Connect as on classic
Spark); ``mapInArrow`` runs one function per partition that reads its files
with sparkgrad's C reader (TFRecordDataset, one file at a time so an error
names it), scores each batch with the model that ShippedModel delivered once
per job and cached per Python worker, and yields Arrow record batches.
Evaluation yields one row of sums per task (loss sum, count, the metrics' state) that
Spark adds up; the driver receives that one row.

Only the features the job needs are parsed: the model's input, the label
(evaluation) and the pass-through ``keep`` columns. What this module does not
do: read DataFrames (sparkgrad.spark.Model.transform does) or write the
predictions anywhere (that is the caller's ``df.write``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkgrad.data.example import FixedLenFeature, Ragged, RawBytesFeature, Schema, as_schema
from sparkgrad.errors import InvalidArgumentError, SchemaError, SparkgradError, SparkgradIOError
from sparkgrad.nn import metrics as _metrics

PREDICTION_COL = "prediction"
PROBABILITY_COL = "probability"


def _feature_size(spec: Any) -> int | None:
    """Values per record of a fixed-shape feature (None for VarLen)."""
    if isinstance(spec, (FixedLenFeature, RawBytesFeature)):
        shape = (spec.shape,) if isinstance(spec.shape, int) else tuple(spec.shape)
        return math.prod(shape)
    return None


def _input_feature(schema: Schema, model: Any, input_col: str | None, exclude: Sequence[str]) -> str:
    """The schema feature that feeds the model: ``input_col``, or the one feature of the model's input size."""
    width = math.prod(model.input_shape)
    if input_col is not None:
        if input_col not in schema.features:
            raise SchemaError(f"input_col {input_col!r} is not a feature of the schema ({', '.join(schema.features)})")
        spec = schema.features[input_col]
        size = _feature_size(spec)
        if size is None:
            raise SchemaError(
                f"feature {input_col!r} is a VarLenFeature: the model needs {width} values per record "
                "(declare it FixedLenFeature or RawBytesFeature)"
            )
        if size != width:
            raise SchemaError(
                f"feature {input_col!r} has {size} values per record; the model's input_shape "
                f"{tuple(model.input_shape)} needs {width}"
            )
        return input_col
    candidates = [n for n, s in schema.features.items() if n not in exclude and _feature_size(s) is not None]
    if len(candidates) == 1:
        return _input_feature(schema, model, candidates[0], exclude)
    found = [n for n in candidates if _feature_size(schema.features[n]) == width]
    if len(found) != 1:
        what = "no feature" if not found else f"{len(found)} features ({', '.join(found)})"
        raise SchemaError(
            f"{what} of the schema hold {width} values per record, the model's input_shape "
            f"{tuple(model.input_shape)}: name the input with input_col="
        )
    return found[0]


def _subset(schema: Schema, names: Sequence[str]) -> dict:
    missing = [n for n in names if n not in schema.features]
    if missing:
        raise SchemaError(f"column(s) {', '.join(map(repr, missing))} are not features of the schema")
    return {n: schema.features[n] for n in dict.fromkeys(names)}


def _file_frame(spark: Any, files: list[str], files_per_task: int) -> Any:
    if files_per_task < 1:
        raise InvalidArgumentError(f"files_per_task must be at least 1, not {files_per_task}")
    return spark.range(0, len(files), 1, numPartitions=-(-len(files) // files_per_task))


def _check_files(files: list[str]) -> None:
    """Refuses, before any job, files the driver can see are missing (executors check again as they read)."""
    import os

    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        raise SparkgradIOError(f"TFRecord file {missing[0]!r} does not exist ({len(missing)} missing)", path=missing[0])


@dataclass(frozen=True)
class _Reader:
    """Reads the files of one task, batch by batch, naming the file in every error."""

    files: tuple[str, ...]
    features: Mapping[str, Any]
    batch_size: int
    compression: str | None

    def batches(self, ids: Iterator[Any]) -> Iterator[tuple[str, dict]]:
        from sparkgrad.data.dataset import TFRecordDataset

        for arrow_batch in ids:
            for i in arrow_batch.column(0).to_pylist():
                path = self.files[i]
                try:
                    ds = TFRecordDataset([path], self.features, self.batch_size, compression=self.compression)
                    for batch in ds:
                        yield path, batch
                except SparkgradError as e:
                    if path in str(e):
                        raise
                    raise type(e)(f"{path}: {e}", **{**e.details, "path": path}) from None


def _inputs(path: str, name: str, batch: dict, model: Any) -> np.ndarray:
    x = np.asarray(batch[name])
    width = math.prod(model.input_shape)
    if x.ndim == 0 or x.size != x.shape[0] * width:
        raise SchemaError(f"{path}: feature {name!r} has shape {x.shape[1:]}, the model needs {width} values")
    return x


def _flat_array(values: np.ndarray) -> Any:
    """A 1-D array of numbers or bytes (object dtype, as the parser returns bytes features) -> Arrow."""
    import pyarrow as pa

    if values.dtype == object:
        return pa.array(list(values), pa.binary())
    if values.dtype == np.uint8:
        values = values.astype(np.int32)  # Spark has no unsigned byte: IntegerType (data.spark.spark_schema)
    return pa.array(values)


def _arrow_column(values: Any) -> Any:
    """A parsed feature's batch values -> the Arrow array of its spark_schema column (lists for shapes)."""
    import pyarrow as pa

    if isinstance(values, Ragged):
        splits = pa.array(np.asarray(values.row_splits, np.int32))
        flat = values.values  # a list for bytes features
        return pa.ListArray.from_arrays(
            splits, _flat_array(np.array(flat, dtype=object) if isinstance(flat, list) else flat)
        )
    values = np.asarray(values)
    if values.ndim == 1:
        return _flat_array(values)
    rows = values.shape[0]
    flat = values.reshape(rows, -1)
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * flat.shape[1])
    return pa.ListArray.from_arrays(offsets, _flat_array(flat.reshape(-1)))


@dataclass(frozen=True)
class _Predict:
    reader: _Reader
    shipped: Any
    input_col: str
    keep: tuple[str, ...]
    probability: bool

    def __call__(self, ids: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        model = self.shipped.load()
        for path, batch in self.reader.batches(ids):
            probs = model.predict(_inputs(path, self.input_col, batch, model), batch_size=self.reader.batch_size)
            probs = np.ascontiguousarray(probs, np.float32)
            cols = {PREDICTION_COL: pa.array(np.argmax(probs, axis=1).astype(np.float64))}
            if self.probability:
                k = probs.shape[1]
                offsets = pa.array(np.arange(probs.shape[0] + 1, dtype=np.int32) * k)
                cols[PROBABILITY_COL] = pa.ListArray.from_arrays(offsets, pa.array(probs.reshape(-1)))
            for name in self.keep:
                cols[name] = _arrow_column(batch[name])
            yield pa.RecordBatch.from_pydict(cols)


@dataclass(frozen=True)
class _Evaluate:
    reader: _Reader
    shipped: Any
    input_col: str
    label_col: str

    def __call__(self, ids: Iterator[Any]) -> Iterator[Any]:
        model = self.shipped.load()
        loss_sum, seen, state = 0.0, 0, model.new_metric_state()
        for path, batch in self.reader.batches(ids):
            x = _inputs(path, self.input_col, batch, model)
            y = np.asarray(batch[self.label_col])
            try:
                r = model._evaluate_arrays(x, y, max(len(x), 1), state)
            except (InvalidArgumentError, ValueError) as e:
                raise InvalidArgumentError(f"{path}: label {self.label_col!r}: {e}", path=path) from None
            loss_sum, seen = loss_sum + float(r[0]), seen + int(r[1])
        yield _metrics.evaluation_batch(loss_sum, seen, state)


def _prepare(paths: Any, model: Any, schema: Schema | Mapping, batch_size: int, check_paths: bool):
    """(model, schema, files), checked on the driver before any job."""
    from sparkgrad.data.dataset import expand_paths

    if isinstance(model, (bytes, bytearray, memoryview)):
        from sparkgrad.nn.saved import model_from_bytes

        model = model_from_bytes(model)
    if batch_size < 1:
        raise InvalidArgumentError(f"batch_size must be at least 1, not {batch_size}")
    files = expand_paths(paths)
    if check_paths:
        _check_files(files)
    return model, as_schema(schema), files


def predict_tfrecords(
    spark: Any,
    paths: Any,
    model: Any,
    schema: Schema | Mapping,
    *,
    input_col: str | None = None,
    keep: Sequence[str] = (),
    probability: bool = True,
    batch_size: int = 1024,
    compression: str | None = None,
    files_per_task: int = 1,
    shared_dir: str | None = None,
    check_paths: bool = True,
) -> Any:
    """A DataFrame of the model's predictions for every record of the TFRecord files ``paths``.

    The files are read in Spark tasks by sparkgrad's C reader and scored there; the driver touches no
    row. Only the features the job needs are parsed (the model's input and the ``keep`` columns).

    ```python
    preds = predict_tfrecords(spark, "/dbfs/mnist/test", model, schema, keep=["label"])
    ```

    Args:
        spark: A SparkSession (classic or Spark Connect).
        paths: A file, directory, glob or list of them, readable by every executor.
        model: A sparkgrad.nn model or its saved-model bytes (`sparkgrad.nn.model_to_bytes`).
        schema: The parsing schema (a `sparkgrad.data.Schema` or a dict of features).
        input_col: The feature fed to the model (default: the one feature whose size is the model's
            input size).
        keep: Schema features passed through as columns (ids, labels).
        probability: Also output ``probability`` (the model's outputs, array<float>).
        batch_size: Records per batch read and scored.
        compression: None, ``"ZLIB"`` or ``"GZIP"``, as the files were written.
        files_per_task: Files each Spark task reads.
        shared_dir: Where a large model goes over Spark Connect (see `ShippedModel`).
        check_paths: Refuse, before any job, files the driver sees missing.

    Returns:
        A lazy DataFrame with the columns ``prediction`` (double, the argmax, as Spark ML's classifiers
        write it), ``probability`` and the ``keep`` features (types as `sparkgrad.data.spark_schema`
        gives them). The model ships when it is first computed, and with each job that recomputes it.

    Raises:
        InvalidArgumentError: ``batch_size < 1``, missing files, or a ``keep`` name that is an output column.
        SchemaError: ``input_col`` is not in the schema or does not match the model's input size, or
            no single feature does.
    """
    from pyspark.sql import types as T

    from sparkgrad.data.spark import spark_schema
    from sparkgrad.spark.shipping import ShippedModel

    model, schema, files = _prepare(paths, model, schema, batch_size, check_paths)
    keep = tuple(keep)
    for name in (PREDICTION_COL, PROBABILITY_COL):
        if name in keep:
            raise InvalidArgumentError(f"keep: {name!r} is the name of an output column")
    name = _input_feature(schema, model, input_col, keep)
    features = _subset(schema, [name, *keep])
    out = [T.StructField(PREDICTION_COL, T.DoubleType(), nullable=False)]
    if probability:
        out.append(T.StructField(PROBABILITY_COL, T.ArrayType(T.FloatType(), containsNull=False), nullable=False))
    if keep:
        out += list(spark_schema({k: features[k] for k in keep}).fields)
    reader = _Reader(tuple(files), features, int(batch_size), compression)
    fn = _Predict(reader, ShippedModel(spark, model, shared_dir=shared_dir), name, keep, bool(probability))
    return _file_frame(spark, files, files_per_task).mapInArrow(fn, T.StructType(out))


def evaluate_tfrecords(
    spark: Any,
    paths: Any,
    model: Any,
    schema: Schema | Mapping,
    *,
    input_col: str | None = None,
    label_col: str = "label",
    loss: str | None = None,
    batch_size: int = 1024,
    compression: str | None = None,
    files_per_task: int = 1,
    shared_dir: str | None = None,
    check_paths: bool = True,
) -> dict:
    """Loss and accuracy of the model over every record of the TFRecord files ``paths``, computed in Spark tasks.

    Each task sums the loss, the correct predictions and the records over its files; Spark adds the
    sums, and the driver receives one row.

    ```python
    stats = evaluate_tfrecords(spark, "/dbfs/mnist/test", model, schema)  # {"loss", "accuracy", "count"}
    ```

    Args:
        spark: A SparkSession (classic or Spark Connect).
        paths: A file, directory, glob or list of them, readable by every executor.
        model: A sparkgrad.nn model or its saved-model bytes.
        schema: The parsing schema (a `sparkgrad.data.Schema` or a dict of features).
        input_col: The feature fed to the model (default: the one feature of the model's input size).
        label_col: The feature holding the labels.
        loss: Compiles the model with this loss; needed when the model carries none (a saved model
            keeps the loss it was compiled with).
        batch_size: Records per batch read and scored.
        compression: None, ``"ZLIB"`` or ``"GZIP"``.
        files_per_task: Files each Spark task reads.
        shared_dir: Where a large model goes over Spark Connect (see `ShippedModel`).
        check_paths: Refuse, before any job, files the driver sees missing.

    Returns:
        ``{"loss": mean loss, "accuracy": fraction correct, "count": records}``.

    Raises:
        InvalidArgumentError: No loss to compute, missing files, or files without records.
        SchemaError: The input or label feature does not fit the schema or the model.
    """
    from sparkgrad.spark.shipping import ShippedModel

    model, schema, files = _prepare(paths, model, schema, batch_size, check_paths)
    if loss is not None or model.loss is None:
        if loss is None:
            raise InvalidArgumentError("evaluate_tfrecords: the model has no loss: pass loss= or compile it")
        model.compile(optimizer="sgd", loss=loss, metrics=["accuracy"])
    name = _input_feature(schema, model, input_col, [label_col])
    features = _subset(schema, [name, label_col])
    shipped = ShippedModel(spark, model, shared_dir=shared_dir)
    try:
        reader = _Reader(tuple(files), features, int(batch_size), compression)
        sums = _file_frame(spark, files, files_per_task).mapInArrow(
            _Evaluate(reader, shipped, name, label_col), _metrics.EVALUATION_SCHEMA
        )
        rows = sums.collect()  # one row per task: the metrics' states add up on the driver
    finally:
        shipped.release()
    loss_sum, count, values = _metrics.sum_evaluations(rows, model.metrics)
    if count == 0:
        raise InvalidArgumentError(f"evaluate_tfrecords: the {len(files)} file(s) hold no records")
    return {"loss": loss_sum / count, **values, "count": count}
