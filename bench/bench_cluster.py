"""Cluster benchmark: sparkgrad (async ps, sync) vs TensorFlowOnSpark vs TorchDistributor.

The same job for every system, on this machine, on local Spark: the
walkthrough MLP (784-128-64-10 ReLU, SGD 0.07, batch 100 per worker) on
Fashion-MNIST TFRecords made by ``sparkgrad convert`` (4 train files), 2
workers, 1 epoch of the 60,000 training samples shared between them
(``--quick``: 20,000 samples, warm context only). Each worker uses one
compute thread (OMP_NUM_THREADS=1 and the framework's own thread setting):
2 workers on 2 cores.

- sparkgrad async / sync (from the source tree, its bytecode compiled first
  as a wheel install would): sparkgrad.examples.mnist_dist's map_fun (1 ps + 2
  workers, TFRecords read by each worker for its shard of the files,
  InputMode.TENSORFLOW) through sparkgrad.TFCluster.run. Two placements of
  the ps: a thread of the driver (driver_ps_nodes=True) with the 2 workers
  as Spark tasks on local[2], the same 2 task slots TensorFlowOnSpark uses;
  and the ps as a third Spark task on local[3] ("ps as a task"). Raw [0, 1]
  pixels, as every system (no per-pixel standardisation: the same inputs for
  all), and the same initialisation (truncated normal, stddev 1/sqrt(fan_in)).
  Synchronous sparkgrad is compared with the anchors (both synchronous);
  asynchronous sparkgrad is reported apart.
- TensorFlowOnSpark 2.2.5 + tensorflow-cpu: bench/cluster_tfos.py in the
  first interpreter with tensorflow, tf_keras and tensorflowonspark among
  this one (`make bench` installs the `anchors` extra into .venv) and
  $SPARKGRAD_TF_PYTHON,
  the Keras MultiWorkerMirroredStrategy path of its examples/mnist (chief +
  worker, InputMode.TENSORFLOW) on local[2]; raw [0, 1] pixels.
- TorchDistributor: bench/cluster_torch.py, DDP over gloo, local_mode=True,
  num_processes=2; raw [0, 1] pixels.

Measured for each: formation (run() called on the driver -> every worker has
started its first training step, wall clock on this one machine), total wall
time (run() -> the cluster is shut down and run()/shutdown() returned),
training time (the first worker's first step -> the last worker's last step),
for TensorFlowOnSpark the time.sleep calls of its own shutdown() (in the wall time),
samples/s over that wall time, and the chief's final test accuracy on the
10,000 test images. Spark's own start (SparkSession) is before run() and is
reported apart. Every system runs on a warm SparkContext (one that has
already run a Python job, as in a notebook) and on a cold one (run() is its
first job, so Spark starts its Python workers inside it), each in its own
process group with a timeout, ``--repeat`` times (default 3, round-robin
over the systems; the figures are medians); a system that cannot run is
reported as not measured with the reason, never a figure.

    python bench/bench_cluster.py [--quick] [--systems sparkgrad_async,...,tfos,torch] [--contexts warm,cold]

Prints the table and writes bench/results/cluster.json (rows system, metric, value, unit).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import benchlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
TF_PYTHONS = [sys.executable, os.environ.get("SPARKGRAD_TF_PYTHON", "")]
SOURCE = "/usr/share/datasets/fashion-mnist"
SYSTEMS = ("sparkgrad_async", "sparkgrad_sync", "sparkgrad_async_ps_task", "sparkgrad_sync_ps_task", "tfos", "torch")
OURS = tuple(s for s in SYSTEMS if s.startswith("sparkgrad"))
LABELS = {
    "sparkgrad_async": "sparkgrad async ps",
    "sparkgrad_sync": "sparkgrad sync",
    "sparkgrad_async_ps_task": "sparkgrad async ps, ps as a task",
    "sparkgrad_sync_ps_task": "sparkgrad sync, ps as a task",
    "tfos": "TensorFlowOnSpark 2.2.5",
    "torch": "TorchDistributor (DDP gloo)",
}
NUM_WORKERS = 2
SEED = 42  # run k (of --repeat) in the c-th context seeds every system with SEED + c * repeat + k
BATCH = 100
LR = 0.07


# ---- sparkgrad (runs in a child process of this script) --------------------------


def sparkgrad_map_fun(bench_args, ctx):
    """mnist_dist.map_fun, with the wall-clock time of each worker's first step recorded.

    The example's workers take their batches from ``_train_batches``; this
    wraps it (in the node's process only, restored afterwards) to note when the
    first batch reaches the training loop and to stop after ``max_steps``.
    """
    import itertools
    import time

    from sparkgrad.examples import mnist_dist as ex

    args, max_steps = bench_args
    entered = time.time()
    first: list[float] = []
    last: list[float] = []
    original = ex._train_batches

    def batches(a, c, rank, *rest):
        for batch in itertools.islice(original(a, c, rank, *rest), max_steps):
            if not first:
                first.append(time.time())
            yield batch
        last.append(time.time())  # fit asks for the next batch once the last step is done

    ex._train_batches = batches
    try:
        result = ex.map_fun(args, ctx)
    finally:
        ex._train_batches = original
    if isinstance(result, dict) and "rank" in result:
        result["first_step_wall"] = first[0] if first else None
        result["trained_wall"] = last[0] if last else None
        result["map_fun_wall"] = entered
    return result


def child_sparkgrad(system: str, samples: int, data_dir: str, out: str, cold: bool, seed: int) -> int:
    import anchor_driver
    from sparkgrad import TFCluster
    from sparkgrad.cluster.roles import InputMode
    from sparkgrad.examples.mnist_dist import Args

    sync = system.startswith("sparkgrad_sync")
    ps_in_driver = not system.endswith("_ps_task")
    slots = NUM_WORKERS if ps_in_driver else NUM_WORKERS + 1
    model_dir = tempfile.mkdtemp(prefix="bench-cluster-sg-")
    args = Args(
        mode="tensorflow",
        data_dir=data_dir,
        model_dir=model_dir,
        epochs=1,
        batch_size=BATCH,
        learning_rate=LR,
        sync=sync,
        checkpoint_every=500,
        shard_data=True,  # raw [0, 1] pixels, as every system gets (no per-pixel standardisation)
        seed=seed,
    )
    spark, spark_seconds = anchor_driver.start_spark("bench_cluster-sparkgrad", slots, cold)
    try:
        t0 = time.time()
        cluster = TFCluster.run(
            spark.sparkContext,
            sparkgrad_map_fun,
            (args, samples // (BATCH * NUM_WORKERS)),
            num_executors=NUM_WORKERS + 1,
            num_ps=1,
            input_mode=InputMode.TENSORFLOW,
            driver_ps_nodes=ps_in_driver,
            reservation_timeout=120,
        )
        t_run = time.time()
        cluster.shutdown()
        t_end = time.time()
    finally:
        spark.stop()
        shutil.rmtree(model_dir, ignore_errors=True)
    nodes = [r for r in cluster.results.values() if isinstance(r, dict) and "rank" in r]
    import importlib.metadata

    result = {
        "t0": t0,
        "run_returned": t_run,
        "end": t_end,
        "spark_start_seconds": spark_seconds,
        "nodes": nodes,
        "versions": {"pyspark": importlib.metadata.version("pyspark")},
    }
    pathlib.Path(out).write_text(json.dumps(result))
    print(json.dumps(result))
    return 0


# ---- the driver of the benchmark ---------------------------------------------------


def prepare_data(data_dir: str) -> None:
    sys.path.insert(0, str(ROOT / "python"))
    from sparkgrad.examples.mnist_dist import prepare_data as convert

    convert(data_dir, SOURCE, shards=4)


def compile_bytecode() -> None:
    """Writes sparkgrad's .pyc files, as pip does when it installs the wheel.

    The anchors run from pip-installed packages, bytecode included; the
    benchmark runs sparkgrad from the source tree, where (with
    PYTHONDONTWRITEBYTECODE set, as on this machine) each of Spark's Python
    workers would otherwise compile sparkgrad's modules at every cluster start.
    """
    import compileall

    if not compileall.compile_dir(str(ROOT / "python" / "sparkgrad"), quiet=1):
        raise SystemExit("bench_cluster: compiling sparkgrad's bytecode failed")


def tfos_python() -> tuple[str | None, str]:
    """The first interpreter that has tensorflow, tf_keras and tensorflowonspark; (path, why not)."""
    return benchlib.python_with(TF_PYTHONS, ("tensorflow", "tf_keras", "tensorflowonspark", "pyspark"))


def run_child(system: str, cmd: list[str], env: dict, timeout: float, log: pathlib.Path) -> tuple[dict | None, str]:
    """Runs one system in its own process group; (result, reason it failed)."""
    out = log.with_suffix(".json")
    out.unlink(missing_ok=True)
    cmd = [*cmd, "--out", str(out)]
    with open(log, "w") as f:
        # cwd: the log's directory (TensorFlowOnSpark writes an executor_id file into the working directory)
        proc = subprocess.Popen(
            cmd, env=env, cwd=log.parent, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own group: its JVM and Python workers too
            proc.wait(timeout=30)
            return None, f"timed out after {timeout:.0f} s (log {log})"
    _end_group(proc.pid)
    if rc != 0 or not out.exists():
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        return None, f"exit status {rc} (log {log}): {' / '.join(tail)[-300:]}"
    return json.loads(out.read_text()), ""


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _end_group(pgid: int, wait: float = 15.0) -> None:
    """Ends what a finished run left in its process group (a JVM still shutting down, a
    framework's helper processes), so that nothing of one system runs during the next."""
    deadline = time.monotonic() + wait
    sig = signal.SIGTERM
    while _group_alive(pgid):
        if time.monotonic() > deadline:
            if sig == signal.SIGKILL:
                return
            sig, deadline = signal.SIGKILL, time.monotonic() + 5.0
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        time.sleep(0.1)  # bounded above by the two deadlines; waiting on processes we cannot wait() for


def summarize(res: dict) -> dict:
    """formation, wall, samples, samples/s, accuracy from a child's raw result."""
    nodes = res["nodes"]
    firsts = [n["first_step_wall"] for n in nodes if n.get("first_step_wall")]
    if len(firsts) < NUM_WORKERS:
        raise ValueError(f"{len(firsts)} of {NUM_WORKERS} workers reported a first training step")
    accs = [n["test_accuracy"] for n in nodes if "test_accuracy" in n]
    if not accs:
        raise ValueError("the chief reported no test accuracy")
    wall = res["end"] - res["t0"]
    formation = max(firsts) - res["t0"]
    samples = sum(int(n["samples"]) for n in nodes)
    entered = [n["map_fun_wall"] for n in nodes if n.get("map_fun_wall")]
    extra = {"map_fun_start_s": max(entered) - res["t0"]} if len(entered) == len(firsts) else {}
    trained = [n["trained_wall"] for n in nodes if n.get("trained_wall")]
    if len(trained) == len(firsts):  # training alone: the first worker's first step -> the last worker's last
        extra["train_s"] = max(trained) - min(firsts)
    if res.get("shutdown_sleep_s") is not None:
        extra["shutdown_sleep_s"] = res["shutdown_sleep_s"]
    return {
        **extra,
        "formation_s": formation,
        "wall_s": wall,
        "samples": samples,
        "samples_per_s": samples / wall,
        "samples_per_s_after_formation": samples / max(wall - formation, 1e-9),
        "test_accuracy": accs[0],
        "spark_start_s": res["spark_start_seconds"],
    }


UNITS = {
    "formation_s": "s (run() -> every worker's first step)",
    "map_fun_start_s": (
        "s (run() -> every worker's map_fun called: Spark's task start, then sparkgrad's import and registration)"
    ),
    "wall_s": "s (run() -> shut down)",
    "train_s": "s (training alone: first worker's first step -> last worker's last step)",
    "shutdown_sleep_s": "s (time.sleep calls of TensorFlowOnSpark's own TFCluster.shutdown(), measured; in wall_s)",
    "samples": "samples",
    "samples_per_s": "samples/s (end to end)",
    "samples_per_s_after_formation": "samples/s (first step -> shut down)",
    "test_accuracy": "fraction (10,000 test images; median over the runs' seeds)",
    "test_accuracy_all_seeds": "fraction (10,000 test images; median over every run, both contexts, each its own seed)",
    "spark_start_s": "s (SparkSession start, before run())",
}


CONTEXTS = {
    "warm": "a SparkContext that has already run a Python job (as in a notebook)",
    "cold": "the first job of a fresh SparkContext (Spark starts its Python workers inside run())",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="20,000 samples instead of 60,000 (a run of 1-2 minutes)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {','.join(SYSTEMS)}")
    ap.add_argument("--contexts", default=None, help="warm and/or cold, comma-separated (default: both; --quick: warm)")
    ap.add_argument("--data-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "sparkgrad", "fashion-mnist"))
    ap.add_argument("--timeout", type=float, default=None, help="seconds per run (default 300 quick, 900 full)")
    ap.add_argument("--repeat", type=int, default=None, help="runs per system and context (default 3, quick 1)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--samples", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=SEED, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    benchlib.add_update_flag(ap)
    args = ap.parse_args()
    if args.child:
        return child_sparkgrad(args.child, args.samples, args.data_dir, args.out, args.cold, args.seed)

    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    contexts = [c.strip() for c in (args.contexts or ("warm" if args.quick else "warm,cold")).split(",") if c.strip()]
    unknown = [s for s in systems if s not in SYSTEMS] + [c for c in contexts if c not in CONTEXTS]
    if unknown:
        ap.error(f"unknown system(s)/context(s) {unknown}; choose from {SYSTEMS} and {tuple(CONTEXTS)}")
    samples = 20_000 if args.quick else 60_000
    args.repeat = args.repeat or (1 if args.quick else 3)
    timeout = args.timeout or (300 if args.quick else 900)
    prepare_data(args.data_dir)
    compile_bytecode()
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    base_env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    base_env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    sg_env = dict(base_env, PYTHONPATH=str(ROOT / "python"))
    rows: list[dict] = []

    def row(system, metric, value, unit, **extra):
        rows.append(benchlib.row(system, metric, value, unit, **extra))

    meta = benchlib.metadata("cluster")
    meta["notes"] = [
        "every system gets the same inputs: raw [0, 1] pixels (no per-pixel standardisation)",
        "synchronous sparkgrad is compared with the synchronous anchors (TensorFlowOnSpark's "
        "MultiWorkerMirroredStrategy, TorchDistributor's DDP); asynchronous sparkgrad (a different algorithm: "
        "each worker's updates applied as they come) is reported apart",
        "wall time is run() -> shut down; training time is the first worker's first step -> the last worker's "
        "last step; TensorFlowOnSpark's wall time includes the time.sleep calls of its own TFCluster.shutdown() "
        "(measured: shutdown_sleep_s)",
        f"figures are medians of {args.repeat} runs with min and max; run k of every system in context c "
        f"(its place in --contexts: warm 0, cold 1 by default) uses seed {SEED} + c * {args.repeat} + k (its "
        "initial weights and its shuffle), so accuracy is a median over seeds, and test_accuracy_all_seeds "
        "pools every run of a system",
    ]
    row("machine", "training_samples", samples, "samples (1 epoch = 60,000)")
    row("machine", "runs_per_system", args.repeat, "runs (figures are medians)")
    summary: dict[tuple[str, str], dict | None] = {}
    reasons: dict[tuple[str, str], str] = {}
    versions: dict[str, dict] = {}
    tf_python, tf_missing, tf_probed = None, "", False
    runs: dict[tuple[str, str], list[dict]] = {}
    # Round-robin over the repeats, so that a change of load on the shared
    # machine falls on every system alike.
    for rep in range(args.repeat):
        for context in contexts:
            for system in systems:
                key = (system, context)
                tag = f"{system}-{context}-{rep}"
                log = work / f"{tag}.log"
                nodes_dir = work / f"{tag}-nodes"
                cold = ["--cold"] if context == "cold" else []
                # every system's run k in a context starts from the same seed, and no two runs of a
                # system share one: accuracy (which the context does not touch) pools over contexts
                cold += ["--seed", str(SEED + contexts.index(context) * args.repeat + rep)]
                if system.startswith("sparkgrad"):
                    cmd = [sys.executable, __file__, "--child", system, "--samples", str(samples)]
                    cmd += ["--data-dir", args.data_dir, *cold]
                    env = sg_env
                elif system == "tfos":
                    if not tf_probed:
                        (tf_python, tf_missing), tf_probed = tfos_python(), True
                    if not tf_python:
                        reasons[key] = tf_missing
                        continue
                    cmd = [tf_python, str(BENCH / "cluster_tfos.py"), "--data-dir", args.data_dir, *cold]
                    cmd += ["--samples", str(samples), "--out-dir", str(nodes_dir)]
                    cmd += ["--cluster-size", str(NUM_WORKERS)]
                    env = dict(base_env, TF_USE_LEGACY_KERAS="1")
                    env.pop("PYTHONPATH", None)
                else:
                    cmd = [sys.executable, str(BENCH / "cluster_torch.py"), "--samples", str(samples), *cold]
                    cmd += ["--out-dir", str(nodes_dir), "--num-processes", str(NUM_WORKERS)]
                    env = sg_env
                print(f"run {rep + 1}/{args.repeat}: {LABELS[system]}, {context} context...", flush=True)
                res, why = run_child(system, cmd, env, timeout, log)
                one = None
                if res is not None:
                    try:
                        one = summarize(res)
                        versions[system] = res.get("versions", {})
                    except (KeyError, ValueError) as e:
                        why = f"incomplete result ({e}; log {log})"
                if one is None:
                    reasons[key] = why
                    print(f"  not measured: {why}", flush=True)
                    continue
                runs.setdefault(key, []).append(one)
                print(
                    f"  formation {one['formation_s']:.2f} s"
                    + (f" (map_fun called at {one['map_fun_start_s']:.2f} s)" if "map_fun_start_s" in one else "")
                    + f", wall {one['wall_s']:.1f} s, "
                    f"{one['samples_per_s']:,.0f} samples/s, test accuracy {one['test_accuracy']:.4f}",
                    flush=True,
                )
    for context in contexts:
        for system in systems:
            key = (system, context)
            done = runs.get(key, [])
            if len(done) < args.repeat:  # a system that failed once is reported as failed, not as its lucky runs
                summary[key] = None
                reasons.setdefault(key, "not run")
                continue
            summary[key] = benchlib.summarise_runs(done)
            reasons.pop(key, None)

    # test accuracy over every run of a system, both contexts: its seeds are all different
    pooled: dict[str, dict] = {}
    for system in systems:
        every = [one for context in contexts for one in runs.get((system, context), [])]
        if every and all(summary.get((system, context)) for context in contexts):
            pooled[system] = benchlib.summarise([one["test_accuracy"] for one in every])
            p = pooled[system]
            row(LABELS[system], "test_accuracy_all_seeds", round(p["median"], 4), UNITS["test_accuracy_all_seeds"],
                min=round(p["min"], 4), max=round(p["max"], 4), runs=len(every))  # fmt: skip

    ratio_lines = []
    for ours in OURS:
        for anchor in ("tfos", "torch"):
            if ours in pooled and anchor in pooled:
                how = "synchronous" if "sync" in ours and "async" not in ours else "asynchronous against synchronous"
                delta = pooled[ours]["median"] - pooled[anchor]["median"]
                row(LABELS[ours], f"accuracy_minus_{anchor}_all_seeds", round(delta, 4), "fraction (medians over "
                    "every run's seed)", comparison=how)  # fmt: skip
                ratio_lines.append(f"every seed, {how}: {LABELS[ours]} vs {LABELS[anchor]}: accuracy {delta:+.4f}")
    for context in contexts:
        sfx = "" if context == "warm" else "_cold_context"
        for system in systems:
            s = summary.get((system, context))
            if s is None:
                why = reasons.get((system, context), "not run")
                rows.append(benchlib.not_measured(LABELS[system], f"wall_s{sfx}", why, UNITS["wall_s"]))
                continue
            for metric in (
                "formation_s",
                "map_fun_start_s",
                "wall_s",
                "train_s",
                "shutdown_sleep_s",
                "samples",
                "samples_per_s",
                "samples_per_s_after_formation",
                "test_accuracy",  # run k seeded with SEED + k: the spread is over seeds
            ):
                if metric not in s:  # map_fun_start_s: sparkgrad's runs only; shutdown_sleep_s: TensorFlowOnSpark's
                    continue
                d = 3 if metric.endswith("start_s") or metric == "formation_s" else 2 if metric == "train_s" else 1
                d = 4 if metric == "test_accuracy" else d
                spread = {"min": round(s[metric + "_min"], d), "max": round(s[metric + "_max"], d), "runs": s["runs"]}
                row(LABELS[system], metric + sfx, round(s[metric], d), UNITS[metric], **spread)
            row(LABELS[system], "spark_start_s" + sfx, round(s["spark_start_s"], 2), UNITS["spark_start_s"])
        for ours in OURS:
            mine = summary.get((ours, context))
            if mine is None:
                continue
            # the anchors are synchronous (all-reduce): sparkgrad's asynchronous ps is a different algorithm
            how = "synchronous" if "sync" in ours and "async" not in ours else "asynchronous against synchronous"
            for anchor in ("tfos", "torch"):
                theirs = summary.get((anchor, context))
                if theirs is None:
                    continue
                f_ratio = theirs["formation_s"] / mine["formation_s"]
                w_ratio = theirs["wall_s"] / mine["wall_s"]
                acc_delta = mine["test_accuracy"] - theirs["test_accuracy"]
                tag = {"comparison": how}
                row(LABELS[ours], f"formation_speedup_vs_{anchor}{sfx}", round(f_ratio, 2), "x (medians)", **tag)
                row(LABELS[ours], f"end_to_end_speedup_vs_{anchor}{sfx}", round(w_ratio, 2), "x (medians)", **tag)
                t_text = ""
                if "train_s" in mine and "train_s" in theirs:
                    t_ratio = theirs["train_s"] / mine["train_s"]
                    row(LABELS[ours], f"training_speedup_vs_{anchor}{sfx}", round(t_ratio, 2), "x (medians)", **tag)
                    t_text = f", training {t_ratio:.1f}x faster"
                row(LABELS[ours], f"accuracy_minus_{anchor}{sfx}", round(acc_delta, 4), "fraction", **tag)
                ratio_lines.append(
                    f"{context}, {how}: {LABELS[ours]} vs {LABELS[anchor]}: formation {f_ratio:.1f}x faster, "
                    f"end to end {w_ratio:.1f}x faster{t_text}, accuracy {acc_delta:+.4f}"
                )

    results = benchlib.results_file("cluster.json", args.update)
    benchlib.write_results(results, rows, meta)

    head = ("context", "system", "formation s", "wall s", "samples", "samples/s", "test acc", "Spark start s")
    table = []
    for context in contexts:
        for system in systems:
            s = summary.get((system, context))
            if s is None:
                table.append((context, LABELS[system], "not measured", "", "", "", "", ""))
                continue
            table.append(
                (context, LABELS[system], f"{s['formation_s']:.2f}", f"{s['wall_s']:.1f}", str(int(s["samples"])),
                 f"{s['samples_per_s']:,.0f}", f"{s['test_accuracy']:.4f}", f"{s['spark_start_s']:.1f}")
            )  # fmt: skip
    widths = [max(len(str(r[i])) for r in [head, *table]) + 2 for i in range(len(head))]
    print()
    print("".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    for r in table:
        print("".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    print()
    for line in ratio_lines:
        print(line)
    for (system, context), why in reasons.items():
        print(f"{LABELS[system]} ({context}): not measured: {why}")
    for context in contexts:
        print(f"{context} context: {CONTEXTS[context]}")
    for system, v in versions.items():
        print(f"{LABELS[system]}: {', '.join(f'{k} {x}' for k, x in v.items())}")
    print("targets: formation < 2 s and >= 10x faster than TensorFlowOnSpark; end to end >= 5x faster than both")
    print(f"load average (1 min) at start {meta['load_average_start'][0]:.2f}, at end "
          f"{os.getloadavg()[0]:.2f}; logs in {work}")  # fmt: skip
    print(f"wrote {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
