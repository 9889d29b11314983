"""Keras 3's learning-rate schedules (``keras.optimizers.schedules``), run in the C optimizer.

A schedule passed as an optimizer's ``learning_rate`` becomes a schedule kind of
csrc/nn/nn_optim.h, so the rate changes inside the C fit loop (and on parameter
servers) at every step. Calling a schedule, ``schedule(step)``, computes the same
formula in Python, for plots and checks. ``step`` is the number of steps taken
before the one the rate is for, as Keras' ``optimizer.iterations``.

The formulas are Keras 3's (keras/src/optimizers/schedules/learning_rate_schedule.py).
Not here: ``PolynomialDecay``, ``InverseTimeDecay``, ``CosineDecayRestarts`` and
schedules written in Python (the C loop cannot call them at every step).
"""

from __future__ import annotations

import math
from typing import Any

from sparkgrad.errors import InvalidArgumentError

__all__ = ["LearningRateSchedule", "ExponentialDecay", "PiecewiseConstantDecay", "CosineDecay"]

MAX_PIECES = 64  # OPTIM_MAX_PIECES in csrc/nn/nn_optim.h


def _steps(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) or value < minimum:
        raise InvalidArgumentError(f"{name} must be an integer >= {minimum}, not {value!r}")
    return int(value)


def _rate(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise InvalidArgumentError(f"{name} must be a finite number >= 0, not {value!r}")
    return float(value)


class LearningRateSchedule:
    """The base of the schedules: a function of the step that the C optimizer computes at every step.

    Subclasses implement ``__call__``, ``get_config`` and ``c_config``; a schedule written only in
    Python cannot be passed to an optimizer.
    """

    def __call__(self, step: int) -> float:
        """The learning rate after ``step`` steps (the rate of step ``step + 1``)."""
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        """The constructor's arguments, as Keras' ``get_config`` returns them."""
        raise NotImplementedError

    def c_config(self) -> dict[str, Any]:
        """The C optimizer's keywords (``lr``, ``schedule``, ...) that compute this schedule."""
        raise NotImplementedError

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LearningRateSchedule:
        """A schedule from what `get_config` returned."""
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


class ExponentialDecay(LearningRateSchedule):
    """``initial_learning_rate * decay_rate ** (step / decay_steps)``, the exponent floored if ``staircase``.

    As ``keras.optimizers.schedules.ExponentialDecay``. With ``staircase=True`` it is the optimizers'
    ``schedule="step"`` (``step_size=decay_steps``, ``gamma=decay_rate``).

    Args:
        initial_learning_rate: The rate of the first step (>= 0).
        decay_steps: Steps over which the rate is multiplied by ``decay_rate`` (an integer > 0).
        decay_rate: The decay factor (>= 0).
        staircase: Decay at whole multiples of ``decay_steps`` only.
        name: Keras' name of the schedule (kept in the config).

    Raises:
        InvalidArgumentError: An argument out of range, named with its value.
    """

    def __init__(
        self,
        initial_learning_rate: float,
        decay_steps: int,
        decay_rate: float,
        staircase: bool = False,
        name: str = "ExponentialDecay",
    ) -> None:
        self.initial_learning_rate = _rate("initial_learning_rate", initial_learning_rate)
        self.decay_steps = _steps("decay_steps", decay_steps, 1)
        self.decay_rate = _rate("decay_rate", decay_rate)
        self.staircase = bool(staircase)
        self.name = name

    def __call__(self, step: int) -> float:
        """The decayed rate after ``step`` steps."""
        p = float(step) / self.decay_steps
        if self.staircase:
            p = math.floor(p)
        return self.initial_learning_rate * self.decay_rate**p

    def get_config(self) -> dict[str, Any]:
        """``initial_learning_rate``, ``decay_steps``, ``decay_rate``, ``staircase``, ``name``."""
        return {
            "initial_learning_rate": self.initial_learning_rate,
            "decay_steps": self.decay_steps,
            "decay_rate": self.decay_rate,
            "staircase": self.staircase,
            "name": self.name,
        }

    def c_config(self) -> dict[str, Any]:
        """The C ``"step"`` schedule (staircase) or ``"exponential"``."""
        return {
            "lr": self.initial_learning_rate,
            "schedule": "step" if self.staircase else "exponential",
            "step_size": self.decay_steps,
            "gamma": self.decay_rate,
        }


class PiecewiseConstantDecay(LearningRateSchedule):
    """``values[0]`` while ``step <= boundaries[0]``, ``values[i]`` while ``boundaries[i-1] < step <= boundaries[i]``.

    As ``keras.optimizers.schedules.PiecewiseConstantDecay``: ``values[-1]`` after the last
    boundary. The values are absolute rates, so an optimizer under this schedule has no base rate
    to set (`Optimizer.set_learning_rate` refuses, as Keras does for any schedule).

    Args:
        boundaries: Strictly increasing steps (integers >= 0), at most 63.
        values: The rates (>= 0), one more than ``boundaries``.
        name: Keras' name of the schedule (kept in the config).

    Raises:
        InvalidArgumentError: Lengths that do not fit, boundaries not increasing, or a bad rate.
    """

    def __init__(self, boundaries: list[int], values: list[float], name: str = "PiecewiseConstant") -> None:
        boundaries, values = list(boundaries), list(values)
        if len(boundaries) != len(values) - 1 or not 1 <= len(values) <= MAX_PIECES:
            raise InvalidArgumentError(
                f"PiecewiseConstantDecay needs one value more than boundaries and at most {MAX_PIECES} values; "
                f"got boundaries={boundaries} and values={values}"
            )
        self.boundaries = [_steps(f"boundaries[{i}]", b, 0) for i, b in enumerate(boundaries)]
        self.values = [_rate(f"values[{i}]", v) for i, v in enumerate(values)]
        for i in range(1, len(self.boundaries)):
            if self.boundaries[i] <= self.boundaries[i - 1]:
                raise InvalidArgumentError(f"boundaries must increase strictly, got boundaries={self.boundaries}")
        self.name = name

    def __call__(self, step: int) -> float:
        """The value of the interval ``step`` falls in."""
        i = 0
        while i < len(self.boundaries) and step > self.boundaries[i]:
            i += 1
        return self.values[i]

    def get_config(self) -> dict[str, Any]:
        """``boundaries``, ``values``, ``name``."""
        return {"boundaries": list(self.boundaries), "values": list(self.values), "name": self.name}

    def c_config(self) -> dict[str, Any]:
        """The C ``"piecewise"`` schedule."""
        return {
            "lr": self.values[0],
            "schedule": "piecewise",
            "boundaries": list(self.boundaries),
            "values": list(self.values),
        }


class CosineDecay(LearningRateSchedule):
    """A cosine decay, after an optional linear warm-up, as ``keras.optimizers.schedules.CosineDecay``.

    Without ``warmup_target``: ``initial_learning_rate * ((1 - alpha) * c + alpha)`` with
    ``c = (1 + cos(pi * min(step, decay_steps) / decay_steps)) / 2``, the optimizers'
    ``schedule="cosine"`` with ``lr_min = alpha * initial_learning_rate``. With ``warmup_target``:
    for ``step < warmup_steps`` the rate goes linearly from ``initial_learning_rate`` to
    ``warmup_target`` (``initial + (target - initial) * step / warmup_steps``), then decays as above
    from ``warmup_target`` at ``step - warmup_steps``.

    Args:
        initial_learning_rate: The first rate (>= 0).
        decay_steps: Length of the decay in steps (an integer > 0).
        alpha: The final rate as a fraction of the rate the decay starts from, in [0, 1].
        name: Keras' name of the schedule (kept in the config).
        warmup_target: The rate the warm-up reaches; None is no warm-up.
        warmup_steps: Length of the warm-up in steps (an integer >= 0).

    Raises:
        InvalidArgumentError: An argument out of range, named with its value.
    """

    def __init__(
        self,
        initial_learning_rate: float,
        decay_steps: int,
        alpha: float = 0.0,
        name: str = "CosineDecay",
        warmup_target: float | None = None,
        warmup_steps: int = 0,
    ) -> None:
        self.initial_learning_rate = _rate("initial_learning_rate", initial_learning_rate)
        self.decay_steps = _steps("decay_steps", decay_steps, 1)
        self.alpha = _rate("alpha", alpha)
        if self.alpha > 1.0:
            raise InvalidArgumentError(f"alpha must be in [0, 1], not {alpha!r}")
        self.name = name
        self.warmup_target = None if warmup_target is None else _rate("warmup_target", warmup_target)
        self.warmup_steps = _steps("warmup_steps", warmup_steps, 0)

    def _decay(self, step: float, start: float) -> float:
        c = 0.5 * (1.0 + math.cos(math.pi * step / self.decay_steps))
        return start * ((1.0 - self.alpha) * c + self.alpha)

    def __call__(self, step: int) -> float:
        """The warmed-up or decayed rate after ``step`` steps."""
        if self.warmup_target is None:
            return self._decay(min(float(step), self.decay_steps), self.initial_learning_rate)
        t = min(float(step), float(self.decay_steps + self.warmup_steps))
        if t < self.warmup_steps:
            delta = self.warmup_target - self.initial_learning_rate
            return delta * t / self.warmup_steps + self.initial_learning_rate
        return self._decay(t - self.warmup_steps, self.warmup_target)

    def get_config(self) -> dict[str, Any]:
        """``initial_learning_rate``, ``decay_steps``, ``alpha``, ``name``, ``warmup_target``, ``warmup_steps``."""
        return {
            "initial_learning_rate": self.initial_learning_rate,
            "decay_steps": self.decay_steps,
            "alpha": self.alpha,
            "name": self.name,
            "warmup_target": self.warmup_target,
            "warmup_steps": self.warmup_steps,
        }

    def c_config(self) -> dict[str, Any]:
        """The C ``"cosine"`` schedule, with the ``"ramp"`` warm-up when there is a ``warmup_target``."""
        start = self.initial_learning_rate if self.warmup_target is None else self.warmup_target
        kw: dict[str, Any] = {
            "lr": start,
            "schedule": "cosine",
            "total_steps": self.decay_steps,
            "lr_min": self.alpha * start,
        }
        if self.warmup_target is not None:
            kw.update(warmup="ramp", warmup_steps=self.warmup_steps, warmup_from=self.initial_learning_rate)
        return kw
