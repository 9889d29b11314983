"""map_fun bodies of the fault suite (shipped to the executors with sc.addPyFile).

Every node writes started-<executor_id>.json (its pid, its parent, the
executor JVM above that, its listening port) as soon as it runs, so the test
can aim a fault at the process that holds a given role. Every loop is bounded.
"""

from __future__ import annotations

import json
import os
import resource
import time

from sparkgrad import TFNode

NUM_PARAMS = 4096
RUN_SECONDS = 120.0  # no node trains longer than this, whatever happens to the driver


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _mark(args, ctx, what: str, **extra) -> None:
    info = {
        "pid": os.getpid(),
        "parent": os.getppid(),
        "jvm": _ppid(os.getppid()),  # on Spark: python worker <- pyspark daemon <- executor JVM
        "port": ctx.port,
        "name": f"{ctx.job_name}:{ctx.task_index}",
        "executor_id": ctx.executor_id,
        **extra,
    }
    path = os.path.join(args["dir"], f"{what}-{ctx.executor_id}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(info, f)
    os.replace(path + ".tmp", path)


def train_until_stopped(args, ctx):
    """ps: serve NUM_PARAMS with SGD; workers and the chief: push/pull until the driver stops them, until
    args["steps"], or until args["until_file"] exists (and 20 steps after); args["nofile"]: RLIMIT_NOFILE."""
    import numpy as np

    if args.get("nofile"):  # a descriptor limit as on most hosts (soft 1024), whatever this one has
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(args["nofile"], hard), hard))
    server = TFNode.start_cluster_server(ctx)
    _mark(args, ctx, "started", listener=server.listener.port)
    if ctx.job_name == "ps":
        return server.serve_parameters(NUM_PARAMS, mode="async", lr=0.01, init=np.zeros(NUM_PARAMS, np.float32))
    params = np.zeros(NUM_PARAMS, np.float32)
    grads = np.full(NUM_PARAMS, 0.001, np.float32)
    steps = 0
    end = time.monotonic() + args.get("seconds", RUN_SECONDS)
    with TFNode.ps_client(ctx, NUM_PARAMS) as ps:
        until = args.get("until_file")  # train until this file exists (then 20 steps more), if given
        more = None
        while not ctx.should_stop() and time.monotonic() < end and steps < args.get("steps", 10**9):
            if until and more is None and os.path.exists(until):
                more = steps + 20
            if more is not None and steps >= more:
                break
            ps.pull(params)
            ps.push(grads)
            steps += 1
            if steps == 20:
                _mark(args, ctx, "training")
            time.sleep(0.005)
    return {"steps": steps}


def count_feed(args, ctx):
    """InputMode.SPARK: the worker, with at most `nofile` descriptors, counts the rows fed to it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.get("nofile", 256)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    _mark(args, ctx, "started", nofile=min(want, hard))
    feed = TFNode.DataFeed(ctx.mgr, timeout=args.get("feed_timeout", 120))
    rows = total = 0
    end = time.monotonic() + args.get("seconds", 600)
    while not feed.should_stop() and time.monotonic() < end:
        batch = feed.next_batch(args.get("batch", 256))
        rows += len(batch)
        total += sum(int(r) for r in batch)
    return {"rows": rows, "sum": total, "nofile": min(want, hard)}
