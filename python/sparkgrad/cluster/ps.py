"""Parameter servers and their clients for map_fun, on the C parameter server.

The flat float32 parameter buffer of ``total`` values is split into contiguous
shards, one per ps (``_core.ps_shard_range``). A ps node serves its shard on
the listening socket it registered (ctx.listener) until every training node
said done (or the driver says stop); training nodes reach every shard through
one PsClient whose worker id is their rank among the training nodes.

    model.compile(optimizer=SGD(0.07), ...)
    if ctx.job_name == "ps":
        TFNode.start_cluster_server(ctx).serve_parameters(model, mode="sync")
    else:
        model.fit(dataset, ps=TFNode.ps_client(ctx, model))

``serve_parameters(model)`` takes the size and the optimizer (kind, learning
rate, schedule) from the model's compile; ``fit(ps=...)`` runs every step
through the client inside the C loop (see sparkgrad.nn.training). By hand,
with a total: ``ps.init(params); step = ps.pull(params); ps.push_pull(grads,
params); ...``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparkgrad.cluster.context import NodeContext
from sparkgrad.cluster.roles import PS
from sparkgrad.cluster.transport import net
from sparkgrad.errors import ClusterError


def worker_rank(ctx: NodeContext) -> int:
    """This node's rank among the training nodes (ctx.worker_rank); ClusterError on other nodes."""
    rank = ctx.worker_rank
    if rank is None:
        raise ClusterError(f"{ctx.job_name}:{ctx.task_index} is not a training node (chief, master or worker)")
    return rank


def _total_of(model_or_total: Any) -> int:
    """The parameter count of a sparkgrad.nn model, or the int given."""
    if isinstance(model_or_total, (int, np.integer)):
        return int(model_or_total)
    if hasattr(model_or_total, "num_params") and hasattr(model_or_total, "params"):
        return int(model_or_total.num_params)
    raise ClusterError(f"expected a sparkgrad.nn model or a parameter count, not {type(model_or_total).__name__}")


def serve_parameters(
    ctx: NodeContext,
    total: Any,
    mode: str = "async",
    lr: float | None = None,
    init: np.ndarray | None = None,
    timeout: float | None = None,
    optimizer: Any = None,
) -> str:
    """Serves this ps node's shard of the parameters; returns "done", "stopped" or "timeout".

    ``total``: a compiled sparkgrad.nn model (its size and its compile's
    optimizer, learning rate included, which then runs on the ps with its
    state) or the number of parameters (plain SGD with ``lr``, default 0.01,
    unless ``optimizer``: a name, a sparkgrad.nn optimizer or a config dict).
    "done": every training node called done(); "stopped": the driver stopped
    the cluster. ``init`` (the whole flat buffer) seeds the shard; otherwise
    the chief's init (fit(ps=...) does it) does.
    """
    if ctx.job_name != PS:
        raise ClusterError(f"serve_parameters runs on ps nodes; this is {ctx.job_name}:{ctx.task_index}")
    if not isinstance(total, (int, np.integer)):
        model = total
        total = _total_of(model)
        if optimizer is None and lr is None:
            if getattr(model, "optimizer", None) is None:
                raise ClusterError(
                    "serve_parameters(model): compile the model first; the ps applies its compile's optimizer"
                )
            optimizer = getattr(model.optimizer, "optimizer", model.optimizer)  # a DistributedOptimizer's inner
    if optimizer is None and lr is None:
        lr = 0.01
    core = net()
    num_ps = len(ctx.cluster_spec.get(PS, ()))
    offset, count = core.ps_shard_range(int(total), num_ps, ctx.task_index)
    params = None
    if init is not None:
        flat = np.ascontiguousarray(init, dtype=np.float32).reshape(-1)
        params = flat[offset : offset + count].copy()
    update: dict[str, Any] = {"optimizer": optimizer} if optimizer is not None else {"lr": float(lr)}
    server = core.PsServer(
        ctx.listener,
        ctx.secret,
        offset,
        count,
        int(total),
        ctx.num_workers,
        mode=mode,
        params=params,
        security=ctx.security,
        **update,
    )
    unhook = ctx.on_stop(server.stop)  # the driver's stop ends serve() at once
    try:
        return server.serve(timeout)
    finally:
        unhook()


class ParameterClient:
    """A training node's connection to every ps shard (a context manager that says done() on exit).

    ``total``: a sparkgrad.nn model or its number of parameters. Pass the
    client to ``model.fit(..., ps=client)``: fit initialises the servers from
    the chief (worker_id 0), runs every step through ``grad_hook()`` in the C
    loop and says done() at the end. ``compression="bf16"`` sends the
    gradients as bf16 (half the bytes; the shards widen them to float32 before
    they apply or average them); parameters always come back as float32.
    """

    def __init__(self, ctx: NodeContext, total: Any, timeout: float = 60.0, compression: str | None = None) -> None:
        addresses = [(n.host, n.port) for n in ctx.nodes_of(PS)]
        if not addresses:
            raise ClusterError("the cluster has no ps nodes (num_ps=0): nothing to pull parameters from")
        self.total = _total_of(total)
        self.worker_id = worker_rank(ctx)
        self._num_ps = len(addresses)
        self._client = net().PsClient(
            addresses, ctx.secret, self.total, self.worker_id, timeout, compression, security=ctx.security
        )
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

    def _shard_ranges(self) -> list[tuple[int, int]]:
        core = net()
        return [core.ps_shard_range(self.total, self._num_ps, i) for i in range(self._num_ps)]

    def optimizer_state(self) -> tuple[int, np.ndarray] | None:
        """The servers' optimizer state as one optimizer over the whole model holds it ([slots, total]
        float32, flat) with its step count, for the chief's checkpoint; None when the servers keep none
        (plain SGD)."""
        _, _, shards = self._client.get_state()
        if not shards or any(s is None for s in shards):
            return None
        sizes = sum(int(np.asarray(s[1]).size) for s in shards)
        if self.total == 0 or sizes == 0 or sizes % self.total:
            return None
        slots = sizes // self.total
        full = np.empty((slots, self.total), np.float32)
        for (offset, count), (_, state) in zip(self._shard_ranges(), shards, strict=True):
            full[:, offset : offset + count] = np.asarray(state, np.float32).reshape(slots, count)
        return int(shards[0][0]), full.reshape(-1)

    def shard_optimizer_state(self, steps: int, state: np.ndarray) -> list[tuple[int, np.ndarray]] | None:
        """``optimizer_state()``'s layout split back into one entry per shard (for set_state); None when
        ``state`` holds nothing (a checkpoint of plain SGD)."""
        state = np.asarray(state, np.float32).reshape(-1)
        if self.total == 0 or state.size == 0 or state.size % self.total:
            return None
        full = state.reshape(state.size // self.total, self.total)
        return [
            (int(steps), np.ascontiguousarray(full[:, offset : offset + count]).reshape(-1))
            for offset, count in self._shard_ranges()
        ]

    @property
    def is_chief(self) -> bool:
        return self.worker_id == 0

    def grad_hook(self) -> object:
        """The C training loop's gradient hook (a sparkgrad._core.NnGradHook capsule): push_pull per step."""
        return self._client.grad_hook()

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
