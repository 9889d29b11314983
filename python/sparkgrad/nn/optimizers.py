"""Optimizers over flat float32 arrays, run in C (csrc/nn/nn_optim.h).

Each optimizer is a configuration plus, once bound to a size, a C optimizer
holding its state. ``opt.apply(params, grads)`` updates any float32 array in
place (a model's flat buffer, a parameter-server shard); a model compiled
with an optimizer steps it inside its C training loop.

Update rules follow torch.optim; defaults follow Keras (users port Keras code):
SGD lr 0.01, Adam/AdamW lr 0.001 eps 1e-7, RMSprop lr 0.001 rho 0.9 eps 1e-7,
Adadelta lr 0.001 rho 0.95 eps 1e-7. Learning-rate schedule per step:
``schedule="constant" | "step" (step_size, gamma) | "cosine" (total_steps,
lr_min)`` with optional linear ``warmup_steps``; clipping by global norm
(``global_clipnorm``) or by value (``clipvalue``).
"""

from __future__ import annotations

import numpy as np

from sparkgrad import _core


class Optimizer:
    """The base of the optimizers: a configuration and, once bound to a size, the C optimizer with its state.

    The subclasses (`SGD`, `Adam`, `AdamW`, `RMSprop`, `Adadelta`) take their own update-rule
    arguments and pass the keyword arguments below through. The configuration is checked when the
    optimizer is built, not at its first step.

    Args:
        learning_rate: The base learning rate (>= 0); the schedule and warm-up scale it per step.
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
        clipvalue: Clamps every gradient value to ``[-clipvalue, clipvalue]``; None is off.
        **rule: The update rule's own parameters, as the subclasses pass them.

    Raises:
        InvalidArgumentError: A value out of range or an unknown schedule.
    """

    kind = ""
    """The optimizer's name in the C core and in checkpoints.

    ``"sgd"``, ``"adam"``, ``"adamw"``, ``"rmsprop"`` or ``"adadelta"``.
    """

    def __init__(
        self,
        learning_rate: float,
        *,
        weight_decay: float = 0.0,
        schedule: str = "constant",
        step_size: int = 1,
        gamma: float = 0.1,
        total_steps: int = 1,
        lr_min: float = 0.0,
        warmup_steps: int = 0,
        global_clipnorm: float | None = None,
        clipvalue: float | None = None,
        **rule: float,
    ) -> None:
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
            **rule,
        )
        self._c: _core.Optimizer | None = None
        # validate now rather than at the first step
        _core.Optimizer(self.kind, 0, **self.config)

    def bind(self, n: int) -> _core.Optimizer:
        """The C optimizer for ``n`` parameters: created with zeroed state on first use or when ``n`` changes."""
        if self._c is None or self._c.n != n:
            self._c = _core.Optimizer(self.kind, n, **self.config)
        return self._c

    def apply(self, params: np.ndarray, grads: np.ndarray) -> None:
        """One optimizer step: updates ``params`` in place from ``grads``.

        Args:
            params: A C-contiguous float32 array of any shape, updated in place.
            grads: The gradient, as many values as ``params`` (converted to float32).

        Raises:
            TypeError: ``params`` is not a C-contiguous float32 NumPy array.
        """
        if not isinstance(params, np.ndarray) or params.dtype != np.float32 or not params.flags.c_contiguous:
            raise TypeError("params must be a C-contiguous float32 NumPy array (updated in place)")
        grads = np.ascontiguousarray(grads, dtype=np.float32)
        self.bind(params.size).step(params.reshape(-1), grads.reshape(-1))

    @property
    def learning_rate(self) -> float:
        """The learning rate of the next step (schedule applied)."""
        return self._c.lr if self._c is not None else self.config["lr"]

    def set_learning_rate(self, lr: float) -> None:
        """Sets the base learning rate (the schedule applies on top), also between steps of a running fit."""
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

    def __init__(self, learning_rate: float = 0.01, momentum: float = 0.0, nesterov: bool = False, **kw) -> None:
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
        self, learning_rate: float = 0.001, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7, **kw
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

    def __init__(self, learning_rate: float = 0.001, weight_decay: float = 0.004, **kw) -> None:
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
        learning_rate: float = 0.001,
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

    def __init__(self, learning_rate: float = 0.001, rho: float = 0.95, epsilon: float = 1e-7, **kw) -> None:
        super().__init__(learning_rate, rho=float(rho), eps=float(epsilon), **kw)


_BY_NAME = {"sgd": SGD, "adam": Adam, "adamw": AdamW, "rmsprop": RMSprop, "adadelta": Adadelta}


def get(optimizer: str | Optimizer) -> Optimizer:
    """An optimizer from a name (Keras defaults) or an instance."""
    if isinstance(optimizer, Optimizer):
        return optimizer
    if isinstance(optimizer, str) and optimizer.lower() in _BY_NAME:
        return _BY_NAME[optimizer.lower()]()
    raise ValueError(f"unknown optimizer {optimizer!r}; one of {sorted(_BY_NAME)} or an Optimizer instance")
