"""precision="bf16" (issue 16): Dense and Conv2D run oneDNN bf16 primitives with
f32 accumulation on bf16 copies of activations, weights and output gradients;
parameters, gradients, optimizer state and checkpoints stay float32.

The MLP step is checked exactly against a NumPy emulation of those roundings
(and loosely against fp32); the CNN against fp32 within what bf16 rounding
moves a gradient at initialisation (relu masks and max-pool winners flip, so
some 5% of the gradient norm, about as much as rounding only the inputs and
weights moves the fp32 gradient). Accuracy after training: test_nn_accuracy.py,
models (a) and (b) in bf16 beside their fp32 runs of the same seed."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from sparkgrad import _core
from sparkgrad.nn import Conv2D, Dense, Flatten, MaxPool2D, Sequential

needs_bf16 = pytest.mark.skipif(not _core.bf16_supported(), reason="this CPU has no native bf16 (AVX512_BF16/AMX)")


def bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> nearest bf16 (ties to even), as float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def mlp(seed=1, inputs=40):
    return Sequential([Dense(32, activation="relu", input_shape=(inputs,)), Dense(10)], seed=seed)


def mlp_odd(seed=1):
    """An odd input width: the optimizer's bf16 copy of the first kernel pairs its last row with zeros."""
    return mlp(seed, inputs=41)


def cnn(seed=1):
    return Sequential(
        [
            Conv2D(8, (3, 3), activation="relu", input_shape=(12, 12, 1)),
            MaxPool2D((2, 2)),
            Conv2D(16, (3, 3), activation="relu"),
            Flatten(),
            Dense(32, activation="relu"),
            Dense(10),
        ],
        seed=seed,
    )


def data(shape, n=64, seed=0):
    """Inputs and labels a linear teacher draws from them (coherent gradients)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, *shape)).astype(np.float32)
    flat = x.reshape(n, -1)
    y = np.argmax(flat @ rng.standard_normal((flat.shape[1], 10)), 1).astype(np.int32)
    return x, y


def one_step(make, precision, x, y, optimizer="sgd"):
    m = make()
    m.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", precision=precision)
    assert m.precision == precision
    p0 = m.params.copy()
    h = m.fit(x, y, batch_size=len(x), epochs=1, verbose=0, shuffle=False)
    return m, m.params - p0, h.history["loss"][0]


@needs_bf16
def test_bf16_mlp_gradients_are_the_bf16_rounded_products_accumulated_in_f32():
    x, y = data((40,))
    m = mlp()
    m.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", precision="bf16")
    assert m._core.bf16_layers(64) == 2
    m.compute_gradients(x, y)
    t = m.param_table
    P = m.params
    W1, b1 = P[t[0].offset : t[0].offset + t[0].size].reshape(40, 32), P[t[1].offset : t[1].offset + 32]
    W2, b2 = P[t[2].offset : t[2].offset + t[2].size].reshape(32, 10), P[t[3].offset : t[3].offset + 10]
    f64 = np.float64
    h = np.maximum(bf16(x).astype(f64) @ bf16(W1) + b1, 0).astype(np.float32)
    z = bf16(h).astype(f64) @ bf16(W2) + b2
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dz = ((p - np.eye(10)[y]) / len(x)).astype(np.float32)
    dh = ((bf16(dz).astype(f64) @ bf16(W2).T) * (h > 0)).astype(np.float32)
    ref = np.concatenate(
        [
            (bf16(x).astype(f64).T @ bf16(dh)).ravel(),
            bf16(dh).astype(f64).sum(0),
            (bf16(h).astype(f64).T @ bf16(dz)).ravel(),
            bf16(dz).astype(f64).sum(0),
        ]
    )
    assert np.abs(m.grads - ref).max() <= 1e-5 * np.abs(ref).max()
    # and it is not the fp32 gradient
    m32 = mlp()
    m32.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    m32.compute_gradients(x, y)
    rel = np.linalg.norm(m.grads - m32.grads) / np.linalg.norm(m32.grads)
    assert 1e-4 < rel < 2e-2


@needs_bf16
# Adam's first step is about lr * sign(g): the gradients near zero that bf16
# rounding flips move it by 2 lr, hence its wider bound
@pytest.mark.parametrize(("optimizer", "tol"), [("sgd", 2e-2), ("adam", 0.15)])
def test_bf16_mlp_step_matches_the_fp32_step(optimizer, tol):
    x, y = data((40,))
    _, d32, l32 = one_step(mlp, "fp32", x, y, optimizer)
    mb, d16, l16 = one_step(mlp, "bf16", x, y, optimizer)
    assert abs(l16 - l32) <= 1e-2 * abs(l32)
    assert np.linalg.norm(d16 - d32) <= tol * np.linalg.norm(d32)
    assert mb.params.dtype == np.float32 and mb.grads.dtype == np.float32


@needs_bf16
def test_bf16_cnn_step_matches_the_fp32_step_within_bf16_rounding():
    x, y = data((12, 12, 1))
    m32, d32, l32 = one_step(cnn, "fp32", x, y)
    m16, d16, l16 = one_step(cnn, "bf16", x, y)
    assert m16._core.bf16_layers(64) == 4
    assert abs(l16 - l32) <= 1e-2 * abs(l32)
    assert np.linalg.norm(d16 - d32) <= 0.1 * np.linalg.norm(d32)
    # the output layer sees only the rounding of its own inputs
    last = [t for t in m16.param_table if t.layer == 5 and not t.is_bias][0]
    sl = slice(last.offset, last.offset + last.size)
    assert np.linalg.norm(d16[sl] - d32[sl]) <= 1e-2 * np.linalg.norm(d32[sl])
    # inference in bf16 is close to fp32 (same weights)
    m16.params[:] = m32.params
    p32, p16 = m32.predict(x), m16.predict(x)
    assert np.abs(p16 - p32).max() < 2e-2
    e32, e16 = m32.evaluate(x, y), m16.evaluate(x, y)
    assert abs(e16[0] - e32[0]) <= 1e-2 * e32[0]


@needs_bf16
@pytest.mark.parametrize(
    ("make", "shape", "optimizer"),
    [(mlp, (40,), "sgd"), (mlp_odd, (41,), "sgd"), (mlp_odd, (41,), "adam"), (cnn, (12, 12, 1), "adadelta")],
)
def test_bf16_training_is_the_same_in_one_run_of_steps_or_one_call_per_step(make, shape, optimizer):
    """The bf16 copies (inputs gathered into bf16, activations handed on in bf16,
    weights converted per step) carry no state from one call into the next: a
    run of steps in one call and one call per step train bit for bit alike."""
    x, y = data(shape, n=96)
    runs = []
    for log_every in (1, 1000):
        m = make()
        m.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", precision="bf16")
        m.fit(x, y, batch_size=32, epochs=2, verbose=0, log_every=log_every)
        runs.append(m.params.copy())
    np.testing.assert_array_equal(runs[0], runs[1])


@needs_bf16
def test_bf16_weights_changed_between_runs_are_converted_again():
    """Weights set from Python after a run are the ones the next step uses."""
    x, y = data((40,))
    m = mlp()
    m.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", precision="bf16")
    m.fit(x, y, batch_size=len(x), epochs=3, verbose=0, shuffle=False)
    new = mlp(seed=5).params
    m.params[:] = new
    m.fit(x, y, batch_size=len(x), epochs=1, verbose=0, shuffle=False)
    ref = mlp(seed=5)
    ref.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", precision="bf16")
    ref.fit(x, y, batch_size=len(x), epochs=1, verbose=0, shuffle=False)
    np.testing.assert_array_equal(m.params, ref.params)


@needs_bf16
def test_precision_is_chosen_per_compile_and_checkpoints_stay_fp32(tmp_path):
    x, y = data((40,))
    m = mlp()
    m.compile(optimizer="adam", loss="sparse_categorical_crossentropy", precision="bf16")
    m.fit(x, y, batch_size=16, epochs=1, verbose=0)
    path = str(tmp_path / "m.sgck")
    m.save(path)
    back = mlp(seed=7)
    back.compile(optimizer="adam", loss="sparse_categorical_crossentropy")  # fp32
    back.load(path)
    assert back.precision == "fp32"
    np.testing.assert_array_equal(back.params, m.params)
    # and back into bf16: the same float32 weights
    again = mlp(seed=8)
    again.compile(optimizer="adam", loss="sparse_categorical_crossentropy", precision="bf16")
    again.load(path)
    np.testing.assert_array_equal(again.params, m.params)
    m.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    assert m.precision == "fp32" and m._core.bf16_layers(16) == 0
    with pytest.raises(ValueError, match="precision"):
        m.compile(optimizer="sgd", precision="fp16")


def test_bf16_falls_back_to_fp32_with_one_warning_where_the_cpu_lacks_it():
    code = (
        "import warnings, numpy as np\n"
        "from sparkgrad import _core\n"
        "from sparkgrad.nn import Sequential, Dense\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    for _ in range(2):\n"
        "        m = Sequential([Dense(8, activation='relu', input_shape=(4,)), Dense(3)], seed=1)\n"
        "        m.compile(optimizer='sgd', precision='bf16')\n"
        "        m.fit(np.ones((8, 4), np.float32), np.zeros(8, np.int32), batch_size=4, verbose=0)\n"
        "print(_core.bf16_supported(), m.precision, m._core.bf16_layers(4), len(w))\n"
        "print(w[0].message if w else '')\n"
    )
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    first, message = out.stdout.splitlines()[:2]
    assert first.split() == ["False", "fp32", "0", "1"]
    assert "no native bf16" in message and "running fp32" in message
