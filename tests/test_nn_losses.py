"""Keras 3's losses and metrics as the C engine computes them (csrc/nn/nn_loss.c, nn_metric.c), against
references: every loss's value and gradients against PyTorch autograd in fp32 (1e-5), with and without
sample weights; the metrics against NumPy formulas, scikit-learn's ROC AUC and a NumPy transcription of
Keras' thresholded AUC; metric states that add up across row sets; the test quality of a real training
run against PyTorch's; and the errors bad inputs raise.

Not here: the optimizers (test_nn_torch.py, test_nn_optim*.py) and distributed evaluation (test_nn_spark.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from sparkgrad.errors import InvalidArgumentError, ModelError, NonFiniteLossError
from sparkgrad.nn import SGD, Adam, Dense, Sequential, losses, metrics

try:
    import torch
    import torch.nn.functional as F
    from nn_torch_ref import TorchMirror
except ImportError:  # torch is in the test extra; the tests that compare with it skip without it
    torch = None
try:
    from sklearn.metrics import roc_auc_score
except ImportError:
    roc_auc_score = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch (pip install -e '.[test]')")
needs_sklearn = pytest.mark.skipif(roc_auc_score is None, reason="needs scikit-learn (pip install -e '.[test]')")

KERAS_EPSILON = 1e-7  # keras.config.epsilon()
ROWS = 16  # rows of the batch of the loss comparisons


@pytest.fixture
def torch_one_thread():
    """Tiny networks run fastest, and reproducibly, on one torch thread; the setting is process-wide."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def small_model(head: str | None, outputs: int, seed: int = 7, last_bias: float = 0.0) -> Sequential:
    model = Sequential([Dense(5, activation="relu", input_shape=(4,)), Dense(outputs, activation=head)], seed=seed)
    if last_bias:
        weights = model.get_weights()
        weights[-1][:] = last_bias
        model.set_weights(weights)
    return model


# ---- 1. every loss against PyTorch, value and gradients --------------------------------------------------


def head_outputs(out: torch.Tensor, head: str | None) -> torch.Tensor:
    """The model's outputs from TorchMirror.forward's (which leaves a softmax head to the loss)."""
    return torch.softmax(out, dim=1) if head == "softmax" else out


def smoothed(t: torch.Tensor, ls: float) -> torch.Tensor:
    return t * (1.0 - ls) + 0.5 * ls  # Keras' binary label smoothing


# Per-row losses in torch of (TorchMirror.forward's output, targets): logits for a linear or softmax head,
# probabilities for a sigmoid head.
RowLoss = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]


def bce_probabilities(ls: float = 0.0) -> RowLoss:
    return lambda p, t: F.binary_cross_entropy(p, smoothed(t, ls), reduction="none").mean(1)


def bce_logits(z, t):
    return F.binary_cross_entropy_with_logits(z, t, reduction="none").mean(1)


def bce_clipped(z, t):  # Keras on a linear head: the outputs are clipped probabilities
    p = z.clamp(KERAS_EPSILON, 1.0 - KERAS_EPSILON)
    return F.binary_cross_entropy(p, t, reduction="none").mean(1)


def cross_entropy(ls: float) -> RowLoss:
    return lambda z, t: F.cross_entropy(z, t, label_smoothing=ls, reduction="none")


def elementwise(fn: Callable, head: str | None) -> RowLoss:
    return lambda out, t: fn(head_outputs(out, head), t).mean(1)


def mse(p, t):
    return F.mse_loss(p, t, reduction="none")


def mae(p, t):
    return F.l1_loss(p, t, reduction="none")


def huber(delta: float) -> Callable:
    return lambda p, t: F.huber_loss(p, t, reduction="none", delta=delta)


def poisson(p, t):  # Keras: p - t log(p + eps); torch's log_input=False form is the same expression
    return F.poisson_nll_loss(p, t, log_input=False, eps=KERAS_EPSILON, reduction="none")


def poisson_by_hand(p, t):
    return p - t * torch.log(p + KERAS_EPSILON)


@dataclass(frozen=True)
class LossCase:
    id: str
    head: str | None  # the last Dense's activation
    outputs: int
    loss: Callable[[], losses.Loss]
    targets: str  # "binary" {0,1}, "soft" [0,1], "onehot", "labels", "real", "counts"
    reference: Callable[[str | None], RowLoss]  # head -> per-row torch loss
    last_bias: float = 0.0  # the last layer's bias (outputs near 0.5 for clipping, positive for poisson)


LOSS_CASES = [
    LossCase("bce_sigmoid_1", "sigmoid", 1, losses.BinaryCrossentropy, "binary", lambda h: bce_probabilities()),
    LossCase("bce_sigmoid_3", "sigmoid", 3, losses.BinaryCrossentropy, "soft", lambda h: bce_probabilities()),
    LossCase(
        "bce_sigmoid_smoothed",
        "sigmoid",
        3,
        lambda: losses.BinaryCrossentropy(label_smoothing=0.1),
        "binary",
        lambda h: bce_probabilities(0.1),
    ),
    LossCase(
        "bce_from_logits",
        None,
        3,
        lambda: losses.BinaryCrossentropy(from_logits=True),
        "soft",
        lambda h: bce_logits,
    ),
    LossCase("bce_linear_clipped", None, 3, losses.BinaryCrossentropy, "binary", lambda h: bce_clipped, 0.5),
    *[
        LossCase(
            f"{name}_{head or 'linear'}_ls{ls}",
            head,
            4,
            lambda cls=cls, ls=ls: cls(label_smoothing=ls),
            targets,
            lambda h, ls=ls: cross_entropy(ls),
        )
        for name, cls, targets in [
            ("cce", losses.CategoricalCrossentropy, "onehot"),
            ("scce", losses.SparseCategoricalCrossentropy, "labels"),
        ]
        for head in (None, "softmax")
        for ls in (0.0, 0.1)
    ],
    LossCase("mse_linear", None, 2, losses.MeanSquaredError, "real", lambda h: elementwise(mse, h)),
    LossCase("mse_softmax", "softmax", 3, losses.MeanSquaredError, "soft", lambda h: elementwise(mse, h)),
    LossCase("mae_linear", None, 2, losses.MeanAbsoluteError, "real", lambda h: elementwise(mae, h)),
    LossCase("mae_sigmoid", "sigmoid", 2, losses.MeanAbsoluteError, "soft", lambda h: elementwise(mae, h)),
    LossCase("huber_delta1", None, 2, losses.Huber, "real", lambda h: elementwise(huber(1.0), h)),
    LossCase("huber_delta2", None, 2, lambda: losses.Huber(delta=2.0), "real", lambda h: elementwise(huber(2.0), h)),
    LossCase("poisson_sigmoid", "sigmoid", 2, losses.Poisson, "counts", lambda h: elementwise(poisson, h)),
    LossCase("poisson_linear", None, 2, losses.Poisson, "counts", lambda h: elementwise(poisson_by_hand, h), 3.0),
]


def loss_batch(case: LossCase, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, (ROWS, 4)).astype(np.float32)
    k = case.outputs
    labels = np.arange(ROWS) % k  # every class present
    rng.shuffle(labels)
    y = {
        "binary": lambda: rng.integers(0, 2, (ROWS, k)),
        "soft": lambda: rng.uniform(0.0, 1.0, (ROWS, k)),
        "onehot": lambda: np.eye(k)[labels],
        "labels": lambda: labels,
        "real": lambda: 2.5 * rng.standard_normal((ROWS, k)),  # errors on both sides of Huber's deltas
        "counts": lambda: rng.poisson(1.5, (ROWS, k)),
    }[case.targets]()
    return x, (y.astype(np.int64) if case.targets == "labels" else y.astype(np.float32))


def row_weights(seed: int = 1) -> np.ndarray:
    w = np.random.default_rng(seed).uniform(0.0, 2.0, ROWS).astype(np.float32)
    w[3] = 0.0
    return w


def torch_loss_and_grads(model: Sequential, case: LossCase, x, y, w) -> tuple[float, list[np.ndarray]]:
    """Keras' reduction in torch: sum(w * per-row loss) / rows, from the same fp32 weights."""
    mirror = TorchMirror(model)
    target = torch.from_numpy(y)
    rows = case.reference(case.head)(mirror.forward(x), target)
    weights = torch.ones(ROWS) if w is None else torch.from_numpy(w)
    loss = (weights * rows).sum() / ROWS
    loss.backward()
    return float(loss.detach()), [t.grad.numpy() for t in mirror.tensors]


def assert_grads_match(model: Sequential, ref: list[np.ndarray]) -> None:
    """Each tensor elementwise to 1e-5 relative, with 1e-5 of the gradient's largest value as the floor
    for the components that are nearly zero."""
    scale = max(float(np.max(np.abs(g))) for g in ref)
    assert scale > 0.0
    for t, want in zip(model.param_table, ref, strict=True):
        got = model.grads[t.offset : t.offset + t.size].reshape(t.shape)
        what = f"layer {t.layer} {'bias' if t.is_bias else 'kernel'}"
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale, err_msg=what)


@needs_torch
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "sample_weight"])
@pytest.mark.parametrize("case", LOSS_CASES, ids=[c.id for c in LOSS_CASES])
def test_loss_value_and_gradients_match_torch(case, weighted, torch_one_thread):
    model = small_model(case.head, case.outputs, last_bias=case.last_bias)
    model.compile(optimizer="sgd", loss=case.loss(), metrics=[])
    x, y = loss_batch(case)
    w = row_weights() if weighted else None
    loss = model.compute_gradients(x, y, sample_weight=w)
    want_loss, want_grads = torch_loss_and_grads(model, case, x, y, w)
    assert loss == pytest.approx(want_loss, rel=1e-5, abs=1e-7)
    assert_grads_match(model, want_grads)


@needs_torch
def test_linear_head_binary_crossentropy_covers_clipped_and_unclipped_outputs():
    """The clipped case above means something only if some outputs fall outside [eps, 1 - eps] (gradient 0)
    and some inside."""
    case = next(c for c in LOSS_CASES if c.id == "bce_linear_clipped")
    model = small_model(case.head, case.outputs, last_bias=case.last_bias)
    out = model.predict(loss_batch(case)[0])
    inside = (out >= KERAS_EPSILON) & (out <= 1.0 - KERAS_EPSILON)
    assert 0 < inside.sum() < inside.size


@needs_torch
def test_poisson_linear_head_outputs_are_positive():
    """The linear-head Poisson case compares finite losses: its outputs are all positive."""
    case = next(c for c in LOSS_CASES if c.id == "poisson_linear")
    model = small_model(case.head, case.outputs, last_bias=case.last_bias)
    assert model.predict(loss_batch(case)[0]).min() > 0.0


@needs_torch
@pytest.mark.parametrize(
    "loss,torch_loss",
    [
        (losses.Huber(delta=1.0), lambda: torch.nn.HuberLoss(delta=1.0)),
        (losses.Huber(delta=2.0), lambda: torch.nn.HuberLoss(delta=2.0)),
        (losses.MeanSquaredError(), lambda: torch.nn.MSELoss()),
        (losses.MeanAbsoluteError(), lambda: torch.nn.L1Loss()),
    ],
    ids=["huber1", "huber2", "mse", "mae"],
)
def test_keras_reduction_equals_torch_mean_over_all_elements(loss, torch_loss):
    """Keras averages over the last axis, then over the batch; torch's 'mean' over every element: the same
    number when every row has the same width (unweighted)."""
    case = next(c for c in LOSS_CASES if c.id == "huber_delta2")
    model = small_model(None, 2)
    model.compile(optimizer="sgd", loss=loss, metrics=[])
    x, y = loss_batch(case)
    got = model.compute_gradients(x, y)
    want = torch_loss()(torch.from_numpy(model.predict(x)), torch.from_numpy(y))
    assert got == pytest.approx(float(want), rel=1e-6)


# ---- 2. metrics against references -------------------------------------------------------------------------


def divide_no_nan(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros_like(a), where=b != 0)


def keras_auc(pred: np.ndarray, truth: np.ndarray, weight: np.ndarray, num_thresholds: int, curve: str) -> float:
    """keras.metrics.AUC (summation "interpolation") by its definition: confusion counts at every
    threshold from comparing each prediction with it (not from buckets), then the trapezoid over (fpr,
    recall) for ROC or interpolate_pr_auc (Davis & Goadrich) for PR."""
    inner = [(i + 1) * 1.0 / (num_thresholds - 1) for i in range(num_thresholds - 2)]
    thresholds = np.array([0.0 - KERAS_EPSILON, *inner, 1.0 + KERAS_EPSILON], np.float32)
    k = pred.shape[1]
    p = np.clip(pred.astype(np.float32).reshape(-1), 0.0, 1.0)
    positive = truth.reshape(-1) != 0
    w = np.repeat(np.asarray(weight, np.float64), k)
    above = p[None, :] > thresholds[:, None]  # [thresholds, predictions]
    tp = (above & positive) @ w
    fp = (above & ~positive) @ w
    fn = (~above & positive) @ w
    tn = (~above & ~positive) @ w
    if curve == "ROC":
        fpr, recall = divide_no_nan(fp, fp + tn), divide_no_nan(tp, tp + fn)
        return float(np.sum((fpr[:-1] - fpr[1:]) * (recall[:-1] + recall[1:]) / 2.0))
    dtp = tp[:-1] - tp[1:]
    pp = tp + fp
    dp = pp[:-1] - pp[1:]
    slope = divide_no_nan(dtp, np.maximum(dp, 0.0))
    intercept = tp[1:] - slope * pp[1:]
    both = (pp[:-1] > 0) & (pp[1:] > 0)
    ratio = np.where(both, divide_no_nan(pp[:-1], np.maximum(pp[1:], 0.0)), 1.0)
    increments = divide_no_nan(slope * (dtp + intercept * np.log(ratio)), np.maximum(tp[1:] + fn[1:], 0.0))
    return float(np.sum(increments))


def scored_rows(n: int = 4000, outputs: int = 1, seed: int = 11):
    """A fixed sigmoid-head model, inputs, labels drawn from its predictions (an AUC well inside (0.5, 1))
    and sample weights with some zeros."""
    model = small_model("sigmoid", outputs, seed=seed)
    weights = model.get_weights()
    weights[-2] *= 4.0  # spread the predictions over most of [0, 1]
    model.set_weights(weights)
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, (n, 4)).astype(np.float32)
    p = model.predict(x)
    y = (rng.random(p.shape) < p).astype(np.float32)
    w = rng.uniform(0.0, 2.0, n).astype(np.float32)
    w[rng.random(n) < 0.05] = 0.0
    return model, x, y, w, p


@pytest.mark.parametrize("num_thresholds", [200, 2001])
@pytest.mark.parametrize("curve", ["ROC", "PR"])
@pytest.mark.parametrize("outputs", [1, 3])
def test_auc_equals_keras_definition(curve, num_thresholds, outputs):
    model, x, y, w, p = scored_rows(outputs=outputs)
    model.compile(loss="binary_crossentropy", metrics=[metrics.AUC(num_thresholds=num_thresholds, curve=curve)])
    got = model.evaluate(x, y, batch_size=128, sample_weight=w, return_dict=True)["auc"]
    assert got == pytest.approx(keras_auc(p, y, w, num_thresholds, curve), abs=1e-9)


def test_auc_from_logits_equals_auc_of_sigmoid_outputs():
    sig, x, y, w, p = scored_rows()
    linear = small_model(None, 1)
    linear.set_weights(sig.get_weights())
    linear.compile(loss=losses.BinaryCrossentropy(from_logits=True), metrics=[metrics.AUC(from_logits=True)])
    got = linear.evaluate(x, y, sample_weight=w, return_dict=True)["auc"]
    assert got == pytest.approx(keras_auc(p, y, w, 200, "ROC"), abs=1e-9)


@needs_sklearn
@pytest.mark.parametrize("num_thresholds,tolerance", [(200, 1e-3), (2001, 1e-4)])
def test_roc_auc_matches_sklearn_within_threshold_discretisation(num_thresholds, tolerance):
    model, x, y, w, p = scored_rows()
    model.compile(loss="binary_crossentropy", metrics=[metrics.AUC(num_thresholds=num_thresholds)])
    got = model.evaluate(x, y, sample_weight=w, return_dict=True)["auc"]
    want = roc_auc_score(y[:, 0], p[:, 0], sample_weight=w)
    assert 0.6 < want < 0.95
    assert got == pytest.approx(want, abs=tolerance)


def weighted_mean(values: np.ndarray, w: np.ndarray) -> float:
    w = np.asarray(w, np.float64)  # the C states sum in double; a float32 sum of the weights would not
    return float(np.sum(w * values) / np.sum(w))


def test_binary_accuracy_precision_recall_match_numpy():
    """Three sigmoid outputs (multi-label): binary accuracy averages over the outputs; precision and
    recall count every output of every row, with its row's weight."""
    model, x, y, w, p = scored_rows(n=1000, outputs=3)
    model.compile(
        loss="binary_crossentropy",
        metrics=[
            metrics.BinaryAccuracy(threshold=0.3),
            metrics.Precision(),
            metrics.Recall(),
            metrics.Precision(thresholds=0.7, name="precision_07"),
            metrics.Recall(thresholds=0.7, name="recall_07"),
        ],
    )
    got = model.evaluate(x, y, batch_size=128, sample_weight=w, return_dict=True)
    wk = np.repeat(w[:, None].astype(np.float64), 3, axis=1)
    want = {"binary_accuracy": weighted_mean(((p > 0.3) == y).mean(1), w)}
    for suffix, threshold in (("", 0.5), ("_07", 0.7)):
        pos, truth = p > threshold, y != 0
        tp, fp, fn = (np.sum(wk * (pos & truth)), np.sum(wk * (pos & ~truth)), np.sum(wk * (~pos & truth)))
        want["precision" + suffix] = tp / (tp + fp)
        want["recall" + suffix] = tp / (tp + fn)
    for name, value in want.items():
        assert got[name] == pytest.approx(value, rel=1e-9), name


@pytest.mark.parametrize("sparse", [False, True], ids=["categorical", "sparse"])
def test_categorical_accuracies_match_numpy(sparse):
    model = small_model("softmax", 4, seed=5)
    rng = np.random.default_rng(5)
    x = rng.uniform(-1.0, 1.0, (1000, 4)).astype(np.float32)
    labels = rng.integers(0, 4, 1000)
    w = rng.uniform(0.0, 2.0, 1000).astype(np.float32)
    loss = "sparse_categorical_crossentropy" if sparse else "categorical_crossentropy"
    model.compile(loss=loss, metrics=["accuracy"])
    y = labels if sparse else np.eye(4, dtype=np.float32)[labels]
    got = model.evaluate(x, y, batch_size=128, sample_weight=w, return_dict=True)
    hits = np.argmax(model.predict(x), axis=1) == labels
    assert type(model.metrics[0]) is (metrics.SparseCategoricalAccuracy if sparse else metrics.CategoricalAccuracy)
    assert got["accuracy"] == pytest.approx(weighted_mean(hits, w), rel=1e-9)
    assert 0.0 < got["accuracy"] < 1.0


def test_regression_metrics_and_loss_match_numpy():
    model = small_model(None, 2, seed=9)
    rng = np.random.default_rng(9)
    x = rng.uniform(-1.0, 1.0, (1000, 4)).astype(np.float32)
    y = rng.standard_normal((1000, 2)).astype(np.float32)
    w = rng.uniform(0.0, 2.0, 1000).astype(np.float32)
    model.compile(loss="mse", metrics=["mse", "mae", "rmse"])
    got = model.evaluate(x, y, batch_size=128, sample_weight=w, return_dict=True)
    e = model.predict(x).astype(np.float64) - y
    assert got["mse"] == pytest.approx(weighted_mean((e**2).mean(1), w), rel=1e-9)
    assert got["mae"] == pytest.approx(weighted_mean(np.abs(e).mean(1), w), rel=1e-9)
    assert got["rmse"] == pytest.approx(np.sqrt(weighted_mean((e**2).mean(1), w)), rel=1e-9)
    # the loss is Keras' sum_over_batch_size: weighted sum over all rows / rows (not / sum of weights)
    assert got["loss"] == pytest.approx(np.sum(w * (e**2).mean(1)) / len(x), rel=1e-6)


# ---- 3. states add up -----------------------------------------------------------------------------------------


def test_metrics_of_two_halves_summed_equal_evaluate_over_all_rows():
    model, x, y, w, p = scored_rows(n=3000)
    model.compile(
        loss="binary_crossentropy",
        metrics=["accuracy", metrics.AUC(), metrics.AUC(curve="PR", name="pr_auc"), "precision", "recall"],
    )
    whole = model.evaluate(x, y, batch_size=128, sample_weight=w, return_dict=True)
    halves = x[:, 2] > 0.0  # halves whose predictions (the model leans on feature 2) differ in distribution
    states, loss_sum, seen, per_half = [], 0.0, 0, []
    for rows in (halves, ~halves):
        state = model.new_metric_state()
        r = model._evaluate_arrays(x[rows], y[rows], 64, state, w[rows])
        loss_sum, seen = loss_sum + r[0], seen + r[1]
        states.append(state)
        per_half.append(model.metric_values(state))
    pooled = model.metric_values(states[0] + states[1])
    assert seen == len(x)
    assert loss_sum / seen == pytest.approx(whole["loss"], rel=1e-12)
    for name, value in pooled.items():
        assert value == pytest.approx(whole[name], rel=1e-12), name
    # what averaging the halves' values would have given is another number: the sum is what pools
    for name in ("auc", "pr_auc"):
        averaged = (per_half[0][name] + per_half[1][name]) / 2.0
        assert abs(averaged - whole[name]) > 0.01, name


# ---- 4. quality of real training against PyTorch ---------------------------------------------------------------

QUALITY_SEEDS = (0, 1, 2)
QUALITY_EPOCHS = 10
TRAIN_ROWS, TEST_ROWS, FEATURES = 20_000, 5_000, 20


def tabular(regression: bool, seed: int = 2024):
    """20 standard-normal features, a nonlinear function of 8 of them (products, a sine, squares, |x|):
    noisy targets (regression) or labels drawn from its sigmoid; 20k train and 5k test rows."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((TRAIN_ROWS + TEST_ROWS, FEATURES)).astype(np.float32)
    f = (
        1.5 * x[:, 0] * x[:, 1]
        + 2.0 * np.sin(2.0 * x[:, 2])
        + x[:, 3] ** 2
        - 1.0
        + 0.8 * x[:, 4]
        - 0.6 * x[:, 5] * x[:, 6]
        + np.abs(x[:, 7])
        - 0.8
    )
    if regression:
        y = (f + 0.5 * rng.standard_normal(len(f))).astype(np.float32)
    else:
        y = (rng.random(len(f)) < 1.0 / (1.0 + np.exp(-f))).astype(np.float32)
    return x[:TRAIN_ROWS], y[:TRAIN_ROWS], x[TRAIN_ROWS:], y[TRAIN_ROWS:]


def mlp(head: str | None, seed: int) -> Sequential:
    return Sequential(
        [
            Dense(64, activation="relu", input_shape=(FEATURES,)),
            Dense(32, activation="relu"),
            Dense(1, activation=head),
        ],
        seed=seed,
    )


def sparkgrad_run(head: str | None, loss: str, seed: int, data) -> np.ndarray:
    """Test-set outputs after training (probabilities for a sigmoid head)."""
    x, y, x_test, _ = data
    model = mlp(head, seed)
    model.compile(optimizer=Adam(1e-3, epsilon=1e-7), loss=loss, metrics=[])
    model.fit(x, y, batch_size=100, epochs=QUALITY_EPOCHS, verbose=0)
    return model.predict(x_test)[:, 0]


def torch_run(head: str | None, seed: int, data) -> np.ndarray:
    """The same network from the same initial weights (sparkgrad's initialiser, seed ``seed``), the same
    optimizer and budget; torch shuffles with its own generator."""
    x, y, x_test, _ = data
    mirror = TorchMirror(mlp(None, seed))  # linear head: logits, the loss applies the sigmoid
    opt = torch.optim.Adam(mirror.tensors, lr=1e-3, betas=(0.9, 0.999), eps=1e-7)
    loss_fn = torch.nn.BCEWithLogitsLoss() if head == "sigmoid" else torch.nn.MSELoss()
    gen = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)[:, None]
    for _ in range(QUALITY_EPOCHS):
        for idx in torch.randperm(len(x), generator=gen).split(100):
            opt.zero_grad()
            loss_fn(mirror.forward(xt[idx]), yt[idx]).backward()
            opt.step()
    with torch.no_grad():
        out = mirror.forward(x_test)
    return (torch.sigmoid(out) if head == "sigmoid" else out)[:, 0].numpy()


def rank_auc(score: np.ndarray, truth: np.ndarray) -> float:
    """The exact ROC AUC (Mann-Whitney, ties counted half) from average ranks."""
    values, inverse, counts = np.unique(score, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts  # rank (0-based) of each distinct value's first row
    ranks = (first + (counts - 1) / 2.0 + 1.0)[inverse]
    pos = truth != 0
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


@pytest.mark.slow  # 5-7 s of CPU each, torch's 3 runs most of it; `make asan` leaves it out
@needs_torch
def test_binary_classifier_reaches_torch_test_auc(torch_one_thread):
    """Median test AUC over 3 seeds within 0.005 of PyTorch's (same MLP 20-64-32-1, initial weights,
    Adam 1e-3 eps 1e-7, batch 100, 10 epochs)."""
    data = tabular(regression=False)
    y_test = data[3]
    ours = [rank_auc(sparkgrad_run("sigmoid", "binary_crossentropy", s, data), y_test) for s in QUALITY_SEEDS]
    theirs = [rank_auc(torch_run("sigmoid", s, data), y_test) for s in QUALITY_SEEDS]
    print(f"test AUC sparkgrad {ours} torch {theirs}")
    assert min(theirs) > 0.75  # the network learned the structure: the comparison means something
    assert np.median(ours) >= np.median(theirs) - 0.005, (ours, theirs)


@pytest.mark.slow  # 5-7 s of CPU each, torch's 3 runs most of it; `make asan` leaves it out
@needs_torch
def test_regressor_reaches_torch_test_mse(torch_one_thread):
    """Median test MSE over 3 seeds at most 5% above PyTorch's (same setup as the classifier, linear
    head, MSE)."""
    data = tabular(regression=True)
    y_test = data[3]
    ours = [float(np.mean((sparkgrad_run(None, "mse", s, data) - y_test) ** 2)) for s in QUALITY_SEEDS]
    theirs = [float(np.mean((torch_run(None, s, data) - y_test) ** 2)) for s in QUALITY_SEEDS]
    print(f"test MSE sparkgrad {ours} torch {theirs} (variance of y {float(np.var(y_test)):.3f})")
    assert max(theirs) < 0.5 * np.var(y_test)  # well below predicting the mean
    assert np.median(ours) <= 1.05 * np.median(theirs), (ours, theirs)


# ---- 5. bad input -----------------------------------------------------------------------------------------------


def test_sparse_crossentropy_on_sigmoid_head_is_refused_at_compile():
    model = small_model("sigmoid", 3)
    with pytest.raises(ModelError, match="sparse_categorical_crossentropy") as e:
        model.compile(loss="sparse_categorical_crossentropy")
    assert "sigmoid" in str(e.value)


@pytest.mark.parametrize("call", ["fit", "evaluate", "train_on_batch"])
def test_binary_target_outside_unit_interval_names_value_and_row(call):
    model = small_model("sigmoid", 1)
    model.compile(loss="binary_crossentropy")
    x = np.zeros((20, 4), np.float32)
    y = np.zeros(20, np.float32)
    y[13] = 1.5
    before = model.get_weights()
    run = {
        "fit": lambda: model.fit(x, y, batch_size=8, epochs=1, verbose=0),  # shuffled: row 13 is the data's row
        "evaluate": lambda: model.evaluate(x, y, batch_size=8),
        "train_on_batch": lambda: model.train_on_batch(x, y),
    }[call]
    with pytest.raises(InvalidArgumentError, match=r"target 1\.5 .*row 13\b"):
        run()
    if call == "train_on_batch":
        for a, b in zip(model.get_weights(), before, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape", [(10,), (10, 3), (10, 2, 1)])
def test_mse_on_two_outputs_refuses_targets_of_another_shape(shape):
    model = small_model(None, 2)
    model.compile(loss="mse")
    with pytest.raises(InvalidArgumentError, match=r"\(10, 2\)"):
        model.evaluate(np.zeros((10, 4), np.float32), np.zeros(shape, np.float32))


def test_unknown_loss_name_lists_the_names():
    with pytest.raises(ValueError, match="unknown loss 'msle'") as e:
        small_model(None, 1).compile(loss="msle")
    for name in ("binary_crossentropy", "huber", "mse", "poisson", "sparse_categorical_crossentropy"):
        assert name in str(e.value)


def test_unknown_metric_name_lists_the_names():
    with pytest.raises(ValueError, match="unknown metric 'f1'") as e:
        small_model("sigmoid", 1).compile(loss="binary_crossentropy", metrics=["f1"])
    for name in ("accuracy", "auc", "precision", "recall", "rmse"):
        assert name in str(e.value)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("activation", ["tanh", None, "relu"])
def test_a_nan_input_is_refused_naming_row_and_feature_and_leaves_that_batch_unapplied(optimizer, activation):
    """Two batches; the second holds a NaN: fit stops at step 2 and the weights are those after step 1.

    The input is checked where it enters: a ReLU forward maps NaN to 0, so the loss would stay finite
    while the backward wrote NaN into the first kernel's row for that feature."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-1.0, 1.0, (40, 4)).astype(np.float32)
    y = rng.integers(0, 2, 40).astype(np.float32)
    x[25, 2] = np.nan

    def model_():
        m = Sequential([Dense(5, activation=activation, input_shape=(4,)), Dense(1, activation="sigmoid")], seed=7)
        m.compile(optimizer=optimizer, loss="binary_crossentropy", metrics=[])
        return m

    model, twin = model_(), model_()
    twin.train_on_batch(x[:20], y[:20])
    with pytest.raises(InvalidArgumentError, match=r"training step 2\b.*input value nan of row 25 \(feature 2\)") as e:
        model.fit(x, y, batch_size=20, epochs=1, shuffle=False, verbose=0)
    assert np.all(np.isfinite(model.params))
    assert e.value.step == 1 and model.step == 1
    for a, b in zip(model.get_weights(), twin.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(InvalidArgumentError, match="row 25"):
        model.predict(x)


def test_a_diverging_loss_raises_nonfinite_loss_naming_the_step_and_leaves_that_batch_unapplied():
    rng = np.random.default_rng(3)
    x = rng.uniform(-1.0, 1.0, (400, 4)).astype(np.float32)
    y = (x[:, 0] * 3).astype(np.float32)
    m = Sequential([Dense(16, activation="relu", input_shape=(4,)), Dense(1)], seed=7)
    m.compile(optimizer=SGD(1e4), loss="mse")
    with pytest.raises(NonFiniteLossError, match=r"training step (\d+) .*mean_squared_error loss is not finite") as e:
        m.fit(x, y, batch_size=10, epochs=5, verbose=0)
    assert e.value.step == m.step > 0 and np.all(np.isfinite(m.params))


def test_class_weight_missing_a_present_class_is_refused():
    model = small_model("softmax", 3)
    model.compile(loss="sparse_categorical_crossentropy")
    x = np.zeros((6, 4), np.float32)
    y = np.array([0, 1, 2, 0, 1, 2])
    with pytest.raises(InvalidArgumentError, match=r"no weight for class 1 \(classes \[0, 2\]\)"):
        model.fit(x, y, epochs=1, verbose=0, class_weight={0: 1.0, 2: 3.0})
