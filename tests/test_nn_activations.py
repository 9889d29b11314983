"""The Activation layer (the first op added after the op table, csrc/nn/nn_op_activation.c) and the
activations Dense and Conv2D fuse, against PyTorch: outputs and every gradient from the same weights,
to 1e-5 relative in fp32."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nn_torch_ref import TorchMirror, rel_err  # noqa: E402
from sparkgrad import _core  # noqa: E402
from sparkgrad.errors import ModelError  # noqa: E402
from sparkgrad.nn import Activation, Conv2D, Dense, Flatten, Sequential, load_model, save_model  # noqa: E402

ALL = ["relu", "leaky_relu", "elu", "selu", "gelu", "swish", "silu", "softplus", "tanh", "sigmoid", "linear"]


def _compare(model, x, y):
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=[])
    mirror = TorchMirror(model)
    loss = model.compute_gradients(x, y)
    want = mirror.loss(x, y)
    want.backward()
    assert loss == pytest.approx(float(want.detach()), rel=1e-5)
    assert rel_err(model.grads, mirror.flat_grads()) < 1e-5
    logits = mirror.forward(x).detach().numpy()
    assert rel_err(model.predict(x), logits) < 1e-5


@pytest.mark.parametrize("name", ALL)
def test_an_activation_layer_matches_torch_forward_and_backward(name):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, 7)).astype(np.float32) * 2
    y = rng.integers(0, 3, 16)
    model = Sequential([Dense(9, input_shape=(7,)), Activation(name), Dense(3)], seed=4)
    _compare(model, x, y)


@pytest.mark.parametrize("name", ["leaky_relu", "elu"])
def test_dense_and_conv2d_fuse_leaky_relu_and_elu_as_torch_computes_them(name):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(6, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 4, 6)
    model = Sequential(
        [Conv2D(3, 3, activation=name, input_shape=(6, 6, 2)), Flatten(), Dense(8, activation=name), Dense(4)],
        seed=5,
    )
    _compare(model, x, y)


def test_an_activation_first_and_on_images():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5, 5, 5, 2)).astype(np.float32)
    y = rng.integers(0, 2, 5)
    model = Sequential(
        [Activation("gelu", input_shape=(5, 5, 2)), Conv2D(3, 3), Activation("selu"), Flatten(), Dense(2)], seed=6
    )
    _compare(model, x, y)


def test_a_model_with_activation_layers_saves_and_loads(tmp_path):
    model = Sequential([Dense(8, input_shape=(4,)), Activation("swish"), Dense(1)], seed=1)
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)
    save_model(model, tmp_path / "m.sgmodel")
    back = load_model(tmp_path / "m.sgmodel")
    assert [type(layer).__name__ for layer in back.layers] == ["Dense", "Activation", "Dense"]
    np.testing.assert_array_equal(back.predict(x), model.predict(x))


def test_activations_a_layer_cannot_fuse_or_softmax_as_a_layer_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"Dense\(activation='gelu'\).*Activation\('gelu'\) after it"):
        Dense(4, activation="gelu")
    with pytest.raises(ValueError, match=r"Conv2D\(activation='swish'\)"):
        Conv2D(4, 3, activation="swish")
    with pytest.raises(ValueError, match="softmax is a head"):
        Activation("softmax")
    with pytest.raises(ValueError, match="unknown activation 'mish'"):
        Activation("mish")
    # the C core refuses it too, naming the layer (a tuple that bypassed the Python class)
    with pytest.raises(ModelError, match=r"layer 0 \(Dense\): activation 8 is not fused.*Activation layer"):
        _core.Model((1, 1, 3), [(_core.LAYER_KINDS.index("Dense"), 2, 0, 0, 0, 0, 8, 0.0, 0)])
