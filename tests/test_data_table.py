"""ParquetDataset and the C table reader under it, on Parquet files written by pyarrow (and by real local Spark)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import sparkgrad.data.table as tables
from sparkgrad import _core
from sparkgrad.data import Column, ParquetDataset
from sparkgrad.errors import CorruptRecordError, InvalidArgumentError, SchemaError, SparkgradIOError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


# The two ways a record batch reaches C: the PyCapsules of pyarrow >= 14, and the structs _export_to_c fills,
# all that older pyarrow (8 on DBR 13.3) has. Every test here runs through each this pyarrow offers.
@pytest.fixture(autouse=True, params=["capsule", "export"] if tables._capsules(pa) else ["export"])
def capsule(request, monkeypatch):
    """True when batches go through __arrow_c_array__; else ParquetDataset is made to use _export_to_c."""
    if request.param == "export":
        monkeypatch.setattr(tables, "_capsules", lambda pa: False)
    return request.param == "capsule"


def write(path, table, row_group_size=None):
    pq.write_table(table, str(path), row_group_size=row_group_size)
    return str(path)


def one_batch(path, columns, label=None, **kw):
    """Every row in file order, as one batch."""
    rows = pq.ParquetFile(path).metadata.num_rows
    batches = list(ParquetDataset(path, columns, rows, label=label, **kw))
    assert len(batches) == 1
    return batches[0]


def strings(col):
    return [bytes(col.data[col.offsets[k] : col.offsets[k + 1]]).decode() for k in range(len(col))]


def parquet_writes_float16():
    """Whether this pyarrow writes float16 columns to Parquet (its Float16 logical type; pyarrow 8 does not)."""
    try:
        pq.write_table(pa.table({"h": pa.array(np.zeros(1, np.float16))}), pa.BufferOutputStream())
    except pa.ArrowNotImplementedError:
        return False
    return True


NUMBER_TYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32", "float64",
                "bool"] + (["float16"] if parquet_writes_float16() else [])  # fmt: skip


def test_numbers_of_every_type_equal_what_pyarrow_reads(tmp_path):
    rng = np.random.default_rng(0)
    cols = {}
    for t in NUMBER_TYPES:
        v = rng.integers(0, 100, 300) if t != "bool" else rng.integers(0, 2, 300).astype(bool)
        cols[t] = pa.array(v.astype(t if t != "bool" else bool), pa.bool_() if t == "bool" else getattr(pa, t)())
    path = write(tmp_path / "n.parquet", pa.table(cols), row_group_size=70)
    batch = one_batch(path, {t: t for t in NUMBER_TYPES})
    table = pq.read_table(path)
    for t in NUMBER_TYPES:
        assert batch[t].dtype == np.float32 and batch[t].shape == (300,)
        np.testing.assert_array_equal(batch[t], table[t].to_numpy().astype(np.float32), err_msg=t)


def test_lists_are_padded_to_the_width_with_their_lengths(tmp_path):
    rows = [[float(i)] * (i % 5) for i in range(200)]
    table = pa.table(
        {
            "l": pa.array(rows, pa.list_(pa.float32())),
            "big": pa.array([[i, -i] * (i % 2) for i in range(200)], pa.large_list(pa.int32())),
            "fixed": pa.array([[i, i + 0.5, 2.0 * i] for i in range(200)], pa.list_(pa.float64(), 3)),
        }
    )
    path = write(tmp_path / "l.parquet", table, row_group_size=64)
    batch = one_batch(
        path,
        {"l": Column("l", width=4, pad=-1.0, lengths="l_len"), "big": Column("big", width=2), "fixed": "fixed"},
    )
    want = np.full((200, 4), -1.0, np.float32)
    for i, r in enumerate(rows):
        want[i, : min(len(r), 4)] = r[:4] if len(r) <= 4 else np.nan
    # row lengths 0..4 (i % 5) fit width 4
    np.testing.assert_array_equal(batch["l"], want)
    np.testing.assert_array_equal(batch["l_len"], [i % 5 for i in range(200)])
    np.testing.assert_array_equal(batch["big"], [[i, -i] if i % 2 else [0, 0] for i in range(200)])
    np.testing.assert_array_equal(batch["fixed"], table["fixed"].to_pylist())


def test_integer_ids_are_read_exactly_as_int64(tmp_path):
    big = np.array([2**40 + 1, 16_777_217, -3, 7], dtype=np.int64)
    table = pa.table(
        {
            "id": pa.array(big),
            "small": pa.array([1, 2, 3, None], pa.int16()),
            "tags": pa.array([[2**33 + 1], [], [5, 6, 7], [8, None]], pa.list_(pa.int64())),
            "f": pa.array([0.5, 1.5, 2.5, 3.5]),
        }
    )
    path = write(tmp_path / "ids.parquet", table)
    batch = one_batch(
        path,
        {
            "id": Column("id", dtype="int64"),
            "small": Column("small", dtype="int64", nulls="fill", fill=-1),
            "tags": Column("tags", dtype="int64", width=2, pad=-9, truncate=True, lengths="n", nulls="fill"),
        },
    )
    assert batch["id"].dtype == np.int64 and batch["id"].tolist() == big.tolist()
    assert batch["small"].tolist() == [1, 2, 3, -1]
    assert batch["tags"].tolist() == [[2**33 + 1, -9], [-9, -9], [5, 6], [8, 0]]
    assert batch["n"].tolist() == [1, 0, 2, 2]
    with pytest.raises(SchemaError, match="column 'f' is read as int64 ids, but it holds no integers"):
        one_batch(path, {"f": Column("f", dtype="int64")})
    labelled = one_batch(path, {"f": "f"}, label="id")
    assert labelled["id"].dtype == np.int64 and labelled["id"].tolist() == big.tolist()


def test_a_list_longer_than_its_width_is_an_error_naming_it_unless_truncated(tmp_path):
    path = write(tmp_path / "l.parquet", pa.table({"l": pa.array([[1.0], [1.0, 2.0, 3.0]], pa.list_(pa.float32()))}))
    with pytest.raises(SchemaError, match=r"l.parquet', row group 0, row 1: column 'l' holds 3 values, more than its "):
        one_batch(path, {"l": Column("l", width=2)})
    batch = one_batch(path, {"l": Column("l", width=2, truncate=True, lengths="n")})
    np.testing.assert_array_equal(batch["l"], [[1, 0], [1, 2]])
    np.testing.assert_array_equal(batch["n"], [1, 2])
    with pytest.raises(SchemaError, match="variable-length list: give its width"):
        one_batch(path, {"l": "l"})


def test_binary_values_become_one_float_per_byte(tmp_path):
    raw = np.random.default_rng(1).integers(0, 256, (50, 6), dtype=np.uint8)
    table = pa.table(
        {
            "b": pa.array([r.tobytes() for r in raw], pa.binary()),
            "lb": pa.array([r.tobytes() for r in raw], pa.large_binary()),
            "fb": pa.array([r.tobytes() for r in raw], pa.binary(6)),
        }
    )
    batch = one_batch(write(tmp_path / "b.parquet", table), {"b": "b", "lb": "lb", "fb": "fb"})
    for k in ("b", "lb", "fb"):
        np.testing.assert_array_equal(batch[k], raw.astype(np.float32))
    odd = write(tmp_path / "odd.parquet", pa.table({"b": pa.array([b"ab", b"abc"])}))
    with pytest.raises(SchemaError, match=r"row 1: column 'b' holds 3 bytes, not its width 2"):
        one_batch(odd, {"b": "b"})


def test_strings_come_as_string_columns(tmp_path):
    words = ["", "a", "日本", "xyz" * 10] * 25
    table = pa.table({"s": pa.array(words), "ls": pa.array(words, pa.large_string())})
    batch = one_batch(write(tmp_path / "s.parquet", table, row_group_size=33), {"s": "s", "ls": "ls"})
    assert strings(batch["s"]) == words and strings(batch["ls"]) == words


def test_struct_fields_are_found_by_dotted_name(tmp_path):
    rows = [{"a": i, "b": {"c": 2.0 * i, "d": f"w{i}"}} for i in range(40)]
    table = pa.table({"st": pa.array(rows), "x.y": pa.array(np.arange(40.0))})
    batch = one_batch(write(tmp_path / "st.parquet", table), {"c": "st.b.c", "d": "st.b.d", "a": "st.a", "xy": "x.y"})
    np.testing.assert_array_equal(batch["c"], 2.0 * np.arange(40))
    np.testing.assert_array_equal(batch["a"], np.arange(40))
    np.testing.assert_array_equal(batch["xy"], np.arange(40))
    assert strings(batch["d"]) == [f"w{i}" for i in range(40)]


def test_nulls_follow_each_columns_policy(tmp_path):
    table = pa.table(
        {
            "x": pa.array([1.0, None, 3.0, 4.0, 5.0]),
            "l": pa.array([[1.0], [2.0, None], None, [4.0], [5.0]], pa.list_(pa.float32())),
            "s": pa.array(["a", "b", None, "d", None]),
            "k": pa.array([0, 1, 2, None, 4]),
        }
    )
    path = write(tmp_path / "nulls.parquet", table, row_group_size=2)
    with pytest.raises(
        SchemaError, match=r"nulls.parquet', row group 0, row 1: column 'x' is null \(its null policy is"
    ):
        list(ParquetDataset(path, {"x": "x"}, 5))
    batch = one_batch(path, {"x": Column("x", nulls="fill", fill=-7.0)})
    np.testing.assert_array_equal(batch["x"], [1, -7, 3, 4, 5])

    # skip: a row with a null in a skip column leaves every column; fill: values, list elements, strings
    ds = ParquetDataset(
        path,
        {"x": "x", "l": Column("l", width=2, lengths="n"), "s": "s"},
        5,
        label="k",
        nulls={"x": -1.0, "l": 9.0, "s": 0.0, "k": "skip"},
    )
    (batch,) = list(ds)
    np.testing.assert_array_equal(batch["k"], [0, 1, 2, 4])
    np.testing.assert_array_equal(batch["x"], [1, -1, 3, 5])
    np.testing.assert_array_equal(batch["l"], [[1, 0], [2, 9], [9, 9], [5, 0]])
    np.testing.assert_array_equal(batch["n"], [1, 2, 0, 1])
    assert strings(batch["s"]) == ["a", "b", "", ""]
    with pytest.raises(SchemaError, match=r"row group 0, row 1: column 'l' is null inside its list"):
        list(ParquetDataset(path, {"l": Column("l", width=2)}, 5))
    with pytest.raises(SchemaError, match=r"row group 1, row 0: column 's' is null"):
        list(ParquetDataset(path, {"s": "s"}, 5))


def test_a_null_struct_makes_its_fields_null(tmp_path):
    rows = pa.array([{"b": {"c": 1.0}}, None, {"b": None}, {"b": {"c": None}}, {"b": {"c": 5.0}}])
    path = write(tmp_path / "s.parquet", pa.table({"st": rows, "i": pa.array(np.arange(5))}))
    with pytest.raises(SchemaError, match=r"row group 0, row 1: column 'st.b.c' is null"):
        list(ParquetDataset(path, {"c": "st.b.c"}, 5))
    batch = one_batch(path, {"c": Column("st.b.c", nulls="skip"), "i": "i"})
    np.testing.assert_array_equal(batch["i"], [0, 4])
    np.testing.assert_array_equal(batch["c"], [1, 5])


def test_importing_sparkgrad_data_does_not_import_pyarrow():
    import subprocess
    import sys

    code = "import sys, sparkgrad, sparkgrad.data, sparkgrad.nn; print('pyarrow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_dictionary_encoded_columns_are_refused_by_name(capsule):
    batch = pa.RecordBatch.from_pydict({"d": pa.array(["a", "b", "a"]).dictionary_encode()})
    reader = _core.TableReader([("d", 0, False, 0, 0.0, 0.0)], 2)
    with pytest.raises(SchemaError, match=r"file 'f.parquet', row group 3: column 'd' is dictionary-encoded"):
        reader.push(batch, "f.parquet", 3, 0, capsule)


def test_sliced_batches_read_from_their_offset(capsule):
    batch = pa.RecordBatch.from_pydict(
        {
            "x": pa.array([0.0, 1.0, None, 3.0, 4.0]),
            "s": pa.array(["a", "b", "c", "d", "e"]),
            "st": pa.array([{"v": [i, i]} for i in range(5)]),
        }  # fmt: skip
    ).slice(3, 2)
    reader = _core.TableReader([("x", 0, False, 0, 0.0, 0.0), ("s", 0, False, 0, 0.0, 0.0),
                                ("st.v", 2, False, 0, 0.0, 0.0)], 2)  # fmt: skip
    assert reader.push(batch, "f", 0, 3, capsule) == 2
    rows, cols = reader.next()
    assert rows == 2
    np.testing.assert_array_equal(cols[0][1], [[3], [4]])
    assert bytes(cols[1][2]) == b"de"
    np.testing.assert_array_equal(cols[2][1], [[3, 3], [4, 4]])


class HalfExport:
    """A producer whose _export_to_c fills the ArrowArray alone (pyarrow's export of a bare array)."""

    def __init__(self, array):
        self.array = array

    def _export_to_c(self, array_ptr, schema_ptr):
        self.array._export_to_c(array_ptr)


def test_an_export_that_fails_or_fills_half_its_structs_is_refused_and_released():
    reader = _core.TableReader([("x", 0, False, 0, 0.0, 0.0)], 2)
    with pytest.raises(AttributeError, match="_export_to_c"):
        reader.push(object(), "f", 0, 0, capsule=False)
    before = pa.total_allocated_bytes()
    half = HalfExport(pa.array(np.arange(1000, dtype=np.float64)))
    with pytest.raises(InvalidArgumentError, match="did not fill both the ArrowArray and the ArrowSchema"):
        reader.push(half, "f", 0, 0, capsule=False)
    del half  # the exported array released, its buffer goes with the last reference
    assert pa.total_allocated_bytes() == before
    assert reader.pending == 0


def test_binary_rows_are_read_from_the_batch_held_until_its_last_row_is_taken(capsule):
    """A binary chunk keeps its Arrow batch instead of copying its bytes: the batch's memory stays allocated
    while rows of it wait in the shuffle buffer, and goes back once the last is taken (or the reader goes)."""
    raw = np.random.default_rng(5).integers(0, 256, (400, 784), dtype=np.uint8)
    labels = np.arange(400, dtype=np.int64)
    plans = [("px", 0, False, 0, 0.0, 0.0), ("y", 0, False, 0, 0.0, 0.0, True)]
    base = pa.total_allocated_bytes()
    batch = pa.RecordBatch.from_pydict({"px": pa.array([r.tobytes() for r in raw], pa.binary()), "y": pa.array(labels)})
    size = pa.total_allocated_bytes() - base
    reader = _core.TableReader(plans, 50, shuffle_buffer=300, seed=9)
    for k in range(0, 400, 100):
        reader.push(batch.slice(k, 100), "f", 0, k, capsule)
    del batch  # the reader's chunks hold it now
    assert pa.total_allocated_bytes() - base >= size
    seen = np.zeros((400, 784), np.float32)
    while (b := reader.next(final=True)) is not None:
        rows, ((_, px, _), (_, y, _)) = b
        seen[y[:, 0]] = px
    np.testing.assert_array_equal(seen, raw.astype(np.float32))  # every row, its own bytes
    assert pa.total_allocated_bytes() == base  # every row taken: the batch released
    again = pa.RecordBatch.from_pydict({"px": pa.array([r.tobytes() for r in raw[:10]], pa.binary())})
    reader = _core.TableReader(plans[:1], 50, shuffle_buffer=300)
    reader.push(again, "f", 0, 0, capsule)
    del again
    assert pa.total_allocated_bytes() > base  # its rows wait for more
    del reader  # the reader gone, the batch with it
    assert pa.total_allocated_bytes() == base


def test_a_pool_reuses_chunk_buffers_without_changing_the_batches(capsule):
    batch = pa.RecordBatch.from_pydict(
        {"x": pa.array(np.arange(500, dtype=np.float64)), "s": pa.array([str(i) for i in range(500)])}
    )
    plans = [("x", 0, False, 0, 0.0, 0.0), ("s", 0, False, 0, 0.0, 0.0)]

    def read(pool):
        reader = _core.TableReader(plans, 64, shuffle_buffer=100, seed=3, pool=pool)
        for k in range(0, 500, 120):
            reader.push(batch.slice(k, 120), "f", 0, k, capsule)
        out = []
        while (b := reader.next(final=True)) is not None:
            out.append((b[1][0][1].copy(), bytes(b[1][1][2])))
        return out

    pool = _core.TablePool(1 << 20)
    plain, first = read(None), read(pool)
    assert pool.bytes > 0  # the chunks' buffers came back
    again = read(pool)
    for a, b, c in zip(plain, first, again, strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[0], c[0])
        assert a[1] == b[1] == c[1]


def test_shuffling_is_seeded_and_a_permutation_of_the_rows(tmp_path):
    path = write(tmp_path / "r.parquet", pa.table({"i": np.arange(1000, dtype=np.int64)}), row_group_size=100)

    def order(seed):
        ds = ParquetDataset(path, {"i": "i"}, 64, shuffle_buffer=300, seed=seed)
        return np.concatenate([b["i"] for b in ds.epoch(0)])

    a, b, c = order(5), order(5), order(6)
    np.testing.assert_array_equal(a, b)
    assert sorted(a.tolist()) == list(range(1000)) and not np.array_equal(a, c)
    assert not np.array_equal(a, np.arange(1000))
    plain = np.concatenate([b["i"] for b in ParquetDataset(path, {"i": "i"}, 64)])
    np.testing.assert_array_equal(plain, np.arange(1000))


@pytest.mark.parametrize("shuffle", [0, 50])
def test_epochs_give_every_row_once_across_shards_and_rotate_the_dropped_rows(tmp_path, shuffle):
    for k in range(3):  # 3 files of uneven row groups: 1003 rows
        rows = np.arange(k * 400, k * 400 + (400 if k < 2 else 203), dtype=np.int64)
        write(tmp_path / f"part-{k}.parquet", pa.table({"i": rows}), row_group_size=90 + 7 * k)
    shards, batch = 4, 16
    readers = [
        ParquetDataset(
            str(tmp_path), {"i": "i"}, batch, shuffle_buffer=shuffle, seed=2, shard_index=s, num_shards=shards
        )
        for s in range(shards)
    ]
    dropped = []
    for epoch in range(3):
        seen = []
        for r in readers:
            got = [b["i"] for b in r.epoch(epoch)]
            assert all(len(g) == batch for g in got)
            seen.append(np.concatenate(got))
        assert len({len(s) for s in seen}) == 1  # equal shards of whole batches
        every = np.concatenate(seen)
        assert len(np.unique(every)) == len(every) == (1003 // (shards * batch)) * shards * batch
        dropped.append(set(range(1003)) - set(every.tolist()))
        assert 0 < len(dropped[-1]) < shards * batch
    assert dropped[0] != dropped[1] and dropped[1] != dropped[2]
    # a shard reads a different slice each epoch
    assert not np.array_equal(
        np.concatenate([b["i"] for b in readers[0].epoch(0)]), np.concatenate([b["i"] for b in readers[0].epoch(1)])
    )


def test_row_groups_read_in_small_record_batches_give_the_same_batches(tmp_path, monkeypatch):
    from sparkgrad.data import table

    offsets = pa.array(np.arange(0, 8 * 1003 + 1, 8, dtype=np.int32))
    values = pa.ListArray.from_arrays(offsets, pa.array(np.arange(8 * 1003, dtype=np.float32)))
    write(tmp_path / "t.parquet", pa.table({"i": np.arange(1003, dtype=np.int64), "v": values}), row_group_size=300)

    def epochs(read_rows, read_bytes):
        monkeypatch.setattr(table, "_READ_ROWS", read_rows)
        monkeypatch.setattr(table, "_READ_BYTES", read_bytes)
        out, sizes = [], set()
        for s in range(3):
            ds = ParquetDataset(
                str(tmp_path), {"v": Column("v", width=8)}, 16, label="i", shuffle_buffer=50, seed=1, shard_index=s,
                num_shards=3,
            )  # fmt: skip
            out += [(b["i"], b["v"]) for e in range(2) for b in ds.epoch(e)]
            sizes.add(ds._read_rows)
        return out, sizes

    whole, _ = epochs((65536, 65536), 1 << 30)
    small, sizes = epochs((7, 50), 1000)  # 7 rows at first, then about 1000 bytes (some 22 rows of 44 bytes)
    assert all(7 < n < 50 for n in sizes)
    assert len(whole) == len(small) > 0
    for (i, v), (i2, v2) in zip(whole, small, strict=True):
        np.testing.assert_array_equal(i, i2)
        np.testing.assert_array_equal(v, v2)
        np.testing.assert_array_equal(v, i[:, None] * 8 + np.arange(8))


def test_a_model_trains_on_a_parquet_dataset_as_on_the_same_arrays(tmp_path):
    from sparkgrad.nn import Adam, CategoryEncoding, Concatenate, Dense, Input, Model, StringLookup

    def model():
        city = Input(shape=(1,), dtype="string", name="city")
        pixels = Input(shape=(4,), name="pixels")
        age = Input(shape=(1,), name="age")
        hot = CategoryEncoding(num_tokens=4, output_mode="one_hot")(StringLookup(vocabulary=["a", "b", "c"])(city))
        h = Concatenate()([hot, pixels, age])
        m = Model([city, pixels, age], Dense(3, activation="softmax")(Dense(8, activation="relu")(h)), seed=3)
        m.compile(optimizer=Adam(0.05), loss="sparse_categorical_crossentropy")
        return m

    rng = np.random.default_rng(0)
    n = 256
    cities = np.array(["a", "b", "c", "dd"])[rng.integers(0, 4, n)]
    pixels = rng.integers(0, 256, (n, 4), dtype=np.uint8)
    age = rng.normal(40, 10, n).astype(np.float32)
    label = rng.integers(0, 3, n)
    table = pa.table(
        {
            "city": pa.array(cities.tolist()),
            "img": pa.array([p.tobytes() for p in pixels], pa.binary()),
            "person": pa.array([{"age": float(a)} for a in age]),
            "label": pa.array(label, pa.int32()),
        }
    )
    path = write(tmp_path / "train.parquet", table, row_group_size=100)
    ds = ParquetDataset(path, {"city": "city", "pixels": "img", "age": "person.age"}, 32, label="label")
    fed, arrays = model(), model()
    fed.fit(ds, epochs=2, verbose=0)
    x = {"city": cities, "pixels": pixels.astype(np.float32), "age": age.reshape(n, 1)}
    arrays.fit(x, label, batch_size=32, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(fed.get_weights(), arrays.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_a_missing_column_lists_the_files_columns(tmp_path):
    path = write(tmp_path / "m.parquet", pa.table({"a": [1], "st": pa.array([{"b": 1.0}])}))
    with pytest.raises(
        SchemaError, match=r"column 'st.c' \(for 'x'\) is not in file '.*m.parquet'; its columns: a, st.b"
    ):
        ParquetDataset(path, {"x": "st.c"}, 4)


def test_an_unsupported_type_is_refused_naming_the_column(tmp_path):
    table = pa.table({"m": pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64())), "d": pa.array([1], pa.date32())})
    path = write(tmp_path / "u.parquet", table)
    with pytest.raises(SchemaError, match=r"column 'm' has Arrow format '\+m', which cannot be fed"):
        list(ParquetDataset(path, {"m": "m"}, 4))
    with pytest.raises(SchemaError, match=r"column 'd' has Arrow format 'tdD', which cannot be fed"):
        list(ParquetDataset(path, {"d": "d"}, 4))


def test_a_corrupt_or_vanished_file_is_an_error_naming_it(tmp_path):
    good = write(tmp_path / "a.parquet", pa.table({"x": np.arange(10.0)}))
    bad = tmp_path / "b.parquet"
    bad.write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1")
    with pytest.raises(CorruptRecordError, match=r"file '.*b.parquet' is not a readable Parquet file"):
        ParquetDataset([good, str(bad)], {"x": "x"}, 4)
    with pytest.raises(SparkgradIOError, match=r"file '.*nope.parquet'.*does not exist"):
        ParquetDataset([good, str(tmp_path / "nope.parquet")], {"x": "x"}, 4)
    ds = ParquetDataset(good, {"x": "x"}, 4)
    os.remove(good)
    with pytest.raises(SparkgradIOError, match=r"file '.*a.parquet', row group 0: it does not exist"):
        list(ds)


def test_bad_arguments_are_refused():
    with pytest.raises(InvalidArgumentError, match="nulls must be one of"):
        Column("x", nulls="drop")
    with pytest.raises(InvalidArgumentError, match="shard_index 2 must be in"):
        ParquetDataset("x.parquet", {"x": "x"}, 4, shard_index=2, num_shards=2)


@pytest.mark.spark
def test_spark_vectors_and_structs_read_as_dense_rows(spark, tmp_path):
    from pyspark.ml.linalg import Vectors
    from pyspark.sql import Row

    rows = [
        Row(
            id=i,
            vec=Vectors.dense([i, 0.5, -1.0]) if i % 2 else Vectors.sparse(3, {0: float(i), 2: 2.0}),
            info=Row(age=float(i), city=f"c{i % 3}"),
        )
        for i in range(40)
    ]
    out = str(tmp_path / "spark")
    spark.createDataFrame(rows).repartition(2).write.parquet(out)
    ds = ParquetDataset(out, {"vec": "vec", "age": "info.age", "city": "info.city"}, 8, label="id")
    got = {k: [] for k in ("id", "vec", "age", "city")}
    for b in ds:
        for k in got:
            got[k] += strings(b[k]) if k == "city" else list(b[k])
    order = np.argsort(got["id"])
    ids = np.asarray(got["id"])[order]
    np.testing.assert_array_equal(ids, np.arange(40))
    want = [[i, 0.5, -1.0] if i % 2 else [i, 0.0, 2.0] for i in range(40)]
    np.testing.assert_array_equal(np.asarray(got["vec"])[order], want)
    np.testing.assert_array_equal(np.asarray(got["age"])[order], np.arange(40))
    assert [got["city"][k] for k in order] == [f"c{i % 3}" for i in range(40)]


def test_without_drop_remainder_one_shard_reads_every_row_and_a_short_last_batch(tmp_path):
    path = write(tmp_path / "r.parquet", pa.table({"i": np.arange(103, dtype=np.int64)}), row_group_size=40)
    ds = ParquetDataset(path, {"i": "i"}, 25, shuffle_buffer=30, seed=4)
    sizes = [len(b["i"]) for b in ds.epoch(0)]
    assert sizes == [25, 25, 25, 25, 3]
    two = ParquetDataset(path, {"i": "i"}, 25, num_shards=2, shard_index=1, drop_remainder=False)
    assert two.shard_rows() == 51 and [len(b["i"]) for b in two.epoch(0)] == [25, 25, 1]


def test_each_iteration_reads_the_next_epochs(tmp_path):
    path = write(tmp_path / "r.parquet", pa.table({"i": np.arange(300, dtype=np.int64)}), row_group_size=50)
    ds = ParquetDataset(path, {"i": "i"}, 50, shuffle_buffer=100, seed=8, epochs=2)
    first = [np.concatenate([b["i"] for b in ds.epoch(e)]) for e in (0, 1, 2, 3)]
    np.testing.assert_array_equal(np.concatenate([b["i"] for b in ds]), np.concatenate(first[:2]))
    np.testing.assert_array_equal(np.concatenate([b["i"] for b in ds]), np.concatenate(first[2:]))
    assert not np.array_equal(first[0], first[1])


def test_a_damaged_row_group_is_an_error_naming_the_file_and_row_group(tmp_path):
    path = write(tmp_path / "d.parquet", pa.table({"x": np.random.default_rng(0).normal(size=20000)}), 5000)
    chunk = pq.ParquetFile(path).metadata.row_group(2).column(0)
    data = bytearray(open(path, "rb").read())
    data[chunk.data_page_offset + 40 : chunk.data_page_offset + 240] = b"\xff" * 200
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptRecordError, match=r"file '.*d.parquet', row group 2: "):
        list(ParquetDataset(path, {"x": "x"}, 1000))
