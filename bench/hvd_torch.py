"""TorchDistributor anchor of bench_hvd.py: the seed CNN with DDP over gloo.

The driver starts a local Spark session and calls
TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(train_fn, ...);
each process joins the gloo process group, loads Fashion-MNIST
(sparkgrad.data.idx.fashion_mnist, pixels scaled to [0, 1]) into tensors
before its timer, and trains the HorovodRunner recipe's CNN
(Conv2d(1,32,3)-ReLU-Conv2d(32,64,3)-ReLU-MaxPool2d(2)-Dropout(0.25)-Flatten-
Linear(9216,128)-ReLU-Dropout(0.5)-Linear(128,10); Keras' glorot-uniform
weights and zero biases; Adadelta(lr 0.1 x world, rho 0.95, eps 1e-7);
cross entropy; batch 128 per process) with DistributedDataParallel and a
DistributedSampler (set_epoch every epoch), ``--epochs`` epochs of
``--samples`` training samples, torch threads = ``--threads``. With
``--compile`` the model goes through torch.compile before DDP wraps it
(DDP(torch.compile(model)); the other order runs eagerly in torch 2.13, see
train_fn); its first step (which compiles forward and backward) is timed on
its own. With ``--bf16`` the forward pass and the loss run under
torch.autocast("cpu", dtype=torch.bfloat16) (PyTorch's CPU mixed precision:
bf16 convolutions and matmuls, fp32 weights and optimizer). Each process
writes its own timestamps to ``--out-dir``; rank 0 evaluates the 10,000 test
images. The driver writes ``--out`` (JSON) with the run() wall time.

    .venv/bin/python bench/hvd_torch.py --samples 60000 --epochs 3 --out-dir O --out R.json [--compile | --bf16]
"""

from __future__ import annotations

import sys

import anchor_driver


def train_fn(
    samples: int, epochs: int, batch_size: int, lr: float, threads: int, compile_: bool, bf16: bool, out_dir: str
):
    """Runs in each TorchDistributor process (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR...)."""
    import contextlib
    import json
    import os
    import time

    import numpy as np
    import torch
    import torch.distributed as dist
    from sparkgrad.data.idx import fashion_mnist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)

    model = nn.Sequential(
        nn.Conv2d(1, 32, 3),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Dropout(0.25),
        nn.Flatten(),
        nn.Linear(9216, 128),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(128, 10),
    )
    for layer in model:
        if isinstance(layer, (nn.Conv2d, nn.Linear)):  # Keras' defaults: glorot uniform, zero bias
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
    # compiled inside DDP: torch.compile(DDP(model)) graph-breaks at DDP's forward in torch 2.13
    # (DistributedDataParallel._inside_ddp_forward is on dynamo's skip list) and so runs eagerly
    net = DistributedDataParallel(torch.compile(model) if compile_ else model)
    opt = torch.optim.Adadelta(net.parameters(), lr=lr, rho=0.95, eps=1e-7)
    loss_fn = nn.CrossEntropyLoss()

    x, y = fashion_mnist("train")
    x, y = x[:samples], y[:samples]
    data = TensorDataset(
        torch.from_numpy(x.reshape(-1, 1, 28, 28).astype(np.float32) / 255.0), torch.from_numpy(y.astype(np.int64))
    )
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler, drop_last=True)

    def autocast():  # bf16 forward and loss, fp32 weights and optimizer: PyTorch's mixed precision on CPU
        return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    stamps = []  # wall-clock end of every step
    first_step = None
    net.train()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            if first_step is None:
                first_step = time.time()
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = loss_fn(net(xb), yb)
            loss.backward()
            opt.step()
            stamps.append(time.time())
    result = {
        "rank": rank,
        "first_step_wall": first_step,
        "first_step_end_wall": stamps[0],
        "last_step_wall": stamps[-1],
        "step_seconds": float(np.median(np.diff(stamps))) if len(stamps) > 1 else None,
        "samples": len(stamps) * batch_size,
        "steps": len(stamps),
        "torch": torch.__version__,
    }
    if compile_:  # evidence that torch.compile compiled (a graph break everywhere would run eagerly)
        from torch._dynamo.utils import counters

        result["compiled_graphs"] = int(counters["stats"]["unique_graphs"])
        result["graph_breaks"] = int(sum(counters["graph_break"].values()))
    if rank == 0:
        tx, ty = fashion_mnist("test")
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(tx), 1000):
                xb = torch.from_numpy(tx[i : i + 1000].reshape(-1, 1, 28, 28).astype(np.float32) / 255.0)
                correct += int((model(xb).argmax(1).numpy() == ty[i : i + 1000]).sum())
        result["test_accuracy"] = correct / len(tx)
        print(f"torch rank 0: {len(stamps)} steps, test accuracy {result['test_accuracy']:.4f}", flush=True)
    with open(os.path.join(out_dir, f"torch-{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    return result


def main() -> int:
    p = anchor_driver.parser(__doc__.splitlines()[0])
    p.add_argument("--num-processes", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--compile", action="store_true", help="torch.compile the model inside DDP")
    p.add_argument("--bf16", action="store_true", help="forward and loss under torch.autocast('cpu', bfloat16)")
    p.set_defaults(batch_size=128, learning_rate=None)
    args = p.parse_args()
    lr = args.learning_rate if args.learning_rate is not None else 0.1 * args.num_processes

    return anchor_driver.run_torch_distributor(
        args, "bench_hvd-torch", train_fn, args.samples, args.epochs, args.batch_size, lr, args.threads,
        args.compile, args.bf16, args.out_dir,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
