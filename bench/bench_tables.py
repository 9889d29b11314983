"""Parquet table feeding: rows/s of sparkgrad's ParquetDataset against pyarrow alone (the file floor).

Data: 60,000 synthetic Fashion-MNIST-shaped rows (784 pixels in 0..255 and
an int64 label) in two Parquet files written by pyarrow (snappy, row groups
of 10,000 rows): pixels as list<float> and as 784-byte binary values.

  pyarrow -> NumPy (file floor)   ParquetFile.iter_batches(columns), batches
                                  of about 16 MiB as ParquetDataset reads them,
                                  and the column's buffers as [rows, 784] NumPy
                                  arrays (no copy where Arrow allows): reading
                                  and decoding the file, nothing else
  sparkgrad ParquetDataset        batches of 100 {pixels float32 [100, 784],
                                  label int64 [100]}: the same reads, then
                                  validation, conversion and batching in C;
                                  one dataset, each pass its next epoch (as
                                  model.fit reads it), after one warm-up epoch
  ... shuffle_buffer=10000        the same, rows drawn from a 10,000-row
                                  shuffle buffer, row groups shuffled

Everything above runs in this one process, pinned to one core (pyarrow's own
threads included). Each figure is the median of --runs passes over the file.

Workers (the issue's table: rows/s by table, worker count and system). Three
tables of the same rows count (--rows, default 60,000; --quick 20,000), each
as 2 Parquet files (row groups of 10,000) and 2 TFRecord files written from
the same rows: Fashion-MNIST-shaped pixels as array<float>[784] and as 784
uint8 binary values (with a long label), and a tabular table of 13 numeric
(float) and 26 string columns (8-character tokens, 1,000 per column) and a
label. With 1 and 2 workers, each a process of its own pinned to a core,
reading shard i of n (rows/s: all rows over the slower worker's pass, after
an untimed warm-up pass):

  sparkgrad ParquetDataset          the new path: pyarrow row groups into the C
                                    table reader, batches of 100
  sparkgrad TFRecordDataset         our TFRecord reader over the same rows
  ... RawBytesFeature to float32    binary table: the same reader decoding the
                                    bytes in C to the float32 [100, 784] array
                                    ParquetDataset hands the model (the plain
                                    reader gives 100 bytes objects): the same
                                    output, and the anchor of the 0.5 goal
  sparkgrad Arrow feed              today's DataFrame feed: cluster.train(df) of
                                    the cached DataFrame (spark.read.parquet of the
                                    files) into n InputMode.SPARK workers taking
                                    batches of 100, local[4]
  Spark's floor                     a mapInArrow over the same cached DataFrame
                                    that only counts its rows (its 2 partitions)
  pyarrow -> NumPy (file floor)     one process reading the Parquet files' columns
                                    into NumPy (1 worker)
  Petastorm 0.13                    make_spark_converter(df) + make_torch_dataloader
                                    (reader_pool_type="thread", workers_count =
                                    cores, batches of 100), or a not-measured row
                                    with the reason it cannot run beside our
                                    pyarrow and NumPy

and the ratios the issue sets as goals: ParquetDataset against the TFRecord
reader (>= 0.5), the Arrow feed (>= 10) and Petastorm (>= 5).
--fit adds Estimator.fit seconds on the array<float> table (the walkthrough MLP,
2 workers, 2 epochs, local[4]), each run in a fresh driver process whose
SparkSession is started before the timer: this tree's Estimator on a plain
spark.read.parquet scan (its workers read the files); with --fit-baseline DIR,
also an earlier checkout's (built in place there, e.g. `git worktree add
/tmp/old 968f9fb && cd /tmp/old && python setup.py build_ext --inplace`),
whose feeding tasks take the same DataFrame cached, as that path is at its
best; the runs of the two alternate, and the ratio is from the same sitting.
Each driver fits twice: the first fit pays the session's first Python job
(Spark starting its Python workers), the second, in the same driver, finds
them started, as a notebook's later fits do; both are reported, with ratios.
Beside them, a worker's floor: two processes at once, each pinned to a core,
each reading one file (a worker's shard) twice at the file floor and taking
the same model's 2 epochs of steps on those rows in memory; no Spark, no
cluster, no allreduce. No fit on this machine can take less. And Spark's
part alone, in a fresh driver like the fits': a barrier stage of 2 Python
tasks that return at once, the session's first and its second.

    python bench/bench_tables.py [--quick] [--runs N] [--rows N] [--fit [--fit-baseline DIR]] [--skip-spark] [--update]
    python bench/bench_tables.py --fit-only [--fit-baseline DIR] [--update]   # the fit rows again, the others kept
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import benchlib
import numpy as np

ROWS, WIDTH, GROUP = 60_000, 784, 10_000


def prepare(work: str) -> dict[str, str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (ROWS, WIDTH), dtype=np.uint8)
    label = pa.array(rng.integers(0, 10, ROWS), pa.int64())
    floats = pa.FixedSizeListArray.from_arrays(pa.array(pixels.reshape(-1).astype(np.float32)), WIDTH)
    lists = pa.ListArray.from_arrays(pa.array(np.arange(0, ROWS * WIDTH + 1, WIDTH, dtype=np.int32)), floats.values)
    binary = pa.array([row.tobytes() for row in pixels], pa.binary())
    paths = {"list<float>": os.path.join(work, "floats.parquet"), "binary": os.path.join(work, "bytes.parquet")}
    pq.write_table(pa.table({"pixels": lists, "label": label}), paths["list<float>"], row_group_size=GROUP)
    pq.write_table(pa.table({"pixels": binary, "label": label}), paths["binary"], row_group_size=GROUP)
    return paths


def floor_batches(pf, columns=None):
    """pyarrow at its best: every row group as record batches of about 16 MiB, sized as ParquetDataset
    sizes them (reading a wide row group whole is up to twice as slow: see sparkgrad.data.table)."""
    from sparkgrad.data.table import read_rows_after

    rows = 1024
    for g in range(pf.num_row_groups):
        for batch in pf.iter_batches(batch_size=rows, row_groups=[g], columns=columns):
            rows = read_rows_after(batch)
            yield batch


def floor_pass(path: str) -> int:
    """pyarrow alone: each record batch's columns as NumPy arrays [rows, 784] and [rows]."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf, rows = pq.ParquetFile(path), 0
    for t in floor_batches(pf, ["pixels", "label"]):
        col = t.column("pixels")
        if pa.types.is_list(col.type):
            x = col.flatten().to_numpy().reshape(-1, WIDTH)
        else:
            offsets = np.frombuffer(col.buffers()[1], np.int32)[col.offset : col.offset + len(col) + 1]
            x = np.frombuffer(col.buffers()[2], np.uint8)[offsets[0] : offsets[-1]].reshape(-1, WIDTH)
        y = t.column("label").to_numpy()
        rows += x.shape[0] if x.shape[0] == y.shape[0] else 0
    return rows


def sparkgrad_epochs(path: str, shuffle: int, kind: str):
    """One dataset, as fit holds it: each call reads its next epoch."""
    from sparkgrad.data import Column, ParquetDataset

    width = WIDTH if kind == "list<float>" else None
    ds = ParquetDataset(path, {"pixels": Column("pixels", width=width)}, 100, label="label", shuffle_buffer=shuffle)
    return lambda: sum(b["pixels"].shape[0] for b in ds)


def timed(fn, runs: int) -> tuple[int, list[float]]:
    rows, seconds = 0, []
    for _ in range(runs):
        t0 = time.perf_counter()
        rows = fn()
        seconds.append(time.perf_counter() - t0)
    return rows, seconds


# ---- workers: the table ------------------------------------------------------------

BATCH, TOKENS, NUMERIC, STRINGS = 100, 1_000, 13, 26
PARQUET_DS, TFRECORD_DS = "sparkgrad ParquetDataset", "sparkgrad TFRecordDataset"
TFRECORD_DECODED = "sparkgrad TFRecordDataset, RawBytesFeature to float32"
ARROW_FEED, SPARK_FLOOR = "sparkgrad Arrow feed (cluster.train(df))", "Spark's floor (mapInArrow counting the rows)"
FILE_FLOOR, PETASTORM = "pyarrow -> NumPy (file floor)", "Petastorm 0.13"
FIT_NEW, FIT_OLD = "Estimator.fit, one task per worker (files)", "Estimator.fit, --fit-baseline (feeding tasks)"
FIT_SECOND = ", second fit in the driver"  # the metric of a driver's second fit: its Python workers started
FIT_SPARK = "Spark's floor: a barrier stage of 2 Python tasks that return at once"
FIT_FLOOR = "a worker's floor: file-floor reads of its shard + its steps in memory, one core each"
# every system of the --fit rows (the ratio row's included)
FIT_SYSTEMS = frozenset({FIT_NEW, FIT_OLD, FIT_FLOOR, FIT_SPARK, f"{FIT_OLD} / new"})


@dataclass(frozen=True)
class Table:
    """One table of the workers section: its files and how each reader takes its columns."""

    kind: str
    parquet: list[str]
    tfrecords: list[str]
    columns: dict = field(default_factory=dict)  # ParquetDataset's {input: Column}
    schema: dict = field(default_factory=dict)  # TFRecordDataset's {feature: FixedLenFeature}


def write_tables(work: str, rows: int) -> list[Table]:
    """The three tables as 2 Parquet files and 2 TFRecord files each, from the same rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sparkgrad.data import Column, FixedLenFeature, TFRecordWriter, encode_example

    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (rows, WIDTH), dtype=np.uint8)
    label = rng.integers(0, 10, rows).astype(np.int64)
    floats = (pixels / 255).astype(np.float32)
    numeric = rng.normal(size=(rows, NUMERIC)).astype(np.float32)
    vocab = np.array([f"{t:08x}" for t in rng.integers(0, 2**32, TOKENS)])
    strings = vocab[rng.integers(0, TOKENS, (rows, STRINGS))]
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * WIDTH)
    tables = {
        "array<float>[784]": pa.table(
            {"pixels": pa.ListArray.from_arrays(offsets, pa.array(floats.reshape(-1))), "label": label}
        ),
        "binary[784]": pa.table({"pixels": pa.array([r.tobytes() for r in pixels], pa.binary()), "label": label}),
        "tabular 13 numeric + 26 string": pa.table(
            {
                **{f"i{j}": numeric[:, j] for j in range(NUMERIC)},
                **{f"c{j}": pa.array(strings[:, j]) for j in range(STRINGS)},
                "label": label,
            }
        ),
    }
    tabular_columns = {f"i{j}": f"i{j}" for j in range(NUMERIC)} | {f"c{j}": f"c{j}" for j in range(STRINGS)}
    out = []
    for k, (kind, table) in enumerate(tables.items()):
        parquet, tfrecords = [], []
        for shard in range(2):
            part = table.slice(shard * (rows // 2), rows // 2 if shard == 0 else rows - rows // 2)
            parquet.append(os.path.join(work, f"t{k}-{shard}.parquet"))
            pq.write_table(part, parquet[-1], row_group_size=GROUP)
            tfrecords.append(os.path.join(work, f"t{k}-{shard}.tfrecords"))
            first = shard * (rows // 2)
            with TFRecordWriter(tfrecords[-1]) as w:
                for i in range(first, first + part.num_rows):
                    if k == 0:
                        feats = {"pixels": floats[i], "label": label[i : i + 1]}
                    elif k == 1:
                        feats = {"pixels": pixels[i].tobytes(), "label": label[i : i + 1]}
                    else:
                        feats = {f"i{j}": numeric[i, j : j + 1] for j in range(NUMERIC)}
                        feats |= {f"c{j}": strings[i, j] for j in range(STRINGS)} | {"label": label[i : i + 1]}
                    w.write(encode_example(feats))
        if k == 0:
            columns = {"pixels": Column("pixels", width=WIDTH)}
            schema = {"pixels": FixedLenFeature([WIDTH], "float32")}
        elif k == 1:
            columns = {"pixels": Column("pixels")}
            schema = {"pixels": FixedLenFeature([], "bytes")}
        else:
            columns = tabular_columns
            schema = {f"i{j}": FixedLenFeature([], "float32") for j in range(NUMERIC)}
            schema |= {f"c{j}": FixedLenFeature([], "bytes") for j in range(STRINGS)}
        schema["label"] = FixedLenFeature([], "int64")
        out.append(Table(kind, parquet, tfrecords, columns, schema))
    return out


def _reader_pass(system: str, table: Table, shard: int, shards: int):
    """A function reading shard ``shard`` of ``shards`` once (its rows), as one worker would."""
    from sparkgrad.data import ParquetDataset, TFRecordDataset

    if system == PARQUET_DS:
        ds = ParquetDataset(table.parquet, table.columns, BATCH, label="label", shard_index=shard, num_shards=shards)
    else:
        schema = decoded_schema(table.schema) if system == TFRECORD_DECODED else table.schema
        ds = TFRecordDataset(table.tfrecords, schema, BATCH, shard_index=shard, num_shards=shards)
    return lambda: sum(len(b["label"]) for b in ds)


def decoded_schema(schema: dict) -> dict:
    """The binary table's TFRecord schema with the pixels' bytes decoded in C to float32 [784]."""
    from sparkgrad.data import RawBytesFeature

    return {**schema, "pixels": RawBytesFeature([WIDTH], "float32")}


def _reader_worker(system: str, table: Table, shard: int, shards: int, runs: int, out: Any) -> None:
    """One worker process: pinned to a core, an untimed pass, then ``runs`` timed passes: (rows, seconds)."""
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[shard % len(cores)]})
    read = _reader_pass(system, table, shard, shards)
    read()
    out.put((shard, timed(read, runs)))


def readers_rate(system: str, table: Table, shards: int, runs: int) -> list[float]:
    """rows/s of ``shards`` worker processes reading their shards: all rows over the slower worker's time."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_reader_worker, args=(system, table, i, shards, runs, out)) for i in range(shards)]
    for p in procs:
        p.start()
    got = [out.get(timeout=900) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        if p.exitcode != 0:
            raise RuntimeError(f"{system}: a worker exited with status {p.exitcode}")
    rows = sum(r[1][0] for r in got)
    return [rows / max(r[1][1][i] for r in got) for i in range(runs)]


def file_floor(table: Table) -> int:
    """pyarrow alone, one process: every column of the files into NumPy (strings as their Arrow buffers)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 0
    for path in table.parquet:
        pf = pq.ParquetFile(path)
        for t in floor_batches(pf):
            for col in t.columns:
                if pa.types.is_list(col.type):
                    col.flatten().to_numpy().reshape(len(col), -1)
                elif pa.types.is_binary(col.type) or pa.types.is_string(col.type):
                    np.frombuffer(col.buffers()[2], np.uint8)
                    np.frombuffer(col.buffers()[1], np.int32)
                else:
                    col.to_numpy()
            rows += t.num_rows
    return rows


def feed_worker(args, ctx):
    """A worker of today's DataFrame feed: takes batches until the feed ends; the rows that arrived."""
    from sparkgrad import TFNode

    feed = TFNode.DataFeed(ctx.mgr, timeout=600)
    rows = 0
    while not feed.should_stop():
        cols = feed.next_batch_columns(args["batch"])
        if cols:
            rows += len(next(iter(cols.values())))
    return {"rows": rows}


def arrow_feed_rate(spark, df, rows: int, workers: int) -> float:
    """rows/s of one cluster.train(df) into ``workers`` counting workers (formation and shutdown untimed)."""
    from sparkgrad import TFCluster
    from sparkgrad.cluster.roles import InputMode

    cluster = TFCluster.run(
        spark, feed_worker, {"batch": BATCH}, workers, 0, input_mode=InputMode.SPARK, output=lambda line: None
    )
    try:
        start = time.perf_counter()
        cluster.train(df, num_epochs=1, feed_timeout=600)
        seconds = time.perf_counter() - start
    finally:
        cluster.shutdown(timeout=300)
    got = sum(r["rows"] for r in cluster.results.values() if isinstance(r, dict))
    if got != rows:
        raise RuntimeError(f"the workers counted {got} rows of {rows}")
    return rows / seconds


def spark_floor_rate(df, rows: int) -> float:
    """rows/s of a mapInArrow over the DataFrame's columns that only counts the rows."""

    def count(batches):
        import pyarrow as pa

        n = sum(b.num_rows for b in batches)
        yield pa.RecordBatch.from_arrays([pa.array([n], pa.int64())], names=["n"])

    start = time.perf_counter()
    seen = sum(r["n"] for r in df.mapInArrow(count, "n long").collect())
    if seen != rows:
        raise RuntimeError(f"the floor counted {seen} rows of {rows}")
    return rows / (time.perf_counter() - start)


def petastorm_rate(spark, df, rows: int, work: str) -> tuple[float | None, str]:
    """rows/s of Petastorm 0.13's converter and torch DataLoader over the DataFrame (conversion untimed), or
    None and why it cannot run in this interpreter."""
    try:
        from petastorm.spark import SparkDatasetConverter, make_spark_converter
    except Exception as e:  # noqa: BLE001 - any import failure is the row's reason
        import pyarrow

        if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == "petastorm":
            return None, "petastorm is not installed here (make bench installs the anchors extra, petastorm==0.13.1)"
        return None, (
            f"petastorm does not import beside pyarrow {pyarrow.__version__} and NumPy {np.__version__}: "
            f"{type(e).__name__}: {e}"
        )
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, "file://" + os.path.join(work, "petastorm"))
    converter = make_spark_converter(df)
    try:
        start, seen = time.perf_counter(), 0
        workers = len(os.sched_getaffinity(0))
        with converter.make_torch_dataloader(
            batch_size=BATCH, num_epochs=1, workers_count=workers, reader_pool_type="thread"
        ) as loader:
            for batch in loader:
                seen += len(batch["label"])
        seconds = time.perf_counter() - start
    finally:
        converter.delete()
    if seen != rows:
        return None, f"read {seen} rows of {rows}"
    return rows / seconds, ""


def fit_model():
    """The model both Estimator.fit and a worker's floor train: the 784-128-10 MLP, seed 1."""
    from sparkgrad.nn import Dense, Sequential

    return Sequential([Dense(128, activation="relu", input_shape=(WIDTH,)), Dense(10, activation="softmax")], seed=1)


def estimator_fit_seconds(df, **kwargs) -> float:
    """Seconds of ``Estimator(...).fit(df)`` end to end: the walkthrough MLP on the array<float> table, 2
    workers, 2 epochs (``kwargs``: the path's own Estimator arguments)."""
    from sparkgrad.spark import Estimator

    estimator = Estimator(
        model=fit_model(), featuresCol="pixels", labelCol="label", batch_size=BATCH, epochs=2, num_workers=2, **kwargs
    )
    start = time.perf_counter()
    estimator.fit(df)
    return time.perf_counter() - start


def _innermost(e: BaseException) -> str:
    """The innermost Python error in an exception's text (a Spark task's traceback), else its first line."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception): ", ln)]
    return (errors[-1] if errors else f"{type(e).__name__}: {lines[0] if lines else ''}")[:300]


def measured(system: str, metric: str, fn, runs: int) -> dict:
    """The median row of ``fn``'s rates over ``runs`` calls, or a not-measured row with the failure."""
    try:
        rates = [fn() for _ in range(runs)]
    except Exception as e:  # noqa: BLE001 - a system that fails is reported, not fatal to the others
        return benchlib.not_measured(system, metric, _innermost(e), "rows/s")
    return benchlib.median_row(system, metric, rates, "rows/s", digits=0)


def workers_section(args, work: str, runs: int) -> list[dict]:
    rows = args.rows or (20_000 if args.quick else ROWS)
    tables = write_tables(work, rows)
    out: list[dict] = []
    for table in tables:
        for workers in (1, 2):
            metric = f"rows/s, {table.kind}, {workers} worker{'s' if workers > 1 else ''}"
            systems = (PARQUET_DS, TFRECORD_DS) + ((TFRECORD_DECODED,) if table.kind.startswith("binary") else ())
            for system in systems:
                if system != PARQUET_DS and workers > len(table.tfrecords):
                    continue
                fn = lambda system=system, w=workers, t=table: readers_rate(system, t, w, 1)[0]  # noqa: E731
                out.append(measured(system, metric, fn, runs))
        out.append(measured(FILE_FLOOR, f"rows/s, {table.kind}, 1 worker", lambda t=table: _floor_rate(t), runs))
    if not args.skip_spark:
        out += spark_section(args, tables, rows, runs, work)
        if args.fit:
            out += fit_section(args, tables[0], runs)
    return out + goal_ratios(out)


def fit_section(args, table: Table, runs: int) -> list[dict]:
    """Estimator.fit seconds of this tree and (--fit-baseline) an earlier checkout, alternating runs, each in
    a fresh driver (fit_child)."""
    trees = {FIT_NEW: (str(benchlib.ROOT / "python"), False)}
    if args.fit_baseline:
        trees[FIT_OLD] = (os.path.join(os.path.abspath(args.fit_baseline), "python"), True)
    metric = f"seconds, {table.kind}, 2 workers, 2 epochs"
    metrics = (metric, metric + FIT_SECOND)  # a fresh driver's first fit, then its second
    seconds: dict[tuple[str, str], list[float]] = {(n, m): [] for n in trees for m in metrics}
    for _ in range(runs):
        for name, (pythonpath, cached) in trees.items():
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([pythonpath, os.path.dirname(__file__)]))
            cached_flag = ["--cached"] if cached else []
            firsts = _child_seconds(name, ["--fit-child", *table.parquet, *cached_flag], env)
            for m, v in zip(metrics, firsts, strict=True):
                seconds[name, m].append(v)
    out = [benchlib.median_row(n, m, values, "s", digits=2) for (n, m), values in seconds.items()]
    stages: dict[str, list[float]] = {m: [] for m in metrics}
    for _ in range(runs):
        for m, v in zip(metrics, _child_seconds("the Spark floor", ["--spark-floor-child"]), strict=True):
            stages[m].append(v)
    out += [benchlib.median_row(FIT_SPARK, m, values, "s", digits=2) for m, values in stages.items()]
    floors = [fit_floor_seconds(table) for _ in range(runs)]
    out.append(
        benchlib.median_row(FIT_FLOOR, metric.replace("seconds", "seconds of a worker's work"), floors, "s", digits=2)
    )
    if FIT_OLD in trees:
        for m in metrics:
            ratio = statistics.median(seconds[FIT_OLD, m]) / statistics.median(seconds[FIT_NEW, m])
            out.append(benchlib.row(f"{FIT_OLD} / new", m.replace("seconds", "speed-up"), round(ratio, 2), "x", goal=5))
    return out


def _child_seconds(what: str, argv: list[str], env: dict[str, str] | None = None) -> list[float]:
    """The two seconds (a fresh driver's first and second) a child of this script prints last."""
    done = subprocess.run([sys.executable, __file__, *argv], env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"bench_tables: {what} failed:\n{done.stderr[-3000:]}")
    return [float(v) for v in done.stdout.strip().splitlines()[-2:]]


def fit_only(args, runs: int) -> int:
    """--fit-only: the Estimator.fit rows measured again; the results file's other rows are kept as they were
    (its notes say from which run)."""
    path = pathlib.Path(args.out) if args.out else benchlib.results_file("tables.json", args.update)
    with tempfile.TemporaryDirectory(prefix="sparkgrad-bench-tables-") as work:
        table = write_tables(work, args.rows or (20_000 if args.quick else ROWS))[0]
        fit_rows = fit_section(args, table, runs)
    kept, old = benchlib.kept_rows(path, lambda r: r["system"] not in FIT_SYSTEMS)
    meta = benchlib.metadata("tables", packages=benchlib.PACKAGES + ("pyarrow",))
    meta["notes"] = [n for n in old.get("notes", []) if not n.startswith("--fit-only:")]
    if kept:
        meta["notes"].append(
            f"--fit-only: the Estimator.fit rows are from this run; the others from {benchlib.run_of(old)}"
        )
    benchlib.write_results(path, kept + fit_rows, meta)
    benchlib.print_rows(fit_rows)
    return 0


def _fresh_session(app: str) -> Any:
    """The local[4] session of a fit child, started (before any timer) in this fresh process."""
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[4]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "3g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def fit_child(paths: list[str], cached: bool) -> None:
    """Two Estimator.fits in this fresh process (its SparkSession started before the timer); prints the
    seconds of each, a line each."""
    spark = _fresh_session("bench_tables_fit")
    df = spark.read.parquet(*paths)
    if cached:
        df = df.cache()
        df.count()
    print(estimator_fit_seconds(df))
    print(estimator_fit_seconds(df))
    spark.stop()


def spark_floor_child() -> None:
    """Spark's part of a fit, in a fresh driver as fit_child's: a barrier stage of 2 Python tasks that return
    at once, twice (the first starts the session's Python workers); prints the seconds of each."""
    spark = _fresh_session("bench_tables_spark_floor")
    for _ in range(2):
        start = time.perf_counter()
        spark.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(lambda rows: [0]).collect()
        print(time.perf_counter() - start)
    spark.stop()


def fit_floor_seconds(table: Table) -> float:
    """What fit's workers cannot do without, with nothing else: two processes at once, each pinned to a
    core, each reading one of the two files (a worker's shard) twice at the file floor and taking the same
    model's steps over those rows in memory (2 epochs, batch 100); the slower one's seconds."""
    path = os.pathsep.join([str(benchlib.ROOT / "python"), os.path.dirname(__file__)])
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")  # one thread, as a task of spark.task.cpus=1
    cores = sorted(os.sched_getaffinity(0))
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--fit-floor-child", path, str(cores[i % len(cores)])],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i, path in enumerate(table.parquet[:2])
    ]
    seconds = []
    for child in children:
        out, _ = child.communicate(timeout=900)
        if child.returncode != 0:
            raise SystemExit(f"bench_tables: the fit floor's child failed ({child.returncode})")
        seconds.append(float(out.strip().splitlines()[-1]))
    return max(seconds)


def fit_floor_child(path: str, core: int) -> None:
    """One worker's floor (see fit_floor_seconds): prints its seconds."""
    import pyarrow.parquet as pq

    os.sched_setaffinity(0, {core})
    pf = pq.ParquetFile(path)
    x = np.concatenate([b.column("pixels").flatten().to_numpy().reshape(-1, WIDTH) for b in floor_batches(pf)])
    y = pq.read_table(path, columns=["label"]).column("label").to_numpy()
    model = fit_model()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)  # untimed: kernels built
    start = time.perf_counter()
    for _ in range(2):
        floor_pass(path)
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    print(time.perf_counter() - start)


def _floor_rate(table: Table) -> float:
    file_floor(table)  # warm
    start = time.perf_counter()
    rows = file_floor(table)
    return rows / (time.perf_counter() - start)


def spark_section(args, tables: list[Table], rows: int, runs: int, work: str) -> list[dict]:
    """Today's Arrow feed, Spark's floor, Petastorm and (--fit) Estimator.fit, on one local[4] session."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[4]")  # 2 node tasks (a barrier stage) + 2 feeding tasks
        .appName("bench_tables")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "3g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    out: list[dict] = []
    try:
        for table in tables:
            df = spark.read.parquet(*table.parquet).cache()
            df.count()
            if table is tables[0]:  # untimed: Spark's Python workers and the JVM's Arrow paths warmed
                arrow_feed_rate(spark, df.limit(1000), 1000, 1)
            for workers in (1, 2):
                metric = f"rows/s, {table.kind}, {workers} worker{'s' if workers > 1 else ''}"
                out.append(
                    measured(ARROW_FEED, metric, lambda w=workers, d=df: arrow_feed_rate(spark, d, rows, w), runs)
                )
            metric = f"rows/s, {table.kind}, 2 workers"
            out.append(measured(SPARK_FLOOR, metric, lambda d=df: spark_floor_rate(d, rows), runs))
            rate, why = petastorm_rate(spark, df, rows, work)
            metric = f"rows/s, {table.kind}, 1 worker"
            out.append(
                benchlib.row(PETASTORM, metric, round(rate), "rows/s")
                if rate is not None
                else benchlib.not_measured(PETASTORM, metric, why, "rows/s")
            )
            df.unpersist()
    finally:
        spark.stop()
    return out


def goal_ratios(rows: list[dict]) -> list[dict]:
    """ParquetDataset's rows/s over each anchor's, per table and workers, where both were measured."""
    value = {(r["system"], r["metric"]): r["value"] for r in rows if r.get("value") is not None}
    out = []
    for (system, metric), rate in value.items():
        if system != PARQUET_DS:
            continue
        # against the TFRecord reader that hands the model the same arrays, where the raw one does not
        tfrecord = TFRECORD_DECODED if value.get((TFRECORD_DECODED, metric)) else TFRECORD_DS
        for anchor, goal in ((tfrecord, 0.5), (ARROW_FEED, 10), (PETASTORM, 5)):
            if value.get((anchor, metric)):
                ratio = round(rate / value[(anchor, metric)], 2)
                out.append(
                    benchlib.row(f"{PARQUET_DS} / {anchor}", metric.replace("rows/s", "ratio"), ratio, "x", goal=goal)
                )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one pass each")
    ap.add_argument("--runs", type=int, default=None, help="passes per configuration (the median is kept); default 3")
    ap.add_argument("--out", default=None, help="the results file (default: see --update)")
    ap.add_argument("--rows", type=int, default=None, help="rows of each workers-section table (default 60,000)")
    ap.add_argument("--fit", action="store_true", help="also Estimator.fit seconds (see the module doc)")
    ap.add_argument("--fit-baseline", default=None, help="an earlier checkout whose Estimator.fit --fit also times")
    ap.add_argument("--fit-child", nargs="+", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cached", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--fit-floor-child", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--spark-floor-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--fit-only", action="store_true", help="only the --fit rows, keeping the other rows of the results file"
    )
    ap.add_argument("--skip-spark", action="store_true", help="no Spark rows (Arrow feed, floor, Petastorm, fit)")
    benchlib.add_update_flag(ap)
    args = ap.parse_args()
    if args.fit_child:
        fit_child(args.fit_child, args.cached)
        return 0
    if args.spark_floor_child:
        spark_floor_child()
        return 0
    if args.fit_floor_child:
        fit_floor_child(args.fit_floor_child[0], int(args.fit_floor_child[1]))
        return 0
    runs = args.runs or (1 if args.quick else 3)
    if args.fit_only:
        return fit_only(args, runs)
    meta = benchlib.metadata("tables", packages=benchlib.PACKAGES + ("pyarrow",))
    meta["notes"] = [
        f"every figure is the median of {runs} passes over {ROWS:,} rows (wall clock), with min and max",
        "one process pinned to one core; synthetic Fashion-MNIST-shaped rows, row groups of 10,000",
        "workers rows: one process per worker, each pinned to a core, reading its shard; rows/s over the slower "
        "worker's pass; the Arrow feed and Spark's floor on a cached DataFrame in local[4]",
    ]
    rows_out: list[dict] = []
    allowed = os.sched_getaffinity(0)
    with tempfile.TemporaryDirectory(prefix="sparkgrad-bench-tables-") as work:
        paths = prepare(work)
        os.sched_setaffinity(0, {min(allowed)})
        try:
            for kind, path in paths.items():
                systems = {
                    "pyarrow -> NumPy (file floor)": lambda p=path: floor_pass(p),
                    "sparkgrad ParquetDataset": sparkgrad_epochs(path, 0, kind),
                    "sparkgrad ParquetDataset, shuffle_buffer=10000": sparkgrad_epochs(path, 10_000, kind),
                }
                medians = {}
                for system, fn in systems.items():
                    fn()  # warm: page cache, imports, the dataset's buffer pool
                    n, seconds = timed(fn, runs)
                    if n != ROWS:
                        raise SystemExit(f"bench_tables: {system} read {n} rows of {ROWS}")
                    rates = [n / s for s in seconds]
                    rows_out.append(benchlib.median_row(system, f"rows_per_s_{kind}", rates, "rows/s", digits=0))
                    medians[system] = benchlib.summarise(rates)["median"]
                floor = medians["pyarrow -> NumPy (file floor)"]
                for system, rate in medians.items():
                    if system.startswith("sparkgrad"):
                        rows_out.append(benchlib.row(system, f"fraction_of_floor_{kind}", round(rate / floor, 2), "x"))
        finally:
            os.sched_setaffinity(0, allowed)
        rows_out += workers_section(args, work, runs)
    path = args.out or benchlib.results_file("tables.json", args.update)
    if not args.fit and not args.skip_spark:  # the --fit rows of the earlier file stay, saying from which run
        kept, old = benchlib.kept_rows(path, lambda r: r["system"] in FIT_SYSTEMS)
        if kept:
            rows_out += kept
            meta["notes"].append(f"the Estimator.fit rows are from {benchlib.run_of(old)}, kept: no --fit this time")
    benchlib.write_results(path, rows_out, meta)
    benchlib.print_rows(rows_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
