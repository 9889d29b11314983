"""DataFrame columns <-> the model's input and outputs, for sparkgrad.spark's Estimator and Model.

Shared by training (the feeding tasks' ``prepare`` step of cluster.train),
scoring (Model.transform's mapInArrow function) and evaluation:

- ``check_schema`` refuses, on the driver and before any job, a feature or
  label column that is missing or of a type that cannot be fed, and a vector
  or array whose size the schema tells (a VectorAssembler's ML attributes,
  a number column) and that differs from the model's input;
- ``FeatureSpec`` turns a frame of Arrow-fed columns (cluster/arrow_feed.py)
  into the model's ``x`` (the feature columns flattened and concatenated in
  order) and ``y``, raising on a row width the model does not take and on a
  label out of range for the loss, naming the column, the partition and the
  row;
- ``resolve_loss`` and ``task_of`` say which loss a stage uses and what the
  model's outputs are (classes, binary probabilities or values), which
  decides the label a loss takes and the columns ``transform`` writes;
- ``vector_array`` / ``list_array`` / ``double_array`` build the Arrow form
  of the output columns (a Spark ML dense vector, an array of floats, a
  double or an array of doubles) from NumPy without a Python object per row.

pyspark is imported only inside the functions that need its types.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkgrad.errors import InvalidArgumentError

SPARSE_LOSS = "sparse_categorical_crossentropy"
ONEHOT_LOSS = "categorical_crossentropy"
BINARY_LOSS = "binary_crossentropy"
LOGIT_EPS = 1e-7  # a probability is clipped to [eps, 1 - eps] before its logit: |logit| <= 16.1


class Task(enum.Enum):
    """What a model's outputs are, by its loss: it decides the label column a loss takes and the columns
    ``Model.transform`` writes."""

    CLASSES = "classes"  # sparse or categorical cross-entropy: one class of the outputs (softmax)
    BINARY = "binary"  # binary cross-entropy: each output the probability of a positive
    REGRESSION = "regression"  # mse, mae, huber, poisson: the outputs are the predicted values


def task_of(loss: str) -> Task:
    """The `Task` of a loss function name (a `sparkgrad.nn.losses.Loss`'s ``fn``)."""
    if loss in (SPARSE_LOSS, ONEHOT_LOSS):
        return Task.CLASSES
    return Task.BINARY if loss == BINARY_LOSS else Task.REGRESSION


def output_kind(model: Any, loss: Any) -> tuple[Task, bool]:
    """``(task, probabilities)`` of ``model`` under ``loss`` (a `sparkgrad.nn.losses.Loss`).

    ``probabilities``: ``model.predict`` gives probabilities (a softmax or sigmoid head, or a linear
    layer a binary cross-entropy without ``from_logits`` reads as probabilities, as Keras does), not
    logits (a linear last layer under a categorical loss or ``BinaryCrossentropy(from_logits=True)``).
    """
    task = task_of(loss.fn)
    logits = model.head == "linear" and (task is not Task.BINARY or bool(getattr(loss, "from_logits", False)))
    return task, not logits


def resolve_loss(name: str | None, model: Any, what: str) -> Any:
    """The `sparkgrad.nn.losses.Loss` a stage trains or evaluates ``model`` with.

    ``name`` (a loss param: any name `sparkgrad.nn.losses.get` takes) when set, else the loss the model
    was compiled with, else ``binary_crossentropy`` for a sigmoid head and
    ``sparse_categorical_crossentropy`` otherwise. When the model was compiled with the same loss
    function, its own object is returned, so its arguments (``from_logits``, ``delta``, ...) hold.

    Raises:
        InvalidArgumentError: ``name`` is not a loss name; the message starts with ``what``.
    """
    from sparkgrad.nn import losses
    from sparkgrad.nn.model import LOSSES

    compiled = getattr(model, "loss_object", None)
    if name is None:
        if compiled is not None:
            return compiled
        name = BINARY_LOSS if model.head == "sigmoid" else SPARSE_LOSS
    try:
        loss = losses.get(name)
    except ValueError:
        raise InvalidArgumentError(
            f"{what}: loss must be one of {', '.join(map(repr, LOSSES))} (or 'mse', 'mae', 'huber_loss'), not {name!r}"
        ) from None
    return compiled if compiled is not None and compiled.fn == loss.fn else loss


def _kind(dt: Any) -> str:
    """'vector', 'array', 'binary', 'number', 'bool' or the type's simple string."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    if isinstance(dt, VectorUDT):
        return "vector"
    if isinstance(dt, T.ArrayType):
        inner = dt.elementType
        while isinstance(inner, T.ArrayType):
            inner = inner.elementType
        return "array" if isinstance(inner, (T.NumericType, T.BooleanType)) else dt.simpleString()
    if isinstance(dt, T.BinaryType):
        return "binary"
    if isinstance(dt, T.NumericType) and not isinstance(dt, T.DecimalType):
        return "number"
    if isinstance(dt, T.BooleanType):
        return "bool"
    return dt.simpleString()


def _known_width(field: Any, kind: str) -> int | None:
    """How many values a row of the column holds, when the schema tells."""
    if kind in ("number", "bool"):
        return 1
    if kind == "vector":
        attrs = (field.metadata or {}).get("ml_attr") or {}
        if "num_attrs" in attrs:
            return int(attrs["num_attrs"])
        groups = attrs.get("attrs") or {}
        n = sum(len(v) for v in groups.values()) if isinstance(groups, dict) else 0
        return n or None
    return None


def _field(schema: Any, name: str, role: str) -> Any:
    if name not in schema.names:
        raise InvalidArgumentError(
            f"{role} column {name!r} is not in the DataFrame (its columns: {', '.join(map(repr, schema.names))})",
            column=name,
        )
    return schema[name]


def check_schema(
    schema: Any,
    features: tuple[str, ...],
    width: int,
    input_shape: tuple[int, ...],
    label: str | None = None,
    loss: str = SPARSE_LOSS,
    classes: int = 0,
) -> None:
    """Refuses what the schema alone shows cannot train or score (see the module doc)."""
    known = 0
    all_known = True
    for name in features:
        field = _field(schema, name, "feature")
        kind = _kind(field.dataType)
        if kind not in ("vector", "array", "binary", "number", "bool"):
            raise InvalidArgumentError(
                f"feature column {name!r} has type {kind}: features must be Spark ML vectors, arrays of numbers, "
                "binary values of one length per row (e.g. raw pixels) or numbers",
                column=name,
            )
        w = _known_width(field, kind)
        if w is None:
            all_known = False
        else:
            known += w
        if len(features) == 1 and w is not None and w != width:
            raise InvalidArgumentError(
                f"feature column {name!r} holds {kind}s of {w} values (its schema says); the model takes {width} "
                f"values per row (input_shape {tuple(input_shape)})",
                column=name,
            )
    if all_known and known != width:
        raise InvalidArgumentError(
            f"feature columns {', '.join(map(repr, features))} hold {known} values per row (their schema says); "
            f"the model takes {width} (input_shape {tuple(input_shape)})",
            column=features[0],
        )
    if label is None:
        return
    _check_label(_field(schema, label, "label"), label, loss, classes)


def _dense_targets(loss: str, outputs: int) -> str:
    """What a label column holds for a loss other than the sparse cross-entropy, in error messages."""
    if loss == ONEHOT_LOSS:
        return f"one-hot labels of {outputs} values (a vector or an array of numbers)"
    values = "numbers in [0, 1]" if loss == BINARY_LOSS else "numbers"
    if outputs == 1:
        scalars = "numbers (or booleans) in [0, 1]" if loss == BINARY_LOSS else "numbers"
        return f"{scalars}, one per row (the model has one output)"
    return f"arrays or vectors of {outputs} {values}, one per row (the model has {outputs} outputs)"


def _check_label(field: Any, label: str, loss: str, classes: int) -> None:
    kind = _kind(field.dataType)
    if loss == SPARSE_LOSS:
        if kind != "number":
            raise InvalidArgumentError(
                f"label column {label!r} has type {kind}: {SPARSE_LOSS} takes class indices, integers (or integral "
                f"doubles, as StringIndexer writes) in [0, {classes}); index string labels first (StringIndexer)",
                column=label,
            )
        return
    if loss == ONEHOT_LOSS:
        if kind not in ("vector", "array"):
            raise InvalidArgumentError(
                f"label column {label!r} has type {kind}: {ONEHOT_LOSS} takes {_dense_targets(loss, classes)}",
                column=label,
            )
        return
    scalars = ("number", "bool") if loss == BINARY_LOSS else ("number",)
    if kind not in ("vector", "array") and not (classes == 1 and kind in scalars):
        raise InvalidArgumentError(
            f"label column {label!r} has type {field.dataType.simpleString()}: {loss} takes "
            f"{_dense_targets(loss, classes)}",
            column=label,
        )
    width = _known_width(field, kind)
    if width is not None and width != classes:
        raise InvalidArgumentError(
            f"label column {label!r} holds {kind}s of {width} values (its schema says): {loss} takes "
            f"{_dense_targets(loss, classes)}",
            column=label,
        )


@dataclass(frozen=True)
class FeatureSpec:
    """Which columns make the model's x (and y), and what they must hold; picklable into Spark tasks.

    As ``prepare`` of cluster.train it is called ``spec(columns, partition,
    first_row)`` in the feeding task and returns {"x": ..., "y": ...}.
    """

    features: tuple[str, ...]
    width: int
    input_shape: tuple[int, ...]
    label: str | None = None
    loss: str = SPARSE_LOSS
    classes: int = 0

    def x(self, cols: dict[str, np.ndarray], partition: int | None, first_row: int) -> np.ndarray:
        if not len(cols[self.features[0]]):  # an empty batch: no row to tell a width from
            return np.zeros((0, self.width), np.float32)
        parts = []
        for name in self.features:
            a = cols[name]
            parts.append(a.reshape(len(a), -1))
        n = len(parts[0]) if parts else 0
        got = sum(p.shape[1] for p in parts)
        if got != self.width:
            where = f"partition {partition}, " if partition is not None else ""
            what = (
                f"column {self.features[0]!r} holds {parts[0].shape[1]} values per row"
                if len(parts) == 1
                else f"columns {', '.join(map(repr, self.features))} hold {got} values per row together"
            )
            raise InvalidArgumentError(
                f"{where}rows {first_row}..{first_row + n - 1}: {what}; the model takes {self.width} "
                f"(input_shape {self.input_shape})",
                column=self.features[0],
                partition=partition,
            )
        if len(parts) == 1:
            return np.ascontiguousarray(parts[0])
        return np.concatenate([p.astype(np.float32, copy=False) for p in parts], axis=1)

    def y(self, cols: dict[str, np.ndarray], partition: int | None, first_row: int) -> np.ndarray:
        """The labels: int64 ``[rows]`` class indices for the sparse cross-entropy, else float32
        ``[rows, classes]`` targets (one-hot, in [0, 1] for the binary cross-entropy, finite values for
        a regression)."""
        assert self.label is not None
        y = cols[self.label]
        where = f"partition {partition}, " if partition is not None else ""
        if self.loss != SPARSE_LOSS:
            return self._dense_y(y.reshape(len(y), -1), where, partition, first_row)
        y = y.reshape(len(y))
        bad = (y < 0) | (y >= self.classes)
        if y.dtype.kind == "f":
            bad |= y != np.floor(y)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            value = y[i].item()
            raise InvalidArgumentError(
                f"{where}row {first_row + i}: label column {self.label!r} holds {value!r}; {SPARSE_LOSS} takes "
                f"integer class indices in [0, {self.classes}) (the model has {self.classes} outputs)",
                column=self.label,
                partition=partition,
            )
        return y.astype(np.int64, copy=False)

    def _dense_y(self, y: np.ndarray, where: str, partition: int | None, first_row: int) -> np.ndarray:
        if y.shape[1] != self.classes:
            what = "one-hot labels" if self.loss == ONEHOT_LOSS else "targets"
            raise InvalidArgumentError(
                f"{where}label column {self.label!r} holds {y.shape[1]} values per row; {self.loss} takes "
                f"{what} of {self.classes} (the model's outputs)",
                column=self.label,
                partition=partition,
            )
        y = np.ascontiguousarray(y, np.float32)
        if self.loss == ONEHOT_LOSS:
            return y
        binary = self.loss == BINARY_LOSS
        bad = ~((y >= 0) & (y <= 1)) if binary else ~np.isfinite(y)  # NaN fails both
        rows = np.flatnonzero(bad.any(axis=1))
        if rows.size:
            i = int(rows[0])
            value = y[i, 0].item() if self.classes == 1 else y[i].tolist()
            wanted = "values in [0, 1]" if binary else "finite values"
            raise InvalidArgumentError(
                f"{where}row {first_row + i}: label column {self.label!r} holds {value!r}; {self.loss} takes {wanted}",
                column=self.label,
                partition=partition,
            )
        return y

    def __call__(self, cols: dict[str, np.ndarray], partition: int, first_row: int) -> dict[str, np.ndarray]:
        out = {"x": self.x(cols, partition, first_row)}
        if self.label is not None:
            out["y"] = self.y(cols, partition, first_row)
        return out

    @property
    def columns(self) -> tuple[str, ...]:
        return self.features + ((self.label,) if self.label is not None and self.label not in self.features else ())


def vector_array(values: np.ndarray) -> Any:
    """float[rows, k] -> the Arrow struct of dense Spark ML vectors (VectorUDT's SQL type)."""
    import pyarrow as pa

    rows, k = values.shape
    flat = pa.array(np.ascontiguousarray(values, np.float64).reshape(-1))
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * k)
    kinds = pa.array(np.ones(rows, np.int8))
    sizes = pa.nulls(rows, pa.int32())
    indices = pa.nulls(rows, pa.list_(pa.field("element", pa.int32(), nullable=False)))
    vals = pa.ListArray.from_arrays(offsets, flat, type=pa.list_(pa.field("element", pa.float64(), nullable=False)))
    fields = [
        pa.field("type", pa.int8(), nullable=False),
        pa.field("size", pa.int32()),
        pa.field("indices", indices.type),
        pa.field("values", vals.type),
    ]
    return pa.StructArray.from_arrays([kinds, sizes, indices, vals], fields=fields)


def list_array(values: np.ndarray, dtype: Any = np.float32) -> Any:
    """float[rows, k] -> an Arrow list array of ``dtype`` (Spark's array<float>, or array<double>)."""
    import pyarrow as pa

    rows, k = values.shape
    flat = pa.array(np.ascontiguousarray(values, dtype).reshape(-1))
    return pa.ListArray.from_arrays(pa.array(np.arange(rows + 1, dtype=np.int32) * k), flat)


def double_array(values: np.ndarray) -> Any:
    """float[rows, k] -> Arrow doubles for k == 1 (Spark's double), else a list<double> array (array<double>)."""
    import pyarrow as pa

    if values.shape[1] == 1:
        return pa.array(np.ascontiguousarray(values[:, 0], np.float64))
    return list_array(values, np.float64)


def binary_scores(out: np.ndarray, probabilities: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(p, z)``, float64 ``[rows, k]``: the probabilities and logits of a binary model's outputs.

    ``probabilities``: the outputs are probabilities (a sigmoid head; they are clipped to [0, 1]) and
    ``z = log(p / (1 - p))`` of p clipped to ``[LOGIT_EPS, 1 - LOGIT_EPS]``: float32 probabilities lose
    the logit's precision beyond about |z| = 16, where it saturates. Otherwise they are logits
    (``BinaryCrossentropy(from_logits=True)`` on a linear last layer) and ``p = sigmoid(z)``.
    """
    o = out.astype(np.float64)
    if not probabilities:
        return np.exp(-np.logaddexp(0.0, -o)), o
    c = np.clip(o, LOGIT_EPS, 1.0 - LOGIT_EPS)
    return np.clip(o, 0.0, 1.0), np.log(c) - np.log1p(-c)


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def feature_columns(features_col: str | None, input_cols: Any, input_mapping: Any, what: str) -> tuple[str, ...]:
    """The feature columns from featuresCol, inputCols or input_mapping ({column: "x"}), in that precedence."""
    if input_mapping:
        if not isinstance(input_mapping, dict):
            raise InvalidArgumentError(f"{what}: input_mapping must be a dict {{column: 'x' | 'y'}}")
        bad = {c: r for c, r in input_mapping.items() if r not in ("x", "y")}
        if bad:
            raise InvalidArgumentError(
                f"{what}: input_mapping maps columns to 'x' (features) or 'y' (the label), not {bad}"
            )
        xs = tuple(c for c, r in input_mapping.items() if r == "x")
        if not xs:
            raise InvalidArgumentError(f"{what}: input_mapping {input_mapping} maps no column to 'x'")
        return xs
    if input_cols:
        return tuple(str(c) for c in input_cols)
    if not features_col:
        raise InvalidArgumentError(f"{what}: set featuresCol, inputCols or input_mapping")
    return (str(features_col),)


def mapped_label(input_mapping: Any, label_col: str | None) -> str | None:
    if input_mapping:
        ys = [c for c, r in input_mapping.items() if r == "y"]
        if len(ys) > 1:
            raise InvalidArgumentError(f"input_mapping {input_mapping} maps more than one column to 'y'")
        if ys:
            return ys[0]
    return label_col
