"""TFRecordDataset: the C input pipeline (files, shards, shuffle, epochs, batches)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from sparkgrad.data import (
    FixedLenFeature,
    RawBytesFeature,
    TFRecordDataset,
    VarLenFeature,
    encode_example,
    write_records,
)
from sparkgrad.errors import CorruptRecordError, SchemaError, SparkgradIOError, SparkgradTimeout

SCHEMA = {"x": FixedLenFeature([], "int64"), "v": VarLenFeature("int64")}


@pytest.fixture
def files(tmp_path):
    """3 files x 10 records; x = 100 * file + i, v = range(i % 3)."""
    paths = []
    for f in range(3):
        p = tmp_path / f"part-{f:05d}"
        write_records(p, [encode_example({"x": 100 * f + i, "v": np.arange(i % 3)}) for i in range(10)])
        paths.append(str(p))
    (tmp_path / "_SUCCESS").write_bytes(b"")
    return paths


ALL = sorted(100 * f + i for f in range(3) for i in range(10))


def xs(ds) -> list[int]:
    return [int(x) for b in ds for x in b["x"]]


def test_batches_in_file_order_with_remainder(files, tmp_path):
    batches = list(TFRecordDataset(str(tmp_path), SCHEMA, 4))
    assert [len(b["x"]) for b in batches] == [4] * 7 + [2]
    assert xs(batches) == ALL
    assert batches[0]["v"].row_splits.tolist() == [0, 0, 1, 3, 3]
    assert batches[0]["v"].values.tolist() == [0, 0, 1]
    assert batches[0]["v"].row(2).tolist() == [0, 1]
    assert [len(b["x"]) for b in TFRecordDataset(files, SCHEMA, 4, drop_remainder=True)] == [4] * 7


def test_globs_and_file_urls(files, tmp_path):
    assert xs(TFRecordDataset(str(tmp_path / "part-*"), SCHEMA, 8)) == ALL
    assert xs(TFRecordDataset([f"file://{files[1]}"], SCHEMA, 8)) == list(range(100, 110))
    with pytest.raises(SparkgradIOError, match="no files match"):
        TFRecordDataset(str(tmp_path / "nothing-*"), SCHEMA, 8)


def test_epochs_repeat_and_batches_span_epochs(files):
    got = xs(TFRecordDataset(files[:1], SCHEMA, 3, epochs=3))
    assert got == list(range(10)) * 3
    first = next(iter(TFRecordDataset(files[:1], SCHEMA, 4, epochs=None)))
    assert first["x"].tolist() == [0, 1, 2, 3]


def test_shuffle_is_seeded_and_complete(files):
    a = xs(TFRecordDataset(files, SCHEMA, 7, shuffle_buffer=8, seed=42, epochs=2))
    b = xs(TFRecordDataset(files, SCHEMA, 7, shuffle_buffer=8, seed=42, epochs=2))
    c = xs(TFRecordDataset(files, SCHEMA, 7, shuffle_buffer=8, seed=43, epochs=2))
    assert a == b and a != c
    assert sorted(a) == sorted(ALL * 2)
    assert a != sorted(a)


@pytest.mark.parametrize("num_shards", [2, 3, 5])
def test_shards_partition_the_data(files, num_shards):
    shards = [xs(TFRecordDataset(files, SCHEMA, 4, shard_index=i, num_shards=num_shards)) for i in range(num_shards)]
    assert sorted(sum(shards, [])) == ALL
    if num_shards <= len(files):  # by file: shard i reads files i, i+n, ...
        assert shards[0][:10] == list(range(10))
        assert TFRecordDataset(files, SCHEMA, 4, shard_index=1, num_shards=2).shard_files == [files[1]]
    else:  # by record index
        assert shards[1][:2] == [1, 6]


def test_prefetch_modes_agree_and_gzip(files, tmp_path, inflate):
    expect = xs(TFRecordDataset(files, SCHEMA, 5, prefetch=0))
    assert xs(TFRecordDataset(files, SCHEMA, 5, prefetch=4)) == expect
    gz = tmp_path / "g.tfrecord.gz"
    write_records(gz, [encode_example({"x": i, "v": np.arange(1)}) for i in range(25)], compression="GZIP")
    assert xs(TFRecordDataset(gz, SCHEMA, 10, compression="GZIP")) == list(range(25))


def test_raw_image_batches(tmp_path):
    img = np.arange(784, dtype=np.int64) % 256
    write_records(
        tmp_path / "m", [encode_example({"image_raw": img.astype(np.uint8).tobytes(), "label": i}) for i in range(5)]
    )
    schema = {"image_raw": RawBytesFeature([784], scale=1 / 255), "label": FixedLenFeature([], "int64")}
    (batch,) = list(TFRecordDataset(tmp_path / "m", schema, 8))
    assert batch["image_raw"].shape == (5, 784) and batch["image_raw"].dtype == np.float32
    np.testing.assert_allclose(batch["image_raw"][0], img / 255, rtol=1e-6)
    assert batch["label"].tolist() == list(range(5))


def test_schema_error_names_file_record_and_offset(files, tmp_path):
    bad = tmp_path / "bad"
    good = encode_example({"x": 1, "v": np.arange(1)})
    write_records(bad, [good, good, encode_example({"x": 1.5})])
    with pytest.raises(SchemaError) as info:
        list(TFRecordDataset([files[0], str(bad)], SCHEMA, 2))
    msg = str(info.value)
    assert str(bad) in msg and "record 2 at byte" in msg and "'x'" in msg and "float" in msg


def test_corrupt_file_raises_during_iteration(files, tmp_path):
    data = bytearray(open(files[0], "rb").read())
    data[40] ^= 0xFF
    (tmp_path / "c").write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        list(TFRecordDataset(tmp_path / "c", SCHEMA, 4))


@pytest.mark.parametrize("parse_threads", [1, 2])
def test_waiting_is_bounded_and_releases_the_gil(tmp_path, parse_threads):
    # with 2, the caller that would make a batch itself waits for the source
    # (held by the thread blocked in open()) no longer than for a batch
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    ds = TFRecordDataset([str(fifo)], SCHEMA, 4, timeout=0.5, parse_threads=parse_threads)
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set() and len(ticks) < 10_000:
            ticks.append(1)
            time.sleep(0.01)

    t = threading.Thread(target=ticker)
    t.start()
    it = iter(ds)
    start = time.monotonic()
    with pytest.raises(SparkgradTimeout, match="waited 0.5 s for the next batch"):
        next(it)
    stop.set()
    t.join(timeout=5)
    assert 0.4 < time.monotonic() - start < 5
    assert len(ticks) >= 5  # the other Python thread ran while we waited
    # Unblock the reader thread, waiting in open() for a writer: a writer that
    # closes at once is EOF. O_NONBLOCK never waits (ENXIO while no reader).
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            break
        except OSError:
            time.sleep(0.05)
    it.close()


@pytest.mark.parametrize(
    "garbage, pattern",
    [
        (b"\x0a\x05\x0a\x03", "runs past the end"),
        (b"\x0a" + b"\xff" * 11, "overlong varint"),
        (b"\x0d\x00\x00\x00\x00", "wrong wire type 5"),
        (b"\x0a\x08\x0a\x06\x0a\x02\xc3\x28\x12\x00", "not valid UTF-8"),
    ],
)
def test_garbage_records_in_a_file_name_file_record_and_offset(tmp_path, garbage, pattern):
    from sparkgrad.errors import ExampleDecodeError

    good = encode_example({"x": 1, "v": np.arange(2)})
    path = tmp_path / "g.tfrecord"
    write_records(path, [good, garbage])
    with pytest.raises(ExampleDecodeError, match=pattern) as info:
        list(TFRecordDataset(path, SCHEMA, 4))
    offset = 12 + len(good) + 4
    assert f"'{path}': record 1 at byte {offset}: " in str(info.value)


def test_repeating_forever_over_no_records_ends(tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    assert list(TFRecordDataset(tmp_path / "empty", SCHEMA, 4, epochs=None, timeout=10)) == []
    # a shard that gets no records of a 1-record file also ends
    write_records(tmp_path / "one", [encode_example({"x": 1, "v": np.arange(1)})])
    assert xs(TFRecordDataset(tmp_path / "one", SCHEMA, 4, epochs=None, shard_index=1, num_shards=2, timeout=10)) == []


def test_parse_threads_give_the_same_batches(tmp_path):
    img = (np.arange(784) % 256).astype(np.uint8)
    paths = []
    for f in range(3):
        paths.append(str(tmp_path / f"m{f}"))
        write_records(
            paths[-1],
            [encode_example({"image_raw": np.roll(img, i).tobytes(), "label": 100 * f + i}) for i in range(45)],
        )
    schema = {"image_raw": RawBytesFeature([784], scale=1 / 255), "label": FixedLenFeature([], "int64")}
    for kw in ({}, {"shuffle_buffer": 20, "seed": 9, "epochs": 2}, {"drop_remainder": True, "prefetch": 0}):
        one = list(TFRecordDataset(paths, schema, 16, **kw))
        two = list(TFRecordDataset(paths, schema, 16, parse_threads=2, **kw))
        assert len(one) == len(two)
        for a, b in zip(one, two, strict=True):
            assert a["label"].tolist() == b["label"].tolist()
            assert np.array_equal(a["image_raw"], b["image_raw"])


def test_parse_threads_report_the_first_bad_record(tmp_path):
    good = encode_example({"x": 1})
    path = tmp_path / "b"
    write_records(path, [good] * 5 + [encode_example({"x": 1.5})] + [encode_example({"y": 1})] * 5)
    with pytest.raises(SchemaError, match="record 5 at byte") as info:
        list(TFRecordDataset(path, {"x": FixedLenFeature([], "int64")}, 11, parse_threads=2))
    assert "float" in str(info.value)
    data = bytearray(path.read_bytes())
    data[len(good) + 16 + 14] ^= 0x01  # inside record 1's data
    (tmp_path / "c").write_bytes(bytes(data))
    with pytest.raises(
        CorruptRecordError, match=f"'{tmp_path / 'c'}': corrupted record at byte {len(good) + 16}: data CRC"
    ):
        list(TFRecordDataset(tmp_path / "c", {"x": FixedLenFeature([], "int64")}, 11, parse_threads=2))


def test_parse_threads_keep_order_for_any_schema_across_many_small_files(tmp_path):
    # VarLen and bytes outputs parse in parallel too (whole batches per
    # thread); batches that span many mapped files keep each file alive.
    paths = []
    for f in range(12):
        paths.append(str(tmp_path / f"s{f:02d}"))
        write_records(
            paths[-1],
            [
                encode_example({"x": 10 * f + i, "v": np.arange(i + f % 3), "s": ("bytes", [b"r%d" % i] * (i % 2))})
                for i in range(f % 4)
            ],
        )
    schema = {"x": FixedLenFeature([], "int64"), "v": VarLenFeature("int64"), "s": VarLenFeature("bytes")}
    for kw in ({}, {"shuffle_buffer": 7, "seed": 3, "epochs": 3}, {"prefetch": 0}, {"drop_remainder": True}):
        one = list(TFRecordDataset(paths, schema, 5, **kw))
        for threads in (2, 3):
            many = list(TFRecordDataset(paths, schema, 5, parse_threads=threads, **kw))
            assert len(one) == len(many)
            for a, b in zip(one, many, strict=True):
                assert a["x"].tolist() == b["x"].tolist()
                assert a["v"].values.tolist() == b["v"].values.tolist()
                assert a["v"].row_splits.tolist() == b["v"].row_splits.tolist()
                assert list(a["s"].values) == list(b["s"].values)


def test_parse_threads_stop_cleanly_when_closed_early(tmp_path):
    path = tmp_path / "many"
    write_records(path, [encode_example({"x": i, "v": np.arange(2)}) for i in range(2000)])
    for _ in range(5):
        it = iter(TFRecordDataset(path, SCHEMA, 10, parse_threads=2, epochs=None))
        assert next(it)["x"].tolist() == list(range(10))
        it.close()


@pytest.mark.parametrize("parse_threads", [1, 2])
def test_unmapped_plain_stream_reads_every_record_through_read(files, tmp_path, parse_threads):
    """A FIFO cannot be mapped (nor can FUSE or NFS files): the read() path gives the same batches."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    data = b"".join(open(f, "rb").read() for f in files)

    def writer():
        # open() blocks until the dataset opens the other end; bounded by the reader's test timeout
        with open(fifo, "wb") as out:
            for i in range(0, len(data), 7):  # small writes: records arrive split across reads
                out.write(data[i : i + 7])
                out.flush()

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    got = list(TFRecordDataset([str(fifo)], SCHEMA, 4, timeout=10, parse_threads=parse_threads))
    t.join(timeout=10)
    assert not t.is_alive()
    assert xs(got) == ALL
    assert [b["v"].row_splits.tolist() for b in got][:1] == [[0, 0, 1, 3, 3]]
