"""TorchDistributor anchor of bench_cluster.py: pyspark.ml.torch.distributor, DDP over gloo.

The driver starts a local Spark session and calls
TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(train_fn, ...);
each of the two processes joins the gloo process group, loads Fashion-MNIST
(sparkgrad.data.idx.fashion_mnist: the same IDX files the TFRecords were made
from), and trains the walkthrough MLP (784-128-64-10 ReLU, truncated-normal
weights with stddev 1/sqrt(fan_in), zero biases, SGD 0.07, batch 100 per
process) with DistributedDataParallel and a DistributedSampler, on
``--samples`` training samples in total. Each process writes the wall-clock
time of its first training step to ``--out-dir``; rank 0 also evaluates the
test set. The driver writes ``--out`` (JSON) with the run() wall time.

    .venv/bin/python bench/cluster_torch.py --samples 60000 --out-dir O --out R.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time


def train_fn(samples: int, batch_size: int, learning_rate: float, out_dir: str) -> dict:
    """Runs in each TorchDistributor process (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR...)."""
    import json
    import math
    import os
    import time

    import numpy as np
    import torch
    import torch.distributed as dist
    from sparkgrad.data.idx import fashion_mnist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(1)  # one compute thread per process, as every system in the benchmark
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(42)

    def dense(fan_in: int, units: int) -> nn.Linear:
        layer = nn.Linear(fan_in, units)
        std = 1.0 / math.sqrt(fan_in)
        nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
        nn.init.zeros_(layer.bias)
        return layer

    model = nn.Sequential(dense(784, 128), nn.ReLU(), dense(128, 64), nn.ReLU(), dense(64, 10))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=learning_rate)
    loss_fn = nn.CrossEntropyLoss()

    x, y = fashion_mnist("train")
    data = TensorDataset(
        torch.from_numpy(x.reshape(-1, 784).astype(np.float32) / 255.0), torch.from_numpy(y.astype(np.int64))
    )
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=42)
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler, drop_last=True)
    steps = samples // (batch_size * world)

    first_step = None
    started = time.time()
    done = 0
    ddp.train()
    for xb, yb in loader:
        if done >= steps:
            break
        if first_step is None:
            first_step = time.time()
        opt.zero_grad()
        loss = loss_fn(ddp(xb), yb)
        loss.backward()
        opt.step()
        done += 1
    trained = time.time()
    result = {
        "rank": rank,
        "first_step_wall": first_step,
        "fit_seconds": trained - started,
        "samples": done * batch_size,
        "steps": done,
    }
    if rank == 0:
        tx, ty = fashion_mnist("test")
        model.eval()
        with torch.no_grad():
            logits = model(torch.from_numpy(tx.reshape(-1, 784).astype(np.float32) / 255.0))
        result["test_accuracy"] = float((logits.argmax(1).numpy() == ty.astype(np.int64)).mean())
        print(f"torch rank 0: {done} steps, test accuracy {result['test_accuracy']:.4f}", flush=True)
    with open(os.path.join(out_dir, f"torch-{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", required=True, help="where the processes write their results")
    p.add_argument("--out", required=True, help="the driver's result (JSON)")
    p.add_argument("--samples", type=int, default=60000)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--learning-rate", type=float, default=0.07)
    p.add_argument("--num-processes", type=int, default=2)
    p.add_argument("--cold", action="store_true", help="no Python job on the SparkContext before run()")
    args = p.parse_args()

    import importlib.metadata

    from pyspark.ml.torch.distributor import TorchDistributor
    from pyspark.sql import SparkSession

    os.makedirs(args.out_dir, exist_ok=True)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    t_spark = time.time()
    spark = (
        SparkSession.builder.master(f"local[{args.num_processes}]")
        .appName("bench_cluster-torch")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    if not args.cold:  # a context that has run a Python job already, as in a notebook
        spark.sparkContext.parallelize(range(args.num_processes), args.num_processes).map(lambda x: x).count()
    spark_seconds = time.time() - t_spark
    t0 = time.time()
    TorchDistributor(num_processes=args.num_processes, local_mode=True, use_gpu=False).run(
        train_fn, args.samples, args.batch_size, args.learning_rate, args.out_dir
    )
    t_end = time.time()
    spark.stop()
    nodes = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(args.out_dir, "torch-*.json")))]
    out = {
        "t0": t0,
        "end": t_end,
        "spark_start_seconds": spark_seconds,
        "nodes": nodes,
        "versions": {m: importlib.metadata.version(m) for m in ("torch", "pyspark")},
    }
    with open(args.out, "w") as f:
        json.dump(out, f)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
