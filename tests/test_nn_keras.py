"""Keras parity without TensorFlow: tests/fixtures/keras/keras.npz holds what Keras 3 computed
(tests/fixtures/keras/make_keras.py, run with the anchors extra) for models whose weights are set here
into their sparkgrad twins. A functional model with two inputs, a shared layer, Add, Concatenate, Reshape
and two outputs (predictions, evaluate's losses and accuracy, the total loss's gradients); every activation,
fused into Dense and as an Activation layer; binary classification's loss and metrics (accuracy, ROC and PR
AUC, precision, recall) with sample weights; regression's losses (mse, mae, huber, poisson) and metrics;
BatchNormalization and LayerNormalization after Dense and Conv2D (inference on the moving statistics, a
training pass's output, gradients and moving statistics, one SGD step).
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from sparkgrad.nn import (
    SGD,
    Activation,
    BatchNormalization,
    Conv2D,
    Dense,
    Flatten,
    LayerNormalization,
    Sequential,
    losses,
    metrics,
)
from test_nn_functional import build

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "keras" / "keras.npz"
ACTS = ["relu", "leaky_relu", "elu", "selu", "gelu", "swish", "softplus", "tanh", "sigmoid", "linear"]
FUSED = {"relu", "leaky_relu", "elu", "tanh", "sigmoid", "linear"}


@pytest.fixture(scope="module")
def k():
    with np.load(FIXTURE) as f:
        return {name: f[name] for name in f.files}


def case(k, prefix: str) -> dict:
    return {name[len(prefix) + 1 :]: v for name, v in k.items() if name.startswith(prefix + "/")}


def test_functional_model_matches_keras(k):
    f = case(k, "functional")
    model = build(outputs_as_dict=True)  # the graph make_keras.py builds in Keras
    model.compile(
        optimizer=SGD(0.1),
        loss={"reg": "mse", "cls": "sparse_categorical_crossentropy"},
        loss_weights={"reg": 0.5, "cls": 2.0},
        metrics={"cls": ["accuracy"]},
    )
    count = len(model.get_weights())
    model.set_weights([f[f"w{i}"] for i in range(count)])
    x = {"a": f["xa"], "b": f["xb"]}
    y = {"reg": f["yreg"], "cls": f["ycls"]}
    out = model.predict(x)
    np.testing.assert_allclose(out["reg"], f["reg"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["cls"], f["cls"], rtol=1e-5, atol=1e-6)
    logs = model.evaluate(x, y, return_dict=True)
    for key in ("loss", "reg_loss", "cls_loss", "cls_accuracy"):
        assert logs[key] == pytest.approx(float(f[key]), rel=1e-5), key
    model.compute_gradients(x, y)
    for t, i in zip(model.param_table, range(count), strict=True):
        got = model.grads[t.offset : t.offset + t.size].reshape(t.shape)
        np.testing.assert_allclose(got, f[f"g{i}"], rtol=1e-4, atol=1e-6, err_msg=f"gradient {i}")


@pytest.mark.parametrize("act", ACTS)
def test_activations_match_keras(k, act):
    f = case(k, f"activations/{act}")
    layers = [Dense(6, activation=act if act in FUSED else None, input_shape=(5,))]
    if act not in FUSED:
        layers.append(Activation(act))
    model = Sequential([*layers, Activation(act)], seed=0)
    model.set_weights([f["kernel"], f["bias"]])
    np.testing.assert_allclose(model.predict(k["activations/x"]), f["y"], rtol=1e-5, atol=1e-6)


def test_binary_classification_loss_and_metrics_match_keras(k):
    f = case(k, "binary")
    model = Sequential([Dense(8, activation="relu", input_shape=(6,)), Dense(1, activation="sigmoid")], seed=0)
    model.compile(
        loss="binary_crossentropy",
        metrics=[
            metrics.BinaryAccuracy(name="accuracy"),
            metrics.AUC(name="auc"),
            metrics.AUC(curve="PR", name="pr_auc"),
            metrics.Precision(name="precision"),
            metrics.Recall(name="recall"),
        ],
    )
    model.set_weights([f[f"w{i}"] for i in range(4)])
    logs = model.evaluate(f["x"], f["y"], sample_weight=f["sw"], return_dict=True)
    for key in ("loss", "accuracy", "auc", "pr_auc", "precision", "recall"):
        assert logs[key] == pytest.approx(float(f[key]), rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("loss", ["mse", "mae", "huber", "poisson"])
def test_regression_losses_and_metrics_match_keras(k, loss):
    f = case(k, f"regression/{loss}")
    head = "softplus" if loss == "poisson" else None
    layers = [Dense(8, activation="relu", input_shape=(5,)), Dense(2)]
    if head:
        layers.append(Activation(head))
    model = Sequential(layers, seed=0)
    model.compile(loss=losses.Huber(delta=0.7) if loss == "huber" else loss, metrics=["mse", "mae", "rmse"])
    model.set_weights([f[f"w{i}"] for i in range(4)])
    logs = model.evaluate(k["regression/x"], k["regression/y"], return_dict=True)
    for key in ("loss", "mse", "mae", "rmse"):
        assert logs[key] == pytest.approx(float(f[key]), rel=1e-5), key


NORMALIZATION = {
    "dense": lambda: Sequential(
        [
            Dense(8, input_shape=(6,)),
            BatchNormalization(momentum=0.9),
            Activation("relu"),
            LayerNormalization(),
            Dense(2),
        ]
    ),
    "conv": lambda: Sequential(
        [
            Conv2D(3, 3, input_shape=(5, 5, 2)),
            BatchNormalization(center=False, epsilon=0.01),
            Flatten(),
            Dense(1),
        ]
    ),
}


@pytest.mark.parametrize("name", sorted(NORMALIZATION))
def test_normalization_matches_keras(k, name):
    f = case(k, f"normalization/{name}")
    model = NORMALIZATION[name]()
    model.compile(optimizer=SGD(0.1), loss="mse")
    count = len(model.get_weights())
    start = [f[f"w{i}"] for i in range(count)]
    model.set_weights(start)
    np.testing.assert_allclose(model.predict(f["x"]), f["pred"], rtol=1e-5, atol=1e-5)
    # a training pass: the batch's statistics, the gradients, and the moving statistics moved once
    loss = model.compute_gradients(f["x"], f["y"])
    assert loss == pytest.approx(float(f["loss"]), rel=1e-5)
    for t, i in zip(model.param_table, range(count), strict=False):
        got = model.grads[t.offset : t.offset + t.size].reshape(t.shape)
        np.testing.assert_allclose(got, f[f"g{i}"], rtol=1e-4, atol=1e-5, err_msg=f"gradient {i} ({t.name})")
    for i, w in enumerate(model.get_weights()):
        np.testing.assert_allclose(w, f[f"after_forward{i}"], rtol=1e-5, atol=1e-6, err_msg=f"weight {i}")
    model.set_weights(start)
    model.train_on_batch(f["x"], f["y"])
    for i, w in enumerate(model.get_weights()):
        np.testing.assert_allclose(w, f[f"after_step{i}"], rtol=1e-4, atol=1e-5, err_msg=f"weight {i} after a step")
