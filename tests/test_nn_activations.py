"""The Activation layer (the first op added after the op table, csrc/nn/nn_op_activation.c) and every
activation on Dense and Conv2D (fused as a post-op, or run after the primitive), against PyTorch:
outputs and every gradient from the same weights, to 1e-5 relative in fp32."""

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


@pytest.mark.parametrize("name", [a for a in ALL if a not in ("silu", "linear")])
def test_dense_and_conv2d_take_every_activation_as_torch_computes_it(name):
    # relu, leaky_relu, elu, tanh, sigmoid fused into the primitive; gelu, selu, swish, softplus run as eltwise
    # primitives after it, backward from its output (C: nn_weighted_unfused)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(6, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 4, 6)
    model = Sequential(
        [Conv2D(3, 3, activation=name, input_shape=(6, 6, 2)), Flatten(), Dense(8, activation=name), Dense(4)],
        seed=5,
    )
    _compare(model, x, y)
    # the same arithmetic as the linear layer followed by an Activation layer
    twin = Sequential(
        [Conv2D(3, 3, input_shape=(6, 6, 2)), Activation(name), Flatten(), Dense(8), Activation(name), Dense(4)],
        seed=5,
    )
    twin.set_weights(model.get_weights())
    np.testing.assert_allclose(twin.predict(x), model.predict(x), rtol=1e-6, atol=1e-7)


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


def test_softmax_as_a_layer_and_unknown_activations_are_refused():
    with pytest.raises(ValueError, match="softmax is a head"):
        Activation("softmax")
    with pytest.raises(ValueError, match="unknown activation 'mish'"):
        Activation("mish")
    with pytest.raises(ValueError, match="unknown activation 'mish'"):
        Dense(3, activation="mish")
    # the C core refuses it too, naming the layer (a description that bypassed the Python class)
    with pytest.raises(ModelError, match=r"layer 0 \(Dense\): unknown activation 99"):
        _core.Model([(1, 1, 3)], [{"kind": _core.LAYER_KINDS.index("Dense"), "units": 2, "activation": 99}])
