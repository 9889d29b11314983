"""Keras' functional API on the C engine (sparkgrad.nn.Model, Input, layers called on tensors): a graph with
two inputs, a tensor read by several layers, a shared layer, Add, Concatenate, Reshape, Dense on a rank-3
input and two outputs with their own losses and loss weights, against PyTorch autograd in fp32 (outputs,
losses and every gradient to 1e-5); inputs and targets as dicts or lists; fit, evaluate, predict,
save/load and checkpoints; and the errors of bad graphs and bad data, naming layers, inputs and shapes.

Not here: the C finite-difference checks of the same graph (tests/c/test_nn_graph.c), Keras parity of a
functional model (test_nn_keras_functional.py) and functional models in the distributed modes
(test_nn_distributed.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from sparkgrad.errors import CheckpointError, InvalidArgumentError, ModelError
from sparkgrad.nn import (
    SGD,
    Add,
    Concatenate,
    Dense,
    Flatten,
    Input,
    Model,
    Reshape,
    Sequential,
    load_model,
    model_from_bytes,
    model_to_bytes,
    save_model,
)

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch (pip install -e '.[test]')")
N = 12


def build(seed: int = 3, outputs_as_dict: bool = False) -> Model:
    """a [4] and b [3, 2]:
    h = Dense(5, tanh)(a), read by three layers; s = shared(h), shared(s) (one Dense(5, tanh) called twice);
    r = Add([h, shared(shared(h))]); q = Reshape((6,))(Dense(2)(b)) (Dense on the last axis);
    reg = Dense(1)(Concatenate([r, q, h])) (MSE, weight 0.5); cls = Dense(3, softmax)(r) (sparse CE, weight 2)."""
    a = Input(shape=(4,), name="a")
    b = Input(shape=(3, 2), name="b")
    h = Dense(5, activation="tanh")(a)
    shared = Dense(5, activation="tanh", name="shared")
    r = Add()([h, shared(shared(h))])
    q = Reshape((6,))(Dense(2)(b))
    reg = Dense(1, name="reg")(Concatenate()([r, q, h]))
    cls = Dense(3, activation="softmax", name="cls")(r)
    outputs = {"reg": reg, "cls": cls} if outputs_as_dict else [reg, cls]
    return Model([a, b], outputs, seed=seed, name="two_heads")


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    xa = rng.normal(size=(N, 4)).astype(np.float32)
    xb = rng.normal(size=(N, 3, 2)).astype(np.float32)
    yreg = rng.normal(size=(N, 1)).astype(np.float32)
    ycls = rng.integers(0, 3, N).astype(np.int64)
    return xa, xb, yreg, ycls


def compiled(model: Model) -> Model:
    model.compile(
        optimizer=SGD(0.1),
        loss={"reg": "mse", "cls": "sparse_categorical_crossentropy"},
        loss_weights={"reg": 0.5, "cls": 2.0},
        metrics={"cls": ["accuracy"]},
    )
    return model


def torch_forward(weights, xa, xb):
    """The graph of `build` in PyTorch on torch leaves of ``weights`` (get_weights' order)."""
    k0, b0, ks, bs, kq, bq, kr, br, kc, bc = weights
    h = torch.tanh(torch.from_numpy(xa) @ k0 + b0)
    s = torch.tanh(torch.tanh(h @ ks + bs) @ ks + bs)
    r = h + s
    q = (torch.from_numpy(xb) @ kq + bq).reshape(N, 6)
    reg = torch.cat([r, q, h], dim=1) @ kr + br
    logits = r @ kc + bc
    return reg, logits


@needs_torch
def test_graph_matches_torch_outputs_losses_and_gradients():
    model = compiled(build())
    xa, xb, yreg, ycls = data()
    names = [f"{type(model.layers[t.layer]).__name__}{t.layer}{'b' if t.is_bias else 'k'}" for t in model.param_table]
    assert len(model.get_weights()) == 10, names  # the shared Dense's kernel and bias once
    leaves = [torch.tensor(w, requires_grad=True) for w in model.get_weights()]
    reg, logits = torch_forward(leaves, xa, xb)
    mse = ((reg - torch.from_numpy(yreg)) ** 2).mean()
    ce = F.cross_entropy(logits, torch.from_numpy(ycls))
    total = 0.5 * mse + 2.0 * ce
    total.backward()

    out = model.predict({"a": xa, "b": xb})
    np.testing.assert_allclose(out[0], reg.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[1], torch.softmax(logits, 1).detach().numpy(), rtol=1e-5, atol=1e-6)
    result = model.compute_gradients([xa, xb], [yreg, ycls])
    assert model.metrics_names == ["loss", "reg_loss", "cls_loss", "cls_accuracy"]
    np.testing.assert_allclose(result[:3], [total.item(), mse.item(), ce.item()], rtol=1e-5)
    grads = model.grads
    for t, leaf, name in zip(model.param_table, leaves, names, strict=True):
        got = grads[t.offset : t.offset + t.size].reshape(t.shape)
        np.testing.assert_allclose(got, leaf.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def test_dict_and_list_inputs_train_the_same():
    xa, xb, yreg, ycls = data()
    by_dict, by_list = compiled(build()), compiled(build())
    h1 = by_dict.fit({"a": xa, "b": xb}, {"reg": yreg, "cls": ycls}, batch_size=4, epochs=2, verbose=0, shuffle=False)
    h2 = by_list.fit([xa, xb], [yreg, ycls], batch_size=4, epochs=2, verbose=0, shuffle=False)
    assert h1.history == h2.history
    assert set(h1.history) == {"loss", "reg_loss", "cls_loss", "cls_accuracy"}
    np.testing.assert_array_equal(by_dict.params, by_list.params)
    # the total is the weighted sum of the outputs'
    assert h1.history["loss"][-1] == pytest.approx(0.5 * h1.history["reg_loss"][-1] + 2 * h1.history["cls_loss"][-1])
    logs = by_dict.evaluate([xa, xb], [yreg, ycls], return_dict=True)
    assert list(logs) == by_dict.metrics_names
    # validation data and sample weights take the same forms
    h3 = by_list.fit(
        [xa, xb], [yreg, ycls], batch_size=6, epochs=1, verbose=0, validation_data=({"a": xa, "b": xb}, [yreg, ycls])
    )
    assert "val_cls_accuracy" in h3.history and "val_reg_loss" in h3.history
    w = np.linspace(0.5, 1.5, N).astype(np.float32)
    loss_w = by_list.evaluate([xa, xb], [yreg, ycls], sample_weight=w)[0]
    assert loss_w != pytest.approx(by_list.evaluate([xa, xb], [yreg, ycls])[0])


def test_an_iterable_of_batches_of_several_inputs_trains_as_arrays_do():
    xa, xb, yreg, ycls = data()
    by_arrays, by_batches = compiled(build()), compiled(build())
    by_arrays.fit([xa, xb], [yreg, ycls], batch_size=4, epochs=1, verbose=0, shuffle=False)
    batches = [({"a": xa[i : i + 4], "b": xb[i : i + 4]}, [yreg[i : i + 4], ycls[i : i + 4]]) for i in range(0, N, 4)]
    by_batches.fit(batches, epochs=1, verbose=0)
    np.testing.assert_allclose(by_batches.params, by_arrays.params, rtol=1e-6, atol=1e-7)
    assert by_batches.evaluate(batches) == pytest.approx(by_arrays.evaluate([xa, xb], [yreg, ycls]), rel=1e-6)


def test_predict_returns_outputs_in_the_form_the_model_was_given():
    xa, xb, _, _ = data()
    as_list = build()
    as_dict = build(outputs_as_dict=True)
    out_list = as_list.predict([xa, xb])
    out_dict = as_dict.predict({"a": xa, "b": xb}, batch_size=5)
    assert isinstance(out_list, list) and [o.shape for o in out_list] == [(N, 1), (N, 3)]
    assert list(out_dict) == ["reg", "cls"]
    # batches of 5 and of the default size: the matrix products may round the last bit of a row differently
    np.testing.assert_allclose(as_dict.predict([xa, xb])["reg"], out_dict["reg"], rtol=1e-6, atol=1e-7)
    # weights are listed in Keras' order: a dict's outputs are walked in key order ("cls" first)
    assert [as_dict.layer_names[t.layer] for t in as_dict.param_table][-4:] == ["cls", "cls", "reg", "reg"]
    assert [as_list.layer_names[t.layer] for t in as_list.param_table][-4:] == ["reg", "reg", "cls", "cls"]


def test_get_layer_by_name_or_index():
    model = build()
    shared = model.get_layer("shared")
    assert model.layers.count(shared) == 2  # a shared layer is listed at each of its calls
    assert model.get_layer(index=0) is model.layers[0] and model.get_layer("dense_1") is not None
    with pytest.raises(ValueError, match=r"no layer named 'nope'; the layers are \['add', 'cls'"):
        model.get_layer("nope")
    with pytest.raises(ValueError, match="give a name or an index"):
        model.get_layer()


def test_summary_lists_inputs_and_connections():
    text = build().summary(print_fn=None)
    assert "a (InputLayer)" in text and "b (InputLayer)" in text
    assert "shared (Dense)" in text and "Connected to" in text
    assert "concatenate" in text and "(None, 16)" in text  # 5 + 6 + 5
    assert "(None, 3, 2)" in text  # Dense(2) on b's last axis
    # a Sequential keeps its table
    seq = Sequential([Dense(3, input_shape=(2,)), Dense(1)], seed=0)
    assert isinstance(seq, Model) and seq.is_chain and "Connected to" not in seq.summary(print_fn=None)


def test_save_load_and_checkpoints_keep_the_graph(tmp_path):
    xa, xb, yreg, ycls = data()
    model = compiled(build(outputs_as_dict=True))
    model.fit([xa, xb], [yreg, ycls], batch_size=4, epochs=1, verbose=0)
    save_model(model, tmp_path / "m.sgmodel")
    back = load_model(tmp_path / "m.sgmodel")
    assert back.output_names == ["reg", "cls"] and back.input_names == ["a", "b"]
    assert back.loss == ["mean_squared_error", "sparse_categorical_crossentropy"]
    assert back.loss_weights == [0.5, 2.0]
    got, want = back.predict({"a": xa, "b": xb}), model.predict({"a": xa, "b": xb})
    np.testing.assert_array_equal(got["cls"], want["cls"])
    assert back.evaluate([xa, xb], [yreg, ycls]) == pytest.approx(model.evaluate([xa, xb], [yreg, ycls]))
    assert model_from_bytes(model_to_bytes(back)).num_params == model.num_params
    # a checkpoint restores into the same graph and refuses another
    model.save(tmp_path / "c.sgck")
    other = compiled(build(seed=9, outputs_as_dict=True))
    other.load(tmp_path / "c.sgck")
    np.testing.assert_array_equal(other.params, model.params)
    a = Input(shape=(4,), name="a")
    b = Input(shape=(3, 2), name="b")
    h = Dense(5, activation="tanh")(a)
    different = Model([a, b], [Dense(1, name="reg")(Concatenate()([h, Flatten()(b)])), Dense(3, name="cls")(h)])
    with pytest.raises(CheckpointError):
        different.load(tmp_path / "c.sgck")


def test_bad_graphs_name_the_layers_inputs_and_shapes():
    a = Input(shape=(4,), name="a")
    b = Input(shape=(3,), name="b")
    x = Dense(2)(a)
    with pytest.raises(ModelError, match=r"layer 1 'add' \(Add\): input 1 \('b'\) is 1x1x3 and input 0 \('dense'\)"):
        Model([a, b], Dense(1)(Add()([x, b])))
    with pytest.raises(ModelError, match="depend on Input 'b', which is not among the model's inputs"):
        Model(a, Dense(1)(Concatenate()([x, b])))
    with pytest.raises(ModelError, match="input 'b' is not connected to the outputs"):
        Model([a, b], Dense(1)(x))
    with pytest.raises(ModelError, match="called on a list of 2 to 64 tensors"):
        Add()(x)
    with pytest.raises(ModelError, match="called on ndarray"):
        Dense(1)(np.zeros((2, 4)))
    with pytest.raises(ModelError, match="input_shape=.*is for Sequential"):
        Dense(1, input_shape=(4,))(a)
    with pytest.raises(ValueError, match="Concatenate.axis=1.: only axis=-1"):
        Concatenate(axis=1)
    # a shared layer on inputs of another width
    shared = Dense(2)
    with pytest.raises(ModelError, match="called again, on an input of 3 channels where layer 0 had 4"):
        Model([a, b], Add()([shared(a), shared(b)]))
    with pytest.raises(ModelError, match="Reshape.*the input 1x1x2 has 2 values"):
        Model(a, Dense(1)(Reshape((3,))(x)))


def test_bad_data_names_inputs_and_outputs():
    model = compiled(build())
    xa, xb, yreg, ycls = data()
    with pytest.raises(
        InvalidArgumentError, match=r"keys \['a'\]; the model's inputs are \['a', 'b'\] \(missing \['b'\]\)"
    ):
        model.fit({"a": xa}, [yreg, ycls], verbose=0)
    with pytest.raises(InvalidArgumentError, match=r"unknown \['c'\]"):
        model.predict({"a": xa, "b": xb, "c": xa})
    with pytest.raises(InvalidArgumentError, match=r"the model has 2 inputs \['a', 'b'\]: give x as a list"):
        model.predict(xa)
    with pytest.raises(InvalidArgumentError, match="input 'b' has 5 rows, input 'a' 12"):
        model.predict([xa, xb[:5]])
    with pytest.raises(InvalidArgumentError, match=r"the model has 2 outputs \['reg', 'cls'\]"):
        model.evaluate([xa, xb], ycls)
    bad = ycls.copy()
    bad[3] = 7
    with pytest.raises(InvalidArgumentError, match=r"label 7 of row 3 of output 1 is outside \[0, 3\)"):
        model.train_on_batch([xa, xb], [yreg, bad])
    with pytest.raises(ValueError, match=r"loss names unknown outputs \['out'\]"):
        model.compile(loss={"out": "mse"})
    with pytest.raises(ValueError, match=r"loss gives no loss for outputs \['cls'\]"):
        model.compile(loss={"reg": "mse"})
    with pytest.raises(ModelError, match="output 0 'reg': .*sparse_categorical_crossentropy needs at least 2 outputs"):
        model.compile(loss=["sparse_categorical_crossentropy", "sparse_categorical_crossentropy"])


def test_dense_on_a_sequence_works_on_the_last_axis():
    # Keras' Dense on (steps, features): the same kernel at every step
    x = Input(shape=(5, 3))
    y = Dense(1)(Flatten()(Dense(2, activation="relu")(x)))
    model = Model(x, y, seed=1)
    assert [w.shape for w in model.get_weights()] == [(3, 2), (2,), (10, 1), (1,)]
    xs = np.random.default_rng(0).normal(size=(7, 5, 3)).astype(np.float32)
    k, b, k2, b2 = model.get_weights()
    want = np.maximum(xs @ k + b, 0).reshape(7, 10) @ k2 + b2
    np.testing.assert_allclose(model.predict(xs), want, rtol=1e-5, atol=1e-6)


def test_a_residual_model_learns():
    # y = sum of x: a residual MLP of Dense + Add fits it
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype(np.float32)
    y = x.sum(1, keepdims=True)
    inp = Input(shape=(8,))
    h = Dense(16, activation="relu")(inp)
    h = Add()([h, Dense(16, activation="relu")(h)])
    model = Model(inp, Dense(1)(h), seed=0)
    model.compile(optimizer="adam", loss="mse")
    first = model.evaluate(x, y)
    model.fit(x, y, batch_size=32, epochs=20, verbose=0)
    assert model.evaluate(x, y) < 0.05 * first


@pytest.mark.skipif(not __import__("sparkgrad")._core.bf16_supported(), reason="this CPU has no native bf16")
def test_a_graph_with_a_shared_layer_trains_in_bf16_close_to_fp32():
    xa, xb, yreg, ycls = data()
    runs = {}
    for precision in ("fp32", "bf16"):
        model = build()
        model.compile(
            optimizer=SGD(0.1),
            loss={"reg": "mse", "cls": "sparse_categorical_crossentropy"},
            loss_weights={"reg": 0.5, "cls": 2.0},
            precision=precision,
        )
        h = model.fit([xa, xb], [yreg, ycls], batch_size=4, epochs=3, verbose=0, shuffle=False)
        runs[precision] = (model._core.bf16_layers(4), h.history["loss"], model.params.copy())
    assert runs["bf16"][0] == 6 and runs["fp32"][0] == 0  # every Dense call, the shared layer's twice
    np.testing.assert_allclose(runs["bf16"][1], runs["fp32"][1], rtol=1e-3)
    np.testing.assert_allclose(runs["bf16"][2], runs["fp32"][2], atol=5e-3)
