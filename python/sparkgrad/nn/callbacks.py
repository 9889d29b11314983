"""Keras 3's training callbacks for ``Sequential.fit``, as ``keras.callbacks`` names them.

`EarlyStopping` (with ``restore_best_weights``), `ReduceLROnPlateau`,
`LearningRateScheduler` and `TerminateOnNaN`, with Keras 3's arguments,
defaults and decisions (keras/src/callbacks/early_stopping.py,
reduce_lr_on_plateau.py, monitor_callback.py, learning_rate_scheduler.py,
terminate_on_nan.py), and `Callback`, the base class with every hook of
fit's callback protocol (see sparkgrad.nn.training) doing nothing.

Where they differ from Keras, on purpose:

- Bad arguments raise InvalidArgumentError when the callback is built: an
  unknown ``mode`` (Keras warns and falls back to "auto"), a negative
  ``patience``, ``cooldown`` or ``start_from_epoch``, ``factor`` outside
  [0, 1), a negative ``min_lr``, a ``monitor`` whose direction "auto" cannot
  tell (Keras raises ValueError at the first epoch's end). Keras infers the
  direction from the compiled metric objects; sparkgrad has none, so it goes
  by the name: ``loss``, ``*_loss`` and error metrics (``mse``, ``mae``,
  ...) are minimised; accuracies, ``auc``, ``precision``, ``recall`` are
  maximised.
- The learning-rate callbacks read and set the optimizer's base rate
  (``config["lr"]``, ``set_learning_rate``; a DistributedOptimizer forwards
  to the wrapped optimizer); a string schedule (``schedule="cosine"``)
  scales it per step as usual. An optimizer whose ``learning_rate`` is a
  schedule object refuses (StateError), as Keras refuses to set it.
  ``logs["learning_rate"]`` is the rate of the next step, as Keras logs it.
- fit returns to Python every ``log_every`` steps, not after every batch:
  TerminateOnNaN checks the loss of each log interval (``on_step_end``), so
  it stops at the end of the interval whose mean loss is NaN or inf.
  fit does not record an epoch it stopped inside.

Not implemented: ModelCheckpoint, BackupAndRestore, TensorBoard and the
progress bar are fit's own options (``checkpoint_dir``, ``resume``,
``tensorboard_dir``, ``verbose``); CSVLogger, LambdaCallback, RemoteMonitor
and SwapEMAWeights are not provided. With allreduce training, put
``hvd.callbacks.MetricAverageCallback()`` before a monitoring callback so
that every rank decides on the same averaged value.
"""

from __future__ import annotations

import inspect
import math
import numbers
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from sparkgrad.errors import InvalidArgumentError, ModelError

MODES = ("auto", "min", "max")

# Keras 3 infers the direction from a compiled metric's ``_direction``; these are its metrics' names.
_MAXIMISED = ("accuracy", "acc", "auc", "precision", "recall", "f1_score", "fbeta_score", "r2_score", "iou")
_MINIMISED = (
    "loss",
    "mse",
    "mae",
    "rmse",
    "mape",
    "msle",
    "mean_squared_error",
    "mean_absolute_error",
    "root_mean_squared_error",
    "mean_absolute_percentage_error",
    "mean_squared_logarithmic_error",
    "crossentropy",
    "hinge",
    "poisson",
)


class Callback:
    """The base of fit's callbacks: keeps the model `set_model` gives; every hook does nothing.

    Subclass it and override the hooks you need, as with ``keras.callbacks.Callback``. fit calls
    ``set_model(model)``, then ``on_train_begin(logs)``; per epoch ``on_epoch_begin(epoch, logs)``,
    ``on_step_end(step, logs)`` every ``log_every`` steps (``step``: the model's step count; ``logs``:
    the interval's ``loss``, ``accuracy`` and ``lr``), ``on_epoch_end(epoch, logs)`` (what a callback
    writes into ``logs`` is what History records); and ``on_train_end(logs)`` once training ends
    without an exception. A callback stops training with ``self.model.stop_training = True``.

    Attributes:
        model (Any): The model being trained (None before `set_model`).
    """

    model: Any = None

    def set_model(self, model: Any) -> None:
        """Keeps ``model`` as ``self.model``; fit calls it before ``on_train_begin``."""
        self.model = model

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Called once when fit starts."""

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        """Called at the start of each epoch (0-based ``epoch``)."""

    def on_step_end(self, step: int, logs: dict | None = None) -> None:
        """Called every ``log_every`` steps with the interval's metrics."""

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Called at the end of each epoch, before History records ``logs``."""

    def on_train_end(self, logs: dict | None = None) -> None:
        """Called once when fit ends (``logs``: History's per-epoch lists)."""


def _non_negative(who: str, **values: float) -> None:
    for name, value in values.items():
        if not value >= 0:  # also refuses NaN
            raise InvalidArgumentError(f"{who}: {name} must be >= 0, not {value!r}")


def _monitor_sign(who: str, monitor: str, mode: str) -> float:
    """+1.0 when lower values of ``monitor`` are better ("min"), -1.0 when higher are ("max")."""
    if mode not in MODES:
        raise InvalidArgumentError(f"{who}: mode must be one of {MODES}, not {mode!r}")
    if not isinstance(monitor, str) or not monitor:
        raise InvalidArgumentError(f"{who}: monitor must be a metric name such as 'val_loss', not {monitor!r}")
    if mode != "auto":
        return 1.0 if mode == "min" else -1.0
    name = monitor.removeprefix("val_")
    if name.endswith("loss") or name in _MINIMISED or name.endswith(("_error", "crossentropy")):
        return 1.0
    if name in _MAXIMISED or name.endswith(("accuracy", "_acc", "auc", "precision", "recall")):
        return -1.0
    raise InvalidArgumentError(
        f"{who}: cannot tell from its name whether monitor={monitor!r} should be minimised or maximised; "
        "pass mode='min' or mode='max'"
    )


def _monitor_value(who: str, monitor: str, logs: dict | None) -> float | None:
    """``logs[monitor]``, or None after a warning naming the available keys (as Keras warns)."""
    logs = logs or {}
    value = logs.get(monitor)
    if value is None:
        warnings.warn(
            f"{who} is conditioned on metric {monitor!r}, which is not available. "
            f"Available metrics are: {','.join(logs)}",
            stacklevel=3,
        )
        return None
    return float(value)


def _optimizer(who: str, model: Any) -> Any:
    opt = getattr(model, "optimizer", None)
    if opt is None or not hasattr(opt, "set_learning_rate"):
        raise InvalidArgumentError(
            f"{who}: the model's optimizer {type(opt).__name__} has no set_learning_rate "
            "(compile the model with a sparkgrad optimizer first)"
        )
    return opt


def _base_learning_rate(opt: Any) -> float:
    """The rate ``set_learning_rate`` sets: the configured base rate, before the optimizer's own schedule."""
    return float(opt.config["lr"])


class EarlyStopping(Callback):
    """Stops training when a monitored metric has stopped improving, as ``keras.callbacks.EarlyStopping``.

    At each epoch's end, from epoch ``start_from_epoch`` on: a value better than the best so far by
    more than ``min_delta`` is an improvement and becomes ``best`` (the first value always does); the
    count ``wait`` of epochs since one is reset by an improvement that also beats ``baseline``. When
    ``wait`` reaches ``patience`` (and the epoch is not the first), fit stops after this epoch
    (``model.stop_training = True``). With ``restore_best_weights``, the weights of the best epoch
    are put back when training ends, whether it stopped early or ran all its epochs (Keras 3).

    ```python
    stop = EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True)
    model.fit(x, y, epochs=50, validation_data=(vx, vy), callbacks=[stop])
    ```

    Args:
        monitor: The ``logs`` key to watch, e.g. ``"val_loss"`` (needs ``validation_data``),
            ``"loss"``, ``"val_accuracy"``. Missing from an epoch's ``logs``: a warning, and the epoch
            is skipped.
        min_delta: The smallest change that counts as an improvement (its absolute value is used).
        patience: Epochs without improvement after which training stops.
        verbose: 1 prints when it stops and when it restores weights.
        mode: ``"min"``, ``"max"``, or ``"auto"``: from the name (losses and errors min, accuracies,
            ``auc``, ``precision``, ``recall`` max).
        baseline: A value to beat: until an epoch beats it, ``wait`` is not reset, so training stops
            after ``patience`` epochs that do not beat it. None: none.
        restore_best_weights: Put the best epoch's weights back at the end of training.
        start_from_epoch: Epochs of warm-up that are not watched.

    Attributes:
        best (float | None): The best value seen in this fit (None before the first watched epoch).
        best_epoch (int): The 0-based epoch of ``best``.
        wait (int): Epochs since the last improvement that beat ``baseline``.
        stopped_epoch (int): The 0-based epoch at whose end training was stopped (0: not stopped).
        best_weights (list[numpy.ndarray] | None): The best epoch's `get_weights`, with
            ``restore_best_weights``.

    Raises:
        InvalidArgumentError: An unknown ``mode``, a ``monitor`` whose direction "auto" cannot tell,
            or a negative ``patience`` or ``start_from_epoch``.
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        min_delta: float = 0,
        patience: int = 0,
        verbose: int = 0,
        mode: str = "auto",
        baseline: float | None = None,
        restore_best_weights: bool = False,
        start_from_epoch: int = 0,
    ) -> None:
        self._sign = _monitor_sign("EarlyStopping", monitor, mode)
        _non_negative("EarlyStopping", patience=patience, start_from_epoch=start_from_epoch)
        self.monitor = monitor
        self.mode = mode
        self.min_delta = abs(float(min_delta))
        self.patience = int(patience)
        self.verbose = int(verbose)
        self.baseline = None if baseline is None else float(baseline)
        self.restore_best_weights = bool(restore_best_weights)
        self.start_from_epoch = int(start_from_epoch)
        self.best: float | None = None
        self.best_epoch = 0
        self.best_weights: list | None = None
        self.wait = 0
        self.stopped_epoch = 0

    def _is_improvement(self, value: float, reference: float | None) -> bool:
        # Keras: monitor_op(value - min_delta, reference) with min_delta negated for "min"
        if reference is None:
            return True
        return self._sign * (value + self._sign * self.min_delta) < self._sign * reference

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Resets the state, so that one instance serves several fits."""
        self.wait = 0
        self.stopped_epoch = 0
        self.best = None
        self.best_weights = None
        self.best_epoch = 0

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Compares the epoch's value with the best and stops training once patience runs out."""
        current = _monitor_value("EarlyStopping", self.monitor, logs)
        if current is None or epoch < self.start_from_epoch:
            return
        if self.restore_best_weights and self.best_weights is None:
            self.best_weights = self.model.get_weights()
            self.best_epoch = epoch
        self.wait += 1
        if self._is_improvement(current, self.best):
            self.best = current
            self.best_epoch = epoch
            if self.restore_best_weights:
                self.best_weights = self.model.get_weights()
            if self.baseline is None or self._is_improvement(current, self.baseline):
                self.wait = 0
            return
        if self.wait >= self.patience and epoch > 0:
            self.stopped_epoch = epoch
            self.model.stop_training = True

    def on_train_end(self, logs: dict | None = None) -> None:
        """Restores the best epoch's weights (with ``restore_best_weights``)."""
        if self.stopped_epoch > 0 and self.verbose > 0:
            print(f"Epoch {self.stopped_epoch + 1}: early stopping", flush=True)
        if self.restore_best_weights and self.best_weights is not None:
            if self.verbose > 0:
                print(f"Restoring model weights from the end of the best epoch: {self.best_epoch + 1}.", flush=True)
            self.model.set_weights(self.best_weights)


class ReduceLROnPlateau(Callback):
    """Multiplies the learning rate by ``factor`` when a metric has stopped improving, as Keras' callback.

    At each epoch's end it writes the rate into ``logs["learning_rate"]``, then: a value better than
    the best by more than ``min_delta`` becomes the best and resets ``wait``; otherwise, outside a
    cooldown, ``wait`` grows, and when it reaches ``patience`` the rate becomes
    ``max(lr * factor, min_lr)`` (if it is above ``min_lr``), ``wait`` is reset and ``cooldown``
    epochs follow in which ``wait`` stays 0.

    ```python
    reduce = ReduceLROnPlateau(monitor="val_loss", factor=0.2, patience=5, min_lr=1e-4)
    model.fit(x, y, epochs=50, validation_data=(vx, vy), callbacks=[reduce])
    ```

    Args:
        monitor: The ``logs`` key to watch. Missing: a warning, and the epoch is skipped.
        factor: The factor the rate is multiplied by, in [0, 1).
        patience: Epochs without improvement after which the rate is reduced.
        verbose: 1 prints each reduction.
        mode: ``"min"``, ``"max"`` or ``"auto"`` (from the name, as `EarlyStopping`).
        min_delta: The smallest change that counts as an improvement (its absolute value is used).
        cooldown: Epochs after a reduction during which no new reduction is counted.
        min_lr: The lowest rate it sets.

    Attributes:
        best (float): The best value seen (inf for "min", -inf for "max" before the first epoch; kept
            across fits, as in Keras 3).
        wait (int): Epochs without improvement, outside cooldown.
        cooldown_counter (int): Cooldown epochs left.

    Raises:
        InvalidArgumentError: ``factor`` outside [0, 1), an unknown ``mode``, a ``monitor`` whose
            direction "auto" cannot tell, or a negative ``patience``, ``cooldown`` or ``min_lr``.
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        factor: float = 0.1,
        patience: int = 10,
        verbose: int = 0,
        mode: str = "auto",
        min_delta: float = 1e-4,
        cooldown: int = 0,
        min_lr: float = 0.0,
    ) -> None:
        self._sign = _monitor_sign("ReduceLROnPlateau", monitor, mode)
        if not 0.0 <= factor < 1.0:
            raise InvalidArgumentError(f"ReduceLROnPlateau: factor must be in [0, 1), not {factor!r}")
        _non_negative("ReduceLROnPlateau", patience=patience, cooldown=cooldown, min_lr=min_lr)
        self.monitor = monitor
        self.mode = mode
        self.factor = float(factor)
        self.patience = int(patience)
        self.verbose = int(verbose)
        self.min_delta = abs(float(min_delta))
        self.cooldown = int(cooldown)
        self.min_lr = float(min_lr)
        self.best = math.inf * self._sign
        self.wait = 0
        self.cooldown_counter = 0

    def _is_improvement(self, value: float) -> bool:
        return self._sign * (value + self._sign * self.min_delta) < self._sign * self.best

    def in_cooldown(self) -> bool:
        """Whether a cooldown is running."""
        return self.cooldown_counter > 0

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Resets ``wait`` and the cooldown (not ``best``, as in Keras 3)."""
        self.wait = 0
        self.cooldown_counter = 0

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Logs the rate, then reduces it when patience has run out."""
        opt = _optimizer("ReduceLROnPlateau", self.model)
        if logs is not None:
            logs["learning_rate"] = float(opt.learning_rate)
        current = _monitor_value("ReduceLROnPlateau", self.monitor, logs)
        if current is None:
            return
        if self.in_cooldown():
            self.cooldown_counter -= 1
            self.wait = 0
        if self._is_improvement(current):
            self.best = current
            self.wait = 0
            return
        if self.in_cooldown():
            return
        self.wait += 1
        if self.wait < self.patience:
            return
        old_lr = _base_learning_rate(opt)
        if old_lr > float(np.float32(self.min_lr)):  # as Keras compares
            new_lr = max(old_lr * self.factor, self.min_lr)
            opt.set_learning_rate(new_lr)
            if self.verbose > 0:
                print(f"Epoch {epoch + 1}: ReduceLROnPlateau reducing learning rate to {new_lr}.", flush=True)
            self.cooldown_counter = self.cooldown
            self.wait = 0


class LearningRateScheduler(Callback):
    """Sets the learning rate at each epoch's start from ``schedule(epoch, lr)``, as Keras' callback.

    ``schedule`` gets the 0-based epoch and the current (base) rate and returns the new rate; a
    function of the epoch alone is called as ``schedule(epoch)``, as Keras allows. At each epoch's end
    the rate is written into ``logs["learning_rate"]``.

    ```python
    def schedule(epoch, lr):
        return lr if epoch < 10 else lr * 0.9

    model.fit(x, y, epochs=30, callbacks=[LearningRateScheduler(schedule)])
    ```

    Args:
        schedule: ``(epoch: int, lr: float) -> float`` or ``(epoch: int) -> float``.
        verbose: 1 prints the rate set at each epoch.

    Raises:
        InvalidArgumentError: ``schedule`` is not callable, or (at an epoch's start) it returned
            something other than a finite number >= 0.
    """

    def __init__(self, schedule: Callable[..., float], verbose: int = 0) -> None:
        if not callable(schedule):
            raise InvalidArgumentError(f"LearningRateScheduler: schedule must be callable, not {schedule!r}")
        self.schedule = schedule
        self.verbose = int(verbose)
        self._takes_lr = _takes_two_arguments(schedule)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        """Sets the rate ``schedule`` returns for this epoch."""
        opt = _optimizer("LearningRateScheduler", self.model)
        lr = self.schedule(epoch, _base_learning_rate(opt)) if self._takes_lr else self.schedule(epoch)
        if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
            raise InvalidArgumentError(f"LearningRateScheduler: schedule({epoch}) must return a float, not {lr!r}")
        lr = float(lr)
        if not (math.isfinite(lr) and lr >= 0):
            raise InvalidArgumentError(
                f"LearningRateScheduler: schedule({epoch}) returned {lr!r}; the rate must be finite and >= 0"
            )
        opt.set_learning_rate(lr)
        if self.verbose > 0:
            print(f"Epoch {epoch + 1}: LearningRateScheduler setting learning rate to {lr}.", flush=True)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Writes the rate into ``logs["learning_rate"]``."""
        if logs is not None:
            logs["learning_rate"] = float(_optimizer("LearningRateScheduler", self.model).learning_rate)


def _takes_two_arguments(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` can be called as ``fn(epoch, lr)`` (else ``fn(epoch)``, Keras' older form)."""
    try:
        inspect.signature(fn).bind(0, 0.0)
    except TypeError:
        return False
    except ValueError:  # no signature (some builtins): try the current form
        return True
    return True


class TerminateOnNaN(Callback):
    """Stops training when the loss is NaN or infinite, as ``keras.callbacks.TerminateOnNaN``.

    fit calls it every ``log_every`` steps with the interval's mean loss; the first non-finite one
    stops training at the end of that interval (``model.stop_training = True``), and fit does not
    record the epoch it stopped inside.

    Args:
        raise_error: Raise instead of stopping (Keras 3's ``raise_error``, where it is a RuntimeError):
            the callbacks' ``on_train_end`` then does not run.

    Raises:
        ModelError: From ``on_step_end``, with ``raise_error``, naming the step and the loss.
    """

    def __init__(self, raise_error: bool = False) -> None:
        self.raise_error = bool(raise_error)

    def on_step_end(self, step: int, logs: dict | None = None) -> None:
        """Stops (or raises) when ``logs["loss"]`` is NaN or infinite."""
        loss = (logs or {}).get("loss")
        if loss is None or math.isfinite(loss):
            return
        if self.raise_error:
            raise ModelError(f"TerminateOnNaN: NaN or Inf loss in the interval ending at step {step} (loss {loss})")
        print(f"Step {step}: Invalid loss, terminating training", flush=True)
        self.model.stop_training = True


__all__ = [
    "Callback",
    "EarlyStopping",
    "LearningRateScheduler",
    "ReduceLROnPlateau",
    "TerminateOnNaN",
]
