"""PyTorch on sparkgrad: sparkgrad.hvd.torch and sparkgrad.torch.Distributor against TorchDistributor and gloo.

    python bench/bench_torch.py [--quick] [--parts e2e,allreduce] [--update]

Two parts, each system in its own driver process per run (a fresh interpreter: nothing warm but the OS):

  e2e        The same PyTorch models trained with 2 ranks of one thread each on this machine:
               cnn    the HorovodRunner example's network (Conv 1->10 k5, max-pool, ReLU, Conv 10->20 k5,
                      dropout, max-pool, ReLU, Linear 320->50, ReLU, dropout, Linear 50->10), SGD 0.01
                      momentum 0.5, batch 64 per rank, 2 epochs of Fashion-MNIST (--quick: 150 steps);
               mlp10m Linear 784->2048->2048->2048->10 with ReLUs (10.6M parameters), SGD 0.01, batch 64
                      per rank, 200 steps (--quick: 30) on Fashion-MNIST rows.
             Systems: PySpark's TorchDistributor(local_mode=True) running DDP over gloo (the anchor);
             sparkgrad.torch.Distributor(local_mode=True) running the very same function; sparkgrad.run with
             sparkgrad.hvd.torch's DistributedOptimizer (broadcast_parameters, gradients reduced on the C ring).
             Each driver calls run() twice, as a notebook's cells do: the first run() is cold (a fresh
             interpreter), the second finds what the first left (sparkgrad's ranks fork from a server that
             imported torch: Distributor's default, sparkgrad.run's preload=("torch",); TorchDistributor
             starts torchrun and its workers afresh each time: measured, not assumed).
             Rows: group formed (run() called until init_process_group or hvd.init returned on every
             rank: the launcher's share), formation (run() called until every rank begins its first step:
             init_process_group or hvd.init, the model's broadcast and the rank's np.load of its Fashion-MNIST
             shard included; the shards are decoded and written as float32 .npy files by the driver before
             the timer starts, as pipelines built outside the timer) of the first and of the second run(),
             seconds per
             step (rank 0's median after 5 warm steps, first run), end to end (run() called until it
             returned) of both runs, each the median over drivers with min and max, and the ratios
             (TorchDistributor / sparkgrad) from the same drivers. Goals (issue 33): end to end at least 1.3x
             TorchDistributor, formation at least 10x.
  allreduce  One allreduce of a float32 tensor of 1, 4, 16 and 64 MB at 2 and 3 ranks, as Spark barrier
             tasks on local Spark: sparkgrad.hvd.torch.allreduce_ (the C ring, in place on the tensor's
             storage) against torch.distributed.all_reduce over gloo (ranks started by sparkgrad.torch.
             Distributor(local_mode=False)), the same tensors; seconds per allreduce on rank 0 (median of
             the timed calls after 3 warm-up ones, each call started after a barrier). Goal: at least 1.5x
             gloo from 4 MB up.

Writes build/bench-results/torch.json (bench/results/ with --update).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import benchlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
RANKS = 2
WARM_STEPS = 5
SIZES_MB = (1, 4, 16, 64)
SYSTEMS = {
    "torchdistributor": "TorchDistributor (DDP, gloo)",
    "distributor": "sparkgrad.torch.Distributor (DDP, gloo)",
    "hvd": "sparkgrad.hvd.torch (DistributedOptimizer)",
}


# ---- what each rank runs ---------------------------------------------------------------------------


def build_model(name: str):
    import torch
    from torch import nn

    if name == "cnn":

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
                self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
                self.drop2d = nn.Dropout2d()
                self.fc1 = nn.Linear(320, 50)
                self.fc2 = nn.Linear(50, 10)

            def forward(self, x):
                x = torch.relu(torch.max_pool2d(self.conv1(x), 2))
                x = torch.relu(torch.max_pool2d(self.drop2d(self.conv2(x)), 2))
                x = torch.relu(self.fc1(x.flatten(1)))
                return self.fc2(torch.dropout(x, 0.5, self.training))

        return Net(), (1, 28, 28), 0.01, 0.5
    widths = (784, 2048, 2048, 2048, 10)
    layers: list = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1]), (784,), 0.01, 0.0


def prepare_shards(data_dir: str) -> None:
    """Each rank's Fashion-MNIST shard as float32 pixels in [0, 1] (rows rank::RANKS) and int64 labels,
    written as .npy files by the driver before any timer starts: the pipeline is built outside the timer,
    and a rank's loading is one np.load, the same for every system."""
    import numpy as np
    from sparkgrad.data.idx import fashion_mnist

    x, y = fashion_mnist("train")
    for r in range(RANKS):
        np.save(os.path.join(data_dir, f"x-{r}.npy"), x[r::RANKS].reshape(-1, 784).astype(np.float32) / 255.0)
        np.save(os.path.join(data_dir, f"y-{r}.npy"), y[r::RANKS].astype(np.int64))


def train_rank(model_name: str, steps: int, batch: int, mode: str, out_dir: str, data_dir: str) -> dict:
    """One rank's training; ``mode`` "ddp" (torch.distributed from the environment) or "hvd"
    (sparkgrad.hvd.torch). Reads its shard from prepare_shards' files in ``data_dir``; writes
    <out_dir>/rank-<r>.json with its wall-clock marks."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(7)
    model, shape, lr, momentum = build_model(model_name)
    if mode == "ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        formed = time.time()
        rank, world = dist.get_rank(), dist.get_world_size()
        net = DistributedDataParallel(model)
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    else:
        import sparkgrad.hvd.torch as hvd

        hvd.init()
        formed = time.time()
        rank, world = hvd.rank(), hvd.size()
        net = model
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
        hvd.broadcast_parameters(net.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters())
    if world != RANKS:
        raise RuntimeError(f"the shards in {data_dir} are for {RANKS} ranks, this job has {world}")
    xs = torch.from_numpy(np.load(os.path.join(data_dir, f"x-{rank}.npy")).reshape(-1, *shape))
    ys = torch.from_numpy(np.load(os.path.join(data_dir, f"y-{rank}.npy")))
    loss_fn = torch.nn.CrossEntropyLoss()
    marks, first = [], None
    net.train()
    for s in range(steps):
        at = (s * batch) % (xs.shape[0] - batch)
        t = time.time()
        if first is None:
            first = t
        opt.zero_grad()
        loss = loss_fn(net(xs[at : at + batch]), ys[at : at + batch])
        loss.backward()
        opt.step()
        marks.append(time.time() - t)
    result = {
        "rank": rank,
        "formed": formed,
        "first_step": first,
        "step_seconds": marks[WARM_STEPS:],
        "loss": float(loss),
    }
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)
    if mode == "ddp":
        del net, opt  # the reducer before the group: PyTorch 2.13 can hang freeing it after (docs/guide/pytorch.md)
        dist.destroy_process_group()
    return result


def allreduce_rank(sizes_mb: tuple, calls: int, mode: str, out_dir: str) -> dict:
    """Seconds per allreduce of each size on this rank, after 3 warm-up calls, each after a barrier."""
    import torch

    torch.set_num_threads(1)
    if mode == "gloo":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()

        def reduce(t):
            dist.all_reduce(t)

        barrier = dist.barrier
    else:
        import sparkgrad.hvd.torch as hvd

        hvd.init()
        rank = hvd.rank()

        def reduce(t):
            hvd.allreduce_(t, op=hvd.Sum, name="bench")

        def barrier():
            hvd.allreduce_(torch.zeros(1), op=hvd.Sum, name="barrier")

    out = {}
    for mb in sizes_mb:
        t = torch.ones(mb * 1024 * 1024 // 4)
        times = []
        for i in range(3 + calls):
            barrier()
            t0 = time.perf_counter()
            reduce(t)
            if i >= 3:
                times.append(time.perf_counter() - t0)
        out[str(mb)] = times
    with open(os.path.join(out_dir, f"ar-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "times": out}, f)
    if mode == "gloo":
        dist.destroy_process_group()
    return out


# ---- one run per driver process ------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> dict:
    out_dir = tempfile.mkdtemp(prefix="bench-torch-")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import bench_torch as me  # the ranks unpickle the functions from this module, not __main__

    if args.part == "e2e":
        mode = "hvd" if args.system == "hvd" else "ddp"
        spark = None
        if args.system == "torchdistributor":
            import anchor_driver
            from pyspark.ml.torch.distributor import TorchDistributor

            spark, _ = anchor_driver.start_spark("bench_torch", RANKS, cold=False)

            def launch(*fn_args):
                TorchDistributor(num_processes=RANKS, local_mode=True, use_gpu=False).run(me.train_rank, *fn_args)

        elif args.system == "distributor":
            from sparkgrad.torch import Distributor

            def launch(*fn_args):
                Distributor(num_processes=RANKS, local_mode=True, use_gpu=False).run(me.train_rank, *fn_args)

        else:
            import sparkgrad

            def launch(*fn_args):  # preload: the ranks of a later run fork from a server that imported torch
                sparkgrad.run(me.train_rank, args=fn_args, num_proc=RANKS, local=True, preload=("torch",))

        data_dir = tempfile.mkdtemp(prefix="data-", dir=out_dir)
        me.prepare_shards(data_dir)
        out: dict = {}
        for which in ("", "_second"):  # two run() calls in one driver, as a notebook's cells make them
            run_dir = tempfile.mkdtemp(prefix="bench-torch-", dir=out_dir)
            t0 = time.time()
            launch(args.model, args.steps, args.batch, mode, run_dir, data_dir)
            end = time.time()
            ranks = [json.load(open(os.path.join(run_dir, f"rank-{r}.json"))) for r in range(RANKS)]
            out["group_formed" + which] = max(r["formed"] for r in ranks) - t0
            out["formation" + which] = max(r["first_step"] for r in ranks) - t0
            out["step" + which] = statistics.median(ranks[0]["step_seconds"])
            out["end_to_end" + which] = end - t0
            out["loss" + which] = ranks[0]["loss"]
        if spark is not None:
            spark.stop()
        shutil.rmtree(out_dir, ignore_errors=True)
        return out
    import anchor_driver

    spark, _ = anchor_driver.start_spark("bench_torch_allreduce", args.ranks, cold=False)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    try:
        if args.system == "gloo":
            from sparkgrad.torch import Distributor

            Distributor(num_processes=args.ranks, local_mode=False, use_gpu=False, spark=spark).run(
                me.allreduce_rank, sizes, args.calls, "gloo", out_dir
            )
        else:
            import sparkgrad

            sparkgrad.run(me.allreduce_rank, args=(sizes, args.calls, "hvd", out_dir), num_proc=args.ranks, spark=spark)
    finally:
        spark.stop()
    got = json.load(open(os.path.join(out_dir, "ar-0.json")))["times"]
    return {mb: statistics.median(t) for mb, t in got.items()}


# ---- the driver ----------------------------------------------------------------------------------------


def hvd_torch_reason() -> str | None:
    sys.path.insert(0, str(ROOT / "python"))
    try:
        import sparkgrad.hvd.torch  # noqa: F401
    except ImportError as exc:
        return f"sparkgrad.hvd.torch not available: {exc}"
    return None


def spawn(args: list[str], timeout: float) -> tuple[dict | None, str]:
    # bench/ too: the ranks unpickle this module's functions by name
    path = os.pathsep.join([str(ROOT / "python"), str(ROOT / "bench")])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    return benchlib.run_worker(__file__, sys.executable, args, env, timeout)


E2E_METRICS = (
    ("group_formed", "s"),
    ("group_formed_second", "s"),
    ("formation", "s"),
    ("formation_second", "s"),
    ("step", "s/step"),
    ("end_to_end", "s"),
    ("end_to_end_second", "s"),
)


def metric_name(metric: str) -> str:
    base = metric.removesuffix("_second").replace("_", " ")
    return f"{base}, second run() in the driver" if metric.endswith("_second") else f"{base}, first run()"


def e2e_rows(quick: bool, runs: int) -> list[dict]:
    rows: list[dict] = []
    steps = {"cnn": 150 if quick else 2 * 60000 // (64 * RANKS), "mlp10m": 30 if quick else 200}
    missing = hvd_torch_reason()
    for model, n in steps.items():
        got: dict[str, list[dict | None]] = {s: [] for s in SYSTEMS}
        why: dict[str, str] = {}
        for _ in range(runs):  # systems alternate within a round
            for system in SYSTEMS:
                if system == "hvd" and missing:
                    why[system] = missing
                    continue
                res, reason = spawn(
                    ["--part", "e2e", "--system", system, "--model", model, "--steps", str(n), "--batch", "64"],
                    timeout=1800,
                )
                if res is None:
                    why[system] = reason
                got[system].append(res)  # None for a failed run: ratios pair the runs of one round
        for system, label in SYSTEMS.items():
            ok = [r for r in got[system] if r is not None]
            for metric, unit in E2E_METRICS:
                name = f"{model}: {metric_name(metric)} (2 ranks, {n} steps)"
                if ok:
                    rows.append(benchlib.median_row(label, name, [r[metric] for r in ok], unit, digits=4))
                else:
                    rows.append(benchlib.not_measured(label, name, why.get(system, "no run"), unit))
        anchor = got["torchdistributor"]
        for system in ("distributor", "hvd"):
            for metric in (
                "group_formed", "group_formed_second", "formation", "formation_second", "end_to_end",
                "end_to_end_second",
            ):  # fmt: skip
                pairs = [a[metric] / b[metric] for a, b in zip(anchor, got[system], strict=False) if a and b]
                name = f"{model}: {metric_name(metric)}, TorchDistributor / {SYSTEMS[system]}"
                if pairs:
                    rows.append(benchlib.median_row("ratio", name, pairs, "x", digits=2))
    return rows


def allreduce_rows(quick: bool, runs: int) -> list[dict]:
    rows: list[dict] = []
    sizes = SIZES_MB[:2] if quick else SIZES_MB
    calls = 5 if quick else 20
    missing = hvd_torch_reason()
    for ranks in (2,) if quick else (2, 3):
        got: dict[str, list[dict | None]] = {"hvd": [], "gloo": []}
        why: dict[str, str] = {}
        for _ in range(runs):
            for system in got:
                if system == "hvd" and missing:
                    why[system] = missing
                    continue
                args = ["--part", "allreduce", "--system", system, "--ranks", str(ranks)]
                res, reason = spawn(args + ["--sizes", ",".join(map(str, sizes)), "--calls", str(calls)], 1800)
                if res is None:
                    why[system] = reason
                got[system].append(res)
        labels = {"hvd": "sparkgrad.hvd.torch allreduce_", "gloo": "torch.distributed.all_reduce (gloo)"}
        for mb in sizes:
            name = f"allreduce {mb} MB float32, {ranks} ranks on local Spark"
            for system, label in labels.items():
                ok = [r[str(mb)] for r in got[system] if r is not None]
                if ok:
                    rows.append(benchlib.median_row(label, name, ok, "s", digits=5))
                else:
                    rows.append(benchlib.not_measured(label, name, why.get(system, "no run"), "s"))
            pairs = [g[str(mb)] / h[str(mb)] for g, h in zip(got["gloo"], got["hvd"], strict=False) if g and h]
            if pairs:
                rows.append(benchlib.median_row("ratio", f"{name}: gloo / sparkgrad", pairs, "x", digits=2))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer steps, sizes and runs")
    ap.add_argument("--parts", default="e2e,allreduce")
    ap.add_argument("--runs", type=int, default=None, help="runs per system (default 3; --quick: 1)")
    benchlib.add_update_flag(ap)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--part", help=argparse.SUPPRESS)
    ap.add_argument("--system", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ranks", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    ap.add_argument("--calls", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    runs = args.runs or (1 if args.quick else 3)
    parts = args.parts.split(",")
    rows: list[dict] = []
    if "e2e" in parts:
        rows += e2e_rows(args.quick, runs)
    if "allreduce" in parts:
        rows += allreduce_rows(args.quick, runs)
    benchlib.print_rows(rows)
    meta = benchlib.metadata("torch", packages=("torch", "pyspark", "numpy"), ranks=RANKS, runs=runs, quick=args.quick)
    path = benchlib.results_file("torch.json", args.update)
    # the part not run this time keeps its rows from the earlier results file
    other = [p for p in ("e2e", "allreduce") if p not in parts]
    kept, old = benchlib.kept_rows(path, lambda r: part_of(r) == other[0]) if len(other) == 1 else ([], {})
    if kept:
        meta["notes"] = [f"{other[0]}'s rows are from {benchlib.run_of(old)}, kept by --parts"]
    benchlib.write_results(path, rows + kept, meta)
    return 0


def part_of(row: dict) -> str:
    return "allreduce" if row["metric"].startswith("allreduce ") else "e2e"


if __name__ == "__main__":
    sys.exit(main())
