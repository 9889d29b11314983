"""Bucketed overlap: does reducing gradients during backward (bucket_bytes > 0) pay?

On 2 ranks over loopback (``sparkgrad.run(num_proc=2, local=True)``: two
processes of this machine, each with cores / 2 compute threads and its own
communicator from hvd.init()), each rank fits its shard of Fashion-MNIST
with ``DistributedOptimizer(..., bucket_bytes=B)``: B = 0 reduces the whole
gradient after backward; B > 0 starts a background reduction of each bucket
of B bytes as the C backward reports its layers ready. Two models:

- the walkthrough MLP (784-128-64-10, 436 KB of float32 gradient; SGD 0.07,
  batch 100 per rank);
- the HorovodRunner seed CNN (about 4.8 MB; Adadelta 0.2, batch 128 per rank).

For each B (and "compute only": the same fit with no allreduce at all, both
ranks at once, the floor that overlap could reach) a fresh model of the same
seed fits ``--steps`` steps; steps/s is steps over first step -> last step
(fit's on_train_begin / on_train_end on rank 0; plan and data are built
before). The settings are taken round-robin ``--repeat`` times, the figures
are medians with their min and max, and each bucket size is also given as
its speed relative to B = 0.

    python bench/bench_overlap.py [--quick] [--models mlp,cnn] [--repeat N]

``--quick``: fewer steps, 1 run (about a minute). Writes bench/results/overlap.json.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import benchlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
NP = 2
MODELS = {
    # name: (batch, bucket sizes in bytes; 0 = after backward, None = compute only)
    "mlp": (100, [None, 0, 64 << 10, 128 << 10, 256 << 10]),
    "cnn": (128, [None, 0, 256 << 10, 1 << 20, 2 << 20, 4 << 20]),
}
LABELS = {"mlp": "walkthrough MLP (436 KB gradient)", "cnn": "seed CNN (4.8 MB gradient)"}


def rank_main(plan: list[tuple[str, int | None]], steps: dict[str, int], threads: int) -> list[dict]:
    """Every rank: the settings of ``plan`` in order, one fresh model each; rank 0's timings."""
    import time

    import numpy as np
    import sparkgrad.hvd as hvd
    from sparkgrad.data.idx import fashion_mnist
    from sparkgrad.nn import SGD, Adadelta, DistributedOptimizer, set_num_threads
    from sparkgrad.nn.models import horovod_cnn, walkthrough_mlp

    hvd.init()
    set_num_threads(threads)
    rank, size = hvd.rank(), hvd.size()
    comm = hvd.communicator()
    x, y = fashion_mnist("train")
    x = x[rank::size].astype(np.float32) / 255
    y = y[rank::size]
    data = {
        "mlp": (x.reshape(-1, 784), y.astype(np.int64)),
        "cnn": (x.reshape(-1, 28, 28, 1), np.eye(10, dtype=np.float32)[y]),
    }

    class Stamps:
        first = last = None

        def on_train_begin(self, logs):
            self.first = time.time()

        def on_train_end(self, logs):
            self.last = time.time()

    out = []
    warmup = [(m, 0) for m in dict.fromkeys(m for m, _ in plan)]  # first fits of a process: not recorded
    for i, (model_name, bucket) in enumerate(warmup + plan):
        batch = MODELS[model_name][0]
        if model_name == "mlp":
            model, opt, loss = walkthrough_mlp(seed=1), SGD(0.07), "sparse_categorical_crossentropy"
        else:
            model, opt, loss = horovod_cnn(seed=1), Adadelta(0.1 * size), "categorical_crossentropy"
        if bucket is not None:
            opt = DistributedOptimizer(opt, bucket_bytes=bucket)
        model.compile(optimizer=opt, loss=loss)
        n = (steps[model_name] if i >= len(warmup) else 3) * batch
        xs, ys = data[model_name]
        stamps = Stamps()
        comm.barrier()  # both ranks start together
        model.fit(xs[:n], ys[:n], batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[stamps])
        if i >= len(warmup):
            took = stamps.last - stamps.first
            out.append({"model": model_name, "bucket": bucket, "steps": int(model.step), "s": took})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="MLP 150 steps, CNN 8 steps, 1 run")
    ap.add_argument("--models", default="mlp,cnn", help="comma-separated subset of mlp,cnn")
    ap.add_argument("--repeat", type=int, default=None, help="round-robin runs of every setting (default 5, quick 1)")
    ap.add_argument("--mlp-steps", type=int, default=None, help="default 600 (quick 150)")
    ap.add_argument("--cnn-steps", type=int, default=None, help="default 60 (quick 8)")
    benchlib.add_update_flag(ap)
    args = ap.parse_args()
    meta = benchlib.metadata("overlap")
    sys.path.insert(0, str(ROOT / "python"))
    import sparkgrad

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if any(m not in MODELS for m in models):
        ap.error(f"unknown model in {models}; choose from {tuple(MODELS)}")
    repeat = args.repeat or (1 if args.quick else 5)
    steps = {
        "mlp": args.mlp_steps or (150 if args.quick else 600),
        "cnn": args.cnn_steps or (8 if args.quick else 60),
    }
    threads = max(1, (os.cpu_count() or 2) // NP)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    plan = [(m, b) for _ in range(repeat) for m in models for b in MODELS[m][1]]
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    print(f"{len(plan)} fits on {NP} local ranks ({threads} thread(s) each)...", flush=True)
    timings = sparkgrad.run(rank_main, args=(plan, steps, threads), num_proc=NP, local=True)[0]

    rows: list[dict] = []

    def row(system, metric, value, unit, **extra):
        rows.append({"system": system, "metric": metric, "value": value, "unit": unit, **extra})

    row("machine", "load_average_1min_at_start", round(load_before, 2), f"runnable tasks ({os.cpu_count()} cores)")
    row("machine", "ranks", NP, f"local processes, {threads} compute thread(s) each, loopback")
    row("machine", "runs_per_setting", repeat, "runs (figures are medians; min and max beside them)")
    print()
    print(f"{'model':<36}{'setting':<24}{'steps/s':>10}{'min':>9}{'max':>9}{'vs B=0':>9}")
    for m in models:
        row(LABELS[m], "steps_per_run", steps[m], f"steps of batch {MODELS[m][0]} per rank")
        rates = {}
        for b in MODELS[m][1]:
            got = [t["steps"] / t["s"] for t in timings if t["model"] == m and t["bucket"] == b]
            sm = benchlib.summarise(got)
            rates[b] = (sm["median"], sm["min"], sm["max"])
        base = rates[0][0]
        for b in MODELS[m][1]:
            med, lo, hi = rates[b]
            name = "compute only (no allreduce)" if b is None else ("bucket_bytes=0" if b == 0 else f"bucket_bytes={b}")
            spread = {"min": round(lo, 2), "max": round(hi, 2), "runs": repeat} if repeat > 1 else {}
            metric = "steps_per_s_" + ("compute_only" if b is None else f"bucket_{b}")
            row(LABELS[m], metric, round(med, 2), f"steps/s ({name})", **spread)
            if b:
                row(LABELS[m], f"speed_vs_bucket_0_bucket_{b}", round(med / base, 3), "x (steps/s / bucket_bytes=0's)")
            print(f"{LABELS[m]:<36}{name:<24}{med:>10.2f}{lo:>9.2f}{hi:>9.2f}{med / base:>9.3f}")
    results = benchlib.results_file("overlap.json", args.update)
    benchlib.write_results(results, rows, meta)
    print(f"\n{time.monotonic() - started:.0f} s; load average (1 min) at start {load_before:.2f}, "
          f"at end {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"wrote {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
