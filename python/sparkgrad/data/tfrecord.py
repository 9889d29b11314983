"""TFRecord files: reading, writing and CRC32C, byte-compatible with TensorFlow.

The work happens in C (``sparkgrad._core``); these are thin Python faces.
Paths may be local, ``file://...``, ``/dbfs/...`` or ``dbfs:/...`` (read as
``/dbfs/...``). Compression is ``None``, ``"ZLIB"`` or ``"GZIP"`` (the whole
stream, as TensorFlow writes it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from sparkgrad import _core

TFRecordWriter = _core.TFRecordWriter
crc32c = _core.crc32c
masked_crc32c = _core.masked_crc32c


def tfrecord_iterator(
    path: str | os.PathLike, compression: str | None = None, verify_crc: bool = True
) -> Iterator[bytes]:
    """Yields every record of one TFRecord file as bytes.

    Raises TruncatedRecordError / CorruptRecordError (with ``path`` and
    ``offset`` attributes) on damaged files; ``verify_crc=False`` skips the
    CRC checks (the framing is still checked).
    """
    return _core.TFRecordReader(os.fspath(path), compression, verify_crc)


def read_records(
    data: bytes | bytearray | memoryview, compression: str | None = None, verify_crc: bool = True
) -> list[bytes]:
    """All records of a TFRecord stream held in memory."""
    return list(_core.TFRecordReader(data=data, compression=compression, verify_crc=verify_crc))


def write_records(path: str | os.PathLike, records, compression: str | None = None) -> int:
    """Writes an iterable of bytes as one TFRecord file; returns the count."""
    n = 0
    with TFRecordWriter(os.fspath(path), compression) as writer:
        for record in records:
            writer.write(record)
            n += 1
    return n
