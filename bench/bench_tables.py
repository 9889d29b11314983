"""Parquet table feeding: rows/s of sparkgrad's ParquetDataset against pyarrow alone (the file floor).

Data: 60,000 synthetic Fashion-MNIST-shaped rows (784 pixels in 0..255 and
an int64 label) in two Parquet files written by pyarrow (snappy, row groups
of 10,000 rows): pixels as list<float> and as 784-byte binary values.

  pyarrow -> NumPy (file floor)   ParquetFile.read_row_group(columns) and
                                  the column's buffers as [rows, 784] NumPy
                                  arrays (no copy where Arrow allows): reading
                                  and decoding the file, nothing else
  sparkgrad ParquetDataset        batches of 100 {pixels float32 [100, 784],
                                  label int64 [100]}: the same reads, then
                                  validation, conversion and batching in C;
                                  one dataset, each pass its next epoch (as
                                  model.fit reads it), after one warm-up epoch
  ... shuffle_buffer=10000        the same, rows drawn from a 10,000-row
                                  shuffle buffer, row groups shuffled

Everything runs in this one process, pinned to one core (pyarrow's own
threads included). Each figure is the median of --runs passes over the file.

    python bench/bench_tables.py [--quick] [--runs N] [--update]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import benchlib
import numpy as np

ROWS, WIDTH, GROUP = 60_000, 784, 10_000


def prepare(work: str) -> dict[str, str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (ROWS, WIDTH), dtype=np.uint8)
    label = pa.array(rng.integers(0, 10, ROWS), pa.int64())
    floats = pa.FixedSizeListArray.from_arrays(pa.array(pixels.reshape(-1).astype(np.float32)), WIDTH)
    lists = pa.ListArray.from_arrays(pa.array(np.arange(0, ROWS * WIDTH + 1, WIDTH, dtype=np.int32)), floats.values)
    binary = pa.array([row.tobytes() for row in pixels], pa.binary())
    paths = {"list<float>": os.path.join(work, "floats.parquet"), "binary": os.path.join(work, "bytes.parquet")}
    pq.write_table(pa.table({"pixels": lists, "label": label}), paths["list<float>"], row_group_size=GROUP)
    pq.write_table(pa.table({"pixels": binary, "label": label}), paths["binary"], row_group_size=GROUP)
    return paths


def floor_pass(path: str) -> int:
    """pyarrow alone: each row group's columns as NumPy arrays [rows, 784] and [rows]."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf, rows = pq.ParquetFile(path), 0
    for g in range(pf.num_row_groups):
        t = pf.read_row_group(g, columns=["pixels", "label"])
        col = t.column("pixels").combine_chunks()
        if pa.types.is_list(col.type):
            x = col.flatten().to_numpy().reshape(-1, WIDTH)
        else:
            offsets = np.frombuffer(col.buffers()[1], np.int32)[col.offset : col.offset + len(col) + 1]
            x = np.frombuffer(col.buffers()[2], np.uint8)[offsets[0] : offsets[-1]].reshape(-1, WIDTH)
        y = t.column("label").to_numpy()
        rows += x.shape[0] if x.shape[0] == y.shape[0] else 0
    return rows


def sparkgrad_epochs(path: str, shuffle: int, kind: str):
    """One dataset, as fit holds it: each call reads its next epoch."""
    from sparkgrad.data import Column, ParquetDataset

    width = WIDTH if kind == "list<float>" else None
    ds = ParquetDataset(path, {"pixels": Column("pixels", width=width)}, 100, label="label", shuffle_buffer=shuffle)
    return lambda: sum(b["pixels"].shape[0] for b in ds)


def timed(fn, runs: int) -> tuple[int, list[float]]:
    rows, seconds = 0, []
    for _ in range(runs):
        t0 = time.perf_counter()
        rows = fn()
        seconds.append(time.perf_counter() - t0)
    return rows, seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one pass each")
    ap.add_argument("--runs", type=int, default=None, help="passes per configuration (the median is kept); default 3")
    ap.add_argument("--out", default=None, help="the results file (default: see --update)")
    benchlib.add_update_flag(ap)
    args = ap.parse_args()
    runs = args.runs or (1 if args.quick else 3)
    meta = benchlib.metadata("tables", packages=benchlib.PACKAGES + ("pyarrow",))
    meta["notes"] = [
        f"every figure is the median of {runs} passes over {ROWS:,} rows (wall clock), with min and max",
        "one process pinned to one core; synthetic Fashion-MNIST-shaped rows, row groups of 10,000",
    ]
    rows_out: list[dict] = []
    allowed = os.sched_getaffinity(0)
    with tempfile.TemporaryDirectory(prefix="sparkgrad-bench-tables-") as work:
        paths = prepare(work)
        os.sched_setaffinity(0, {min(allowed)})
        try:
            for kind, path in paths.items():
                systems = {
                    "pyarrow -> NumPy (file floor)": lambda p=path: floor_pass(p),
                    "sparkgrad ParquetDataset": sparkgrad_epochs(path, 0, kind),
                    "sparkgrad ParquetDataset, shuffle_buffer=10000": sparkgrad_epochs(path, 10_000, kind),
                }
                medians = {}
                for system, fn in systems.items():
                    fn()  # warm: page cache, imports, the dataset's buffer pool
                    n, seconds = timed(fn, runs)
                    if n != ROWS:
                        raise SystemExit(f"bench_tables: {system} read {n} rows of {ROWS}")
                    rates = [n / s for s in seconds]
                    rows_out.append(benchlib.median_row(system, f"rows_per_s_{kind}", rates, "rows/s", digits=0))
                    medians[system] = benchlib.summarise(rates)["median"]
                floor = medians["pyarrow -> NumPy (file floor)"]
                for system, rate in medians.items():
                    if system.startswith("sparkgrad"):
                        rows_out.append(benchlib.row(system, f"fraction_of_floor_{kind}", round(rate / floor, 2), "x"))
        finally:
            os.sched_setaffinity(0, allowed)
    benchlib.write_results(args.out or benchlib.results_file("tables.json", args.update), rows_out, meta)
    benchlib.print_rows(rows_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
