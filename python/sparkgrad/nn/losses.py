"""Losses with Keras 3's names and arguments; the C engine computes them (csrc/nn/nn_loss.c).

A loss is chosen in `Sequential.compile` by name (``"binary_crossentropy"``, ``"mse"``, ...) or as one of
the objects below. A last ``Dense`` layer with ``activation="softmax"`` or ``"sigmoid"`` is the model's
head: the loss applies it and differentiates through it in the numerically stable fused form
(softmax + cross-entropy, sigmoid + binary cross-entropy, from the logits), as Keras does.

```python
from sparkgrad.nn import Dense, Sequential, losses

model = Sequential([Dense(16, activation="relu", input_shape=(8,)), Dense(1)], seed=0)
model.compile(optimizer="adam", loss=losses.Huber(delta=2.0))
```

Every loss reduces like Keras' default ``"sum_over_batch_size"``: the batch's loss is
``sum(sample_weight * per_sample_loss) / batch_size``. Cross-entropies sum over the classes; the others
average over the last axis.
"""

from __future__ import annotations

from typing import Any

from sparkgrad import _core

__all__ = [
    "Loss",
    "BinaryCrossentropy",
    "CategoricalCrossentropy",
    "SparseCategoricalCrossentropy",
    "MeanSquaredError",
    "MeanAbsoluteError",
    "Huber",
    "Poisson",
    "get",
]

_REDUCTION = "sum_over_batch_size"


class Loss:
    """Base of the losses: a C table entry (``fn``, Keras' function name) and its arguments.

    Attributes:
        name (str): The name Keras logs it under.
        fn (str): The loss function's name (an entry of the C table).
    """

    fn = ""
    default_name = ""
    sparse = False

    def __init__(self, name: str | None = None, reduction: str = _REDUCTION, dtype: Any = None) -> None:
        if reduction != _REDUCTION:
            raise ValueError(f"{type(self).__name__}: only reduction={_REDUCTION!r} is supported, not {reduction!r}")
        if dtype not in (None, "float32"):
            raise ValueError(f"{type(self).__name__}: dtype must be None or 'float32', not {dtype!r}")
        self.name = name or self.default_name
        self.reduction = reduction

    def core_args(self) -> dict:
        """The keyword arguments of ``_core.Model.set_loss`` beside the kind."""
        return {}

    def get_config(self) -> dict:
        """The constructor's arguments, as Keras' ``get_config``."""
        return {"name": self.name, "reduction": self.reduction}

    @property
    def kind(self) -> int:
        return _core.LOSS_NAMES.index(self.fn)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.get_config() == self.get_config()

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self.get_config().items()))))


class _CrossEntropy(Loss):
    def __init__(
        self,
        from_logits: bool = False,
        label_smoothing: float = 0.0,
        axis: int = -1,
        reduction: str = _REDUCTION,
        name: str | None = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(name, reduction, dtype)
        if axis != -1:
            raise ValueError(f"{type(self).__name__}: only axis=-1 is supported, not {axis!r}")
        if not 0.0 <= float(label_smoothing) <= 1.0:
            raise ValueError(f"{type(self).__name__}: label_smoothing must be in [0, 1], not {label_smoothing!r}")
        self.from_logits = bool(from_logits)
        self.label_smoothing = float(label_smoothing)

    def core_args(self) -> dict:
        return {"from_logits": self.from_logits, "label_smoothing": self.label_smoothing}

    def get_config(self) -> dict:
        return {**super().get_config(), "from_logits": self.from_logits, "label_smoothing": self.label_smoothing}


class BinaryCrossentropy(_CrossEntropy):
    """Binary cross-entropy, averaged over the outputs: a sigmoid head, or logits with ``from_logits=True``.

    Targets are floats in [0, 1] of shape ``(n,)`` or ``(n, outputs)``; ``label_smoothing`` moves them
    towards 0.5. On a linear last layer without ``from_logits`` the outputs are taken as probabilities,
    clipped to ``[1e-7, 1 - 1e-7]`` as Keras does.
    """

    fn = default_name = "binary_crossentropy"


class CategoricalCrossentropy(_CrossEntropy):
    """Cross-entropy against one-hot (or soft) targets of shape ``(n, classes)``.

    Computed from the logits of a softmax head or of a linear last layer (``from_logits`` is then implied:
    a departure from Keras, which would read a linear layer's outputs as probabilities).
    """

    fn = default_name = "categorical_crossentropy"


class SparseCategoricalCrossentropy(_CrossEntropy):
    """Cross-entropy against integer labels of shape ``(n,)``, from the logits as `CategoricalCrossentropy`.

    ``label_smoothing`` is an extension: Keras' sparse loss has none; here it smooths as the categorical
    loss does. ``ignore_class`` is not supported.
    """

    fn = default_name = "sparse_categorical_crossentropy"
    sparse = True

    def __init__(
        self,
        from_logits: bool = False,
        ignore_class: int | None = None,
        reduction: str = _REDUCTION,
        name: str | None = None,
        dtype: Any = None,
        label_smoothing: float = 0.0,
    ) -> None:
        if ignore_class is not None:
            raise ValueError("SparseCategoricalCrossentropy: ignore_class is not supported")
        super().__init__(from_logits, label_smoothing, -1, reduction, name, dtype)


class MeanSquaredError(Loss):
    """Mean of ``(output - target) ** 2`` over the outputs, for regression."""

    fn = default_name = "mean_squared_error"


class MeanAbsoluteError(Loss):
    """Mean of ``|output - target|`` over the outputs."""

    fn = default_name = "mean_absolute_error"


class Huber(Loss):
    """``0.5 * e**2`` where ``|e| <= delta``, else ``delta * |e| - 0.5 * delta**2``, averaged over the outputs."""

    fn = "huber"
    default_name = "huber_loss"

    def __init__(self, delta: float = 1.0, reduction: str = _REDUCTION, name: str | None = None, dtype: Any = None):
        super().__init__(name, reduction, dtype)
        if not float(delta) > 0.0:
            raise ValueError(f"Huber: delta must be > 0, not {delta!r}")
        self.delta = float(delta)

    def core_args(self) -> dict:
        return {"delta": self.delta}

    def get_config(self) -> dict:
        return {**super().get_config(), "delta": self.delta}


class Poisson(Loss):
    """Mean of ``output - target * log(output + 1e-7)``, for counts (the output should be positive)."""

    fn = default_name = "poisson"


_BY_NAME: dict[str, type[Loss]] = {
    "binary_crossentropy": BinaryCrossentropy,
    "categorical_crossentropy": CategoricalCrossentropy,
    "sparse_categorical_crossentropy": SparseCategoricalCrossentropy,
    "mean_squared_error": MeanSquaredError,
    "mse": MeanSquaredError,
    "mean_absolute_error": MeanAbsoluteError,
    "mae": MeanAbsoluteError,
    "huber": Huber,
    "huber_loss": Huber,
    "poisson": Poisson,
}
_CLASSES = {cls.__name__: cls for cls in set(_BY_NAME.values())}


def get(identifier: str | Loss | dict) -> Loss:
    """A loss from a name (Keras' function names, ``"mse"``, ``"mae"``), a `Loss`, or a saved config.

    Raises:
        ValueError: An unknown name or argument.
    """
    if isinstance(identifier, Loss):
        return identifier
    if isinstance(identifier, dict):  # what saved models store: {"class_name": ..., "config": {...}}
        cls = _CLASSES.get(identifier.get("class_name", ""))
        if cls is None:
            raise ValueError(f"unknown loss class {identifier.get('class_name')!r}; one of {sorted(_CLASSES)}")
        return cls(**identifier.get("config", {}))
    if isinstance(identifier, str) and identifier in _BY_NAME:
        return _BY_NAME[identifier]()
    raise ValueError(f"unknown loss {identifier!r}; one of {sorted(_BY_NAME)} or a sparkgrad.nn.losses.Loss")


def serialize(loss: Loss) -> dict:
    """``{"class_name": ..., "config": ...}``, what `get` takes back."""
    return {"class_name": type(loss).__name__, "config": loss.get_config()}
