"""Training throughput: sparkgrad vs PyTorch vs TensorFlow/Keras model.fit.

Models and data as issue 4: (a) the TFoS walkthrough MLP 784-128-64-10 ReLU,
SGD lr 0.07, batch 100; (b) the HorovodRunner Keras CNN (Conv32-Conv64-MaxPool-
Dropout-Flatten-Dense128-Dropout-Dense10, Adadelta lr 0.1, batch 128); and the
MLP's body (784-128-64 ReLU, SGD lr 0.07, batch 100) with a 1-unit head (HEADS):
"binary", a sigmoid head trained with binary cross-entropy on label >= 5, and
"regression", a linear head trained with mean squared error on label / 9 (float32
targets [n, 1] made from the same labels for every system). Data: Fashion-MNIST
in memory (random data of the same shape if it is absent).
Each (system, configuration, model, threads) runs in its own subprocess, so
thread settings and peak RSS are its own; each times 5 segments (1000 MLP-body /
20 CNN steps; --quick: 3 of 200 / 5, 1 thread) after a warm-up and reports their
median with the spread. The anchors run as a skilled user would run them, and
sparkgrad is compared with each one's best configuration:

  PyTorch   eager; torch.compile (the compile, in the first step, is reported
            apart and excluded from the rate); bf16 autocast where the CPU has
            bf16 (avx512_bf16 or amx_bf16 in /proc/cpuinfo, else a row saying so)
  Keras     steps_per_execution 1, 10, 100 x jit_compile False / True, each over
            one model.fit whose first epoch is the warm-up and whose following
            epochs are the timed segments (a tf.data pipeline built once); and
            the mixed_bfloat16 policy at steps_per_execution 100 where the CPU
            has bf16 (--quick: steps_per_execution 1 and 100 for the MLP, 1 and 10
            for the CNN)
OpenMP systems (sparkgrad, PyTorch) at 2+ threads run under OMP_WAIT_POLICY
passive and active, the faster kept (--wait-policy).

Keras runs in this interpreter (where `make bench` installs the anchors extra)
or in $SPARKGRAD_TF_PYTHON; without TensorFlow its rows say why. sparkgrad_bf16
is compile(precision="bf16") (its ratio is the speedup over sparkgrad's fp32; a
CPU without native bf16 gets a row saying so); "sparkgrad (best precision)" is
the faster of the two, compared with each anchor at its best. The fp32 GEMM bound is the best
1536^3 product of NumPy, torch.mm and oneDNN's matmul in the layouts it picks (bench/gemm_peak.c,
built by `make bench`), over the FLOPs of one training sample; each is a row, with oneDNN's bf16
matmul beside them.

    python bench/bench_train.py [--quick] [--threads 1,2]

Prints the table and writes bench/results/train.json (rows system, metric, value, unit).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import resource
import subprocess
import sys
import time
from collections.abc import Callable

import benchlib

ROOT = pathlib.Path(__file__).resolve().parent.parent

# FLOPs per training sample (multiply-add = 2): forward, weight gradient,
# and data gradient except for the first layer.
MLP_LAYERS = [(784, 128), (128, 64), (64, 10)]
MLP_FLOPS = sum(6 * i * o for i, o in MLP_LAYERS) - 2 * 784 * 128
HEAD_LAYERS = [*MLP_LAYERS[:-1], (64, 1)]  # the MLP's body with a 1-unit head
HEAD_FLOPS = sum(6 * i * o for i, o in HEAD_LAYERS) - 2 * 784 * 128
CONV = [(26 * 26, 1 * 9, 32), (24 * 24, 32 * 9, 64)]  # (output pixels, C*KH*KW, OC)
CNN_DENSE = [(9216, 128), (128, 10)]
CNN_FLOPS = (
    sum(6 * p * k * o for p, k, o in CONV)
    - 2 * CONV[0][0] * CONV[0][1] * CONV[0][2]
    + sum(6 * i * o for i, o in CNN_DENSE)
)


@dataclasses.dataclass(frozen=True)
class Head:
    """A 1-unit head on the MLP's body: the last Dense layer's activation in sparkgrad and Keras (PyTorch's
    head is linear and its loss takes the logit), the loss (Keras' name, which sparkgrad takes too) and
    PyTorch's, and the float32 target made from the Fashion-MNIST label (``target``, said in ``says``)."""

    activation: str | None
    loss: str
    torch_loss: str  # a torch.nn class
    target: Callable  # int64 labels [n] -> the target before the cast to float32 [n, 1]
    says: str


HEADS = {
    "binary": Head("sigmoid", "binary_crossentropy", "BCEWithLogitsLoss", lambda y: y >= 5, "label >= 5 (1.0 or 0.0)"),
    "regression": Head(None, "mse", "MSELoss", lambda y: y / 9, "label / 9 (0 to 1)"),
}
MODELS = ("mlp", "cnn", *HEADS)
BATCH = {"mlp": 100, "cnn": 128, "binary": 100, "regression": 100}
FLOPS = {"mlp": MLP_FLOPS, "cnn": CNN_FLOPS, "binary": HEAD_FLOPS, "regression": HEAD_FLOPS}


def load_data(model: str):
    import numpy as np

    try:
        sys.path.insert(0, str(ROOT / "python"))
        from sparkgrad.data.idx import fashion_mnist

        x, y = fashion_mnist("train")
        x = x.astype(np.float32) / 255
    except Exception:  # noqa: BLE001 - the benchmark still runs without the dataset
        rng = np.random.default_rng(0)
        x, y = rng.random((60000, 28, 28), dtype=np.float32), rng.integers(0, 10, 60000).astype(np.uint8)
    x = x.reshape(-1, 28, 28, 1) if model == "cnn" else x.reshape(-1, 784)
    return np.ascontiguousarray(x), y.astype(np.int64)


def head_target(model: str, y):
    """The float32 target [n, 1] of a HEADS model from the int64 labels [n]."""
    return HEADS[model].target(y).astype("float32").reshape(-1, 1)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# Each worker times REPEATS segments of `steps` steps in one process, after a
# warm-up, and reports every segment's rate; the figure is their median, with
# the spread beside it. Every system is measured the same way.
REPEATS = 5


def rates_result(rates: list[float], **extra) -> dict:
    return {"rates": rates, "peak_rss_mb": peak_rss_mb(), **extra}


# ---- workers (run in subprocesses) -------------------------------------------------


def worker_sparkgrad(model: str, threads: int, steps: int, warmup: int, precision: str = "fp32") -> dict:
    import numpy as np
    from sparkgrad.nn import SGD, Adadelta, Dense, Sequential, set_num_threads
    from sparkgrad.nn.models import horovod_cnn, walkthrough_mlp

    set_num_threads(threads)
    x, y = load_data(model)
    if model == "mlp":
        m = walkthrough_mlp(seed=1)
        m.compile(optimizer=SGD(0.07), loss="sparse_categorical_crossentropy", precision=precision)
        target = y
    elif model in HEADS:  # walkthrough_mlp's layers with a 1-unit head
        head, init = HEADS[model], "truncated_normal"
        m = Sequential(
            [
                Dense(128, activation="relu", input_shape=(784,), kernel_initializer=init),
                Dense(64, activation="relu", kernel_initializer=init),
                Dense(1, activation=head.activation, kernel_initializer=init),
            ],
            seed=1,
        )
        m.compile(optimizer=SGD(0.07), loss=head.loss, precision=precision)
        target = head_target(model, y)
    else:
        m = horovod_cnn(seed=1)
        m.compile(optimizer=Adadelta(0.1), loss="categorical_crossentropy", precision=precision)
        target = np.eye(10, dtype=np.float32)[y]
    b = BATCH[model]
    m.fit(x, target, batch_size=b, epochs=1, max_steps=warmup, verbose=0)
    rates = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        m.fit(x, target, batch_size=b, epochs=10**6, max_steps=m.step + steps, verbose=0, log_every=1000)
        rates.append(steps * b / (time.perf_counter() - t))
    return rates_result(rates, precision=m.precision)


def worker_sparkgrad_bf16(model: str, threads: int, steps: int, warmup: int) -> dict:
    """sparkgrad with compile(precision="bf16"); where the CPU has no native bf16
    it would run fp32, so it reports that instead of a rate."""
    from sparkgrad import _core

    if not _core.bf16_supported():
        return {"unsupported": "no native bf16 on this CPU (AVX512_BF16/AMX, as oneDNN sees it)"}
    return worker_sparkgrad(model, threads, steps, warmup, precision="bf16")


def worker_torch(model: str, threads: int, steps: int, warmup: int, mode: str = "eager") -> dict:
    """PyTorch eager, torch.compile (its compile, in the first step, timed apart) or bf16 autocast."""
    import contextlib

    import torch
    import torch.nn as tnn

    if mode == "bf16" and not benchlib.cpu_info()["bf16"]:
        return {"unsupported": "no avx512_bf16/amx_bf16 in /proc/cpuinfo: bf16 autocast would be emulated"}
    torch.set_num_threads(threads)
    x, y = load_data(model)
    if model in HEADS:  # a 1-unit linear head, whose loss takes the logit
        y, lossf = head_target(model, y), getattr(tnn, HEADS[model].torch_loss)()
    else:
        lossf = tnn.CrossEntropyLoss()
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    torch.manual_seed(1)
    if model != "cnn":
        out = 1 if model in HEADS else 10
        net = tnn.Sequential(tnn.Linear(784, 128), tnn.ReLU(), tnn.Linear(128, 64), tnn.ReLU(), tnn.Linear(64, out))
        opt = torch.optim.SGD(net.parameters(), lr=0.07)
    else:
        x = x.permute(0, 3, 1, 2).contiguous()
        net = tnn.Sequential(
            tnn.Conv2d(1, 32, 3), tnn.ReLU(), tnn.Conv2d(32, 64, 3), tnn.ReLU(), tnn.MaxPool2d(2), tnn.Dropout(0.25),
            tnn.Flatten(), tnn.Linear(9216, 128), tnn.ReLU(), tnn.Dropout(0.5), tnn.Linear(128, 10),
        )  # fmt: skip
        opt = torch.optim.Adadelta(net.parameters(), lr=0.1, rho=0.95, eps=1e-7)
    fwd = torch.compile(net) if mode == "compile" else net
    b = BATCH[model]
    n = x.shape[0]

    def cast():
        return torch.autocast("cpu", dtype=torch.bfloat16) if mode == "bf16" else contextlib.nullcontext()

    perm = torch.randperm(n)

    def run(k: int, start: int) -> None:
        for s in range(k):
            i = ((start + s) * b) % (n - b)
            idx = perm[i : i + b]
            opt.zero_grad(set_to_none=True)
            with cast():
                loss = lossf(fwd(x[idx]), y[idx])
            loss.backward()
            opt.step()

    t = time.perf_counter()
    run(1, 0)  # torch.compile compiles forward and backward here
    first_step_s = time.perf_counter() - t
    run(warmup, 1)
    rates = []
    for r in range(REPEATS):
        t = time.perf_counter()
        run(steps, 1 + warmup + r * steps)
        rates.append(steps * b / (time.perf_counter() - t))
    return rates_result(rates, **({"compile_s": first_step_s} if mode == "compile" else {}))


def worker_keras(
    model: str, threads: int, steps: int, warmup: int, spe: int = 1, jit: int = 0, precision: str = "fp32"
) -> dict:
    """Keras model.fit with steps_per_execution=spe and jit_compile=jit, over one long fit:
    its first epoch (of `warmup` steps, where tracing and compiling happen) is the warm-up,
    each following epoch of `steps` steps one timed segment (epoch ends stamped by a callback).
    precision "bf16" is Keras' mixed_bfloat16 policy (bf16 compute, fp32 variables; the output
    layer in fp32, as Keras' mixed-precision guide does)."""
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if precision == "bf16" and not benchlib.cpu_info()["bf16"]:
        return {"unsupported": "no avx512_bf16/amx_bf16 in /proc/cpuinfo: mixed_bfloat16 would be emulated"}
    import numpy as np
    import tensorflow as tf

    spe, jit = int(spe), int(jit)  # from the worker's command line
    if precision == "bf16":
        tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    x, y = load_data(model)
    keras = tf.keras
    if model == "mlp":
        init = keras.initializers.TruncatedNormal(stddev=1 / 28.0)
        net = keras.Sequential(
            [
                keras.Input((784,)),
                keras.layers.Dense(128, activation="relu", kernel_initializer=init),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10, dtype="float32"),
            ]
        )
        opt, loss = keras.optimizers.SGD(0.07), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        target = y
    elif model in HEADS:  # the MLP's body with a 1-unit head, in fp32 as the MLP's output layer
        head = HEADS[model]
        init = keras.initializers.TruncatedNormal(stddev=1 / 28.0)
        net = keras.Sequential(
            [
                keras.Input((784,)),
                keras.layers.Dense(128, activation="relu", kernel_initializer=init),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(1, activation=head.activation, dtype="float32"),
            ]
        )
        opt, loss = keras.optimizers.SGD(0.07), head.loss
        target = head_target(model, y)
    else:
        L = keras.layers
        net = keras.Sequential(
            [keras.Input((28, 28, 1)), L.Conv2D(32, 3, activation="relu"), L.Conv2D(64, 3, activation="relu"),
             L.MaxPooling2D(2), L.Dropout(0.25), L.Flatten(), L.Dense(128, activation="relu"), L.Dropout(0.5),
             L.Dense(10, activation="softmax", dtype="float32")]
        )  # fmt: skip
        opt, loss = keras.optimizers.Adadelta(0.1), "categorical_crossentropy"
        target = np.eye(10, dtype=np.float32)[y]
    net.compile(optimizer=opt, loss=loss, steps_per_execution=spe, jit_compile=bool(jit))
    b = BATCH[model]
    # Shuffled once here, outside the timer; batched and repeated as a tf.data pipeline (built once).
    order = np.random.default_rng(1).permutation(len(x))
    ds = tf.data.Dataset.from_tensor_slices((x[order], target[order])).batch(b, drop_remainder=True)
    ds = ds.repeat().prefetch(tf.data.AUTOTUNE)
    seg = -(-max(steps, spe) // spe) * spe  # a whole number of executions per segment
    stamps: list[float] = []

    class Stamp(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if not stamps:
                stamps.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            stamps.append(time.perf_counter())

    # One fit: its first epoch (tracing, and XLA's compile with jit_compile) is the warm-up,
    # each of the REPEATS epochs after it one timed segment.
    net.fit(ds, epochs=1 + REPEATS, steps_per_epoch=seg, verbose=0, callbacks=[Stamp()])
    rates = [seg * b / (stamps[i + 1] - stamps[i]) for i in range(1, len(stamps) - 1)]
    return rates_result(rates, steps_per_segment=seg, first_epoch_s=stamps[1] - stamps[0])


GEMM_N = 1536
GEMM_PEAK = ROOT / "build" / "bench" / "gemm_peak"  # bench/gemm_peak.c, built by `make bench`


def onednn_gemm(dtype: str) -> tuple[float | None, str]:
    """oneDNN's matmul rate (GFLOP/s, best of its rounds) with the layouts it picks, or why not."""
    if not GEMM_PEAK.exists():
        made = subprocess.run(["make", "-s", "-C", str(ROOT), "build/bench/gemm_peak"], capture_output=True, text=True)
        if made.returncode != 0 or not GEMM_PEAK.exists():
            return None, f"build/bench/gemm_peak could not be built: {made.stderr.strip()[-300:]}"
    out = subprocess.run([str(GEMM_PEAK), str(GEMM_N), dtype], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        return None, f"gemm_peak {dtype} exited with {out.returncode}: {out.stderr.strip()[-300:]}"
    res = json.loads(out.stdout)
    return float(res["best_gflops"]), str(res["impl"])


def worker_gemm(threads: int) -> dict:
    """GEMM rates on 1536^3, GFLOP/s: NumPy (BLAS) and torch.mm in fp32, oneDNN's matmul in fp32
    and bf16 (its own layouts). The fp32 bound is the best of the fp32 ones."""
    import numpy as np

    n = GEMM_N
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    rates: dict[str, float | None] = {}
    notes: dict[str, str] = {}
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        a @ a
        best = max(best, 2 * n**3 / (time.perf_counter() - t))
    rates["numpy"] = best / 1e9
    try:
        import torch

        torch.set_num_threads(threads)
        ta = torch.from_numpy(a)
        best = 0.0
        for _ in range(5):
            t = time.perf_counter()
            torch.mm(ta, ta)
            best = max(best, 2 * n**3 / (time.perf_counter() - t))
        rates["torch"] = best / 1e9
    except ImportError:
        rates["torch"], notes["torch"] = None, "torch is not installed"
    for dtype in ("f32", "bf16"):
        key = f"onednn_{dtype}"
        rates[key], notes[key] = onednn_gemm(dtype)
    fp32 = [v for k, v in rates.items() if v is not None and k != "onednn_bf16"]
    return {"gflops": max(fp32), "sources": rates, "notes": notes}


WORKERS = {
    "sparkgrad": worker_sparkgrad,
    "sparkgrad_bf16": worker_sparkgrad_bf16,
    "torch": worker_torch,
    "keras": worker_keras,
}


GEMM_SOURCES = {  # what each row of the GEMM bound measured (the bound is the best fp32 one)
    "numpy": "NumPy @, fp32",
    "torch": "torch.mm, fp32",
    "onednn_f32": "oneDNN matmul, fp32, its own layouts",
    "onednn_bf16": "oneDNN matmul, bf16 in, fp32 out, its own layouts; not in the fp32 bound",
}
WAIT_POLICY = "both"
BEST_OURS = "sparkgrad (best precision)"  # the faster of sparkgrad fp32 and bf16, per model and threads
OPENMP_SYSTEMS = ("sparkgrad", "sparkgrad_bf16", "torch")  # TensorFlow runs its own thread pools


def wait_policies(system: str, threads: int) -> list[str | None]:
    """The OMP_WAIT_POLICY values a system runs under; the faster one is its figure. With one
    thread nothing waits; TensorFlow does not use OpenMP (None: left unset)."""
    if system not in OPENMP_SYSTEMS:
        return [None]
    if threads == 1:
        return ["passive"]
    return ["passive", "active"] if WAIT_POLICY == "both" else [WAIT_POLICY]


def spawn(
    python: str, args: list[str], threads: int, timeout: float, policy: str | None = None
) -> tuple[dict | None, str]:
    """Runs one worker; (its result, why it has none)."""
    env = dict(
        os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads)
    )
    # Spinning OpenMP threads ("active") win on an idle machine and lose a time slice to a
    # descheduled peer on a shared one, so each OpenMP system runs under both (wait_policies).
    env.pop("OMP_WAIT_POLICY", None)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    env["PYTHONPATH"] = str(ROOT / "python")
    return benchlib.run_worker(__file__, python, args, env, timeout)


def tf_python() -> tuple[str | None, str]:
    """The interpreter with TensorFlow: $SPARKGRAD_TF_PYTHON if set, else this one (where
    `make bench` installs the anchors extra); (path, its TensorFlow and Keras versions) or (None, why not)."""
    python = os.environ.get("SPARKGRAD_TF_PYTHON") or sys.executable
    if not os.path.exists(python):
        return None, f"no interpreter at {python} ($SPARKGRAD_TF_PYTHON)"
    code = "import tensorflow as tf; print(tf.__version__, tf.keras.__version__)"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")  # no TensorFlow log lines on stderr
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["import failed"])[-1]
        return None, f"{python} cannot import tensorflow ({last}; `make bench` installs the anchors extra)"
    words = r.stdout.split()  # the versions are its last line
    tf_version, keras_version = words[-2:] if len(words) >= 2 else ("?", "?")
    return python, f"TensorFlow {tf_version}, Keras {keras_version}"


# Each anchor's configurations: (label, extra worker arguments); its best is the one compared.
def anchor_configs(quick: bool, model: str) -> dict[str, list[tuple[str, list[str]]]]:
    spes = ((1, 10) if model == "cnn" else (1, 100)) if quick else (1, 10, 100)
    keras = [(f"steps_per_execution={s}, jit_compile={bool(j)}", [str(s), str(j)]) for s in spes for j in (0, 1)]
    # mixed_bfloat16 at the largest steps_per_execution (the fastest in fp32 on every run so far)
    top = spes[-1]
    keras += [(f"steps_per_execution={top}, jit_compile={bool(j)}, mixed_bfloat16", [str(top), str(j), "bf16"])
              for j in (0, 1)]  # fmt: skip
    return {
        "torch": [("eager", ["eager"]), ("torch.compile", ["compile"]), ("bf16 autocast", ["bf16"])],
        "keras": keras,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer steps and runs, 1 thread (a few minutes)")
    ap.add_argument("--threads", default=None, help="comma-separated thread counts (default 1,2; --quick: 1)")
    ap.add_argument(
        "--wait-policy",
        default="both",
        choices=["both", "passive", "active"],
        help="OMP_WAIT_POLICY of the OpenMP systems at 2+ threads (both: each runs under both, the faster kept)",
    )
    ap.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    benchlib.add_update_flag(ap)
    args = ap.parse_args()
    global REPEATS, WAIT_POLICY
    if args.worker is not None:
        if args.worker[0] == "gemm":
            res = worker_gemm(int(args.worker[1]))
        else:
            system, model, threads, steps, warmup, repeats, *extra = args.worker
            REPEATS = int(repeats)
            res = WORKERS[system](model, int(threads), int(steps), int(warmup), *extra)
        print(json.dumps(res))
        return 0

    meta = benchlib.metadata("train", omp_wait_policy=args.wait_policy)
    WAIT_POLICY = args.wait_policy
    REPEATS = 3 if args.quick else 5
    mlp_steps = 200 if args.quick else 1000  # per timed segment, for the MLP and its 1-unit heads
    steps = {"cnn": 5 if args.quick else 20, **{m: mlp_steps for m in ("mlp", *HEADS)}}
    warmup = {"cnn": 3, **{m: 50 for m in ("mlp", *HEADS)}}
    threads = [int(t) for t in (args.threads or ("1" if args.quick else "1,2")).split(",")]
    keras_python, keras_found = tf_python()
    keras_missing = "" if keras_python else keras_found
    rows: list[dict] = []
    table: list[tuple] = []
    row = rows.append
    meta["notes"] = [
        f"each figure is the median of {REPEATS} timed segments ({mlp_steps} MLP / {steps['cnn']} CNN steps, "
        "Keras: a whole number of steps_per_execution) in one process after a warm-up",
        "binary and regression: the MLP's body (784-128-64 ReLU, SGD lr 0.07, batch 100) with a 1-unit head on "
        "the same Fashion-MNIST images, float32 targets [n, 1] made from the label: binary "
        f"{HEADS['binary'].says}, a sigmoid head with binary_crossentropy (PyTorch: BCEWithLogitsLoss on the "
        f"logit); regression {HEADS['regression'].says}, a linear head with mse (PyTorch: MSELoss)",
        "OMP_WAIT_POLICY of sparkgrad and PyTorch (OpenMP) at 2+ threads: "
        + ("passive and active, the faster kept" if WAIT_POLICY == "both" else WAIT_POLICY)
        + "; passive at 1 thread; TensorFlow's own thread pools do not read it",
        "PyTorch: eager, torch.compile (its compile, in the first step, reported apart and not in the rate) and "
        "bf16 autocast where the CPU has bf16; Keras: steps_per_execution 1, 10, 100 x jit_compile False/True, "
        "each over one fit whose first epoch is the warm-up; ratios are against each anchor's best configuration, "
        "and sparkgrad fp32's also against each anchor's best fp32 configuration ('<anchor> fp32')",
        "sparkgrad_bf16 is compile(precision='bf16'); its ratio is against sparkgrad's own fp32",
        f"Keras: {keras_found} in {keras_python}" if keras_python else f"Keras: not measured: {keras_missing}",
    ]
    for model in MODELS:
        row(benchlib.row("machine", f"{model}_flops_per_training_sample", FLOPS[model], "FLOP"))
    bounds: dict[str, float] = {}

    def measure(system: str, label: str, model: str, t: int, extra: list[str]) -> list[tuple[str, dict | None, str]]:
        """[(label with its wait policy, result, why none)] for each wait policy the system runs under."""
        if system == "keras" and not keras_python:
            return [(label, None, keras_missing)]
        python = keras_python if system == "keras" else sys.executable
        cmd = [system, model, str(t), str(steps[model]), str(warmup[model]), str(REPEATS), *extra]
        policies = wait_policies(system, t)
        out = []
        for policy in policies:
            named = ", ".join(x for x in (label, f"OMP_WAIT_POLICY={policy}" if len(policies) > 1 else "") if x)
            print(f"  {model} t{t}: {system} {named}...", file=sys.stderr, flush=True)
            out.append((named, *spawn(python, cmd, t, 1800, policy)))
        return out

    for t in threads:
        g, _ = spawn(sys.executable, ["gemm", str(t)], t, 600)
        peak = g["gflops"] if g else float("nan")
        row(benchlib.row("machine", f"fp32_gemm_peak_t{t}", round(peak, 1), "GFLOP/s"))
        for source, what in GEMM_SOURCES.items():
            rate = (g or {}).get("sources", {}).get(source)
            note = (g or {}).get("notes", {}).get(source, "")
            if rate is None:
                row(benchlib.not_measured("machine", f"gemm_{source}_t{t}", note or "no result", "GFLOP/s"))
            else:  # for oneDNN the note is the implementation it chose
                row(benchlib.row("machine", f"gemm_{source}_t{t}", round(rate, 1),
                                 f"GFLOP/s ({what}{'; ' + note if note else ''})"))  # fmt: skip
        bf16_peak = (g or {}).get("sources", {}).get("onednn_bf16")
        for model in MODELS:
            # no system can train faster than the measured GEMM peak over the FLOPs of one sample
            bounds[f"{model}_t{t}"] = peak * 1e9 / FLOPS[model]
            row(benchlib.row("machine", f"{model}_compute_bound_t{t}", round(bounds[f"{model}_t{t}"], 1), "samples/s"))
            if bf16_peak:  # the same bound for a run whose every FLOP were a bf16 dot product
                bound = round(bf16_peak * 1e9 / FLOPS[model], 1)
                what = "samples/s (oneDNN's bf16 matmul rate over the FLOPs of one sample)"
                row(benchlib.row("machine", f"{model}_compute_bound_bf16_t{t}", bound, what))
        for model in MODELS:
            tag = f"{model}_b{BATCH[model]}_t{t}"
            metric = f"{tag}_samples_per_s"
            unit = f"samples/s (median of {REPEATS} segments)"
            medians: dict[str, float] = {}
            results: dict[str, tuple[dict, str]] = {}

            def record(
                system, res, config=None, tag=tag, metric=metric, unit=unit, model=model, peak=peak, bf16_peak=bf16_peak
            ) -> float:
                s = benchlib.summarise(res["rates"])
                extra = {"config": config} if config else {}
                row(benchlib.median_row(system, metric, res["rates"], unit, **extra))
                row(benchlib.row(system, f"{tag}_peak_rss", round(res["peak_rss_mb"], 1), "MB"))
                share = s["median"] * FLOPS[model] / (peak * 1e9)
                row(benchlib.row(system, f"{tag}_share_of_gemm_peak", round(share, 4), "fraction"))
                if bf16_peak:
                    share = s["median"] * FLOPS[model] / (bf16_peak * 1e9)
                    row(benchlib.row(system, f"{tag}_share_of_bf16_gemm_peak", round(share, 4), "fraction"))
                for key, what in (("compile_s", "s (torch.compile's compile, in the first step; not in the rate)"),
                                  ("first_epoch_s", "s (warm-up epoch: tracing/XLA compile)")):  # fmt: skip
                    if key in res:
                        row(benchlib.row(system, f"{tag}_{key}", round(res[key], 2), what))
                return s["median"]

            for system in ("sparkgrad", "sparkgrad_bf16"):
                runs = measure(system, "", model, t, [])
                done = [(benchlib.summarise(res["rates"])["median"], label, res) for label, res, _ in runs if res]
                if not done:
                    why = "; ".join(dict.fromkeys(why for _, _, why in runs))
                    row(benchlib.not_measured(system, metric, why))
                    table.append((tag, system, "", f"not measured: {why}", ""))
                    continue
                for med, label, _ in done:
                    table.append((tag, system, label, f"{med:,.0f}", ""))
                _, label, res = max(done, key=lambda d: d[0])
                medians[system] = record(system, res, config=label or None)
                results[system] = (res, label)
            ours = medians.get("sparkgrad")
            if ours and "sparkgrad_bf16" in medians:
                row(benchlib.row("sparkgrad_bf16", f"{tag}_speedup_vs_fp32", round(medians["sparkgrad_bf16"] / ours, 2),
                                 "x (medians)"))  # fmt: skip
            # sparkgrad at its best precision, against each anchor at its best (which may be bf16 too)
            top = max((s for s in ("sparkgrad", "sparkgrad_bf16") if s in medians), key=medians.get, default=None)
            if top:
                res, label = results[top]
                precision = "bf16" if top == "sparkgrad_bf16" else "fp32"
                record(BEST_OURS, res, config=", ".join(x for x in (precision, label) if x))
            for anchor, configs in anchor_configs(args.quick, model).items():
                best: tuple[float, str, dict] | None = None
                best_fp32: tuple[float, str, dict] | None = None  # the best of its configurations without bf16
                reasons = []
                for lab, extra in configs:
                    for label, res, why in measure(anchor, lab, model, t, extra):
                        name = f"{anchor} ({label})"
                        if res is None:
                            row(benchlib.not_measured(name, metric, why))
                            reasons.append(f"{label}: {why}")
                            table.append((tag, anchor, label, f"not measured: {why}", ""))
                            continue
                        med = record(name, res)
                        table.append((tag, anchor, label, f"{med:,.0f}", f"{ours / med:.2f}x" if ours else ""))
                        if best is None or med > best[0]:
                            best = (med, label, res)
                        if "bf16" not in extra and (best_fp32 is None or med > best_fp32[0]):
                            best_fp32 = (med, label, res)
                if best_fp32 is not None:  # fp32 against fp32, beside the best against the best
                    fp32_med, fp32_label, fp32_res = best_fp32
                    row(benchlib.median_row(f"{anchor} fp32", metric, fp32_res["rates"], unit, config=fp32_label))
                    if ours:
                        what = f"x (medians; sparkgrad fp32 against {anchor}'s best fp32: {fp32_label})"
                        row(benchlib.row("sparkgrad", f"{tag}_ratio_vs_{anchor}_fp32", round(ours / fp32_med, 2), what))
                if best is None:
                    row(benchlib.not_measured(anchor, metric, "; ".join(dict.fromkeys(reasons))))
                    continue
                record(anchor, best[2], config=best[1])  # the anchor at its best, the one compared
                if ours:
                    row(benchlib.row("sparkgrad", f"{tag}_ratio_vs_{anchor}", round(ours / best[0], 2),
                                     f"x (medians; {anchor} at its best: {best[1]})"))  # fmt: skip
                if top:
                    row(benchlib.row(BEST_OURS, f"{tag}_ratio_vs_{anchor}", round(medians[top] / best[0], 2),
                                     f"x (medians; {top} against {anchor} at its best: {best[1]})"))  # fmt: skip
    results = benchlib.results_file("train.json", args.update)
    meta = benchlib.write_results(results, rows, meta)
    head = ("config", "system", "configuration", "median samples/s", "sparkgrad's ratio")
    widths = [max(len(str(r[i])) for r in [head, *table]) + 2 for i in range(len(head))]
    print("".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    for r in table:
        print("".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    for t in threads:
        peak_t = next(r["value"] for r in rows if r["metric"] == f"fp32_gemm_peak_t{t}")
        print(
            f"fp32 GEMM peak, {t} thread(s): {peak_t} GFLOP/s; compute bound (peak / FLOPs per sample): "
            f"MLP {bounds[f'mlp_t{t}']:,.0f} samples/s, CNN {bounds[f'cnn_t{t}']:,.0f} samples/s, "
            f"1-unit heads {bounds[f'binary_t{t}']:,.0f} samples/s"
        )
    keras_note = f"measured with {keras_python} ({keras_found})" if keras_python else f"not measured: {keras_missing}"
    print(f"FLOPs per training sample: MLP {MLP_FLOPS / 1e3:.0f} k, CNN {CNN_FLOPS / 1e6:.1f} M, "
          f"1-unit heads {HEAD_FLOPS / 1e3:.0f} k; keras: {keras_note}")  # fmt: skip
    print(f"load average (1 min) at start {meta['load_average_start'][0]:.2f}, at end {meta['load_average_end'][0]:.2f}"
          f"; OMP_WAIT_POLICY at 2+ threads: {WAIT_POLICY}")  # fmt: skip
    print(f"wrote {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
