"""End-to-end allreduce benchmark: sparkgrad.HorovodRunner(np=2) vs TorchDistributor (DDP gloo).

The same job for every system, on this machine, on a local Spark session with
2 task slots: the HorovodRunner recipe's seed CNN (sparkgrad.nn.models.
horovod_cnn and its PyTorch twin in bench/hvd_torch.py: Keras' glorot-uniform
init, Adadelta lr 0.1 x 2, rho 0.95, eps 1e-7, categorical cross entropy,
batch 128 per process) on Fashion-MNIST (sparkgrad.data.idx, pixels in
[0, 1]), 2 processes, each with (cores / 2) compute threads. Each process
loads its data before training starts; each epoch both systems take the
same number of steps (the samples per process rounded down to whole
batches).

- sparkgrad: ``HorovodRunner(np=2).run(main)`` on local[2] (a barrier stage
  of 2 Spark tasks, what a Databricks user runs), main() calling hvd.init(),
  compiling with ``hvd.DistributedOptimizer(Adadelta(0.1 * hvd.size()))`` and
  fitting its shard with BroadcastGlobalVariablesCallback(0).
  "sparkgrad_bf16" is the same with ``compile(precision="bf16")`` (bf16
  Dense and Conv2D, fp32 master weights, fp32 gradients on the wire).
- TorchDistributor: ``TorchDistributor(num_processes=2, local_mode=True,
  use_gpu=False)`` with DistributedDataParallel over gloo and a
  DistributedSampler; "torch" eagerly, "torch_compile" with the model
  through torch.compile inside DDP (its first step, which compiles, is reported apart as
  compile_s and left out of its training time; each run has an empty
  inductor cache, TORCHINDUCTOR_CACHE_DIR, as a fresh cluster has),
  "torch_bf16" eagerly with forward and loss under bf16 autocast.
  The bf16 systems run only where the CPU has native bf16 (avx512_bf16 or
  amx_bf16 in /proc/cpuinfo); elsewhere a row says why.
- horovod: ``pip install horovod`` is tried in a throwaway venv that sees
  this venv's packages (torch among them), with a timeout, and if it fails
  (not with --quick) once more with the settings a user would try next (HOROVOD_RETRY_ENV:
  CMake's policy-minimum escape, PyTorch and gloo only); the rows say
  whether it built, else the first line of the error. Nothing is installed
  into this venv.

Measured for each, as medians over ``--repeat`` runs (round-robin over the
systems) with their min and max: run() wall time (run() called -> returned,
Spark's start before it, reported apart), training time (first step ->
last step, from each process's own wall-clock timestamps: the earliest
first step to the latest last step), samples/s over the training time,
and rank 0's test accuracy on the 10,000 test images after the epochs.
The speedup rows divide each TorchDistributor's training time (and run()
wall time) by each sparkgrad's, and "best precision" divides the fastest
anchor's by sparkgrad's faster precision; the accuracy difference says
whether they are at equal accuracy.

    python bench/bench_hvd.py [--quick] [--systems sparkgrad,sparkgrad_bf16,torch,...] [--repeat N] [--no-horovod]

``--quick``: 12,800 samples, 1 epoch, 1 run, no torch.compile, horovod's
plain install only (about 3 minutes).
Default: 3 epochs of the 60,000 samples, 3 runs. Prints the table and writes
bench/results/hvd.json (rows system, metric, value, unit; min/max/runs where
a figure is a median).
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
SYSTEMS = ("sparkgrad", "sparkgrad_bf16", "torch", "torch_compile", "torch_bf16")
LABELS = {
    "sparkgrad": "sparkgrad HorovodRunner(np=2)",
    "sparkgrad_bf16": "sparkgrad HorovodRunner(np=2, bf16)",
    "torch": "TorchDistributor (DDP gloo)",
    "torch_compile": "TorchDistributor (DDP gloo, torch.compile)",
    "torch_bf16": "TorchDistributor (DDP gloo, bf16 autocast)",
}
OURS = ("sparkgrad", "sparkgrad_bf16")
ANCHORS = ("torch", "torch_compile", "torch_bf16")
BF16 = ("sparkgrad_bf16", "torch_bf16")  # measured only where the CPU has native bf16
BEST_OURS = "sparkgrad HorovodRunner (best precision)"
# compile(precision="bf16") and nothing else: fp32 gradients on the wire, reduced after backward, as
# the torch_bf16 anchor keeps DDP's defaults (the child's --compression and --bucket-bytes are there
# to try the rest: 2 x 25,600 samples, 1 epoch, gave 1.04x for 1 MB buckets and 1.06x for both)
SPARKGRAD_ARGS = {"sparkgrad_bf16": ["--precision", "bf16"]}
NP = 2
BATCH = 128


# ---- sparkgrad: main() of every rank, and the child that runs HorovodRunner ---------------


def sparkgrad_main(
    samples: int, epochs: int, threads: int, out_dir: str, precision: str = "fp32", compression=None, bucket_bytes=0
) -> dict:
    """What a HorovodRunner user's main() does, plus the process's own timestamps."""
    import os
    import time

    import numpy as np
    import sparkgrad.hvd as hvd
    from sparkgrad.data.idx import fashion_mnist
    from sparkgrad.nn import Adadelta, set_num_threads
    from sparkgrad.nn.models import horovod_cnn

    hvd.init()
    set_num_threads(threads)
    rank, size = hvd.rank(), hvd.size()
    x, y = fashion_mnist("train")
    per_rank = (min(samples, len(x)) // size) // BATCH * BATCH
    x = (x[:samples][rank::size][:per_rank].reshape(-1, 28, 28, 1).astype(np.float32)) / 255
    onehot = np.eye(10, dtype=np.float32)[y[:samples][rank::size][:per_rank]]
    model = horovod_cnn(seed=1)
    model.compile(
        optimizer=hvd.DistributedOptimizer(
            Adadelta(learning_rate=0.1 * size), compression=compression, bucket_bytes=bucket_bytes
        ),
        loss="categorical_crossentropy",
        metrics=["accuracy"],
        precision=precision,
    )

    class Stamps:
        first = last = None

        def on_train_begin(self, logs):
            self.first = time.time()

        def on_train_end(self, logs):
            self.last = time.time()

    stamps = Stamps()
    model.fit(
        x,
        onehot,
        batch_size=BATCH,
        epochs=epochs,
        verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), stamps],
    )
    result = {
        "rank": rank,
        "first_step_wall": stamps.first,
        "last_step_wall": stamps.last,
        "samples": int(model.step) * BATCH,
        "steps": int(model.step),
        "threads": threads,
    }
    if rank == 0:
        tx, ty = fashion_mnist("test")
        _, acc = model.evaluate(tx.reshape(-1, 28, 28, 1).astype(np.float32) / 255, np.eye(10, dtype=np.float32)[ty])
        result["test_accuracy"] = float(acc)
    with open(os.path.join(out_dir, f"sparkgrad-{rank}.json"), "w") as f:
        json.dump(result, f)
    return result


def child_sparkgrad(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(BENCH))
    import anchor_driver
    import sparkgrad

    os.makedirs(args.out_dir, exist_ok=True)
    spark, spark_seconds = anchor_driver.start_spark("bench_hvd-sparkgrad", NP, cold=False)
    try:
        t0 = time.time()
        sparkgrad.HorovodRunner(np=NP).run(
            sparkgrad_main, samples=args.samples, epochs=args.epochs, threads=args.threads, out_dir=args.out_dir,
            precision=args.precision, compression=args.compression, bucket_bytes=args.bucket_bytes,
        )  # fmt: skip
        t_end = time.time()
    finally:
        spark.stop()
    return anchor_driver.write_result(args, "sparkgrad", {"t0": t0, "end": t_end}, spark_seconds, ("pyspark",))


# ---- horovod: does `pip install horovod` build here? --------------------------------------


# a skilled user's second try after the plain install fails on this CMake (4.x refuses horovod's
# bundled gloo, which asks for CMake < 3.5): CMake's documented escape, and torch only
HOROVOD_RETRY_ENV = {
    "CMAKE_POLICY_VERSION_MINIMUM": "3.5",
    "HOROVOD_WITH_PYTORCH": "1",
    "HOROVOD_WITHOUT_TENSORFLOW": "1",
    "HOROVOD_WITHOUT_MXNET": "1",
    "HOROVOD_WITHOUT_MPI": "1",
    "HOROVOD_WITH_GLOO": "1",
    "MAKEFLAGS": f"-j{os.cpu_count() or 1}",
}
_NOT_THE_ERROR = ("subprocess-exited-with-error", "finished with status 'error'", "failed building wheel",
                  "could not build wheels", "this error originates", "running setup.py")  # fmt: skip


def first_error(text: str) -> str:
    """The first line of a pip build log that says what went wrong (a compiler's or CMake's)."""
    lines = [ln.strip() for ln in text.splitlines()]
    for i, ln in enumerate(lines):
        low = ln.lower()
        if (
            not re.search(r"\berror:|cmake error", low)
            or any(s in low for s in _NOT_THE_ERROR)
            or low.startswith("warning")
        ):
            continue
        if ln.startswith("CMake Error"):
            nxt = next((x for x in lines[i + 1 :] if x), "")
            return f"{ln} {nxt}"
        at = ln.find("error:")
        return ln[at:] if at > 0 else ln
    return lines[-1] if lines else "no output"


def try_horovod(timeout: float, work: pathlib.Path, retry: bool = True) -> list[tuple[str, bool, str]]:
    """[(attempt, built, what happened)]: pip install horovod in a throwaway venv that sees this venv's packages."""
    venv = work / "horovod-venv"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, capture_output=True)
        site = next(iter(glob.glob(str(venv / "lib" / "python*" / "site-packages"))))
    except (OSError, subprocess.SubprocessError, StopIteration) as e:
        return [("plain", False, f"could not make a throwaway venv: {e}")]
    ours = [p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix)]
    pathlib.Path(site, "zz_sparkgrad_venv.pth").write_text("\n".join(ours) + "\n")  # torch, for its build
    cmd = [str(venv / "bin" / "pip"), "--disable-pip-version-check", "install", "--no-cache-dir", "horovod"]
    attempts = []
    for name, extra in (("plain", {}), ("retry", HOROVOD_RETRY_ENV))[: 2 if retry else 1]:
        log = work / f"horovod-pip-{name}.log"
        try:
            with open(log, "w") as f:
                r = subprocess.run(
                    cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env={**os.environ, **extra}
                )
        except subprocess.TimeoutExpired:
            attempts.append((name, False, f"pip install horovod did not finish within {timeout:.0f} s (log {log})"))
            continue
        if r.returncode == 0:
            probe = subprocess.run(
                [str(venv / "bin" / "python"), "-c", "import horovod.torch as h; print(h.__version__)"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if probe.returncode == 0:
                attempts.append((name, True, f"built horovod {probe.stdout.strip()}"))
                break
            last = (probe.stderr.strip().splitlines() or ["?"])[-1]
            attempts.append((name, False, f"pip installed horovod but `import horovod.torch` fails: {last[:200]}"))
            break
        err = first_error(log.read_text(errors="replace"))
        attempts.append((name, False, f"pip install horovod failed (exit {r.returncode}): {err[:240]}"))
    return attempts


# ---- the driver ------------------------------------------------------------------------------


def run_child(cmd: list[str], env: dict, timeout: float, log: pathlib.Path) -> tuple[dict | None, str]:
    sys.path.insert(0, str(BENCH))
    from bench_cluster import run_child as run_in_group

    return run_in_group("", cmd, env, timeout, log)


def summarize(res: dict, system: str) -> dict:
    nodes = res["nodes"]
    if len(nodes) < NP or any(not n.get("first_step_wall") or not n.get("last_step_wall") for n in nodes):
        raise ValueError(f"{len(nodes)} of {NP} processes reported their first and last step")
    accs = [n["test_accuracy"] for n in nodes if "test_accuracy" in n]
    if not accs:
        raise ValueError("rank 0 reported no test accuracy")
    out = {}
    first, last = min(n["first_step_wall"] for n in nodes), max(n["last_step_wall"] for n in nodes)
    train = last - first
    if system == "torch_compile":
        if any(not n.get("compiled_graphs") for n in nodes):
            raise ValueError("torch.compile compiled no graph (it ran eagerly)")
        out["graph_breaks"] = max(n.get("graph_breaks", 0) for n in nodes)
        # the first step compiles forward and backward: apart, less one ordinary step
        step = statistics.median(n["step_seconds"] for n in nodes)
        compile_s = max(n["first_step_end_wall"] - n["first_step_wall"] for n in nodes) - step
        out["compile_s"] = compile_s
        train -= compile_s
    samples = sum(int(n["samples"]) for n in nodes)
    return {
        **out,
        "run_wall_s": res["end"] - res["t0"],
        "train_s": train,
        "samples": samples,
        "samples_per_s": samples / train,
        "test_accuracy": accs[0],
        "spark_start_s": res["spark_start_seconds"],
    }


UNITS = {
    "run_wall_s": "s (run() called -> returned)",
    "train_s": "s (first step -> last step, the processes' own clocks)",
    "compile_s": "s (torch.compile's first step less one step)",
    "graph_breaks": "graph breaks (torch._dynamo's count, rank with most)",
    "samples": "samples (both processes, all epochs)",
    "samples_per_s": "samples/s (over the training time)",
    "test_accuracy": "fraction (rank 0, 10,000 test images)",
    "spark_start_s": "s (SparkSession start, before run())",
}
METRICS = ("run_wall_s", "train_s", "compile_s", "graph_breaks", "samples", "samples_per_s", "test_accuracy",
           "spark_start_s")  # fmt: skip
DIGITS = {"test_accuracy": 4, "samples": 0, "compile_s": 2, "spark_start_s": 2, "graph_breaks": 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--quick", action="store_true", help="12,800 samples, 1 epoch, 1 run, no torch.compile, no horovod retry"
    )
    ap.add_argument("--systems", default=None, help=f"comma-separated subset of {','.join(SYSTEMS)}")
    ap.add_argument("--samples", type=int, default=None, help="training samples per epoch (default 60,000)")
    ap.add_argument("--epochs", type=int, default=None, help="default 3 (quick 1)")
    ap.add_argument("--repeat", type=int, default=None, help="runs per system (default 3, quick 1)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per run (default 600 quick, 2400 full)")
    ap.add_argument("--no-horovod", action="store_true", help="do not try pip install horovod")
    ap.add_argument("--horovod-timeout", type=float, default=600.0, help="seconds for each pip install horovod")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    ap.add_argument("--compression", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--bucket-bytes", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    benchlib.add_update_flag(ap)
    args = ap.parse_args()
    meta = benchlib.metadata("hvd")
    if args.child:
        return child_sparkgrad(args)

    default_systems = "sparkgrad,torch" if args.quick else ",".join(SYSTEMS)
    systems = [s.strip() for s in (args.systems or default_systems).split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        ap.error(f"unknown system(s) {unknown}; choose from {SYSTEMS}")
    samples = args.samples or (12_800 if args.quick else 60_000)
    epochs = args.epochs or (1 if args.quick else 3)
    repeat = args.repeat or (1 if args.quick else 3)
    timeout = args.timeout or (600 if args.quick else 2400)
    threads = max(1, (os.cpu_count() or 2) // NP)
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-hvd-"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python"), str(BENCH)]))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    rows: list[dict] = []

    def row(system, metric, value, unit, **extra):
        rows.append({"system": system, "metric": metric, "value": value, "unit": unit, **extra})

    load_before = os.getloadavg()[0]
    row("machine", "load_average_1min_at_start", round(load_before, 2), f"runnable tasks ({os.cpu_count()} cores)")
    row("machine", "training_samples_per_epoch", samples, "samples (60,000 = all of Fashion-MNIST's training set)")
    row("machine", "epochs", epochs, "epochs")
    row("machine", "threads_per_process", threads, "compute threads (cores / 2)")
    row("machine", "runs_per_system", repeat, "runs (figures are medians; min and max beside them)")

    runs: dict[str, list[dict]] = {}
    reasons: dict[str, str] = {}
    if not benchlib.cpu_info()["bf16"]:  # emulated bf16 would measure the emulation, not the method
        for system in BF16:
            reasons[system] = "no avx512_bf16/amx_bf16 in /proc/cpuinfo: bf16 would be emulated"
    versions: dict[str, dict] = {}
    for rep in range(repeat):  # round-robin, so that a change of load falls on every system alike
        for system in systems:
            if system in BF16 and system in reasons:
                continue
            tag = f"{system}-{rep}"
            log, nodes_dir = work / f"{tag}.log", work / f"{tag}-nodes"
            common = ["--samples", str(samples), "--epochs", str(epochs), "--out-dir", str(nodes_dir)]
            common += ["--threads", str(threads)]
            if system in OURS:
                cmd = [sys.executable, __file__, "--child", "sparkgrad", *common]
                cmd += SPARKGRAD_ARGS.get(system, [])
            else:
                cmd = [sys.executable, str(BENCH / "hvd_torch.py"), *common, "--num-processes", str(NP)]
                cmd += {"torch_compile": ["--compile"], "torch_bf16": ["--bf16"]}.get(system, [])
            print(f"run {rep + 1}/{repeat}: {LABELS[system]}...", flush=True)
            run_env = env
            if system == "torch_compile":  # a cold compile cache for each run, as on a fresh cluster
                run_env = dict(env, TORCHINDUCTOR_CACHE_DIR=str(work / f"{tag}-inductor-cache"))
            res, why = run_child(cmd, run_env, timeout, log)
            one = None
            if res is not None:
                try:
                    one = summarize(res, system)
                    versions[system] = res.get("versions", {})
                except (KeyError, ValueError) as e:
                    why = f"incomplete result ({e}; log {log})"
            if one is None:
                reasons[system] = why
                print(f"  not measured: {why}", flush=True)
                continue
            runs.setdefault(system, []).append(one)
            print(
                f"  run() {one['run_wall_s']:.1f} s, training {one['train_s']:.1f} s, "
                f"{one['samples_per_s']:,.0f} samples/s, test accuracy {one['test_accuracy']:.4f}"
                + (f", compile {one['compile_s']:.1f} s" if "compile_s" in one else ""),
                flush=True,
            )

    medians: dict[str, dict] = {}
    for system in systems:
        done = runs.get(system, [])
        if len(done) < repeat:  # a system that failed once is reported as failed, not as its lucky runs
            reason = reasons.get(system, "not run")
            row(LABELS[system], "train_s", None, UNITS["train_s"], reason=reason)
            continue
        medians[system] = benchlib.summarise_runs(done)
        for metric in METRICS:
            if metric not in done[0]:
                continue
            d = DIGITS.get(metric, 1)
            s = medians[system]
            spread = {"min": round(s[f"{metric}_min"], d), "max": round(s[f"{metric}_max"], d), "runs": s["runs"]}
            row(LABELS[system], metric, round(s[metric], d), UNITS[metric], **(spread if repeat > 1 else {}))

    def compare(label: str, suffix: str, mine: dict, theirs: dict, unit: str = "their {} / ours") -> str:
        """The speedup and accuracy rows of one sparkgrad system against one anchor."""
        t_ratio = theirs["train_s"] / mine["train_s"]
        w_ratio = theirs["run_wall_s"] / mine["run_wall_s"]
        delta = mine["test_accuracy"] - theirs["test_accuracy"]
        row(label, f"training_speedup_vs_{suffix}", round(t_ratio, 2), f"x ({unit.format('training s')})")
        row(label, f"run_wall_speedup_vs_{suffix}", round(w_ratio, 2), f"x ({unit.format('run() s')})")
        row(label, f"accuracy_minus_{suffix}", round(delta, 4), "fraction (same epochs, same recipe)")
        return f"training {t_ratio:.2f}x, run() {w_ratio:.2f}x, accuracy {delta:+.4f}"

    ratio_lines = []
    for ours in (o for o in OURS if o in systems):
        mine = medians.get(ours)
        for anchor in (a for a in ANCHORS if a in systems):
            theirs = medians.get(anchor)
            if mine is None or theirs is None:
                why = reasons.get(ours if mine is None else anchor, "not run")
                row(LABELS[ours], f"training_speedup_vs_{anchor}", None, "x", reason=why)
                continue
            ratio_lines.append(f"{LABELS[ours]} vs {LABELS[anchor]}: {compare(LABELS[ours], anchor, mine, theirs)}")
    # each side at its best: the faster of sparkgrad's precisions against the fastest TorchDistributor
    best_ours = min((o for o in OURS if o in medians), key=lambda o: medians[o]["train_s"], default=None)
    best_theirs = min((a for a in ANCHORS if a in medians), key=lambda a: medians[a]["train_s"], default=None)
    if best_ours and best_theirs:
        unit = f"{LABELS[best_theirs]}'s {{}} / {LABELS[best_ours]}'s"
        line = compare(BEST_OURS, "best_torch", medians[best_ours], medians[best_theirs], unit)
        ratio_lines.append(f"best against best: {LABELS[best_ours]} vs {LABELS[best_theirs]}: {line}")
    eager = medians.get("torch")
    for anchor in ("torch_compile", "torch_bf16"):
        if eager and medians.get(anchor):
            gain = eager["train_s"] / medians[anchor]["train_s"]
            row(LABELS[anchor], "training_speedup_vs_eager", round(gain, 2), "x (eager training s / this one's)")
            ratio_lines.append(f"{LABELS[anchor]} on this CPU: {gain:.2f}x the eager training speed")

    if args.no_horovod:
        row("horovod", "pip_install_horovod", None, "", reason="not tried (--no-horovod)")
    else:
        print(f"pip install horovod in a throwaway venv (timeout {args.horovod_timeout:.0f} s)...", flush=True)
        for attempt, built, what in try_horovod(args.horovod_timeout, work, retry=not args.quick):
            label = "pip install horovod" + (
                "" if attempt == "plain" else " with " + " ".join(f"{k}={v}" for k, v in HOROVOD_RETRY_ENV.items())
            )
            print(f"  {label}: {what}", flush=True)
            metric = "pip_install_horovod" + ("" if attempt == "plain" else "_retry")
            if built:  # running it beside the others is not wired up: say so rather than leave it out
                row("horovod", metric, 1, what)
                row("horovod", "train_s", None, UNITS["train_s"], reason="built, but bench_hvd.py does not run it")
            else:
                row("horovod", metric, None, label, reason=what)
    shutil.rmtree(work / "horovod-venv", ignore_errors=True)

    results = benchlib.results_file("hvd.json", args.update)
    benchlib.write_results(results, rows, meta)

    head = ("system", "run() s", "training s", "samples", "samples/s", "test acc", "compile s")
    table = []
    for system in systems:
        s = medians.get(system)
        if s is None:
            table.append((LABELS[system], f"not measured: {reasons.get(system, 'not run')}", "", "", "", "", ""))
            continue
        table.append(
            (LABELS[system], f"{s['run_wall_s']:.1f}", f"{s['train_s']:.1f}", str(int(s["samples"])),
             f"{s['samples_per_s']:,.0f}", f"{s['test_accuracy']:.4f}",
             f"{s['compile_s']:.1f}" if "compile_s" in s else "")
        )  # fmt: skip
    widths = [max(len(str(r[i])) for r in [head, *table]) + 2 for i in range(len(head))]
    print()
    print("".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    for r in table:
        print("".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    print()
    for line in ratio_lines:
        print(line)
    for system, v in versions.items():
        print(f"{LABELS[system]}: {', '.join(f'{k} {x}' for k, x in v.items())}")
    print(f"sparkgrad from {ROOT / 'python'}, pyspark {importlib.metadata.version('pyspark')}")
    print("target: end to end (run() wall time) >= 2x TorchDistributor at equal accuracy (training time beside it)")
    print(f"load average (1 min) at start {load_before:.2f}, at end {os.getloadavg()[0]:.2f}; logs in {work}")
    print(f"wrote {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
