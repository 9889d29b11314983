"""The merge layers beyond Add and Concatenate (csrc/nn/nn_op_merge.c, nn_op_dot.c): Subtract, Multiply,
Average, Maximum, Minimum and Dot (with and without normalize), each inside a small functional model of
Dense towers against PyTorch autograd (outputs, loss, every parameter's gradient); a tensor read twice by
one merge; Maximum's and Minimum's ties (the first tied input takes the gradient, as TensorFlow's);
Dot's normalize of an all-zero row (Keras' epsilon); plain SGD folded around them; save and load; the
shape and argument errors naming the layer and its inputs; and all of them in one graph against Keras'
outputs and TensorFlow's gradients (tests/fixtures/keras/merge.npz)."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from sparkgrad.errors import ModelError
from sparkgrad.nn import (
    SGD,
    Add,
    Average,
    Concatenate,
    Dense,
    Dot,
    Flatten,
    Input,
    Maximum,
    Minimum,
    Model,
    Multiply,
    Reshape,
    Subtract,
    model_from_bytes,
    model_to_bytes,
)

try:
    import torch
except ImportError:  # the test extra installs it
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch (pip install -e '.[test]')")
pytestmark = pytest.mark.timeout(120)
N, D = 7, 4  # rows, the towers' width


def towers(merge, n: int = 2, head: bool = True, seed: int = 5) -> Model:
    """Inputs x0..x{n-1} [3]; tower k = Dense(D, tanh, name="t<k>")(x_k); merge of the towers; then (with
    ``head``) Dense(2, name="head"). Random biases, so no tower output is 0 by accident."""
    xs = [Input((3,), name=f"x{k}") for k in range(n)]
    ts = [Dense(D, activation="tanh", name=f"t{k}")(x) for k, x in enumerate(xs)]
    out = merge(ts)
    if head:
        out = Dense(2, name="head")(out)
    model = Model(xs, out, seed=seed)
    model.compile(optimizer=SGD(0.1), loss="mse")
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0, 0.7, w.shape).astype(np.float32) for w in model.get_weights()])
    return model


def batch(n: int, width: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(N, 3)).astype(np.float32) for _ in range(n)]
    return xs, rng.normal(size=(N, width)).astype(np.float32)


def leaves(model: Model) -> dict[str, torch.Tensor]:
    """Torch leaves of the model's parameters by "<layer name>/<kernel|bias>"."""
    return {
        f"{model.layer_names[t.layer]}/{t.name}": torch.tensor(
            model.params[t.offset : t.offset + t.size].reshape(t.shape), requires_grad=True
        )
        for t in model.param_table
    }


def keras_normalize(x: torch.Tensor) -> torch.Tensor:
    """keras.ops.normalize(x, axis=-1): x * min(rsqrt(sum x^2), 1 / epsilon), epsilon 1e-7; where the cap
    holds, no gradient through the norm (TensorFlow's; torch's clamp would give 0 * inf there)."""
    ss = (x * x).sum(-1, keepdim=True)
    free = torch.rsqrt(ss.detach()) <= 1e7
    return x * torch.where(free, torch.rsqrt(torch.where(free, ss, torch.ones_like(ss))), 1e7)


def torch_merge(kind: str, ts: list[torch.Tensor]) -> torch.Tensor:
    if kind == "add":
        return sum(ts[1:], ts[0])
    if kind == "subtract":
        return ts[0] - ts[1]
    if kind == "multiply":
        out = ts[0]
        for t in ts[1:]:
            out = out * t
        return out
    if kind == "average":
        return sum(ts[1:], ts[0]) / len(ts)
    if kind in ("maximum", "minimum"):
        out = ts[0]
        for t in ts[1:]:
            out = torch.maximum(out, t) if kind == "maximum" else torch.minimum(out, t)
        return out
    if kind.startswith("dot"):
        x, y = ts
        if kind == "dot_normalize":
            x, y = keras_normalize(x), keras_normalize(y)
        return (x * y).sum(-1, keepdim=True)
    raise ValueError(kind)


LAYERS = {
    "add": lambda: Add(),
    "subtract": lambda: Subtract(),
    "multiply": lambda: Multiply(),
    "average": lambda: Average(),
    "maximum": lambda: Maximum(),
    "minimum": lambda: Minimum(),
    "dot": lambda: Dot(axes=-1),
    "dot_normalize": lambda: Dot(axes=1, normalize=True),
}
CASES = [
    ("subtract", 2, True),
    ("multiply", 2, True),
    ("multiply", 3, True),
    ("average", 3, True),
    ("maximum", 3, True),
    ("minimum", 2, True),
    ("dot", 2, False),
    ("dot", 2, True),
    ("dot_normalize", 2, False),
    ("dot_normalize", 2, True),
]


def check_against_torch(model: Model, xs, y, forward) -> None:
    """Predictions, the MSE loss and every parameter's gradient of ``model`` against ``forward(leaves,
    inputs)`` in torch autograd."""
    w = leaves(model)
    out = forward(w, [torch.from_numpy(x) for x in xs])
    loss = ((out - torch.from_numpy(y)) ** 2).mean()
    loss.backward()
    x = xs if len(xs) > 1 else xs[0]  # a model of one input takes its array
    np.testing.assert_allclose(model.predict(x), out.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert model.compute_gradients(x, y) == pytest.approx(loss.item(), rel=1e-5)
    for t in model.param_table:
        key = f"{model.layer_names[t.layer]}/{t.name}"
        got = model.grads[t.offset : t.offset + t.size].reshape(t.shape)
        np.testing.assert_allclose(got, w[key].grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=key)


def tower_forward(kind: str, n: int, head: bool):
    def forward(w, xs):
        ts = [torch.tanh(xs[k] @ w[f"t{k}/kernel"] + w[f"t{k}/bias"]) for k in range(n)]
        out = torch_merge(kind, ts)
        return out @ w["head/kernel"] + w["head/bias"] if head else out

    return forward


@needs_torch
@pytest.mark.parametrize("kind,n,head", CASES)
def test_merge_of_dense_towers_matches_torch(kind, n, head):
    model = towers(lambda ts: LAYERS[kind]()(ts), n=n, head=head)
    xs, y = batch(n, 2 if head else 1)
    check_against_torch(model, xs, y, tower_forward(kind, n, head))


@needs_torch
@pytest.mark.parametrize("kind", ["multiply", "subtract", "maximum", "dot", "dot_normalize"])
def test_a_tensor_read_twice_by_one_merge_gets_both_gradients(kind):
    """Multiply([h, h]) is h**2, Dot([h, h]) |h|**2: each input's gradient goes to its own edge, summed."""
    x = Input((3,), name="x0")
    h = Dense(D, activation="tanh", name="t0")(x)
    model = Model(x, Dense(2, name="head")(LAYERS[kind]()([h, h])), seed=1)
    model.compile(optimizer=SGD(0.1), loss="mse")
    rng = np.random.default_rng(2)
    model.set_weights([rng.normal(0, 0.7, w.shape).astype(np.float32) for w in model.get_weights()])
    xs, y = batch(1, 2, seed=3)

    def forward(w, ins):
        h = torch.tanh(ins[0] @ w["t0/kernel"] + w["t0/bias"])
        return torch_merge(kind, [h, h]) @ w["head/kernel"] + w["head/bias"]

    check_against_torch(model, xs, y, forward)


def tied_towers(merge, n: int):
    """n towers Dense(D, name="t<k>") on ONE input x whose kernels and biases are equal in columns 0 and
    1 (so there every tower ties) and differ elsewhere; the merge is the output."""
    x = Input((3,), name="x")
    model = Model(x, merge([Dense(D, name=f"t{k}")(x) for k in range(n)]), seed=0)
    model.compile(optimizer=SGD(0.1), loss="mse")
    rng = np.random.default_rng(7)
    same_k, same_b = rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=2).astype(np.float32)
    weights = []
    for _ in range(n):
        k, b = rng.normal(size=(3, D)).astype(np.float32), rng.normal(size=D).astype(np.float32)
        k[:, :2], b[:2] = same_k, same_b
        weights += [k, b]
    model.set_weights(weights)
    return model


@needs_torch
@pytest.mark.parametrize("kind,n", [("maximum", 2), ("maximum", 3), ("minimum", 3)])
def test_maximum_and_minimum_give_a_tie_to_the_first_tied_input(kind, n):
    """Where towers tie, the first of the tied inputs takes the whole gradient (TensorFlow's rule, which
    torch.maximum does not follow: it halves it); elsewhere the winner does. The torch reference selects
    with the first-winner mask."""
    model = tied_towers(lambda ts: LAYERS[kind]()(ts), n)
    rng = np.random.default_rng(8)
    x = rng.normal(size=(N, 3)).astype(np.float32)
    y = rng.normal(size=(N, D)).astype(np.float32)
    w = leaves(model)
    ts = [torch.from_numpy(x) @ w[f"t{k}/kernel"] + w[f"t{k}/bias"] for k in range(n)]
    stacked = np.stack([t.detach().numpy() for t in ts])
    assert (stacked[:, :, :2] == stacked[:1, :, :2]).all()  # the ties are exact
    won = (np.argmax if kind == "maximum" else np.argmin)(stacked, axis=0)  # numpy: the first extreme
    out = sum(t * torch.from_numpy((won == k).astype(np.float32)) for k, t in enumerate(ts))
    ((out - torch.from_numpy(y)) ** 2).mean().backward()
    np.testing.assert_allclose(model.predict(x), out.detach().numpy(), rtol=1e-6)
    model.compute_gradients(x, y)
    for t in model.param_table:
        key = f"{model.layer_names[t.layer]}/{t.name}"
        got = model.grads[t.offset : t.offset + t.size].reshape(t.shape)
        np.testing.assert_allclose(got, w[key].grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=key)
        if key != "t0/bias" and key != "t0/kernel":
            assert (got[..., :2] == 0).all(), key  # the tied columns: nothing to the later towers


@needs_torch
def test_dot_normalize_scores_an_all_zero_row_0_with_keras_epsilon():
    """A zero row normalizes to 0 (its inverse norm capped at 1 / 1e-7, as keras.ops.normalize), so its
    cosine score is 0, and its gradient is the capped factor times the other row's direction."""
    model = towers(lambda ts: Dot(axes=-1, normalize=True)(ts), head=False)
    model.set_weights([w if w.ndim == 2 else np.zeros_like(w) for w in model.get_weights()])  # zero biases
    xs, y = batch(2, 1, seed=4)
    xs[0][2] = 0.0  # row 2 of tower 0 is tanh(0 @ k) = 0
    pred = model.predict(xs)
    assert pred[2, 0] == 0.0 and np.abs(pred).max() <= 1.0 + 1e-6
    check_against_torch(model, xs, y, tower_forward("dot_normalize", 2, False))


@pytest.mark.parametrize("kind,n,head", [c for c in CASES if c[2]])
def test_plain_sgd_folded_around_a_merge_is_gradient_then_update(kind, n, head):
    xs, y = batch(n, 2, seed=6)
    model = towers(lambda ts: LAYERS[kind]()(ts), n=n)
    start = model.params.copy()
    model.compute_gradients(xs, y)
    want = start - np.float32(0.1) * model.grads
    model.train_on_batch(xs, y)
    np.testing.assert_allclose(model.params, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_a_model_with_each_merge_saves_and_loads(kind):
    model = towers(lambda ts: LAYERS[kind]()(ts), n=2, head=True)
    xs, _ = batch(2, 2)
    loaded = model_from_bytes(model_to_bytes(model))
    cls = type(LAYERS[kind]())
    (merge,) = [a for a in model.layers if type(a) is cls]
    twin = [a for a in loaded.layers if type(a) is cls]
    assert len(twin) == 1
    if isinstance(merge, Dot):
        assert (twin[0].axes, twin[0].normalize) == (merge.axes, merge.normalize)
    np.testing.assert_array_equal(loaded.predict(xs), model.predict(xs))
    assert model_to_bytes(loaded) == model_to_bytes(model)


def test_dot_takes_the_last_axis_of_batch_1_d_inputs():
    """[B, 1, d] inputs (Reshape, or an Input of that shape) with axes=-1 or 2 score as [B, d] ones."""
    a, b = Input((1, 5), name="a"), Input((5,), name="b")
    flat = Model([a, b], Dot(axes=(2, 1))([a, b]), seed=0)
    lifted = Model([a, b], Dot(axes=-1)([a, Reshape((1, 5))(b)]), seed=0)
    rng = np.random.default_rng(9)
    xa, xb = rng.normal(size=(N, 1, 5)).astype(np.float32), rng.normal(size=(N, 5)).astype(np.float32)
    want = (xa[:, 0] * xb).sum(-1, keepdims=True)
    np.testing.assert_allclose(flat.predict([xa, xb]), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lifted.predict([xa, xb]), want, rtol=1e-5, atol=1e-6)


def test_merge_shape_errors_name_the_layer_and_its_inputs():
    a, b, c = Input((3,), name="a"), Input((4,), name="b"), Input((3,), name="c")
    for layer in (Subtract(), Multiply(), Average(), Maximum(), Minimum()):
        kind = type(layer).__name__
        with pytest.raises(ModelError, match=rf"\({kind}\): input 1 \('b'\) is 1x1x4 and input 0 \('a'\) 1x1x3; "):
            Model([a, b], Dense(1)(layer([a, b])))
    with pytest.raises(ModelError, match=r"Dot.*input 1 \('b'\) has 4 values on the contracted last axis and input 0"):
        Model([a, b], Dot(axes=-1)([a, b]))
    seq = Input((2, 3), name="seq")
    with pytest.raises(ModelError, match=r"\(Dot\): input 0 \('seq'\) is 1x2x3; Dot takes inputs of shape \[batch"):
        Model([seq, c], Dot(axes=-1)([seq, c]))
    with pytest.raises(ModelError, match="Subtract is called on a list of exactly 2 tensors"):
        Subtract()([a, c, a])
    with pytest.raises(ModelError, match="Dot is called on a list of exactly 2 tensors"):
        Dot(axes=-1)([a, c, a])
    with pytest.raises(ModelError, match="Multiply is called on a list of 2 to 64 tensors"):
        Multiply()([a])


def test_dot_axes_errors():
    with pytest.raises(ValueError, match="axis 0 is the batch axis"):
        Dot(axes=0)
    with pytest.raises(ValueError, match="an int or a pair of ints"):
        Dot(axes=(1, 1, 1))
    with pytest.raises(TypeError, match="an int or a pair of ints"):
        Dot(axes="last")
    one, flat = Input((1, 4), name="one"), Input((4,), name="flat")
    with pytest.raises(ValueError, match=r"axis 1 of input 0, a tensor of rank 3 .* is not its last"):
        Dot(axes=1)([one, one])  # Keras would contract the axis of size 1 (a [B, 4, 4] product)
    with pytest.raises(ValueError, match=r"axis 2 of input 1, a tensor of rank 2 .* is not its last"):
        Dot(axes=2)([one, flat])
    # ranks followed through the layers before: Flatten gives rank 1, Dense keeps it
    h = Dense(4)(Flatten()(one))
    Dot(axes=1)([h, flat])


def test_merges_match_keras():
    """tests/fixtures/keras/merge.npz (make_keras.py): every merge in one graph with ties between towers
    and an all-zero row under Dot's normalize; Keras' predictions and TensorFlow's gradients."""
    with np.load(pathlib.Path(__file__).parent / "fixtures" / "keras" / "merge.npz") as f:
        k = {name: f[name] for name in f.files}
    a, b = Input((3,), name="a"), Input((3,), name="b")
    t0 = Dense(4, activation="tanh", name="t0")(a)
    t1 = Dense(4, activation="tanh", name="t1")(a)
    t2 = Dense(4, activation="tanh", name="t2")(b)
    joined = Concatenate()(
        [
            Subtract()([t0, t2]),
            Multiply()([t0, t1, t2]),
            Average()([t0, t1, t2]),
            Maximum()([t0, t1, t2]),
            Minimum()([t2, t0, t1]),
        ]
    )
    reg = Dense(2, name="reg")(joined)
    score = Add(name="score")([Dot(axes=1, normalize=True)([t0, t2]), Dot(axes=-1)([t1, t2])])
    model = Model([a, b], {"reg": reg, "score": score}, seed=0)
    model.compile(optimizer=SGD(0.1), loss={"reg": "mse", "score": "mse"})
    count = len(model.get_weights())
    model.set_weights([k[f"w{i}"] for i in range(count)])
    x = {"a": k["xa"], "b": k["xb"]}
    out = model.predict(x)
    np.testing.assert_allclose(out["reg"], k["reg"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["score"], k["score"], rtol=1e-5, atol=1e-6)
    loss = model.compute_gradients(x, {"reg": k["yreg"], "score": k["yscore"]})
    assert loss[0] == pytest.approx(float(k["loss"]), rel=1e-5)
    for t, i in zip(model.param_table, range(count), strict=True):
        got = model.grads[t.offset : t.offset + t.size].reshape(t.shape)
        np.testing.assert_allclose(got, k[f"g{i}"], rtol=1e-5, atol=1e-6, err_msg=f"gradient {i} ({t.name})")
