"""What the ranks of sparkgrad.torch.Distributor run in the tests (shipped to Spark's executors)."""

from __future__ import annotations

import os

TORCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")


def allreduce_rank(scale):
    """init_process_group from the environment alone, one all_reduce, the rank's view of its environment."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(3) * (dist.get_rank() + 1) * scale
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} reduced {t.tolist()}", flush=True)
    out = {
        "rank": dist.get_rank(),
        "size": dist.get_world_size(),
        "sum": t.tolist(),
        "env": {k: os.environ.get(k) for k in TORCH_ENV},
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    dist.destroy_process_group()
    return out


def ddp_destroyed_before_its_model(steps):
    """The usual ending of a DDP function: destroy_process_group() with the DistributedDataParallel model still
    in the frame, so the model's reducer frees the gloo group when the frame goes. A switch interval of a
    second keeps the GIL with this thread from the last backward to that moment, when one of gloo's worker
    threads still needs the GIL to drop the last collective. Returning ``float(loss)`` of a tensor that requires
    grad, with its UserWarning, as the guide's example does: without Distributor's _group_released, PyTorch
    2.13 deadlocked on the second run every time here (with ``loss.detach()`` it did not)."""
    import sys

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    sys.setswitchinterval(1.0)
    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(32, 4) + dist.get_rank()
    for _ in range(steps):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
    dist.destroy_process_group()
    return float(loss)


def fail_on_rank_one():
    """Rank 1 raises after the group formed; rank 0 blocks in a collective rank 1 never joins."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("rank one broke on purpose")
    dist.all_reduce(torch.ones(2))


def hvd_inside():
    """sparkgrad.hvd inside a Distributor job: refused (the comm port serves torch's store)."""
    import sparkgrad.hvd as hvd

    hvd.init()


def gpu_view():
    """Every rank's CUDA_VISIBLE_DEVICES beside the gpu addresses Spark gave its task, gathered on rank 0."""
    import torch.distributed as dist
    from pyspark import TaskContext

    dist.init_process_group("gloo")
    task = TaskContext.get()
    mine = {
        "rank": dist.get_rank(),
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "task_gpus": list(task.resources()["gpu"].addresses),
    }
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    dist.destroy_process_group()
    return every


def process_state(tag):
    """What a rank found when it started, then marks its process (a later run's ranks must not see the mark),
    leaving its process group initialized (the Distributor releases it)."""
    import sys

    found = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "marks": sorted(k for k in os.environ if k.startswith("SG_TEST_MARK_")),
        "global_mark": getattr(sys.modules[__name__], "GLOBAL_MARK", None),
        "driver_env": os.environ.get("SG_TEST_DRIVER_ENV"),
        "preloaded": [m for m in ("torch", "torch._dynamo") if m in sys.modules],  # before this function imports
    }
    import torch.distributed as dist

    found["group_was_initialized"] = dist.is_initialized()
    dist.init_process_group("gloo")
    os.environ[f"SG_TEST_MARK_{tag}"] = "1"
    sys.modules[__name__].GLOBAL_MARK = tag
    return found


def exit_hard_on_rank_one():
    """Rank 1's process ends at once, after the group formed (os._exit: no exception, no word to the driver)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        os._exit(13)
    import torch

    dist.all_reduce(torch.ones(1))
