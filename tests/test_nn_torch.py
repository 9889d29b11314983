"""Whole training steps against PyTorch 2.13 from identical initial weights:
forward, loss, gradients and the parameters after 3 steps of each optimizer,
to about 1e-5 relative; plus gradients against finite differences."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nn_torch_ref import TorchMirror, rel_err, torch_optimizer  # noqa: E402
from sparkgrad.nn import (  # noqa: E402
    SGD,
    Adadelta,
    Adam,
    AdamW,
    AveragePooling2D,
    Conv2D,
    Dense,
    Dropout,
    Flatten,
    MaxPool2D,
    RMSprop,
    Sequential,
)
from sparkgrad.nn.models import walkthrough_mlp  # noqa: E402

torch.set_num_threads(1)

# (sparkgrad optimizer, torch.optim name, torch kwargs)
OPTIMIZERS = {
    "sgd": (lambda: SGD(0.07), "sgd", dict(lr=0.07)),
    "sgd_momentum_wd": (
        lambda: SGD(0.05, momentum=0.9, weight_decay=1e-3),
        "sgd",
        dict(lr=0.05, momentum=0.9, weight_decay=1e-3),
    ),
    "sgd_nesterov": (lambda: SGD(0.05, momentum=0.8, nesterov=True), "sgd", dict(lr=0.05, momentum=0.8, nesterov=True)),
    "adam": (lambda: Adam(0.01, epsilon=1e-8), "adam", dict(lr=0.01, eps=1e-8)),
    "adamw": (
        lambda: AdamW(0.01, weight_decay=0.05, epsilon=1e-8),
        "adamw",
        dict(lr=0.01, weight_decay=0.05, eps=1e-8),
    ),
    "rmsprop": (lambda: RMSprop(0.01, rho=0.9, epsilon=1e-8), "rmsprop", dict(lr=0.01, alpha=0.9, eps=1e-8)),
    "adadelta": (lambda: Adadelta(0.1, rho=0.95, epsilon=1e-7), "adadelta", dict(lr=0.1, rho=0.95, eps=1e-7)),
}

# Adam, AdamW and RMSprop divide by sqrt(v): a gradient component that is 0 up
# to rounding (1e-7 relative to the largest) still moves its parameter by about
# lr, in a direction set by the rounding. For them both frameworks step from the
# SAME gradient (ours, after checking it against torch's to 1e-5), so the
# comparison measures the update rule instead of amplified rounding.
NORMALISING = {"adam", "adamw", "rmsprop"}


def mlp(seed: int = 3) -> Sequential:
    return walkthrough_mlp(seed=seed)


def small_cnn(seed: int = 5) -> Sequential:
    return Sequential(
        [
            Conv2D(8, 3, activation="relu", input_shape=(14, 14, 2)),
            Conv2D(16, 3, strides=2, padding="same", activation="tanh"),
            MaxPool2D(2),
            AveragePooling2D(2, strides=1, padding="same"),
            Flatten(),
            Dense(32, activation="sigmoid"),
            Dense(10, activation="softmax"),
        ],
        seed=seed,
    )


def batches(shape: tuple[int, ...], n: int, classes: int, onehot: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.random(shape, dtype=np.float32)
        y = rng.integers(0, classes, shape[0])
        out.append((x, np.eye(classes, dtype=np.float32)[y] if onehot else y))
    return out


def run_three_steps(model, mirror, opt_key, data):
    make, tname, tkw = OPTIMIZERS[opt_key]
    model.compile(optimizer=make(), loss=model.loss or "sparse_categorical_crossentropy")
    topt = torch_optimizer(tname, mirror.tensors, **tkw)
    for step, (x, y) in enumerate(data):
        # forward and loss before the update
        tloss = mirror.loss(x, y)
        logits = mirror.forward(x).detach().numpy()
        out = model.predict(x)
        if model.layers[-1].activation == "softmax":
            logits = torch.softmax(torch.from_numpy(logits), 1).numpy()
        assert rel_err(out, logits) < 1e-5, f"forward differs at step {step}"
        loss, _ = model.compute_gradients(x, y)
        assert abs(loss - tloss.item()) <= 1e-5 * abs(tloss.item()), f"loss differs at step {step}"
        topt.zero_grad()
        tloss.backward()
        assert rel_err(model.grads, mirror.flat_grads()) < 1e-5, f"gradients differ at step {step}"
        if opt_key in NORMALISING:
            for t, info in zip(mirror.tensors, model.param_table, strict=True):
                ours = model.grads[info.offset : info.offset + info.size]
                t.grad = torch.from_numpy(ours.reshape(t.shape).copy())
        model.apply_gradients()
        topt.step()
    return rel_err(model.params, mirror.flat_params())


@pytest.mark.parametrize("opt_key", sorted(OPTIMIZERS))
def test_mlp_three_steps_match_pytorch(opt_key):
    model = mlp()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    mirror = TorchMirror(model)
    err = run_three_steps(model, mirror, opt_key, batches((100, 784), 3, 10, onehot=False))
    assert err < 1e-5, f"{opt_key}: parameters after 3 steps differ by {err:.2e} (relative)"


@pytest.mark.parametrize("opt_key", ["sgd_momentum_wd", "adadelta", "adam"])
def test_cnn_three_steps_match_pytorch(opt_key):
    model = small_cnn()
    model.compile(optimizer="sgd", loss="categorical_crossentropy")
    mirror = TorchMirror(model)
    err = run_three_steps(model, mirror, opt_key, batches((6, 14, 14, 2), 3, 10, onehot=True, seed=1))
    assert err < 1e-5, f"{opt_key}: parameters after 3 steps differ by {err:.2e} (relative)"


def test_fit_in_c_matches_pytorch_sgd_loop():
    """The C inner loop (gather -> forward -> backward -> SGD) over 3 unshuffled batches."""
    model = mlp(seed=11)
    model.compile(optimizer=SGD(0.07), loss="sparse_categorical_crossentropy")
    mirror = TorchMirror(model)
    topt = torch.optim.SGD(mirror.tensors, lr=0.07)
    data = batches((300, 784), 1, 10, onehot=False, seed=4)[0]
    hist = model.fit(data[0], data[1], batch_size=100, epochs=1, shuffle=False, verbose=0)
    losses = []
    for i in range(3):
        topt.zero_grad()
        loss = mirror.loss(data[0][i * 100 : (i + 1) * 100], data[1][i * 100 : (i + 1) * 100])
        loss.backward()
        topt.step()
        losses.append(loss.item())
    assert rel_err(model.params, mirror.flat_params()) < 1e-5
    assert abs(hist.history["loss"][0] - np.mean(losses)) < 1e-5 * np.mean(losses)


def _fd_check(model, x, y, n_check=24, eps=1e-3, tol=2e-2):
    model.compile(optimizer="sgd", loss=model.loss or "sparse_categorical_crossentropy")
    model.compute_gradients(x, y)
    grads = model.grads.copy()
    p = model.params
    rng = np.random.default_rng(0)
    # the largest gradients of every tensor plus random others
    idx = set()
    for t in model.param_table:
        g = np.abs(grads[t.offset : t.offset + t.size])
        idx.update((t.offset + np.argsort(g)[-2:]).tolist())
    idx.update(rng.integers(0, p.size, n_check).tolist())
    scale = np.abs(grads).max()
    for i in sorted(idx):
        old = float(p[i])
        p[i] = old + eps
        lp = model.evaluate(x, y, batch_size=len(x))[0]
        p[i] = old - eps
        lm = model.evaluate(x, y, batch_size=len(x))[0]
        p[i] = old
        fd = (lp - lm) / (2 * eps)
        assert abs(fd - grads[i]) <= tol * scale + 1e-3 * abs(fd), f"param {i}: fd {fd:.6g} vs backprop {grads[i]:.6g}"


def test_dense_gradients_match_finite_differences():
    model = Sequential(
        [
            Dense(12, activation="tanh", input_shape=(9,)),
            Dense(7, activation="sigmoid"),
            Dense(4, activation="softmax"),
        ],
        seed=2,
    )
    model.compile(loss="categorical_crossentropy")
    x, y = batches((8, 9), 1, 4, onehot=True, seed=3)[0]
    _fd_check(model, x * 2 - 1, y)


def test_conv_pool_gradients_match_finite_differences():
    model = Sequential(
        [
            Conv2D(4, 3, padding="same", activation="tanh", input_shape=(7, 7, 2)),
            MaxPool2D(2, padding="same"),
            Conv2D(3, 2, activation="sigmoid"),
            AveragePooling2D(2, strides=1),
            Flatten(),
            Dense(5),
        ],
        seed=4,
    )
    model.compile(loss="sparse_categorical_crossentropy")
    x, y = batches((5, 7, 7, 2), 1, 5, onehot=False, seed=6)[0]
    _fd_check(model, x * 2 - 1, y)


def test_fit_with_plain_sgd_folds_the_update_into_the_gemm_and_matches_pytorch():
    """fit on a Dense stack with plain SGD applies W -= lr * X^T dY inside the
    weight-gradient GEMM (no gradient buffer, no optimizer pass): parameters
    after 3 steps still match torch.optim.SGD from the same weights, with a
    step schedule changing the learning rate between steps."""
    model = Sequential(
        [
            Dense(32, activation="relu", input_shape=(40,), kernel_initializer="truncated_normal"),
            Dense(16, activation="tanh"),
            Dense(8, activation="sigmoid"),
            Dense(5),
        ],
        seed=11,
    )
    model.compile(optimizer=SGD(0.3, schedule="step", step_size=2, gamma=0.5), loss="sparse_categorical_crossentropy")
    mirror = TorchMirror(model)
    topt = torch_optimizer("sgd", mirror.tensors, lr=0.3)
    sched = torch.optim.lr_scheduler.StepLR(topt, step_size=2, gamma=0.5)
    data = batches((20, 40), 3, 5, onehot=False, seed=4)
    model.grads[:] = 0.0
    for x, y in data:
        topt.zero_grad()
        mirror.loss(x, y).backward()
        topt.step()
        sched.step()
    x = np.concatenate([b[0] for b in data])
    y = np.concatenate([b[1] for b in data])
    model.fit(x, y, batch_size=20, epochs=1, shuffle=False, verbose=0)
    assert model.step == 3
    assert not model.grads.any(), "the fused path writes no gradient buffer"
    assert rel_err(model.params, mirror.flat_params()) < 1e-5


def test_fused_sgd_with_dropout_matches_gradient_then_update():
    """The folded SGD update through Dropout layers equals compute_gradients
    followed by apply_gradients (same seed, so the same dropout masks)."""

    def make() -> Sequential:
        m = Sequential(
            [
                Flatten(input_shape=(6, 5, 1)),
                Dropout(0.2),
                Dense(24, activation="relu"),
                Dropout(0.5),
                Dense(7, activation="softmax"),
            ],
            seed=21,
        )
        m.compile(optimizer=SGD(0.2), loss="categorical_crossentropy")
        return m

    fused, reference = make(), make()
    for x, y in batches((16, 6, 5, 1), 3, 7, onehot=True, seed=8):
        fused.train_on_batch(x, y)
        reference.compute_gradients(x, y)
        reference.apply_gradients()
    assert not fused.grads.any()
    assert rel_err(fused.params, reference.params) < 1e-5
    assert fused.step == reference.step == 3
