"""map_fun bodies shared by the cluster tests (Spark ships this file with sc.addPyFile).

Each takes ``args`` = {"dir": output directory, "target": "role:index" the test
aims at} and writes what it saw into ``dir`` so the driver side can check it.
Every wait is bounded.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import threading

from sparkgrad import TFNode
from sparkgrad.cluster import rank

WAIT = 60.0  # seconds a node waits for the driver's stop before failing the test


def _name(ctx) -> str:
    return f"{ctx.job_name}:{ctx.task_index}"


def _mark(args, ctx, what: str) -> None:
    """Writes the marker whole under a temporary name, then renames it: a test polling for markers never reads
    one half written."""
    path = os.path.join(args["dir"], f"{what}-{ctx.executor_id}.json")
    with open(path + ".part", "w") as f:
        json.dump({"pid": os.getpid(), "port": ctx.port, "name": _name(ctx)}, f)
    os.replace(path + ".part", path)


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def write_ctx(args, ctx):
    """ps serve until stopped; the others write their ctx and TF_CONFIG, log, and return."""
    server = TFNode.start_cluster_server(ctx)
    logging.getLogger("sparkgrad.test").warning("node %s up on %s", _name(ctx), server.target)
    print(f"stdout line from {_name(ctx)}")
    info = {
        "executor_id": ctx.executor_id,
        "worker_num": ctx.worker_num,
        "job_name": ctx.job_name,
        "task_index": ctx.task_index,
        "cluster_spec": ctx.cluster_spec,
        "num_workers": ctx.num_workers,
        "defaultFS": ctx.defaultFS,
        "working_dir": ctx.working_dir,
        "tf_config": json.loads(os.environ.get("TF_CONFIG", "null")),  # not exported by a node in a driver thread
        "ctx_tf_config": json.loads(ctx.tf_config),
        "ctx_env": dict(ctx.env),
        "test_var": os.environ.get("SPARKGRAD_TEST_VAR"),  # TFCluster.run's env=, exported by a node process
        "thread": threading.current_thread().name,
        "rank": list(dataclasses.astuple(rank.current())),
        "listener_port": server.listener.port,
        "listener_host": server.listener.host,
        "pid": os.getpid(),
        "parent_pid": os.getppid(),
        "grandparent_pid": _parent_of(os.getppid()),  # on Spark: the executor JVM (worker <- daemon <- JVM)
    }
    with open(os.path.join(args["dir"], f"ctx-{ctx.executor_id}.json"), "w") as f:
        json.dump(info, f)
    if ctx.job_name == "ps":
        server.join(WAIT)
        return "ps stopped"
    ctx.metric("loss", 1.0 / (ctx.task_index + 1), step=ctx.task_index)
    return {"task_index": ctx.task_index}


def _wait_then_mark(args, ctx) -> None:
    ctx.wait_for_stop(WAIT)
    _mark(args, ctx, "stopped")


def raise_on_target(args, ctx):
    """The target node raises ValueError; the others wait for the driver's stop."""
    if _name(ctx) == args["target"]:
        raise ValueError(f"boom from {_name(ctx)}")
    _wait_then_mark(args, ctx)


def kill_target(args, ctx):
    """The target node SIGKILLs its own process; the others wait for the driver's stop."""
    _mark(args, ctx, "started")
    if _name(ctx) == args["target"]:
        os.kill(os.getpid(), signal.SIGKILL)
    _wait_then_mark(args, ctx)


def busy_until_interrupted(args, ctx):
    """A training loop that never looks at ctx.should_stop(): the node must be interrupted."""
    _mark(args, ctx, "started")
    n = 0
    while True:
        n += 1
        if n % 5_000_000 == 0:
            _mark(args, ctx, "alive")


def blocked_in_native_wait(args, ctx):
    """Waits in a select() that nothing wakes (as a rank waits in a torch.distributed collective): neither the
    stop signal nor an exception raised in this thread reaches it."""
    _mark(args, ctx, "started")
    never, _keep = os.pipe()
    import select

    select.select([never], [], [])


def blocked_holding_the_gil(args, ctx):
    """Sleeps in libc called through ctypes.PyDLL, which keeps the GIL (as PyTorch's gloo teardown has): no
    other Python thread of the process runs again."""
    import ctypes

    _mark(args, ctx, "started")
    ctypes.PyDLL(None).sleep(3600)


# -- training with parameter servers: a linear softmax classifier in NumPy ------------------

FEATURES, CLASSES = 10, 4
NUM_PARAMS = FEATURES * CLASSES + CLASSES  # W (FEATURES x CLASSES) then b (CLASSES), one flat buffer


def _blobs(rng, n: int):
    import numpy as np

    centers = np.random.default_rng(1234).normal(0.0, 2.0, (CLASSES, FEATURES))
    y = rng.integers(0, CLASSES, n)
    return (centers[y] + rng.normal(0.0, 1.0, (n, FEATURES))).astype("float32"), y


def softmax_loss_grads(params, x, y):
    """Mean cross-entropy of softmax(x W + b) and its gradient as one flat float32 buffer."""
    import numpy as np

    w = params[: FEATURES * CLASSES].reshape(FEATURES, CLASSES)
    b = params[FEATURES * CLASSES :]
    logits = x @ w + b
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
    p[np.arange(len(y)), y] -= 1.0
    p /= len(y)
    return loss, np.concatenate([(x.T @ p).reshape(-1), p.sum(axis=0)]).astype("float32")


def accuracy(params, x, y) -> float:
    w = params[: FEATURES * CLASSES].reshape(FEATURES, CLASSES)
    return float(((x @ w + params[FEATURES * CLASSES :]).argmax(axis=1) == y).mean())


def train_softmax(args, ctx):
    """ps serve the flat buffer; workers pull, compute gradients on their own data, push."""
    import numpy as np

    if ctx.job_name == "ps":
        server = TFNode.start_cluster_server(ctx)
        init = np.zeros(NUM_PARAMS, dtype=np.float32)
        if args.get("optimizer"):
            return server.serve_parameters(NUM_PARAMS, mode=args["mode"], init=init, optimizer=args["optimizer"])
        return server.serve_parameters(NUM_PARAMS, mode=args["mode"], lr=args.get("lr", 0.5), init=init)
    rng = np.random.default_rng(100 + ctx.task_index)
    params = np.zeros(NUM_PARAMS, dtype=np.float32)
    steps = []
    with TFNode.ps_client(ctx, NUM_PARAMS) as ps:
        for i in range(args["steps"]):
            ps.pull(params)
            x, y = _blobs(rng, 64)
            loss, grads = softmax_loss_grads(params, x, y)
            steps.append(ps.push(grads))
            if i % 10 == 0:
                ctx.metric("loss", loss, steps[-1])
        ps.pull(params)
        _, _, optimizer_state = ps.get_state()
    x, y = _blobs(np.random.default_rng(7), 2000)
    return {
        "accuracy": accuracy(params, x, y),
        "steps": steps,
        "worker_id": ps.worker_id,
        "optimizer_state_shards": [s is not None for s in optimizer_state],
    }


def fit_embedding(args, ctx):
    """ps serve a model with a 500-row Embedding table (sync); workers fit it with ps= on their own ids,
    args["sparse"] choosing rows or the whole table on the wire; each returns its final model."""
    import numpy as np
    from sparkgrad.nn import SGD, Dense, Embedding, Flatten, Input, Model

    ids = Input(shape=(3,), dtype="int32", name="ids")
    hidden = Dense(8, activation="relu")(Flatten()(Embedding(500, 4, name="emb")(ids)))
    m = Model(ids, Dense(2)(hidden), seed=5)
    m.compile(optimizer=SGD(0.2), loss="mse")
    if ctx.job_name == "ps":
        return TFNode.start_cluster_server(ctx).serve_parameters(m, mode="sync")
    rng = np.random.default_rng(20 + ctx.task_index)
    x = rng.integers(0, 500, (160, 3)).astype(np.int32)
    y = np.stack([np.sin(x.sum(1) / 90.0), np.cos(x[:, 0] / 70.0)], 1).astype(np.float32)
    with TFNode.ps_client(ctx, m, sparse=args["sparse"]) as ps:
        h = m.fit(x[:128], y[:128], batch_size=16, epochs=2, shuffle=False, verbose=0, ps=ps,
                  validation_data=(x[128:], y[128:]))  # fmt: skip
    return {
        "params": m.params.tolist(),
        "chief": ps.is_chief,
        "sparse_rows": ps.sparse_rows,
        "val_loss": h.history["val_loss"],
        "bytes": sum(ps.bytes),
        "step": m.step,
    }


def train_from_feed(args, ctx):
    """InputMode.SPARK: workers train from DataFeed batches (rows: (features, label)) with a sync ps.

    args["columns"]: the (features, label) column names, "0" and "1" for an RDD of tuples.
    """
    import numpy as np

    xname, yname = args.get("columns", ("0", "1"))

    if ctx.job_name == "ps":
        server = TFNode.start_cluster_server(ctx)
        return server.serve_parameters(NUM_PARAMS, mode="sync", lr=0.5, init=np.zeros(NUM_PARAMS, np.float32))
    feed = TFNode.DataFeed(ctx.mgr, timeout=60)
    params = np.zeros(NUM_PARAMS, dtype=np.float32)
    rows, label_sum, steps = 0, 0, 0
    with TFNode.ps_client(ctx, NUM_PARAMS) as ps:
        while not feed.should_stop():
            if ctx.task_index == 0:  # TensorFlowOnSpark style: a list of row tuples
                batch = feed.next_batch(50)
                if not batch:
                    continue
                x = np.array([r[0] for r in batch], dtype=np.float32)
                y = np.array([r[1] for r in batch])
            else:  # column arrays, no per-row copies
                cols = feed.next_batch_columns(50)
                if not cols or len(cols[yname]) == 0:
                    continue
                x, y = cols[xname], cols[yname]
            rows += len(y)
            label_sum += int(y.sum())
            ps.pull(params)
            _, grads = softmax_loss_grads(params, x, y)
            steps = ps.push(grads)
        ps.pull(params)
    x, y = _blobs(np.random.default_rng(7), 2000)
    return {
        "rows": rows,
        "label_sum": label_sum,
        "accuracy": accuracy(params, x, y),
        "last_step": steps,
        "security": ctx.security,
    }


def infer_from_feed(args, ctx):
    """InputMode.SPARK inference: rows (id, features); the result of a row is 3 * id + 1.

    args["columns"]: the (id, features) column names, "0" and "1" for an RDD of tuples.
    """
    import numpy as np

    idname, xname = args.get("columns", ("0", "1"))

    if ctx.job_name == "ps":
        TFNode.start_cluster_server(ctx).join(WAIT)
        return "ps stopped"
    feed = TFNode.DataFeed(ctx.mgr, train_mode=False, timeout=60)
    rows = 0
    while not feed.should_stop():
        cols = feed.next_batch_columns(37)
        if not cols or len(cols[idname]) == 0:
            continue
        rows += len(cols[idname])
        feed.batch_results(cols[idname] * 3 + 1 + 0 * np.asarray(cols[xname]).sum(axis=1).astype(np.int64))
    return {"rows": rows}


def exit_with(args, ctx):
    """map_fun that ends with sys.exit(code) on the target node (TensorFlowOnSpark users do this)."""
    import sys

    if _name(ctx) == args["target"]:
        sys.exit(args["code"])
    return "returned"


def freeze_target(args, ctx):
    """The target node stops its own process (SIGSTOP: alive, but silent); the others wait for stop."""
    _mark(args, ctx, "started")
    if _name(ctx) == args["target"]:
        os.kill(os.getpid(), signal.SIGSTOP)
    _wait_then_mark(args, ctx)


def fit_with_mlflow(args, ctx):
    """Every node (a ps too) fits a small model with ``mlflow=True`` (the tracking URI comes from
    the environment): only the chief may log, and no other node may even import mlflow."""
    import sys

    import numpy as np
    from sparkgrad.nn import Dense, Sequential

    x, y = _blobs(np.random.default_rng(ctx.task_index), 256)
    model = Sequential([Dense(CLASSES, input_shape=(FEATURES,))], seed=1)
    model.compile(optimizer="sgd")
    model.fit(x, y, batch_size=32, epochs=2, log_every=4, verbose=0, mlflow=True)
    return {
        "role": ctx.job_name,
        "rank": rank.current().rank,
        "step": model.step,
        "mlflow_imported": "mlflow" in sys.modules,
    }
