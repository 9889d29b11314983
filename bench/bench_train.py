"""Training throughput: sparkgrad vs PyTorch vs TensorFlow/Keras model.fit.

Models and data as issue 4: (a) the TFoS walkthrough MLP 784-128-64-10 ReLU,
SGD lr 0.07, batch 100; (b) the HorovodRunner Keras CNN (Conv32-Conv64-MaxPool-
Dropout-Flatten-Dense128-Dropout-Dense10, Adadelta lr 0.1, batch 128). Data:
Fashion-MNIST in memory (random data of the same shape if it is absent).
Each (system, model, threads) runs in its own subprocess, so thread settings
and peak RSS are its own; each times 5 segments (1000 MLP / 20 CNN steps) and
reports the best (as timeit: the one least disturbed by other work on the
machine) and the median, and the ratios are given for both. Keras runs in /work/tfvenv (or $SPARKGRAD_TF_PYTHON)
when that interpreter has tensorflow; otherwise it is reported as not measured.
sparkgrad_bf16 is sparkgrad with compile(precision="bf16") (its ratio is the
speedup over sparkgrad's fp32; a CPU without native bf16 gets a row saying so).

    python bench/bench_train.py [--quick] [--threads 1,2]

Prints the table and writes bench/results/train.json (rows system, metric, value, unit).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "train.json"
TF_PYTHON = os.environ.get("SPARKGRAD_TF_PYTHON", "/work/tfvenv/bin/python")

# FLOPs per training sample (multiply-add = 2): forward, weight gradient,
# and data gradient except for the first layer.
MLP_LAYERS = [(784, 128), (128, 64), (64, 10)]
MLP_FLOPS = sum(6 * i * o for i, o in MLP_LAYERS) - 2 * 784 * 128
CONV = [(26 * 26, 1 * 9, 32), (24 * 24, 32 * 9, 64)]  # (output pixels, C*KH*KW, OC)
CNN_DENSE = [(9216, 128), (128, 10)]
CNN_FLOPS = (
    sum(6 * p * k * o for p, k, o in CONV)
    - 2 * CONV[0][0] * CONV[0][1] * CONV[0][2]
    + sum(6 * i * o for i, o in CNN_DENSE)
)
BATCH = {"mlp": 100, "cnn": 128}


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
    x = x.reshape(-1, 784) if model == "mlp" else x.reshape(-1, 28, 28, 1)
    return np.ascontiguousarray(x), y.astype(np.int64)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# Each worker times REPEATS segments of `steps` steps in one process and reports
# the best (the least disturbed by other work on this shared machine, as timeit
# does) and the median; every system is measured the same way.
REPEATS = 5


def summarise(rates: list[float]) -> dict:
    rates = sorted(rates)
    return {
        "samples_per_s": rates[-1],
        "samples_per_s_median": rates[len(rates) // 2],
        "segments": len(rates),
        "peak_rss_mb": peak_rss_mb(),
    }


# ---- workers (run in subprocesses) -------------------------------------------------


def worker_sparkgrad(model: str, threads: int, steps: int, warmup: int, precision: str = "fp32") -> dict:
    import numpy as np
    from sparkgrad.nn import SGD, Adadelta, set_num_threads
    from sparkgrad.nn.models import horovod_cnn, walkthrough_mlp

    set_num_threads(threads)
    x, y = load_data(model)
    if model == "mlp":
        m = walkthrough_mlp(seed=1)
        m.compile(optimizer=SGD(0.07), loss="sparse_categorical_crossentropy", precision=precision)
        target = y
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
    return summarise(rates)


def worker_sparkgrad_bf16(model: str, threads: int, steps: int, warmup: int) -> dict:
    """sparkgrad with compile(precision="bf16"); where the CPU has no native bf16
    it would run fp32, so it reports that instead of a rate."""
    from sparkgrad import _core

    if not _core.bf16_supported():
        return {"unsupported": "no native bf16 on this CPU (AVX512_BF16/AMX, as oneDNN sees it)"}
    return worker_sparkgrad(model, threads, steps, warmup, precision="bf16")


def worker_torch(model: str, threads: int, steps: int, warmup: int) -> dict:
    import torch
    import torch.nn as tnn

    torch.set_num_threads(threads)
    x, y = load_data(model)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    torch.manual_seed(1)
    if model == "mlp":
        net = tnn.Sequential(tnn.Linear(784, 128), tnn.ReLU(), tnn.Linear(128, 64), tnn.ReLU(), tnn.Linear(64, 10))
        opt = torch.optim.SGD(net.parameters(), lr=0.07)
    else:
        x = x.permute(0, 3, 1, 2).contiguous()
        net = tnn.Sequential(
            tnn.Conv2d(1, 32, 3), tnn.ReLU(), tnn.Conv2d(32, 64, 3), tnn.ReLU(), tnn.MaxPool2d(2), tnn.Dropout(0.25),
            tnn.Flatten(), tnn.Linear(9216, 128), tnn.ReLU(), tnn.Dropout(0.5), tnn.Linear(128, 10),
        )  # fmt: skip
        opt = torch.optim.Adadelta(net.parameters(), lr=0.1, rho=0.95, eps=1e-7)
    b = BATCH[model]
    n = x.shape[0]
    lossf = tnn.CrossEntropyLoss()

    def run(k: int, start: int) -> None:
        perm = torch.randperm(n)
        for s in range(k):
            i = ((start + s) * b) % (n - b)
            idx = perm[i : i + b]
            opt.zero_grad()
            loss = lossf(net(x[idx]), y[idx])
            loss.backward()
            opt.step()

    run(warmup, 0)
    rates = []
    for r in range(REPEATS):
        t = time.perf_counter()
        run(steps, warmup + r * steps)
        rates.append(steps * b / (time.perf_counter() - t))
    return summarise(rates)


def worker_keras(model: str, threads: int, steps: int, warmup: int) -> dict:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf

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
                keras.layers.Dense(10),
            ]
        )
        net.compile(
            optimizer=keras.optimizers.SGD(0.07), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
        target = y
    else:
        L = keras.layers
        net = keras.Sequential(
            [keras.Input((28, 28, 1)), L.Conv2D(32, 3, activation="relu"), L.Conv2D(64, 3, activation="relu"),
             L.MaxPooling2D(2), L.Dropout(0.25), L.Flatten(), L.Dense(128, activation="relu"), L.Dropout(0.5),
             L.Dense(10, activation="softmax")]
        )  # fmt: skip
        net.compile(optimizer=keras.optimizers.Adadelta(0.1), loss="categorical_crossentropy")
        import numpy as np

        target = np.eye(10, dtype=np.float32)[y]
    b = BATCH[model]
    net.fit(x[: warmup * b], target[: warmup * b], batch_size=b, epochs=1, verbose=0)
    rows = min(steps * b, (len(x) // b) * b)
    epochs = -(-steps * b // rows)
    rates = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        net.fit(x[:rows], target[:rows], batch_size=b, epochs=epochs, verbose=0)
        rates.append(rows * epochs / (time.perf_counter() - t))
    return summarise(rates)


def worker_gemm(threads: int) -> dict:
    """Measured fp32 GEMM peak: best of NumPy (BLAS) and torch.mm on 1536^3."""
    import numpy as np

    n = 1536
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        a @ a
        best = max(best, 2 * n**3 / (time.perf_counter() - t))
    try:
        import torch

        torch.set_num_threads(threads)
        ta = torch.from_numpy(a)
        for _ in range(5):
            t = time.perf_counter()
            torch.mm(ta, ta)
            best = max(best, 2 * n**3 / (time.perf_counter() - t))
    except ImportError:
        pass
    return {"gflops": best / 1e9}


WORKERS = {
    "sparkgrad": worker_sparkgrad,
    "sparkgrad_bf16": worker_sparkgrad_bf16,
    "torch": worker_torch,
    "keras": worker_keras,
}


WAIT_POLICY = "passive"


def spawn(python: str, args: list[str], threads: int, timeout: float) -> dict | None:
    env = dict(
        os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads)
    )
    # The same OpenMP wait policy for every system: on a machine shared with other
    # jobs, spinning threads wait for a descheduled peer for a whole time slice.
    env["OMP_WAIT_POLICY"] = WAIT_POLICY
    env["PYTHONPATH"] = str(ROOT / "python")
    try:
        out = subprocess.run(
            [python, __file__, "--worker", *args], env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        print(f"  {' '.join(args)}: timed out after {timeout:.0f} s", file=sys.stderr)
        return None
    if out.returncode != 0:
        print(f"  {' '.join(args)} failed:\n{out.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def keras_available() -> bool:
    if not os.path.exists(TF_PYTHON):
        return False
    r = subprocess.run([TF_PYTHON, "-c", "import tensorflow"], capture_output=True, timeout=300)
    return r.returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer steps (about a minute)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--wait-policy", default="passive", choices=["passive", "active"], help="OMP_WAIT_POLICY for all")
    ap.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        if args.worker[0] == "gemm":
            res = worker_gemm(int(args.worker[1]))
        else:
            system, model, threads, steps, warmup = args.worker
            res = WORKERS[system](model, int(threads), int(steps), int(warmup))
        print(json.dumps(res))
        return 0

    global WAIT_POLICY
    WAIT_POLICY = args.wait_policy
    steps = {"mlp": 200 if args.quick else 1000, "cnn": 5 if args.quick else 20}  # per timed segment
    warmup = {"mlp": 50, "cnn": 3}
    threads = [int(t) for t in args.threads.split(",")]
    has_keras = keras_available()
    flops = {"mlp": MLP_FLOPS, "cnn": CNN_FLOPS}
    rows: list[dict] = []
    table: list[tuple] = []

    def row(system, metric, value, unit):
        rows.append({"system": system, "metric": metric, "value": value, "unit": unit})

    load_before = os.getloadavg()[0]
    row("machine", "load_average_1min_at_start", round(load_before, 2), "runnable tasks (2 cores)")
    row("machine", f"omp_wait_policy_{WAIT_POLICY}", 1, "flag")
    for model in ("mlp", "cnn"):
        row("machine", f"{model}_flops_per_training_sample", flops[model], "FLOP")
    bounds: dict[str, float] = {}
    for t in threads:
        g = spawn(sys.executable, ["gemm", str(t)], t, 300)
        peak = g["gflops"] if g else float("nan")
        row("machine", f"fp32_gemm_peak_t{t}", round(peak, 1), "GFLOP/s")
        for model in ("mlp", "cnn"):
            # no system can train faster than the measured GEMM peak over the FLOPs of one sample
            bounds[f"{model}_t{t}"] = peak * 1e9 / flops[model]
            row("machine", f"{model}_compute_bound_t{t}", round(bounds[f"{model}_t{t}"], 1), "samples/s")
        for model in ("mlp", "cnn"):
            res = {}
            why: dict[str, str] = {}
            for system in ("sparkgrad", "sparkgrad_bf16", "torch", "keras"):
                python = TF_PYTHON if system == "keras" else sys.executable
                if system == "keras" and not has_keras:
                    res[system] = None
                    continue
                res[system] = spawn(python, [system, model, str(t), str(steps[model]), str(warmup[model])], t, 1800)
                if res[system] is not None and "unsupported" in res[system]:
                    why[system] = res[system]["unsupported"]
                    res[system] = None
            tag = f"{model}_b{BATCH[model]}_t{t}"
            ours = res["sparkgrad"]["samples_per_s"] if res["sparkgrad"] else float("nan")
            ours_med = res["sparkgrad"]["samples_per_s_median"] if res["sparkgrad"] else float("nan")
            for system, r in res.items():
                if r is None:
                    unit = "not measured" if system == "keras" else why.get(system, "failed")
                    row(system, f"{tag}_samples_per_s", None, unit)
                    table.append((tag, system, "not measured", "", "", "", "", ""))
                    continue
                share = r["samples_per_s"] * flops[model] / (peak * 1e9)
                row(system, f"{tag}_samples_per_s", round(r["samples_per_s"], 1), f"samples/s (best of {REPEATS})")
                row(system, f"{tag}_samples_per_s_median", round(r["samples_per_s_median"], 1), "samples/s")
                row(system, f"{tag}_peak_rss", round(r["peak_rss_mb"], 1), "MB")
                row(system, f"{tag}_share_of_gemm_peak", round(share, 4), "fraction")
                ratio = ours / r["samples_per_s"]
                med = float("nan")
                if system == "sparkgrad_bf16":
                    # bf16 against sparkgrad's own fp32 (the share above is of the fp32 GEMM peak)
                    ratio = r["samples_per_s"] / ours
                    med = r["samples_per_s_median"] / ours_med
                    row("sparkgrad_bf16", f"{tag}_speedup_vs_fp32", round(ratio, 2), "x")
                    row("sparkgrad_bf16", f"{tag}_speedup_vs_fp32_of_medians", round(med, 2), "x")
                elif system != "sparkgrad":
                    row("sparkgrad", f"{tag}_ratio_vs_{system}", round(ratio, 2), "x")
                    med = ours_med / r["samples_per_s_median"]
                    row("sparkgrad", f"{tag}_ratio_vs_{system}_of_medians", round(med, 2), "x")
                table.append(
                    (tag, system, f"{r['samples_per_s']:,.0f}", f"{ratio:.2f}x" if system != "sparkgrad" else "",
                     f"{r['samples_per_s_median']:,.0f}", f"{med:.2f}x" if system != "sparkgrad" else "",
                     f"{100 * share:.1f}%", f"{r['peak_rss_mb']:.0f}")
                )  # fmt: skip
    load_after = os.getloadavg()[0]
    row("machine", "load_average_1min_at_end", round(load_after, 2), "runnable tasks (2 cores)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=1) + "\n")
    head = ("config", "system", "best samples/s", "sg ratio", "median", "sg ratio", "% GEMM peak", "peak RSS MB")
    widths = [max(len(str(r[i])) for r in [head, *table]) + 2 for i in range(len(head))]
    print("".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    for r in table:
        print("".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    for t in threads:
        peak_t = next(r["value"] for r in rows if r["metric"] == f"fp32_gemm_peak_t{t}")
        print(
            f"fp32 GEMM peak, {t} thread(s): {peak_t} GFLOP/s; compute bound (peak / FLOPs per sample): "
            f"MLP {bounds[f'mlp_t{t}']:,.0f} samples/s, CNN {bounds[f'cnn_t{t}']:,.0f} samples/s"
        )
    keras_note = "measured" if has_keras else f"not measured (no tensorflow at {TF_PYTHON})"
    print(f"FLOPs per training sample: MLP {MLP_FLOPS / 1e3:.0f} k, CNN {CNN_FLOPS / 1e6:.1f} M; keras: {keras_note}")
    print(f"load average (1 min) at start {load_before:.2f}, at end {load_after:.2f}: other work on the")
    print(f"machine takes cores from multi-threaded runs; OMP_WAIT_POLICY={WAIT_POLICY} for every system")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
