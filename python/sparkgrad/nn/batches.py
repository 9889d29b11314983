"""Batches at the boundary of the C engine (a leaf module): which keys of a
dict batch hold x and y, and the arrays handed to ``_core.Model``.

The engine takes float32, uint8, int32 or int64 inputs (integers: ids, made
float32 values in C, exact below 2^24) and int32 or int64 labels as they
are (no copy when they are C-contiguous); scaling and standardisation happen
in C as rows are gathered (``Sequential.set_input_transform``). Other dtypes
are converted here, once: inputs to float32, integer labels to int64.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from sparkgrad.errors import InvalidArgumentError

ENGINE_INPUT_DTYPES = (np.dtype(np.float32), np.dtype(np.uint8), np.dtype(np.int32), np.dtype(np.int64))
ENGINE_LABEL_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def keys(input_mapping: Mapping[str, str] | None, x_key: str, y_key: str) -> tuple[str, str]:
    """(x_key, y_key) from a TFoS-style mapping {dataset key: "x" | "y"}."""
    if input_mapping is None:
        return x_key, y_key
    roles = {role: key for key, role in input_mapping.items()}
    if set(roles) != {"x", "y"} or len(input_mapping) != 2:
        raise InvalidArgumentError(f"input_mapping must map one key to 'x' and one to 'y', not {dict(input_mapping)}")
    return roles["x"], roles["y"]


def batch_arrays(batch: object, x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of one dataset batch: a dict of arrays or an (x, y) pair (see `batch_parts` for weights)."""
    return batch_parts(batch, x_key, y_key)[:2]


def batch_parts(batch: object, x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(x, y, sample_weight) of one dataset batch: a dict of arrays (``"sample_weight"``: optional; without
    ``x_key``, every key but ``y_key`` and ``"sample_weight"`` is an input by name) or an
    (x, y) pair or (x, y, sample_weight) triple, as Keras takes them (x and y may be lists or dicts of
    arrays, for a model of several inputs or outputs)."""
    if isinstance(batch, Mapping):
        sw = batch.get("sample_weight")
        sw = None if sw is None else np.asarray(sw)
        if x_key not in batch and y_key in batch and len(batch) > 1 + (sw is not None):
            # a flat batch {input name: values, ..., y_key: labels} (ParquetDataset's): the inputs by name
            x = {k: v for k, v in batch.items() if k not in (y_key, "sample_weight")}
            return x, np.asarray(batch[y_key]), sw
        missing = [k for k in (x_key, y_key) if k not in batch]
        if missing:
            raise InvalidArgumentError(f"dataset batch has keys {sorted(batch)}; missing {missing} (set x_key=/y_key=)")
        x = batch[x_key]
        return x if isinstance(x, Mapping) else np.asarray(x), np.asarray(batch[y_key]), sw
    if isinstance(batch, tuple) and len(batch) in (2, 3):
        sw = batch[2] if len(batch) == 3 else None
        return _arrays(batch[0]), _arrays(batch[1]), None if sw is None else np.asarray(sw)
    raise InvalidArgumentError(
        f"dataset batches must be dicts of arrays or (x, y) / (x, y, sample_weight) tuples, not {type(batch).__name__}"
    )


def _arrays(v: object) -> object:
    """An array, or a list or dict of them (a functional model's inputs or outputs) as they are."""
    if isinstance(v, (list, Mapping)):
        return v
    return np.asarray(v)


def inputs(x: object, input_shape: Sequence[int], name: str | None = None) -> np.ndarray:
    """x as [n, row] for the engine: float32, uint8, int32 and int64 as they are (a view when
    contiguous), any other numeric dtype converted to float32. Strings are refused (they go
    through a StringLookup or Hashing layer on the Input)."""
    x = np.asarray(x)
    if x.dtype.kind in "US" or (x.dtype.kind == "O" and x.size and isinstance(x.flat[0], (str, bytes))):
        what = f"input {name!r}" if name else "the input"
        raise InvalidArgumentError(
            f"{what} takes numbers, but a string column ({x.dtype}) was given: put a StringLookup or Hashing "
            "layer on an Input(dtype='string')"
        )
    if x.dtype not in ENGINE_INPUT_DTYPES:
        x = x.astype(np.float32)
    x = np.ascontiguousarray(x)
    row = int(np.prod(input_shape))
    if x.ndim == 0 or x.size != x.shape[0] * row:
        raise InvalidArgumentError(f"x of shape {x.shape} does not hold rows of input_shape {tuple(input_shape)}")
    return x.reshape(x.shape[0], row)


def targets(y: object, n: int, outputs: int, loss: object) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(labels, None)`` for a sparse loss (int32/int64 as they are) or ``(None, targets)``: float32
    ``[n, outputs]`` for the others (``(n,)`` taken as ``(n, 1)`` for one output).

    ``loss`` is a `sparkgrad.nn.losses.Loss`, or its function name.
    """
    y = np.asarray(y)
    if y.ndim == 0 or y.shape[0] != n:
        raise InvalidArgumentError(f"x has {n} rows but y has {y.shape[0] if y.ndim else 'no'} rows")
    name = getattr(loss, "fn", loss) or "sparse_categorical_crossentropy"
    sparse = getattr(loss, "sparse", name == "sparse_categorical_crossentropy")
    if not sparse:
        if y.dtype == object or not (np.issubdtype(y.dtype, np.number) or y.dtype == np.bool_):
            raise InvalidArgumentError(f"{name} needs numeric targets, not {y.dtype}")
        if y.ndim == 1 and outputs == 1:
            y = y.reshape(n, 1)
        if y.ndim != 2 or y.shape[1] != outputs:
            hint = (
                " (one-hot targets; for integer labels use sparse_categorical_crossentropy)"
                if name == "categorical_crossentropy" and y.ndim == 1
                else ""
            )
            raise InvalidArgumentError(
                f"{name} needs y of shape ({n}, {outputs}) for a model with {outputs} output"
                f"{'s' if outputs != 1 else ''}, not {y.shape}{hint}"
            )
        return None, np.ascontiguousarray(y, dtype=np.float32)
    y = y.reshape(n, -1) if y.ndim > 1 else y.reshape(n, 1)
    if y.shape[1] != 1:
        raise InvalidArgumentError(
            f"sparse_categorical_crossentropy needs integer labels of shape ({n},), not {y.shape} "
            "(one-hot targets: use categorical_crossentropy)"
        )
    labels = y.reshape(n)
    if labels.dtype in ENGINE_LABEL_DTYPES:
        return np.ascontiguousarray(labels), None
    if not np.issubdtype(labels.dtype, np.integer) and not np.all(np.equal(np.mod(labels, 1), 0)):
        raise InvalidArgumentError("sparse labels must be integers")
    return np.ascontiguousarray(labels, dtype=np.int64), None


def weights(
    sample_weight: object,
    class_weight: Mapping[int, float] | None,
    n: int,
    labels: np.ndarray | None,
    dense: np.ndarray | None,
) -> np.ndarray | None:
    """Per-row float32 weights from ``sample_weight`` ``(n,)`` times ``class_weight[class of the row]``
    (the label; for dense targets the largest output's index, or the rounded value for one output), as
    Keras weighs them; None when both are None."""
    w = None
    if sample_weight is not None:
        w = np.asarray(sample_weight, dtype=np.float32).reshape(-1)
        if w.shape[0] != n:
            raise InvalidArgumentError(f"sample_weight has {w.shape[0]} values for {n} rows")
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            bad = int(np.flatnonzero(~np.isfinite(w) | (w < 0))[0])
            raise InvalidArgumentError(f"sample_weight[{bad}] = {w[bad]}: weights must be finite and >= 0")
    if class_weight is not None:
        if not isinstance(class_weight, Mapping):
            kind = type(class_weight).__name__
            raise InvalidArgumentError(f"class_weight must be a dict {{class: weight}}, not {kind}")
        if labels is not None:
            cls = labels.astype(np.int64)
        elif dense.shape[1] == 1:
            cls = np.rint(dense[:, 0]).astype(np.int64)
        else:
            cls = np.argmax(dense, axis=1)
        table = {int(k): float(v) for k, v in class_weight.items()}
        missing = sorted(set(np.unique(cls).tolist()) - set(table))
        if missing:
            raise InvalidArgumentError(f"class_weight has no weight for class {missing[0]} (classes {sorted(table)})")
        lut = np.zeros(max(max(table), int(cls.max(initial=0))) + 1, np.float32)
        for k, v in table.items():
            if k >= 0:
                lut[k] = v
        cw = lut[cls]
        w = cw if w is None else w * cw
    return None if w is None else np.ascontiguousarray(w, dtype=np.float32)
