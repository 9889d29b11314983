"""Keras 3's optimizer additions in the C optimizer: Adagrad (against torch.optim
and a NumPy copy of Keras' update), clipnorm per tensor (against a NumPy
reference of Keras' clip_by_norm), and the schedule objects (the C rate at
every step against the Keras formulas, and a model trained under each against
NumPy), locally and on parameter servers."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sparkgrad import _core, errors  # noqa: E402
from sparkgrad.nn import (  # noqa: E402
    SGD,
    Adagrad,
    Adam,
    CosineDecay,
    Dense,
    ExponentialDecay,
    PiecewiseConstantDecay,
    Sequential,
    optimizers,
    schedules,
)
from sparkgrad.nn.checkpoint import load, save  # noqa: E402
from test_net_ps import Cluster  # noqa: E402

N = 3000


def data(seed=0, steps=5, n=N):
    rng = np.random.default_rng(seed)
    p = rng.standard_normal(n).astype(np.float32)
    gs = [(rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 0, n)).astype(np.float32) for _ in range(steps)]
    return p, gs


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


# ---- Adagrad ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "tkw"),
    [
        ({}, {"lr": 0.001, "initial_accumulator_value": 0.1, "eps": 1e-7}),
        (
            {"learning_rate": 0.05, "initial_accumulator_value": 0.5, "epsilon": 1e-10, "weight_decay": 0.01},
            {"lr": 0.05, "initial_accumulator_value": 0.5, "eps": 1e-10, "weight_decay": 0.01},
        ),
    ],
)
def test_adagrad_matches_torch_over_five_steps(kw, tkw):
    """Keras' initial_accumulator_value passed to torch's; epsilon is inside the
    square root here (Keras) and outside in torch, which moves the result by far
    less than the tolerance while the accumulator is >= 0.1."""
    p, gs = data()
    ours = p.copy()
    opt = Adagrad(**kw)
    t = torch.tensor(p.copy(), requires_grad=True)
    topt = torch.optim.Adagrad([t], **tkw)
    for g in gs:
        opt.apply(ours, g)
        t.grad = torch.from_numpy(g.copy())
        topt.step()
    assert opt.iterations == 5
    assert rel(ours, t.detach().numpy()) < 1e-6


def test_adagrad_puts_epsilon_inside_the_square_root_as_keras():
    """Keras 3 (keras/src/optimizers/adagrad.py): acc += g^2; p -= lr * g / sqrt(acc + eps).
    With eps comparable to g^2, torch's sqrt(acc) + eps differs visibly."""
    p, gs = data(seed=3, steps=4)
    lr, eps = 0.1, 1e-3
    ours = p.copy()
    opt = Adagrad(lr, initial_accumulator_value=0.0, epsilon=eps)
    ref, acc = p.astype(np.float64), np.zeros(N)
    torch_like, tacc = p.astype(np.float64), np.zeros(N)
    for g in gs:
        opt.apply(ours, g)
        g = g.astype(np.float64)
        acc += g * g
        ref -= lr * g / np.sqrt(acc + eps)
        tacc += g * g
        torch_like -= lr * g / (np.sqrt(tacc) + eps)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=2e-6)
    assert np.abs(torch_like - ref).max() > 1e-3


def test_adagrad_by_name_has_keras_defaults_and_state():
    opt = optimizers.get("adagrad")
    assert isinstance(opt, Adagrad) and opt.kind == "adagrad"
    assert opt.config["lr"] == 0.001 and opt.config["init_accum"] == 0.1 and math.isclose(opt.config["eps"], 1e-7)
    c = opt.bind(4)
    np.testing.assert_allclose(c.state(), 0.1)  # the accumulator starts at initial_accumulator_value
    with pytest.raises(errors.InvalidArgumentError, match="initial_accumulator_value must be finite and >= 0"):
        Adagrad(initial_accumulator_value=-1.0)


def _mlp(seed=1):
    return Sequential([Dense(8, activation="relu", input_shape=(6,)), Dense(3)], seed=seed)


def _xy(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 6)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)


def test_adagrad_checkpoint_resumes_exactly(tmp_path):
    x, y = _xy()
    a = _mlp()
    a.compile(optimizer=Adagrad(0.05), loss="sparse_categorical_crossentropy")
    a.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    save(a, tmp_path / "a.ckpt")
    b = _mlp(seed=7)
    b.compile(optimizer=Adagrad(0.05), loss="sparse_categorical_crossentropy")
    load(b, tmp_path / "a.ckpt")
    assert b.optimizer.iterations == 4
    for m in (a, b):
        m.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    np.testing.assert_array_equal(a.params, b.params)


@pytest.mark.parametrize("num_ps", [1, 2])
def test_adagrad_on_the_ps_matches_adagrad_applied_locally(num_ps):
    total, steps = 101, 6
    grads = [np.random.default_rng(t).standard_normal(total).astype(np.float32) for t in range(steps)]
    cl = Cluster(total, num_ps, 1, "async", optimizer=Adagrad(0.1, initial_accumulator_value=0.2))
    try:
        c = cl.client(0)
        got = np.empty(total, np.float32)
        for t in range(steps):
            assert c.push_pull(grads[t], got) == t + 1
        c.done()
        assert cl.join() == ["done"] * num_ps
    finally:
        cl.close()
    want = cl.init.copy()
    opt = Adagrad(0.1, initial_accumulator_value=0.2)
    for g in grads:
        opt.apply(want, g)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


# ---- clipnorm -----------------------------------------------------------------


def clip_by_norm(g: np.ndarray, c: float) -> np.ndarray:
    """Keras 3's clip_by_norm: g * c / max(||g||_2, c)."""
    return g * c / max(float(np.sqrt(np.sum(g.astype(np.float64) ** 2))), c)


def test_clipnorm_clips_each_tensor_by_its_own_norm():
    rng = np.random.default_rng(5)
    sizes = [40, 7, 300, 1]
    g = np.concatenate([rng.standard_normal(s) * k for s, k in zip(sizes, (1.0, 0.01, 2.0, 0.5), strict=True)])
    g = g.astype(np.float32)
    p = np.zeros(sum(sizes), np.float32)
    opt = SGD(1.0, clipnorm=0.9)
    opt.bind(p.size, sizes).step(p, g)
    ends = np.cumsum(sizes)
    want = -np.concatenate([clip_by_norm(t, 0.9) for t in np.split(g, ends[:-1])])
    np.testing.assert_allclose(p, want, rtol=1e-6, atol=1e-7)
    norms = [np.linalg.norm(t) for t in np.split(g, ends[:-1])]
    assert norms[0] > 0.9 and norms[1] < 0.9 and norms[2] > 0.9  # clipped, untouched, clipped
    np.testing.assert_array_equal(p[40:47], -g[40:47])
    # without the table the whole buffer is one tensor
    q = np.zeros_like(p)
    SGD(1.0, clipnorm=0.9).apply(q, g)
    np.testing.assert_allclose(q, -clip_by_norm(g, 0.9), rtol=1e-6, atol=1e-7)


def test_declaring_the_tensors_after_steps_keeps_the_optimizer_state():
    """bind(n) and later bind(n, sizes) (a restore before the model's table is known): Adam's moments and
    step count carry over rather than starting afresh."""
    g = np.linspace(-1, 1, 10, dtype=np.float32)
    a, b = np.zeros(10, np.float32), np.zeros(10, np.float32)
    one, two = Adam(0.1), Adam(0.1)
    one.apply(a, g)
    two.apply(b, g)
    two.bind(10, [4, 6])  # the same buffer, now in two tensors
    assert two.get_state()[0] == 1
    one.apply(a, g)
    two.apply(b, g)
    np.testing.assert_array_equal(a, b)


def test_model_fit_with_clipnorm_clips_each_kernel_and_bias():
    x, y = _xy(32)
    m = _mlp()
    m.compile(optimizer=SGD(0.5, momentum=0.0, clipnorm=0.25), loss="sparse_categorical_crossentropy")
    before = m.params.copy()
    loss, _ = m.compute_gradients(x, y)
    g = m.grads.copy()
    m.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    sizes = m.tensor_sizes()
    assert sizes == [48, 8, 24, 3]
    parts = np.split(g, np.cumsum(sizes)[:-1])
    want = before - 0.5 * np.concatenate([clip_by_norm(t, 0.25) for t in parts])
    np.testing.assert_allclose(m.params, want, rtol=0, atol=1e-6)
    assert any(np.linalg.norm(t) < 0.25 for t in parts) and any(np.linalg.norm(t) > 0.25 for t in parts)


def test_clipnorm_arguments_are_checked():
    with pytest.raises(errors.InvalidArgumentError, match="not both"):
        SGD(0.1, clipnorm=1.0, global_clipnorm=1.0)
    with pytest.raises(errors.InvalidArgumentError, match=r"clipnorm must be > 0 or None, not -1"):
        SGD(0.1, clipnorm=-1)
    with pytest.raises(errors.InvalidArgumentError, match="2 tensors of 5 floats in all, but the optimizer holds 6"):
        SGD(0.1, clipnorm=1.0).bind(6, [2, 3])
    lis = _core.Listener("127.0.0.1", 0)
    try:
        with pytest.raises(errors.InvalidArgumentError, match=r"clipnorm=1\) needs the tensor boundaries"):
            _core.PsServer(lis, b"s" * 32, 0, 10, 10, 1, optimizer=SGD(0.1, clipnorm=1.0))
    finally:
        lis.close()


# ---- schedules ------------------------------------------------------------------

# The Keras 3 formulas written out independently of sparkgrad.nn.schedules.
KERAS = {
    "exp": (
        lambda: ExponentialDecay(0.1, decay_steps=4, decay_rate=0.5),
        lambda t: 0.1 * 0.5 ** (t / 4),
    ),
    "exp_staircase": (
        lambda: ExponentialDecay(0.1, decay_steps=4, decay_rate=0.5, staircase=True),
        lambda t: 0.1 * 0.5 ** (t // 4),
    ),
    "piecewise": (
        lambda: PiecewiseConstantDecay([3, 7], [0.3, 0.1, 0.02]),
        lambda t: 0.3 if t <= 3 else (0.1 if t <= 7 else 0.02),
    ),
    "cosine": (
        lambda: CosineDecay(0.2, decay_steps=8, alpha=0.1),
        lambda t: 0.2 * (0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 8) / 8)) + 0.1),
    ),
    "cosine_warmup": (
        lambda: CosineDecay(0.01, decay_steps=6, alpha=0.0, warmup_target=0.2, warmup_steps=4),
        lambda t: 0.01 + (0.2 - 0.01) * t / 4 if t < 4 else 0.2 * 0.5 * (1 + math.cos(math.pi * (min(t, 10) - 4) / 6)),
    ),
}
STEPS = [0, 1, 3, 4, 5, 7, 8, 9, 10, 11, 15]


@pytest.mark.parametrize("case", sorted(KERAS))
def test_c_learning_rate_follows_the_keras_formula(case):
    make, formula = KERAS[case]
    sched = make()
    for t in STEPS:
        assert math.isclose(sched(t), formula(t), rel_tol=1e-12, abs_tol=1e-15), (case, t)
    opt = SGD(sched)
    assert math.isclose(opt.learning_rate, formula(0), rel_tol=1e-6)
    c = opt.bind(2)
    p, g = np.zeros(2, np.float32), np.zeros(2, np.float32)
    for t in range(max(STEPS) + 1):
        if t in STEPS:
            assert math.isclose(c.lr, formula(t), rel_tol=1e-6, abs_tol=1e-9), (case, t, c.lr)
        c.step(p, g)


def test_string_schedules_are_the_schedule_objects_functions():
    a = SGD(0.1, schedule="step", step_size=4, gamma=0.5).bind(1)
    b = SGD(ExponentialDecay(0.1, 4, 0.5, staircase=True)).bind(1)
    c = SGD(0.2, schedule="cosine", total_steps=8, lr_min=0.02).bind(1)
    d = SGD(CosineDecay(0.2, 8, alpha=0.1)).bind(1)
    z = np.zeros(1, np.float32)
    for _ in range(12):
        assert a.lr == b.lr and math.isclose(c.lr, d.lr, rel_tol=1e-6)
        for o in (a, b, c, d):
            o.step(z, z)


@pytest.mark.parametrize("case", sorted(KERAS))
def test_model_trained_under_a_schedule_matches_numpy(case):
    """A softmax regression (one Dense) fit with SGD under the schedule: every
    step of the C loop against W -= lr(t) * x^T (softmax(xW + b) - onehot) / B."""
    make, formula = KERAS[case]
    rng = np.random.default_rng(2)
    x = rng.standard_normal((48, 5)).astype(np.float32)
    y = rng.integers(0, 3, 48).astype(np.int32)
    m = Sequential([Dense(3, input_shape=(5,))], seed=4)
    m.compile(optimizer=SGD(make()), loss="sparse_categorical_crossentropy")
    w, b = (a.astype(np.float64) for a in m.get_weights())
    m.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)  # 12 steps in one C loop per epoch
    onehot = np.eye(3)[y]
    for t in range(12):
        xb, yb = x[8 * (t % 6) : 8 * (t % 6 + 1)].astype(np.float64), onehot[8 * (t % 6) : 8 * (t % 6 + 1)]
        z = xb @ w + b
        sm = np.exp(z - z.max(1, keepdims=True))
        sm /= sm.sum(1, keepdims=True)
        d = (sm - yb) / 8
        w, b = w - formula(t) * xb.T @ d, b - formula(t) * d.sum(0)
    got_w, got_b = m.get_weights()
    np.testing.assert_allclose(got_w, w, rtol=0, atol=2e-5)
    np.testing.assert_allclose(got_b, b, rtol=0, atol=2e-5)
    assert m.optimizer.iterations == 12


def test_schedule_on_the_ps_runs_in_the_shards_optimizer():
    total = 11
    sched = PiecewiseConstantDecay([1, 2], [0.5, 0.1, 0.01])
    cl = Cluster(total, 2, 1, "async", optimizer=SGD(sched))
    try:
        c = cl.client(0)
        got = np.empty(total, np.float32)
        for _ in range(4):
            c.push_pull(np.ones(total, np.float32), got)
        c.done()
        cl.join()
    finally:
        cl.close()
    np.testing.assert_allclose(got, cl.init - (0.5 + 0.5 + 0.1 + 0.01), rtol=0, atol=1e-6)


def test_schedules_are_callable_configurable_and_checked():
    for make, _ in KERAS.values():
        s = make()
        assert type(s).from_config(s.get_config()).get_config() == s.get_config()
    assert schedules.CosineDecay is CosineDecay
    assert ExponentialDecay(0.1, 10, 0.9).get_config() == {
        "initial_learning_rate": 0.1,
        "decay_steps": 10,
        "decay_rate": 0.9,
        "staircase": False,
        "name": "ExponentialDecay",
    }
    with pytest.raises(errors.InvalidArgumentError, match="decay_steps must be an integer >= 1, not 0"):
        ExponentialDecay(0.1, 0, 0.9)
    with pytest.raises(errors.InvalidArgumentError, match="one value more than boundaries"):
        PiecewiseConstantDecay([1, 2], [0.1, 0.2])
    with pytest.raises(errors.InvalidArgumentError, match="boundaries must increase strictly"):
        PiecewiseConstantDecay([2, 2], [0.1, 0.2, 0.3])
    with pytest.raises(errors.InvalidArgumentError, match=r"values\[1\] must be a finite number >= 0, not -0.2"):
        PiecewiseConstantDecay([2], [0.1, -0.2])
    with pytest.raises(errors.InvalidArgumentError, match="alpha must be in"):
        CosineDecay(0.1, 10, alpha=2.0)
    with pytest.raises(errors.InvalidArgumentError, match="leave schedule='step'"):
        SGD(CosineDecay(0.1, 10), schedule="step")
    with pytest.raises(errors.InvalidArgumentError, match="learning_rate must be a number or a schedule"):
        SGD("fast")
    with pytest.raises(errors.StateError, match="cannot be set"):
        SGD(ExponentialDecay(0.1, 10, 0.9)).set_learning_rate(0.5)
