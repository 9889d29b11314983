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

import json
import sys

import anchor_driver


def train_fn(samples: int, batch_size: int, learning_rate: float, seed: int, out_dir: str) -> dict:
    """Runs in each TorchDistributor process (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR...)."""
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
    torch.manual_seed(seed)

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
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=seed)
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
        "trained_wall": trained,
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
    p = anchor_driver.parser(__doc__.splitlines()[0])
    p.add_argument("--num-processes", type=int, default=2)
    args = p.parse_args()

    return anchor_driver.run_torch_distributor(
        args, "bench_cluster-torch", train_fn, args.samples, args.batch_size, args.learning_rate, args.seed,
        args.out_dir,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
