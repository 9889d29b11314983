"""Accuracy on real data: Debian's Fashion-MNIST (train 60k, test 10k).

Model (a), the TensorFlowOnSpark walkthrough MLP: 784-128-64-10 ReLU, truncated
normal stddev 1/sqrt(fan_in), zero biases, sparse softmax cross-entropy, SGD
lr 0.07, batch 100, 5 epochs. Model (b), the HorovodRunner Keras CNN (slow).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from sparkgrad import _core
from sparkgrad.data.idx import FASHION_MNIST_DIR, fashion_mnist
from sparkgrad.nn import SGD, Adadelta, Sequential
from sparkgrad.nn.models import horovod_cnn, walkthrough_mlp

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz")),
    reason=f"Fashion-MNIST not installed in {FASHION_MNIST_DIR}",
)


def load(flat: bool):
    x, y = fashion_mnist("train")
    xt, yt = fashion_mnist("test")
    shape = (-1, 784) if flat else (-1, 28, 28, 1)
    return (x.reshape(shape).astype(np.float32) / 255, y, xt.reshape(shape).astype(np.float32) / 255, yt)


def model_a(seed: int) -> Sequential:
    m = walkthrough_mlp(seed=seed)
    m.compile(optimizer=SGD(0.07), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return m


@pytest.fixture(scope="module")
def model_a_fp32():
    """Model (a) trained in fp32 on standardised pixels: (test accuracy, steps, seconds).

    Per-pixel standardisation with training-set statistics. With pixels only
    scaled to [0, 1] this recipe ends at about 0.85 after 5 epochs, in
    PyTorch as well as here (test_model_a prints it for the record)."""
    x, y, xt, yt = load(flat=True)
    mu, sd = x.mean(0), x.std(0) + 0.05
    started = time.monotonic()
    m = model_a(seed=1)
    m.fit((x - mu) / sd, y, batch_size=100, epochs=5, verbose=0)
    elapsed = time.monotonic() - started
    return m.evaluate((xt - mu) / sd, yt)[1], m.step, elapsed


def model_b_accuracy(learning_rate: float, epochs: int, rows: int | None = None) -> tuple[float, float]:
    """Model (b), the HorovodRunner CNN (Adadelta rho 0.95, eps 1e-7, batch 128, seed 1), trained in fp32 on
    the first ``rows`` training images (all by default): (test accuracy on all 10k, seconds)."""
    x, y, xt, yt = load(flat=False)
    m = horovod_cnn(seed=1)
    m.compile(optimizer=Adadelta(learning_rate=learning_rate), loss="categorical_crossentropy", metrics=["accuracy"])
    onehot = np.eye(10, dtype=np.float32)
    started = time.monotonic()
    m.fit(x[:rows], onehot[y[:rows]], batch_size=128, epochs=epochs, verbose=0)
    elapsed = time.monotonic() - started
    return m.evaluate(xt, onehot[yt])[1], elapsed


@pytest.fixture(scope="module")
def model_b_fp32():
    """Model (b) in the recipe of issue 4 (lr 0.1, 3 epochs). Only the bf16 comparison takes it (4-5 minutes
    on 2 AVX2 cores, where that test is skipped)."""
    return model_b_accuracy(0.1, 3)


def test_model_a_reaches_087_on_fashion_mnist_in_5_epochs(model_a_fp32):
    acc, steps, elapsed = model_a_fp32
    x, y, xt, yt = load(flat=True)
    raw = model_a(seed=1)
    raw.fit(x, y, batch_size=100, epochs=5, verbose=0)
    raw_acc = raw.evaluate(xt, yt)[1]
    print(
        f"\nmodel (a) Fashion-MNIST test accuracy after 5 epochs: {acc:.4f} ({elapsed:.1f} s); "
        f"pixels in [0, 1] without standardisation: {raw_acc:.4f}"
    )
    assert steps == 5 * 600
    assert acc >= 0.87


@pytest.mark.slow
@pytest.mark.timeout(600)  # 30k CNN samples: 36 s on an idle 2-core AVX2 machine
def test_model_b_keras_cnn_learns_fashion_mnist_in_one_epoch():
    """The HorovodRunner CNN with the Keras mnist_cnn example's Adadelta lr 1.0
    (rho 0.95, eps 1e-7), batch 128, one epoch over the first 30,000 training
    images, tested on all 10,000: 0.8445 here (2026-12-07, AVX2; all 60,000
    images: 0.869 in 62 s).

    The recipe issue 4 specified (lr 0.1, 3 epochs: about 0.85 here, 0.844 in
    TensorFlow 2.21 Keras, as Adadelta's first steps are about lr * sqrt(eps))
    takes 180k samples, 4-5 minutes on 2 AVX2 cores: bench/accuracy_cnn.py
    measures it beside Keras, and the bf16 test below runs it where bf16 is
    native. Every step matches PyTorch to 1e-5 (test_nn_torch.py); the bound
    here catches a broken network."""
    acc, elapsed = model_b_accuracy(1.0, 1, rows=30000)
    print(f"\nmodel (b), Adadelta lr 1.0, 30k images once: Fashion-MNIST test accuracy {acc:.4f} ({elapsed:.0f} s)")
    assert acc >= 0.82


needs_bf16 = pytest.mark.skipif(not _core.bf16_supported(), reason="this CPU has no native bf16 (AVX512_BF16/AMX)")


@needs_bf16
@pytest.mark.timeout(900)
def test_model_a_in_bf16_is_within_03_points_of_fp32_after_5_epochs(model_a_fp32):
    """Model (a) in bf16 beside the fp32 run of the same seed on this machine (the fp32
    figure depends on its threads and oneDNN build, so it is measured, not quoted)."""
    x, y, xt, yt = load(flat=True)
    mu, sd = x.mean(0), x.std(0) + 0.05
    m = walkthrough_mlp(seed=1)
    m.compile(optimizer=SGD(0.07), loss="sparse_categorical_crossentropy", precision="bf16")
    started = time.monotonic()
    m.fit((x - mu) / sd, y, batch_size=100, epochs=5, verbose=0)
    elapsed = time.monotonic() - started
    acc = m.evaluate((xt - mu) / sd, yt)[1]
    print(f"\nmodel (a) bf16: test accuracy {acc:.4f} ({elapsed:.1f} s), fp32 {model_a_fp32[0]:.4f}")
    assert abs(acc - model_a_fp32[0]) <= 0.003


@needs_bf16
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_model_b_in_bf16_is_within_05_points_of_fp32_after_3_epochs(model_b_fp32):
    """Model (b) in bf16 beside the fp32 run of the same seed."""
    x, y, xt, yt = load(flat=False)
    onehot = np.eye(10, dtype=np.float32)
    m = horovod_cnn(seed=1)
    m.compile(optimizer=Adadelta(learning_rate=0.1), loss="categorical_crossentropy", precision="bf16")
    assert m._core.bf16_layers(128) == 4
    started = time.monotonic()
    m.fit(x, onehot[y], batch_size=128, epochs=3, verbose=0)
    elapsed = time.monotonic() - started
    acc = m.evaluate(xt, onehot[yt])[1]
    print(f"\nmodel (b) bf16: test accuracy {acc:.4f} ({elapsed:.0f} s), fp32 {model_b_fp32[0]:.4f}")
    assert abs(acc - model_b_fp32[0]) <= 0.005


KERAS_MODEL_A = """
import sys
import numpy as np
import tensorflow as tf
d = np.load(sys.argv[1])
x, y, xt = d["x"], d["y"], d["xt"]
model = tf.keras.Sequential([tf.keras.Input((784,)), tf.keras.layers.Dense(128, activation="relu"),
                             tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(10)])
model.set_weights([d[f"w{i}"] for i in range(6)])
model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=0.07),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
batch = int(d["batch"])
for i in range(0, len(x), batch):
    model.train_on_batch(x[i : i + batch], y[i : i + batch])
out = {f"w{i}": w for i, w in enumerate(model.get_weights())}
np.savez(sys.argv[2], predicted=model.predict(xt, batch_size=1000, verbose=0).argmax(1), **out)
"""


@pytest.mark.timeout(600)
def test_model_a_trains_to_kerass_weights_from_the_same_start_and_batches(tmp_path):
    """The walkthrough MLP in sparkgrad and in Keras, given the same initial weights
    and the same batches (raw [0, 1] pixels, SGD 0.07, batch 200, as bench_cluster's
    synchronous run), end with the same weights and the same test predictions: what
    is left between the two systems' accuracies in bench_cluster is the seed. Runs
    where TensorFlow is importable or SPARKGRAD_TF_PYTHON names an interpreter
    that has it (`make bench` installs it into .venv)."""
    import subprocess

    from tf_fixtures import tf_python

    python = tf_python()
    x, y, xt, yt = load(flat=True)
    steps, batch = 100, 200
    order = np.random.default_rng(42).permutation(len(x))[: steps * batch]
    x, y = x[order], y[order].astype(np.int64)
    m = model_a(seed=42)
    start = m.get_weights()
    data = tmp_path / "in.npz"
    np.savez(data, x=x, y=y, xt=xt, batch=batch, **{f"w{i}": w for i, w in enumerate(start)})
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    out = subprocess.run(
        [python, "-c", KERAS_MODEL_A, str(data), str(tmp_path / "out.npz")],
        capture_output=True, text=True, timeout=540, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    for i in range(0, len(x), batch):
        m.train_on_batch(x[i : i + batch], y[i : i + batch])
    keras = np.load(tmp_path / "out.npz")
    moved = 0.0
    for i, (ours, w0) in enumerate(zip(m.get_weights(), start, strict=True)):
        theirs = keras[f"w{i}"]
        moved = max(moved, float(np.abs(ours - w0).max()))
        assert np.abs(ours - theirs).max() <= 1e-4 * max(1.0, float(np.abs(theirs).max())), f"tensor {i}"
    assert moved > 1e-2  # the weights did train
    ours_pred = m.predict(xt).argmax(1)
    agree = float((ours_pred == keras["predicted"]).mean())
    acc, keras_acc = float((ours_pred == yt).mean()), float((keras["predicted"] == yt).mean())
    print(
        f"\nmodel (a), {steps} steps from the same start: sparkgrad {acc:.4f}, Keras {keras_acc:.4f}, {agree:.2%} agree"
    )
    assert agree >= 0.999
