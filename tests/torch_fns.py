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
