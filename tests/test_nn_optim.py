"""The C optimizers (csrc/nn/nn_optim.c) against torch.optim over flat float32
arrays: every rule, learning-rate schedules and gradient clipping, 3 steps."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sparkgrad import _core  # noqa: E402
from sparkgrad.errors import InvalidArgumentError  # noqa: E402
from sparkgrad.nn import SGD, Adadelta, Adam, AdamW, RMSprop  # noqa: E402

N = 5000
CASES = {
    "sgd": (lambda: SGD(0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    "sgd_momentum": (lambda: SGD(0.1, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    "sgd_nesterov_wd": (
        lambda: SGD(0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    ),
    "adam": (lambda: Adam(0.01, epsilon=1e-8), lambda p: torch.optim.Adam(p, lr=0.01, eps=1e-8)),
    "adam_wd": (
        lambda: Adam(0.01, beta_1=0.8, beta_2=0.99, epsilon=1e-6, weight_decay=0.1),
        lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    ),
    "adamw": (
        lambda: AdamW(0.01, weight_decay=0.1, epsilon=1e-8),
        lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, eps=1e-8),
    ),
    "rmsprop": (lambda: RMSprop(0.01, epsilon=1e-8), lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.9, eps=1e-8)),
    "rmsprop_momentum_centered": (
        lambda: RMSprop(0.01, rho=0.95, momentum=0.5, centered=True, epsilon=1e-8, weight_decay=0.01),
        lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.95, momentum=0.5, centered=True, eps=1e-8, weight_decay=0.01),
    ),
    "adadelta": (
        lambda: Adadelta(1.0, rho=0.9, epsilon=1e-6),
        lambda p: torch.optim.Adadelta(p, lr=1.0, rho=0.9, eps=1e-6),
    ),
    "adadelta_keras_b": (
        lambda: Adadelta(0.1, rho=0.95, epsilon=1e-7, weight_decay=0.01),
        lambda p: torch.optim.Adadelta(p, lr=0.1, rho=0.95, eps=1e-7, weight_decay=0.01),
    ),
}


def data(seed=0, steps=3):
    rng = np.random.default_rng(seed)
    p = rng.standard_normal(N).astype(np.float32)
    gs = [(rng.standard_normal(N) * 10.0 ** rng.uniform(-4, 0, N)).astype(np.float32) for _ in range(steps)]
    return p, gs


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("case", sorted(CASES))
def test_optimizer_matches_torch_after_three_steps(case):
    make, tmake = CASES[case]
    p, gs = data()
    ours = p.copy()
    opt = make()
    t = torch.tensor(p.copy(), requires_grad=True)
    topt = tmake([t])
    for g in gs:
        opt.apply(ours, g)
        t.grad = torch.from_numpy(g.copy())
        topt.step()
    assert opt.iterations == 3
    assert rel(ours, t.detach().numpy()) < 1e-6, case


def _lr_sequence(opt, steps):
    p, _ = data()
    lrs = []
    for _ in range(steps):
        lrs.append(opt.learning_rate if opt.iterations else opt.bind(N).lr)
        opt.apply(p, np.zeros(N, np.float32))
    return lrs


def test_step_schedule_matches_torch_steplr():
    ours = _lr_sequence(SGD(0.5, schedule="step", step_size=2, gamma=0.3), 7)
    t = torch.tensor([0.0], requires_grad=True)
    topt = torch.optim.SGD([t], lr=0.5)
    sched = torch.optim.lr_scheduler.StepLR(topt, step_size=2, gamma=0.3)
    want = []
    for _ in range(7):
        want.append(topt.param_groups[0]["lr"])
        topt.step()
        sched.step()
    np.testing.assert_allclose(ours, want, rtol=1e-6)


def test_cosine_schedule_matches_torch_and_holds_after_total():
    ours = _lr_sequence(Adam(0.1, schedule="cosine", total_steps=5, lr_min=0.01), 8)
    t = torch.tensor([0.0], requires_grad=True)
    topt = torch.optim.SGD([t], lr=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(topt, T_max=5, eta_min=0.01)
    want = []
    for _ in range(6):
        want.append(topt.param_groups[0]["lr"])
        topt.step()
        sched.step()
    np.testing.assert_allclose(ours[:6], want, rtol=1e-6)
    assert ours[6] == pytest.approx(0.01) and ours[7] == pytest.approx(0.01)


def test_warmup_matches_torch_linearlr():
    ours = _lr_sequence(SGD(0.2, warmup_steps=4), 6)
    t = torch.tensor([0.0], requires_grad=True)
    topt = torch.optim.SGD([t], lr=0.2)
    sched = torch.optim.lr_scheduler.LinearLR(topt, start_factor=0.25, end_factor=1.0, total_iters=3)
    want = []
    for _ in range(6):
        want.append(topt.param_groups[0]["lr"])
        topt.step()
        sched.step()
    np.testing.assert_allclose(ours, want, rtol=1e-6)


def test_schedule_drives_the_update():
    p = np.zeros(3, np.float32)
    opt = SGD(1.0, schedule="step", step_size=1, gamma=0.5)
    g = np.ones(3, np.float32)
    for _ in range(3):
        opt.apply(p, g)
    np.testing.assert_allclose(p, -(1 + 0.5 + 0.25), rtol=1e-6)


def test_global_norm_clipping_matches_torch():
    p, gs = data(seed=1)
    ours = p.copy()
    opt = SGD(0.1, momentum=0.9, global_clipnorm=0.5)
    t = torch.tensor(p.copy(), requires_grad=True)
    topt = torch.optim.SGD([t], lr=0.1, momentum=0.9)
    for g in gs:
        opt.apply(ours, g)
        t.grad = torch.from_numpy(g.copy())
        torch.nn.utils.clip_grad_norm_([t], 0.5)
        topt.step()
    assert rel(ours, t.detach().numpy()) < 1e-6
    assert not np.array_equal(ours, p)


def test_value_clipping_matches_torch():
    p, gs = data(seed=2)
    ours = p.copy()
    opt = Adam(0.01, epsilon=1e-8, clipvalue=0.05)
    t = torch.tensor(p.copy(), requires_grad=True)
    topt = torch.optim.Adam([t], lr=0.01, eps=1e-8)
    for g in gs:
        opt.apply(ours, g)
        t.grad = torch.from_numpy(g.copy())
        torch.nn.utils.clip_grad_value_([t], 0.05)
        topt.step()
    assert rel(ours, t.detach().numpy()) < 1e-6


def test_state_round_trip_continues_identically():
    p, gs = data(seed=3, steps=4)
    a, b = p.copy(), p.copy()
    opt_a = Adam(0.01)
    for g in gs[:2]:
        opt_a.apply(a, g)
    steps, state = opt_a.get_state()
    assert steps == 2 and state.size == 2 * N
    b[:] = a
    opt_b = Adam(0.01)
    opt_b.bind(N)
    opt_b.set_state(steps, state)
    for g in gs[2:]:
        opt_a.apply(a, g)
        opt_b.apply(b, g)
    np.testing.assert_array_equal(a, b)


def test_c_optimizer_rejects_bad_configuration_and_sizes():
    with pytest.raises(InvalidArgumentError, match="momentum"):
        SGD(0.1, momentum=1.5)
    with pytest.raises(InvalidArgumentError, match="nesterov"):
        SGD(0.1, nesterov=True)
    with pytest.raises(InvalidArgumentError, match="step_size"):
        SGD(0.1, schedule="step", step_size=0)
    with pytest.raises(ValueError, match="schedule"):
        SGD(0.1, schedule="exponential")
    opt = _core.Optimizer("sgd", 4, lr=0.1)
    with pytest.raises(ValueError, match="expected 4"):
        opt.step(np.zeros(5, np.float32), np.zeros(5, np.float32))
    with pytest.raises(TypeError, match="float32"):
        opt.step(np.zeros(4, np.float64), np.zeros(4, np.float32))
    with pytest.raises(InvalidArgumentError, match="state has 3 floats"):
        Adam(0.1).bind(4).set_state(1, np.zeros(3, np.float32))


def test_apply_works_on_any_float32_array_shape():
    p = np.ones((4, 5), np.float32)
    SGD(0.5).apply(p, np.full((4, 5), 2.0, np.float32))
    np.testing.assert_allclose(p, 0.0)
    assert math.isclose(SGD(0.5).learning_rate, 0.5)


KERAS_ADADELTA = """
import json, sys
import numpy as np
import tensorflow as tf
p0, grads, lr = json.loads(sys.argv[1])
var = tf.Variable(np.asarray(p0, np.float32))
opt = tf.keras.optimizers.Adadelta(learning_rate=lr, rho=0.95, epsilon=1e-7)
for g in grads:
    opt.apply_gradients([(tf.constant(np.asarray(g, np.float32)), var)])
print(json.dumps(var.numpy().astype(float).tolist()))
"""


@pytest.mark.parametrize("lr", [0.1, 1.0])
def test_adadelta_matches_keras_after_three_steps(lr):
    """Model (b)'s optimizer against Keras itself (TensorFlow's Keras 3): the
    learning rate scales the Adadelta update, rho 0.95, epsilon 1e-7 inside both
    square roots. Runs where TensorFlow is importable or SPARKGRAD_TF_PYTHON
    names an interpreter that has it (e.g. /work/tfvenv/bin/python)."""
    import json
    import os
    import subprocess

    from tf_fixtures import tf_python

    python = tf_python()
    rng = np.random.default_rng(9)
    p = np.zeros(300, np.float32)  # the update does not depend on p: start at 0 to compare the steps themselves
    grads = [rng.standard_normal(300).astype(np.float32) * s for s in (1.0, 0.01, 3.0)]
    arg = json.dumps([p.tolist(), [g.tolist() for g in grads], lr])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([python, "-c", KERAS_ADADELTA, arg], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    keras_p = np.asarray(json.loads(out.stdout.strip().splitlines()[-1]), np.float32)
    opt = Adadelta(lr)  # Keras' defaults: rho 0.95, epsilon 1e-7
    for g in grads:
        opt.apply(p, g)
    assert np.abs(keras_p).min() > 0
    assert np.abs(p - keras_p).max() <= 1e-5 * np.abs(keras_p).max()
