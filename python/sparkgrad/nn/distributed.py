"""DistributedOptimizer: synchronous data-parallel training by allreduce, as
``hvd.DistributedOptimizer`` is used with Keras.

    model.compile(optimizer=DistributedOptimizer(Adadelta(0.1 * hvd.size())), loss=...)
    model.fit(x, y, ...)

For ``compile`` it is the wrapped optimizer: kind, learning rate (read and
``set_learning_rate``), state, checkpoints and any other attribute are the
wrapped one's. At fit time it supplies the gradient hook
of the C training loop (csrc/nn/nn_hook.h): every step the gradients are
reduced across the ranks of the communicator (``op``: "average", "sum",
"min", "max"; ``compression``: None, "fp16" or "bf16" on the wire, or an
object with such a ``.name`` as ``hvd.Compression.fp16``), then the wrapped
optimizer applies them on every rank. ``backward_passes_per_step`` > 1
accumulates that many local gradients per reduction. ``bucket_bytes`` > 0
overlaps the reduction with backward: a background thread reduces each
bucket of about that many bytes of gradient as the C backward reports its
layers done (0, the default: the whole gradient after backward; the
results are equal either way; bench/bench_overlap.py measures whether it
pays for a model). Embedding tables are reduced as the rows the ranks'
batches touched (their union), or densely where every row was touched;
the wrapped optimizer then updates those rows alone, as it does in one
process (``sparse_tables=False``: the tables reduced and updated densely;
docs/guide/tabular.md). The communicator
defaults to the one ``hvd.init()`` set up in this process (found through
sparkgrad.cluster.collective, so this module does not import sparkgrad.hvd,
which imports it), looked up when fit starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sparkgrad import _core
from sparkgrad.cluster import collective
from sparkgrad.errors import InvalidArgumentError, ModelError, StateError
from sparkgrad.nn.optimizers import Optimizer, get

OPS = ("average", "sum", "min", "max")
COMPRESSIONS = (None, "none", "fp16", "bf16")


def _compression_name(compression: Any) -> str | None:
    name = getattr(compression, "name", compression)
    if isinstance(name, str):
        name = name.lower()
    if name not in COMPRESSIONS:
        raise InvalidArgumentError(
            f"compression must be None, 'fp16' or 'bf16' (or an object with such a .name), not {compression!r}"
        )
    return None if name in (None, "none") else name


class DistributedOptimizer(Optimizer):
    """Wraps an optimizer for synchronous data-parallel training by allreduce, as horovod's is used with Keras.

    ```python
    hvd.init()
    model.compile(optimizer=DistributedOptimizer(Adadelta(0.1 * hvd.size())), loss="sparse_categorical_crossentropy")
    hvd.broadcast_parameters(model, root_rank=0)
    model.fit(x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()], epochs=2)
    ```

    For `Sequential.compile` it is the wrapped optimizer: kind, learning rate, state, checkpoints and
    any other attribute are the wrapped one's. At fit time it supplies the gradient hook of the C
    training loop: every step the gradients are reduced across the ranks of the communicator, then
    the wrapped optimizer applies them on every rank. The results are the same whatever
    ``bucket_bytes`` is.

    Args:
        optimizer: The optimizer to wrap, an instance or a name (``"adam"``, ...).
        backward_passes_per_step: Local gradients accumulated per reduction (>= 1).
        compression: None, ``"fp16"`` or ``"bf16"`` on the wire, or an object with such a ``.name``
            (``hvd.Compression.fp16``); sums accumulate in float32.
        op: ``"average"`` (default), ``"sum"``, ``"min"`` or ``"max"`` (or an object with such a ``.name``).
        communicator: A ``sparkgrad._core.Communicator``; default ``sparkgrad.hvd.communicator()``, looked
            up when fit starts.
        bucket_bytes: > 0 overlaps the reduction with backward: a background thread reduces each bucket
            of about that many bytes of gradient as the C backward finishes its layers; 0 (default)
            reduces the whole gradient after backward. ``bench/bench_overlap.py`` measures whether it
            pays for a model.
        sparse_tables: True (default): each Embedding table's gradient travels as the rows the ranks
            touched (their union), or densely when that touches every row (``Communicator.stats()``
            counts which); the optimizer updates the union's rows alone, lazily as in one process.
            False: the tables are reduced and updated densely. ``backward_passes_per_step`` > 1 is
            always dense.

    Raises:
        InvalidArgumentError: ``optimizer`` is already distributed, or an argument is out of range.
    """

    def __init__(
        self,
        optimizer: str | Optimizer,
        backward_passes_per_step: int = 1,
        compression: Any = None,
        op: str = "average",
        communicator: Any = None,
        bucket_bytes: int = 0,
        sparse_tables: bool = True,
    ) -> None:
        # no Optimizer.__init__: the configuration and the C state are the wrapped optimizer's
        if isinstance(optimizer, DistributedOptimizer):
            raise InvalidArgumentError("DistributedOptimizer: the optimizer is already distributed")
        self.optimizer = get(optimizer)
        if int(backward_passes_per_step) < 1:
            raise InvalidArgumentError(f"backward_passes_per_step must be >= 1, not {backward_passes_per_step}")
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.compression = _compression_name(compression)
        op = getattr(op, "name", op)
        if not isinstance(op, str) or op.lower() not in OPS:
            raise InvalidArgumentError(f"op must be one of {OPS}, not {op!r}")
        self.op = op.lower()
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, (int, np.integer)) or bucket_bytes < 0:
            raise InvalidArgumentError(
                f"bucket_bytes must be an int >= 0 (0: reduce after backward), not {bucket_bytes!r}"
            )
        self.bucket_bytes = int(bucket_bytes)
        if not isinstance(sparse_tables, (bool, np.bool_)):
            raise InvalidArgumentError(f"sparse_tables must be True or False, not {sparse_tables!r}")
        self.sparse_tables = bool(sparse_tables)
        self.communicator = communicator

    # ---- the wrapped optimizer, for compile, fit and checkpoints -------------

    @property
    def kind(self) -> str:  # type: ignore[override]
        """The wrapped optimizer's `kind`."""
        return self.optimizer.kind

    @property
    def config(self) -> dict:
        """The wrapped optimizer's configuration."""
        return self.optimizer.config

    def bind(self, n: int, tensor_sizes: Sequence[int] | None = None) -> _core.Optimizer:
        """Binds the wrapped optimizer to ``n`` parameters in tensors of ``tensor_sizes`` (``Optimizer.bind``)."""
        return self.optimizer.bind(n, tensor_sizes)

    def apply(self, params: np.ndarray, grads: np.ndarray) -> None:
        """One step of the wrapped optimizer on ``params``, with ``grads`` as given (no reduction)."""
        self.optimizer.apply(params, grads)

    @property
    def learning_rate(self) -> float:
        """The wrapped optimizer's learning rate for the next step."""
        return self.optimizer.learning_rate

    @property
    def iterations(self) -> int:
        """The wrapped optimizer's step count."""
        return self.optimizer.iterations

    def get_state(self) -> tuple[int, np.ndarray]:
        """The wrapped optimizer's ``(steps, slots)`` state."""
        return self.optimizer.get_state()

    def set_state(self, steps: int, state: np.ndarray) -> None:
        """Restores the wrapped optimizer's state."""
        self.optimizer.set_state(steps, state)

    def set_learning_rate(self, lr: float) -> None:
        """Sets the wrapped optimizer's base learning rate.

        Callbacks such as ``hvd.callbacks.LearningRateWarmupCallback`` call it between steps of fit.
        """
        self.optimizer.set_learning_rate(lr)

    def __getattr__(self, name: str) -> Any:
        # anything else an Optimizer (or the wrapped subclass) has is the wrapped one's
        if name == "optimizer":  # not set yet (a half-built instance): no recursion
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    # ---- fit time --------------------------------------------------------------

    def resolve_communicator(self) -> Any:
        """The communicator given, else the one ``sparkgrad.hvd.init()`` formed in this process.

        Raises:
            ModelError: None was given and ``hvd.init()`` was not called in this process.
        """
        if self.communicator is not None:
            return self.communicator
        try:
            return collective.communicator()
        except StateError as exc:
            raise ModelError(
                "DistributedOptimizer: no communicator in this process; call sparkgrad.hvd.init() first "
                f"(under sparkgrad.run or HorovodRunner), or pass communicator=: {exc}"
            ) from exc

    def grad_hook(self) -> object:
        """The gradient hook fit hands to the C loop (a ``sparkgrad._core.NnGradHook`` capsule)."""
        return self.resolve_communicator().grad_hook(
            op=self.op,
            compression=self.compression,
            backward_passes_per_step=self.backward_passes_per_step,
            bucket_bytes=self.bucket_bytes,
            sparse_tables=self.sparse_tables,
        )

    def __repr__(self) -> str:
        return (
            f"DistributedOptimizer({self.optimizer!r}, backward_passes_per_step={self.backward_passes_per_step}, "
            f"compression={self.compression!r}, op={self.op!r}, bucket_bytes={self.bucket_bytes}, "
            f"sparse_tables={self.sparse_tables})"
        )
