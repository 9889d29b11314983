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

TensorFlow and tfrecord run in this interpreter if importable, else in the
interpreter named by --tf-python / $SPARKGRAD_TF_PYTHON (default
/work/tfvenv/bin/python), in a subprocess. Each figure is the best of
--runs passes over the whole file (wall clock).

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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

ANCHOR_SCRIPT = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
plain, gz, runs, tfrecord_limit, which = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
out = []
import numpy as np
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
            best = None
            for _ in range(runs):
                t = time.perf_counter(); n = 0
                for img, lab in make(path, comp):
                    n += int(lab.shape[0])
                dt = time.perf_counter() - t
                best = dt if best is None or dt < best else best
            out.append({"system": name, "file": label, "records": n, "seconds": best, "version": tf.__version__})
except ImportError as e:
    print("tensorflow unavailable:", e, file=sys.stderr)
try:
    if which != "tfrecord":
        raise ImportError("skipped in this process")
    from tfrecord.reader import tfrecord_loader
    for label, path, comp in (("plain", plain, None), ("gzip", gz, "gzip")):
        best = None
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
            dt = time.perf_counter() - t
            best = dt if best is None or dt < best else best
        out.append({"system": "tfrecord (PyPI)", "file": label, "records": n, "seconds": best, "version": "tfrecord"})
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
) -> tuple[int, float, float]:
    from sparkgrad.data import TFRecordDataset
    from sparkgrad.data.convert import mnist_schema

    schema = mnist_schema("image_raw")
    best = best_cpu = None
    for _ in range(runs):
        t, c = time.perf_counter(), time.process_time()
        n = 0
        for batch in TFRecordDataset(
            path, schema, 100, compression=compression, prefetch=prefetch, parse_threads=parse_threads
        ):
            n += len(batch["label"])
        dt, dc = time.perf_counter() - t, time.process_time() - c
        best = dt if best is None or dt < best else best
        best_cpu = dc if best_cpu is None or dc < best_cpu else best_cpu
    return n, best, best_cpu


def tf_python(arg: str | None) -> str | None:
    try:
        import tensorflow  # noqa: F401

        return sys.executable
    except ImportError:
        pass
    for cand in (arg, os.environ.get("SPARKGRAD_TF_PYTHON"), "/work/tfvenv/bin/python"):
        if cand and os.path.exists(cand):
            return cand
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one pass each, tfrecord (PyPI) on 10,000 records")
    ap.add_argument("--runs", type=int, default=None, help="passes per configuration (best is kept); default 3")
    ap.add_argument("--tf-python", default=None, help="interpreter with tensorflow-cpu and tfrecord")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "records.json"))
    args = ap.parse_args()
    runs = args.runs or (1 if args.quick else 3)

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

    rows = []
    for r in results:
        rps = r["records"] / r["seconds"]
        mbps = stream_bytes * (r["records"] / 60_000) / r["seconds"] / 1e6
        rows.append(
            {"system": r["system"], "metric": f"records_per_s_{r['file']}", "value": round(rps), "unit": "records/s"}
        )
        rows.append({"system": r["system"], "metric": f"MB_per_s_{r['file']}", "value": round(mbps, 1), "unit": "MB/s"})
        if "cpu" in r:  # per CPU-second: what one core does when it is not shared
            mb_cpu = stream_bytes * (r["records"] / 60_000) / r["cpu"] / 1e6
            rows.append(
                {
                    "system": r["system"],
                    "metric": f"MB_per_cpu_s_{r['file']}",
                    "value": round(mb_cpu, 1),
                    "unit": "MB/cpu-s",
                }
            )
    by = {(r["system"], r["metric"]): r["value"] for r in rows}
    for file in ("plain", "gzip"):
        ours = by.get(("sparkgrad (1 core)", f"records_per_s_{file}"))
        for r in results:
            if r["file"] == file and not r["system"].startswith("sparkgrad") and ours:
                rows.append(
                    {
                        "system": "sparkgrad (1 core)",
                        "metric": f"speedup_vs_{r['system']}_{file}",
                        "value": round(ours / by[(r["system"], f"records_per_s_{file}")], 1),
                        "unit": "x",
                    }
                )
    # The best sparkgrad configuration against the best of each anchor.
    for file in ("plain", "gzip"):
        metric = f"records_per_s_{file}"
        ours = max((v for (sys_, m), v in by.items() if m == metric and sys_.startswith("sparkgrad")), default=0)
        tf_best = max((v for (sys_, m), v in by.items() if m == metric and sys_.startswith("tf.data")), default=0)
        if ours and tf_best:
            rows.append(
                {
                    "system": "sparkgrad (best config)",
                    "metric": f"speedup_vs_tf.data best_{file}",
                    "value": round(ours / tf_best, 1),
                    "unit": "x",
                }
            )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{'system':<26} {'metric':<48} {'value':>12} unit")
    for r in rows:
        print(f"{r['system']:<26} {r['metric']:<48} {r['value']:>12} {r['unit']}")
    print(f"(plain file {sizes['plain'] / 1e6:.1f} MB, gzip file {sizes['gzip'] / 1e6:.1f} MB, best of {runs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
