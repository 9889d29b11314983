"""Keras' preprocessing layers, run in C while each batch is gathered.

`Normalization`, `Discretization`, `Hashing`, `StringLookup`, `IntegerLookup` and `CategoryEncoding`
take Keras 3's arguments and give Keras' values. Put on a model `Input` (a lookup, Hashing or
Discretization may be followed by one `CategoryEncoding`), the chain becomes part of the one batch-gather
stage of the C engine (csrc/nn/nn_prep.c): a string or integer column is mapped value by value in C as
the rows of each batch are gathered, with no per-row Python work. A preprocessing layer anywhere else
is a `ModelError` saying where it may go.

Ids (a lookup's, Hashing's, Discretization's) are exact integers held in float32 (all below 2^24),
which is what `Dense` and `Embedding` read. Vocabularies and statistics are part of the model: saved
with it (`save_model`), in checkpoints and in the MLflow flavor.

Hashes are Keras' (TensorFlow's ``to_hash_bucket_fast`` and ``to_hash_bucket_strong``): FarmHash
Fingerprint64 without a salt (libfarmhash), SipHash-2-4 keyed with the salt's two 64-bit halves with
one (OpenSSL); an integer is hashed as its decimal string.

Not here: ``invert``, ``tf_idf``, ``sparse`` outputs.
"""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkgrad import _core
from sparkgrad.errors import InvalidArgumentError, ModelError
from sparkgrad.nn.layers import Layer

__all__ = [
    "CategoryEncoding",
    "Discretization",
    "Hashing",
    "IntegerLookup",
    "Normalization",
    "StringColumn",
    "StringLookup",
]

# csrc/nn/nn_prep.h
_MAP = {"identity": 0, "normalize": 1, "discretize": 2, "lookup": 3, "hash": 4}
_ENCODE = {"int": 0, "one_hot": 1, "multi_hot": 2, "count": 3}
MAX_ID = 1 << 24
_EPSILON = np.float32(1e-7)  # keras.backend.epsilon()


@dataclass(frozen=True, eq=False)
class StringColumn:
    """A column of strings as the C engine (and Arrow) lays it out: value ``k`` is
    ``data[offsets[k]:offsets[k + 1]]``, UTF-8, ``row`` values per row.

    Built once from a NumPy array of ``str``, ``bytes`` or objects (`from_array`, in C); an Arrow
    ``string`` / ``large_string`` array's buffers fit as they are (int32 or int64 offsets).
    """

    offsets: np.ndarray
    data: np.ndarray
    row: int = 1

    @classmethod
    def from_array(cls, x: np.ndarray, row: int) -> StringColumn:
        offsets, data = _core.utf8_column(np.asarray(x))
        return cls(offsets, data, int(row))

    @property
    def shape(self) -> tuple[int, int]:
        return ((self.offsets.size - 1) // self.row, self.row)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows) -> StringColumn:
        """The rows ``rows`` (a slice, or an index array), as a new column."""
        idx = np.arange(len(self))[rows]
        k = (idx.reshape(-1, 1) * self.row + np.arange(self.row)).reshape(-1)
        starts, ends = self.offsets[k], self.offsets[k + 1]
        lens = (ends - starts).astype(np.int64)
        offsets = np.zeros(k.size + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        pos = np.repeat(starts.astype(np.int64) - offsets[:-1], lens) + np.arange(offsets[-1])
        return StringColumn(offsets, np.ascontiguousarray(self.data[pos]), self.row)


def _is_strings(a: np.ndarray) -> bool:
    return a.dtype.kind in "USO"


def _name(layer: Layer) -> str:
    return f"{type(layer).__name__} {layer.name or type(layer).__name__.lower()!r}"


def _batches_of(data: Any) -> Iterable[np.ndarray]:
    """adapt's data as arrays: one array, a list of values, or an iterable of batches (arrays, or
    ``(x, y)`` pairs whose x is taken, as Keras takes a dataset)."""
    if isinstance(data, np.ndarray) or (isinstance(data, (list, tuple)) and not _nested(data)):
        yield np.asarray(data)
        return
    for batch in data:
        if isinstance(batch, tuple) and len(batch) in (2, 3):
            batch = batch[0]
        yield np.asarray(batch)


def _nested(data: Sequence) -> bool:
    return len(data) > 0 and isinstance(data[0], (np.ndarray, list, tuple))


class _State:
    """A preprocessing layer's learned or given state (vocabulary, statistics), which `adapt` sets; its
    ``version`` moves on each change, so a model rebuilds its C chains."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.version = 0

    def set(self, **values: Any) -> None:
        self.values.update(values)
        self.version += 1


@dataclass(frozen=True, eq=False)
class _Preprocessing(Layer):
    """Base of the preprocessing layers: a frozen configuration plus a `_State` (``adapt``'s)."""

    preprocessing = True
    output_mode: str = "int"

    def _setup(self, name: str | None) -> None:
        object.__setattr__(self, "input_shape", None)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "_state", _State())

    def spec(self) -> dict:
        raise ModelError(f"{_name(self)} runs in the batch gather; it has no op")

    def __call__(self, inputs):
        """On a tensor (`Input`): the layer's output tensor, as any layer. On values (an array, a list): the
        layer applied to them now, in C, as Keras' eager call: ids as int64 (``output_mode="int"``),
        encodings and normalized values as float32. A 1-D array is one value per sample."""
        from sparkgrad.nn.graph import KerasTensor, call_layer

        if isinstance(inputs, KerasTensor) or (
            isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], KerasTensor)
        ):
            return call_layer(self, inputs)
        a = inputs if isinstance(inputs, StringColumn) else np.asarray(inputs)
        flat = not isinstance(a, StringColumn) and a.ndim == 1
        n = len(a)
        shape = (a.row,) if isinstance(a, StringColumn) else (1,) if flat else tuple(a.shape[1:])
        strings = isinstance(a, StringColumn) or _is_strings(a)
        desc = chain_desc([self], shape, strings)
        col = raw_column([self], a if isinstance(a, StringColumn) else a.reshape(n, -1), self.name or "x", shape)
        out = _core.Prep(desc).map(col).reshape((n, *chain_shape([self], shape)))
        if flat and self.output_mode in ("int",):
            out = out.reshape(n)
        return out if self.output_mode != "int" or isinstance(self, Normalization) else out.astype(np.int64)

    # what a chain needs (see chain_desc)
    def _map_desc(self, shape: tuple[int, ...], strings: bool) -> dict:
        raise NotImplementedError

    def _depth(self) -> int:
        """The width of this layer's own encoding (output_mode other than "int")."""
        raise NotImplementedError

    def get_config(self) -> dict:
        """Keras' configuration (the constructor's arguments)."""
        raise NotImplementedError

    def _state_config(self) -> dict:
        """The state as JSON values (saved with the model)."""
        return {}

    def _load_state(self, values: dict) -> None:
        """Puts a `_state_config` back."""


# ---- Normalization ---------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Normalization(_Preprocessing):
    """Standardizes each feature, as Keras' ``Normalization``: ``(x - mean) / max(sqrt(variance), 1e-7)``,
    in float32.

    ``mean`` and ``variance`` are given or learned by `adapt` (over the batch axis and every axis but
    ``axis``: the population variance, batches merged as Keras merges them).

    ```python
    import numpy as np
    from sparkgrad.nn import Dense, Input, Model, Normalization

    x = np.random.default_rng(0).normal(5.0, 2.0, size=(256, 3)).astype(np.float32)
    norm = Normalization()
    norm.adapt(x)
    inp = Input(shape=(3,))
    model = Model(inp, Dense(1)(norm(inp)), seed=0)
    ```

    Args:
        axis: -1 (a mean and variance per feature of the last axis) or None (one of each).
        mean: The means (a scalar, or one per feature); with ``variance``; None: from `adapt`.
        variance: The variances, as ``mean``.
        invert: False only.
        name: The layer's name.

    Raises:
        ValueError: Another axis, ``invert=True``, or only one of mean and variance.
    """

    axis: int | None = -1

    def __init__(
        self,
        axis: int | None = -1,
        mean: Any = None,
        variance: Any = None,
        invert: bool = False,
        name: str | None = None,
    ):
        self._setup(name)
        if axis not in (-1, None, (-1,), [-1]):
            raise ValueError(f"Normalization(axis={axis!r}): -1 (the last axis) or None only")
        if invert:
            raise ValueError("Normalization(invert=True) is not supported")
        if (mean is None) != (variance is None):
            raise ValueError("Normalization: give both mean and variance, or neither (then adapt)")
        object.__setattr__(self, "axis", None if axis is None else -1)
        if mean is not None:
            self._state.set(mean=np.asarray(mean, np.float32), variance=np.asarray(variance, np.float32), given=True)

    @property
    def mean(self) -> np.ndarray | None:
        return self._state.values.get("mean")

    @property
    def variance(self) -> np.ndarray | None:
        return self._state.values.get("variance")

    def adapt(self, data) -> None:
        """Learns the mean and variance of ``data``: an array, or an iterable of batches.

        Raises:
            InvalidArgumentError: No values (an empty array or dataset), strings, or batches whose
                feature axis differs.
        """
        total_mean = total_var = None
        count = 0
        one = isinstance(data, np.ndarray)  # Keras: one array in its own dtype, batches in float32
        for batch in _batches_of(data):
            if _is_strings(batch):
                raise InvalidArgumentError(f"{_name(self)}: adapt takes numbers, not {batch.dtype} values")
            if not one or batch.dtype.kind not in "f":
                batch = batch.astype(np.float32)
            if batch.ndim == 1:
                batch = batch.reshape(-1, 1)
            if batch.size == 0:
                continue
            reduce = tuple(range(batch.ndim)) if self.axis is None else tuple(range(batch.ndim - 1))
            mean, var = np.mean(batch, axis=reduce), np.var(batch, axis=reduce)
            n = int(np.prod([batch.shape[d] for d in reduce]))
            if total_mean is None:
                total_mean, total_var, count = mean, var, n
                continue
            if mean.shape != total_mean.shape:
                raise InvalidArgumentError(f"{_name(self)}: adapt got batches of {mean.shape} and {total_mean.shape}")
            count += n
            w = np.float32(n / count)
            keep = np.float32(1.0) - w
            new_mean = total_mean * keep + mean * w
            total_var = (total_var + (total_mean - new_mean) ** 2) * keep + (var + (mean - new_mean) ** 2) * w
            total_mean = new_mean
        if total_mean is None:
            raise InvalidArgumentError(f"{_name(self)}: adapt got no values (an empty array or dataset)")
        self._state.set(mean=np.asarray(total_mean, np.float32), variance=np.asarray(total_var, np.float32))

    def _map_desc(self, shape, strings):
        if self.mean is None:
            raise ModelError(f"{_name(self)} has no mean and variance: give them or call adapt first")
        if strings:
            raise ModelError(f"{_name(self)} takes numbers, not a string Input")
        row = int(np.prod(shape))
        try:
            mean = np.broadcast_to(self.mean, shape).astype(np.float32).reshape(-1)
            var = np.broadcast_to(self.variance, shape).astype(np.float32).reshape(-1)
        except ValueError:
            raise ModelError(f"{_name(self)}: mean of shape {self.mean.shape} does not fit inputs of {shape}") from None
        std = np.maximum(np.sqrt(var), _EPSILON).astype(np.float32)
        return {"map": _MAP["normalize"], "row": row, "mean": mean, "std": std}

    def get_config(self):
        return {"axis": self.axis, "name": self.name}

    def _state_config(self):
        if self.mean is None:
            return {}
        return {"mean": self.mean.tolist(), "variance": self.variance.tolist()}

    def _load_state(self, values):
        if values:
            self._state.set(
                mean=np.asarray(values["mean"], np.float32), variance=np.asarray(values["variance"], np.float32)
            )


# ---- Discretization --------------------------------------------------------------------------------


def _unsupported(layer: str, **args: Any) -> None:
    """Keras arguments taken by name but not supported here: an error when one is set."""
    for key, value in args.items():
        if value is not None and value is not False:
            raise ValueError(f"{layer}({key}={value!r}) is not supported (see sparkgrad.nn.preprocessing)")


def _check_mode(layer: str, mode: str, allowed=("int", "one_hot", "multi_hot", "count")) -> str:
    if mode not in allowed:
        raise ValueError(f"{layer}: output_mode must be one of {allowed}, not {mode!r}")
    return mode


def _quantile_summary(values: np.ndarray, epsilon: float) -> np.ndarray:
    """Keras' summary of one batch for Discretization.adapt: about ``1 / epsilon`` of the sorted values,
    evenly spaced, each weighing the values it stands for (all of them, weight 1, when there are fewer)."""
    v = np.sort(values.reshape(-1))
    step = max(v.size / (1.0 / epsilon), 1)
    points = v[int(step - 1) :: int(step)]
    return np.stack([points, np.ones_like(points) * step])


def _compress(summary: np.ndarray, epsilon: float) -> np.ndarray:
    """A summary cut to the points at cumulative weight fractions ``epsilon, 2 * epsilon, ..., 1``
    (interpolated), each weighing the weight between it and the one before; a summary of fewer than
    ``1 / epsilon`` points stays as it is (Keras' rule)."""
    if summary.shape[1] * epsilon < 1:
        return summary
    at = epsilon + np.arange(0.0, 1.0, epsilon)
    cum = summary[1].cumsum()
    frac = cum / cum[-1]
    points = np.interp(at, frac, summary[0])
    cum_at = np.interp(at, frac, cum)
    weights = cum_at - np.concatenate((np.array([0]), cum_at[:-1]))
    return np.stack((points, weights)).astype("float32")


@dataclass(frozen=True, eq=False)
class Discretization(_Preprocessing):
    """Buckets numbers by boundaries, as Keras' ``Discretization``: the bucket of ``x`` is the number of
    boundaries ``<= x`` (bins ``[b[i-1], b[i])``), an id in ``[0, len(bin_boundaries)]``.

    The boundaries are given, or learned by `adapt` for ``num_bins`` bins: Keras' approximate quantiles
    (each batch summarized to about ``1 / epsilon`` weighted points, summaries merged and compressed, the
    boundaries read at the cumulative fractions ``1 / num_bins, 2 / num_bins, ...``), so that the
    boundaries are the ones Keras learns from the same batches.

    Args:
        bin_boundaries: Ascending boundaries, or None (then ``num_bins`` and `adapt`).
        num_bins: The bins `adapt` aims at.
        epsilon: The summaries' tolerance (Keras' 0.01).
        output_mode: ``"int"`` (the ids), ``"one_hot"``, ``"multi_hot"`` or ``"count"`` (over
            ``len(bin_boundaries) + 1`` bins, or ``num_bins``).
        sparse: False only (sparse outputs are not supported).
        name: The layer's name.

    Raises:
        ValueError: Both or neither of bin_boundaries and num_bins, or boundaries that are not ascending.
    """

    num_bins: int | None = None
    epsilon: float = 0.01

    def __init__(
        self,
        bin_boundaries: Sequence[float] | None = None,
        num_bins: int | None = None,
        epsilon: float = 0.01,
        output_mode: str = "int",
        sparse: bool = False,
        name: str | None = None,
    ):
        _unsupported("Discretization", sparse=sparse)
        self._setup(name)
        if (bin_boundaries is None) == (num_bins is None):
            raise ValueError("Discretization: give bin_boundaries or num_bins (then adapt), one of them")
        if num_bins is not None and int(num_bins) < 0:
            raise ValueError(f"Discretization: num_bins must be >= 0, not {num_bins!r}")
        object.__setattr__(self, "num_bins", None if num_bins is None else int(num_bins))
        object.__setattr__(self, "epsilon", float(epsilon))
        object.__setattr__(self, "output_mode", _check_mode("Discretization", output_mode))
        if bin_boundaries is not None:
            self._set_boundaries([float(v) for v in bin_boundaries])

    def _set_boundaries(self, b: list[float]) -> None:
        if any(not (x <= y) for x, y in itertools.pairwise(b)):
            raise ValueError(f"Discretization: bin_boundaries must be ascending, not {b}")
        self._state.set(bounds=tuple(b))

    @property
    def bin_boundaries(self) -> list[float] | None:
        """The boundaries, given or learned (None before `adapt`)."""
        b = self._state.values.get("bounds")
        return None if b is None else list(b)

    def adapt(self, data, steps: int | None = None) -> None:
        """Learns ``num_bins - 1`` boundaries from ``data`` (an array, or an iterable of batches; ``steps``
        batches at most), as Keras does.

        Raises:
            ValueError: The layer was given bin_boundaries. InvalidArgumentError: no values, or strings.
        """
        if self.num_bins is None:
            raise ValueError(f"{_name(self)} was given bin_boundaries; adapt needs num_bins")
        summary = np.array([[], []], dtype="float32")
        seen = 0
        for i, batch in enumerate(_batches_of(data)):
            if steps is not None and i >= steps:
                break
            if _is_strings(batch):
                raise InvalidArgumentError(f"{_name(self)}: adapt takes numbers, not {batch.dtype} values")
            batch = batch.astype("float32")
            seen += batch.size
            merged = np.concatenate((_quantile_summary(batch, self.epsilon), summary), axis=1)
            summary = _compress(np.take(merged, np.argsort(merged[0]), axis=1), self.epsilon)
        if not seen:
            raise InvalidArgumentError(f"{_name(self)}: adapt got no values (an empty array or dataset)")
        self._set_boundaries(_compress(summary, 1.0 / self.num_bins)[0, :-1].tolist())

    def _depth(self):
        if self.num_bins is not None:
            return self.num_bins
        return len(self.bin_boundaries) + 1

    def _map_desc(self, shape, strings):
        if strings:
            raise ModelError(f"{_name(self)} takes numbers, not a string Input")
        if self.bin_boundaries is None:
            raise ModelError(f"{_name(self)} has no bin_boundaries: call adapt first")
        return {
            "map": _MAP["discretize"],
            "row": int(np.prod(shape)),
            "bounds": np.asarray(self.bin_boundaries, np.float32),
        }

    def get_config(self):
        given = self.num_bins is None
        return {
            "bin_boundaries": self.bin_boundaries if given else None,
            "num_bins": self.num_bins,
            "epsilon": self.epsilon,
            "output_mode": self.output_mode,
            "name": self.name,
        }

    def _state_config(self):
        return {} if self.num_bins is None or self.bin_boundaries is None else {"bounds": self.bin_boundaries}

    def _load_state(self, values):
        if values:
            self._set_boundaries([float(v) for v in values["bounds"]])


# ---- Hashing ---------------------------------------------------------------------------------------


def _salt(salt) -> tuple[int, int] | None:
    if salt is None:
        return None
    if isinstance(salt, (tuple, list)) and len(salt) == 2:
        return (int(salt[0]), int(salt[1]))
    if isinstance(salt, (int, np.integer)) and not isinstance(salt, bool):
        return (int(salt), int(salt))
    raise ValueError(f"salt must be an integer or a pair of integers, not {salt!r}")


@dataclass(frozen=True, eq=False)
class Hashing(_Preprocessing):
    """Hashes strings or integers into ``num_bins`` buckets, as Keras' ``Hashing``.

    Without a salt the hash is FarmHash Fingerprint64 (TensorFlow's ``to_hash_bucket_fast``), with one
    SipHash-2-4 keyed with the salt's two halves (``to_hash_bucket_strong``); an integer is hashed as
    its decimal string, a float first cast to an integer. With ``mask_value`` (and ``num_bins > 1``) that
    value gets bucket 0 and the others ``1 + hash % (num_bins - 1)``.

    Args:
        num_bins: The number of buckets (at most 2^24, ids exact in float32).
        mask_value: A value (string or integer) that gets bucket 0, or None.
        salt: An integer (used twice) or a pair: the SipHash key.
        output_mode: ``"int"``, ``"one_hot"``, ``"multi_hot"`` or ``"count"``.
        sparse: False only (sparse outputs are not supported).
        name: The layer's name.

    Raises:
        ValueError: ``num_bins`` below 1 or above 2^24, a bad salt or output_mode.
    """

    num_bins: int = 0
    mask_value: Any = None
    salt: tuple[int, int] | None = None

    def __init__(
        self,
        num_bins: int,
        mask_value: str | int | None = None,
        salt: int | Sequence[int] | None = None,
        output_mode: str = "int",
        sparse: bool = False,
        name: str | None = None,
    ):
        _unsupported("Hashing", sparse=sparse)
        self._setup(name)
        if num_bins is None or not 1 <= int(num_bins) <= MAX_ID:
            raise ValueError(f"Hashing: num_bins must be in [1, 2^24], not {num_bins!r}")
        object.__setattr__(self, "num_bins", int(num_bins))
        object.__setattr__(self, "mask_value", mask_value)
        object.__setattr__(self, "salt", _salt(salt))
        object.__setattr__(self, "output_mode", _check_mode("Hashing", output_mode))

    def _depth(self):
        return self.num_bins

    def _map_desc(self, shape, strings):
        mask = self.mask_value if self.num_bins > 1 else None
        if mask is not None and not isinstance(mask, (str, bytes)):
            mask = int(mask)
        return {
            "map": _MAP["hash"],
            "row": int(np.prod(shape)),
            "strings": int(strings),
            "num_bins": self.num_bins,
            "mask": mask,
            "salt": self.salt,
        }

    def get_config(self):
        return {
            "num_bins": self.num_bins,
            "mask_value": self.mask_value,
            "salt": list(self.salt) if self.salt else None,
            "output_mode": self.output_mode,
            "name": self.name,
        }


# ---- StringLookup and IntegerLookup ----------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Lookup(_Preprocessing):
    max_tokens: int | None = None
    num_oov_indices: int = 1
    mask_token: Any = None
    oov_token: Any = None
    pad_to_max_tokens: bool = False

    _strings = True

    def _init_lookup(self, max_tokens, num_oov_indices, mask_token, oov_token, vocabulary, output_mode,
                     pad_to_max_tokens, name) -> None:  # fmt: skip
        self._setup(name)
        kind = type(self).__name__
        if max_tokens is not None and int(max_tokens) <= 1:
            raise ValueError(f"{kind}: max_tokens must be > 1, not {max_tokens!r}")
        if int(num_oov_indices) < 0:
            raise ValueError(f"{kind}: num_oov_indices must be >= 0, not {num_oov_indices!r}")
        object.__setattr__(self, "max_tokens", None if max_tokens is None else int(max_tokens))
        object.__setattr__(self, "num_oov_indices", int(num_oov_indices))
        object.__setattr__(self, "mask_token", mask_token)
        object.__setattr__(self, "oov_token", oov_token)
        object.__setattr__(self, "output_mode", _check_mode(kind, output_mode))
        object.__setattr__(self, "pad_to_max_tokens", bool(pad_to_max_tokens))
        if pad_to_max_tokens and max_tokens is None:
            raise ValueError(f"{kind}: pad_to_max_tokens needs max_tokens")
        if vocabulary is not None:
            self.set_vocabulary(vocabulary)

    # Keras' index layout: [mask (int mode only)] [OOV buckets] [tokens]
    def _oov_start(self) -> int:
        return 1 if self.mask_token is not None and self.output_mode == "int" else 0

    def _token_start(self) -> int:
        return self._oov_start() + self.num_oov_indices

    def _token(self, v) -> Any:
        return str(v) if self._strings else int(v)

    def _read_file(self, path: str) -> list:
        if not os.path.isfile(path):
            raise InvalidArgumentError(f"{_name(self)}: vocabulary file {path!r} does not exist")
        with open(path, encoding="utf-8", newline="") as f:
            lines = f.read().split("\n")
        while lines and lines[-1] == "":
            lines.pop()
        lines = [line[:-1] if line.endswith("\r") else line for line in lines]
        seen: dict[str, int] = {}
        for i, line in enumerate(lines, 1):
            if line in seen:
                raise InvalidArgumentError(
                    f"{_name(self)}: vocabulary file {path!r} repeats {line!r} on lines {seen[line]} and {i}"
                )
            seen[line] = i
        try:
            return [self._token(v) for v in lines]
        except ValueError:
            raise InvalidArgumentError(
                f"{_name(self)}: vocabulary file {path!r} holds a line that is not an integer"
            ) from None

    def set_vocabulary(self, vocabulary) -> None:
        """Sets the vocabulary: a list or array of tokens, or the path of a file of one token per line
        (Keras' ``set_vocabulary``; the mask and OOV tokens may lead it, in Keras' order).

        Raises:
            InvalidArgumentError: A missing file, a repeated token (the file's lines are named), an
                empty vocabulary, the mask token among the tokens, or more than max_tokens.
        """
        if isinstance(vocabulary, (str, os.PathLike)):
            tokens = self._read_file(os.fspath(vocabulary))
            file = True
        else:
            tokens = [self._token(v) for v in np.asarray(vocabulary).reshape(-1).tolist()]
            file = False
        if not tokens:
            raise InvalidArgumentError(f"{_name(self)}: an empty vocabulary")
        special = [self.mask_token] * self._oov_start() + [self.oov_token] * self.num_oov_indices
        if not file and special and tokens[: len(special)] == [self._token(s) for s in special if s is not None]:
            tokens = tokens[len(special) :]
        repeated = [t for t, c in collections.Counter(tokens).items() if c > 1]
        if repeated:
            raise InvalidArgumentError(f"{_name(self)}: the vocabulary repeats {repeated[:10]}")
        if self.mask_token is not None and self._token(self.mask_token) in tokens:
            raise InvalidArgumentError(
                f"{_name(self)}: the mask token {self.mask_token!r} is among the vocabulary's tokens "
                f"(at {tokens.index(self._token(self.mask_token))})"
            )
        if self.max_tokens is not None and self._token_start() + len(tokens) > self.max_tokens:
            raise InvalidArgumentError(
                f"{_name(self)}: a vocabulary of {self._token_start() + len(tokens)} is larger than "
                f"max_tokens={self.max_tokens}"
            )
        self._state.set(tokens=tokens, given=True)

    def adapt(self, data, steps: int | None = None) -> None:
        """Learns the vocabulary from ``data`` (an array, or an iterable of batches; ``steps`` batches at
        most): tokens by count, most frequent first, ties by token from the highest (Keras' order), the
        mask and OOV tokens left out, cut to ``max_tokens``.

        Raises:
            InvalidArgumentError: No values (an empty array or dataset), or values of the wrong kind.
        """
        counts: collections.Counter = collections.Counter()
        for i, batch in enumerate(_batches_of(data)):
            if steps is not None and i >= steps:
                break
            if self._strings != _is_strings(batch) and batch.size:
                want = "strings" if self._strings else "integers"
                raise InvalidArgumentError(f"{_name(self)}: adapt takes {want}, not {batch.dtype} values")
            counts.update(self._token(v) for v in batch.reshape(-1).tolist())
        for special in (self.mask_token, self.oov_token):
            if special is not None:
                counts.pop(self._token(special), None)
        if not counts:
            raise InvalidArgumentError(f"{_name(self)}: adapt got no values (an empty array or dataset)")
        key = (lambda t: t.encode()) if self._strings else (lambda t: t)
        tokens = sorted(counts, key=lambda t: (counts[t], key(t)), reverse=True)
        if self.max_tokens is not None:
            tokens = tokens[: self.max_tokens - self._token_start()]
        self._state.set(tokens=tokens, given=False)

    def get_vocabulary(self, include_special_tokens: bool = True) -> list:
        """The tokens in index order (with the mask and OOV tokens first, as Keras lists them)."""
        tokens = list(self._state.values.get("tokens", []))
        if not include_special_tokens:
            return tokens
        return [self.mask_token] * self._oov_start() + [self.oov_token] * self.num_oov_indices + tokens

    def vocabulary_size(self) -> int:
        """The number of ids: the tokens plus the mask and OOV indices."""
        return self._token_start() + len(self._state.values.get("tokens", []))

    def _depth(self):
        if self.pad_to_max_tokens:
            return self.max_tokens
        if "tokens" not in self._state.values:
            raise ModelError(
                f"{_name(self)} with output_mode={self.output_mode!r} needs its vocabulary before the model is "
                "built: pass vocabulary= or call adapt first"
            )
        return self.vocabulary_size()

    def _hash_oov(self) -> bool:
        return True

    def _map_desc(self, shape, strings):
        if "tokens" not in self._state.values:
            raise ModelError(f"{_name(self)} has no vocabulary: pass vocabulary= or call adapt first")
        if strings != self._strings:
            want = "a string Input" if self._strings else "an integer Input"
            raise ModelError(f"{_name(self)} takes {want}")
        tokens = self._state.values["tokens"]
        desc: dict[str, Any] = {
            "map": _MAP["lookup"],
            "row": int(np.prod(shape)),
            "strings": int(self._strings),
            "first": self._token_start(),
            "num_oov": self.num_oov_indices,
            "oov_start": self._oov_start(),
            "oov_floormod": int(not self._hash_oov()),
            "mask": None if self.mask_token is None else self._token(self.mask_token),
            "mask_id": 0 if self.output_mode == "int" else -1,
            "salt": self._salt_pair(),
        }
        if self._strings:
            col = StringColumn.from_array(np.asarray(tokens, dtype=object), 1)
            desc["vocab_offsets"], desc["vocab_bytes"] = col.offsets, col.data
        else:
            desc["vocab_ints"] = np.asarray(tokens, np.int64)
        return desc

    def _salt_pair(self) -> tuple[int, int] | None:
        return self.salt

    def _own_config(self) -> dict:
        """What a subclass adds to the shared config (before the salt and the name)."""
        return {}

    def get_config(self):
        return {
            "max_tokens": self.max_tokens,
            "num_oov_indices": self.num_oov_indices,
            "mask_token": self.mask_token,
            "oov_token": self.oov_token,
            "output_mode": self.output_mode,
            "pad_to_max_tokens": self.pad_to_max_tokens,
            **self._own_config(),
            "salt": list(self.salt) if self.salt else None,
            "name": self.name,
        }

    def _state_config(self):
        v = self._state.values
        return {"tokens": list(v["tokens"]), "given": bool(v.get("given"))} if "tokens" in v else {}

    def _load_state(self, values):
        if values:
            self._state.set(tokens=[self._token(t) for t in values["tokens"]], given=values.get("given", False))


@dataclass(frozen=True, eq=False)
class StringLookup(_Lookup):
    """Maps strings to integer ids through a vocabulary, as Keras' ``StringLookup``.

    Ids, as Keras lays them out: with ``mask_token`` (and ``output_mode="int"``) index 0 is the mask;
    then ``num_oov_indices`` out-of-vocabulary buckets (a string not in the vocabulary goes to the one
    its FarmHash Fingerprint64, or with ``salt`` its SipHash, picks); then the tokens in vocabulary
    order. Other output modes encode the ids over ``vocabulary_size()`` (the mask dropped).

    ```python
    import numpy as np
    from sparkgrad.nn import CategoryEncoding, Dense, Input, Model, StringLookup

    city = Input(shape=(1,), dtype="string", name="city")
    lookup = StringLookup(vocabulary=["paris", "rome", "oslo"])
    onehot = CategoryEncoding(num_tokens=lookup.vocabulary_size(), output_mode="one_hot")(lookup(city))
    model = Model(city, Dense(1, activation="sigmoid")(onehot), seed=0)
    ```

    Args:
        max_tokens: The most ids (tokens plus mask and OOV), or None.
        num_oov_indices: OOV buckets (0: a value not in the vocabulary is an error naming it).
        mask_token: A string that maps to 0 (int mode) or is dropped, or None.
        oov_token: What `get_vocabulary` lists for the OOV buckets.
        vocabulary: A list of strings or a file of one per line, or None (then `adapt`).
        output_mode: ``"int"``, ``"one_hot"``, ``"multi_hot"`` or ``"count"``.
        pad_to_max_tokens: Encode over ``max_tokens`` rather than the vocabulary's size.
        encoding: ``"utf-8"`` only.
        salt: SipHash's key for the OOV buckets (an integer or a pair), or None (FarmHash).
        idf_weights: Keras' TF-IDF weights: None only (not supported).
        invert: Keras' inverted lookup: False only (not supported).
        sparse: False only (sparse outputs are not supported).
        name: The layer's name.

    Raises:
        ValueError: Bad arguments. InvalidArgumentError: a bad vocabulary (missing file, repeats).
    """

    def __init__(
        self,
        max_tokens: int | None = None,
        num_oov_indices: int = 1,
        mask_token: str | None = None,
        oov_token: str = "[UNK]",
        vocabulary: Sequence[str] | str | os.PathLike | None = None,
        idf_weights: Any = None,
        invert: bool = False,
        output_mode: str = "int",
        pad_to_max_tokens: bool = False,
        sparse: bool = False,
        encoding: str = "utf-8",
        name: str | None = None,
        salt: int | Sequence[int] | None = None,
    ):
        _unsupported("StringLookup", idf_weights=idf_weights, invert=invert, sparse=sparse)
        if encoding not in ("utf-8", "utf8"):
            raise ValueError(f"StringLookup: encoding must be 'utf-8', not {encoding!r}")
        object.__setattr__(self, "salt", _salt(salt))
        self._init_lookup(max_tokens, num_oov_indices, mask_token, oov_token, vocabulary, output_mode,
                          pad_to_max_tokens, name)  # fmt: skip


@dataclass(frozen=True, eq=False)
class IntegerLookup(_Lookup):
    """Maps integers to ids through a vocabulary, as Keras' ``IntegerLookup``: the layout of
    `StringLookup`; a value not in the vocabulary goes to OOV bucket ``value % num_oov_indices``
    (``oov_method="floormod"``, Keras' default) or its hash's (``"farmhash"``, of its decimal string).

    Args:
        max_tokens: The most ids, or None.
        num_oov_indices: OOV buckets (0: a value not in the vocabulary is an error naming it).
        mask_token: An integer that maps to 0 (int mode) or is dropped, or None.
        oov_token: What `get_vocabulary` lists for the OOV buckets.
        vocabulary: A list of integers or a file of one per line, or None (then `adapt`).
        vocabulary_dtype: ``"int64"`` only.
        output_mode: ``"int"``, ``"one_hot"``, ``"multi_hot"`` or ``"count"``.
        pad_to_max_tokens: Encode over ``max_tokens``.
        oov_method: ``"floormod"`` or ``"farmhash"``.
        salt: With ``"farmhash"``: SipHash's key instead.
        idf_weights: None only (not supported).
        invert: False only (not supported).
        sparse: False only (not supported).
        name: The layer's name.
    """

    _strings = False
    oov_method: str = "floormod"

    def __init__(
        self,
        max_tokens: int | None = None,
        num_oov_indices: int = 1,
        mask_token: int | None = None,
        oov_token: int = -1,
        vocabulary: Sequence[int] | str | os.PathLike | None = None,
        vocabulary_dtype: str = "int64",
        idf_weights: Any = None,
        invert: bool = False,
        output_mode: str = "int",
        sparse: bool = False,
        pad_to_max_tokens: bool = False,
        oov_method: str = "floormod",
        salt: int | Sequence[int] | None = None,
        name: str | None = None,
    ):
        _unsupported("IntegerLookup", idf_weights=idf_weights, invert=invert, sparse=sparse)
        if vocabulary_dtype != "int64":
            raise ValueError(f"IntegerLookup: vocabulary_dtype must be 'int64', not {vocabulary_dtype!r}")
        if oov_method not in ("floormod", "farmhash"):
            raise ValueError(f"IntegerLookup: oov_method must be 'floormod' or 'farmhash', not {oov_method!r}")
        if salt is not None and oov_method != "farmhash":
            raise ValueError("IntegerLookup: salt can only be used with oov_method='farmhash'")
        object.__setattr__(self, "oov_method", oov_method)
        object.__setattr__(self, "salt", _salt(salt))
        self._init_lookup(max_tokens, num_oov_indices, mask_token, oov_token, vocabulary, output_mode,
                          pad_to_max_tokens, name)  # fmt: skip

    def _hash_oov(self):
        return self.oov_method == "farmhash"

    def _own_config(self):
        return {"oov_method": self.oov_method}


# ---- CategoryEncoding ------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class CategoryEncoding(_Preprocessing):
    """Encodes integer ids in ``[0, num_tokens)`` as Keras' ``CategoryEncoding``: ``"one_hot"`` (each value
    its own row of ``num_tokens``; one value per sample gives one row), ``"multi_hot"`` (1 where an id
    occurs in the sample) or ``"count"`` (how often). On an integer `Input`, or after a lookup, Hashing
    or Discretization with ``output_mode="int"``. An id outside ``[0, num_tokens)`` is an error naming the
    row and column.

    Args:
        num_tokens: The width of the encoding (at most 2^24).
        output_mode: ``"multi_hot"`` (Keras' default), ``"one_hot"`` or ``"count"``.
        sparse: False only (sparse outputs are not supported).
        name: The layer's name.
    """

    num_tokens: int = 0

    def __init__(
        self,
        num_tokens: int | None = None,
        output_mode: str = "multi_hot",
        sparse: bool = False,
        name: str | None = None,
    ):
        _unsupported("CategoryEncoding", sparse=sparse)
        self._setup(name)
        if num_tokens is None or not 1 <= int(num_tokens) <= MAX_ID:
            raise ValueError(f"CategoryEncoding: num_tokens must be in [1, 2^24], not {num_tokens!r}")
        object.__setattr__(self, "num_tokens", int(num_tokens))
        mode = "multi_hot" if output_mode == "binary" else output_mode
        object.__setattr__(
            self, "output_mode", _check_mode("CategoryEncoding", mode, ("one_hot", "multi_hot", "count"))
        )

    def _depth(self):
        return self.num_tokens

    def _map_desc(self, shape, strings):
        if strings:
            raise ModelError(f"{_name(self)} takes integer ids, not a string Input (put a StringLookup before it)")
        return {"map": _MAP["identity"], "row": int(np.prod(shape))}

    def get_config(self):
        return {"num_tokens": self.num_tokens, "output_mode": self.output_mode, "name": self.name}


PREPROCESSING_TYPES: dict[str, type] = {
    cls.__name__: cls for cls in (Normalization, Discretization, Hashing, StringLookup, IntegerLookup, CategoryEncoding)
}


# ---- chains ----------------------------------------------------------------------------------------


def is_preprocessing(layer: object) -> bool:
    return getattr(layer, "preprocessing", False)


def encoded_shape(shape: tuple[int, ...], mode: str, depth: int) -> tuple[int, ...]:
    """Keras' output shape of an encoding of ``depth`` over per-sample ``shape``."""
    if mode == "one_hot":
        return (*shape[:-1], depth) if shape[-1] == 1 else (*shape, depth)
    return (*shape[:-1], depth)


def chain_shape(layers: Sequence[_Preprocessing], shape: tuple[int, ...]) -> tuple[int, ...]:
    """The per-sample shape after a chain."""
    for layer in layers:
        if layer.output_mode != "int":
            if len(shape) != 1:
                raise ModelError(f"{_name(layer)}: an encoding takes inputs of one axis, (values,), not {shape}")
            shape = encoded_shape(shape, layer.output_mode, layer._depth())
    return shape


def chain_desc(layers: Sequence[_Preprocessing], shape: tuple[int, ...], strings: bool) -> dict:
    """The description `_core.Prep` builds a chain from: the first layer's map, and the encoding of the
    last layer whose output_mode is not "int" (CategoryEncoding, or the map's own)."""
    head = layers[0]
    desc = dict(head._map_desc(tuple(shape), strings))
    desc["map_layer"] = _name(head)
    enc = next((layer for layer in reversed(layers) if layer.output_mode != "int"), None)
    if enc is not None:
        if isinstance(head, Normalization):
            raise ModelError(f"{_name(enc)} cannot follow Normalization (it gives floats, not ids)")
        desc.update(encode=_ENCODE[enc.output_mode], num_tokens=enc._depth(), encode_layer=_name(enc))
    return desc


def chain_version(layers: Sequence[_Preprocessing]) -> tuple:
    return tuple((id(layer), layer._state.version) for layer in layers)


def raw_column(layers: Sequence[_Preprocessing], x: object, input_name: str, shape: tuple[int, ...]):
    """Input data as the chain's C step reads it: a `StringColumn`, int64 / int32 ids or float32 values,
    ``[n, row]``.

    Raises:
        InvalidArgumentError: Strings for a numeric chain or numbers for a string one (the input and the
            layer are named), or rows that do not match the Input's shape.
    """
    head = layers[0]
    row = int(np.prod(shape))
    if isinstance(x, StringColumn):
        if x.row != row:
            raise InvalidArgumentError(f"input {input_name!r}: a string column of {x.row} values per row, not {row}")
        strings = True
    else:
        x = np.asarray(x)
        strings = _is_strings(x)
        if x.ndim == 0 or x.size != x.shape[0] * row:
            raise InvalidArgumentError(f"input {input_name!r}: x of shape {x.shape} does not hold rows of {shape}")
    takes_strings = isinstance(head, StringLookup) or isinstance(head, Hashing)
    if strings and not takes_strings:
        raise InvalidArgumentError(
            f"input {input_name!r} feeds {_name(head)}, which takes numbers; a string column was given"
        )
    if not strings and isinstance(head, StringLookup):
        raise InvalidArgumentError(f"input {input_name!r} feeds {_name(head)}, which takes strings, not {x.dtype}")
    if strings:
        return x if isinstance(x, StringColumn) else StringColumn.from_array(x.reshape(-1), row)
    x = x.reshape(x.shape[0], row)
    if isinstance(head, (Normalization, Discretization)):
        return np.ascontiguousarray(x, np.float32)
    if x.dtype in (np.int32, np.int64):
        return np.ascontiguousarray(x)
    if x.dtype.kind == "f" and not isinstance(head, Hashing):
        bad = ~np.isfinite(x) | (x != np.round(x))
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise InvalidArgumentError(
                f"input {input_name!r} feeds {_name(head)}, which takes integers; value {x[r, c]} of row {r} "
                f"(column {c}) is not one"
            )
    return np.ascontiguousarray(x.astype(np.int64))


def split_graph(g):
    """Takes the preprocessing chains off a graph (`sparkgrad.nn.graph.Graph`): each Input read by a
    preprocessing layer becomes, for the C graph, the chain's output. Returns the graph of the other
    layers (tensor ids renumbered) and each input's chain (None: none).

    Raises:
        ModelError: A preprocessing layer that does not read an Input (or a lookup's, Hashing's or
            Discretization's ids, for a CategoryEncoding), a chain whose values another layer also reads,
            or a chain that is a model output.
    """
    from sparkgrad.nn.graph import Graph

    nin = len(g.inputs)
    readers: dict[int, list[int]] = collections.defaultdict(list)
    for k, reads in enumerate(g.reads):
        for t in reads:
            readers[t].append(k)
    chains: list[list | None] = [None] * nin
    end = list(range(nin))  # the tensor each input's values reach the C graph as
    taken: set[int] = set()

    def where(k: int) -> str:
        return f"{_name(g.layers[k])} reads " + (
            f"Input {g.inputs[g.reads[k][0]].name!r}" if g.reads[k][0] < nin else "another layer's output"
        )

    for i in range(nin):
        ks = [k for k in readers[i] if is_preprocessing(g.layers[k])]
        if not ks:
            continue
        if len(readers[i]) > 1:
            names = ", ".join(_name(g.layers[k]) for k in readers[i])
            raise ModelError(
                f"Input {g.inputs[i].name!r} feeds a preprocessing layer and others ({names}); an Input with a "
                "preprocessing layer is read by that layer alone (give the raw values a second Input)"
            )
        chain, k = [ks[0]], ks[0]
        while True:
            nxt = readers[len(g.inputs) + k]
            if len(nxt) == 1 and isinstance(g.layers[nxt[0]], CategoryEncoding) and len(chain) == 1:
                if g.layers[k].output_mode != "int" or isinstance(g.layers[k], Normalization):
                    raise ModelError(f"{_name(g.layers[nxt[0]])} reads {_name(g.layers[k])}, which gives no ids")
                chain.append(nxt[0])
                k = nxt[0]
                continue
            if any(is_preprocessing(g.layers[r]) for r in nxt):
                bad = next(r for r in nxt if is_preprocessing(g.layers[r]))
                raise ModelError(
                    f"{where(bad)}: preprocessing layers run in the batch gather, so they go directly on a model "
                    "Input (a lookup, Hashing or Discretization may be followed by one CategoryEncoding)"
                )
            break
        if nin + k in g.outputs:
            raise ModelError(f"{_name(g.layers[k])} is a model output; preprocessing layers feed other layers")
        chains[i] = [g.layers[c] for c in chain]
        taken.update(chain)
        end[i] = nin + k
    for k, layer in enumerate(g.layers):
        if is_preprocessing(layer) and k not in taken:
            raise ModelError(
                f"{where(k)}: preprocessing layers run in the batch gather, so they go directly on a model Input "
                "(a lookup, Hashing or Discretization may be followed by one CategoryEncoding)"
            )
    if not taken:
        return g, chains
    keep = [k for k in range(len(g.layers)) if k not in taken]
    ids = {end[i]: i for i in range(nin)}
    for n, k in enumerate(keep):
        ids[nin + k] = nin + n
    pos = {k: n for n, k in enumerate(keep)}
    g2 = Graph(
        g.inputs,
        [g.layers[k] for k in keep],
        [[ids[t] for t in g.reads[k]] for k in keep],
        [ids[t] for t in g.outputs],
        g.output_tensors,
        [pos[g.shares[k]] if g.shares and g.shares[k] >= 0 else -1 for k in keep],
        g.output_keys,
    )
    return g2, chains
