"""TensorFlowOnSpark anchor of bench_cluster.py (run by an interpreter with tensorflow and tensorflowonspark).

The shape of TensorFlowOnSpark's examples/mnist/keras/mnist_tf.py: the driver
calls TFCluster.run(sc, main_fun, args, cluster_size, num_ps=0, ...,
InputMode.TENSORFLOW, master_node="chief") and cluster.shutdown(); each node's
main_fun builds a MultiWorkerMirroredStrategy from the TF_CONFIG that
TensorFlowOnSpark exports, reads the training TFRecords with tf.data (the
files written by ``sparkgrad convert``; the strategy shards them by file
between the workers), and trains the walkthrough MLP with Keras model.fit.
The workload is bench_cluster.py's: MLP 784-128-64-10, SGD 0.07, batch 100
per worker, ``--samples`` training samples in total.

Each node writes the wall-clock time of its first training step (a Keras
callback) to ``--out-dir``; the chief also writes the test accuracy. The
driver writes ``--out`` (JSON) with the run() -> shutdown() wall time.

    .venv/bin/python bench/cluster_tfos.py --data-dir D --samples 60000 --out-dir O --out R.json
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time

import anchor_driver


def main_fun(args, ctx):
    """Runs on every TensorFlowOnSpark node (chief and worker)."""
    import math
    import os
    import time

    # tf.keras as Keras 2 (the tf-keras package): TensorFlowOnSpark's examples are
    # tf.keras code, and Keras 3 does not run MultiWorkerMirroredStrategy's fit.
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import numpy as np
    import tensorflow as tf

    # One compute thread per node, as every system in the benchmark (2 nodes, 2 cores).
    tf.config.threading.set_intra_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    num_workers = ctx.num_workers
    global_batch = args.batch_size * num_workers
    steps = args.samples // global_batch

    def parse(record):
        ex = tf.io.parse_single_example(
            record, {"image_raw": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
        )
        image = tf.cast(tf.io.decode_raw(ex["image_raw"], tf.uint8), tf.float32) / 255.0
        return tf.reshape(image, [784]), ex["label"]

    files = sorted(glob.glob(os.path.join(args.data_dir, "train*.tfrecords")))
    train = (
        tf.data.TFRecordDataset(files)
        .map(parse, num_parallel_calls=1)
        .shuffle(10_000, seed=args.seed)
        .repeat()
        .batch(global_batch)
        .prefetch(2)
    )

    def dense(units, fan_in, activation=None):
        init = tf.keras.initializers.TruncatedNormal(stddev=1.0 / math.sqrt(fan_in), seed=args.seed)
        return tf.keras.layers.Dense(units, activation=activation, kernel_initializer=init, bias_initializer="zeros")

    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.Input((784,)), dense(128, 784, "relu"), dense(64, 128, "relu"), dense(10, 64)]
        )
        model.compile(
            optimizer=tf.keras.optimizers.SGD(learning_rate=args.learning_rate),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )

    first_step: list[float] = []

    class FirstStep(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if not first_step:
                first_step.append(time.time())

    started = time.time()
    model.fit(train, epochs=1, steps_per_epoch=steps, callbacks=[FirstStep()], verbose=0)
    trained = time.time()
    result = {
        "job_name": ctx.job_name,
        "task_index": ctx.task_index,
        "first_step_wall": first_step[0] if first_step else None,
        "fit_seconds": trained - started,
        "trained_wall": trained,
        "samples": steps * args.batch_size,
        "steps": steps,
    }
    if ctx.job_name == "chief":
        xs, ys = [], []
        test = tf.data.TFRecordDataset(sorted(glob.glob(os.path.join(args.data_dir, "test*.tfrecords"))))
        for x, y in test.map(parse).batch(1000):
            xs.append(x.numpy())
            ys.append(y.numpy())
        x_test, y_test = np.concatenate(xs), np.concatenate(ys)
        logits = model(x_test, training=False)
        result["test_accuracy"] = float(np.mean(np.argmax(np.asarray(logits), axis=1) == y_test))
        print(f"tfos chief: {steps} steps, test accuracy {result['test_accuracy']:.4f}", flush=True)
    name = f"tfos-{ctx.job_name}-{ctx.task_index}.json"
    with open(os.path.join(args.out_dir, name), "w") as f:
        json.dump(result, f)


def main() -> int:
    p = anchor_driver.parser(__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--cluster-size", type=int, default=2)
    p.add_argument("--reservation-timeout", type=int, default=300)
    args = p.parse_args()

    from tensorflowonspark import TFCluster

    os.makedirs(args.out_dir, exist_ok=True)
    spark, spark_seconds = anchor_driver.start_spark(
        "bench_cluster-tfos", args.cluster_size, args.cold, {"spark.executorEnv.OMP_NUM_THREADS": "1"}
    )
    t0 = time.time()
    cluster = TFCluster.run(
        spark.sparkContext,
        main_fun,
        args,
        args.cluster_size,
        num_ps=0,
        tensorboard=False,
        input_mode=TFCluster.InputMode.TENSORFLOW,
        master_node="chief",
        reservation_timeout=args.reservation_timeout,
    )
    t_run = time.time()
    # TensorFlowOnSpark's shutdown() waits with fixed time.sleep calls of its own: measured, and reported
    with anchor_driver.SleepCounter("tensorflowonspark") as slept:
        cluster.shutdown()
    t_end = time.time()
    spark.stop()
    timings = {"t0": t0, "run_returned": t_run, "end": t_end, "shutdown_sleep_s": slept.seconds,
               "shutdown_sleep_calls": slept.calls}  # fmt: skip
    return anchor_driver.write_result(
        args, "tfos", timings, spark_seconds, ("tensorflowonspark", "tensorflow-cpu", "pyspark")
    )


if __name__ == "__main__":
    sys.exit(main())
