"""table_files over Spark Connect: the client's plan tells a plain Parquet scan from anything else.

The Connect server is test_cluster_connect's (a local[4] server in a
process of its own; this client has no JVM), so this module runs where that
one does: the py312-spark40 leg of ``make test-matrix``. The Parquet files
are written by the server's Spark into this machine's temporary directory,
where the client reads them back with pyarrow.
"""

from __future__ import annotations

import glob
import os

import pytest
from sparkgrad.data import table_files
from test_cluster_connect import connect  # noqa: F401 - the module's Connect server and client (a fixture)

pq = pytest.importorskip("pyarrow.parquet")
pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]


def ids(tf):
    return sorted(v for f in tf.files for v in pq.read_table(f, columns=["id"]).column("id").to_pylist())


@pytest.fixture(scope="module")
def table(connect, tmp_path_factory):  # noqa: F811 - the fixture imported above
    """A Parquet directory of 40 rows in 2 files (id, y = 2 id, s.a = id), and one partitioned by k = id % 2."""
    from pyspark.sql.connect import functions as F

    root = tmp_path_factory.mktemp("connect-source")
    df = connect.range(40).withColumn("y", F.col("id") * 2).withColumn("s", F.struct(F.col("id").alias("a")))
    df.repartition(2).write.parquet(str(root / "plain"))
    df.withColumn("k", F.col("id") % 2).write.partitionBy("k").parquet(str(root / "parted"))
    return root


def test_connect_plain_and_pruned_scans_are_read_from_their_files(connect, table):  # noqa: F811
    df = connect.read.parquet(str(table / "plain"))
    files = tuple(sorted(glob.glob(str(table / "plain" / "part-*.parquet"))))
    loaded = connect.read.format("parquet").load(str(table / "plain"))
    for plain in (df, df.select("y", "id"), df.select(df.s, df.id), loaded, connect.read.load(str(table / "plain"))):
        tf = table_files(plain, columns=["id"])
        assert (tf.origin, tf.files) == ("parquet", files)
    assert ids(tf) == list(range(40))


@pytest.mark.parametrize("kind", ["filter", "withColumn", "rename", "struct field", "limit", "partitioned", "join"])
def test_connect_plans_that_change_rows_or_names_go_to_the_cache(connect, table, tmp_path, kind):  # noqa: F811
    from pyspark.sql.connect import functions as F

    df = connect.read.parquet(str(table / "plain"))
    every, upper = list(range(40)), list(range(30, 40))
    made, want = {
        "filter": (lambda: df.filter("id >= 30"), upper),
        "withColumn": (lambda: df.withColumn("z", F.col("y") + 1), every),
        "rename": (lambda: df.withColumnRenamed("y", "yy"), every),
        "struct field": (lambda: df.select("s.a", "id"), every),
        "limit": (lambda: df.limit(40), every),
        "partitioned": (lambda: connect.read.parquet(str(table / "parted")), every),
        "join": (lambda: df.join(connect.range(30, 45), "id"), upper),
    }[kind]
    tf = table_files(made(), columns=["id"], cache_dir=str(tmp_path))
    assert tf.origin == "cache" and all(f.startswith(str(tmp_path)) for f in tf.files)
    assert ids(tf) == want


def test_connect_second_call_reuses_the_cache_entry(connect, table, tmp_path):  # noqa: F811
    def make():
        return connect.read.parquet(str(table / "plain")).filter("id % 4 = 0")

    first = table_files(make(), cache_dir=str(tmp_path))
    marker = os.path.join(os.path.dirname(first.files[0]), "_sparkgrad_entry.json")
    before = os.stat(marker)
    again = table_files(make(), cache_dir=str(tmp_path))
    assert again == first and (os.stat(marker).st_ino, os.stat(marker).st_mtime_ns) == (
        before.st_ino,
        before.st_mtime_ns,
    )
    assert len(os.listdir(tmp_path)) == 1 and ids(again) == list(range(0, 40, 4))
