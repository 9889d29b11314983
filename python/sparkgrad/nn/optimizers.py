"""Optimizers over flat float32 arrays, run in C (csrc/nn/nn_optim.h).

Each optimizer is a configuration plus, once bound to a size, a C optimizer
holding its state. ``opt.apply(params, grads)`` updates any float32 array in
place (a model's flat buffer, a parameter-server shard); a model compiled
with an optimizer steps it inside its C training loop.

Update rules follow torch.optim; defaults follow Keras (users port Keras code):
SGD lr 0.01, Adam/AdamW lr 0.001 eps 1e-7, RMSprop lr 0.001 rho 0.9 eps 1e-7,
Adadelta lr 0.001 rho 0.95 eps 1e-7, Adagrad lr 0.001 initial accumulator 0.1
eps 1e-7 (Adagrad's rule is Keras 3's: epsilon inside the square root).
Learning-rate schedule per step: a Keras schedule object as ``learning_rate``
(`sparkgrad.nn.schedules`), or ``schedule="constant" | "step" (step_size,
gamma) | "cosine" (total_steps, lr_min)`` with optional linear
``warmup_steps``; clipping by global norm (``global_clipnorm``), by each
tensor's norm (``clipnorm``) or by value (``clipvalue``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sparkgrad import _core
from sparkgrad.errors import InvalidArgumentError, StateError
from sparkgrad.nn.schedules import LearningRateSchedule


class Optimizer:
    """The base of the optimizers: a configuration and, once bound to a size, the C optimizer with its state.

    The subclasses (`SGD`, `Adam`, `AdamW`, `RMSprop`, `Adadelta`, `Adagrad`) take their own
    update-rule arguments and pass the keyword arguments below through. The configuration is checked
    when the optimizer is built, not at its first step.

    Args:
        learning_rate: The base learning rate (>= 0), which the schedule and warm-up scale per step; or
            a schedule object (`ExponentialDecay`, `PiecewiseConstantDecay`, `CosineDecay`), computed
            by the C optimizer at every step (then ``schedule`` and ``warmup_steps`` stay unset).
        weight_decay: L2 penalty added to the gradient (decoupled from it for `AdamW`); 0 is off.
        schedule: ``"constant"``; ``"step"``: ``lr * gamma ** (t // step_size)``; or ``"cosine"``:
            ``lr_min + (lr - lr_min) * (1 + cos(pi * min(t, total_steps) / total_steps)) / 2``,
            where ``t`` is the number of steps taken before this one.
        step_size: Steps between two decays of the ``"step"`` schedule.
        gamma: Decay factor of the ``"step"`` schedule.
        total_steps: Length of the ``"cosine"`` schedule, in steps.
        lr_min: Final learning rate of the ``"cosine"`` schedule.
        warmup_steps: Linear warm-up: the scheduled rate is scaled by ``min(1, (t + 1) / warmup_steps)``;
            0 is off.
        global_clipnorm: Scales the gradient by ``min(1, global_clipnorm / ||g||_2)`` before the update;
            None is off.
        clipnorm: Scales each tensor's gradient by ``clipnorm / max(clipnorm, ||g_tensor||_2)`` (Keras'
            ``clipnorm``: every variable separately; the tensors are the model's, `bind`); None is
            off. Not with ``global_clipnorm``, and not on parameter servers (a shard may cut a tensor).
        clipvalue: Clamps every gradient value to ``[-clipvalue, clipvalue]`` (after the norm
            clipping); None is off.
        **rule: The update rule's own parameters, as the subclasses pass them.

    Raises:
        InvalidArgumentError: A value out of range, an unknown schedule, or a schedule object with
            ``schedule`` or ``warmup_steps``.
    """

    kind = ""
    """The optimizer's name in the C core and in checkpoints.

    ``"sgd"``, ``"adam"``, ``"adamw"``, ``"rmsprop"``, ``"adadelta"`` or ``"adagrad"``.
    """

    def __init__(
        self,
        learning_rate: float | LearningRateSchedule,
        *,
        weight_decay: float = 0.0,
        schedule: str = "constant",
        step_size: int = 1,
        gamma: float = 0.1,
        total_steps: int = 1,
        lr_min: float = 0.0,
        warmup_steps: int = 0,
        global_clipnorm: float | None = None,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        **rule: float,
    ) -> None:
        self.schedule: LearningRateSchedule | None = None
        """The schedule object given as ``learning_rate``, or None."""
        sched_kw = {}
        if isinstance(learning_rate, LearningRateSchedule):
            if schedule != "constant" or warmup_steps:
                raise InvalidArgumentError(
                    f"learning_rate is a schedule ({learning_rate!r}): leave schedule={schedule!r} and "
                    f"warmup_steps={warmup_steps!r} unset"
                )
            self.schedule, sched_kw = learning_rate, learning_rate.c_config()
            learning_rate = sched_kw.pop("lr")
        elif schedule not in ("constant", "step", "cosine"):
            raise InvalidArgumentError(
                f"schedule must be 'constant', 'step' or 'cosine' (or give learning_rate a schedule object), "
                f"not {schedule!r}"
            )
        if isinstance(learning_rate, bool) or not isinstance(learning_rate, int | float | np.floating):
            raise InvalidArgumentError(
                f"learning_rate must be a number or a schedule (sparkgrad.nn.schedules), not {learning_rate!r}"
            )
        if clipnorm is not None and not clipnorm > 0:
            raise InvalidArgumentError(f"clipnorm must be > 0 or None, not {clipnorm!r}")
        if clipnorm is not None and global_clipnorm is not None:
            raise InvalidArgumentError(
                f"set clipnorm ({clipnorm!r}) or global_clipnorm ({global_clipnorm!r}), not both (as Keras)"
            )
        self._tensor_sizes: tuple[int, ...] | None = None
        self.config = dict(  # the C optimizer's configuration (lr, weight_decay, schedule, ... and the rule's)
            lr=float(learning_rate),
            weight_decay=float(weight_decay),
            schedule=schedule,
            step_size=int(step_size),
            gamma=float(gamma),
            total_steps=int(total_steps),
            lr_min=float(lr_min),
            warmup_steps=int(warmup_steps),
            clip_norm=float(global_clipnorm or 0.0),
            clip_value=float(clipvalue or 0.0),
            clip_tensor_norm=float(clipnorm or 0.0),
            **rule,
        )
        self.config.update(sched_kw)
        self._c: _core.Optimizer | None = None
        # validate now rather than at the first step
        _core.Optimizer(self.kind, 0, **self.config)

    def bind(self, n: int, tensor_sizes: Sequence[int] | None = None) -> _core.Optimizer:
        """The C optimizer for ``n`` parameters: created with fresh state on first use or when ``n`` changes.

        Args:
            n: The number of parameters (float32 values) it updates.
            tensor_sizes: The sizes of the tensors in the flat buffer, in order, summing to ``n`` (a
                model's ``param_table``), for ``clipnorm``; None keeps the ones given before, or makes
                the whole buffer one tensor.

        Raises:
            InvalidArgumentError: ``tensor_sizes`` does not sum to ``n``.
        """
        sizes = None if tensor_sizes is None else tuple(int(s) for s in tensor_sizes)
        if self._c is None or self._c.n != n:
            self._c = _core.Optimizer(self.kind, n, tensor_sizes=sizes, **self.config)
            self._tensor_sizes = sizes
        elif sizes is not None and sizes != self._tensor_sizes:  # the same buffer cut anew: the state carries over
            steps, state = self.get_state()
            self._c = _core.Optimizer(self.kind, n, tensor_sizes=sizes, **self.config)
            self._c.set_state(steps, state)
            self._tensor_sizes = sizes
        return self._c

    def apply(self, params: np.ndarray, grads: np.ndarray, rows: list | None = None) -> None:
        """One optimizer step: updates ``params`` in place from ``grads``.

        Args:
            params: A C-contiguous float32 array of any shape, updated in place.
            grads: The gradient, as many values as ``params`` (converted to float32).
            rows: Embedding tables whose gradient is zero outside some rows, as `Model.touched_rows` gives
                them: ``(offset, rows, dim, ids)`` each (ids sorted and unique). Where the optimizer is
                sparse (`sparse_rows`) it updates only those rows of each table; others update densely.

        Raises:
            TypeError: ``params`` is not a C-contiguous float32 NumPy array.
        """
        if not isinstance(params, np.ndarray) or params.dtype != np.float32 or not params.flags.c_contiguous:
            raise TypeError("params must be a C-contiguous float32 NumPy array (updated in place)")
        grads = np.ascontiguousarray(grads, dtype=np.float32)
        self.bind(params.size).step(params.reshape(-1), grads.reshape(-1), rows=rows)

    @property
    def sparse_rows(self) -> bool:
        """True when an `Embedding` table's step updates only the rows a batch touched: SGD (with or
        without momentum), Adagrad and Adam, without weight decay. SGD's momentum and Adam are then lazy on
        the tables (the state of untouched rows stays as it is); the others update tables densely."""
        return bool(self.bind(self._c.n if self._c is not None else 1).sparse_rows)

    @property
    def learning_rate(self) -> float:
        """The learning rate of the next step (schedule applied)."""
        if self._c is not None:
            return self._c.lr
        return float(self.schedule(0)) if self.schedule is not None else self.config["lr"]

    def set_learning_rate(self, lr: float) -> None:
        """Sets the base learning rate (the schedule applies on top), also between steps of a running fit.

        Raises:
            StateError: The learning rate is a schedule object (Keras refuses to set it too).
        """
        if self.schedule is not None:
            raise StateError(
                f"this optimizer's learning_rate is a schedule ({self.schedule!r}): its rate cannot be set"
            )
        self.config["lr"] = float(lr)
        if self._c is not None:
            self._c.base_lr = float(lr)

    @property
    def iterations(self) -> int:
        """The number of steps taken so far (0 before the optimizer is bound)."""
        return self._c.steps if self._c is not None else 0

    def get_state(self) -> tuple[int, np.ndarray]:
        """The state a checkpoint saves: ``(steps, slots)``.

        The slots (Adam's moments, momentum buffers) are a flat float32 copy, ``n`` values per slot.
        """
        if self._c is None:
            return 0, np.zeros(0, np.float32)
        return self._c.steps, self._c.state().copy()

    def set_state(self, steps: int, state: np.ndarray) -> None:
        """Restores what `get_state` returned.

        Raises:
            RuntimeError: The optimizer is not bound to a size yet (call `apply`, or compile a model with it).
        """
        if self._c is None:
            raise RuntimeError("bind the optimizer to a size (apply or compile) before restoring its state")
        self._c.set_state(int(steps), np.ascontiguousarray(state, dtype=np.float32))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, Nesterov momentum and L2 weight decay (as torch.optim.SGD).

    Args:
        learning_rate: The base learning rate (Keras's default 0.01).
        momentum: Momentum factor; 0 is plain SGD.
        nesterov: Nesterov momentum (needs ``momentum > 0``).
        **kw (Any): The options every optimizer takes (`Optimizer`): weight decay, schedule, warm-up, clipping.
    """

    kind = "sgd"

    def __init__(
        self, learning_rate: float | LearningRateSchedule = 0.01, momentum: float = 0.0, nesterov: bool = False, **kw
    ) -> None:
        super().__init__(learning_rate, momentum=float(momentum), nesterov=bool(nesterov), **kw)


class Adam(Optimizer):
    """Adam; a ``weight_decay`` is added to the gradient as L2, as torch.optim.Adam does.

    Args:
        learning_rate: The base learning rate (default 0.001).
        beta_1: Decay of the first-moment estimate.
        beta_2: Decay of the second-moment estimate.
        epsilon: Added to the denominator (Keras's default 1e-7, not torch's 1e-8).
        **kw (Any): The options every optimizer takes (`Optimizer`).
    """

    kind = "adam"

    def __init__(
        self,
        learning_rate: float | LearningRateSchedule = 0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        **kw,
    ) -> None:
        super().__init__(learning_rate, beta1=float(beta_1), beta2=float(beta_2), eps=float(epsilon), **kw)


class AdamW(Adam):
    """Adam with decoupled weight decay (as torch.optim.AdamW).

    Args:
        learning_rate: The base learning rate (default 0.001).
        weight_decay: Decoupled weight decay (Keras's default 0.004).
        **kw (Any): ``beta_1``, ``beta_2``, ``epsilon`` as for `Adam`, and the options every optimizer takes.
    """

    kind = "adamw"

    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001, weight_decay: float = 0.004, **kw) -> None:
        super().__init__(learning_rate, weight_decay=weight_decay, **kw)


class RMSprop(Optimizer):
    """RMSprop with optional momentum and centering (as torch.optim.RMSprop).

    Args:
        learning_rate: The base learning rate (default 0.001).
        rho: Decay of the running mean of squared gradients (torch's ``alpha``).
        momentum: Momentum factor; 0 is off.
        epsilon: Added to the denominator.
        centered: Normalise by the estimated variance of the gradient instead of its second moment.
        **kw (Any): The options every optimizer takes (`Optimizer`).
    """

    kind = "rmsprop"

    def __init__(
        self,
        learning_rate: float | LearningRateSchedule = 0.001,
        rho: float = 0.9,
        momentum: float = 0.0,
        epsilon: float = 1e-7,
        centered: bool = False,
        **kw,
    ) -> None:
        super().__init__(
            learning_rate, rho=float(rho), momentum=float(momentum), eps=float(epsilon), centered=bool(centered), **kw
        )


class Adadelta(Optimizer):
    """Adadelta (Zeiler 2012), its update scaled by the learning rate as Keras and torch scale it.

    Args:
        learning_rate: The base learning rate (Keras's default 0.001; torch's is 1.0).
        rho: Decay of the running averages.
        epsilon: Added inside the square roots.
        **kw (Any): The options every optimizer takes (`Optimizer`).
    """

    kind = "adadelta"

    def __init__(
        self, learning_rate: float | LearningRateSchedule = 0.001, rho: float = 0.95, epsilon: float = 1e-7, **kw
    ) -> None:
        super().__init__(learning_rate, rho=float(rho), eps=float(epsilon), **kw)


class Adagrad(Optimizer):
    """Adagrad (Duchi et al. 2011) as Keras 3 computes it: ``acc += g**2``; ``p -= lr * g / sqrt(acc + epsilon)``.

    The accumulator starts at ``initial_accumulator_value``; epsilon sits inside the square root as in
    Keras (torch.optim.Adagrad adds it outside: ``sqrt(acc) + eps``, and starts the accumulator at 0).

    Args:
        learning_rate: The base learning rate (Keras's default 0.001), or a schedule.
        initial_accumulator_value: The accumulator's first value (>= 0).
        epsilon: Added to the accumulator inside the square root.
        **kw (Any): The options every optimizer takes (`Optimizer`).
    """

    kind = "adagrad"

    def __init__(
        self,
        learning_rate: float | LearningRateSchedule = 0.001,
        initial_accumulator_value: float = 0.1,
        epsilon: float = 1e-7,
        **kw,
    ) -> None:
        super().__init__(learning_rate, init_accum=float(initial_accumulator_value), eps=float(epsilon), **kw)


_BY_NAME = {"sgd": SGD, "adam": Adam, "adamw": AdamW, "rmsprop": RMSprop, "adadelta": Adadelta, "adagrad": Adagrad}


def get(optimizer: str | Optimizer) -> Optimizer:
    """An optimizer from a name (Keras defaults) or an instance."""
    if isinstance(optimizer, Optimizer):
        return optimizer
    if isinstance(optimizer, str) and optimizer.lower() in _BY_NAME:
        return _BY_NAME[optimizer.lower()]()
    raise ValueError(f"unknown optimizer {optimizer!r}; one of {sorted(_BY_NAME)} or an Optimizer instance")
