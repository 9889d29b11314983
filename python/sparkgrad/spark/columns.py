"""DataFrame columns <-> the model's input and outputs, for sparkgrad.spark's Estimator and Model.

Shared by training (each Estimator worker's batches, read from Parquet by
sparkgrad.data.ParquetDataset), scoring (Model.transform's mapInArrow
function) and evaluation:

- ``input_columns`` maps the params (featuresCol, inputCols, input_mapping)
  to the model's inputs: one input takes its columns concatenated; a model
  of several named inputs takes a column per input, by name or mapping;
- ``check_schema`` refuses, on the driver and before any job, a feature or
  label column that is missing or of a type that cannot be fed to its input
  (a string column to a numeric input, a number to a string Input), and a
  vector or array whose size the schema tells (a VectorAssembler's ML
  attributes, a number column) and that differs from its input;
- ``FeatureSpec`` turns a dict of column arrays (a ParquetDataset batch, or
  a scoring task's Arrow columns from cluster/arrow_feed.py) into the model's
  ``x`` (one array, or a dict by input name: numbers, exact integer ids, or a
  `StringColumn` over Arrow's string buffers) and ``y``, raising on a row
  width an input does not take, a fractional id and a label out of range for
  the loss, naming the column, the partition (where there is one) and the row;
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
    """'vector', 'array', 'binary', 'number', 'bool', 'string' or the type's simple string."""
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
    if isinstance(dt, T.StringType):
        return "string"
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


def check_schema(schema: Any, spec: FeatureSpec) -> None:
    """Refuses what the schema alone shows cannot train or score ``spec`` (see the module doc)."""
    for inp in spec.inputs:
        _check_input(schema, inp, len(spec.inputs) > 1)
    if spec.label is not None:
        _check_label(_field(schema, spec.label, "label"), spec.label, spec.loss, spec.classes)


def _check_input(schema: Any, inp: InputColumns, named: bool) -> None:
    known = 0
    all_known = True
    takes = f"input {inp.name!r}" if named else "the model"
    for name in inp.columns:
        field = _field(schema, name, "feature")
        kind = _kind(field.dataType)
        if inp.dtype == "string":
            if kind != "string":
                raise InvalidArgumentError(
                    f"feature column {name!r} has type {field.dataType.simpleString()} but {takes} (Input "
                    f"{inp.name!r}) takes strings (dtype='string'): give it a string column",
                    column=name,
                )
            continue
        if kind == "string":
            raise InvalidArgumentError(
                f"feature column {name!r} holds strings but {takes} (Input {inp.name!r}) takes numbers "
                f"(dtype={inp.dtype!r}): map the strings with a StringLookup or Hashing layer on an "
                "Input(dtype='string'), or index them first (StringIndexer)",
                column=name,
            )
        if kind not in ("vector", "array", "binary", "number", "bool"):
            raise InvalidArgumentError(
                f"feature column {name!r} has type {kind}: features must be Spark ML vectors, arrays of numbers, "
                "binary values of one length per row (e.g. raw pixels), numbers or (for a string Input) strings",
                column=name,
            )
        w = _known_width(field, kind)
        if w is None:
            all_known = False
        else:
            known += w
        if len(inp.columns) == 1 and w is not None and w != inp.width:
            raise InvalidArgumentError(
                f"feature column {name!r} holds {kind}s of {w} values (its schema says); {takes} takes "
                f"{inp.width} values per row (input_shape {inp.shape})",
                column=name,
            )
    if inp.dtype != "string" and all_known and known != inp.width:
        raise InvalidArgumentError(
            f"feature columns {', '.join(map(repr, inp.columns))} hold {known} values per row (their schema "
            f"says); {takes} takes {inp.width} (input_shape {inp.shape})",
            column=inp.columns[0],
        )


def list_widths(schema: Any, spec: FeatureSpec) -> tuple[tuple[str, int], ...]:
    """``(column, values per row)`` of each array column ``spec`` reads: a Parquet file does not record an
    array's length, so a table reader is told it (its input's width, less its other columns' widths when
    the schema tells them; the label's: the model's outputs).

    Raises:
        InvalidArgumentError: An input of several columns with more than one whose width the schema does
            not tell (arrays, binary, vectors without ML attributes), naming them.
    """
    out = []
    for inp in spec.inputs:
        if inp.dtype == "string":
            continue
        kinds = {c: _kind(schema[c].dataType) for c in inp.columns}
        arrays = [c for c in inp.columns if kinds[c] == "array"]
        if not arrays:
            continue
        known = {c: _known_width(schema[c], kinds[c]) for c in inp.columns if c not in arrays}
        unknown = arrays + [c for c, w in known.items() if w is None]
        if len(unknown) > 1:
            raise InvalidArgumentError(
                f"feature columns {', '.join(map(repr, unknown))} of input {inp.name!r} hold arrays or values whose "
                f"length the schema does not tell, so the input's {inp.width} values cannot be split among them: "
                "feed the input from one such column (e.g. concat the arrays first), or give vectors of known size "
                "(VectorAssembler)",
                column=unknown[0],
            )
        out.append((arrays[0], inp.width - sum(w or 0 for w in known.values())))
    if spec.label is not None and spec.loss != SPARSE_LOSS and _kind(schema[spec.label].dataType) == "array":
        out.append((spec.label, spec.classes))
    return tuple(out)


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


def _where(partition: int | None) -> str:
    return f"partition {partition}, " if partition is not None else ""


@dataclass(frozen=True)
class InputColumns:
    """The DataFrame columns that feed one model `Input`, and what that Input takes; picklable."""

    name: str  # the Input's name
    columns: tuple[str, ...]  # flattened and concatenated in order (a string Input: one column)
    dtype: str  # the Input's dtype: "float32", "uint8", "int32", "int64" or "string"
    shape: tuple[int, ...]  # per row, without the batch axis

    @property
    def width(self) -> int:
        return int(np.prod(self.shape))

    def values(self, cols: dict[str, Any], partition: int | None, first_row: int, named: bool) -> Any:
        """The Input's rows from a frame's columns: ``[rows, width]`` numbers, or a `StringColumn`.

        ``named``: the model has several inputs (errors name this one).
        """
        from sparkgrad.nn.preprocessing import StringColumn

        takes = f"input {self.name!r}" if named else "the model"
        for name in self.columns:
            if isinstance(cols[name], StringColumn) != (self.dtype == "string"):
                what = "strings" if self.dtype != "string" else "numbers"
                raise InvalidArgumentError(
                    f"{_where(partition)}column {name!r} holds {what}; {takes} (Input {self.name!r}, dtype "
                    f"{self.dtype!r}) does not take them",
                    column=name,
                    partition=partition,
                )
        if self.dtype == "string":
            return cols[self.columns[0]]
        rows = len(cols[self.columns[0]])
        if not rows:  # an empty batch: no row to tell a width from
            return np.zeros((0, self.width), np.float32 if self.dtype == "float32" else self.dtype)
        parts = [cols[name].reshape(rows, -1) for name in self.columns]
        got = sum(p.shape[1] for p in parts)
        if got != self.width:
            what = (
                f"column {self.columns[0]!r} holds {parts[0].shape[1]} values per row"
                if len(parts) == 1
                else f"columns {', '.join(map(repr, self.columns))} hold {got} values per row together"
            )
            raise InvalidArgumentError(
                f"{_where(partition)}rows {first_row}..{first_row + rows - 1}: {what}; {takes} takes {self.width} "
                f"(input_shape {self.shape})",
                column=self.columns[0],
                partition=partition,
            )
        if self.dtype in ("int32", "int64"):
            return self._ids(parts, partition, first_row, takes)
        if len(parts) == 1:
            return np.ascontiguousarray(parts[0])
        return np.concatenate([p.astype(np.float32, copy=False) for p in parts], axis=1)

    def _ids(self, parts: list[np.ndarray], partition: int | None, first_row: int, takes: str) -> np.ndarray:
        """Integer ids, exact: doubles (as StringIndexer writes them) only when they hold integers in range."""
        info = np.iinfo(self.dtype)
        out = []
        for name, p in zip(self.columns, parts, strict=True):
            if p.dtype.kind == "f":
                bad = ~np.isfinite(p) | (p != np.floor(p)) | (p < info.min) | (p > info.max)
            elif p.dtype.kind in "iu" and p.dtype.itemsize * 8 > info.bits:
                bad = (p < info.min) | (p > info.max)
            else:
                bad = None
            if bad is not None and bad.any():
                r, c = np.argwhere(bad)[0]
                raise InvalidArgumentError(
                    f"{_where(partition)}row {first_row + int(r)}: column {name!r} holds {p[r, c].item()!r}; {takes} "
                    f"(Input {self.name!r}) takes {self.dtype} ids, which are exact integers",
                    column=name,
                    partition=partition,
                )
            out.append(p.astype(self.dtype, copy=False))
        return np.ascontiguousarray(out[0] if len(out) == 1 else np.concatenate(out, axis=1))


@dataclass(frozen=True)
class FeatureSpec:
    """Which columns make the model's x (and y), and what they must hold; picklable into Spark tasks.

    ``x`` is one array for a model of one input, else a dict by input name (a string Input's value a
    `StringColumn`); ``partition`` (None where the rows come from no partition) and ``first_row`` place
    the rows in error messages.
    """

    inputs: tuple[InputColumns, ...]
    label: str | None = None
    loss: str = SPARSE_LOSS
    classes: int = 0

    @property
    def features(self) -> tuple[str, ...]:
        """Every feature column, each once, in the order of the inputs."""
        return tuple(dict.fromkeys(c for inp in self.inputs for c in inp.columns))

    def x(self, cols: dict[str, Any], partition: int | None, first_row: int) -> Any:
        named = len(self.inputs) > 1
        xs = {inp.name: inp.values(cols, partition, first_row, named) for inp in self.inputs}
        return xs if named else xs[self.inputs[0].name]

    def y(self, cols: dict[str, np.ndarray], partition: int | None, first_row: int) -> np.ndarray:
        """The labels: int64 ``[rows]`` class indices for the sparse cross-entropy, else float32
        ``[rows, classes]`` targets (one-hot, in [0, 1] for the binary cross-entropy, finite values for
        a regression)."""
        assert self.label is not None
        y = cols[self.label]
        where = _where(partition)
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


def model_inputs(model: Any) -> list[tuple[str, str, tuple[int, ...]]]:
    """``(name, dtype, per-row shape)`` of each of a sparkgrad.nn model's inputs."""
    return [(t.name, t.dtype, tuple(int(d) for d in t.shape[1:])) for t in model.inputs]


def input_columns(
    model: Any, features_col: str | None, input_cols: Any, input_mapping: Any, what: str
) -> tuple[InputColumns, ...]:
    """Which columns feed which of ``model``'s inputs, from the params.

    One input: the columns of ``input_mapping`` ({column: "x" or the Input's name}), else ``inputCols``,
    else ``featuresCol``, flattened and concatenated in order. Several inputs: ``inputCols`` name the
    inputs (column name == Input name), or ``input_mapping`` maps columns to Input names (several
    columns to one input are concatenated in order). ``"y"`` in ``input_mapping`` is the label.

    Raises:
        InvalidArgumentError: A mapping to neither "y" nor an input, an input with no column, several
            columns for a string input, or no feature column set; the message names them.
    """
    inputs = model_inputs(model)
    names = [n for n, _, _ in inputs]
    if input_mapping is not None and not isinstance(input_mapping, dict):
        raise InvalidArgumentError(f"{what}: input_mapping must be a dict {{column: input name | 'x' | 'y'}}")
    mapping = {str(c): str(r) for c, r in (input_mapping or {}).items() if r != "y"}
    if len(inputs) == 1:
        bad = {c: r for c, r in mapping.items() if r not in ("x", names[0])}
        if bad:
            raise InvalidArgumentError(
                f"{what}: input_mapping maps columns to 'x' (features) or 'y' (the label), or to the model's "
                f"input {names[0]!r}, not {bad}"
            )
        if input_mapping and not mapping:
            raise InvalidArgumentError(f"{what}: input_mapping {input_mapping} maps no column to 'x'")
        cols = tuple(mapping) or tuple(str(c) for c in input_cols or ())
        cols = cols or ((str(features_col),) if features_col else ())
        if not cols:
            raise InvalidArgumentError(f"{what}: set featuresCol, inputCols or input_mapping")
        by_input = {names[0]: cols}
    else:
        if not mapping and not input_cols:
            raise InvalidArgumentError(
                f"{what}: the model has inputs {names}: set inputCols to columns named as the inputs, or "
                "input_mapping={column: input name} where the names differ (featuresCol feeds a model of one input)"
            )
        pairs = list(mapping.items()) if mapping else [(str(c), str(c)) for c in input_cols]
        by_input = {}
        for col, name in pairs:
            if name not in names:
                how = f"input_mapping maps column {col!r} to {name!r}" if mapping else f"inputCols has {col!r}"
                raise InvalidArgumentError(
                    f"{what}: {how}, which is not an input of the model (its inputs: {names}); "
                    + ("map it to one of them" if mapping else "map it to one with input_mapping={column: input}"),
                    column=col,
                )
            by_input[name] = by_input.get(name, ()) + (col,)
        missing = [n for n in names if n not in by_input]
        if missing:
            raise InvalidArgumentError(
                f"{what}: input {missing[0]!r} of the model has no column"
                + (f" (nor {', '.join(map(repr, missing[1:]))})" if len(missing) > 1 else "")
                + ": name a column as the input in inputCols, or map one to it in input_mapping",
                input=missing[0],
            )
    out = []
    for name, dtype, shape in inputs:
        cols = by_input[name]
        if dtype == "string" and (len(cols) != 1 or int(np.prod(shape)) != 1):
            raise InvalidArgumentError(
                f"{what}: input {name!r} takes strings (dtype='string', shape {shape}): it is fed from one string "
                f"column, one value per row, not {', '.join(map(repr, cols))}",
                input=name,
            )
        out.append(InputColumns(name, cols, dtype, shape))
    return tuple(out)


def column_mapping(inputs: tuple[InputColumns, ...]) -> dict[str, str]:
    """``{column: input name}`` of resolved inputs (what the MLflow flavor's pyfunc maps by)."""
    return {c: inp.name for inp in inputs for c in inp.columns}


def mapped_label(input_mapping: Any, label_col: str | None) -> str | None:
    if input_mapping:
        ys = [c for c, r in input_mapping.items() if r == "y"]
        if len(ys) > 1:
            raise InvalidArgumentError(f"input_mapping {input_mapping} maps more than one column to 'y'")
        if ys:
            return ys[0]
    return label_col
