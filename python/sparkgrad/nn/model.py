"""sparkgrad.nn.Sequential: a Keras-shaped model whose network, loss and
optimizer run in C on oneDNN (csrc/nn/).

All parameters live in one contiguous float32 buffer and all gradients in
another; ``model.params`` and ``model.grads`` are NumPy views of them (no copy),
``model.param_table`` says which slice is which tensor. ``fit`` on in-memory
arrays runs its inner loop (gather batch -> forward -> backward -> update) in
C with the GIL released, returning to Python every ``log_every`` steps for the
progress bar, logging and callbacks. ``fit`` also takes an iterable of dicts of
NumPy arrays (e.g. sparkgrad.data.TFRecordDataset), one C call per batch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from sparkgrad import _core
from sparkgrad.errors import InvalidArgumentError, ModelError
from sparkgrad.nn import optimizers as _optimizers
from sparkgrad.nn.layers import Layer

LOSSES = ("sparse_categorical_crossentropy", "categorical_crossentropy")


@dataclass(frozen=True)
class ParamTensor:
    """One tensor of the flat buffer: layer index, kernel or bias, slice, shape."""

    layer: int
    is_bias: bool
    offset: int
    size: int
    shape: tuple[int, ...]


@dataclass
class History:
    """Per-epoch metrics (``history``, Keras-style) and per-log-interval step metrics (``steps``)."""

    history: dict[str, list[float]] = field(default_factory=dict)
    steps: list[dict[str, float]] = field(default_factory=list)
    epoch: list[int] = field(default_factory=list)

    def add_epoch(self, epoch: int, logs: Mapping[str, float]) -> None:
        self.epoch.append(epoch)
        for k, v in logs.items():
            self.history.setdefault(k, []).append(float(v))


def _input_shape3(shape: Sequence[int]) -> tuple[int, int, int]:
    shape = tuple(int(s) for s in shape)
    if len(shape) == 1:
        return (1, 1, shape[0])
    if len(shape) == 2:
        return (shape[0], shape[1], 1)
    if len(shape) == 3:
        return shape  # type: ignore[return-value]
    raise ValueError(f"input_shape must have 1 to 3 dimensions (H, W, C), not {shape!r}")


class Sequential:
    """A stack of layers; the first declares ``input_shape``.

    ``seed`` fixes the initial weights, dropout masks and shuffling (None:
    drawn from os.urandom).
    """

    def __init__(self, layers: Sequence[Layer], seed: int | None = None, name: str = "sequential") -> None:
        layers = list(layers)
        if not layers:
            raise ModelError("Sequential needs at least one layer")
        if layers[0].input_shape is None:
            raise ModelError("the first layer needs input_shape=, e.g. Dense(128, input_shape=(784,))")
        for i, layer in enumerate(layers[1:], 1):
            if layer.input_shape is not None:
                raise ModelError(f"layer {i} ({layer.type_name}): only the first layer takes input_shape")
        self.layers = layers
        self.name = name
        self.input_shape = tuple(layers[0].input_shape)
        self._core = _core.Model(_input_shape3(self.input_shape), [layer.spec() for layer in layers])
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little")
        self.seed = int(seed) & (2**64 - 1)
        self._core.init_params(self.seed)
        self._core.set_rng(self.seed ^ 0x5DEECE66D, 0)
        self.param_table = [ParamTensor(i, bool(b), o, s, tuple(sh)) for i, b, o, s, sh in self._core.param_table()]
        # read once: fit's prefetch thread converts batches while the C core is busy
        self._classes = int(self._core.classes)
        self.optimizer: _optimizers.Optimizer | None = None
        self.loss: str | None = None
        self.metrics: list[str] = []
        self.step = 0  # optimizer steps taken by fit
        self.epoch = 0  # epochs completed by fit
        self.stop_training = False

    # ---- parameters -------------------------------------------------------

    @property
    def params(self) -> np.ndarray:
        """The flat float32 parameter buffer (a view: writes go to the model)."""
        return self._core.params

    @property
    def grads(self) -> np.ndarray:
        """The flat float32 gradient buffer (a view), as the last pass that wrote it left it.

        compute_gradients writes it, and so do training steps with any
        optimizer except plain SGD on a model of Dense, Dropout and Flatten
        layers: that update is folded into the weight-gradient products and
        leaves this buffer untouched.
        """
        return self._core.grads

    @property
    def num_params(self) -> int:
        return int(self.params.size)

    @property
    def output_classes(self) -> int:
        return self._classes

    def get_weights(self) -> list[np.ndarray]:
        """Copies of every tensor in Keras order and layout (kernel, bias per layer)."""
        p = self.params
        return [p[t.offset : t.offset + t.size].reshape(t.shape).copy() for t in self.param_table]

    def set_weights(self, weights: Sequence[np.ndarray]) -> None:
        """Loads tensors in get_weights' order and shapes (Keras layouts)."""
        weights = list(weights)
        if len(weights) != len(self.param_table):
            raise InvalidArgumentError(f"set_weights: got {len(weights)} arrays, the model has {len(self.param_table)}")
        p = self.params
        for i, (t, w) in enumerate(zip(self.param_table, weights, strict=True)):
            w = np.asarray(w, dtype=np.float32)
            if w.shape != t.shape:
                raise InvalidArgumentError(
                    f"set_weights: array {i} has shape {w.shape}, layer {t.layer} needs {t.shape}"
                )
            p[t.offset : t.offset + t.size] = w.reshape(-1)

    def layer_weights(self, layer: int) -> list[np.ndarray]:
        """Views (no copy) of one layer's tensors."""
        p = self.params
        return [p[t.offset : t.offset + t.size].reshape(t.shape) for t in self.param_table if t.layer == layer]

    def summary(self, print_fn: Callable[[str], None] | None = print) -> str:
        """A Keras-like table of layers, output shapes and parameter counts."""
        shapes = self._core.layer_shapes()
        counts = [0] * len(self.layers)
        for t in self.param_table:
            counts[t.layer] += t.size
        rows = [("Layer (type)", "Output Shape", "Param #")]
        for i, (layer, (_, out, _pad)) in enumerate(zip(self.layers, shapes, strict=True)):
            oh, ow, oc = out
            shape = f"(None, {oc})" if oh == 1 and ow == 1 else f"(None, {oh}, {ow}, {oc})"
            name = layer.name or f"{layer.type_name.lower()}_{i}"
            rows.append((f"{name} ({layer.type_name})", shape, str(counts[i])))
        widths = [max(len(r[c]) for r in rows) + 2 for c in range(3)]
        line = "=" * sum(widths)
        text = [f'Model: "{self.name}"', line]
        for j, r in enumerate(rows):
            text.append("".join(r[c].ljust(widths[c]) for c in range(3)))
            text.append(line if j == 0 else "-" * sum(widths))
        text[-1] = line
        text.append(f"Total params: {self.num_params}")
        text.append(f"Parameter buffer: {self.num_params * 4} bytes, one contiguous float32 array")
        out = "\n".join(text)
        if print_fn is not None:
            print_fn(out)
        return out

    # ---- compile ----------------------------------------------------------

    def compile(
        self,
        optimizer: str | _optimizers.Optimizer = "sgd",
        loss: str = "sparse_categorical_crossentropy",
        metrics: Sequence[str] = ("accuracy",),
    ) -> None:
        """Chooses the optimizer (bound to the flat buffer) and the loss."""
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, not {loss!r}")
        for m in metrics:
            if m not in ("accuracy", "acc"):
                raise ValueError(f"unsupported metric {m!r}: only 'accuracy'")
        self.optimizer = _optimizers.get(optimizer)
        self.optimizer.bind(self.num_params)
        pending = getattr(self, "_pending_opt_state", None)
        if pending is not None and pending[0] == self.optimizer.kind:
            self.optimizer.set_state(pending[1], pending[2])
        self._pending_opt_state = None
        self.loss = loss
        self.metrics = list(metrics)

    # ---- data -------------------------------------------------------------

    def _x(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        x = np.ascontiguousarray(x, dtype=np.float32)
        row = int(np.prod(self.input_shape))
        if x.ndim == 0 or x.size != x.shape[0] * row:
            raise InvalidArgumentError(f"x of shape {x.shape} does not hold rows of input_shape {self.input_shape}")
        return x.reshape(x.shape[0], row)

    def _targets(self, y: np.ndarray, n: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        y = np.asarray(y)
        if y.shape[0] != n:
            raise InvalidArgumentError(f"x has {n} rows but y has {y.shape[0]}")
        k = self.output_classes
        if self.loss == "categorical_crossentropy":
            if y.ndim != 2 or y.shape[1] != k:
                raise InvalidArgumentError(
                    f"categorical_crossentropy needs one-hot y of shape ({n}, {k}), not {y.shape}"
                )
            return None, np.ascontiguousarray(y, dtype=np.float32)
        y = y.reshape(n, -1)
        if y.shape[1] != 1:
            raise InvalidArgumentError(
                f"sparse_categorical_crossentropy needs integer labels of shape ({n},), not {y.shape}"
            )
        labels = y.reshape(n)
        if not np.issubdtype(labels.dtype, np.integer):
            if not np.all(np.equal(np.mod(labels, 1), 0)):
                raise InvalidArgumentError("sparse labels must be integers")
        return np.ascontiguousarray(labels, dtype=np.int32), None

    def _require_compiled(self) -> None:
        if self.optimizer is None or self.loss is None:
            raise ModelError("call model.compile(optimizer=..., loss=...) first")

    # ---- training ---------------------------------------------------------

    def compute_gradients(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Forward + backward on one batch: fills ``model.grads`` without updating
        the parameters; returns (mean loss, accuracy). For parameter servers
        and allreduce, which apply the update themselves."""
        self._require_compiled()
        xb = self._x(x)
        labels, onehot = self._targets(y, xb.shape[0])
        loss_sum, correct, seen, _ = self._core.train_steps(None, xb, labels, onehot, None, 0, xb.shape[0], 1)
        return loss_sum / seen, correct / seen

    def apply_gradients(self, grads: np.ndarray | None = None) -> None:
        """One optimizer step from ``grads`` (default: model.grads)."""
        self._require_compiled()
        self.optimizer.apply(self.params, self.grads if grads is None else grads)
        self.step += 1

    def train_on_batch(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """One training step on one batch: (loss, accuracy)."""
        self._require_compiled()
        xb = self._x(x)
        labels, onehot = self._targets(y, xb.shape[0])
        copt = self.optimizer.bind(self.num_params)
        loss_sum, correct, seen, steps = self._core.train_steps(copt, xb, labels, onehot, None, 0, xb.shape[0], 1)
        self.step += steps
        return loss_sum / seen, correct / seen

    def fit(
        self,
        x: np.ndarray | Iterable[Mapping[str, np.ndarray]] | None = None,
        y: np.ndarray | None = None,
        batch_size: int = 32,
        epochs: int = 1,
        verbose: int = 1,
        validation_data: tuple[np.ndarray, np.ndarray] | None = None,
        max_steps: int | None = None,
        shuffle: bool = True,
        log_every: int = 50,
        callbacks: Sequence[object] = (),
        x_key: str = "image_raw",
        y_key: str = "label",
        initial_epoch: int | None = None,
        input_mapping: Mapping[str, str] | None = None,
        **options: object,
    ) -> History:
        """Trains for ``epochs`` epochs or until ``max_steps`` optimizer steps,
        whichever comes first. ``x`` is an array (with ``y``) or an iterable of
        dicts of arrays (keys ``x_key``/``y_key``, one batch per dict; re-iterated
        each epoch when it is a re-iterable); ``input_mapping`` ({"image_raw": "x",
        "label": "y"}, as TFoS' input_mapping) may name the keys instead. Arrays are
        converted to float32 as they are (scale images yourself). See
        sparkgrad.nn.training for the checkpoint, sync and plotting options, and
        sparkgrad.nn.tracking for ``mlflow=`` (MLflow tracking from the chief)."""
        from sparkgrad.nn.training import Trainer

        self._require_compiled()
        x_key, y_key = _keys(input_mapping, x_key, y_key)
        trainer = Trainer(self, verbose=verbose, log_every=log_every, callbacks=callbacks, **options)
        try:
            return trainer.run(
                x,
                y,
                batch_size=batch_size,
                epochs=epochs,
                validation_data=validation_data,
                max_steps=max_steps,
                shuffle=shuffle,
                x_key=x_key,
                y_key=y_key,
                initial_epoch=initial_epoch,
            )
        except BaseException:
            if trainer.tracker is not None:  # an MLflow run fit started ends as FAILED
                trainer.tracker.on_train_failed()
            raise

    # ---- inference --------------------------------------------------------

    def evaluate(
        self,
        x: np.ndarray | Iterable[Mapping[str, np.ndarray]],
        y: np.ndarray | None = None,
        batch_size: int = 128,
        x_key: str = "image_raw",
        y_key: str = "label",
        verbose: int = 0,
        return_dict: bool = False,
        input_mapping: Mapping[str, str] | None = None,
    ) -> list[float] | dict[str, float]:
        """[loss, accuracy] over the data in inference mode (dropout off)."""
        self._require_compiled()
        x_key, y_key = _keys(input_mapping, x_key, y_key)
        if y is None and isinstance(x, np.ndarray):
            raise InvalidArgumentError("evaluate: y is required when x is an array")
        if y is None:
            totals = np.zeros(3)
            for batch in x:
                xb, yb = _batch_arrays(batch, x_key, y_key)
                totals += self._evaluate_arrays(xb, yb, max(len(xb), 1))[:3]
            loss_sum, correct, seen = totals
        else:
            loss_sum, correct, seen, _ = self._evaluate_arrays(x, y, batch_size)
        if seen == 0:
            raise InvalidArgumentError("evaluate: no data")
        logs = {"loss": loss_sum / seen, "accuracy": correct / seen}
        if verbose:
            print(f"evaluate: loss {logs['loss']:.4f} accuracy {logs['accuracy']:.4f}")
        return logs if return_dict else [logs["loss"], logs["accuracy"]]

    def _evaluate_arrays(self, x: np.ndarray, y: np.ndarray, batch_size: int) -> tuple[float, int, int, int]:
        xb = self._x(x)
        labels, onehot = self._targets(y, xb.shape[0])
        return self._core.evaluate(xb, labels, onehot, int(batch_size))

    def predict(self, x: np.ndarray, batch_size: int = 128) -> np.ndarray:
        """[n, K]: softmax probabilities if the last layer is softmax, else its outputs (logits)."""
        return self._core.predict(self._x(x), int(batch_size))

    # ---- persistence (sparkgrad.nn.checkpoint) ----------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Writes weights, optimizer state, step and RNG state (checkpoint format)."""
        from sparkgrad.nn import checkpoint

        checkpoint.save(self, path)

    def load(self, path: str | os.PathLike) -> None:
        """Restores what save wrote; the model must have the same architecture."""
        from sparkgrad.nn import checkpoint

        checkpoint.load(self, path)

    def export_npz(self, path: str | os.PathLike) -> None:
        """Writes the weights as .npz (layer<i>_kernel / layer<i>_bias, Keras layouts)."""
        arrays = {}
        for t, w in zip(self.param_table, self.get_weights(), strict=True):
            arrays[f"layer{t.layer}_{'bias' if t.is_bias else 'kernel'}"] = w
        with open(os.fspath(path), "wb") as f:
            np.savez(f, **arrays)


def _keys(input_mapping: Mapping[str, str] | None, x_key: str, y_key: str) -> tuple[str, str]:
    """(x_key, y_key) from a TFoS-style mapping {dataset key: "x" | "y"}."""
    if input_mapping is None:
        return x_key, y_key
    roles = {role: key for key, role in input_mapping.items()}
    if set(roles) != {"x", "y"} or len(input_mapping) != 2:
        raise InvalidArgumentError(f"input_mapping must map one key to 'x' and one to 'y', not {dict(input_mapping)}")
    return roles["x"], roles["y"]


def _batch_arrays(batch: object, x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(batch, Mapping):
        missing = [k for k in (x_key, y_key) if k not in batch]
        if missing:
            raise InvalidArgumentError(f"dataset batch has keys {sorted(batch)}; missing {missing} (set x_key=/y_key=)")
        return np.asarray(batch[x_key]), np.asarray(batch[y_key])
    if isinstance(batch, tuple) and len(batch) == 2:
        return np.asarray(batch[0]), np.asarray(batch[1])
    raise InvalidArgumentError(f"dataset batches must be dicts of arrays or (x, y) pairs, not {type(batch).__name__}")


def steps_per_epoch(n: int, batch_size: int) -> int:
    return math.ceil(n / batch_size)
