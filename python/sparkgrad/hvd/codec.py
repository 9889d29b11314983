"""A small tagged binary codec for the objects hvd.broadcast_object / allgather_object move (no pickle on the wire).

Supported: None, bool, int (any size), float, str, bytes (and bytearray /
memoryview, decoded as bytes), list, tuple, dict (keys of these types), NumPy
arrays (dtype, shape and raw bytes, C order; not object dtype) and NumPy
scalars. Anything else is a TypeError naming its type and where it sits.
Layout: one tag byte per value, lengths as little-endian u64, ints as a
length and their two's complement bytes, floats as IEEE binary64.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

MAX_DEPTH = 100
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")


def encode(obj: Any) -> bytes:
    out = bytearray()
    _encode(obj, out, "obj", 0)
    return bytes(out)


def _put_len(out: bytearray, n: int) -> None:
    out += _U64.pack(n)


def _put_blob(out: bytearray, data: bytes) -> None:
    _put_len(out, len(data))
    out += data


def _encode(obj: Any, out: bytearray, where: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    if obj is None:
        out += b"N"
    elif obj is True or obj is False:
        out += b"T" if obj else b"F"
    elif isinstance(obj, (np.ndarray, np.generic)):
        arr = np.asarray(obj)
        if arr.dtype.hasobject or arr.dtype.fields is not None:
            raise TypeError(f"{where}: NumPy arrays of dtype {arr.dtype} cannot be sent (plain dtypes only)")
        out += b"a" if isinstance(obj, np.ndarray) else b"g"
        _put_blob(out, arr.dtype.str.encode("ascii"))
        _put_len(out, arr.ndim)
        for dim in arr.shape:
            _put_len(out, dim)
        _put_blob(out, np.ascontiguousarray(arr).tobytes())
    elif isinstance(obj, int):
        n = int(obj)
        out += b"i"
        _put_blob(out, n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True))
    elif isinstance(obj, float):
        out += b"f" + _F64.pack(float(obj))
    elif isinstance(obj, str):
        out += b"s"
        _put_blob(out, obj.encode("utf-8", "surrogatepass"))
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        out += b"b"
        _put_blob(out, bytes(obj))
    elif isinstance(obj, (list, tuple)):
        out += b"l" if isinstance(obj, list) else b"t"
        _put_len(out, len(obj))
        for i, item in enumerate(obj):
            _encode(item, out, f"{where}[{i}]", depth + 1)
    elif isinstance(obj, dict):
        out += b"d"
        _put_len(out, len(obj))
        for key, value in obj.items():
            _encode(key, out, f"{where} key {key!r}", depth + 1)
            _encode(value, out, f"{where}[{key!r}]", depth + 1)
    else:
        raise TypeError(
            f"{where}: cannot send a {type(obj).__module__}.{type(obj).__qualname__}; broadcast_object and "
            "allgather_object take None, bool, int, float, str, bytes, list, tuple, dict and NumPy arrays"
        )


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError(
                f"truncated object encoding: {what} needs {n} bytes at offset {self.pos}, "
                f"{len(self.data) - self.pos} left"
            )
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def length(self, what: str) -> int:
        return _U64.unpack(self.take(8, what))[0]

    def blob(self, what: str) -> bytes:
        return bytes(self.take(self.length(what), what))


def decode(data: bytes) -> Any:
    reader = _Reader(data)
    obj = _decode(reader, 0)
    if reader.pos != len(reader.data):
        raise ValueError(
            f"object encoding has {len(reader.data) - reader.pos} bytes after its end (offset {reader.pos})"
        )
    return obj


def _decode(r: _Reader, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise ValueError(f"object encoding nested deeper than {MAX_DEPTH} levels at offset {r.pos}")
    at = r.pos
    tag = bytes(r.take(1, "a tag"))
    if tag == b"N":
        return None
    if tag in (b"T", b"F"):
        return tag == b"T"
    if tag == b"i":
        return int.from_bytes(r.blob("an int"), "little", signed=True)
    if tag == b"f":
        return _F64.unpack(r.take(8, "a float"))[0]
    if tag == b"s":
        return r.blob("a str").decode("utf-8", "surrogatepass")
    if tag == b"b":
        return r.blob("bytes")
    if tag in (b"l", b"t"):
        n = r.length("a sequence length")
        if n > len(r.data) - r.pos:  # every item takes at least one byte
            raise ValueError(f"object encoding: a sequence of {n} items at offset {at} exceeds the data")
        items = [_decode(r, depth + 1) for _ in range(n)]
        return items if tag == b"l" else tuple(items)
    if tag == b"d":
        n = r.length("a dict length")
        if n > len(r.data) - r.pos:
            raise ValueError(f"object encoding: a dict of {n} items at offset {at} exceeds the data")
        out = {}
        for _ in range(n):
            key = _decode(r, depth + 1)
            out[key] = _decode(r, depth + 1)
        return out
    if tag in (b"a", b"g"):
        dtype = np.dtype(r.blob("a dtype").decode("ascii"))
        if dtype.hasobject:
            raise ValueError(f"object encoding: object dtype at offset {at}")
        ndim = r.length("an array's ndim")
        if ndim > 64:
            raise ValueError(f"object encoding: array of {ndim} dimensions at offset {at}")
        shape = tuple(r.length("an array's shape") for _ in range(ndim))
        raw = r.blob("an array's data")
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if count * dtype.itemsize != len(raw):
            raise ValueError(
                f"object encoding: array at offset {at} of shape {shape} and dtype {dtype} needs "
                f"{count * dtype.itemsize} bytes, has {len(raw)}"
            )
        arr = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        return arr if tag == b"a" else arr[()]
    raise ValueError(f"object encoding: unknown tag {tag!r} at offset {at}")
