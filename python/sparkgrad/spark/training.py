"""What each node of an Estimator.fit cluster runs (no pyspark import: this is the nodes' code).

The Estimator starts a TFCluster in InputMode.TENSORFLOW: one barrier task
per node, no feeding tasks. Each worker reads its own shard of the training
table's Parquet files with `sparkgrad.data.ParquetDataset` (equal shards,
row groups shuffled per epoch plus a seeded shuffle buffer, each column's
null policy) and makes each batch the model's x and y with the Estimator's
`sparkgrad.spark.columns.FeatureSpec` (the checks and messages Model.transform
uses). Every node builds the model from the saved-model bytes in ``TrainArgs``:

- mode "ps": ps nodes serve the parameters (the optimizer runs there,
  asynchronously); workers call ``fit(ps=TFNode.ps_client(ctx, model))``;
  the chief (worker 0) ends with the final parameters;
- mode "allreduce": every worker calls ``hvd.init()`` and fits with a
  DistributedOptimizer (gradients averaged every step; rank 0's initial
  weights broadcast first). The shards are equal, so every worker takes the
  same number of steps per epoch; only when a column skips rows with nulls
  (``nulls="skip"``), which can leave shards unequal, do the workers agree
  before each step (a one-value allreduce, min) whether each still has a
  batch, and all end the epoch at the same step.

Every node compiles the model with the Estimator's loss and metrics (any
loss of sparkgrad.nn.losses: classifiers, binary classifiers, regressions).
The chief returns the trained model's bytes and its epoch logs through
Spark's task results (keep_results), never through sparkgrad's sockets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkgrad.errors import InvalidArgumentError

LENGTHS = "\0lengths:"  # batch key prefix of an array column's row lengths (no column has such a name)


@dataclass(frozen=True)
class TableRead:
    """Where a worker reads the training rows and how; picklable."""

    files: tuple[str, ...]  # Parquet files every executor can open
    nulls: tuple[tuple[str, object], ...]  # (column, "error" | "skip" | fill value), for the columns not "error"
    widths: tuple[tuple[str, int], ...]  # (array column, values per row): columns.list_widths
    shuffle_buffer: int  # rows per worker; 0: the files' order
    seed: int
    workers: int  # shards

    def dataset(self, features: Any, batch_size: int, shard: int) -> Any:
        """Shard ``shard``'s `ParquetDataset` of the columns ``features`` (a FeatureSpec) reads, one epoch per
        iteration; integer id inputs are read as exact int64, the rest as float32 or strings."""
        from sparkgrad.data.table import Column, ParquetDataset

        ids = {c for inp in features.inputs if inp.dtype in ("int32", "int64") for c in inp.columns}
        widths = dict(self.widths)

        def column(c: str) -> Column:
            # an array's lengths come beside it (LENGTHS + name): TableBatches refuses a short row
            if c in widths:
                return Column(c, width=widths[c], lengths=LENGTHS + c, dtype="int64" if c in ids else None)
            return Column(c, dtype="int64" if c in ids else None)

        label = features.label
        return ParquetDataset(
            list(self.files),
            {c: column(c) for c in features.features if c != label},
            batch_size,
            label=None if label is None else column(label),
            shuffle_buffer=self.shuffle_buffer,
            seed=self.seed,
            shard_index=shard,
            num_shards=self.workers,
            nulls=dict(self.nulls),
        )

    @property
    def skips(self) -> bool:
        return any(policy == "skip" for _, policy in self.nulls)


@dataclass(frozen=True, eq=False)
class TrainArgs:
    model_bytes: bytes
    optimizer: tuple[str, dict]  # (kind, config): rebuilt on each node (a bound C optimizer does not pickle)
    loss: dict  # sparkgrad.nn.losses.serialize's form: the loss with its arguments
    metrics: tuple[dict, ...]  # sparkgrad.nn.metrics.serialize's forms
    batch_size: int
    epochs: int
    mode: str  # "allreduce" | "ps"
    checkpoint_dir: str | None
    checkpoint_every: int
    features: Any  # sparkgrad.spark.columns.FeatureSpec: a table batch -> the model's x and y
    table: TableRead


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


class TableBatches:
    """``(x, y)`` batches of one worker's shard, the next epoch at each ``iter()`` (what fit re-iterates).

    ``agree(has_batch) -> bool`` (allreduce with rows skipped for nulls) or None. ``rows`` counts the rows
    trained. A batch the FeatureSpec refuses raises its error, prefixed with the worker and epoch.
    """

    def __init__(self, dataset: Any, features: Any, rank: int, agree: Callable[[bool], bool] | None):
        self.dataset, self.features, self.rank, self.agree = dataset, features, rank, agree
        self.rows = 0
        self._epoch = 0

    def __iter__(self) -> Iterator[tuple[Any, np.ndarray]]:
        epoch, self._epoch = self._epoch, self._epoch + 1
        first = 0
        for batch in self.dataset:
            if self.agree is not None and not self.agree(True):
                return  # another worker's shard ended: all end the epoch at this step
            where = f"worker {self.rank}, epoch {epoch}, rows from {first} of its shard: "
            try:
                self._check_lengths(batch, first)
                x, y = self.features.x(batch, None, first), self.features.y(batch, None, first)
                if not isinstance(x, (np.ndarray, dict)):  # one string input: fit takes its StringColumn by name
                    x = {self.features.inputs[0].name: x}
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(where + str(exc), **exc.details) from None
            first += len(y)
            self.rows += len(y)
            yield x, y
        if self.agree is not None:
            self.agree(False)

    def _check_lengths(self, batch: dict, first: int) -> None:
        """Refuses an array row shorter than its width (the reader pads it); a null filled (length 0) passes."""
        for key in [k for k in batch if k.startswith(LENGTHS)]:
            lengths = batch.pop(key)
            column, width = key[len(LENGTHS) :], batch[key[len(LENGTHS) :]].shape[1]
            short = np.flatnonzero((lengths != width) & (lengths != 0))
            if short.size:
                r = int(short[0])
                raise InvalidArgumentError(
                    f"row {first + r}: column {column!r} holds {int(lengths[r])} values; its input takes {width}",
                    column=column,
                )


def _fit_options(args: TrainArgs, agree: bool) -> dict:
    # agreeing is an allreduce: it must run in fit's own thread, in step with the gradients' (no prefetch)
    opts: dict = {"verbose": 0, "epochs": args.epochs, "prefetch": 0 if agree else 2}
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
    if args.mode == "ps":
        server = TFNode.start_cluster_server(ctx)
        model.compile(optimizer=optimizer, loss=args.loss, metrics=list(args.metrics))
        if ctx.job_name == "ps":
            server.serve_parameters(model, mode="async")
            return None
        rank = int(ctx.worker_rank)
        batches = TableBatches(args.table.dataset(args.features, args.batch_size, rank), args.features, rank, None)
        with TFNode.ps_client(ctx, model) as ps:
            history = model.fit(batches, ps=ps, **_fit_options(args, False))
    else:
        import sparkgrad.hvd as hvd
        from sparkgrad.nn import DistributedOptimizer

        hvd.init()
        rank = hvd.rank()
        model.compile(optimizer=DistributedOptimizer(optimizer), loss=args.loss, metrics=list(args.metrics))

        def agree(has_batch: bool) -> bool:
            return bool(hvd.allreduce(np.array([1.0 if has_batch else 0.0], np.float32), op=hvd.Min)[0] > 0)

        unequal = args.table.skips and hvd.size() > 1
        dataset = args.table.dataset(args.features, args.batch_size, rank)
        batches = TableBatches(dataset, args.features, rank, agree if unequal else None)
        history = model.fit(
            batches,
            callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
            **_fit_options(args, unequal),
        )
    logs = {k: float(v[-1]) for k, v in history.history.items() if v}
    result = {"rank": rank, "rows": batches.rows, "steps": int(model.step), "logs": logs}
    if rank == 0:
        result["model"] = model_to_bytes(model)
    return result
