"""Parameter servers and their clients for map_fun, on the C parameter server.

The flat float32 parameter buffer of ``total`` values is split into contiguous
shards, one per ps (``_core.ps_shard_range``). A ps node serves its shard on
the listening socket it registered (ctx.listener) until every training node
said done (or the driver says stop); training nodes reach every shard through
one PsClient whose worker id is their rank among the training nodes.

    if ctx.job_name == "ps":
        TFNode.start_cluster_server(ctx).serve_parameters(total, mode="sync", lr=0.07)
    else:
        with TFNode.ps_client(ctx, total) as ps:
            ps.init(params); step = ps.pull(params); ps.push(grads); ...

What it does not do: define a model or an optimizer other than the ps's SGD.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparkgrad.cluster.context import NodeContext
from sparkgrad.cluster.roles import PS, TRAINING_ROLES
from sparkgrad.cluster.transport import net
from sparkgrad.errors import ClusterError


def worker_rank(ctx: NodeContext) -> int:
    """This node's rank among the training nodes (chief/master first, then workers), 0-based."""
    training = sorted((n for n in ctx.nodes if n.role in TRAINING_ROLES), key=lambda n: n.executor_id)
    for rank, node in enumerate(training):
        if node.executor_id == ctx.executor_id:
            return rank
    raise ClusterError(f"{ctx.job_name}:{ctx.task_index} is not a training node (chief, master or worker)")


def serve_parameters(
    ctx: NodeContext,
    total: int,
    mode: str = "async",
    lr: float | None = 0.01,
    init: np.ndarray | None = None,
    timeout: float | None = None,
    optimizer: Any = None,
) -> str:
    """Serves this ps node's shard of ``total`` parameters; returns "done", "stopped" or "timeout".

    "done": every training node called done(); "stopped": the driver stopped
    the cluster. ``init`` (the whole flat buffer) seeds the shard; otherwise
    the first worker's PsClient.init() does. ``optimizer`` (a name, a
    sparkgrad.nn optimizer or a config dict) replaces plain SGD with ``lr``;
    its state then lives on the ps.
    """
    if ctx.job_name != PS:
        raise ClusterError(f"serve_parameters runs on ps nodes; this is {ctx.job_name}:{ctx.task_index}")
    core = net()
    num_ps = len(ctx.cluster_spec.get(PS, ()))
    offset, count = core.ps_shard_range(int(total), num_ps, ctx.task_index)
    params = None
    if init is not None:
        flat = np.ascontiguousarray(init, dtype=np.float32).reshape(-1)
        params = flat[offset : offset + count].copy()
    update: dict[str, Any] = {"optimizer": optimizer} if optimizer is not None else {"lr": float(lr or 0.01)}
    server = core.PsServer(
        ctx.listener, ctx.secret, offset, count, int(total), ctx.num_workers, mode=mode, params=params, **update
    )
    unhook = ctx.on_stop(server.stop)  # the driver's stop ends serve() at once
    try:
        return server.serve(timeout)
    finally:
        unhook()


class ParameterClient:
    """A training node's connection to every ps shard (a context manager that says done() on exit)."""

    def __init__(self, ctx: NodeContext, total: int, timeout: float = 60.0) -> None:
        addresses = [(n.host, n.port) for n in ctx.nodes_of(PS)]
        if not addresses:
            raise ClusterError("the cluster has no ps nodes (num_ps=0): nothing to pull parameters from")
        self.total = int(total)
        self.worker_id = worker_rank(ctx)
        self._client = net().PsClient(addresses, ctx.secret, self.total, self.worker_id, timeout)
        self._done = False

    def init(self, params: np.ndarray) -> bool:
        return self._client.init(params)

    def pull(self, params: np.ndarray) -> int:
        return self._client.pull(params)

    def push(self, grads: np.ndarray) -> int:
        return self._client.push(grads)

    def push_pull(self, grads: np.ndarray, params: np.ndarray) -> int:
        return self._client.push_pull(grads, params)

    def wait_for_workers(self, params: np.ndarray, timeout: float = 600.0) -> int:
        """Waits until every other training node said done, then fills ``params``
        with the final parameters and returns the global step: how the chief
        takes its last checkpoint and evaluates the finished model.
        Raises SparkgradTimeout after ``timeout`` seconds."""
        return self._client.wait_others(params, float(timeout))

    def get_state(self) -> tuple[np.ndarray, int, list[Any]]:
        """(params, step, optimizer state per shard) for a checkpoint."""
        return self._client.get_state()

    def set_state(self, params: np.ndarray, step: int, optimizer_state: Any = None) -> None:
        """Restores a checkpoint into every shard."""
        self._client.set_state(params, step, optimizer_state)

    def done(self) -> None:
        if not self._done:
            self._done = True
            self._client.done()

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ParameterClient:
        return self

    def __exit__(self, exc_type: Any, *rest: object) -> None:
        try:
            if exc_type is None:
                self.done()
        finally:
            self.close()
