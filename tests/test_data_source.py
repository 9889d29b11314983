"""table_files and clear_cache: which Parquet files hold a table's rows, over real local Spark, Parquet and Delta.

DataFrames come from the shared local Spark session and read Parquet files
Spark wrote; Delta tables are written and listed by the ``deltalake``
package. The table with deletion vectors is made as the Delta protocol
describes a DELETE that writes them (a commit appended to ``_delta_log/`` and
a deletion-vector file), and deltalake itself reads its deleted row back.
Spark Connect's detection runs in test_data_source_connect.py (the matrix leg
with a Connect server).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

import pytest
from sparkgrad.data import TableFiles, clear_cache, table_files
from sparkgrad.errors import CorruptRecordError, InvalidArgumentError, SchemaError, SparkgradIOError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def read_rows(tf: TableFiles, column: str) -> list:
    return sorted(v for f in tf.files for v in pq.read_table(f, columns=[column]).column(column).to_pylist())


@pytest.fixture(scope="module")
def table(spark, tmp_path_factory):
    """A Parquet directory of 40 rows in 2 files (id, y = 2 id, s.a = id), and one partitioned by k = id % 2."""
    from pyspark.sql import functions as F

    root = tmp_path_factory.mktemp("source")
    df = spark.range(40).withColumn("y", F.col("id") * 2).withColumn("s", F.struct(F.col("id").alias("a")))
    df.repartition(2).write.parquet(str(root / "plain"))
    df.withColumn("k", F.col("id") % 2).write.partitionBy("k").parquet(str(root / "parted"))
    return root


def jobs_run(spark, group, call):
    """Spark jobs ``call()`` started, counted by the status tracker under a job group of its own."""
    sc = spark.sparkContext
    sc.setJobGroup(group, group)
    try:
        result = call()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return result, len(sc.statusTracker().getJobIdsForGroup(group))


# ---- DataFrames ----------------------------------------------------------------------------------------------------


@pytest.mark.spark
def test_plain_parquet_scan_is_read_from_its_own_files(spark, table):
    tf = table_files(spark.read.parquet(str(table / "plain")))
    assert tf.origin == "parquet" and tf.version is None
    assert tf.files == tuple(sorted(glob.glob(str(table / "plain" / "part-*.parquet"))))
    assert len(tf.files) == 2 and f"{table / 'plain'} (2 files)" in tf.description
    assert read_rows(tf, "y") == [2 * i for i in range(40)]


@pytest.mark.spark
def test_column_pruning_keeps_a_scan_plain(spark, table):
    df = spark.read.parquet(str(table / "plain"))
    for pruned in (df.select("y", "s"), df.select(df.s, df.y), df.select("*")):
        tf = table_files(pruned, columns=["y", "s.a"])
        assert tf.origin == "parquet" and len(tf.files) == 2


@pytest.mark.spark
@pytest.mark.parametrize(
    "kind", ["filter", "join", "withColumn", "limit", "rename", "struct field", "sample", "partitioned", "csv"]
)
def test_a_plan_that_changes_rows_or_names_goes_to_the_cache(spark, table, tmp_path, kind):
    from pyspark.sql import functions as F

    df = spark.read.parquet(str(table / "plain"))
    if kind == "csv":
        spark.range(5).write.csv(str(tmp_path / "csv"))
    every, upper = list(range(40)), list(range(30, 40))
    made, want = {
        "filter": (lambda: df.filter("id >= 30"), upper),
        "join": (lambda: df.join(spark.range(30, 45), "id"), upper),
        "withColumn": (lambda: df.withColumn("z", F.col("y") + 1), every),
        "limit": (lambda: df.limit(40), every),
        "rename": (lambda: df.withColumnRenamed("y", "yy"), every),
        "struct field": (lambda: df.select("s.a", "id"), every),
        "sample": (lambda: df.sample(fraction=1.0, seed=1), every),
        "partitioned": (lambda: spark.read.parquet(str(table / "parted")).filter("id >= 30"), upper),
        "csv": (
            lambda: spark.read.csv(str(tmp_path / "csv")).select(F.col("_c0").cast("long").alias("id")),
            [0, 1, 2, 3, 4],
        ),
    }[kind]
    tf = table_files(made(), columns=["id"], cache_dir=str(tmp_path / "cache"))
    assert tf.origin == "cache" and tf.description.startswith(f"cache {tmp_path / 'cache'}")
    assert "; not a plain scan: " in tf.description
    assert all(f.startswith(str(tmp_path / "cache")) for f in tf.files)
    assert read_rows(tf, "id") == want
    assert pq.read_schema(tf.files[0]).names == ["id"]  # only the columns asked for


@pytest.mark.spark
def test_partitioned_scan_without_a_filter_is_cached_with_its_partition_column(spark, table, tmp_path):
    tf = table_files(spark.read.parquet(str(table / "parted")), columns=["y", "k"], cache_dir=str(tmp_path))
    assert tf.origin == "cache"
    assert read_rows(tf, "k") == [0] * 20 + [1] * 20


@pytest.mark.spark
def test_a_scanned_file_that_vanished_is_named(spark, table, tmp_path):
    shutil.copytree(table / "plain", tmp_path / "src")
    df = spark.read.parquet(str(tmp_path / "src"))
    gone = sorted((tmp_path / "src").glob("part-*.parquet"))[1]
    gone.unlink()
    with pytest.raises(SparkgradIOError, match="of the DataFrame's Parquet scan .* is gone") as err:
        table_files(df)
    assert err.value.path == str(gone)


@pytest.mark.spark
def test_second_call_reuses_the_cache_entry_without_a_spark_job(spark, table, tmp_path):
    def make():  # the DataFrame built anew, as a second fit in the same notebook builds it
        return spark.read.parquet(str(table / "plain")).filter("id % 3 = 0")

    df = make()  # (reading the footers for the schema is a Spark job of its own)
    first, jobs = jobs_run(spark, "source-first", lambda: table_files(df, cache_dir=str(tmp_path)))
    assert jobs >= 1 and first.origin == "cache"
    stats = [os.stat(f) for f in first.files]
    df = make()
    again, jobs = jobs_run(spark, "source-again", lambda: table_files(df, cache_dir=str(tmp_path)))
    assert jobs == 0
    assert again == first
    assert [(s.st_ino, s.st_mtime_ns) for s in stats] == [
        (os.stat(f).st_ino, os.stat(f).st_mtime_ns) for f in again.files
    ]
    other = table_files(make(), columns=["y"], cache_dir=str(tmp_path))  # other columns: an entry of its own
    assert os.path.dirname(other.files[0]) != os.path.dirname(first.files[0])


@pytest.mark.spark
def test_a_changed_input_file_makes_a_new_cache_entry(spark, table, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(table / "plain", src)
    df = spark.read.parquet(str(src)).filter("id < 5")
    first = table_files(df, cache_dir=str(tmp_path / "cache"))
    part = sorted(src.glob("part-*.parquet"))[0]
    st = os.stat(part)
    os.utime(part, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same bytes, a later modification time
    second, jobs = jobs_run(spark, "source-changed", lambda: table_files(df, cache_dir=str(tmp_path / "cache")))
    assert jobs >= 1
    assert os.path.dirname(second.files[0]) != os.path.dirname(first.files[0])
    assert read_rows(second, "id") == read_rows(first, "id") == [0, 1, 2, 3, 4]


@pytest.mark.spark
def test_an_entry_without_its_marker_is_written_again_and_unfinished_writes_are_ignored(spark, table, tmp_path):
    df = spark.read.parquet(str(table / "plain")).filter("id < 7")
    first = table_files(df, cache_dir=str(tmp_path))
    entry = os.path.dirname(first.files[0])
    unfinished = tmp_path / f".tmp-{os.path.basename(entry)}-0123abcd"
    unfinished.mkdir()
    (unfinished / "part-00000-x.parquet").write_bytes(b"PAR1")  # a writer that died mid-file
    os.unlink(os.path.join(entry, "_sparkgrad_entry.json"))
    with open(first.files[0], "r+b") as f:  # and a part file cut short, as a copy interrupted would leave it
        f.truncate(8)
    again, jobs = jobs_run(spark, "source-rewrite", lambda: table_files(df, cache_dir=str(tmp_path)))
    assert jobs >= 1 and os.path.dirname(again.files[0]) == entry
    assert read_rows(again, "id") == list(range(7))
    assert unfinished.is_dir()  # left for clear_cache


@pytest.mark.spark
def test_clear_cache_removes_every_entry_or_one_dataframes(spark, table, tmp_path):
    base = spark.read.parquet(str(table / "plain"))
    a, b = base.filter("id < 3"), base.filter("id > 36")
    table_files(a, cache_dir=str(tmp_path))
    table_files(a, columns=["y"], cache_dir=str(tmp_path))
    table_files(b, cache_dir=str(tmp_path))
    (tmp_path / ".tmp-0123456789abcdef-0123456789abcdef-0123abcd").mkdir()  # a writer that died
    (tmp_path / "notes.txt").write_text("not the cache's")
    assert clear_cache(str(tmp_path), source=a) == 2
    assert clear_cache(str(tmp_path), source=str(table / "plain")) == 0  # a path is never cached
    assert clear_cache(str(tmp_path)) == 2
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]
    assert clear_cache(str(tmp_path / "absent")) == 0
    assert table_files(b, cache_dir=str(tmp_path)).origin == "cache"  # written again


@pytest.mark.spark
def test_unwritable_cache_dir_is_named_before_spark_writes(spark, table, tmp_path):
    (tmp_path / "a-file").write_text("")
    blocked = str(tmp_path / "a-file" / "cache")
    df = spark.read.parquet(str(table / "plain")).filter("id < 3")
    with pytest.raises(SparkgradIOError, match="cache directory .*a-file/cache.* cannot be written") as err:
        jobs_run(spark, "source-blocked", lambda: table_files(df, cache_dir=blocked))
    assert err.value.path == blocked
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup("source-blocked")) == 0


@pytest.mark.spark
def test_missing_dataframe_column_is_named_with_the_columns_there(spark, table, tmp_path):
    df = spark.read.parquet(str(table / "plain"))
    for source in (df, df.filter("id < 3")):
        with pytest.raises(SchemaError, match=r"'s\.b' is not in the DataFrame; its columns: id, y, s\.a") as err:
            table_files(source, columns=["y", "s.b"], cache_dir=str(tmp_path))
        assert err.value.column == "s.b"
    assert os.listdir(tmp_path) == []  # refused before anything was written


@pytest.mark.spark
def test_cache_dir_on_dbfs_and_volumes_is_written_by_spark_where_workers_read_it():
    from sparkgrad.data.source import _cache_root

    root = _cache_root("dbfs:/ml/cache", None, check=False)
    assert (root.local, root.spark) == ("/dbfs/ml/cache", "dbfs:/ml/cache")
    root = _cache_root("/Volumes/main/default/v/cache", None, check=False)
    assert (root.local, root.spark) == ("/Volumes/main/default/v/cache", "/Volumes/main/default/v/cache")
    assert _cache_root("/tmp/c", None, check=False).spark == "file:///tmp/c"
    with pytest.raises(InvalidArgumentError, match="must be a local path, dbfs"):
        _cache_root("s3://bucket/cache", None, check=False)


# ---- paths ---------------------------------------------------------------------------------------------------------


def test_parquet_path_is_read_from_its_files(tmp_path, monkeypatch):
    for i in range(3):
        pq.write_table(pa.table({"x": [i, i + 10]}), str(tmp_path / f"part-{i}.parquet"))
    (tmp_path / "_SUCCESS").write_text("")
    tf = table_files(str(tmp_path), columns=["x"])
    assert tf.origin == "parquet" and len(tf.files) == 3 and "(3 files)" in tf.description
    assert table_files(str(tmp_path / "part-1.parquet")).files == (str(tmp_path / "part-1.parquet"),)
    assert table_files(str(tmp_path / "part-[02].parquet")).files == tf.files[::2]
    assert table_files("file://" + str(tmp_path)).files == tf.files
    monkeypatch.chdir(tmp_path)
    assert table_files("part-1.parquet").files == (str(tmp_path / "part-1.parquet"),)  # absolute, for the workers


def test_bad_parquet_paths_get_specific_errors(tmp_path):
    with pytest.raises(SparkgradIOError, match="does not exist"):
        table_files(str(tmp_path / "absent"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "_SUCCESS").write_text("")
    with pytest.raises(SparkgradIOError, match="holds no data files: an empty table"):
        table_files(str(tmp_path / "empty"))
    (tmp_path / "mixed").mkdir()
    pq.write_table(pa.table({"x": [1]}), str(tmp_path / "mixed" / "a.parquet"))
    (tmp_path / "mixed" / "b.csv").write_text("x\n1\n2\n3\n4\n5\n")
    with pytest.raises(CorruptRecordError, match=r"b\.csv' is not Parquet") as err:
        table_files(str(tmp_path / "mixed"))
    assert err.value.path == str(tmp_path / "mixed" / "b.csv")
    (tmp_path / "parted" / "k=0").mkdir(parents=True)
    pq.write_table(pa.table({"x": [1]}), str(tmp_path / "parted" / "k=0" / "a.parquet"))
    with pytest.raises(SparkgradIOError, match=r"partitioned \(k=0, \.\.\.\).*spark\.read\.parquet"):
        table_files(str(tmp_path / "parted"))
    with pytest.raises(SchemaError, match="'y' is not in Parquet source .*; its columns: x"):
        table_files(str(tmp_path / "mixed" / "a.parquet"), columns=["y"])
    with pytest.raises(InvalidArgumentError, match="not a path the workers can open"):
        table_files("s3://bucket/table")
    with pytest.raises(InvalidArgumentError, match="not int"):
        table_files(3)


# ---- Delta ---------------------------------------------------------------------------------------------------------


def test_delta_table_is_read_from_its_snapshot_files(tmp_path):
    deltalake = pytest.importorskip("deltalake")
    path = str(tmp_path / "delta")
    deltalake.write_deltalake(path, pa.table({"x": [1, 2, 3], "y": [0.5, 1.5, 2.5]}))
    deltalake.write_deltalake(path, pa.table({"x": [4, 5], "y": [3.5, 4.5]}), mode="append")
    deltalake.write_deltalake(path, pa.table({"x": [6], "y": [5.5]}), mode="append")
    tf = table_files(path, columns=["x", "y"])
    assert tf.origin == "delta" and tf.version == 2 and f"Delta table {path} at version 2 (3 files)" == tf.description
    assert tf.files == tuple(sorted(u.removeprefix("file://") for u in deltalake.DeltaTable(path).file_uris()))
    assert read_rows(tf, "x") == [1, 2, 3, 4, 5, 6]
    deltalake.DeltaTable(path).delete("x = 2")  # rewrites the file that held x = 2
    tf = table_files(deltalake.DeltaTable(path))
    assert tf.version == 3 and read_rows(tf, "x") == [1, 3, 4, 5, 6]
    deltalake.write_deltalake(path, pa.table({"x": [9], "y": [9.5]}), mode="overwrite")
    tf = table_files(path)
    assert tf.version == 4 and read_rows(tf, "x") == [9]
    old = table_files(deltalake.DeltaTable(path, version=1))  # time travel: the files of that version
    assert old.version == 1 and read_rows(old, "x") == [1, 2, 3, 4, 5]
    with pytest.raises(SchemaError, match="'z' is not in Delta table .* at version 4 .*; its columns: x, y"):
        table_files(path, columns=["z"])


def test_delta_log_that_cannot_be_read_is_named(tmp_path):
    pytest.importorskip("deltalake")
    (tmp_path / "broken" / "_delta_log").mkdir(parents=True)
    with pytest.raises(SparkgradIOError, match="Delta table .*broken' cannot be opened"):
        table_files(str(tmp_path / "broken"))


def test_delta_partition_column_cannot_be_read_from_the_files(tmp_path):
    deltalake = pytest.importorskip("deltalake")
    path = str(tmp_path / "delta")
    deltalake.write_deltalake(path, pa.table({"x": [1, 2], "k": ["a", "b"]}), partition_by=["k"])
    assert read_rows(table_files(path, columns=["x"]), "x") == [1, 2]
    with pytest.raises(SchemaError, match="'k' of Delta table .* is a partition column"):
        table_files(path, columns=["x", "k"])


def _delete_with_a_deletion_vector(path: str, row: int | None) -> None:
    """Appends a DELETE commit to a one-file Delta table, as the Delta protocol defines it.

    The reader and writer features gain ``deletionVectors``; with ``row`` the file's add action is
    replaced by one carrying a deletion vector stored in a file of its own (storage type ``p``, an
    absolute path): a version byte, then the vector's size (big-endian), the vector (magic 1681511377,
    one 32-bit Roaring bitmap in its portable serialization holding ``row``) and its CRC-32 (big-endian).
    """
    log = os.path.join(path, "_delta_log")
    commits = sorted(glob.glob(os.path.join(log, "*.json")))
    add = next(json.loads(line)["add"] for line in open(commits[-1]) if '"add"' in line)
    actions: list[dict] = [
        {"commitInfo": {"timestamp": add["modificationTime"] + 1, "operation": "DELETE"}},
        {
            "protocol": {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": ["deletionVectors"],
                "writerFeatures": ["deletionVectors"],
            }
        },
    ]
    if row is not None:
        bitmap = struct.pack("<IIHHIH", 12346, 1, 0, 0, 16, row)  # cookie, 1 container: key 0, 1 value; offset
        vector = struct.pack("<iqi", 1681511377, 1, 0) + bitmap  # magic, 1 bitmap, its high 32 bits
        dv_file = os.path.join(path, "deletion_vector_0.bin")
        with open(dv_file, "wb") as f:
            f.write(b"\x01" + struct.pack(">i", len(vector)) + vector + struct.pack(">I", zlib.crc32(vector)))
        dv = {"storageType": "p", "pathOrInlineDv": "file://" + dv_file, "offset": 1,
              "sizeInBytes": len(vector), "cardinality": 1}  # fmt: skip
        now = add["modificationTime"] + 1
        actions += [
            {"remove": {"path": add["path"], "deletionTimestamp": now, "dataChange": True,
                        "extendedFileMetadata": True, "partitionValues": {}, "size": add["size"]}},
            {"add": dict(add, dataChange=True, deletionVector=dv)},
        ]  # fmt: skip
    with open(os.path.join(log, f"{len(commits):020d}.json"), "x") as f:
        f.write("".join(json.dumps(a) + "\n" for a in actions))


def test_delta_snapshot_with_deletion_vectors_is_refused_saying_how_to_proceed(tmp_path):
    deltalake = pytest.importorskip("deltalake")
    path = str(tmp_path / "dv")
    deltalake.write_deltalake(path, pa.table({"x": [10, 20, 30]}))
    _delete_with_a_deletion_vector(path, row=1)
    dt = deltalake.DeltaTable(path)
    marks = pa.RecordBatchReader.from_stream(dt.deletion_vectors()).read_all()
    assert marks.column("selection_vector").to_pylist() == [[True, False, True]]  # deltalake reads our vector
    with pytest.raises(InvalidArgumentError, match=r"Delta table .*dv at version 1 has deletion vectors") as err:
        table_files(path)
    assert "REORG TABLE" in str(err.value) and "APPLY (PURGE)" in str(err.value)
    assert err.value.table == path


def test_delta_table_with_the_feature_but_no_deletion_vectors_is_read(tmp_path):
    deltalake = pytest.importorskip("deltalake")
    path = str(tmp_path / "dv")
    deltalake.write_deltalake(path, pa.table({"x": [10, 20, 30]}))
    _delete_with_a_deletion_vector(path, row=None)
    tf = table_files(path)
    assert tf.version == 1 and read_rows(tf, "x") == [10, 20, 30]


def test_empty_delta_table_is_refused(tmp_path):
    deltalake = pytest.importorskip("deltalake")
    path = str(tmp_path / "empty")
    deltalake.write_deltalake(path, pa.table({"x": pa.array([], pa.int64())}))
    if deltalake.DeltaTable(path).file_uris():
        pytest.skip("this deltalake writes a file for an empty table")
    with pytest.raises(SparkgradIOError, match="holds no data files"):
        table_files(path)


def test_importing_sparkgrad_data_imports_no_spark_arrow_or_delta():
    code = "import sys, sparkgrad.data; print([m for m in ('pyspark', 'pyarrow', 'deltalake') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
