"""Keras 3's callbacks in sparkgrad.nn.callbacks: each decision checked on a crafted metric sequence, driven
as Keras' own tests drive them (on_epoch_end with logs), and end to end in fit on small synthetic data.

The expected sequences follow keras/src/callbacks/{early_stopping,reduce_lr_on_plateau,monitor_callback,
learning_rate_scheduler,terminate_on_nan}.py, worked by hand in the comments."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import sparkgrad.nn as nn
from sparkgrad.errors import InvalidArgumentError, ModelError, NonFiniteLossError
from sparkgrad.hvd import callbacks as hvd_callbacks
from sparkgrad.nn import (
    SGD,
    Dense,
    DistributedOptimizer,
    EarlyStopping,
    LearningRateScheduler,
    ReduceLROnPlateau,
    Sequential,
    TerminateOnNaN,
)


class _FakeModel:
    """What the callbacks touch: stop_training, an optimizer, get_weights/set_weights."""

    def __init__(self, lr: float = 1.0) -> None:
        self.stop_training = False
        self.optimizer = SGD(lr)
        self.weights = [np.zeros(2, np.float32)]

    def get_weights(self):
        return [w.copy() for w in self.weights]

    def set_weights(self, weights):
        self.weights = [np.asarray(w).copy() for w in weights]


def _drive(cb, values, key="val_loss", model=None):
    """Runs ``cb`` over one epoch per value, stopping as fit stops; returns (model, epochs run, logs)."""
    model = model or _FakeModel()
    cb.set_model(model)
    cb.on_train_begin({})
    seen = []
    for epoch, value in enumerate(values):
        cb.on_epoch_begin(epoch, {})
        logs = {"loss": 1.0, key: value}
        model.weights = [np.full(2, epoch, np.float32)]  # "this epoch's weights"
        cb.on_epoch_end(epoch, logs)
        seen.append(logs)
        if model.stop_training:
            break
    cb.on_train_end({})
    return model, len(seen), seen


def _data(n=200, features=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    return x, (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)


def _model(lr=0.1, seed=1):
    m = Sequential([Dense(16, activation="relu", input_shape=(8,)), Dense(2)], seed=seed)
    m.compile(optimizer=SGD(lr), loss="sparse_categorical_crossentropy")
    return m


class _Scripted(nn.callbacks.Callback):
    """Writes ``values[epoch]`` into logs[key] at each epoch's end (put before the callback under test)."""

    def __init__(self, key, values):
        self.key, self.values = key, values

    def on_epoch_end(self, epoch, logs=None):
        logs[self.key] = self.values[epoch]


class _Weights(nn.callbacks.Callback):
    """Records get_weights() at each epoch's end."""

    def __init__(self):
        self.by_epoch = []

    def on_epoch_end(self, epoch, logs=None):
        self.by_epoch.append(self.model.get_weights())


def _identical(a, b):
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True)
    )


# ---- EarlyStopping ------------------------------------------------------------------------------


def test_early_stopping_stops_after_patience_epochs_without_improvement():
    # best 0.8 at epoch 1; epochs 2 and 3 do not improve: wait reaches 2 at epoch 3
    cb = EarlyStopping(monitor="val_loss", patience=2)
    model, epochs, _ = _drive(cb, [0.9, 0.8, 0.85, 0.82, 0.7, 0.6])
    assert model.stop_training and epochs == 4
    assert (cb.stopped_epoch, cb.best, cb.best_epoch, cb.wait) == (3, 0.8, 1, 2)


def test_early_stopping_takes_the_first_value_as_best_even_nan():
    cb = EarlyStopping(monitor="loss", patience=0, mode="min")
    _, epochs, _ = _drive(cb, [float("nan"), 0.5, 0.6], key="loss")
    # Keras 3: best starts as None, so epoch 0's value (even NaN) is the best; nothing then beats NaN
    assert epochs == 2 and cb.stopped_epoch == 1


def test_early_stopping_min_delta_is_the_smallest_improvement():
    cb = EarlyStopping(monitor="val_loss", min_delta=-0.1, patience=1)  # the sign is dropped, as in Keras
    _, epochs, _ = _drive(cb, [1.0, 0.95, 0.5])
    assert epochs == 2 and cb.stopped_epoch == 1 and cb.best == 1.0


def test_early_stopping_maximises_accuracy_in_auto_mode_and_counts_baseline():
    # baseline 0.6 never beaten: improvements set best but do not reset wait; the first non-improving
    # epoch with wait >= patience stops (epoch 2: wait 3)
    cb = EarlyStopping(monitor="val_accuracy", patience=2, baseline=0.6)
    _, epochs, _ = _drive(cb, [0.5, 0.55, 0.52, 0.9], key="val_accuracy")
    assert epochs == 3 and (cb.stopped_epoch, cb.best, cb.wait) == (2, 0.55, 3)
    # once the baseline is beaten, wait resets
    cb = EarlyStopping(monitor="val_accuracy", patience=2, baseline=0.6)
    _, epochs, _ = _drive(cb, [0.5, 0.7, 0.65, 0.66, 0.64], key="val_accuracy")
    assert epochs == 4 and cb.stopped_epoch == 3 and cb.best == 0.7


def test_early_stopping_ignores_epochs_before_start_from_epoch():
    cb = EarlyStopping(monitor="val_loss", patience=0, start_from_epoch=2)
    _, epochs, _ = _drive(cb, [1.0, 2.0, 3.0, 4.0])
    assert epochs == 4 and cb.stopped_epoch == 3 and cb.best == 3.0 and cb.best_epoch == 2


def test_early_stopping_restores_the_best_weights_at_train_end_even_without_stopping():
    cb = EarlyStopping(monitor="val_loss", patience=5, restore_best_weights=True)
    model, epochs, _ = _drive(cb, [0.5, 0.3, 0.4])
    assert epochs == 3 and not model.stop_training
    assert model.weights[0].tolist() == [1.0, 1.0]  # epoch 1's


def test_early_stopping_resets_when_reused_for_another_fit():
    cb = EarlyStopping(monitor="val_loss", patience=1)
    _drive(cb, [0.1, 0.2])
    assert cb.stopped_epoch == 1
    _, epochs, _ = _drive(cb, [5.0, 4.0, 3.0])
    assert epochs == 3 and cb.stopped_epoch == 0 and cb.best == 3.0


def test_early_stopping_warns_naming_a_missing_monitor_and_the_available_keys():
    cb = EarlyStopping(monitor="val_loss")
    cb.set_model(_FakeModel())
    cb.on_train_begin({})
    with pytest.warns(UserWarning, match=r"'val_loss'.*Available metrics are: loss,accuracy"):
        cb.on_epoch_end(0, {"loss": 1.0, "accuracy": 0.5})
    assert cb.best is None and not cb.model.stop_training


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "maximum"}, "mode must be one of"),
        ({"patience": -1}, "patience must be >= 0"),
        ({"start_from_epoch": -2}, "start_from_epoch must be >= 0"),
        ({"monitor": "val_speed"}, "cannot tell .*'val_speed'"),
    ],
)
def test_early_stopping_rejects_bad_arguments(kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        EarlyStopping(**kwargs)


def test_early_stopping_in_fit_restores_the_best_epochs_weights_bit_identically():
    x, y = _data()
    m = _model()
    weights = _Weights()
    # val_loss scripted: best at epoch 1; epochs 2 and 3 do not improve -> stop after epoch 3
    script = _Scripted("val_loss", [0.5, 0.3, 0.4, 0.35, 0.2, 0.1])
    stop = EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True)
    h = m.fit(x, y, batch_size=20, epochs=6, verbose=0, callbacks=[script, weights, stop])
    assert h.epoch == [0, 1, 2, 3] and stop.stopped_epoch == 3 and stop.best_epoch == 1
    assert m.epoch == 4 and m.step == 40
    assert _identical(m.get_weights(), weights.by_epoch[1])
    assert not _identical(m.get_weights(), weights.by_epoch[3])


# ---- ReduceLROnPlateau ------------------------------------------------------------------------


def test_reduce_lr_on_plateau_follows_patience_cooldown_and_min_lr():
    # factor 0.5, patience 1, cooldown 2, min_lr 0.2 on a flat metric (Keras' order of decisions):
    # e0 best; e1 wait 1 -> 0.5, cooldown 2; e2 cooldown 1; e3 cooldown 0, wait 1 -> 0.25; e4 cooldown;
    # e5 -> max(0.125, 0.2) = 0.2; e6 cooldown; e7 0.2 is not above float32(0.2): stays
    cb = ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=1, cooldown=2, min_lr=0.2)
    model = _FakeModel(lr=1.0)
    rates = []
    cb.set_model(model)
    cb.on_train_begin({})
    logged = []
    for epoch in range(8):
        logs = {"val_loss": 1.0}
        cb.on_epoch_end(epoch, logs)
        logged.append(logs["learning_rate"])
        rates.append(model.optimizer.learning_rate)
    assert rates == [1.0, 0.5, 0.5, 0.25, 0.25, 0.2, 0.2, 0.2]
    assert logged == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25, 0.2, 0.2]  # the rate the epoch trained with


def test_reduce_lr_on_plateau_improvement_by_more_than_min_delta_resets_wait():
    cb = ReduceLROnPlateau(monitor="val_loss", factor=0.1, patience=2, min_delta=0.05)
    model = _FakeModel(lr=1.0)
    cb.set_model(model)
    cb.on_train_begin({})
    # 0.97 is within min_delta of 1.0 (no improvement, wait 1); 0.9 improves (wait 0); 0.88, 0.86: wait 2
    for epoch, value in enumerate([1.0, 0.97, 0.9, 0.88, 0.86]):
        cb.on_epoch_end(epoch, {"val_loss": value})
        if epoch < 4:
            assert model.optimizer.learning_rate == 1.0, epoch
    assert model.optimizer.learning_rate == pytest.approx(0.1) and cb.best == 0.9 and cb.wait == 0


def test_reduce_lr_on_plateau_maximises_accuracy_in_auto_mode():
    cb = ReduceLROnPlateau(monitor="val_accuracy", patience=1, factor=0.5)
    model = _FakeModel(lr=1.0)
    cb.set_model(model)
    cb.on_train_begin({})
    for epoch, value in enumerate([0.5, 0.6, 0.7]):  # rising: never reduced
        cb.on_epoch_end(epoch, {"val_accuracy": value})
    assert model.optimizer.learning_rate == 1.0
    cb.on_epoch_end(3, {"val_accuracy": 0.7})
    assert model.optimizer.learning_rate == 0.5


def test_reduce_lr_on_plateau_sets_the_rate_of_the_optimizer_a_distributed_optimizer_wraps():
    model = _FakeModel()
    inner = SGD(0.8)
    model.optimizer = DistributedOptimizer(inner, communicator=object())  # the communicator is used by fit only
    cb = ReduceLROnPlateau(monitor="loss", patience=0, factor=0.25)
    cb.set_model(model)
    cb.on_train_begin({})
    cb.on_epoch_end(0, {"loss": 1.0})
    cb.on_epoch_end(1, {"loss": 1.0})
    assert inner.learning_rate == pytest.approx(0.2) and model.optimizer.learning_rate == inner.learning_rate


def test_reduce_lr_on_plateau_warns_naming_a_missing_monitor_and_still_logs_the_rate():
    cb = ReduceLROnPlateau(monitor="val_loss", patience=0)
    cb.set_model(_FakeModel(lr=0.3))
    logs = {"loss": 1.0}
    with pytest.warns(UserWarning, match=r"'val_loss'.*Available metrics are: loss,learning_rate"):
        cb.on_epoch_end(0, logs)
    assert logs["learning_rate"] == 0.3 and cb.model.optimizer.learning_rate == 0.3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"factor": 1.0}, r"factor must be in \[0, 1\)"),
        ({"factor": -0.5}, r"factor must be in \[0, 1\)"),
        ({"patience": -1}, "patience must be >= 0"),
        ({"cooldown": -1}, "cooldown must be >= 0"),
        ({"min_lr": -1e-3}, "min_lr must be >= 0"),
        ({"mode": "up"}, "mode must be one of"),
    ],
)
def test_reduce_lr_on_plateau_rejects_bad_arguments(kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        ReduceLROnPlateau(**kwargs)


def test_reduce_lr_on_plateau_in_fit_changes_the_rate_the_c_loop_uses():
    x, y = _data()
    m = _model(lr=0.1)
    script = _Scripted("val_loss", [1.0, 1.0, 1.0])
    reduce = ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=1)
    h = m.fit(x, y, batch_size=20, epochs=3, log_every=10, verbose=0, callbacks=[script, reduce])
    assert h.history["learning_rate"] == pytest.approx([0.1, 0.1, 0.05])
    assert [s["lr"] for s in h.steps] == pytest.approx([0.1, 0.1, 0.05])  # one interval per epoch
    assert m.optimizer.learning_rate == pytest.approx(0.025)


# ---- LearningRateScheduler ----------------------------------------------------------------------


def test_learning_rate_scheduler_rate_0_from_epoch_1_leaves_the_weights_unchanged():
    x, y = _data()
    m = _model(lr=0.5)
    weights = _Weights()
    calls = []

    def schedule(epoch, lr):
        calls.append((epoch, lr))
        return 0.1 if epoch == 0 else 0.0

    before = m.get_weights()
    h = m.fit(
        x, y, batch_size=20, epochs=3, log_every=10, verbose=0, callbacks=[LearningRateScheduler(schedule), weights]
    )
    assert calls == [(0, 0.5), (1, 0.1), (2, 0.0)]
    assert m.optimizer.learning_rate == 0.0
    assert h.history["learning_rate"] == pytest.approx([0.1, 0.0, 0.0])
    assert [s["lr"] for s in h.steps] == pytest.approx([0.1, 0.0, 0.0])
    assert not _identical(before, weights.by_epoch[0])  # epoch 0 trained at 0.1
    assert _identical(weights.by_epoch[0], weights.by_epoch[2]) and _identical(m.get_weights(), weights.by_epoch[0])


def test_learning_rate_scheduler_takes_a_schedule_of_the_epoch_alone():
    model = _FakeModel(lr=1.0)
    cb = LearningRateScheduler(lambda epoch: 0.1 * (epoch + 1))
    cb.set_model(model)
    cb.on_epoch_begin(2, {})
    assert model.optimizer.learning_rate == pytest.approx(0.3)
    logs = {}
    cb.on_epoch_end(2, logs)
    assert logs == {"learning_rate": pytest.approx(0.3)}


@pytest.mark.parametrize("bad", ["0.1", None, -0.1, float("nan"), float("inf"), True])
def test_learning_rate_scheduler_rejects_a_schedule_that_returns_no_valid_rate(bad):
    model = _FakeModel(lr=1.0)
    cb = LearningRateScheduler(lambda epoch, lr: bad)
    cb.set_model(model)
    with pytest.raises(InvalidArgumentError, match=r"schedule\(0\)"):
        cb.on_epoch_begin(0, {})
    assert model.optimizer.learning_rate == 1.0


def test_learning_rate_scheduler_rejects_a_schedule_that_is_not_callable():
    with pytest.raises(InvalidArgumentError, match="schedule must be callable"):
        LearningRateScheduler(0.1)


# ---- TerminateOnNaN -----------------------------------------------------------------------------


def test_terminate_on_nan_stops_at_the_first_non_finite_loss_only():
    model = _FakeModel()
    cb = TerminateOnNaN()
    cb.set_model(model)
    cb.on_step_end(1, {"loss": 1e30})
    cb.on_step_end(2, {})
    assert not model.stop_training
    cb.on_step_end(3, {"loss": float("inf")})
    assert model.stop_training


def test_terminate_on_nan_stops_a_diverging_fit_and_history_has_no_epoch_after_it():
    x, y = _data(n=400)
    m = _model(lr=1e6)  # diverges within the first epoch of 40 steps
    h = m.fit(x, y, batch_size=10, epochs=3, log_every=1, verbose=0, callbacks=[TerminateOnNaN()])
    losses = [s["loss"] for s in h.steps]
    assert all(math.isfinite(v) for v in losses[:-1]) and not math.isfinite(losses[-1])
    assert m.step == h.steps[-1]["step"] < 40
    assert h.epoch == [] and h.history == {}
    assert np.all(np.isfinite(m.params))  # the batch whose loss was not finite was not applied
    # without it the same fit raises at the first non-finite loss, naming the step
    m2 = _model(lr=1e6)
    with pytest.raises(NonFiniteLossError, match=r"training step (\d+) .*loss is not finite") as info:
        m2.fit(x, y, batch_size=10, epochs=3, log_every=1, verbose=0)
    assert info.value.step == m.step and m2.step == m.step and np.all(np.isfinite(m2.params))


def test_terminate_on_nan_with_raise_error_raises_naming_the_step():
    model = _FakeModel()
    cb = TerminateOnNaN(raise_error=True)
    cb.set_model(model)
    with pytest.raises(ModelError, match="step 7"):
        cb.on_step_end(7, {"loss": float("nan")})


# ---- names ------------------------------------------------------------------------------------


def test_callbacks_are_reachable_as_keras_spells_them_and_share_one_base():
    from sparkgrad.nn.callbacks import Callback

    assert nn.callbacks.EarlyStopping is nn.EarlyStopping
    for cls in (EarlyStopping, ReduceLROnPlateau, LearningRateScheduler, TerminateOnNaN):
        assert issubclass(cls, Callback)
    assert hvd_callbacks.Callback is Callback
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Callback().on_epoch_end(0, {})  # every hook does nothing
