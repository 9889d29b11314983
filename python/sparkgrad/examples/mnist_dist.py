"""Distributed Fashion-MNIST: the TensorFlowOnSpark-on-Databricks walkthrough, ported.

    python -m sparkgrad.examples.mnist_dist --mode tensorflow   # workers read TFRecords
    python -m sparkgrad.examples.mnist_dist --mode spark        # Spark feeds the workers
    python -m sparkgrad.examples.mnist_dist --local             # no Spark: local processes
    python -m sparkgrad.examples.mnist_dist --connect --mode spark  # over Spark Connect (pyspark >= 4.0)
    python -m sparkgrad.examples.mnist_dist --allreduce --shard-data  # no ps: allreduce among the workers

The walkthrough's MLP (784 -> 128 -> 64 -> 10, ReLU, truncated-normal weights
with stddev 1/sqrt(fan_in), zero biases, sparse softmax cross-entropy, SGD
0.07, batch 100) trains for 2 epochs on 1 parameter server + 2 workers. The
driver converts Debian's Fashion-MNIST to TFRecords with the same code as
``sparkgrad convert mnist``; the ps serves the parameters with the optimizer
of the model's compile; each worker calls ``model.fit(batches,
ps=TFNode.ps_client(ctx, model))``, whose C loop pushes every gradient and
pulls the updated parameters; the chief (``ctx.worker_rank`` 0) initialises
the ps, writes checkpoints to ``--model-dir`` (a re-run resumes from the
last one), takes the final parameters once every worker is done and reports
the test accuracy, which the driver prints. Images reach the C core as the
uint8 bytes they are stored as (read from the TFRecords or fed by Spark);
the model's input transform scales them to [0, 1] and, by default,
standardises each pixel ((x - mean) / std with the training set's
statistics, computed once by the driver and shipped in ``args``) as C
gathers each batch: a preprocessing choice that lifts this MLP markedly (in
Spark mode, where each row reaches one worker once per epoch, from about
0.835 to 0.86 after 2 epochs). ``--no-standardize`` feeds the walkthrough's
raw [0, 1] pixels.

``--connect`` runs the same over Spark Connect (a local Connect server
started by ``SparkSession.builder.remote("local[N]")``): no SparkContext, the
nodes start as a barrier mapInArrow stage, and in spark mode the training
set is a DataFrame (binary ``image_raw``, int64 ``label``) read from the
TFRecords on the executors and fed as Arrow record batches.

``--allreduce`` trains without parameter servers (``num_ps=0``), as
TensorFlowOnSpark's MultiWorkerMirroredStrategy examples do: each worker
calls ``hvd.init()``, compiles the model with
``hvd.DistributedOptimizer(SGD(learning_rate * hvd.size()))`` and calls
``model.fit`` with ``BroadcastGlobalVariablesCallback(0)``; every step
averages the gradients across the workers in the C loop, so the workers end
with identical parameters (the driver checks their digests). Every worker
must take the same number of steps: TFRecords input mode only, with equal
shards (``--shard-data`` over files of equal size) or every file read by
every worker.

What changed from the TensorFlowOnSpark version: imports, and the model code
(sparkgrad.nn's fit instead of a tf.train loop); TFCluster.run, ctx, TFNode
and DataFeed are used the same way.
"""

from __future__ import annotations

import glob
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import argparse

SEED = 42
CHECKPOINT = "model.sgckpt"


@dataclass(frozen=True, eq=False)  # eq would compare the numpy stats elementwise
class Args:
    mode: str
    data_dir: str
    model_dir: str
    epochs: int
    batch_size: int
    learning_rate: float
    sync: bool
    checkpoint_every: int
    shard_data: bool
    allreduce: bool = False
    # The model's initial weights, and (plus the worker's rank) its shuffle of the TFRecords.
    seed: int = SEED
    # Per-pixel mean and standard deviation of the training images (float32[784] each), from
    # pixel_stats(); None trains on the raw [0, 1] pixels as the walkthrough does.
    pixel_mean: np.ndarray | None = None
    pixel_std: np.ndarray | None = None

    def set_input_transform(self, model) -> None:
        """uint8 pixels -> x / 255, then (x - mean) / std per pixel with the stats, applied in C."""
        model.set_input_transform(scale=1 / 255, mean=self.pixel_mean, std=self.pixel_std)


def build_model(seed: int = SEED):
    from sparkgrad.nn.models import walkthrough_mlp

    return walkthrough_mlp(seed=seed)


def _schema():
    from sparkgrad.data.convert import mnist_schema

    return mnist_schema("image_raw")


def _raw_schema():
    """The pixels as the uint8 bytes they are stored as (scaled in C by the model's input transform)."""
    from sparkgrad.data import FixedLenFeature, RawBytesFeature

    return {"image_raw": RawBytesFeature([784], "uint8"), "label": FixedLenFeature([], "int64")}


def _checkpoint(model_dir: str) -> str:
    return os.path.join(model_dir, CHECKPOINT)


def load_test_set(data_dir: str, raw: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(images float32[N, 784] in [0, 1], or uint8[N, 784] when ``raw``, labels int64[N])
    of the test*.tfrecords in data_dir."""
    from sparkgrad.data import TFRecordDataset

    xs, ys = [], []
    files = sorted(glob.glob(os.path.join(data_dir, "test*.tfrecords")))
    for batch in TFRecordDataset(files, _raw_schema() if raw else _schema(), 1000):
        xs.append(batch["image_raw"])
        ys.append(batch["label"])
    return np.concatenate(xs), np.concatenate(ys)


def _train_batches(args: Args, ctx, rank: int, counter: list[int]):
    """(images uint8[B, 784], labels int64[B]) batches for this worker; counter[0] counts the rows."""
    if args.mode == "tensorflow":
        from sparkgrad.data import TFRecordDataset

        files = sorted(glob.glob(os.path.join(args.data_dir, "train*.tfrecords")))
        ds = TFRecordDataset(
            files,
            _raw_schema(),
            args.batch_size,
            shuffle_buffer=10_000,
            seed=args.seed + rank,
            epochs=args.epochs,
            shard_index=rank if args.shard_data else 0,
            num_shards=ctx.num_workers if args.shard_data else 1,
        )
        for batch in ds:
            counter[0] += len(batch["label"])
            yield batch["image_raw"], batch["label"]
        return
    from sparkgrad import TFNode

    # image_raw arrives as uint8[B, 784] (the binary column, packed by the feeder)
    feed = TFNode.DataFeed(ctx.mgr, input_mapping={"image_raw": "x", "label": "y"})
    while not feed.should_stop():
        batch = feed.next_batch(args.batch_size)
        if batch and len(batch["y"]):
            counter[0] += len(batch["y"])
            yield batch["x"], batch["y"]


@dataclass
class _Report:
    """fit callback on every worker: metrics to the driver; on the chief, a checkpoint every ``every`` steps."""

    ctx: object
    path: str | None
    every: int
    last: int = 0

    def on_step_end(self, step: int, logs: dict) -> None:
        self.ctx.metric("loss", logs["loss"], step)
        self.ctx.metric("accuracy", logs["accuracy"], step)
        if self.path and self.every and step - self.last >= self.every:
            self.last = step
            self.model.save(self.path)

    def set_model(self, model) -> None:
        self.model = model


def _test_result(model, args: Args) -> dict:
    test_x, test_y = load_test_set(args.data_dir, raw=True)
    loss, accuracy = model.evaluate(test_x, test_y, batch_size=1000, verbose=0)
    print(f"chief: step {model.step}, test loss {loss:.4f}, test accuracy {accuracy:.4f}")
    return {"step": model.step, "test_loss": loss, "test_accuracy": accuracy}


def allreduce_map_fun(args: Args, ctx) -> dict:
    """--allreduce: no ps; every worker runs fit with a DistributedOptimizer, rank 0 checkpoints and evaluates."""
    import hashlib

    import sparkgrad.hvd as hvd
    from sparkgrad.nn import SGD

    hvd.init()
    rank = hvd.rank()
    model = build_model(args.seed)
    optimizer = hvd.DistributedOptimizer(SGD(args.learning_rate * hvd.size()))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    args.set_input_transform(model)
    path = _checkpoint(args.model_dir)
    os.makedirs(args.model_dir, exist_ok=True)
    if rank == 0 and os.path.exists(path):  # the callback below gives every worker rank 0's state
        model.load(path)
        print(f"resumed from {path} at step {model.step}")
    started, samples = time.monotonic(), [0]
    report = _Report(ctx, path if rank == 0 else None, args.checkpoint_every, model.step)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), report]
    batches = _train_batches(args, ctx, rank, samples)
    model.fit(batches, epochs=1, initial_epoch=0, verbose=0, log_every=100, callbacks=callbacks)
    result = {
        "rank": rank,
        "samples": samples[0],
        "seconds": time.monotonic() - started,
        "params_sha256": hashlib.sha256(model.params.tobytes()).hexdigest(),
    }
    if rank != 0:
        return result
    model.save(path)
    return {**result, **_test_result(model, args)}


def map_fun(args: Args, ctx) -> dict:
    """Runs on every node, as in TensorFlowOnSpark: ps nodes serve, workers train."""
    from sparkgrad import TFNode
    from sparkgrad.nn import SGD

    if args.allreduce:
        return allreduce_map_fun(args, ctx)

    server = TFNode.start_cluster_server(ctx)
    model = build_model(args.seed)
    model.compile(optimizer=SGD(args.learning_rate), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    args.set_input_transform(model)
    if ctx.job_name == "ps":  # the ps applies the model's SGD(learning_rate)
        return {"ps": server.serve_parameters(model, mode="sync" if args.sync else "async")}

    rank = ctx.worker_rank
    chief = rank == 0
    path = _checkpoint(args.model_dir)
    os.makedirs(args.model_dir, exist_ok=True)
    if chief and os.path.exists(path):  # fit hands the chief's state to the ps
        model.load(path)
        print(f"resumed from {path} at step {model.step}")
    started, samples = time.monotonic(), [0]
    report = _Report(ctx, path if chief else None, args.checkpoint_every, model.step)
    with TFNode.ps_client(ctx, model) as ps:
        # the --epochs passes over the data are one pass of the iterable: one fit epoch, each run
        batches = _train_batches(args, ctx, rank, samples)
        model.fit(batches, epochs=1, initial_epoch=0, ps=ps, verbose=0, log_every=100, callbacks=[report])
    elapsed = time.monotonic() - started
    if not chief:
        return {"rank": rank, "samples": samples[0], "seconds": elapsed}
    # fit left the chief with the final parameters, after every worker's updates
    model.save(path)
    return {"rank": rank, "samples": samples[0], "seconds": elapsed, **_test_result(model, args)}


def prepare_data(data_dir: str, source: str, shards: int) -> None:
    """Converts Fashion-MNIST to TFRecords once (train split in ``shards`` files)."""
    from sparkgrad.data.convert import convert_mnist

    if glob.glob(os.path.join(data_dir, "train*.tfrecords")) and glob.glob(os.path.join(data_dir, "test*.tfrecords")):
        return
    for split, prefix, n in (("train", "train", shards), ("test", "t10k", 1)):
        convert_mnist(
            os.path.join(source, f"{prefix}-images-idx3-ubyte.gz"),
            os.path.join(source, f"{prefix}-labels-idx1-ubyte.gz"),
            data_dir,
            layout="image_raw",
            shards=n,
            name=split,
        )
    print(f"converted Fashion-MNIST from {source} to TFRecords in {data_dir}")


def pixel_stats(data_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-pixel (mean, std) of the training images, float32[784] each.

    Computed once in one pass over train*.tfrecords and kept beside them in
    pixel_stats.npz. A pixel that never varies gets std 1 (it then stays 0).
    """
    from sparkgrad.data import TFRecordDataset

    path = os.path.join(data_dir, "pixel_stats.npz")
    if os.path.exists(path):
        with np.load(path) as saved:
            return saved["mean"], saved["std"]
    total = np.zeros(784, np.float64)
    squares = np.zeros(784, np.float64)
    n = 0
    for batch in TFRecordDataset(sorted(glob.glob(os.path.join(data_dir, "train*.tfrecords"))), _schema(), 10_000):
        x = batch["image_raw"].astype(np.float64)
        total += x.sum(axis=0)
        squares += (x * x).sum(axis=0)
        n += len(x)
    mean = total / n
    std = np.sqrt(np.maximum(squares / n - mean * mean, 0.0))
    std[std < 1e-6] = 1.0
    mean, std = mean.astype(np.float32), std.astype(np.float32)
    np.savez(path, mean=mean, std=std)
    return mean, std


def _read_examples(paths):
    """Row(image_raw: bytes, label: int) for every Example in the TFRecord files ``paths`` (runs on executors)."""
    from pyspark.sql import Row

    from sparkgrad.data import FixedLenFeature, TFRecordDataset

    example = Row("image_raw", "label")  # the field names become the feed's column names
    schema = {"image_raw": FixedLenFeature([], "bytes"), "label": FixedLenFeature([], "int64")}
    for path in paths:
        for batch in TFRecordDataset([path], schema, 1024):
            yield from map(example, batch["image_raw"], batch["label"].tolist())


def _spark_train_rdd(spark, data_dir: str, partitions: int):
    """The training set as an RDD of (image_raw, label) rows: the pixels as one binary value (784 bytes) a row.

    Keeping the pixels as bytes is what makes feeding fast: the feeding tasks
    pack them into uint8 arrays in C (no Python object per pixel) and the
    workers scale them to [0, 1]. ``partitions`` partitions (one per worker:
    few, large feeding tasks) of whole files, read on the executors;
    partitions go to the workers round-robin. (A DataFrame with a
    BinaryType column feeds the same way through ``df.rdd``; building one
    from Python rows costs more than the training here, hence the RDD.)
    """
    files = sorted(glob.glob(os.path.join(data_dir, "train*.tfrecords")))
    return spark.sparkContext.parallelize(files, min(partitions, len(files))).mapPartitions(_read_examples)


@dataclass(frozen=True)
class _ExampleBatches:
    """DataFrame.mapInArrow function: the rows of files[id] for each id of its input, as Arrow batches.

    The pixels stay one binary value a row (784 bytes); the feeding tasks
    read them from the Arrow buffers as uint8[rows, 784].
    """

    files: tuple[str, ...]

    def __call__(self, batches):
        import pyarrow as pa

        from sparkgrad.data import FixedLenFeature, TFRecordDataset

        schema = {"image_raw": FixedLenFeature([], "bytes"), "label": FixedLenFeature([], "int64")}
        for ids in batches:
            for i in ids.column(0).to_pylist():
                for batch in TFRecordDataset([self.files[i]], schema, 1024):
                    images = pa.array(batch["image_raw"], pa.binary())  # the reader's bytes values, in one buffer
                    yield pa.RecordBatch.from_arrays([images, pa.array(batch["label"])], names=["image_raw", "label"])


def _spark_train_df(spark, data_dir: str, partitions: int):
    """The training set as a DataFrame of (image_raw binary, label long): for Spark Connect, which has no RDDs.

    Whole files per partition, read on the executors (as _spark_train_rdd does).
    """
    files = tuple(sorted(glob.glob(os.path.join(data_dir, "train*.tfrecords"))))
    ids = spark.range(len(files), numPartitions=min(partitions, len(files)))
    return ids.mapInArrow(_ExampleBatches(files), "image_raw binary, label long")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    import argparse  # here, not at the top: the executors import this module for map_fun

    p = argparse.ArgumentParser(prog="python -m sparkgrad.examples.mnist_dist", description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("tensorflow", "spark"), default="tensorflow", help="input mode")
    p.add_argument("--local", action="store_true", help="run the nodes as local processes, without Spark")
    p.add_argument(
        "--connect",
        action="store_true",
        help="run over Spark Connect: a local Connect server started by SparkSession.builder.remote('local[N]')",
    )
    p.add_argument(
        "--master",
        default=None,
        help="Spark master (default: local with a slot per node); with --connect, the Connect remote: "
        "local[N] or sc://host:port",
    )
    p.add_argument("--source", default="/usr/share/datasets/fashion-mnist", help="directory of the IDX files")
    p.add_argument("--data-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "sparkgrad", "fashion-mnist"))
    p.add_argument("--model-dir", default=None, help="checkpoint directory (default: a fresh temporary one)")
    p.add_argument("--num-ps", type=int, default=1)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--learning-rate", type=float, default=0.07)
    p.add_argument("--sync", action="store_true", help="synchronous training (one gradient per worker per step)")
    p.add_argument(
        "--allreduce",
        action="store_true",
        help="no parameter servers (num_ps=0): the workers average their gradients by allreduce "
        "(hvd.DistributedOptimizer, learning rate x workers); TFRecords mode only",
    )
    p.add_argument(
        "--shard-data",
        action="store_true",
        help="give each worker its own shard of the training files (default: as the walkthrough, every worker "
        "reads every file for --epochs epochs)",
    )
    p.add_argument(
        "--standardize",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="standardise each pixel with the training set's per-pixel mean and std (pixel_stats.npz beside "
        "the TFRecords; the default). --no-standardize feeds raw [0, 1] pixels, as the walkthrough did",
    )
    p.add_argument("--checkpoint-every", type=int, default=500, help="steps between the chief's checkpoints")
    p.add_argument("--seed", type=int, default=SEED, help="initial weights, and (plus the rank) each worker's shuffle")
    p.add_argument("--reservation-timeout", type=float, default=120)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from sparkgrad import TFCluster
    from sparkgrad.cluster.roles import InputMode

    ns = parse_args(argv)
    if ns.allreduce and ns.mode == "spark":
        raise SystemExit(
            "--allreduce needs the same number of steps on every worker: use --mode tensorflow (Spark's feed "
            "splits the rows unevenly)"
        )
    if ns.allreduce:
        ns.num_ps = 0
    num_nodes = ns.num_ps + ns.num_workers
    prepare_data(ns.data_dir, ns.source, shards=max(4, ns.num_workers))
    model_dir = ns.model_dir or tempfile.mkdtemp(prefix="sparkgrad-mnist-")
    mean, std = pixel_stats(ns.data_dir) if ns.standardize else (None, None)
    args = Args(
        mode=ns.mode,
        data_dir=ns.data_dir,
        model_dir=model_dir,
        epochs=ns.epochs,
        batch_size=ns.batch_size,
        learning_rate=ns.learning_rate,
        sync=ns.sync,
        checkpoint_every=ns.checkpoint_every,
        shard_data=ns.shard_data,
        allreduce=ns.allreduce,
        seed=ns.seed,
        pixel_mean=mean,
        pixel_std=std,
    )
    input_mode = InputMode.SPARK if ns.mode == "spark" else InputMode.TENSORFLOW
    if ns.local and ns.mode == "spark":
        raise SystemExit("--mode spark needs Spark: drop --local")
    if ns.local and ns.connect:
        raise SystemExit("--connect runs over Spark Connect: drop --local")

    spark = None
    feed_slots = ns.num_workers if input_mode == InputMode.SPARK else 0
    slots = num_nodes + feed_slots
    if not ns.local:
        from pyspark.sql import SparkSession

        # One slot per node (a barrier stage), plus in spark mode one per worker for the feeding
        # tasks, so that every worker is fed at once.
        builder = SparkSession.builder.appName("sparkgrad-mnist_dist").config("spark.ui.showConsoleProgress", "false")
        if ns.connect:  # a local Connect server in this process; this client sees it through gRPC only
            spark = builder.remote(ns.master or f"local[{slots}]").getOrCreate()
        else:
            spark = builder.master(ns.master or f"local[{slots}]").getOrCreate()
            spark.sparkContext.setLogLevel("ERROR")
    started = time.monotonic()
    try:
        cluster = TFCluster.run(
            spark,  # a SparkSession (classic or Connect), or None for local processes
            map_fun,
            args,
            num_executors=num_nodes,
            num_ps=ns.num_ps,
            input_mode=input_mode,
            reservation_timeout=ns.reservation_timeout,
        )
        if input_mode == InputMode.SPARK and ns.connect:
            cluster.train(_spark_train_df(spark, ns.data_dir, ns.num_workers), num_epochs=ns.epochs)
        elif input_mode == InputMode.SPARK:
            cluster.train(_spark_train_rdd(spark, ns.data_dir, ns.num_workers), num_epochs=ns.epochs)
        cluster.shutdown()
    finally:
        if spark is not None:
            spark.stop()
    wall = time.monotonic() - started
    chief = next((r for r in cluster.results.values() if isinstance(r, dict) and r.get("rank") == 0), None)
    if chief is None:
        print("the chief returned no result", file=sys.stderr)
        return 1
    samples = sum(r.get("samples", 0) for r in cluster.results.values() if isinstance(r, dict))
    nodes, how = f"{ns.num_ps} ps + {ns.num_workers} workers", "sync" if ns.sync else "async"
    if ns.allreduce:
        digests = {r.get("params_sha256") for r in cluster.results.values() if isinstance(r, dict)}
        nodes, how = f"{ns.num_workers} workers", "allreduce"
        print(f"parameters identical on every worker: {len(digests) == 1}")
    print(
        f"mnist_dist ({ns.mode} mode, {nodes}, {how}): {ns.epochs} epochs, {samples} samples in {wall:.1f} s, "
        f"global step {chief['step']}, checkpoints in {model_dir}{' (over Spark Connect)' if ns.connect else ''}"
    )
    print(f"test accuracy: {chief['test_accuracy']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
