"""What the ranks of sparkgrad.run / HorovodRunner run in the tests (shipped to Spark's executors)."""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np


def describe(tag="", env_name="SPARKGRAD_TEST_VAR"):
    """The rank's view of itself: sparkgrad's rank, hvd's topology, its env and process, a line on each stream."""
    import sparkgrad.hvd as hvd
    from sparkgrad.cluster import collective, rank

    hvd.init()
    me = rank.current()
    handle = collective.current()
    print(f"stdout line of {tag} from {hvd.rank()}")
    print(f"stderr line of {tag} from {hvd.rank()}", file=sys.stderr)
    return {
        "tag": tag,
        "rank": me.rank,
        "size": me.size,
        "hvd": [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()],
        "env": os.environ.get(env_name),
        "pid": os.getpid(),
        "comm": [list(a) for a in handle.setup.addresses],
        "array": np.arange(3) * me.rank,  # any picklable value comes back
    }


def _wait(seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # bounded; a stopped rank is interrupted here
        time.sleep(0.05)


def fail_on(target, pid_dir):
    from sparkgrad.cluster import rank

    me = rank.current().rank
    with open(os.path.join(pid_dir, f"pid-{me}"), "w") as f:
        f.write(str(os.getpid()))
    if me == target:
        raise ValueError(f"boom from rank {me}")
    _wait(60)
    return me


def kill_on(target, pid_dir):
    from sparkgrad.cluster import rank

    me = rank.current().rank
    with open(os.path.join(pid_dir, f"pid-{me}"), "w") as f:
        f.write(str(os.getpid()))
    if me == target:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    _wait(60)
    return me


def hvd_main(scale=1):
    """A HorovodRunner main: rank 0's value is the run's."""
    import sparkgrad.hvd as hvd

    hvd.init()
    return {"rank": hvd.rank(), "size": hvd.size(), "scaled": scale * hvd.size()}


def ring_transport():
    """Whether this rank's communicator moves its data through shared memory, and an allreduce on it."""
    import sparkgrad.hvd as hvd

    hvd.init()
    total = hvd.allreduce(np.full(3, hvd.rank() + 1.0, np.float32), op=hvd.Sum)
    return {"shared_memory": hvd.communicator().stats()["shared_memory"], "sum": float(total[0])}


def collectives(seed):
    """Every collective of sparkgrad.hvd on this rank; the test compares them with NumPy."""
    import sparkgrad.hvd as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    rng = np.random.default_rng(seed + r)
    x = rng.standard_normal(1001).astype(np.float32)
    ints = (np.arange(7, dtype=np.int64) + 1) * (r + 1)
    out = {
        "x": x,
        "ints": ints,
        "sum": hvd.allreduce(x, op=hvd.Sum),
        "avg": hvd.allreduce(x),
        "min": hvd.allreduce(x, op=hvd.Min),
        "max": hvd.allreduce(x, op=hvd.Max),
        "isum": hvd.allreduce(ints, op=hvd.Sum),
        "fp16": hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16),
        "gather": hvd.allgather(np.full((r + 1, 2), r, dtype=np.float32)),
        "bcast": hvd.broadcast(x, root_rank=n - 1),
        "obj": hvd.broadcast_object({"from": r, "t": (1, 2.5, None, True), "a": np.arange(4) * r, "b": b"\x00\xff"}, 0),
        "objs": hvd.allgather_object(["rank", r, {"k": r * 1.5}]),
    }
    hvd.barrier()
    out["last"] = hvd.join()
    return out


def models_after_broadcast(seed_base):
    """Builds a model with a rank-dependent seed, broadcasts rank 0's parameters and optimizer state."""
    import sparkgrad.hvd as hvd
    from sparkgrad import nn

    hvd.init()
    layers = [nn.Dense(8, activation="relu", input_shape=(4,)), nn.Dense(3)]
    model = nn.Sequential(layers, seed=seed_base + hvd.rank())
    model.compile(optimizer=nn.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
    x = np.random.default_rng(hvd.rank()).standard_normal((16, 4)).astype(np.float32)
    model.train_on_batch(x, np.zeros(16, np.int64))  # rank-dependent optimizer state
    before = model.params.copy()
    hvd.broadcast_parameters(model, root_rank=0)
    hvd.broadcast_optimizer_state(model, root_rank=0)
    steps, state = model.optimizer.get_state()
    return {"before": before, "after": model.params.copy(), "steps": steps, "state": state}


def tf_allreduce(args, ctx):
    """A TFCluster(num_ps=0) map_fun: one allreduce among the workers through hvd."""
    import sparkgrad.hvd as hvd

    hvd.init()
    got = hvd.allreduce(np.full(5, float(hvd.rank() + 1), np.float32), op=hvd.Sum)
    return {"rank": hvd.rank(), "size": hvd.size(), "sum": got.tolist(), "comm_port": ctx.nodes[0].comm_port}


def tf_ports(args, ctx):
    """A TFCluster map_fun: the communicator addresses its node was given (None without them)."""
    from sparkgrad.cluster import collective

    handle = collective.current()
    return {"comm": None if handle is None else [list(a) for a in handle.setup.addresses]}


def callbacks_flow(warmup_epochs):
    """The hvd callbacks' hooks called as fit calls them, on a model whose ranks start different."""
    import sparkgrad.hvd as hvd
    from sparkgrad import nn
    from sparkgrad.hvd.callbacks import (
        BroadcastGlobalVariablesCallback,
        LearningRateWarmupCallback,
        MetricAverageCallback,
    )

    hvd.init()
    r = hvd.rank()
    model = nn.Sequential([nn.Dense(3, input_shape=(4,))], seed=100 + r)
    opt = hvd.DistributedOptimizer(nn.optimizers.SGD(0.4 * hvd.size()))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    cbs = [
        BroadcastGlobalVariablesCallback(0),
        MetricAverageCallback(),
        LearningRateWarmupCallback(0.4 * hvd.size(), warmup_epochs=warmup_epochs, steps_per_epoch=10),
    ]
    for cb in cbs:
        cb.set_model(model)
    for cb in cbs:
        cb.on_train_begin({})
    params = model.params.copy()
    lrs, logs_seen = [], []
    for epoch in range(warmup_epochs + 1):
        for cb in cbs:
            cb.on_epoch_begin(epoch, {})
        lrs.append(model.optimizer.learning_rate)
        model.step += 5
        for cb in cbs:
            cb.on_step_end(model.step, {"loss": 1.0})
        lrs.append(model.optimizer.learning_rate)
        model.step += 5
        logs = {"loss": float(r), "val_loss": 10.0 * r, "note": "text"}
        for cb in cbs:
            cb.on_epoch_end(epoch, logs)
        logs_seen.append(logs)
    return {"params": params, "lrs": lrs, "logs": logs_seen}


def tf_fit(args, ctx):
    """A TFCluster(num_ps=0) map_fun training with model.fit and a DistributedOptimizer (rank-sharded data)."""
    import sparkgrad.hvd as hvd
    from sparkgrad import nn
    from sparkgrad.hvd.callbacks import BroadcastGlobalVariablesCallback, MetricAverageCallback

    hvd.init()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 8)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    xs, ys = x[hvd.rank() :: hvd.size()], y[hvd.rank() :: hvd.size()]
    model = nn.Sequential([nn.Dense(16, activation="relu", input_shape=(8,)), nn.Dense(2)], seed=1 + hvd.rank())
    model.compile(optimizer=hvd.DistributedOptimizer(nn.SGD(0.1 * hvd.size())), loss="sparse_categorical_crossentropy")
    own, seen = _EpochLogs(), _EpochLogs()
    history = model.fit(
        xs, ys, batch_size=16, epochs=3, verbose=0,
        callbacks=[own, BroadcastGlobalVariablesCallback(0), MetricAverageCallback(), seen],
    )  # fmt: skip
    return {
        "rank": hvd.rank(),
        "params": model.params.tolist(),
        "own_loss": own.key("loss"),
        "averaged_loss": seen.key("loss"),
        "history_loss": history.history["loss"],
    }


class _EpochLogs:
    """Records each epoch's logs as the callbacks at its place in the list see them."""

    def __init__(self):
        self.logs = []

    def on_epoch_end(self, epoch, logs):
        self.logs.append(dict(logs))

    def key(self, name):
        return [logs[name] for logs in self.logs]


def fit_logs_and_checkpoints(ckpt_root):
    """fit on every rank with checkpoint_dir (its own) and validation data that differs by rank.

    What each rank's callbacks saw before and after MetricAverageCallback,
    its History, whether it is sparkgrad.cluster.rank's chief, and the files
    its checkpoint directory holds after fit.
    """
    import sparkgrad.hvd as hvd
    from sparkgrad import nn
    from sparkgrad.cluster import rank as _rank
    from sparkgrad.hvd.callbacks import BroadcastGlobalVariablesCallback, MetricAverageCallback

    hvd.init()
    x, y = _blobs(256, 0)
    xv, yv = _blobs(64, 5 + hvd.rank())  # a different validation set on each rank: different val_loss
    model = build_blob_model(seed=20 + hvd.rank())
    model.compile(optimizer=hvd.DistributedOptimizer(nn.SGD(0.05)), loss="sparse_categorical_crossentropy")
    ckpt_dir = os.path.join(ckpt_root, f"rank{hvd.rank()}")
    own, seen = _EpochLogs(), _EpochLogs()
    history = model.fit(
        x[hvd.rank() :: hvd.size()], y[hvd.rank() :: hvd.size()], batch_size=32, epochs=3, verbose=0,
        validation_data=(xv, yv), callbacks=[own, BroadcastGlobalVariablesCallback(0), MetricAverageCallback(), seen],
        checkpoint_dir=ckpt_dir, save_best_only=True, monitor="val_loss",
    )  # fmt: skip
    return {
        "rank": hvd.rank(),
        "is_chief": _rank.is_chief(),
        "own": own.key("val_loss"),
        "averaged": seen.key("val_loss"),
        "history": history.history["val_loss"],
        "files": sorted(os.listdir(ckpt_dir)) if os.path.isdir(ckpt_dir) else [],
        "dir": ckpt_dir,
    }


def kill_during_allreduce(target, how="kill"):
    """Every rank allreduces in a loop; rank ``target`` kills itself (or raises) in the middle."""
    import sparkgrad.hvd as hvd

    hvd.init()
    x = np.ones(1 << 16, np.float32)
    deadline = time.monotonic() + 30
    i = 0
    while time.monotonic() < deadline:  # bounded: the test expects the run to end long before
        if hvd.rank() == target and i == 20:
            if how == "raise":
                raise RuntimeError(f"rank {target} gives up")
            os.kill(os.getpid(), signal.SIGKILL)
        hvd.allreduce(x, op=hvd.Sum)
        i += 1
    return i


def _blobs(n, seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    centers = 4.0 * np.eye(3, 4, dtype=np.float32)
    x = (centers[y] + rng.standard_normal((n, 4))).astype(np.float32)
    return x, y.astype(np.int64)


def build_blob_model(seed=0):
    from sparkgrad import nn

    return nn.Sequential([nn.Dense(16, activation="relu", input_shape=(4,)), nn.Dense(3)], seed=seed)


def hvd_flow(ckpt_dir):
    """The HorovodRunner recipe in small: shard by rank, lr x size, broadcast from 0, best-only checkpoint on 0."""
    import sparkgrad.hvd as hvd
    from sparkgrad import nn
    from sparkgrad.hvd.callbacks import BroadcastGlobalVariablesCallback, MetricAverageCallback

    hvd.init()
    x, y = _blobs(1024, 0)
    xv, yv = _blobs(256, 1)
    model = build_blob_model(seed=10 + hvd.rank())
    opt = hvd.DistributedOptimizer(nn.Adadelta(1.0 * hvd.size()))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(
        x[hvd.rank() :: hvd.size()], y[hvd.rank() :: hvd.size()], batch_size=32, epochs=3, verbose=0,
        validation_data=(xv, yv), callbacks=[BroadcastGlobalVariablesCallback(0), MetricAverageCallback()],
        checkpoint_dir=ckpt_dir, save_best_only=True, monitor="val_loss",
    )  # fmt: skip
    if hvd.rank() != 0:
        return None
    with open(os.path.join(ckpt_dir, "best.sgck"), "rb") as f:
        return f.read()


def big_value(nbytes):
    """A value far larger than a pipe's buffer."""
    from sparkgrad.cluster import rank

    return bytes([rank.current().rank]) * nbytes


def feed_then_allreduce(args, ctx):
    """InputMode.SPARK without ps: each worker counts its fed rows, then the workers allreduce the counts."""
    import sparkgrad.hvd as hvd
    from sparkgrad import TFNode

    hvd.init()  # its own listener: the node's (ctx.listener) serves the feed
    feed = TFNode.DataFeed(ctx.mgr, timeout=60)
    rows = 0
    while not feed.should_stop():
        cols = feed.next_batch_columns(50)
        if cols:
            rows += len(cols["0"])
    total = hvd.allreduce(np.array([rows], np.int64), op=hvd.Sum)
    return {"rows": rows, "total": int(total[0])}


def train_hvd(learning_rate, checkpoint_dir, epochs=3, train_rows=None, test_rows=None):
    """The HorovodRunner tutorial's train_hvd on sparkgrad: the seed's CNN on Fashion-MNIST.

    Each rank shards the training set by rank, scales the learning rate by the
    number of ranks, wraps Adadelta in hvd.DistributedOptimizer, takes rank 0's
    initial weights, validates on the test set, and only rank 0 keeps the best
    checkpoint (by val_loss), whose bytes rank 0 returns.
    """
    import sparkgrad.hvd as hvd
    from sparkgrad.data.idx import fashion_mnist
    from sparkgrad.hvd.callbacks import BroadcastGlobalVariablesCallback, MetricAverageCallback
    from sparkgrad.nn import Adadelta
    from sparkgrad.nn.models import horovod_cnn

    hvd.init()
    x, y = fashion_mnist("train")
    xt, yt = fashion_mnist("test")
    x, y, xt, yt = x[:train_rows], y[:train_rows], xt[:test_rows], yt[:test_rows]
    x, y = x[hvd.rank() :: hvd.size()], y[hvd.rank() :: hvd.size()]  # this rank's shard, uint8 as read
    onehot = np.eye(10, dtype=np.float32)
    model = horovod_cnn(seed=1 + hvd.rank())  # rank 0's horovod_cnn(seed=1) is broadcast to every rank
    model.set_input_transform(scale=1 / 255)  # C scales the uint8 pixels as it gathers each batch
    optimizer = hvd.DistributedOptimizer(Adadelta(learning_rate * hvd.size()))
    model.compile(optimizer=optimizer, loss="categorical_crossentropy", metrics=["accuracy"])
    checkpoints = {}
    if hvd.rank() == 0:
        checkpoints = dict(checkpoint_dir=checkpoint_dir, save_best_only=True, monitor="val_loss")
    history = model.fit(
        x, onehot[y], batch_size=128, epochs=epochs, verbose=2 if hvd.rank() == 0 else 0,
        validation_data=(xt, onehot[yt]), callbacks=[BroadcastGlobalVariablesCallback(0), MetricAverageCallback()],
        **checkpoints,
    )  # fmt: skip
    if hvd.rank() != 0:
        return None
    with open(os.path.join(checkpoint_dir, "best.sgck"), "rb") as f:
        return {"checkpoint": f.read(), "history": history.history, "steps": model.step, "size": hvd.size()}


def security_probe():
    """The rank's frame protection and a ring allreduce through it (sum of rank + 1 over 1000 values)."""
    import sparkgrad.hvd as hvd
    from sparkgrad.cluster import collective

    hvd.init()
    total = hvd.allreduce(np.full(1000, hvd.rank() + 1.0, np.float32), op=hvd.Sum)
    return {"security": collective.current().setup.security, "sum": total}
