"""Model (b) test accuracy after 3 epochs: sparkgrad vs TensorFlow/Keras, same recipe, same data.

The HorovodRunner Keras CNN (Conv32-Conv64-MaxPool-Dropout 0.25-Flatten-Dense128-
Dropout 0.5-Dense10 softmax, categorical cross-entropy, glorot_uniform kernels,
zero biases, Adadelta rho 0.95 eps 1e-7, inputs / 255) trained on Debian's
Fashion-MNIST (60k train, 10k test) for 3 epochs in each system, with the
recipes a user porting that code would try:

    issue        Adadelta lr 0.1, batch 128 (issue 4's recipe)
    keras_lr1    Adadelta lr 1.0, batch 128 (the Keras mnist_cnn example)
    hvd2         lr 0.1 x 2 workers, 2 x 128 rows per step (HorovodRunner with
                 np=2: each worker reads its half of the data, gradients averaged,
                 so one process with batch 256 and lr 0.2 takes the same steps)

Each (system, recipe) trains in its own subprocess under the shared benchmark
lock (`flock $SPARKGRAD_BENCH_LOCK`, default /work/bench.lock, when it exists), one
thread, seed 1. Keras runs in this interpreter (`make bench` installs the anchors
extra into it) or in $SPARKGRAD_TF_PYTHON; without TensorFlow its rows say why.
--quick: 1 epoch on the first 6000 rows, issue recipe only (a smoke run; its
figures are not comparable).

    python bench/accuracy_cnn.py [--quick] [--recipes issue,keras_lr1,hvd2] [--systems sparkgrad,keras]

Prints the table and writes bench/results/accuracy_cnn.json (rows system, metric, value, unit).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import benchlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Keras: this interpreter (where `make bench` installs the anchors extra), or $SPARKGRAD_TF_PYTHON.
TF_PYTHON = os.environ.get("SPARKGRAD_TF_PYTHON") or sys.executable
LOCK = os.environ.get("SPARKGRAD_BENCH_LOCK", "/work/bench.lock")

# name -> (Adadelta learning rate, batch size, description)
RECIPES = {
    "issue": (0.1, 128, "Adadelta lr 0.1, batch 128 (issue 4)"),
    "keras_lr1": (1.0, 128, "Adadelta lr 1.0, batch 128 (Keras mnist_cnn example)"),
    "hvd2": (0.2, 256, "lr 0.1 x 2 workers, 2 x 128 rows per step (HorovodRunner np=2)"),
}
EPOCHS = 3


def write_data(path: pathlib.Path) -> None:
    """Debian's Fashion-MNIST read once by sparkgrad's IDX reader into one .npz that
    both systems load (the TensorFlow interpreter cannot import sparkgrad's extension)."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "python"))
    from sparkgrad.data.idx import fashion_mnist

    x, y = fashion_mnist("train")
    xt, yt = fashion_mnist("test")
    np.savez(path, x=x, y=y, xt=xt, yt=yt)


def load(data: str, rows: int | None):
    import numpy as np

    with np.load(data) as f:
        x, y, xt, yt = f["x"], f["y"], f["xt"], f["yt"]
    x = x.reshape(-1, 28, 28, 1).astype(np.float32) / 255
    xt = xt.reshape(-1, 28, 28, 1).astype(np.float32) / 255
    eye = np.eye(10, dtype=np.float32)
    if rows:
        x, y = x[:rows], y[:rows]
    return x, eye[y], xt, eye[yt]


def worker_sparkgrad(data: str, lr: float, batch: int, epochs: int, rows: int | None) -> dict:
    from sparkgrad.nn import Adadelta, set_num_threads
    from sparkgrad.nn.models import horovod_cnn

    set_num_threads(1)
    x, y, xt, yt = load(data, rows)
    m = horovod_cnn(seed=1)
    m.compile(optimizer=Adadelta(learning_rate=lr, rho=0.95, epsilon=1e-7), loss="categorical_crossentropy")
    t = time.perf_counter()
    m.fit(x, y, batch_size=batch, epochs=epochs, verbose=0)
    dt = time.perf_counter() - t
    loss, acc = m.evaluate(xt, yt)
    return {"test_accuracy": acc, "test_loss": loss, "train_seconds": dt}


def worker_keras(data: str, lr: float, batch: int, epochs: int, rows: int | None) -> dict:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras = tf.keras
    keras.utils.set_random_seed(1)
    x, y, xt, yt = load(data, rows)
    L = keras.layers
    net = keras.Sequential(
        [keras.Input((28, 28, 1)), L.Conv2D(32, 3, activation="relu"), L.Conv2D(64, 3, activation="relu"),
         L.MaxPooling2D(2), L.Dropout(0.25), L.Flatten(), L.Dense(128, activation="relu"), L.Dropout(0.5),
         L.Dense(10, activation="softmax")]
    )  # fmt: skip
    net.compile(
        optimizer=keras.optimizers.Adadelta(learning_rate=lr, rho=0.95, epsilon=1e-7),
        loss="categorical_crossentropy",
        metrics=["accuracy"],
    )
    t = time.perf_counter()
    net.fit(x, y, batch_size=batch, epochs=epochs, verbose=0)
    dt = time.perf_counter() - t
    loss, acc = net.evaluate(xt, yt, batch_size=1000, verbose=0)
    return {"test_accuracy": float(acc), "test_loss": float(loss), "train_seconds": dt}


WORKERS = {"sparkgrad": worker_sparkgrad, "keras": worker_keras}


def spawn(data: str, system: str, recipe: str, epochs: int, rows: int | None, timeout: float) -> dict | None:
    python = TF_PYTHON if system == "keras" else sys.executable
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMP_WAIT_POLICY="passive")
    env["PYTHONPATH"] = str(ROOT / "python")
    cmd = [python, __file__, "--worker", data, system, recipe, str(epochs), str(rows or 0)]
    if os.path.exists(LOCK):
        cmd = ["flock", LOCK, *cmd]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(
            f"  {system} {recipe}: timed out after {timeout:.0f} s (waiting for the lock and training)", file=sys.stderr
        )
        return None
    if out.returncode != 0:
        print(f"  {system} {recipe} failed:\n{out.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 epoch on 6000 rows, issue recipe only (smoke run)")
    ap.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated subset of " + ", ".join(RECIPES))
    ap.add_argument("--systems", default="sparkgrad,keras")
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    benchlib.add_update_flag(ap)
    args = ap.parse_args()
    if args.worker is not None:
        data, system, recipe, epochs, rows = args.worker
        lr, batch, _ = RECIPES[recipe]
        load_at_start = os.getloadavg()[0]
        res = WORKERS[system](data, lr, batch, int(epochs), int(rows) or None)
        res["load_average_1min"] = load_at_start
        print(json.dumps(res))
        return 0

    recipes = ["issue"] if args.quick else [r for r in args.recipes.split(",") if r]
    unknown = [r for r in recipes if r not in RECIPES]
    if unknown:
        ap.error(f"unknown recipes {unknown}; choose from {list(RECIPES)}")
    systems = [s for s in args.systems.split(",") if s]
    meta = benchlib.metadata("accuracy_cnn")
    keras_missing = ""
    if "keras" in systems:
        probe = subprocess.run([TF_PYTHON, "-c", "import tensorflow"], capture_output=True, text=True, timeout=300) \
            if os.path.exists(TF_PYTHON) else None  # fmt: skip
        if probe is None or probe.returncode != 0:
            last = (probe.stderr.strip().splitlines() or ["import failed"])[-1] if probe else "absent"
            keras_missing = f"{TF_PYTHON} cannot import tensorflow ({last})"
            print(f"keras: not measured: {keras_missing}", file=sys.stderr)
    epochs, rows = (1, 6000) if args.quick else (EPOCHS, None)
    out: list[dict] = []
    table: list[tuple] = []

    def row(system, metric, value, unit):
        out.append({"system": system, "metric": metric, "value": value, "unit": unit})

    tmp = tempfile.TemporaryDirectory(prefix="accuracy_cnn-")
    data = str(pathlib.Path(tmp.name) / "fashion_mnist.npz")
    write_data(pathlib.Path(data))
    row("machine", "epochs", epochs, "epochs")
    row("machine", "train_rows", rows or 60000, "rows")
    for recipe in recipes:
        lr, batch, desc = RECIPES[recipe]
        for system in systems:
            tag = f"cnn_{recipe}_lr{lr:g}_b{batch}"
            if system == "keras" and keras_missing:
                out.append(benchlib.not_measured(system, f"{tag}_test_accuracy", keras_missing))
                table.append((recipe, desc, system, "not measured", "", "", ""))
                continue
            r = spawn(data, system, recipe, epochs, rows, timeout=3600)
            if r is None:
                out.append(
                    benchlib.not_measured(system, f"{tag}_test_accuracy", "failed (its stderr is printed above)")
                )
                table.append((recipe, desc, system, "failed", "", "", ""))
                continue
            row(system, f"{tag}_test_accuracy", round(r["test_accuracy"], 4), "fraction")
            row(system, f"{tag}_test_loss", round(r["test_loss"], 4), "nats")
            row(system, f"{tag}_train_seconds", round(r["train_seconds"], 1), "s (1 thread)")
            row(system, f"{tag}_load_average_1min", round(r["load_average_1min"], 2), "runnable tasks (2 cores)")
            table.append(
                (recipe, desc, system, f"{r['test_accuracy']:.4f}", f"{r['test_loss']:.4f}",
                 f"{r['train_seconds']:.0f}", f"{r['load_average_1min']:.2f}")
            )  # fmt: skip
            print(f"  {recipe} {system}: accuracy {r['test_accuracy']:.4f}", file=sys.stderr, flush=True)
    tmp.cleanup()
    results = benchlib.results_file("accuracy_cnn.json", args.update)
    benchlib.write_results(results, out, meta)
    head = ("recipe", "description", "system", "test acc", "test loss", "train s", "load avg")
    widths = [max(len(str(r[i])) for r in [head, *table]) + 2 for i in range(len(head))]
    print(f"Model (b), Fashion-MNIST, {epochs} epoch(s) on {rows or 60000} rows, test on 10000, 1 thread, seed 1")
    print("".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    for r in table:
        print("".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    print(f"wrote {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
