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
    """Base: holds the configuration and, once bound, the C optimizer."""

    kind = ""

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
        self.config = dict(
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
        """The C optimizer for n parameters (created on first use, state zeroed)."""
        if self._c is None or self._c.n != n:
            self._c = _core.Optimizer(self.kind, n, **self.config)
        return self._c

    def apply(self, params: np.ndarray, grads: np.ndarray) -> None:
        """One update of ``params`` (float32, contiguous, in place) from ``grads``."""
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
        return self._c.steps if self._c is not None else 0

    def get_state(self) -> tuple[int, np.ndarray]:
        """(steps, copy of the slot array) for checkpoints."""
        if self._c is None:
            return 0, np.zeros(0, np.float32)
        return self._c.steps, self._c.state().copy()

    def set_state(self, steps: int, state: np.ndarray) -> None:
        if self._c is None:
            raise RuntimeError("bind the optimizer to a size (apply or compile) before restoring its state")
        self._c.set_state(int(steps), np.ascontiguousarray(state, dtype=np.float32))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"


class SGD(Optimizer):
    """SGD with optional momentum, Nesterov momentum and L2 weight decay."""

    kind = "sgd"

    def __init__(self, learning_rate: float = 0.01, momentum: float = 0.0, nesterov: bool = False, **kw) -> None:
        super().__init__(learning_rate, momentum=float(momentum), nesterov=bool(nesterov), **kw)


class Adam(Optimizer):
    """Adam (L2 weight decay added to the gradient, as torch.optim.Adam)."""

    kind = "adam"

    def __init__(
        self, learning_rate: float = 0.001, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7, **kw
    ) -> None:
        super().__init__(learning_rate, beta1=float(beta_1), beta2=float(beta_2), eps=float(epsilon), **kw)


class AdamW(Adam):
    """Adam with decoupled weight decay (default 0.004 as Keras)."""

    kind = "adamw"

    def __init__(self, learning_rate: float = 0.001, weight_decay: float = 0.004, **kw) -> None:
        super().__init__(learning_rate, weight_decay=weight_decay, **kw)


class RMSprop(Optimizer):
    """RMSprop with optional momentum and centering."""

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
    """Adadelta (Zeiler 2012), scaled by the learning rate as Keras and torch."""

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
