"""Smoke test of an installed sparkgrad wheel on a clean machine (run by .ci/wheel-smoke in a chroot).

    python smoke.py [--timeout SECONDS]

Runs with the interpreter of the venv the wheel was installed into, never from
the source tree: the first step fails if sparkgrad would be imported from
anywhere but that venv's site-packages. Steps: import, the ``sparkgrad info``
console script, TFRecord write/read round trips (plain and GZIP), 50 training
steps of a small MLP on synthetic data, the OpenMP and vendored libraries the
process maps, and a 1 ps + 2 worker cluster of local processes. Each step
prints one ``smoke: ok <step>: ...`` line; the first failure prints
``smoke: FAIL <step>: ...`` and exits 1, and a step that outlives its timeout
dumps every thread's stack and exits 124.

Not a test of accuracy or speed (the suite under tests/ does that): only that
the wheel installs and its C core, oneDNN, OpenMP and transport work with
nothing but glibc, libstdc++ and the Python the machine has.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np

SEED = 7
FEATURES = 16  # synthetic inputs: float32[N, FEATURES]
CLASSES = 4
TRAIN_STEPS = 50
CLUSTER_STEPS = 30  # per worker
BATCH = 64


class SmokeFailure(Exception):
    """A step's check did not hold."""


def check(cond: bool, message: str) -> None:
    if not cond:
        raise SmokeFailure(message)


# ---- synthetic data and model ----------------------------------------------


def blobs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(x float32[n, FEATURES], y int64[n]): CLASSES Gaussian blobs around fixed centres, separable."""
    centres = np.random.default_rng(SEED).normal(0.0, 3.0, size=(CLASSES, FEATURES)).astype(np.float32)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, size=n)
    x = centres[y] + rng.normal(0.0, 1.0, size=(n, FEATURES)).astype(np.float32)
    return x.astype(np.float32), y.astype(np.int64)


def small_mlp():
    from sparkgrad.nn import Dense, Sequential

    model = Sequential([Dense(32, activation="relu", input_shape=(FEATURES,)), Dense(CLASSES)], seed=SEED)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


# ---- steps -------------------------------------------------------------------


def step_import() -> str:
    check("PYTHONPATH" not in os.environ, f"PYTHONPATH is set ({os.environ.get('PYTHONPATH')!r})")
    import sparkgrad
    from sparkgrad import _core

    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    for mod in (sparkgrad, _core):
        where = os.path.realpath(mod.__file__)
        check(where.startswith(site + os.sep), f"{mod.__name__} comes from {where}, not from {site}")
    check(sys.prefix != sys.base_prefix, f"not running in a venv (sys.prefix {sys.prefix})")
    where = os.path.dirname(sparkgrad.__file__)
    return f"sparkgrad {sparkgrad.__version__} from {where} (python {sys.version.split()[0]})"


def step_info() -> str:
    script = os.path.join(sys.prefix, "bin", "sparkgrad")
    proc = subprocess.run([script, "info"], capture_output=True, text=True, timeout=60)
    check(proc.returncode == 0, f"{script} info exited {proc.returncode}: {proc.stderr.strip()}")
    info = json.loads(proc.stdout)
    print(proc.stdout.rstrip())
    check(info.get("onednn_cpu_runtime") == "OpenMP", f"oneDNN's CPU runtime is {info.get('onednn_cpu_runtime')}")
    check(info["onednn"] == info["onednn_headers"], f"oneDNN {info['onednn']} built against {info['onednn_headers']}")
    return f"sparkgrad {info['sparkgrad']}, oneDNN {info['onednn']}, cJSON {info['cjson']}, libcurl {info['libcurl']}"


def step_tfrecord(workdir: str) -> str:
    from sparkgrad.data import FixedLenFeature, TFRecordDataset, encode_example, tfrecord_iterator, write_records

    x, y = blobs(100, seed=1)
    records = [encode_example({"x": row, "y": int(label)}) for row, label in zip(x, y, strict=True)]
    schema = {"x": FixedLenFeature([FEATURES], "float32"), "y": FixedLenFeature([], "int64")}
    sizes = []
    for compression in (None, "GZIP"):
        path = os.path.join(workdir, f"blobs-{compression or 'plain'}.tfrecord")
        check(write_records(path, records, compression) == len(records), "write_records count")
        back = list(tfrecord_iterator(path, compression))
        check(back == records, f"{compression or 'plain'}: the records read back differ from those written")
        batches = list(TFRecordDataset(path, schema, 32, compression=compression))
        got_x = np.concatenate([b["x"] for b in batches])
        got_y = np.concatenate([b["y"] for b in batches])
        check(np.array_equal(got_x, x) and np.array_equal(got_y, y), f"{compression or 'plain'}: parsed values differ")
        sizes.append(f"{compression or 'plain'} {os.path.getsize(path)} B")
    return f"{len(records)} Examples written and read back ({', '.join(sizes)})"


def step_train() -> str:
    x, y = blobs(BATCH * TRAIN_STEPS, seed=2)
    model = small_mlp()
    losses = []
    for i in range(TRAIN_STEPS):
        loss, _ = model.train_on_batch(x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH])
        losses.append(loss)
    first, last = float(np.mean(losses[:5])), float(np.mean(losses[-5:]))
    check(np.all(np.isfinite(losses)), f"non-finite loss: {losses}")
    check(last < 0.5 * first, f"loss did not fall: first 5 steps {first:.4f}, last 5 {last:.4f}")
    _, accuracy = model.evaluate(*blobs(500, seed=3), verbose=0)
    return f"{TRAIN_STEPS} steps, loss {first:.4f} -> {last:.4f}, held-out accuracy {accuracy:.3f}"


def mapped_libraries() -> list[str]:
    """Paths of the shared objects this process maps, in first-mapped order."""
    seen: dict[str, None] = {}
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and ".so" in os.path.basename(parts[5].strip()):
                seen.setdefault(parts[5].strip(), None)
    return list(seen)


def step_libraries() -> str:
    libs = mapped_libraries()
    openmp = [p for p in libs if any(k in os.path.basename(p) for k in ("gomp", "libomp", "libiomp"))]
    vendored = [p for p in libs if os.sep + "sparkgrad.libs" + os.sep in p]
    system = [p for p in libs if p.startswith(("/usr/lib/", "/lib/", "/usr/lib64/"))]
    # libraries other wheels carry (numpy's OpenBLAS, ...); extension modules left out
    others = [p for p in libs if p not in vendored and p not in system and ".cpython-" not in p]
    stems = {os.path.basename(p).split("-")[0] for p in vendored}
    twins = [p for p in system if os.path.basename(p).split(".so")[0] in stems]
    print("  OpenMP runtimes mapped: " + (", ".join(openmp) or "none"))
    print("  sparkgrad's vendored libraries mapped:\n" + "\n".join(f"    {p}" for p in vendored))
    print("  other wheels' libraries mapped:\n" + "\n".join(f"    {p}" for p in others))
    print("  system copies of a vendored library, mapped too: " + (", ".join(twins) or "none"))
    check(len(openmp) == 1 and "gomp" in os.path.basename(openmp[0]), f"want one libgomp mapped, have {openmp}")
    check(openmp[0] in vendored, f"libgomp {openmp[0]} is not the wheel's own")
    for name in ("libdnnl", "libcjson", "libcrypto", "libisal"):
        check(any(os.path.basename(p).startswith(name + "-") for p in vendored), f"the wheel's {name} is not mapped")
    return f"one OpenMP runtime ({os.path.basename(openmp[0])}), {len(vendored)} vendored libraries mapped"


def cluster_map_fun(args: dict, ctx) -> dict:
    """A node of the smoke cluster: the ps serves the MLP's parameters, each worker trains on its own blobs."""
    from sparkgrad import TFNode
    from sparkgrad.cluster.ps import worker_rank

    server = TFNode.start_cluster_server(ctx)
    model = small_mlp()
    if ctx.job_name == "ps":
        return {"ps": server.serve_parameters(model.num_params, mode="async", lr=0.05, init=model.params)}
    rank = worker_rank(ctx)
    x, y = blobs(BATCH * args["steps"], seed=100 + rank)
    losses = []
    with TFNode.ps_client(ctx, model.num_params, timeout=60) as ps:
        step = ps.pull(model.params)
        for i in range(args["steps"]):
            loss, _ = model.compute_gradients(x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH])
            step = ps.push_pull(model.grads, model.params)
            losses.append(loss)
        if rank == 0:  # the chief sees every worker's updates before it reports
            step = ps.wait_for_workers(model.params, timeout=60)
    return {"rank": rank, "pid": os.getpid(), "step": step, "first_loss": losses[0], "last_loss": losses[-1]}


def step_cluster() -> str:
    from sparkgrad import TFCluster

    cluster = TFCluster.run(None, cluster_map_fun, {"steps": CLUSTER_STEPS}, 3, 1, reservation_timeout=60)
    cluster.shutdown(timeout=90)
    spec, results = cluster.cluster_spec, cluster.results
    check(sorted(spec) == ["ps", "worker"] and len(spec["ps"]) == 1 and len(spec["worker"]) == 2, f"spec {spec}")
    ps = [r for r in results.values() if "ps" in r]
    workers = sorted((r for r in results.values() if "rank" in r), key=lambda r: r["rank"])
    check(len(ps) == 1 and ps[0]["ps"] == "done", f"ps result {ps}")
    check([w["rank"] for w in workers] == [0, 1], f"worker results {workers}")
    check(len({w["pid"] for w in workers} | {os.getpid()}) == 3, "the workers did not run in processes of their own")
    check(workers[0]["step"] == 2 * CLUSTER_STEPS, f"global step {workers[0]['step']}, want {2 * CLUSTER_STEPS}")
    for w in workers:
        check(w["last_loss"] < w["first_loss"], f"worker {w['rank']}: loss {w['first_loss']} -> {w['last_loss']}")
    losses = ", ".join(f"worker {w['rank']} {w['first_loss']:.3f} -> {w['last_loss']:.3f}" for w in workers)
    return f"spec {json.dumps(spec)}; global step {workers[0]['step']}; {losses}"


# ---- runner ------------------------------------------------------------------


def run_step(name: str, fn: Callable[[], str], timeout: float) -> None:
    """Runs one step under a watchdog; prints its line, or its failure and exits."""

    def expire() -> None:
        print(f"smoke: FAIL {name}: no result after {timeout:.0f} s; stacks:", flush=True)
        faulthandler.dump_traceback(all_threads=True)
        os._exit(124)

    print(f"smoke: {name} ...", flush=True)
    watchdog = threading.Timer(timeout, expire)
    watchdog.daemon = True
    watchdog.start()
    started = time.monotonic()
    try:
        summary = fn()
    except Exception as exc:  # noqa: BLE001 - any error of a step is its failure, named
        import traceback

        traceback.print_exc()
        print(f"smoke: FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
        os._exit(1)  # not sys.exit: a cluster step's node processes must not hold the exit up
    finally:
        watchdog.cancel()
    print(f"smoke: ok {name} ({time.monotonic() - started:.1f} s): {summary}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds each step may take")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sparkgrad-smoke-") as workdir:
        steps: list[tuple[str, Callable[[], str]]] = [
            ("import", step_import),
            ("info", step_info),
            ("tfrecord", lambda: step_tfrecord(workdir)),
            ("train", step_train),
            ("libraries", step_libraries),
            ("cluster", step_cluster),
        ]
        for name, fn in steps:
            run_step(name, fn, ns.timeout)
    print(f"smoke: all {len(steps)} steps passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
