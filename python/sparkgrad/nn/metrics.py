"""Metrics with Keras 3's names and arguments, computed in C during ``fit`` and ``evaluate`` (csrc/nn/nn_metric.c).

Chosen in `Sequential.compile` by name or as objects; they appear in ``History``, the logs callbacks
see, TensorBoard and MLflow under their ``name``:

```python
from sparkgrad.nn import Dense, Sequential, metrics

model = Sequential([Dense(16, activation="relu", input_shape=(8,)), Dense(1, activation="sigmoid")], seed=0)
model.compile(optimizer="adam", loss="binary_crossentropy",
              metrics=["accuracy", metrics.AUC(name="auc"), metrics.AUC(curve="PR", name="pr_auc")])
```

Each metric's state is a vector of weighted sums (AUC: weighted histograms of the predictions of the
positives and the negatives over ``num_thresholds`` evenly spaced thresholds), so the states of several
batches or workers add up and the value is computed once from the sum: an AUC over several workers is
the AUC of their pooled confusion counts, never an average of per-worker AUCs.

``"accuracy"`` (or ``"acc"``) resolves as in Keras: binary accuracy for one output, sparse categorical
accuracy for integer labels, categorical accuracy for one-hot targets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sparkgrad import _core

__all__ = [
    "Metric",
    "BinaryAccuracy",
    "CategoricalAccuracy",
    "SparseCategoricalAccuracy",
    "AUC",
    "Precision",
    "Recall",
    "MeanSquaredError",
    "MeanAbsoluteError",
    "RootMeanSquaredError",
    "get",
]


class Metric:
    """Base of the metrics: a C table entry (``fn``) and its arguments.

    Attributes:
        name (str): The key in the logs and ``History``.
    """

    fn = ""

    def __init__(self, name: str | None = None, dtype: Any = None) -> None:
        if dtype not in (None, "float32"):
            raise ValueError(f"{type(self).__name__}: dtype must be None or 'float32', not {dtype!r}")
        self.name = name or self.fn

    def spec(self) -> tuple[int, float, int, bool, bool]:
        """``(kind, threshold, num_thresholds, pr_curve, from_logits)`` as ``_core.Model.set_metrics`` takes it."""
        return (_core.METRIC_NAMES.index(self.fn), 0.5, 200, False, False)

    def get_config(self) -> dict:
        return {"name": self.name}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


class BinaryAccuracy(Metric):
    """The fraction of outputs where ``output > threshold`` equals the target (averaged over the outputs)."""

    fn = "binary_accuracy"

    def __init__(self, name: str = "binary_accuracy", dtype: Any = None, threshold: float = 0.5) -> None:
        super().__init__(name, dtype)
        self.threshold = float(threshold)

    def spec(self):
        return (_core.METRIC_NAMES.index(self.fn), self.threshold, 200, False, False)

    def get_config(self) -> dict:
        return {**super().get_config(), "threshold": self.threshold}


class CategoricalAccuracy(Metric):
    """The fraction of rows whose largest output is the target's largest (one-hot targets, or labels)."""

    fn = "categorical_accuracy"

    def __init__(self, name: str = "categorical_accuracy", dtype: Any = None) -> None:
        super().__init__(name, dtype)


class SparseCategoricalAccuracy(Metric):
    """The fraction of rows whose largest output is the integer label."""

    fn = "sparse_categorical_accuracy"

    def __init__(self, name: str = "sparse_categorical_accuracy", dtype: Any = None) -> None:
        super().__init__(name, dtype)


class AUC(Metric):
    """Area under the ROC or precision-recall curve, by Keras' thresholds method.

    Predictions (probabilities, or logits with ``from_logits=True``) are compared with ``num_thresholds``
    evenly spaced thresholds; the curve is interpolated between them (Keras' ``"interpolation"``
    summation; for PR, Davis and Goadrich's interpolation). Every output of every row counts as one
    binary prediction (``multi_label=False``).
    """

    fn = "auc"

    def __init__(
        self,
        num_thresholds: int = 200,
        curve: str = "ROC",
        summation_method: str = "interpolation",
        name: str | None = None,
        dtype: Any = None,
        thresholds: Sequence[float] | None = None,
        multi_label: bool = False,
        num_labels: int | None = None,
        label_weights: Any = None,
        from_logits: bool = False,
    ) -> None:
        super().__init__(name or "auc", dtype)
        if curve not in ("ROC", "PR"):
            raise ValueError(f"AUC: curve must be 'ROC' or 'PR', not {curve!r}")
        if summation_method != "interpolation":
            raise ValueError(f"AUC: only summation_method='interpolation' is supported, not {summation_method!r}")
        if thresholds is not None or multi_label or num_labels is not None or label_weights is not None:
            raise ValueError("AUC: thresholds, multi_label, num_labels and label_weights are not supported")
        if int(num_thresholds) <= 1:
            raise ValueError(f"AUC: num_thresholds must be > 1, not {num_thresholds!r}")
        self.num_thresholds = int(num_thresholds)
        self.curve = curve
        self.from_logits = bool(from_logits)

    def spec(self):
        kind = _core.METRIC_NAMES.index(self.fn)
        return (kind, 0.5, self.num_thresholds, self.curve == "PR", self.from_logits)

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "num_thresholds": self.num_thresholds,
            "curve": self.curve,
            "from_logits": self.from_logits,
        }


class _Confusion(Metric):
    def __init__(
        self,
        thresholds: float | None = None,
        top_k: int | None = None,
        class_id: int | None = None,
        name: str | None = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(name, dtype)
        if top_k is not None or class_id is not None:
            raise ValueError(f"{type(self).__name__}: top_k and class_id are not supported")
        if thresholds is not None and not isinstance(thresholds, (int, float)):
            raise ValueError(f"{type(self).__name__}: thresholds must be one float, not {thresholds!r}")
        self.thresholds = None if thresholds is None else float(thresholds)

    def spec(self):
        kind = _core.METRIC_NAMES.index(self.fn)
        return (kind, 0.5 if self.thresholds is None else self.thresholds, 200, False, False)

    def get_config(self) -> dict:
        return {**super().get_config(), "thresholds": self.thresholds}


class Precision(_Confusion):
    """``tp / (tp + fp)`` with ``output > thresholds`` (default 0.5) as the positive prediction."""

    fn = "precision"


class Recall(_Confusion):
    """``tp / (tp + fn)`` with ``output > thresholds`` (default 0.5) as the positive prediction."""

    fn = "recall"


class MeanSquaredError(Metric):
    """Weighted mean over rows of the mean over outputs of ``(output - target) ** 2``."""

    fn = "mean_squared_error"


class MeanAbsoluteError(Metric):
    """Weighted mean over rows of the mean over outputs of ``|output - target|``."""

    fn = "mean_absolute_error"


class RootMeanSquaredError(Metric):
    """The square root of `MeanSquaredError`'s value."""

    fn = "root_mean_squared_error"


_BY_NAME: dict[str, type[Metric]] = {
    "binary_accuracy": BinaryAccuracy,
    "categorical_accuracy": CategoricalAccuracy,
    "sparse_categorical_accuracy": SparseCategoricalAccuracy,
    "auc": AUC,
    "precision": Precision,
    "recall": Recall,
    "mean_squared_error": MeanSquaredError,
    "mse": MeanSquaredError,
    "mean_absolute_error": MeanAbsoluteError,
    "mae": MeanAbsoluteError,
    "root_mean_squared_error": RootMeanSquaredError,
    "rmse": RootMeanSquaredError,
}
_CLASSES = {cls.__name__: cls for cls in set(_BY_NAME.values())}


def get(identifier: str | Metric | dict, sparse: bool = False, outputs: int = 1) -> Metric:
    """A metric from a name, a `Metric` or a saved config; ``"accuracy"``/``"acc"`` resolve by the targets.

    Args:
        identifier: The name (Keras' function names, ``"accuracy"``, ``"mse"``, ``"mae"``, ``"rmse"``), a
            `Metric`, or ``{"class_name": ..., "config": ...}``.
        sparse: The loss takes integer labels.
        outputs: The model's number of outputs.

    Raises:
        ValueError: An unknown name.
    """
    if isinstance(identifier, Metric):
        return identifier
    if isinstance(identifier, dict):
        cls = _CLASSES.get(identifier.get("class_name", ""))
        if cls is None:
            raise ValueError(f"unknown metric class {identifier.get('class_name')!r}; one of {sorted(_CLASSES)}")
        return cls(**identifier.get("config", {}))
    if identifier in ("accuracy", "acc"):
        if outputs == 1:
            return BinaryAccuracy(name=identifier)
        return SparseCategoricalAccuracy(name=identifier) if sparse else CategoricalAccuracy(name=identifier)
    if isinstance(identifier, str) and identifier in _BY_NAME:
        return _BY_NAME[identifier](name=identifier)
    raise ValueError(
        f"unknown metric {identifier!r}; one of {sorted(['accuracy', 'acc', *_BY_NAME])} or a "
        "sparkgrad.nn.metrics.Metric"
    )


def resolve(metrics: Sequence[str | Metric | dict] | None, loss: Any, outputs: int) -> list[Metric]:
    """The metric objects `Sequential.compile` uses for ``metrics`` under ``loss`` (a
    `sparkgrad.nn.losses.Loss`) and ``outputs`` outputs; None: ``["accuracy"]`` for the cross-entropies,
    none for the other losses.

    Raises:
        ValueError: An unknown metric, a bare string instead of a list, or duplicate names.
    """
    if metrics is None:
        metrics = ["accuracy"] if loss.fn.endswith("crossentropy") else []
    if isinstance(metrics, (str, Metric)):
        raise ValueError(f"metrics must be a list, not {metrics!r} (write metrics=[{metrics!r}])")
    objs = [get(m, loss.sparse, outputs) for m in metrics]
    names = [m.name for m in objs]
    dup = {n for n in names if names.count(n) > 1 or n == "loss"}
    if dup:
        raise ValueError(f"metric names must be unique and not 'loss': {sorted(dup)} (pass name=...)")
    return objs


def serialize(metric: Metric) -> dict:
    return {"class_name": type(metric).__name__, "config": metric.get_config()}


def state_size(metrics: Sequence[Metric]) -> int:
    """The doubles of the state of ``metrics``, in C's layout."""
    return int(_core.metric_state_size([m.spec() for m in metrics])) if metrics else 0


def new_state(model_core) -> np.ndarray:
    """A zeroed state array for the metrics the core model was given."""
    return np.zeros(int(model_core.metric_state_size), np.float64)


def results(metrics: Sequence[Metric], state: np.ndarray) -> dict[str, float]:
    """``{name: value}`` of ``metrics`` from their (summed) state, computed in C."""
    if not metrics:
        return {}
    values = _core.metric_results([m.spec() for m in metrics], np.ascontiguousarray(state, np.float64))
    return dict(zip((m.name for m in metrics), values, strict=True))


EVALUATION_SCHEMA = "loss_sum double, seen long, state array<double>"
"""The Spark schema of one task's evaluation: its weighted loss sum, rows and the metrics' state."""


def evaluation_batch(loss_sum: float, seen: int, state: np.ndarray):
    """One task's evaluation as a pyarrow RecordBatch of `EVALUATION_SCHEMA` (for ``mapInArrow``)."""
    import pyarrow as pa

    schema = pa.schema([("loss_sum", pa.float64()), ("seen", pa.int64()), ("state", pa.list_(pa.float64()))])
    return pa.RecordBatch.from_pydict(
        {"loss_sum": [float(loss_sum)], "seen": [int(seen)], "state": [np.asarray(state, np.float64).tolist()]},
        schema=schema,
    )


def sum_evaluations(rows: Any, metrics: Sequence[Metric]) -> tuple[float, int, dict[str, float]]:
    """``(loss_sum, seen, {metric: value})`` from tasks' rows of `EVALUATION_SCHEMA`: the states add up,
    so the values are those of all the rows together (an AUC of pooled counts, not an average)."""
    loss_sum, seen, state = 0.0, 0, None
    for r in rows:
        loss_sum += float(r["loss_sum"] or 0.0)
        seen += int(r["seen"] or 0)
        part = np.asarray(r["state"] or [], np.float64)
        state = part if state is None else state + part
    if not seen or state is None:
        return loss_sum, seen, {}
    return loss_sum, seen, results(metrics, state)
