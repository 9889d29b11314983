"""tf.train.Example: encoding, decoding, and schema-driven batch parsing.

Encoding takes a dict ``name -> value`` where a value is

- ``bytes`` / ``str`` (one bytes value) or a list of them -> BytesList;
- an integer NumPy array or a list of ints (``bool`` too) -> Int64List;
- a floating NumPy array or a list of floats -> FloatList;
- an explicit ``(kind, values)`` pair with kind ``"bytes"|"float"|"int64"``
  (needed for an empty Python list, whose type cannot be guessed).

Parsing follows TensorFlow's ``parse_example``; the schema is a dict
``name -> FixedLenFeature | VarLenFeature | RawBytesFeature`` compiled once
(``Schema``) and run in C:

- ``FixedLenFeature(shape, dtype, default=None)``: exactly ``prod(shape)``
  values of ``dtype`` (``"int64"``, ``"float32"``, ``"bytes"``) per record,
  batched to ``[N, *shape]``; a missing feature takes ``default`` or raises
  SchemaError.
- ``VarLenFeature(dtype)``: any number of values -> ``Ragged(values, row_splits)``.
- ``RawBytesFeature(shape, dtype="float32", scale=1.0, raw_dtype="uint8")``:
  one bytes value holding ``prod(shape)`` raw ``raw_dtype`` values, decoded to
  ``dtype`` times ``scale`` (``image_raw`` -> ``float32[784] * (1/255)``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from sparkgrad import _core
from sparkgrad.errors import InvalidArgumentError, SchemaError

BYTES, FLOAT, INT64 = 1, 2, 3
_KINDS = {"bytes": BYTES, "float": FLOAT, "float32": FLOAT, "int64": INT64}
_DTYPE_CODES = {"int64": 0, "float32": 1, "uint8": 2, "bytes": 3}


class Ragged(NamedTuple):
    """The values of a `VarLenFeature` over a batch: record ``i`` holds ``values[row_splits[i]:row_splits[i+1]]``."""

    values: Any
    """Every record's values, concatenated: an int64 or float32 array, or a list of bytes."""
    row_splits: np.ndarray
    """int64 offsets into `values`, one more than the records (``row_splits[0] == 0``)."""

    def row(self, i: int):
        """The values of record ``i``."""
        return self.values[self.row_splits[i] : self.row_splits[i + 1]]


def _dtype_name(dtype) -> str:
    if dtype in (bytes, "bytes", "string", object):
        return "bytes"
    name = np.dtype(dtype).name
    if name not in ("int64", "float32", "uint8"):
        raise SchemaError(f"unsupported dtype {dtype!r}: use int64, float32, uint8 or bytes")
    return name


def _shape(shape) -> tuple[int, ...]:
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise SchemaError(f"shape {shape} has a negative dimension")
    return shape


@dataclass(frozen=True)
class FixedLenFeature:
    """A feature with exactly ``prod(shape)`` values per record, batched to ``[N, *shape]``.

    As TensorFlow's ``tf.io.FixedLenFeature``.

    ```python
    schema = {"image": FixedLenFeature([784], "float32"), "label": FixedLenFeature([], "int64")}
    ```

    A record without the feature takes ``default``; without a default it is a SchemaError (naming the
    record and the feature), and so is a record with another number of values.
    """

    shape: tuple[int, ...] | int
    """The shape of one record's value: ``[]`` or ``()`` for a scalar, an int for a vector."""
    dtype: Any
    """``"int64"``, ``"float32"`` or ``"bytes"`` (NumPy dtypes and ``bytes`` are accepted too)."""
    default: Any = None
    """Value for records that lack the feature: a scalar (repeated) or ``prod(shape)`` values; None: required."""

    def _spec(self, name: str) -> tuple:
        dtype = _dtype_name(self.dtype)
        if dtype == "uint8":
            raise SchemaError(f"feature {name!r}: FixedLenFeature dtype must be int64, float32 or bytes")
        shape = _shape(self.shape)
        default = self.default
        if default is not None:
            count = math.prod(shape)
            if dtype == "bytes":
                default = [default] * count if isinstance(default, (bytes, str)) else list(default)
                default = [d.encode() if isinstance(d, str) else bytes(d) for d in default]
            else:
                arr = np.asarray(default, dtype=dtype)
                default = np.broadcast_to(arr, shape).ravel() if arr.size == 1 else arr.ravel()
        return (name, 0, _KINDS[dtype], _DTYPE_CODES[dtype], shape, default, 2, 1.0)


@dataclass(frozen=True)
class VarLenFeature:
    """A feature with any number of values per record (none included), parsed to a `Ragged`.

    As TensorFlow's ``tf.io.VarLenFeature``, whose SparseTensor the `Ragged` replaces.
    """

    dtype: Any
    """``"int64"``, ``"float32"`` or ``"bytes"``."""

    def _spec(self, name: str) -> tuple:
        dtype = _dtype_name(self.dtype)
        if dtype == "uint8":
            raise SchemaError(f"feature {name!r}: VarLenFeature dtype must be int64, float32 or bytes")
        return (name, 1, _KINDS[dtype], _DTYPE_CODES[dtype], (), None, 2, 1.0)


@dataclass(frozen=True)
class RawBytesFeature:
    """A bytes feature holding one record's raw array, decoded in C to ``[N, *shape]`` of ``dtype`` times ``scale``.

    What TensorFlow code does with ``tf.io.decode_raw`` after parsing, in one pass:
    ``RawBytesFeature([784], scale=1 / 255)`` turns MNIST's ``image_raw`` (784 uint8 pixels) into
    float32 values in [0, 1]. A bytes value of the wrong length is a SchemaError.
    """

    shape: tuple[int, ...] | int
    """The shape of one record's array."""
    dtype: Any = "float32"
    """The output dtype: ``"float32"`` or ``"uint8"`` (uint8 needs uint8 raw data and scale 1)."""
    scale: float = 1.0
    """Factor applied to every value (float32 output)."""
    raw_dtype: Any = "uint8"
    """The dtype of the stored bytes: ``"uint8"`` or ``"float32"`` (little-endian)."""

    def _spec(self, name: str) -> tuple:
        dtype, raw = _dtype_name(self.dtype), _dtype_name(self.raw_dtype)
        if dtype not in ("uint8", "float32") or raw not in ("uint8", "float32"):
            raise SchemaError(f"feature {name!r}: RawBytesFeature decodes uint8/float32 bytes to uint8/float32")
        if dtype == "uint8" and (raw != "uint8" or self.scale != 1.0):
            raise SchemaError(f"feature {name!r}: a uint8 output needs uint8 raw data and scale 1")
        return (name, 2, BYTES, _DTYPE_CODES[dtype], _shape(self.shape), None, _DTYPE_CODES[raw], float(self.scale))


FeatureSpec = FixedLenFeature | VarLenFeature | RawBytesFeature


class Schema:
    """A parsing schema compiled once to C; reusable and safe to share between threads.

    It pickles: it is compiled again where it is unpickled, e.g. on Spark executors.

    Functions that take a schema also take the plain dict and compile it on each call; build a Schema
    once when parsing many batches.

    Args:
        features: ``{name: FixedLenFeature | VarLenFeature | RawBytesFeature}``, or another Schema.

    Attributes:
        features (dict): The feature declarations, by name.

    Raises:
        SchemaError: No features, a declaration of another type, or an unsupported dtype or shape.
    """

    def __init__(self, features: Mapping[str, FeatureSpec]):
        if isinstance(features, Schema):
            features = features.features
        if not features:
            raise SchemaError("a schema needs at least one feature")
        for name, spec in features.items():
            if not isinstance(spec, (FixedLenFeature, VarLenFeature, RawBytesFeature)):
                raise SchemaError(f"feature {name!r}: {spec!r} is not a FixedLen/VarLen/RawBytes feature")
        self.features = dict(features)
        self._compiled = _core.Schema([spec._spec(name) for name, spec in self.features.items()])

    def __repr__(self) -> str:
        return f"Schema({self.features!r})"

    def __reduce__(self):
        # The compiled C schema is rebuilt on unpickling (e.g. on Spark executors).
        return (Schema, (self.features,))


def as_schema(schema: Schema | Mapping[str, FeatureSpec]) -> Schema:
    return schema if isinstance(schema, Schema) else Schema(schema)


def _wrap(out: dict, schema: Schema) -> dict:
    for name, spec in schema.features.items():
        if isinstance(spec, VarLenFeature):
            out[name] = Ragged(*out[name])
    return out


def parse_examples(records: Sequence[bytes], schema, name: str | None = None) -> dict:
    """Parses serialized ``tf.train.Example`` records into a dict of batched arrays, in C.

    As TensorFlow's ``tf.io.parse_example``.

    Args:
        records: The serialized Examples.
        schema (Schema | dict): A `Schema` or a dict of features.
        name: Names the batch in error messages (a file name).

    Returns:
        ``{feature: value}``: a ``[N, *shape]`` array for a `FixedLenFeature` or `RawBytesFeature` (bytes
        features: a list of bytes per value), a `Ragged` for a `VarLenFeature`.

    Raises:
        SchemaError: A record does not match the schema; the message names ``name``, the record index,
            the feature, what was expected and what was found.
        ExampleDecodeError: A record is not a valid Example.
    """
    schema = as_schema(schema)
    return _wrap(_core.parse_examples(schema._compiled, records, name), schema)


@dataclass(frozen=True)
class FixedLenSequenceFeature:
    """A SequenceExample feature list whose every step holds ``prod(shape)`` values.

    Batched to ``[N, max_steps, *shape]`` and padded with zeros (``b""`` for bytes);
    `parse_sequence_examples` returns the step counts beside it. As TensorFlow's
    ``tf.io.FixedLenSequenceFeature``.
    """

    shape: tuple[int, ...] | int
    """The shape of one step's value."""
    dtype: Any
    """``"int64"``, ``"float32"`` or ``"bytes"``."""
    allow_missing: bool = False
    """Take a record without the list as 0 steps; False: such a record is a SchemaError."""

    def _spec(self, name: str) -> tuple:
        dtype = _dtype_name(self.dtype)
        if dtype == "uint8":
            raise SchemaError(f"feature list {name!r}: dtype must be int64, float32 or bytes")
        return (name, 0, _KINDS[dtype], _DTYPE_CODES[dtype], _shape(self.shape), None, 2, 1.0)


class RaggedSequence(NamedTuple):
    """The values of a `VarLenFeature` feature list over a batch.

    Record ``i`` has the steps ``row_splits[i]`` to ``row_splits[i+1] - 1``, and step ``k`` holds
    ``values[step_splits[k]:step_splits[k+1]]``.
    """

    values: Any
    """Every step's values, concatenated."""
    step_splits: np.ndarray
    """int64 offsets of each step into `values`, one more than the steps."""
    row_splits: np.ndarray
    """int64 offsets of each record into the steps, one more than the records."""

    def row(self, i: int) -> list:
        """The steps of record ``i``, each an array (or a list of bytes) of values."""
        s = self.step_splits
        return [self.values[s[k] : s[k + 1]] for k in range(self.row_splits[i], self.row_splits[i + 1])]


def parse_sequence_examples(
    records: Sequence[bytes],
    context_features: Schema | Mapping[str, FeatureSpec] | None = None,
    sequence_features: Mapping[str, FixedLenSequenceFeature | VarLenFeature] | None = None,
    name: str | None = None,
) -> tuple[dict, dict, dict]:
    """Parses serialized ``tf.train.SequenceExample`` records as ``tf.io.parse_sequence_example`` does.

    Args:
        records: The serialized SequenceExamples.
        context_features: The schema of the context (as for `parse_examples`); None: none parsed.
        sequence_features: ``{name: FixedLenSequenceFeature | VarLenFeature}`` for the feature lists.
        name: Names the batch in error messages.

    Returns:
        ``(context, feature_lists, lengths)``: the context as `parse_examples` returns it;
        ``feature_lists`` with a ``[N, max_steps, *shape]`` array per `FixedLenSequenceFeature` and a
        `RaggedSequence` per `VarLenFeature`; ``lengths`` with the int64 step count of each record,
        per FixedLenSequenceFeature list.

    Raises:
        SchemaError: Bad input; the message names ``name``, the record index, the feature (list and
            step), what was expected and what was found.
    """
    sequence_features = dict(sequence_features or {})
    ctx = as_schema(context_features) if context_features else None
    for key, spec in sequence_features.items():
        if not isinstance(spec, (FixedLenSequenceFeature, VarLenFeature)):
            raise SchemaError(f"feature list {key!r}: {spec!r} is not a FixedLenSequence/VarLen feature")
    lists = _core.Schema([s._spec(k) for k, s in sequence_features.items()]) if sequence_features else None
    allow = [bool(getattr(s, "allow_missing", False)) for s in sequence_features.values()]
    context, feature_lists, lengths = _core.parse_sequence_examples(
        ctx._compiled if ctx else None, lists, allow, records, name
    )
    if ctx is not None:
        _wrap(context, ctx)
    for key, value in feature_lists.items():
        if isinstance(value, tuple):
            feature_lists[key] = RaggedSequence(*value)
    return context, feature_lists, lengths


def parse_example(record: bytes, schema) -> dict:
    """Parses one serialized Example.

    `parse_examples` of one record, without the batch dimension (a `VarLenFeature` gives its values).
    """
    schema = as_schema(schema)
    out = parse_examples([record], schema)
    return {k: (v.values if isinstance(v, Ragged) else v[0]) for k, v in out.items()}


def _item(key: str, value) -> tuple[str, int, Any]:
    if not isinstance(key, str):
        raise InvalidArgumentError(f"feature keys must be str, not {type(key).__name__}")
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and value[0] in _KINDS:
        kind = _KINDS[value[0]]
        return (key, kind, list(value[1]) if kind == BYTES else value[1])
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        return (key, BYTES, [bytes(value) if not isinstance(value, str) else value])
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "iub":
            return (key, INT64, value)
        if value.dtype.kind == "f":
            return (key, FLOAT, value)
        if value.dtype.kind in "SO":
            return (key, BYTES, [bytes(v) if not isinstance(v, str) else v for v in value.ravel()])
        raise InvalidArgumentError(f"feature {key!r}: cannot encode dtype {value.dtype}")
    if isinstance(value, (bool, int, np.integer)):
        return (key, INT64, [int(value)])
    if isinstance(value, (float, np.floating)):
        return (key, FLOAT, [float(value)])
    if isinstance(value, (list, tuple)):
        if not value:
            raise InvalidArgumentError(
                f"feature {key!r}: an empty list has no type; pass ('int64'|'float'|'bytes', []) "
                "or an empty NumPy array"
            )
        first = value[0]
        if isinstance(first, (bytes, bytearray, str)):
            return (key, BYTES, value)
        if all(isinstance(v, (bool, int, np.integer)) for v in value):
            return (key, INT64, np.asarray(value, dtype=np.int64))
        return (key, FLOAT, np.asarray(value, dtype=np.float32))
    raise InvalidArgumentError(f"feature {key!r}: cannot encode {type(value).__name__}")


def encode_example(features: Mapping[str, Any]) -> bytes:
    """Serializes a dict of values as a ``tf.train.Example``, byte-compatible with TensorFlow's.

    ```python
    record = encode_example({"label": 7, "image_raw": pixels.tobytes(), "score": [0.5, 0.25]})
    ```

    Args:
        features: ``{name: value}``. A value is ``bytes`` or ``str`` (one value) or a list of them
            (BytesList); an integer or bool NumPy array, an int or a list of ints (Int64List); a
            floating array, a float or a list of floats (FloatList); or an explicit
            ``(kind, values)`` pair, kind ``"bytes"``, ``"float"`` or ``"int64"`` (needed for an empty
            list, whose type cannot be guessed).

    Raises:
        InvalidArgumentError: A key that is not a str, an empty list without a kind, or a value of
            another type.
    """
    return _core.encode_example([_item(k, v) for k, v in features.items()])


def decode_example(data: bytes) -> dict:
    """Every feature of a serialized Example, without a schema.

    Returns:
        ``{name: value}``: an int64 array for an Int64List, a float32 array for a FloatList, a list of
        bytes for a BytesList, None for a Feature without a list.

    Raises:
        ExampleDecodeError: The bytes are not a valid Example (garbage protobuf, overlong varint, wrong
            wire type, non-UTF-8 key).
    """
    return _core.decode_example(data)


def encode_sequence_example(context: Mapping[str, Any], feature_lists: Mapping[str, Sequence[Any]]) -> bytes:
    """Serializes a ``tf.train.SequenceExample``.

    Args:
        context: The context features, as `encode_example` takes them.
        feature_lists: ``{name: steps}``: each a sequence of per-step values of one kind, inferred from
            the first step, or given explicitly as ``(kind, steps)`` (needed for an empty list).

    Raises:
        InvalidArgumentError: An empty feature list without a kind, or a value that cannot be encoded.
    """
    ctx = [_item(k, v) for k, v in context.items()]
    lists = []
    for key, steps in feature_lists.items():
        if isinstance(steps, tuple) and len(steps) == 2 and isinstance(steps[0], str) and steps[0] in _KINDS:
            kind, steps = _KINDS[steps[0]], steps[1]
        else:
            if not steps:
                raise InvalidArgumentError(f"feature list {key!r}: empty; pass (kind, [])")
            kind = _item(key, steps[0])[1]
        lists.append((key, kind, [_item(key, (_kind_name(kind), s))[2] for s in steps]))
    return _core.encode_sequence_example(ctx, lists)


def _kind_name(kind: int) -> str:
    return {BYTES: "bytes", FLOAT: "float", INT64: "int64"}[kind]


def decode_sequence_example(data: bytes) -> tuple[dict, dict]:
    """Every feature of a serialized SequenceExample, without a schema.

    Returns:
        ``(context, feature_lists)``: the context as `decode_example` returns it, and each feature list as
        a list of per-step values decoded the same way.

    Raises:
        ExampleDecodeError: The bytes are not a valid SequenceExample.
    """
    return _core.decode_sequence_example(data)
