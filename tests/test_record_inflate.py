"""GZIP / ZLIB records decode the same through ISA-L and zlib: same records,
and on damaged input the same exception, message and offset."""

from __future__ import annotations

import gzip
import os
import random
import struct
import threading
import zlib

import pytest
from sparkgrad import _core, build_info
from sparkgrad.data import read_records, tfrecord_iterator, write_records
from sparkgrad.errors import InvalidArgumentError, SparkgradError

HAVE_ISAL = _core.build_info()["isal"] is not None
needs_isal = pytest.mark.skipif(not HAVE_ISAL, reason="built without ISA-L")
BACKENDS = ["isal", "zlib"]


def masked_crc(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frames(records) -> bytes:
    out = []
    for r in records:
        header = struct.pack("<Q", len(r))
        out.append(header + struct.pack("<I", masked_crc(header)) + r + struct.pack("<I", masked_crc(r)))
    return b"".join(out)


def outcome(monkeypatch, backend, source, compression):
    """Records read before the first error, and that error as (type, message, offset)."""
    monkeypatch.setenv("SPARKGRAD_INFLATE", backend)
    got = []
    try:
        if isinstance(source, bytes):
            return read_records(source, compression=compression), None
        for record in tfrecord_iterator(source, compression):
            got.append(record)
    except SparkgradError as e:
        return got, (type(e), str(e), getattr(e, "offset", None))
    return got, None


def both(monkeypatch, source, compression):
    results = {b: outcome(monkeypatch, b, source, compression) for b in BACKENDS}
    assert results["isal"] == results["zlib"]
    return results["zlib"]


rng = random.Random(16)
TEXT = [(b"record %d " % i) * (1 + i % 40) for i in range(300)]
NOISE = [rng.randbytes(rng.randrange(0, 3000)) for _ in range(60)]
ONE_BYTE = [bytes([i % 256]) for i in range(500)]


def stdlib_corpus():
    plain_text, plain_noise, plain_one = frames(TEXT), frames(NOISE), frames(ONE_BYTE)
    out = {}
    for level in (0, 1, 6, 9):
        out[f"gzip-{level}"] = ("GZIP", gzip.compress(plain_text + plain_noise, compresslevel=level), TEXT + NOISE)
        out[f"zlib-{level}"] = ("ZLIB", zlib.compress(plain_text + plain_noise, level), TEXT + NOISE)
    out["gzip-one-byte"] = ("GZIP", gzip.compress(plain_one), ONE_BYTE)
    out["zlib-one-byte"] = ("ZLIB", zlib.compress(plain_one), ONE_BYTE)
    members = b"".join(gzip.compress(frames(TEXT[i : i + 50]), compresslevel=1 + i % 9) for i in range(0, 300, 50))
    out["gzip-members"] = ("GZIP", members, TEXT)
    out["gzip-empty-member"] = ("GZIP", gzip.compress(b"") + gzip.compress(frames([b"x"])), [b"x"])
    out["gzip-only-empty-member"] = ("GZIP", gzip.compress(b""), [])
    out["zlib-empty-stream"] = ("ZLIB", zlib.compress(b""), [])
    out["gzip-empty-file"] = ("GZIP", b"", [])
    out["zlib-empty-file"] = ("ZLIB", b"", [])
    # A big stream (over the reader's 256 KiB input chunk) of many members.
    big = [rng.randbytes(20000) + b"z" * 30000 for _ in range(40)]
    out["gzip-big-members"] = ("GZIP", b"".join(gzip.compress(frames(big[i : i + 7])) for i in range(0, 40, 7)), big)
    return out


CORPUS = stdlib_corpus()


@needs_isal
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_stdlib_streams_decode_identically(tmp_path, monkeypatch, name):
    compression, blob, want = CORPUS[name]
    path = tmp_path / name
    path.write_bytes(blob)
    assert both(monkeypatch, path, compression) == (want, None)
    assert both(monkeypatch, blob, compression) == (want, None)


@needs_isal
@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_own_writer_streams_decode_identically(tmp_path, monkeypatch, compression):
    for name, records in [("text", TEXT), ("noise", NOISE), ("one", ONE_BYTE), ("empty", []), ("blank", [b""] * 9)]:
        path = tmp_path / f"{name}.{compression}"
        write_records(path, records, compression=compression)
        assert both(monkeypatch, path, compression) == (records, None)
        assert both(monkeypatch, path.read_bytes(), compression) == (records, None)


def damaged():
    """(name, compression, bytes) of broken streams."""
    gz = gzip.compress(frames(TEXT[:80]), compresslevel=6)
    zz = zlib.compress(frames(TEXT[:80]), 6)
    out = []
    for cut in (1, 5, 10, 11, 20, len(gz) // 3, len(gz) // 2, len(gz) - 9, len(gz) - 8, len(gz) - 4, len(gz) - 1):
        out.append((f"gzip-cut-{cut}", "GZIP", gz[:cut]))
    for cut in (1, 2, 3, len(zz) // 2, len(zz) - 5, len(zz) - 4, len(zz) - 1):
        out.append((f"zlib-cut-{cut}", "ZLIB", zz[:cut]))
    for pos in (3, 5, 10, 11, 12, 40, len(gz) // 4, len(gz) // 2, len(gz) - 20, len(gz) - 10):
        for bit in (0x01, 0x80):
            b = bytearray(gz)
            b[pos] ^= bit
            out.append((f"gzip-flip-{pos}-{bit}", "GZIP", bytes(b)))
    for pos in (0, 1, 2, 7, len(zz) // 3, len(zz) // 2, len(zz) - 6):
        b = bytearray(zz)
        b[pos] ^= 0x10
        out.append((f"zlib-flip-{pos}", "ZLIB", bytes(b)))
    for pos, what in ((-8, "crc"), (-5, "crc"), (-4, "isize"), (-1, "isize")):
        b = bytearray(gz)
        b[pos] ^= 0x01
        out.append((f"gzip-bad-{what}{pos}", "GZIP", bytes(b)))
    b = bytearray(zz)
    b[-1] ^= 0x01
    out.append(("zlib-bad-adler", "ZLIB", bytes(b)))
    out.append(("gzip-trailing-garbage", "GZIP", gz + b"garbage!"))
    out.append(("gzip-trailing-zeros", "GZIP", gz + b"\0" * 16))
    out.append(("gzip-second-member-cut", "GZIP", gz + gz[: len(gz) // 2]))
    out.append(("zlib-trailing-garbage", "ZLIB", zz + b"x"))
    out.append(("not-gzip", "GZIP", b"not gzip at all"))
    out.append(("not-zlib", "ZLIB", b"not zlib at all"))
    return out


DAMAGED = damaged()
# Bits of the gzip header that change no data: FTEXT, the modification time.
HARMLESS = {"gzip-flip-3-1", "gzip-flip-5-1", "gzip-flip-5-128"}


@needs_isal
@pytest.mark.parametrize("name, compression, blob", DAMAGED, ids=[d[0] for d in DAMAGED])
def test_damaged_streams_fail_identically(tmp_path, monkeypatch, name, compression, blob):
    path = tmp_path / name
    path.write_bytes(blob)
    got, error = both(monkeypatch, path, compression)
    if name in HARMLESS:
        assert error is None and len(got) == 80
        return
    assert error is not None, f"{name} read as {len(got)} records without an error"
    assert str(path) in error[1]
    assert both(monkeypatch, blob, compression)[1] is not None


def test_backend_is_reported_and_the_override_is_checked(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARKGRAD_INFLATE", "zlib")
    assert build_info()["inflate"] == "zlib"
    monkeypatch.delenv("SPARKGRAD_INFLATE")
    assert build_info()["inflate"] == ("isal" if HAVE_ISAL else "zlib")
    if HAVE_ISAL:
        assert build_info()["isal"].startswith("2.")
    monkeypatch.setenv("SPARKGRAD_INFLATE", "lz4")
    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(frames([b"x"])))
    with pytest.raises(InvalidArgumentError, match="SPARKGRAD_INFLATE must be 'zlib' or 'isal', not 'lz4'"):
        list(tfrecord_iterator(path, "GZIP"))
    # Plain records never look at it.
    write_records(tmp_path / "p", [b"y"])
    assert list(tfrecord_iterator(tmp_path / "p")) == [b"y"]


CHUNK = 256 << 10  # the reader's compressed read size (TFR_ZIN)


def fast_frames(tmp_path, records) -> bytes:
    path = tmp_path / "frames.tfrecord"
    write_records(path, records)
    return path.read_bytes()


@needs_isal
def test_file_read_boundaries(tmp_path, monkeypatch):
    """Member ends, damage and cuts at the reader's 256 KiB read boundaries."""
    r = random.Random(7)
    small = fast_frames(tmp_path, [r.randbytes(r.randrange(10, 3000)) for _ in range(40)])
    cases = []
    for k in (-9, -8, -5, -4, -1, 0, 1, 4, 8):
        size = CHUNK
        for _ in range(4):  # a stored gzip member ending at byte CHUNK + k exactly
            member = gzip.compress(fast_frames(tmp_path, [b"f" * size]), compresslevel=0)
            size += CHUNK + k - len(member)
        member = gzip.compress(fast_frames(tmp_path, [r.randbytes(size)]), compresslevel=0)
        assert len(member) == CHUNK + k
        blob = member + gzip.compress(small)
        cases += [blob, blob[:-3], blob[: len(member) + 20] + b"\xff" + blob[len(member) + 21 :]]
    big = gzip.compress(small * 120, 6)
    assert len(big) > CHUNK + 100
    for pos in (CHUNK - 5, CHUNK - 1, CHUNK, CHUNK + 1, CHUNK + 4):
        cases += [big[:pos], big[:pos] + bytes([big[pos] ^ 0x55]) + big[pos + 1 :]]
    path = tmp_path / "b.gz"
    for blob in cases:
        path.write_bytes(blob)
        both(monkeypatch, path, "GZIP")


def test_a_pipe_is_read_with_zlib_and_fails_the_same(tmp_path, monkeypatch):
    """A FIFO cannot be read twice for the hand-over: it is inflated by zlib throughout."""
    blob = gzip.compress(frames(TEXT[:30]))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for data in (blob, blob[:-3], blob[:40] + bytes([blob[40] ^ 1]) + blob[41:]):
        results = []
        for backend in BACKENDS if HAVE_ISAL else ["zlib"]:
            writer = threading.Thread(target=fifo.write_bytes, args=(data,))
            writer.start()
            results.append(outcome(monkeypatch, backend, fifo, "GZIP"))
            writer.join(timeout=10)
            assert not writer.is_alive()
        assert all(r == results[0] for r in results)
