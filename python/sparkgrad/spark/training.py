"""What each node of an Estimator.fit cluster runs (no pyspark import: this is the nodes' code).

The Estimator starts a TFCluster in InputMode.SPARK and feeds it the
DataFrame (Arrow feeding; the feeding tasks already made each frame the
model's inputs and ``y``, see sparkgrad.spark.columns.FeatureSpec, whose
``from_wire`` makes the model's x again here: one array, or a dict by input
name with string inputs as StringColumns). Every
node builds the model from the saved-model bytes in ``TrainArgs``:

- mode "ps": ps nodes serve the parameters (the optimizer runs there,
  asynchronously); workers call ``fit(ps=TFNode.ps_client(ctx, model))``;
  the chief (worker 0) ends with the final parameters;
- mode "allreduce": every worker calls ``hvd.init()`` and fits with a
  DistributedOptimizer (gradients averaged every step; rank 0's initial
  weights broadcast first). Spark splits rows unevenly, so before each
  step the workers agree (a one-value allreduce, min) whether every one of
  them still has a batch; when one has none, all stop at the same step and
  the others drop what is left of their input (at most the difference
  between partitions, which the Estimator keeps to a row by repartitioning
  round-robin).

Every node compiles the model with the Estimator's loss and metrics (any
loss of sparkgrad.nn.losses: classifiers, binary classifiers, regressions).
The chief returns the trained model's bytes and its epoch logs through
Spark's task results (keep_results), never through sparkgrad's sockets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, eq=False)
class TrainArgs:
    model_bytes: bytes
    optimizer: tuple[str, dict]  # (kind, config): rebuilt on each node (a bound C optimizer does not pickle)
    loss: dict  # sparkgrad.nn.losses.serialize's form: the loss with its arguments
    metrics: tuple[dict, ...]  # sparkgrad.nn.metrics.serialize's forms
    batch_size: int
    mode: str  # "allreduce" | "ps"
    checkpoint_dir: str | None
    checkpoint_every: int
    feed_timeout: float
    features: Any  # sparkgrad.spark.columns.FeatureSpec: turns a fed batch back into the model's x


def build_optimizer(spec: tuple[str, dict]) -> Any:
    from sparkgrad.nn.optimizers import _BY_NAME

    kind, config = spec
    cls = _BY_NAME[kind]
    opt = cls.__new__(cls)
    opt.config = dict(config)
    opt._c = None
    return opt


def optimizer_spec(optimizer: Any) -> tuple[str, dict]:
    from sparkgrad.nn.optimizers import get

    opt = get(optimizer)
    return opt.kind, dict(opt.config)


def _feed_batches(feed: Any, features: Any, batch_size: int, counter: list[int], agree: Any) -> Any:
    """``(x, y)`` batches from the DataFeed (x as ``features.from_wire`` makes it: one array, or a dict by
    input name); ``agree(has_batch) -> bool`` (allreduce) or None (ps)."""
    while True:
        cols = feed.next_batch_columns(batch_size)
        n = len(cols["y"]) if cols else 0
        if agree is not None:
            if not agree(n > 0):
                if not feed.should_stop():
                    feed.terminate()  # another worker ran out: drop the rest so the feeding tasks finish
                return
        elif n == 0:
            if feed.should_stop():
                return
            continue
        counter[0] += n
        yield features.from_wire(cols), cols["y"]


def _fit_options(args: TrainArgs) -> dict:
    opts: dict = {"verbose": 0, "epochs": 1, "prefetch": 0}
    if args.checkpoint_dir:
        opts.update(checkpoint_dir=args.checkpoint_dir, resume=False)
        if args.checkpoint_every:
            opts["checkpoint_every"] = int(args.checkpoint_every)
    return opts


def node_main(args: TrainArgs, ctx: Any) -> Any:
    """map_fun of every node: see the module doc."""
    from sparkgrad import TFNode
    from sparkgrad.nn.saved import model_from_bytes, model_to_bytes

    model = model_from_bytes(args.model_bytes, "Estimator model")
    optimizer = build_optimizer(args.optimizer)
    rows = [0]
    if args.mode == "ps":
        server = TFNode.start_cluster_server(ctx)
        model.compile(optimizer=optimizer, loss=args.loss, metrics=list(args.metrics))
        if ctx.job_name == "ps":
            server.serve_parameters(model, mode="async")
            return None
        feed = TFNode.DataFeed(ctx.mgr, timeout=args.feed_timeout)
        chief = ctx.worker_rank == 0
        with TFNode.ps_client(ctx, model) as ps:
            batches = _feed_batches(feed, args.features, args.batch_size, rows, None)
            history = model.fit(batches, ps=ps, **_fit_options(args))
    else:
        import sparkgrad.hvd as hvd
        from sparkgrad.nn import DistributedOptimizer

        hvd.init()
        chief = hvd.rank() == 0
        model.compile(optimizer=DistributedOptimizer(optimizer), loss=args.loss, metrics=list(args.metrics))
        feed = TFNode.DataFeed(ctx.mgr, timeout=args.feed_timeout)

        def agree(has_batch: bool) -> bool:
            return bool(hvd.allreduce(np.array([1.0 if has_batch else 0.0], np.float32), op=hvd.Min)[0] > 0)

        history = model.fit(
            _feed_batches(feed, args.features, args.batch_size, rows, agree),
            callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
            **_fit_options(args),
        )
    logs = {k: float(v[-1]) for k, v in history.history.items() if v}
    result = {"rank": int(ctx.worker_rank), "rows": rows[0], "steps": int(model.step), "logs": logs}
    if chief:
        result["model"] = model_to_bytes(model)
    return result
