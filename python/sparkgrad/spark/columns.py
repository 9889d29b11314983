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
- ``vector_array`` / ``list_array`` build the Arrow form of the output
  columns (a Spark ML dense vector, an array of floats) from NumPy without a
  Python object per row.

pyspark is imported only inside the functions that need its types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkgrad.errors import InvalidArgumentError

SPARSE_LOSS = "sparse_categorical_crossentropy"
ONEHOT_LOSS = "categorical_crossentropy"


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
    field = _field(schema, label, "label")
    kind = _kind(field.dataType)
    if loss == ONEHOT_LOSS:
        if kind not in ("vector", "array"):
            raise InvalidArgumentError(
                f"label column {label!r} has type {kind}: {ONEHOT_LOSS} takes one-hot labels of {classes} values "
                "(a vector or an array of numbers)",
                column=label,
            )
    elif kind != "number":
        raise InvalidArgumentError(
            f"label column {label!r} has type {kind}: {SPARSE_LOSS} takes class indices, integers (or integral "
            f"doubles, as StringIndexer writes) in [0, {classes}); index string labels first (StringIndexer)",
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
        assert self.label is not None
        y = cols[self.label]
        where = f"partition {partition}, " if partition is not None else ""
        if self.loss == ONEHOT_LOSS:
            y = y.reshape(len(y), -1)
            if y.shape[1] != self.classes:
                raise InvalidArgumentError(
                    f"{where}label column {self.label!r} holds {y.shape[1]} values per row; {ONEHOT_LOSS} takes "
                    f"one-hot labels of {self.classes} (the model's outputs)",
                    column=self.label,
                    partition=partition,
                )
            return np.ascontiguousarray(y, np.float32)
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


def list_array(values: np.ndarray) -> Any:
    """float32[rows, k] -> an Arrow list<float> array (Spark's array<float>)."""
    import pyarrow as pa

    rows, k = values.shape
    flat = pa.array(np.ascontiguousarray(values, np.float32).reshape(-1))
    return pa.ListArray.from_arrays(pa.array(np.arange(rows + 1, dtype=np.int32) * k), flat)


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
