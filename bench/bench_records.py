"""TFRecord read + CRC + parse + decode throughput: sparkgrad vs tf.data vs PyPI tfrecord.

Data: Fashion-MNIST train (60,000 Examples, TF's convert_to_records layout:
image_raw bytes + label + height/width/depth, about 53 MB), written by
`sparkgrad convert mnist`, plus a GZIP copy. Every system produces the same
thing: float32 image batches [100, 784] scaled by 1/255 and int64 labels.

  sparkgrad            TFRecordDataset(prefetch=0): one thread, pinned to one core
  sparkgrad+prefetch   TFRecordDataset(prefetch=2): parsing on the C thread
  sparkgrad+2 parse threads   prefetch=2, parse_threads=2: a C thread and the
                       caller each read, check and parse whole batches,
                       delivered in order (both cores, as TF's AUTOTUNE)
  tf.data map->batch   TFRecordDataset -> map(parse_single_example, AUTOTUNE) -> batch(100)
  tf.data batch->map   TFRecordDataset -> batch(100) -> map(parse_example, AUTOTUNE)
  tfrecord (PyPI)      tfrecord.reader.tfrecord_loader + NumPy batching

TensorFlow and tfrecord run in subprocesses of this interpreter if it has them
(`make bench` installs the anchors extra into it), else of the interpreter
named by --tf-python / $SPARKGRAD_TF_PYTHON. TensorFlow's pipelines are built
once, outside the timer. Each figure is the median of --runs passes over the
whole file (wall clock), with min and max. tfrecord (PyPI) does not verify
the records' CRCs (sparkgrad and tf.data do).

    python bench/bench_records.py [--quick] [--runs N] [--tf-python PY]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import benchlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

ANCHOR_SCRIPT = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
plain, gz, runs, tfrecord_limit, which = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
out = []
import numpy as np
TFRECORD = "tfrecord (PyPI, skips CRC checks)"
# tensorflow and tfrecord both register tensorflow.Example protos: one per process.
try:
    if which != "tf":
        raise ImportError("skipped in this process")
    import tensorflow as tf
    feats = {"image_raw": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    def decode(ex):
        img = tf.cast(tf.io.decode_raw(ex["image_raw"], tf.uint8), tf.float32) * (1.0 / 255)
        return img, ex["label"]
    def single(rec):
        return decode(tf.io.parse_single_example(rec, feats))
    def batched(recs):
        ex = tf.io.parse_example(recs, feats)
        img = tf.cast(tf.io.decode_raw(ex["image_raw"], tf.uint8), tf.float32) * (1.0 / 255)
        return img, ex["label"]
    A = tf.data.AUTOTUNE
    def map_batch(p, c):
        ds = tf.data.TFRecordDataset(p, compression_type=c)
        return ds.map(single, num_parallel_calls=A).batch(100).prefetch(A)
    def batch_map(p, c):
        ds = tf.data.TFRecordDataset(p, compression_type=c)
        return ds.batch(100).map(batched, num_parallel_calls=A).prefetch(A)
    pipelines = {"tf.data map->batch": map_batch, "tf.data batch->map": batch_map}
    for name, make in pipelines.items():
        for label, path, comp in (("plain", plain, ""), ("gzip", gz, "GZIP")):
            ds = make(path, comp)  # built (and its map functions traced) once, outside the timer
            times = []
            for _ in range(runs):
                t = time.perf_counter(); n = 0
                for img, lab in ds:
                    n += int(lab.shape[0])
                times.append(time.perf_counter() - t)
            out.append({"system": name, "file": label, "records": n, "seconds": times, "version": tf.__version__})
except ImportError as e:
    print("tensorflow unavailable:", e, file=sys.stderr)
try:
    if which != "tfrecord":
        raise ImportError("skipped in this process")
    from tfrecord.reader import tfrecord_loader
    for label, path, comp in (("plain", plain, None), ("gzip", gz, "gzip")):
        times = []
        for _ in range(runs):
            t = time.perf_counter(); n = 0; imgs = []; labs = []
            for ex in tfrecord_loader(path, None, {"image_raw": "byte", "label": "int"}, compression_type=comp):
                raw = ex["image_raw"]
                if isinstance(raw, (bytes, np.bytes_)):
                    raw = np.frombuffer(raw, dtype=np.uint8)
                imgs.append(raw); labs.append(ex["label"][0]); n += 1
                if len(imgs) == 100:
                    x = np.stack(imgs).astype(np.float32) * np.float32(1 / 255); y = np.array(labs)
                    imgs, labs = [], []
                if n >= tfrecord_limit:
                    break
            times.append(time.perf_counter() - t)
        out.append({"system": TFRECORD, "file": label, "records": n, "seconds": times, "version": "tfrecord"})
except ImportError as e:
    print("tfrecord unavailable:", e, file=sys.stderr)
print("RESULTS " + json.dumps(out))
"""


def prepare(workdir: str) -> tuple[str, str]:
    from sparkgrad.data.convert import convert_mnist
    from sparkgrad.data.idx import FASHION_MNIST_DIR

    images = os.path.join(FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz")
    labels = os.path.join(FASHION_MNIST_DIR, "train-labels-idx1-ubyte.gz")
    (plain,) = convert_mnist(images, labels, workdir, "image_raw", 1, False, "train")
    (gz,) = convert_mnist(images, labels, workdir, "image_raw", 1, True, "train")
    return plain, gz


def run_sparkgrad(
    path: str, compression: str | None, prefetch: int, runs: int, parse_threads: int = 1
) -> tuple[int, list[float], list[float]]:
    """(records, wall seconds of each pass, CPU seconds of each pass)."""
    from sparkgrad.data import TFRecordDataset
    from sparkgrad.data.convert import mnist_schema

    schema = mnist_schema("image_raw")
    walls, cpus = [], []
    for _ in range(runs):
        t, c = time.perf_counter(), time.process_time()
        n = 0
        for batch in TFRecordDataset(
            path, schema, 100, compression=compression, prefetch=prefetch, parse_threads=parse_threads
        ):
            n += len(batch["label"])
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return n, walls, cpus


def tf_python(arg: str | None) -> str | None:
    """This interpreter if it has TensorFlow (`make bench` installs the anchors extra into it),
    else --tf-python or $SPARKGRAD_TF_PYTHON."""
    try:
        import tensorflow  # noqa: F401

        return sys.executable
    except ImportError:
        pass
    for cand in (arg, os.environ.get("SPARKGRAD_TF_PYTHON")):
        if cand and os.path.exists(cand):
            return cand
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one pass each, tfrecord (PyPI) on 10,000 records")
    ap.add_argument("--runs", type=int, default=None, help="passes per configuration (the median is kept); default 3")
    ap.add_argument("--tf-python", default=None, help="interpreter with tensorflow-cpu and tfrecord")
    ap.add_argument("--out", default=None, help="the results file (default: see --update)")
    benchlib.add_update_flag(ap)
    args = ap.parse_args()
    runs = args.runs or (1 if args.quick else 3)
    meta = benchlib.metadata("records")
    meta["notes"] = [
        f"every figure is the median of {runs} passes over the whole file (wall clock), with min and max",
        "TensorFlow's pipelines are built (and their map functions traced) once, outside the timer",
        "tfrecord (PyPI) reads without verifying the records' CRCs (its reader skips them); sparkgrad and "
        "tf.data check every length and data CRC",
        "MB/s counts the uncompressed stream for both files",
    ]

    with tempfile.TemporaryDirectory(prefix="sparkgrad-bench-records-") as work:
        plain, gz = prepare(work)
        sizes = {"plain": os.path.getsize(plain), "gzip": os.path.getsize(gz)}
        # MB/s is counted on the uncompressed stream for both files.
        stream_bytes = sizes["plain"]
        results = []
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(allowed)})  # sparkgrad on one core
        try:
            for label, path, comp in (("plain", plain, None), ("gzip", gz, "GZIP")):
                n, dt, cpu = run_sparkgrad(path, comp, 0, runs)
                results.append({"system": "sparkgrad (1 core)", "file": label, "records": n, "seconds": dt, "cpu": cpu})
            # GZIP through each inflate backend (the row above used the default one).
            from sparkgrad import _core

            saved = os.environ.get("SPARKGRAD_INFLATE")
            for backend in ("isal", "zlib") if _core.build_info()["isal"] else ("zlib",):
                os.environ["SPARKGRAD_INFLATE"] = backend
                try:
                    n, dt, cpu = run_sparkgrad(gz, "GZIP", 0, runs)
                finally:
                    os.environ.pop("SPARKGRAD_INFLATE")
                    if saved is not None:
                        os.environ["SPARKGRAD_INFLATE"] = saved
                system = f"sparkgrad (1 core, {backend} inflate)"
                results.append({"system": system, "file": "gzip", "records": n, "seconds": dt, "cpu": cpu})
        finally:
            os.sched_setaffinity(0, allowed)
        for label, path, comp in (("plain", plain, None), ("gzip", gz, "GZIP")):
            n, dt, _ = run_sparkgrad(path, comp, 2, runs)
            results.append({"system": "sparkgrad+prefetch", "file": label, "records": n, "seconds": dt})
            n, dt, _ = run_sparkgrad(path, comp, 2, runs, parse_threads=2)
            results.append({"system": "sparkgrad+2 parse threads", "file": label, "records": n, "seconds": dt})

        py = tf_python(args.tf_python)
        if py is None:
            print("bench_records: no TensorFlow interpreter found; anchors skipped", file=sys.stderr)
        else:
            limit = 10_000 if args.quick else 60_000
            for which in ("tf", "tfrecord"):
                proc = subprocess.run(
                    [py, "-c", ANCHOR_SCRIPT, plain, gz, str(runs), str(limit), which],
                    capture_output=True,
                    text=True,
                    timeout=3600,
                    env={**os.environ, "PYTHONPATH": "", "TF_CPP_MIN_LOG_LEVEL": "2"},
                )
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")]
                if proc.returncode != 0 or not lines:
                    print(proc.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"bench_records: the {which} subprocess failed")
                results += json.loads(lines[-1][len("RESULTS ") :])

    rows: list[dict] = []
    medians: dict[tuple[str, str], float] = {}  # (system, file) -> records/s of the median pass
    for r in results:
        scale = r["records"] / 60_000  # tfrecord (PyPI) --quick reads a prefix
        rates = [r["records"] / t for t in r["seconds"]]
        rows.append(benchlib.median_row(r["system"], f"records_per_s_{r['file']}", rates, "records/s", digits=0))
        mbs = [stream_bytes * scale / t / 1e6 for t in r["seconds"]]
        rows.append(benchlib.median_row(r["system"], f"MB_per_s_{r['file']}", mbs, "MB/s"))
        medians[(r["system"], r["file"])] = benchlib.summarise(rates)["median"]
        if "cpu" in r:  # per CPU-second: what one core does when it is not shared
            per_cpu = [stream_bytes * scale / c / 1e6 for c in r["cpu"]]
            rows.append(benchlib.median_row(r["system"], f"MB_per_cpu_s_{r['file']}", per_cpu, "MB/cpu-s"))
    for file in ("plain", "gzip"):
        # each side at its best configuration, by the median pass
        for label, prefix in (("sparkgrad (best config)", "sparkgrad"), ("tf.data best", "tf.data")):
            cands = [(v, s_) for (s_, f), v in medians.items() if f == file and s_.startswith(prefix)]
            if not cands:
                continue
            _, system = max(cands)
            src = next(r for r in rows if r["system"] == system and r["metric"] == f"MB_per_s_{file}")
            rows.append({**src, "system": label, "config": system})
        ours = medians.get(("sparkgrad (1 core)", file))
        for (system, f), theirs in list(medians.items()):
            if f == file and not system.startswith("sparkgrad") and ours:
                rows.append(benchlib.row("sparkgrad (1 core)", f"speedup_vs_{system}_{file}", round(ours / theirs, 1),
                                         "x (medians)"))  # fmt: skip
        best_ours = max((v for (s_, f), v in medians.items() if f == file and s_.startswith("sparkgrad")), default=0)
        best_tf = max((v for (s_, f), v in medians.items() if f == file and s_.startswith("tf.data")), default=0)
        if best_ours and best_tf:
            rows.append(benchlib.row("sparkgrad (best config)", f"speedup_vs_tf.data best_{file}",
                                     round(best_ours / best_tf, 1), "x (medians)"))  # fmt: skip
    if py is None:
        for system in ("tf.data map->batch", "tf.data batch->map", "tfrecord (PyPI, skips CRC checks)"):
            rows.append(benchlib.not_measured(system, "MB_per_s_plain", "no interpreter with tensorflow and tfrecord"))
    benchlib.write_results(args.out or benchlib.results_file("records.json", args.update), rows, meta)
    print(f"{'system':<26} {'metric':<48} {'value':>12} unit")
    for r in rows:
        print(f"{r['system']:<26} {r['metric']:<48} {r['value']!s:>12} {r['unit']}")
    print(f"(plain file {sizes['plain'] / 1e6:.1f} MB, gzip file {sizes['gzip'] / 1e6:.1f} MB, median of {runs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
