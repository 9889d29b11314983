"""``fit(callbacks=[...])`` callbacks for allreduce training, as horovod.tensorflow.keras spells them.

They follow sparkgrad's fit callback protocol: ``set_model(model)``,
``on_train_begin(logs)``, ``on_epoch_begin(epoch, logs)``,
``on_step_end(step, logs)`` (at fit's logging points: steps run in C
between them), ``on_epoch_end(epoch, logs)``, ``on_train_end(logs)``.
Every rank must use the same callbacks in the same order: each one that
communicates is a collective.
"""

from __future__ import annotations

import numpy as np

from sparkgrad import hvd
from sparkgrad.errors import ModelError
from sparkgrad.hvd import codec
from sparkgrad.nn.callbacks import Callback  # the base of every fit callback, re-exported here
from sparkgrad.nn.callbacks import _optimizer as _optimizer_with_lr


class BroadcastGlobalVariablesCallback(Callback):
    """At the start of training, every rank takes rank ``root_rank``'s parameters and optimizer state.

    So that ranks that built their models with different random
    initializations (or only rank 0 restored a checkpoint) train one model.
    """

    def __init__(self, root_rank: int = 0, device: str = "") -> None:
        """``device`` is accepted as Horovod's is, and unused: parameters live in host memory."""
        self.root_rank = int(root_rank)
        self.broadcast_done = False

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.broadcast_done or self.model is None:
            return
        hvd.broadcast_parameters(self.model, root_rank=self.root_rank)
        if getattr(self.model, "optimizer", None) is not None:
            hvd.broadcast_optimizer_state(self.model, root_rank=self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(Callback):
    """At each epoch's end, replaces the metrics in ``logs`` by their value over all the ranks.

    The loss and the compiled metrics (with their ``val_`` forms) are pooled: every rank's sums (weighted
    loss, rows, the metrics' states: `Sequential.epoch_sums`) are added and the values computed once
    from the total, so an AUC is that of all the ranks' rows, never an average of the ranks' AUCs (for
    the loss and accuracy over equal shards, the same as Horovod's average). Any other numeric entry a
    callback wrote is averaged over the ranks, as Horovod does. Put it before callbacks that read the
    metrics: fit runs the callbacks in order, then records the epoch in History and checkpoints (its
    ``save_best_only`` monitor), so both see these values and every rank decides on the same
    ``val_loss``. A metric that some rank lacks is left as it is.
    """

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is None:
            return
        model = getattr(self, "model", None)
        sums = dict(getattr(model, "epoch_sums", None) or {})
        mine = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        shared = {"logs": mine, "sums": {p: [float(a), int(b), [float(v) for v in c]] for p, (a, b, c) in sums.items()}}
        gathered = _allgather(model, shared)
        pooled = set()
        for prefix in sums:
            parts = [g["sums"].get(prefix) for g in gathered]
            if any(p is None for p in parts):
                continue
            loss_sum, seen = sum(p[0] for p in parts), sum(p[1] for p in parts)
            if seen <= 0:
                continue
            state = np.sum([np.asarray(p[2], np.float64) for p in parts], axis=0)
            values = {"loss": loss_sum / seen, **model.metric_values(state, seen)}
            for name, value in values.items():
                if prefix + name in logs:
                    logs[prefix + name] = value
                    pooled.add(prefix + name)
        for key in mine:
            if key in pooled:
                continue
            values = [g["logs"][key] for g in gathered if key in g["logs"]]
            if len(values) == len(gathered):
                logs[key] = sum(values) / len(values)


def _allgather(model, obj):
    """Every rank's ``obj``: through the model's DistributedOptimizer's communicator when it has one
    (ranks formed without hvd.init), else hvd's."""
    comm = None
    resolve = getattr(getattr(model, "optimizer", None), "resolve_communicator", None)
    if resolve is not None:
        try:
            comm = resolve()
        except ModelError:  # hvd.init() not called: hvd's own error below says so
            comm = None
    if comm is not None and hasattr(comm, "allgather_bytes"):
        return [codec.decode(b) for b in comm.allgather_bytes(codec.encode(obj))]
    return hvd.allgather_object(obj)


class LearningRateWarmupCallback(Callback):
    """Ramps the learning rate from ``initial_lr / size()`` to ``initial_lr`` over ``warmup_epochs`` epochs.

    ``initial_lr`` is the rate after warmup (already scaled by the number of
    ranks, e.g. ``0.1 * hvd.size()``), as in Horovod (Goyal et al., "Accurate,
    Large Minibatch SGD"): at fractional epoch e < warmup_epochs the rate is
    ``initial_lr / size * (1 + e * (size - 1) / warmup_epochs)``. It is set at
    each epoch's start and at fit's logging points within the epoch (once the
    steps per epoch are known: ``steps_per_epoch``, else counted in the
    first epoch). ``verbose``: print when the warmup ends. The arguments are
    Horovod's, in its order; ``momentum_correction`` is accepted and has no
    effect (the optimizer's momentum buffers are not rescaled when the rate
    changes).
    """

    def __init__(
        self,
        initial_lr: float,
        warmup_epochs: int = 5,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
    ) -> None:
        self.momentum_correction = bool(momentum_correction)
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = int(warmup_epochs)
        self.verbose = int(verbose)
        self.steps_per_epoch = steps_per_epoch
        self._epoch = 0
        self._epoch_start_step = 0

    def lr_at(self, epoch: float) -> float:
        """The warmup's learning rate at (fractional) ``epoch``."""
        n = hvd.size()
        if epoch >= self.warmup_epochs or self.warmup_epochs <= 0:
            return self.initial_lr
        return self.initial_lr / n * (1.0 + epoch * (n - 1) / self.warmup_epochs)

    def _set(self, lr: float) -> None:
        _optimizer_with_lr("LearningRateWarmupCallback", self.model).set_learning_rate(lr)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = int(epoch)
        self._epoch_start_step = int(getattr(self.model, "step", 0))
        if epoch < self.warmup_epochs:
            self._set(self.lr_at(epoch))

    def on_step_end(self, step: int, logs: dict | None = None) -> None:
        if self._epoch >= self.warmup_epochs or not self.steps_per_epoch:
            return
        done = max(0, int(step) - self._epoch_start_step)
        self._set(self.lr_at(self._epoch + min(1.0, done / self.steps_per_epoch)))

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.steps_per_epoch is None and epoch == 0:
            taken = int(getattr(self.model, "step", 0)) - self._epoch_start_step
            self.steps_per_epoch = taken if taken > 0 else None
        if epoch == self.warmup_epochs - 1:
            self._set(self.initial_lr)
            if self.verbose:
                print(f"epoch {epoch + 1}: finished the learning rate warmup to {self.initial_lr:g}", flush=True)


__all__ = [
    "BroadcastGlobalVariablesCallback",
    "Callback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]
