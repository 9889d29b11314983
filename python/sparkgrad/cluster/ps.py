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
through the client inside the C loop (see sparkgrad.nn.training). A model's
Embedding tables travel as rows: shards split between whole rows, a step
pushes the rows it touched and a forward pulls the rows it reads
(``ps_client(ctx, model, sparse=False)`` sends the tables whole instead). By hand,
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


def _tables_of(model_or_total: Any) -> list[tuple[int, int, int]]:
    """A sparkgrad.nn model's Embedding tables as ``(offset, rows, dim)``; none for a parameter count."""
    touched = getattr(model_or_total, "touched_rows", None)
    if touched is None or isinstance(model_or_total, (int, np.integer)):
        return []
    return [(int(off), int(rows), int(dim)) for off, rows, dim, _ in touched()]


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
    """Serves this ps node's shard of the flat parameter buffer until the training ends; call it in ``map_fun``.

    The buffer of ``total`` float32 values is split into contiguous shards, one per ps. Training
    nodes reach every shard through a `ParameterClient`; the shard applies their gradients with the
    optimizer, whose state lives on the ps.

    ```python
    if ctx.job_name == "ps":
        TFNode.serve_parameters(ctx, model, mode="sync")  # model compiled as the workers compile it
    else:
        model.fit(dataset, ps=TFNode.ps_client(ctx, model))
    ```

    Args:
        ctx: The node's context (a ps node).
        total: A compiled sparkgrad.nn model (its size, its Embedding tables, whose rows the shard then
            takes sparse, and its compile's optimizer with its learning rate and schedule, which then runs
            on the ps) or the number of parameters.
        mode: ``"async"``: each gradient is applied as it arrives (the global step counts pushes);
            ``"sync"``: each step averages exactly one gradient per active worker, then applies it. A
            worker that disconnects without ``done()`` fails the step for everyone rather than hanging it.
        lr: With a parameter count: plain SGD's learning rate (default 0.01).
        init: The whole flat buffer, to seed the shard; otherwise the chief's ``init`` (fit does it) does.
        timeout: Seconds to serve at most; None: until done or stopped.
        optimizer: With a parameter count: a name, a sparkgrad.nn optimizer or a config dict, instead of
            plain SGD.

    Returns:
        ``"done"`` (every training node called ``done()``), ``"stopped"`` (the driver stopped the
        cluster) or ``"timeout"``.

    Raises:
        ClusterError: Not a ps node, or a model that is not compiled.
    """
    if ctx.job_name != PS:
        raise ClusterError(f"serve_parameters runs on ps nodes; this is {ctx.job_name}:{ctx.task_index}")
    tables = _tables_of(total)
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
    offset, count = core.ps_shard_range(int(total), num_ps, ctx.task_index, tables=tables)
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
        tables=tables,
        **update,
    )
    unhook = ctx.on_stop(server.stop)  # the driver's stop ends serve() at once
    try:
        return server.serve(timeout)
    finally:
        unhook()


class ParameterClient:
    """A training node's connection to every ps shard; a context manager that says `done` on a clean exit.

    Pass it to ``model.fit(..., ps=client)`` (`TFNode.ps_client` builds it): fit initialises the
    servers from the chief (worker 0), runs every step through `grad_hook` in the C loop and says
    `done` at the end. By hand, with a parameter count: ``ps.init(params); step = ps.pull(params);
    step = ps.push_pull(grads, params); ...``.

    Args:
        ctx: The node's context (a training node).
        total: A sparkgrad.nn model or its number of parameters.
        timeout: Seconds to connect and to wait for each answer.
        compression: ``"bf16"`` sends the gradients as bf16 (half the bytes; the shards widen them to
            float32 before they apply or average them); None sends float32. Parameters always come back
            as float32.
        sparse: With a model that has Embedding tables: fit's steps push the rows a step touched and
            pull the rows a forward reads (a table of a million rows trains at the speed of the rows it
            uses); False sends the tables whole, as any other parameters.

    Attributes:
        total (int): The number of parameters.
        worker_id (int): This node's rank among the training nodes (0 is the chief).
        sparse_rows (bool): Whether fit's steps carry the Embedding tables as rows.

    Raises:
        ClusterError: The cluster has no ps nodes, or this is not a training node.
    """

    def __init__(
        self,
        ctx: NodeContext,
        total: Any,
        timeout: float = 60.0,
        compression: str | None = None,
        sparse: bool = True,
    ) -> None:
        addresses = [(n.host, n.port) for n in ctx.nodes_of(PS)]
        if not addresses:
            raise ClusterError("the cluster has no ps nodes (num_ps=0): nothing to pull parameters from")
        self.total = _total_of(total)
        self.worker_id = worker_rank(ctx)
        self._num_ps = len(addresses)
        self._tables = _tables_of(total)
        self.sparse_rows = bool(sparse and self._tables)
        self._client = net().PsClient(
            addresses,
            ctx.secret,
            self.total,
            self.worker_id,
            timeout,
            compression,
            security=ctx.security,
            tables=self._tables,
        )
        self._done = False

    def init(self, params: np.ndarray) -> bool:
        """Sets the servers' parameters from the flat float32 ``params`` unless a worker already did.

        Returns True if this call set them.
        """
        return self._client.init(params)

    def pull(self, params: np.ndarray) -> int:
        """Fills the flat float32 ``params`` in place with the servers' parameters; returns the global step."""
        return self._client.pull(params)

    def push(self, grads: np.ndarray) -> int:
        """Sends the flat gradient to the shards; returns the global step after the update."""
        return self._client.push(grads)

    def push_pull(self, grads: np.ndarray, params: np.ndarray) -> int:
        """Pushes ``grads``, then fills ``params`` with the updated parameters; returns the global step."""
        return self._client.push_pull(grads, params)

    def wait_for_workers(self, params: np.ndarray, timeout: float = 600.0) -> int:
        """Waits until every other training node said done, then fills ``params``; returns the global step.

        How the chief takes its last checkpoint and evaluates the finished model.

        Raises:
            SparkgradTimeout: The others did not finish within ``timeout`` seconds.
        """
        return self._client.wait_others(params, float(timeout))

    def get_state(self) -> tuple[np.ndarray, int, list[Any]]:
        """``(params, step, optimizer_state)`` for a checkpoint.

        Every shard's parameters as one flat array, the global step, and per shard
        ``(optimizer_step, slots)`` or None (no optimizer state).
        """
        return self._client.get_state()

    def set_state(self, params: np.ndarray, step: int, optimizer_state: Any = None) -> None:
        """Restores a checkpoint into every shard.

        ``optimizer_state`` as `get_state` returns it; None leaves the shards' optimizers as they are.
        """
        self._client.set_state(params, step, optimizer_state)

    def put_state(self, state: np.ndarray) -> int:
        """Puts this worker's model state on the servers, replacing the one it put before.

        Model state is what a model keeps besides its trainable parameters (BatchNormalization's moving
        mean and variance): each worker updates its own while it trains, and `mean_state` reads the
        average over the workers, as Keras' MirroredStrategy reads its SyncOnRead variables. It is small
        and lives on the first ps alone.

        Args:
            state: The flat float32 state (1-D, C-contiguous); the same size on every worker.

        Returns:
            How many workers' states the servers hold, this one's included.

        Raises:
            ClusterError: Another worker put a state of another size (the message names both).
        """
        return self._client.put_state(state)

    def mean_state(self, state: np.ndarray) -> int:
        """Fills ``state`` in place with the elementwise mean of the model states the workers put.

        How the chief reads the model state for a checkpoint or the final model (see `put_state`).

        Args:
            state: A writable flat float32 array (1-D, C-contiguous) of the size the workers put.

        Returns:
            How many workers' states were averaged; 0 when none put any yet, ``state`` then left as it is.

        Raises:
            ClusterError: ``state`` is not the size the workers put (the message names both).
        """
        return self._client.mean_state(state)

    def _shard_ranges(self) -> list[tuple[int, int]]:
        core = net()
        return [core.ps_shard_range(self.total, self._num_ps, i, tables=self._tables) for i in range(self._num_ps)]

    def optimizer_state(self) -> tuple[int, np.ndarray] | None:
        """The servers' optimizer state as one optimizer over the whole model holds it, for the chief's checkpoint.

        ``(steps, slots)``: the slots ``[slots, total]`` float32, flattened. None when the servers keep
        none (plain SGD).
        """
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
        """`optimizer_state`'s layout split back into one entry per shard, for `set_state`.

        None when ``state`` holds nothing (a checkpoint of plain SGD).
        """
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
        """Whether this node is worker 0, which initialises the servers and writes checkpoints."""
        return self.worker_id == 0

    def grad_hook(self) -> object:
        """The C training loop's gradient hook (a sparkgrad._core.NnGradHook capsule): push_pull per step.

        With `sparse_rows` the Embedding tables travel as rows, and the model's local tables are current
        only in the rows its forwards read: `pull` the whole buffer before reading it (fit does)."""
        return self._client.grad_hook(sparse=self.sparse_rows)

    @property
    def bytes(self) -> tuple[int, int]:
        """``(sent, received)``: bytes on every shard connection so far (frame headers and payloads)."""
        return self._client.bytes

    def done(self) -> None:
        """Tells the servers this worker will push no more (once; later calls do nothing)."""
        if not self._done:
            self._done = True
            self._client.done()

    def close(self) -> None:
        """Closes the connections."""
        self._client.close()

    def __enter__(self) -> ParameterClient:
        return self

    def __exit__(self, exc_type: Any, *rest: object) -> None:
        try:
            if exc_type is None:
                self.done()
        finally:
            self.close()
