"""DataFrame feeding and scoring throughput: Arrow feeding vs the RDD path vs TensorFlowOnSpark, and
Model.transform vs a PyTorch pandas UDF.

Data: the Fashion-MNIST training images (60,000 rows; ``--quick``: 10,000;
random pixels if the dataset is absent), as three DataFrames written once to
Parquet and cached before any timed run: ``features`` array<float>[784] (pixels
/ 255), ``features`` VectorUDT (dense, the same values) and ``image_raw``
binary (784 bytes), each with a ``label`` long; and the same rows as 2
TFRecord files (TF's image_raw layout).

Feeding (rows/s into 2 workers of an InputMode.SPARK cluster that take
batches of 100 and count them; wall clock of ``cluster.train`` alone, the
cluster formed before and shut down after):

  sparkgrad Arrow feed     cluster.train(df): mapInArrow, Arrow buffers into the C feed
  sparkgrad RDD path       cluster.train(df.rdd): a Row per row, packed by the feeder
  TensorFlowOnSpark 2.2.5  bench/feed_tfos.py in the first interpreter with tensorflow and
                           tensorflowonspark (this one, or
                           $SPARKGRAD_TF_PYTHON): cluster.train(df.rdd), as TFoS takes a DataFrame, DataFeed.next_batch
                           (--quick: the array<float> DataFrame only)
  sparkgrad TFRecords      2 InputMode.TENSORFLOW workers reading their file with TFRecordDataset
                           (rows / the slower worker's read time)
  Spark's floor            mapInArrow over the same cached DataFrame's columns that only counts
                           the rows (no cluster): what moving them from the JVM to Python costs,
                           which bounds any feeder that takes its rows through Arrow

Scoring (rows/s of a DataFrame of 784-float arrays in 2 partitions through
the walkthrough MLP, 784-128-64-10 softmax, written to Spark's ``noop`` sink):

  sparkgrad Model.transform         sparkgrad.spark.Model.from_nn(model, featuresCol="features"): the feature
                                    column alone to an iterator pandas UDF, C engine on the task's share of the
                                    cores; the whole output (input columns, prediction, probability vector)
  ..., prediction only              probabilityCol="" and the prediction column alone: the UDF's work
  mlflow.pyfunc.spark_udf           the sparkgrad MLflow flavor's pyfunc (pyfunc_output="prediction")
  PyTorch pandas UDF                the same weights in torch.nn, eval() + inference_mode, one
                                    thread per task (2 tasks on 2 cores), Arrow batches of 1,024
  Spark's floor                     mapInArrow over the features column that only counts the rows
                                    (one row per partition back): what moving the features from
                                    the JVM to Python costs, which no scorer in Python can beat

Before the timed runs each feeding system feeds once untimed (Spark's Python workers, the
JVM's Arrow and pickling paths warmed, as a long-running session has them): without it the
first system measured pays for every start. Each figure is the median of ``--repeat`` runs
(default 3) with min and max.
A system that cannot run is a row with value null and the reason.

    python bench/bench_feed.py [--quick] [--repeat N] [--rows N]

Prints the table and writes bench/results/feed.json (rows system, metric, value, unit).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import benchlib
import pandas as pd

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))
TF_PYTHONS = [sys.executable, os.environ.get("SPARKGRAD_TF_PYTHON", "")]  # make bench installs the anchors here
PIXELS, CLASSES, WORKERS, BATCH = 784, 10, 2, 100
SCORE_PARTITIONS, UDF_BATCH = 2, 1024


# ---- node functions (pickled by value from __main__ into the Spark tasks) -------------------


def feed_worker(args, ctx):
    """Takes batches of args["batch"] rows until the feed ends; returns how many rows arrived."""
    from sparkgrad import TFNode

    feed = TFNode.DataFeed(ctx.mgr, timeout=600)
    rows = 0
    while not feed.should_stop():
        cols = feed.next_batch_columns(args["batch"])
        if cols:
            rows += len(next(iter(cols.values())))
    return {"rows": rows}


def tfrecord_worker(args, ctx):
    """Reads this worker's share of the TFRecord files; (rows, seconds)."""
    import time

    from sparkgrad.data import TFRecordDataset
    from sparkgrad.data.convert import mnist_schema

    ds = TFRecordDataset(
        args["files"], mnist_schema("image_raw"), args["batch"], shard_index=ctx.task_index, num_shards=WORKERS
    )
    start, rows = time.perf_counter(), 0
    for batch in ds:
        rows += len(batch["label"])
    return {"rows": rows, "seconds": time.perf_counter() - start}


# ---- data --------------------------------------------------------------------------------


def images(rows: int):
    """(uint8 [rows, 784], int64 [rows]): Fashion-MNIST train, or random pixels where it is absent."""
    import numpy as np
    from sparkgrad.data.idx import FASHION_MNIST_DIR, read_idx

    path = os.path.join(FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz")
    if os.path.exists(path):
        x = read_idx(path).reshape(-1, PIXELS)[:rows]
        y = read_idx(os.path.join(FASHION_MNIST_DIR, "train-labels-idx1-ubyte.gz"))[:rows].astype(np.int64)
        if len(x) == rows:
            return np.ascontiguousarray(x), y
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (rows, PIXELS), dtype=np.uint8), rng.integers(0, CLASSES, rows).astype(np.int64)


def prepare(spark, work: pathlib.Path, rows: int) -> dict[str, str]:
    """Parquet files of the three DataFrames and 2 TFRecord files of the same rows; their paths."""
    import numpy as np
    from pyspark.ml.functions import array_to_vector
    from sparkgrad.data import TFRecordWriter, encode_example

    x, y = images(rows)
    features = (x.astype(np.float32) / 255).astype(np.float32)
    paths = {k: str(work / k) for k in ("array", "vector", "binary")}
    pdf = pd.DataFrame({"features": list(features), "label": y})
    array_df = spark.createDataFrame(pdf, "features array<float>, label long").repartition(4)
    array_df.write.parquet(paths["array"])
    arr = spark.read.parquet(paths["array"])
    arr.select(array_to_vector("features").alias("features"), "label").write.parquet(paths["vector"])
    raw = pd.DataFrame({"image_raw": [row.tobytes() for row in x], "label": y})
    spark.createDataFrame(raw, "image_raw binary, label long").repartition(4).write.parquet(paths["binary"])
    files = []
    for shard in range(WORKERS):
        file = str(work / f"train-{shard}.tfrecords")
        with TFRecordWriter(file) as w:
            for i in range(shard, rows, WORKERS):
                w.write(encode_example({"image_raw": x[i].tobytes(), "label": np.array([y[i]])}))
        files.append(file)
    paths["tfrecords"] = ",".join(files)
    return paths


def cached(spark, path: str):
    df = spark.read.parquet(path).cache()
    df.count()
    return df


# ---- feeding -----------------------------------------------------------------------------


def quiet(line: str) -> None:
    pass


def time_feed(spark, data, rows: int) -> float:
    """rows/s of one cluster.train(data) into 2 counting workers."""
    from sparkgrad import TFCluster
    from sparkgrad.cluster.roles import InputMode

    cluster = TFCluster.run(spark, feed_worker, {"batch": BATCH}, WORKERS, 0, input_mode=InputMode.SPARK, output=quiet)
    try:
        start = time.perf_counter()
        cluster.train(data, num_epochs=1, feed_timeout=600)
        seconds = time.perf_counter() - start
    finally:
        cluster.shutdown(timeout=300)
    got = sum(r["rows"] for r in cluster.results.values() if isinstance(r, dict))
    if got != rows:
        raise RuntimeError(f"the workers counted {got} rows of {rows}")
    return rows / seconds


def time_tfrecords(spark, files: list[str], rows: int) -> float:
    from sparkgrad import TFCluster

    args = {"batch": BATCH, "files": files}
    cluster = TFCluster.run(spark, tfrecord_worker, args, WORKERS, 0, output=quiet)
    cluster.shutdown(timeout=300)
    done = [r for r in cluster.results.values() if isinstance(r, dict)]
    if sum(r["rows"] for r in done) != rows:
        raise RuntimeError(f"the workers read {sum(r['rows'] for r in done)} rows of {rows}")
    return rows / max(r["seconds"] for r in done)


def tfos_python() -> tuple[str | None, str]:
    """The first interpreter with tensorflow, tensorflowonspark and pyspark; (path, why not)."""
    return benchlib.python_with(TF_PYTHONS, ("tensorflow", "tensorflowonspark", "pyspark"))


def run_tfos(python: str, kind: str, path: str, rows: int, repeat: int, work: pathlib.Path) -> tuple[list, str]:
    out = work / f"tfos-{kind}.json"
    cmd = [python, str(ROOT / "bench" / "feed_tfos.py"), "--data", path, "--rows", str(rows)]
    cmd += ["--repeat", str(repeat), "--warmup", "1", "--batch", str(BATCH), "--out", str(out)]
    log = work / f"tfos-{kind}.log"
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=work, timeout=3600).returncode
        except subprocess.TimeoutExpired:
            return [], f"timed out after 3600 s (log {log})"
    if rc != 0 or not out.exists():
        tail = " / ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        return [], f"exit status {rc} (log {log}): {tail[-300:]}"
    return json.loads(out.read_text())["rows_per_second"], ""


# ---- scoring -----------------------------------------------------------------------------


def mlp(seed: int = 1):
    from sparkgrad.nn import Dense, Sequential

    layers = [
        Dense(128, activation="relu", input_shape=(PIXELS,)),
        Dense(64, activation="relu"),
        Dense(CLASSES, activation="softmax"),
    ]
    model = Sequential(layers, seed=seed)
    model.compile(loss="sparse_categorical_crossentropy")
    return model


def noop(df) -> None:
    df.write.format("noop").mode("overwrite").save()


def time_transform(df, rows: int, prediction_only: bool = False):
    """Model.transform over df (the feature column alone goes to Python, the weights shipped once, the model
    built once per worker): its whole output (the input columns, the predicted class and the probability
    vector), or, for the same work as the PyTorch UDF, the predicted class alone (probabilityCol="")."""
    from sparkgrad.spark import Model

    if prediction_only:
        scorer = Model.from_nn(mlp(), featuresCol="features", probabilityCol="")
        out = scorer.transform(df).select("prediction")
    else:
        out = Model.from_nn(mlp(), featuresCol="features").transform(df)
    start = time.perf_counter()
    noop(out)
    return rows / (time.perf_counter() - start), ""


def time_mlflow_udf(spark, df, rows: int, work: pathlib.Path):
    try:
        import mlflow.pyfunc
    except ImportError as e:
        return None, f"mlflow not importable: {e}"
    import sparkgrad.mlflow as sgmlflow

    path = work / f"mlflow-model-{time.monotonic_ns()}"
    sgmlflow.save_model(mlp(), path, pyfunc_output="prediction")
    udf = mlflow.pyfunc.spark_udf(spark, str(path), result_type="double")
    start = time.perf_counter()
    noop(df.select(udf("features").alias("prediction")))
    return rows / (time.perf_counter() - start), ""


def torch_udf(state: dict, threads: int):
    """An iterator pandas UDF: the MLP in torch, built once per task, scoring Arrow batches."""
    from pyspark.sql.functions import pandas_udf

    @pandas_udf("double")
    def predict(batches: Iterator[pd.Series]) -> Iterator[pd.Series]:  # resolved in this module's globals
        import numpy as np
        import torch

        torch.set_num_threads(threads)
        net = torch.nn.Sequential(
            torch.nn.Linear(PIXELS, 128),
            torch.nn.ReLU(),
            torch.nn.Linear(128, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, CLASSES),
            torch.nn.Softmax(dim=1),
        )
        net.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        net.eval()
        with torch.inference_mode():
            for series in batches:
                x = torch.from_numpy(np.stack(series.to_numpy()).astype(np.float32, copy=False))
                yield pd.Series(net(x).argmax(dim=1).double().numpy())

    return predict


def time_arrow_floor(df, rows: int, columns: tuple[str, ...] = ("features",)):
    """rows/s of a mapInArrow over the columns that only counts their rows."""

    def count(batches):
        import pyarrow as pa

        n = sum(b.num_rows for b in batches)
        yield pa.RecordBatch.from_arrays([pa.array([n], pa.int64())], names=["n"])

    start = time.perf_counter()
    seen = sum(r["n"] for r in df.select(*columns).mapInArrow(count, "n long").collect())
    if seen != rows:
        raise RuntimeError(f"the floor's count saw {seen} rows of {rows}")
    return rows / (time.perf_counter() - start), ""


def time_torch_udf(spark, df, rows: int):
    try:
        import torch  # noqa: F401
    except ImportError as e:
        return None, f"torch not importable: {e}"
    weights = mlp().get_weights()  # Keras layouts: kernel [in, out], bias [out]
    state = {}
    for i, layer in enumerate((0, 2, 4)):
        state[f"{layer}.weight"] = weights[2 * i].T.copy()
        state[f"{layer}.bias"] = weights[2 * i + 1].copy()
    threads = max(1, (os.cpu_count() or 1) // SCORE_PARTITIONS)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(UDF_BATCH))
    udf = torch_udf(state, threads)
    start = time.perf_counter()
    noop(df.select(udf("features").alias("prediction")))
    return rows / (time.perf_counter() - start), ""


# ---- driver ------------------------------------------------------------------------------


def row(system: str, metric: str, values: list[float], unit: str, reason: str = "") -> dict:
    """The median of a system's runs, or a not-measured row with the reason."""
    if not values:
        return benchlib.not_measured(system, metric, reason or "no run", unit)
    return benchlib.median_row(system, metric, values, unit, digits=0)


def failure(e: BaseException) -> str:
    """The innermost Python error in an exception's text (a Spark task's traceback), else its first line."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception): ", ln) and "Traceback" not in ln]
    return (errors[-1] if errors else f"{type(e).__name__}: {lines[0] if lines else ''}")[:300]


def measure(fn, repeat: int) -> tuple[list[float], str]:
    values = []
    for _ in range(repeat):
        try:
            value, *why = fn()
        except Exception as e:  # a system that fails is reported, not fatal to the others
            return values, failure(e)
        if value is None:
            return values, why[0] if why else "not measured"
        values.append(value)
    return values, ""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick", action="store_true", help="10,000 rows, one run of each, TensorFlowOnSpark on array<float> only"
    )
    p.add_argument("--repeat", type=int, default=None, help="runs of each system (default 3; --quick: 1)")
    p.add_argument("--rows", type=int, default=None, help="rows of each DataFrame (default 60,000)")
    p.add_argument("--skip-tfos", action="store_true")
    p.add_argument("--parts", default="feed,score", help="feed, score or both (comma-separated)")
    benchlib.add_update_flag(p)
    args = p.parse_args()
    meta = benchlib.metadata("feed")
    rows = args.rows or (10_000 if args.quick else 60_000)
    repeat = args.repeat or (1 if args.quick else 3)

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from pyspark.sql import SparkSession

    # 2 node tasks (a barrier stage holds their slots) + 2 feeding tasks
    spark = (
        SparkSession.builder.master("local[4]")
        .appName("bench_feed")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "3g")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")  # createDataFrame(pandas) in prepare()
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-feed-"))
    paths = prepare(spark, work, rows)
    out = []

    parts = set(args.parts.split(","))
    frames = {k: cached(spark, paths[k]) for k in ("array", "vector", "binary")} if "feed" in parts else {}
    labels = {"array": "array<float>[784]", "vector": "VectorUDT", "binary": "binary[784]"}
    for df in frames.values():  # untimed: every path and column kind warmed before the first timed run
        for data in (df, df.rdd):
            time_feed(spark, data, rows)
    for kind, df in frames.items():
        metric = f"feed rows/s, {labels[kind]} + label"
        for system, data in (("sparkgrad Arrow feed", lambda d=df: d), ("sparkgrad RDD path", lambda d=df: d.rdd)):
            values, why = measure(lambda data=data: (time_feed(spark, data(), rows),), repeat)
            out.append(row(system, metric, values, "rows/s", why))
        # what moving these columns from the JVM to Python costs, on the same cached DataFrame:
        # no Arrow feeder can pass more rows than this
        columns = tuple(df.columns)
        values, why = measure(lambda df=df, columns=columns: time_arrow_floor(df, rows, columns), repeat)
        out.append(row(benchlib.FLOOR_FEED, metric, values, "rows/s", why))
    python, why_not = (None, "--skip-tfos") if args.skip_tfos or not frames else tfos_python()
    for kind in frames:
        metric = f"feed rows/s, {labels[kind]} + label"
        if python is None:
            out.append(row("TensorFlowOnSpark 2.2.5", metric, [], "rows/s", why_not))
            continue
        if args.quick and kind != "array":  # each kind is a Spark application of its own, with TFoS' sleeps
            out.append(row("TensorFlowOnSpark 2.2.5", metric, [], "rows/s", "--quick: array<float> only"))
            continue
        values, why = run_tfos(python, kind, paths[kind], rows, repeat, work)
        out.append(row("TensorFlowOnSpark 2.2.5", metric, values, "rows/s", why))
    if "feed" in parts:
        files = paths["tfrecords"].split(",")
        values, why = measure(lambda: (time_tfrecords(spark, files, rows),), repeat)
        out.append(row("sparkgrad TFRecordDataset", "read rows/s, image_raw + label", values, "rows/s", why))
    for df in frames.values():
        df.unpersist()

    scoring = spark.read.parquet(paths["array"]).repartition(SCORE_PARTITIONS).cache()
    scoring.count()
    metric = "transform rows/s, MLP 784-128-64-10"
    scorers = (
        ("sparkgrad Model.transform", lambda: time_transform(scoring, rows)),
        ("sparkgrad Model.transform, prediction only", lambda: time_transform(scoring, rows, True)),
        ("mlflow.pyfunc.spark_udf (sparkgrad flavor)", lambda: time_mlflow_udf(spark, scoring, rows, work)),
        ("PyTorch pandas UDF", lambda: time_torch_udf(spark, scoring, rows)),
        (benchlib.FLOOR_SCORE, lambda: time_arrow_floor(scoring, rows)),
    )
    for system, fn in scorers if "score" in parts else ():
        values, why = measure(fn, repeat)
        out.append(row(system, metric, values, "rows/s", why))
    spark.stop()

    for r in out:
        if r["value"] is None:
            shown = f"not measured: {r['reason']}"
        else:
            shown = f"{r['value']:,.0f} ({r['min']:,.0f}-{r['max']:,.0f}, {r['runs']} runs)"
        print(f"{r['system']:<45} {r['metric']:<42} {shown}")
    results = benchlib.results_file("feed.json", args.update)
    benchlib.write_results(results, out, meta)
    print(f"wrote {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
