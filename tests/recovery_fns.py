"""Training functions for the recovery tests (Spark ships this file with sc.addPyFile).

A training node dies (os._exit, no report) at the end of an epoch once the
chief's checkpoint of that epoch exists; a marker file makes it die on the
first attempt only, unless told to die every time. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import time
import zlib

import numpy as np

FEATURES, CLASSES = 4, 3
CHECKPOINT_WAIT = 30.0  # seconds the dying node waits for the chief's checkpoint of its epoch


def blobs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, n)
    centers = 3.0 * np.eye(CLASSES, FEATURES, dtype=np.float32)
    return (centers[y] + rng.standard_normal((n, FEATURES))).astype(np.float32), y.astype(np.int64)


def build_model(seed: int = 3):
    from sparkgrad import nn

    return nn.Sequential([nn.Dense(16, activation="relu", input_shape=(FEATURES,)), nn.Dense(CLASSES)], seed=seed)


def _checkpoint_steps(ckpt_dir: str) -> list[int]:
    if not os.path.isdir(ckpt_dir):
        return []
    return sorted(int(n[5:15]) for n in os.listdir(ckpt_dir) if n.startswith("ckpt-") and n.endswith(".sgck"))


class DieAtEpochEnd:
    """At the end of epoch ``epoch``: waits for the chief's checkpoint of this step, notes it, and dies."""

    def __init__(self, epoch: int, ckpt_dir: str, marker: str, every_time: bool = False, how: str = "exit") -> None:
        self.epoch, self.ckpt_dir, self.marker, self.every_time = epoch, ckpt_dir, marker, every_time
        self.how = how  # "exit": the process dies; "stop": SIGSTOP, silent but alive
        self.model = None

    def set_model(self, model) -> None:
        self.model = model

    def on_epoch_end(self, epoch, logs) -> None:
        if epoch < self.epoch or (os.path.exists(self.marker) and not self.every_time):
            return
        step = self.model.step
        deadline = time.monotonic() + CHECKPOINT_WAIT
        while time.monotonic() < deadline and not any(s >= step for s in _checkpoint_steps(self.ckpt_dir)):
            time.sleep(0.05)
        with open(self.marker, "w") as f:
            json.dump({"step": step, "checkpoints": _checkpoint_steps(self.ckpt_dir)}, f)
        if self.how == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)  # silent: only the missing heartbeats tell
        os._exit(3)  # dies without a word: the driver sees the node lost


class StartStep:
    """The model's step when training begins (after fit restored a checkpoint and, under a ps, pulled)."""

    def __init__(self) -> None:
        self.model = None
        self.step = None

    def set_model(self, model) -> None:
        self.model = model

    def on_train_begin(self, logs) -> None:
        self.step = self.model.step


def ps_fit(args, ctx):
    """TFCluster with a ps: every worker fits its shard through the ps, checkpoints in one shared directory."""
    from sparkgrad import TFNode, nn

    model = build_model()
    model.compile(optimizer=nn.Adam(0.02), loss="sparse_categorical_crossentropy")
    if ctx.job_name == "ps":
        return TFNode.start_cluster_server(ctx).serve_parameters(model, mode="sync")
    x, y = blobs(512, 0)
    rank, size = ctx.worker_rank, ctx.num_workers
    start = StartStep()
    callbacks = [start]
    if rank == args["target"]:
        callbacks.append(
            DieAtEpochEnd(1, args["ckpt"], args["marker"], args.get("every_time", False), args.get("how", "exit"))
        )
    with TFNode.ps_client(ctx, model) as ps:
        model.fit(
            x[rank::size], y[rank::size], batch_size=16, epochs=args["epochs"], verbose=2,
            shuffle=args.get("shuffle", True),
            checkpoint_dir=args["ckpt"], ps=ps, callbacks=callbacks,
        )  # fmt: skip
    xt, yt = blobs(600, 9)
    _, acc = model.evaluate(xt, yt)
    return {
        "attempt": ctx.attempt,
        "start_step": start.step,
        "step": model.step,
        "accuracy": acc,
        "params_crc": zlib.crc32(model.params.tobytes()),
    }


def allreduce_fit(ckpt, marker, target, epochs, every_time=False):
    """sparkgrad.run: every rank fits its shard with a DistributedOptimizer; only rank 0 has a checkpoint_dir
    (the other ranks resume from the state rank 0 resumed, which fit shares)."""
    import sparkgrad.hvd as hvd
    from sparkgrad import nn
    from sparkgrad.cluster import rank as _rank
    from sparkgrad.hvd.callbacks import BroadcastGlobalVariablesCallback

    hvd.init()
    x, y = blobs(512, 0)
    model = build_model(seed=3 + hvd.rank())
    model.compile(optimizer=hvd.DistributedOptimizer(nn.Adam(0.02)), loss="sparse_categorical_crossentropy")
    start = StartStep()
    callbacks = [start, BroadcastGlobalVariablesCallback(0)]
    if hvd.rank() == target:
        callbacks.append(DieAtEpochEnd(1, ckpt, marker, every_time))
    model.fit(
        x[hvd.rank() :: hvd.size()], y[hvd.rank() :: hvd.size()], batch_size=16, epochs=epochs, verbose=2,
        checkpoint_dir=ckpt if hvd.rank() == 0 else None, callbacks=callbacks,  # Horovod's idiom: rank 0's only
    )  # fmt: skip
    xt, yt = blobs(600, 9)
    _, acc = model.evaluate(xt, yt)
    return {
        "attempt": _rank.attempt(),
        "start_step": start.step,
        "step": model.step,
        "accuracy": acc,
        "params_crc": zlib.crc32(model.params.tobytes()),
    }
