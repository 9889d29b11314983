"""Batches at the boundary of the C engine (a leaf module): which keys of a
dict batch hold x and y, and the arrays handed to ``_core.Model``.

The engine takes float32 or uint8 inputs and int32 or int64 labels as they
are (no copy when they are C-contiguous); scaling and standardisation happen
in C as rows are gathered (``Sequential.set_input_transform``). Other dtypes
are converted here, once: inputs to float32, integer labels to int64.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from sparkgrad.errors import InvalidArgumentError

ENGINE_INPUT_DTYPES = (np.dtype(np.float32), np.dtype(np.uint8))
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
    """(x, y) of one dataset batch: a dict of arrays or an (x, y) pair."""
    if isinstance(batch, Mapping):
        missing = [k for k in (x_key, y_key) if k not in batch]
        if missing:
            raise InvalidArgumentError(f"dataset batch has keys {sorted(batch)}; missing {missing} (set x_key=/y_key=)")
        return np.asarray(batch[x_key]), np.asarray(batch[y_key])
    if isinstance(batch, tuple) and len(batch) == 2:
        return np.asarray(batch[0]), np.asarray(batch[1])
    raise InvalidArgumentError(f"dataset batches must be dicts of arrays or (x, y) pairs, not {type(batch).__name__}")


def inputs(x: object, input_shape: Sequence[int]) -> np.ndarray:
    """x as [n, row] for the engine: float32 and uint8 as they are (a view when
    contiguous), any other dtype converted to float32."""
    x = np.asarray(x)
    if x.dtype not in ENGINE_INPUT_DTYPES:
        x = x.astype(np.float32)
    x = np.ascontiguousarray(x)
    row = int(np.prod(input_shape))
    if x.ndim == 0 or x.size != x.shape[0] * row:
        raise InvalidArgumentError(f"x of shape {x.shape} does not hold rows of input_shape {tuple(input_shape)}")
    return x.reshape(x.shape[0], row)


def targets(y: object, n: int, classes: int, loss: str | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(labels, None) for sparse cross-entropy (int32/int64 as they are) or (None, one-hot float32)."""
    y = np.asarray(y)
    if y.ndim == 0 or y.shape[0] != n:
        raise InvalidArgumentError(f"x has {n} rows but y has {y.shape[0] if y.ndim else 'no'} rows")
    if loss == "categorical_crossentropy":
        if y.ndim != 2 or y.shape[1] != classes:
            raise InvalidArgumentError(
                f"categorical_crossentropy needs one-hot y of shape ({n}, {classes}), not {y.shape}"
            )
        return None, np.ascontiguousarray(y, dtype=np.float32)
    y = y.reshape(n, -1)
    if y.shape[1] != 1:
        raise InvalidArgumentError(
            f"sparse_categorical_crossentropy needs integer labels of shape ({n},), not {y.shape}"
        )
    labels = y.reshape(n)
    if labels.dtype in ENGINE_LABEL_DTYPES:
        return np.ascontiguousarray(labels), None
    if not np.issubdtype(labels.dtype, np.integer) and not np.all(np.equal(np.mod(labels, 1), 0)):
        raise InvalidArgumentError("sparse labels must be integers")
    return np.ascontiguousarray(labels, dtype=np.int64), None
