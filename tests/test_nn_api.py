"""sparkgrad.nn's Python face: flat buffers as views, weights in Keras
layouts, summary, fit on arrays and on iterables of dict batches, max_steps,
compute_gradients for parameter servers, determinism, threads, errors."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from sparkgrad import _core
from sparkgrad.errors import InvalidArgumentError, ModelError, SparkgradTimeout, StateError
from sparkgrad.nn import (
    SGD,
    Adam,
    Conv2D,
    Dense,
    Dropout,
    Flatten,
    MaxPool2D,
    Sequential,
    get_num_threads,
    set_num_threads,
)


def mlp(seed=1):
    m = Sequential([Dense(16, activation="relu", input_shape=(20,)), Dense(8, activation="relu"), Dense(4)], seed=seed)
    m.compile(optimizer=SGD(0.1), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return m


def toy(n=400, d=20, k=4, seed=0):
    """Linearly separable-ish classes so that training visibly learns."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((k, d)) * 2
    y = rng.integers(0, k, n)
    x = (centers[y] + rng.standard_normal((n, d))).astype(np.float32)
    return x, y


def test_params_and_grads_are_views_of_the_flat_buffers():
    m = mlp()
    p, g = m.params, m.grads
    assert (
        p.dtype == np.float32
        and p.flags.c_contiguous
        and p.size == m.num_params == 20 * 16 + 16 + 16 * 8 + 8 + 8 * 4 + 4
    )
    assert np.shares_memory(p, m.params) and np.shares_memory(g, m.grads)
    x, y = toy(8)
    before = m.predict(x)
    p[:] = 0.0  # writing the view changes the model
    assert np.all(m.predict(x) == 0.0)
    assert not np.all(before == 0.0)
    m.compute_gradients(x, y)
    assert np.any(g != 0.0)  # the view sees the C writes


def test_param_table_slices_follow_keras_layouts():
    m = Sequential([Conv2D(3, (2, 3), input_shape=(5, 6, 2)), Flatten(), Dense(4)], seed=0)
    shapes = [t.shape for t in m.param_table]
    assert shapes == [(2, 3, 2, 3), (3,), (4 * 4 * 3, 4), (4,)]
    offsets = [t.offset for t in m.param_table]
    assert offsets == [0, 36, 39, 39 + 192]
    w = m.get_weights()
    assert [a.shape for a in w] == shapes
    assert np.all(w[1] == 0) and np.all(w[3] == 0)  # zero biases
    w2 = [np.random.default_rng(1).standard_normal(a.shape).astype(np.float32) for a in w]
    m.set_weights(w2)
    for a, b in zip(m.get_weights(), w2, strict=True):
        np.testing.assert_array_equal(a, b)
    kernel_view = m.layer_weights(0)[0]
    assert np.shares_memory(kernel_view, m.params)
    with pytest.raises(InvalidArgumentError, match="shape"):
        m.set_weights([w2[0].T] + w2[1:])
    with pytest.raises(InvalidArgumentError, match="got 1 arrays"):
        m.set_weights(w2[:1])


def test_initialisers_are_seeded_and_scaled():
    a = Sequential([Dense(500, input_shape=(400,), kernel_initializer="truncated_normal"), Dense(2)], seed=5)
    b = Sequential([Dense(500, input_shape=(400,), kernel_initializer="truncated_normal"), Dense(2)], seed=5)
    np.testing.assert_array_equal(a.params, b.params)
    k = a.get_weights()[0]
    # truncated at 2 stddev of 1/sqrt(fan_in); std of N(0,1) truncated to [-2, 2] is 0.8796
    assert np.abs(k).max() <= 2 / np.sqrt(400) + 1e-6
    assert abs(k.std() - 0.8796 / np.sqrt(400)) < 0.02 / np.sqrt(400)
    g = Sequential([Dense(300, input_shape=(200,)), Dense(2)], seed=1).get_weights()[0]
    limit = np.sqrt(6 / 500)
    assert np.abs(g).max() <= limit and abs(g.std() - limit / np.sqrt(3)) < 0.02 * limit
    h = Sequential([Dense(300, input_shape=(200,), kernel_initializer="he_uniform"), Dense(2)], seed=1).get_weights()[0]
    assert np.abs(h).max() <= np.sqrt(6 / 200) and h.max() > 0.9 * np.sqrt(6 / 200)
    c = Sequential([Dense(300, input_shape=(200,)), Dense(2)], seed=2).get_weights()[0]
    assert not np.array_equal(g, c)


def test_model_b_kernels_use_keras_glorot_uniform_fans_and_zero_biases():
    """Keras' default glorot_uniform: limit sqrt(6 / (fan_in + fan_out)) with the
    receptive field in both fans for Conv2D (fan_in = KH*KW*C, fan_out = KH*KW*OC)."""
    m = Sequential(
        [
            Conv2D(32, 3, activation="relu", input_shape=(28, 28, 1)),
            Conv2D(64, 3, activation="relu"),
            MaxPool2D(2),
            Flatten(),
            Dense(128, activation="relu"),
            Dense(10, activation="softmax"),
        ],
        seed=1,
    )
    fans = [(9 * 1, 9 * 32), (9 * 32, 9 * 64), (9216, 128), (128, 10)]
    weights = m.get_weights()
    for (fan_in, fan_out), kernel, bias in zip(fans, weights[0::2], weights[1::2], strict=True):
        limit = np.sqrt(6 / (fan_in + fan_out))
        assert np.abs(kernel).max() <= limit and np.abs(kernel).max() > 0.95 * limit
        assert abs(kernel.std() - limit / np.sqrt(3)) < 0.1 * limit
        assert not bias.any()


def test_summary_lists_layers_shapes_and_counts():
    m = Sequential(
        [
            Conv2D(4, 3, activation="relu", input_shape=(8, 8, 1)),
            MaxPool2D(2),
            Dropout(0.25),
            Flatten(),
            Dense(10, activation="softmax"),
        ],
        seed=0,
    )
    text = m.summary(print_fn=None)
    assert "(None, 6, 6, 4)" in text and "(None, 3, 3, 4)" in text and "(None, 36)" in text
    assert "40" in text and "370" in text and f"Total params: {m.num_params}" in text


def test_fit_learns_and_reports_history():
    m = mlp()
    x, y = toy()
    h = m.fit(x, y, batch_size=32, epochs=3, verbose=0, validation_data=(x[:100], y[:100]), log_every=5)
    assert set(h.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert h.history["loss"][-1] < h.history["loss"][0]
    assert h.history["accuracy"][-1] > 0.8
    assert m.step == 3 * 13 and m.epoch == 3
    assert [s["step"] for s in h.steps][:3] == [5, 10, 13]  # intervals never cross an epoch end
    loss, acc = m.evaluate(x, y)
    assert acc > 0.8 and loss < h.history["loss"][0]


def test_fit_stops_at_max_steps_before_epochs():
    m = mlp()
    x, y = toy()
    m.fit(x, y, batch_size=32, epochs=10, max_steps=20, verbose=0, log_every=7)
    assert m.step == 20 and m.optimizer.iterations == 20
    assert m.epoch == 1  # the second epoch was cut short


def test_fit_on_an_iterable_of_dict_batches():
    x, y = toy()

    class Batches:  # re-iterable, like a dataset object
        def __iter__(self):
            for i in range(0, len(x), 50):
                yield {"image_raw": x[i : i + 50], "label": y[i : i + 50].astype(np.int64), "extra": np.zeros(3)}

    m = mlp()
    h = m.fit(Batches(), epochs=2, verbose=0, log_every=3)
    assert m.step == 16 and len(h.history["loss"]) == 2
    custom = ({"pixels": x[i : i + 100], "y": y[i : i + 100]} for i in range(0, 400, 100))
    m2 = mlp()
    m2.fit(custom, epochs=5, x_key="pixels", y_key="y", verbose=0)
    assert m2.step == 4  # a one-shot generator ends training when exhausted
    mapped = ({"pixels": x[i : i + 100], "y": y[i : i + 100]} for i in range(0, 400, 100))
    m3 = mlp()
    m3.fit(mapped, input_mapping={"pixels": "x", "y": "y"}, verbose=0)
    assert m3.step == 4
    with pytest.raises(InvalidArgumentError, match="input_mapping"):
        m3.fit(Batches(), input_mapping={"pixels": "x"}, verbose=0)
    loss, acc = m.evaluate(Batches())
    assert 0 <= acc <= 1
    with pytest.raises(InvalidArgumentError, match=r"missing \['label'\]"):
        mlp().fit(iter([{"image_raw": x[:10]}]), verbose=0)


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "sparkgrad-fit-prefetch"]


def test_fit_prefetches_iterable_batches_on_a_background_thread():
    """Batches of an iterable are pulled and converted on a helper thread while
    the C step runs; training is the same as without prefetching."""
    x, y = toy()
    pulled_on: list[str] = []

    class Batches:
        def __iter__(self):
            for i in range(0, len(x), 40):
                pulled_on.append(threading.current_thread().name)
                yield {"image_raw": x[i : i + 40].astype(np.float64), "label": y[i : i + 40]}

    ahead, inline = mlp(), mlp()
    ahead.fit(Batches(), epochs=2, verbose=0)
    assert set(pulled_on) == {"sparkgrad-fit-prefetch"}
    pulled_on.clear()
    inline.fit(Batches(), epochs=2, verbose=0, prefetch=0)
    assert set(pulled_on) == {threading.current_thread().name}
    assert ahead.step == inline.step == 20
    np.testing.assert_array_equal(ahead.params, inline.params)
    assert not _prefetch_threads()


def test_fit_prefetch_stops_at_max_steps_and_reraises_iterator_errors():
    x, y = toy()

    def forever():
        i = 0
        while True:  # bounded by fit's max_steps
            yield {"image_raw": x[i % 10 : i % 10 + 10], "label": y[i % 10 : i % 10 + 10]}
            i += 1

    m = mlp()
    m.fit(forever(), epochs=1, max_steps=7, verbose=0)
    assert m.step == 7
    assert not _prefetch_threads()

    def broken():
        yield {"image_raw": x[:10], "label": y[:10]}
        raise RuntimeError("the feed broke at batch 2")

    with pytest.raises(RuntimeError, match="feed broke at batch 2"):
        mlp().fit(broken(), verbose=0)
    with pytest.raises(InvalidArgumentError, match=r"missing \['label'\]"):
        mlp().fit(iter([{"image_raw": x[:10]}] * 3), verbose=0)  # a conversion error, raised in order
    assert not _prefetch_threads()


def test_fit_prefetch_times_out_naming_the_iterator():
    x, y = toy()
    release = threading.Event()

    def stalled():
        yield {"image_raw": x[:10], "label": y[:10]}
        release.wait(timeout=10)  # the feed stalls until the test is done

    m = mlp()
    try:
        with pytest.raises(SparkgradTimeout, match="next batch from the dataset iterator"):
            m.fit(stalled(), verbose=0, prefetch_timeout=0.3)
    finally:
        release.set()
    assert m.step == 1
    with pytest.raises(InvalidArgumentError, match="prefetch"):
        m.fit(stalled(), verbose=0, prefetch=-1)


def test_compute_gradients_fills_grads_without_updating_params():
    m = mlp()
    x, y = toy(64)
    before = m.params.copy()
    loss, acc = m.compute_gradients(x, y)
    np.testing.assert_array_equal(m.params, before)
    assert np.abs(m.grads).max() > 0
    assert loss == pytest.approx(m.evaluate(x, y, batch_size=64)[0], rel=1e-6)
    g = m.grads.copy()
    m.apply_gradients(g)
    np.testing.assert_allclose(m.params, before - 0.1 * g, rtol=1e-6, atol=1e-7)


def test_same_seed_same_training():
    x, y = toy()
    runs = []
    for _ in range(2):
        m = Sequential([Dense(16, activation="relu", input_shape=(20,)), Dropout(0.3), Dense(4)], seed=9)
        m.compile(optimizer=SGD(0.1), loss="sparse_categorical_crossentropy")
        m.fit(x, y, batch_size=40, epochs=2, verbose=0)
        runs.append(m.params.copy())
    np.testing.assert_array_equal(runs[0], runs[1])


def test_categorical_crossentropy_takes_one_hot_targets():
    x, y = toy()
    m = Sequential([Dense(16, activation="relu", input_shape=(20,)), Dense(4, activation="softmax")], seed=3)
    m.compile(optimizer=Adam(0.01), loss="categorical_crossentropy")
    m.fit(x, np.eye(4)[y], batch_size=32, epochs=3, verbose=0)
    p = m.predict(x[:5])
    np.testing.assert_allclose(p.sum(1), 1.0, rtol=1e-5)
    assert m.evaluate(x, np.eye(4)[y])[1] > 0.8
    with pytest.raises(InvalidArgumentError, match="one-hot"):
        m.evaluate(x, y)


def test_bad_input_gets_specific_errors():
    m = mlp()
    x, y = toy(10)
    with pytest.raises(InvalidArgumentError, match=r"input_shape \(20,\)"):
        m.predict(np.zeros((3, 21), np.float32))
    with pytest.raises(InvalidArgumentError, match="label 7 of row 2"):
        m.compute_gradients(x, np.array([0, 1, 7, 0, 0, 0, 0, 0, 0, 0]))
    with pytest.raises(InvalidArgumentError, match="x has 10 rows but y has 9"):
        m.compute_gradients(x, y[:9])
    with pytest.raises(ModelError, match="compile"):
        Sequential([Dense(2, input_shape=(3,))]).fit(np.zeros((2, 3)), np.zeros(2), verbose=0)
    with pytest.raises(ModelError, match="Flatten"):
        Sequential([Conv2D(2, 3, input_shape=(5, 5, 1)), Dense(2)])
    with pytest.raises(ModelError, match="input_shape"):
        Sequential([Dense(2)])
    with pytest.raises(ValueError, match="unknown activation .mish."):
        Dense(3, activation="mish")
    with pytest.raises(ValueError, match="unknown loss 'mean_squared_errors'"):
        mlp().compile(loss="mean_squared_errors")


def test_fit_releases_the_gil():
    m = Sequential([Dense(256, activation="relu", input_shape=(784,)), Dense(10)], seed=0)
    m.compile(optimizer=SGD(0.01), loss="sparse_categorical_crossentropy")
    x = np.random.default_rng(0).random((4000, 784), dtype=np.float32)
    y = np.zeros(4000, np.int64)
    done = threading.Event()
    ticks = 0

    def train():
        m.fit(x, y, batch_size=100, epochs=3, verbose=0, log_every=1000)
        done.set()

    t = threading.Thread(target=train)
    t.start()
    while not done.is_set():
        ticks += 1
        done.wait(0.001)
    t.join(timeout=60)
    assert ticks > 5  # the main thread ran while C trained


def test_model_rejects_concurrent_use():
    m = mlp()
    m._core.train_steps  # noqa: B018
    # a busy model raises StateError instead of corrupting its buffers
    x = np.zeros((2000, 20), np.float32)
    y = np.zeros(2000, np.int32)
    errors = []

    def loop():
        try:
            for _ in range(20):
                m._core.train_steps(None, x, y, None, 0, 100, 20)
        except StateError as exc:
            errors.append(exc)

    ts = [threading.Thread(target=loop) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    for e in errors:
        assert "in use" in str(e)


def test_thread_count_can_be_set():
    old = get_num_threads()
    try:
        set_num_threads(1)
        assert get_num_threads() == 1
        set_num_threads(2)
        assert _core.get_num_threads() == 2
    finally:
        set_num_threads(old)
    with pytest.raises(InvalidArgumentError):
        set_num_threads(0)


def test_omp_num_threads_is_honoured():
    import subprocess
    import sys

    code = "from sparkgrad.nn import get_num_threads, configure_threads; print(get_num_threads(), configure_threads())"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1"]


def test_fit_on_a_spark_executor_uses_spark_task_cpus(monkeypatch):
    from sparkgrad import _threads as threads  # where configure_threads looks it up

    old = get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "spark_task_cpus", lambda: 1)
    try:
        set_num_threads(2)
        m = mlp()
        x, y = toy(64)
        m.fit(x, y, batch_size=32, epochs=1, verbose=0)
        assert get_num_threads() == 1
    finally:
        set_num_threads(old)


def test_dropout_is_identity_in_inference_and_random_in_training():
    x, y = toy(64)
    with_drop = Sequential([Dense(32, activation="relu", input_shape=(20,)), Dropout(0.5), Dense(4)], seed=3)
    plain = Sequential([Dense(32, activation="relu", input_shape=(20,)), Dense(4)], seed=3)
    plain.set_weights(with_drop.get_weights())
    np.testing.assert_array_equal(with_drop.predict(x), plain.predict(x))
    for m in (with_drop, plain):
        m.compile(optimizer=SGD(0.1), loss="sparse_categorical_crossentropy")
    a = with_drop.compute_gradients(x, y)[0]
    b = with_drop.compute_gradients(x, y)[0]
    assert a != b  # a fresh mask each training step
    assert plain.compute_gradients(x, y)[0] == plain.compute_gradients(x, y)[0]


def test_each_fit_call_trains_its_epochs_as_keras_does():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    m = Sequential([Dense(16, activation="relu", input_shape=(8,)), Dense(2)], seed=1)
    m.compile(optimizer=SGD(0.1), loss="sparse_categorical_crossentropy")
    losses = [m.fit(x, y, batch_size=32, epochs=1, verbose=0).history["loss"] for _ in range(3)]
    assert [len(h) for h in losses] == [1, 1, 1]
    assert m.step == 3 * 8
    assert losses[2][0] < losses[0][0]
