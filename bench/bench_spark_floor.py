"""Spark's own floor under bench_cluster.py: an empty barrier job on the same local Spark.

What any system that starts its nodes as Spark tasks pays before its code
runs: one barrier job of n tasks whose function only notes when it starts,
timed from the job's submission to the last task's start, on a fresh
SparkSession ``local[n]`` in each of bench_cluster.py's two contexts (warm:
after the same warm-up job; cold: the context's first Python job). n = 2 is
the stage of sparkgrad with its ps in the driver and of TensorFlowOnSpark's
two nodes; n = 3 that of sparkgrad with its ps as a task. Compare with
bench_cluster.py's ``map_fun_start_s`` rows (run() -> every map_fun called).

    python bench/bench_spark_floor.py [--quick] [--repeat N]

Each run is a child process in its own process group with a timeout; the
figures are medians. Writes bench/results/spark_floor.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

import benchlib

BENCH = pathlib.Path(__file__).resolve().parent
TASKS = (2, 3)
sys.path.insert(0, str(BENCH))
from bench_cluster import CONTEXTS, run_child  # noqa: E402 - the same child runner and contexts


def child(tasks: int, cold: bool, out: str) -> int:
    import anchor_driver

    spark, _ = anchor_driver.start_spark("bench_spark_floor", tasks, cold)  # warm: bench_cluster.py's warm-up job
    sc = spark.sparkContext

    def started(_rows):
        import time

        yield time.time()

    try:
        t0 = time.time()
        starts = sc.parallelize(range(tasks), tasks).barrier().mapPartitions(started).collect()
        t_end = time.time()
    finally:
        spark.stop()
    result = {"last_task_start_s": max(starts) - t0, "job_s": t_end - t0}
    pathlib.Path(out).write_text(json.dumps(result))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 runs per case instead of 8 (a run of 1-2 minutes)")
    ap.add_argument("--repeat", type=int, default=None, help="runs per task count and context (default 8, quick 2)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per run")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    benchlib.add_update_flag(ap)
    args = ap.parse_args()
    meta = benchlib.metadata("spark_floor")
    if args.child:
        return child(args.child, args.cold, args.out)

    repeat = args.repeat or (2 if args.quick else 8)
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-spark-floor-"))
    load_before = os.getloadavg()[0]
    rows = [
        {"system": "machine", "metric": "load_average_1min_at_start", "value": round(load_before, 2),
         "unit": "runnable tasks (2 cores)"},
        {"system": "machine", "metric": "runs_per_case", "value": repeat, "unit": "runs (figures are medians)"},
    ]  # fmt: skip
    runs: dict[tuple[int, str], list[dict]] = {}
    failed: dict[tuple[int, str], str] = {}
    for rep in range(repeat):  # round-robin, so a change of load falls on every case alike
        for context in CONTEXTS:
            for tasks in TASKS:
                key = (tasks, context)
                log = work / f"{tasks}-{context}-{rep}.log"
                cmd = [sys.executable, __file__, "--child", str(tasks), *(["--cold"] if context == "cold" else [])]
                res, why = run_child(f"spark-{tasks}", cmd, dict(os.environ), args.timeout, log)
                if res is None:
                    failed[key] = why
                    print(f"local[{tasks}], {context}: not measured: {why}", flush=True)
                    continue
                runs.setdefault(key, []).append(res)
                start = res["last_task_start_s"]
                print(f"local[{tasks}], {context}: last task started after {start:.3f} s", flush=True)
    for context in CONTEXTS:
        sfx = "" if context == "warm" else "_cold_context"
        for tasks in TASKS:
            system = f"Spark local[{tasks}], empty barrier job of {tasks} tasks"
            done = runs.get((tasks, context), [])
            if len(done) < repeat:
                why = failed.get((tasks, context), "not run")
                rows.append(benchlib.not_measured(system, f"last_task_start_s{sfx}", why))
                continue
            sm = benchlib.summarise(r["last_task_start_s"] for r in done)
            for metric, value in (
                ("last_task_start_s", sm["median"]),
                ("last_task_start_min_s", sm["min"]),
                ("last_task_start_max_s", sm["max"]),
            ):
                rows.append(
                    {
                        "system": system,
                        "metric": metric + sfx,
                        "value": round(value, 3),
                        "unit": "s (job submitted -> its last task's Python function starts)",
                    }
                )
            print(f"{context}: local[{tasks}] median {sm['median']:.3f} s "
                  f"({sm['min']:.3f}-{sm['max']:.3f} s over {sm['runs']} fresh contexts)")  # fmt: skip
    results = benchlib.results_file("spark_floor.json", args.update)
    benchlib.write_results(results, rows, meta)
    print(f"load average (1 min) at start {load_before:.2f}, at end {os.getloadavg()[0]:.2f}; logs in {work}")
    print(f"wrote {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
