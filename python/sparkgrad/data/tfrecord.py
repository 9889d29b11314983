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
from sparkgrad._core import TFRecordWriter, crc32c, masked_crc32c  # C types; documented in _core.pyi

__all__ = ["TFRecordWriter", "crc32c", "masked_crc32c", "read_records", "tfrecord_iterator", "write_records"]


def tfrecord_iterator(
    path: str | os.PathLike, compression: str | None = None, verify_crc: bool = True
) -> Iterator[bytes]:
    """Every record of one TFRecord file, as bytes, read by the C reader (TensorFlow's ``tf_record_iterator``).

    ```python
    for record in tfrecord_iterator("/dbfs/data/train/part-r-00000"):
        example = decode_example(record)
    ```

    Args:
        path: A local path, ``file://...``, ``/dbfs/...`` or ``dbfs:/...``.
        compression: None, ``"ZLIB"`` or ``"GZIP"`` (the whole stream, as TensorFlow writes it).
        verify_crc: Check each record's CRC32C; False skips it (the framing is still checked).

    Returns:
        An iterator of records; its ``offset`` is the stream offset of the last record returned.

    Raises:
        SparkgradIOError: The file cannot be opened.
        CorruptRecordError: A record fails its CRC or has an impossible length (with ``path`` and
            ``offset`` attributes).
        TruncatedRecordError: The file ends inside a record.
    """
    return _core.TFRecordReader(os.fspath(path), compression, verify_crc)


def read_records(
    data: bytes | bytearray | memoryview, compression: str | None = None, verify_crc: bool = True
) -> list[bytes]:
    """All records of a TFRecord stream held in memory, e.g. a file's bytes fetched over HTTP.

    Args:
        data: The stream's bytes.
        compression: None, ``"ZLIB"`` or ``"GZIP"``.
        verify_crc: Check each record's CRC32C.

    Raises:
        CorruptRecordError: A record fails its CRC or has an impossible length.
        TruncatedRecordError: The stream ends inside a record.
    """
    return list(_core.TFRecordReader(data=data, compression=compression, verify_crc=verify_crc))


def write_records(path: str | os.PathLike, records, compression: str | None = None) -> int:
    """Writes records as one TFRecord file, byte-compatible with TensorFlow's ``TFRecordWriter``.

    ```python
    write_records("train.tfrecord", (encode_example({"x": row, "label": y}) for row, y in zip(xs, ys)))
    ```

    Args:
        path: The file to write (created or truncated).
        records (Iterable[bytes]): The records (bytes-like objects).
        compression: None, ``"ZLIB"`` or ``"GZIP"``.

    Returns:
        The number of records written.
    """
    n = 0
    with TFRecordWriter(os.fspath(path), compression) as writer:
        for record in records:
            writer.write(record)
            n += 1
    return n
