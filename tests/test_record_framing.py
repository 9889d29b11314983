"""TFRecord framing: CRC32C, reader and writer, compression, bad input."""

from __future__ import annotations

import gzip
import os
import struct
import threading
import zlib

import pytest
from sparkgrad import _core
from sparkgrad.data import TFRecordWriter, read_records, tfrecord_iterator, write_records
from sparkgrad.errors import CorruptRecordError, InvalidArgumentError, SparkgradIOError, TruncatedRecordError


def crc32c_reference(data: bytes) -> int:
    """Bit-at-a-time CRC32C, independent of the C code."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return (
        header
        + struct.pack("<I", mask(crc32c_reference(header)))
        + data
        + struct.pack("<I", mask(crc32c_reference(data)))
    )


RECORDS = [b"", b"a", b"hello world", bytes(range(256)) * 3]


def test_crc32c_vectors():
    assert _core.crc32c(b"123456789") == 0xE3069283
    assert _core.crc32c(bytes(32)) == 0x8A9136AA
    assert _core.masked_crc32c(b"") == 0xA282EAD8
    assert _core.crc32c(b"6789", _core.crc32c(b"12345")) == 0xE3069283
    assert isinstance(_core.crc32c_hardware(), bool)
    for n in (0, 1, 7, 8, 9, 63, 100):
        data = bytes((i * 13) & 0xFF for i in range(n))
        assert _core.crc32c(data) == crc32c_reference(data)


def test_writer_output_matches_reference_framing(tmp_path):
    path = tmp_path / "a.tfrecord"
    assert write_records(path, RECORDS) == len(RECORDS)
    assert path.read_bytes() == b"".join(frame(r) for r in RECORDS)
    assert list(tfrecord_iterator(path)) == RECORDS


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB", "gzip"])
def test_compressed_round_trip_and_stdlib_compatibility(tmp_path, compression, inflate):
    path = tmp_path / "c.tfrecord"
    with TFRecordWriter(str(path), compression=compression) as w:
        for r in RECORDS:
            w.write(r)
    raw = path.read_bytes()
    plain = gzip.decompress(raw) if compression.upper() == "GZIP" else zlib.decompress(raw)
    assert plain == b"".join(frame(r) for r in RECORDS)
    assert list(tfrecord_iterator(path, compression=compression)) == RECORDS
    assert read_records(raw, compression=compression) == RECORDS


def test_concatenated_gzip_members(tmp_path, inflate):
    path = tmp_path / "cat.tfrecord.gz"
    path.write_bytes(gzip.compress(frame(b"one")) + gzip.compress(frame(b"two") + frame(b"three")))
    assert list(tfrecord_iterator(path, "GZIP")) == [b"one", b"two", b"three"]


def test_large_records_cross_window_boundaries(tmp_path, inflate):
    big = [bytes([i]) * (1 << 20) + b"x" * i for i in range(7)]
    path = tmp_path / "big.tfrecord"
    write_records(path, big)
    assert list(tfrecord_iterator(path)) == big
    write_records(tmp_path / "big.gz", big, compression="GZIP")
    assert list(tfrecord_iterator(tmp_path / "big.gz", "GZIP")) == big


def test_path_forms(tmp_path):
    path = tmp_path / "p.tfrecord"
    write_records(path, [b"x"])
    assert list(tfrecord_iterator(f"file://{path}")) == [b"x"]
    with pytest.raises(SparkgradIOError, match="/dbfs/nowhere/x.tfrecord"):
        tfrecord_iterator("dbfs:/nowhere/x.tfrecord")
    with pytest.raises(SparkgradIOError, match="cannot open"):
        tfrecord_iterator(tmp_path / "missing")


def test_bad_compression_name():
    with pytest.raises(InvalidArgumentError, match="compression"):
        read_records(b"", compression="LZ4")


def test_writer_closed_and_flush(tmp_path):
    path = tmp_path / "f.tfrecord"
    w = TFRecordWriter(str(path))
    w.write(b"abc")
    w.flush()
    assert path.read_bytes() == frame(b"abc")
    w.close()
    w.close()
    with pytest.raises(Exception, match="closed"):
        w.write(b"x")


# ---- bad input: each a named exception with the file and the byte offset ----


def _read_file(tmp_path, data: bytes, **kw):
    path = tmp_path / "bad.tfrecord"
    path.write_bytes(data)
    return list(tfrecord_iterator(path, **kw)), str(path)


def test_empty_file_has_no_records(tmp_path):
    assert _read_file(tmp_path, b"")[0] == []
    assert read_records(b"") == []


def test_zero_length_records(tmp_path):
    assert _read_file(tmp_path, frame(b"") * 3)[0] == [b"", b"", b""]


def test_truncated_header(tmp_path):
    good = frame(b"abc")
    with pytest.raises(TruncatedRecordError, match="truncated record at byte 19") as info:
        _read_file(tmp_path, good + good[:5])
    assert info.value.offset == len(good)
    assert info.value.path.endswith("bad.tfrecord")
    assert "bad.tfrecord" in str(info.value)


def test_truncated_data(tmp_path):
    good = frame(b"abcdef")
    with pytest.raises(TruncatedRecordError, match="at byte 22") as info:
        _read_file(tmp_path, good + good[:-1])
    assert info.value.offset == 22


def test_bad_length_crc(tmp_path):
    data = bytearray(frame(b"abc"))
    data[9] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="length CRC mismatch") as info:
        _read_file(tmp_path, bytes(data))
    assert info.value.offset == 0 and not isinstance(info.value, TruncatedRecordError)


def test_bad_data_crc_and_the_off_switch(tmp_path):
    data = bytearray(frame(b"ok") + frame(b"abc"))
    data[len(frame(b"ok")) + 12] ^= 0x20  # "abc" -> "Abc"
    with pytest.raises(CorruptRecordError, match="data CRC mismatch") as info:
        _read_file(tmp_path, bytes(data))
    assert info.value.offset == len(frame(b"ok"))
    assert _read_file(tmp_path, bytes(data), verify_crc=False)[0] == [b"ok", b"Abc"]


def test_absurd_length_is_not_allocated(tmp_path, inflate):
    header = struct.pack("<Q", 1 << 60)
    data = header + struct.pack("<I", mask(crc32c_reference(header))) + b"\0" * 16
    with pytest.raises(TruncatedRecordError, match="1152921504606846976") as info:
        _read_file(tmp_path, data)
    assert info.value.offset == 0
    with pytest.raises(TruncatedRecordError):
        read_records(gzip.compress(data), compression="GZIP")
    with pytest.raises(TruncatedRecordError):
        read_records(data)
    # From a FIFO, whose size is unknown, the window grows only as bytes arrive.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(data), daemon=True)
    writer.start()
    with pytest.raises(TruncatedRecordError, match="1152921504606846976"):
        list(tfrecord_iterator(str(fifo)))
    writer.join(timeout=10)
    assert not writer.is_alive()


def test_corrupt_and_truncated_gzip(tmp_path, inflate):
    blob = gzip.compress(frame(b"abc" * 100))
    with pytest.raises(TruncatedRecordError, match="GZIP"):
        _read_file(tmp_path, blob[:-10], compression="GZIP")
    broken = bytearray(blob)
    broken[15] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        _read_file(tmp_path, bytes(broken), compression="GZIP")
    with pytest.raises(CorruptRecordError, match="GZIP"):
        _read_file(tmp_path, b"not gzip at all", compression="GZIP")
