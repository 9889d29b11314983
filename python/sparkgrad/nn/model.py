"""sparkgrad.nn.Model and Sequential: Keras-shaped models whose network, loss
and optimizer run in C on oneDNN (csrc/nn/). `Model(inputs, outputs)` is
Keras' functional API (several inputs and outputs, merges); `Sequential` is
the builder of a chain.

All parameters live in one contiguous float32 buffer and all gradients in
another; ``model.params`` and ``model.grads`` are NumPy views of them (no copy),
``model.param_table`` says which slice is which tensor. ``fit`` on in-memory
arrays runs its inner loop (gather batch -> forward -> backward -> update) in
C with the GIL released, returning to Python every ``log_every`` steps for the
progress bar, logging and callbacks. ``fit`` also takes an iterable of dicts of
NumPy arrays (e.g. sparkgrad.data.TFRecordDataset), one C call per batch.
Inputs go to C as they are when they are float32, uint8, int32 or int64 (ids;
labels int32 or int64); ``set_input_transform`` declares the scale and per-feature
standardisation C applies while it gathers each batch.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from sparkgrad import _core
from sparkgrad.errors import InvalidArgumentError, ModelError, SparkgradError
from sparkgrad.nn import batches as _batches
from sparkgrad.nn import checkpoint as _checkpoint
from sparkgrad.nn import graph as _graph
from sparkgrad.nn import losses as _losses
from sparkgrad.nn import metrics as _metrics
from sparkgrad.nn import optimizers as _optimizers
from sparkgrad.nn import preprocessing as _prep
from sparkgrad.nn.graph import KerasTensor
from sparkgrad.nn.history import History
from sparkgrad.nn.layers import Layer, shape3
from sparkgrad.nn.state import TrainState
from sparkgrad.nn.training import FitOptions, Trainer

__all__ = ["LOSSES", "History", "Model", "ParamTensor", "Sequential", "TrainState", "steps_per_epoch"]

LOSSES = tuple(_core.LOSS_NAMES)
"""The losses' function names (`sparkgrad.nn.losses` also takes ``"mse"`` and ``"mae"``)."""
PRECISIONS = ("fp32", "bf16")
_warned_no_bf16 = False


def _warn_no_bf16() -> None:
    """Says once per process that bf16 was asked for and fp32 runs instead."""
    global _warned_no_bf16
    if not _warned_no_bf16:
        _warned_no_bf16 = True
        warnings.warn(
            "precision='bf16': this CPU has no native bf16 (AVX512_BF16 or AMX, as oneDNN reports it, "
            "ONEDNN_MAX_CPU_ISA included); running fp32",
            RuntimeWarning,
            stacklevel=3,
        )


@dataclass(frozen=True)
class ParamTensor:
    """Where one tensor lives in the model's flat parameter buffer (an entry of ``model.param_table``), or
    in its non-trainable state buffer (an entry of ``model.buffer_table``).

    ``model.params[t.offset : t.offset + t.size].reshape(t.shape)`` is the tensor, as a view
    (``model.buffers[...]`` for a state tensor).
    """

    layer: int
    """Index of the layer in the model."""
    is_bias: bool
    """True for a tensor that starts at zero (a bias, a beta, a moving mean)."""
    offset: int
    """First element of the tensor in the flat buffer (in float32 values, not bytes)."""
    size: int
    """Number of float32 values."""
    shape: tuple[int, ...]
    """Shape in Keras's layout: Dense ``(in, units)``, Conv2D ``(kh, kw, in, filters)``, a bias ``(units,)``."""
    name: str = ""
    """Keras' variable name: ``"kernel"``, ``"bias"``, ``"gamma"``, ``"beta"``, ``"moving_mean"``,
    ``"moving_variance"``."""


def _per_output(value, names: list[str], what: str) -> list:
    """``value`` for each output: one value for all, a list in output order, or a dict by output name (a
    serialized loss or metric, ``{"class_name": ..., "config": ...}``, is one value)."""
    if isinstance(value, Mapping) and "class_name" not in value:
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise ValueError(f"{what} names unknown outputs {unknown}; the outputs are {names}")
        missing = [n for n in names if n not in value]
        if missing and what == "loss":
            raise ValueError(f"loss gives no loss for outputs {missing} (the outputs are {names})")
        return [value.get(n) for n in names]
    if isinstance(value, (list, tuple)) and len(names) == 1 and len(value) == 1 and what != "metrics":
        return list(value)  # Keras' list of one, for one output
    if isinstance(value, (list, tuple)) and len(names) > 1:
        if len(value) != len(names):
            raise ValueError(f"{what} has {len(value)} entries, the model has {len(names)} outputs {names}")
        return list(value)
    return [value] * len(names)


class Model:
    """A Keras-shaped model whose forward pass, loss, backward pass and optimizer run in C on oneDNN.

    Built with Keras' functional API, from `Input` tensors and layers called on them, or as a
    `Sequential` chain. All parameters live in one contiguous float32 buffer (``params``) and all
    gradients in another (``grads``); ``param_table`` says which slice is which tensor. Build it,
    `compile` it, then `fit`, `evaluate` and `predict`:

    ```python
    import numpy as np
    from sparkgrad.nn import Concatenate, Dense, Input, Model

    wide = Input(shape=(4,), name="wide")
    deep = Input(shape=(12,), name="deep")
    h = Dense(16, activation="relu")(deep)
    out = Dense(1, activation="sigmoid", name="click")(Concatenate()([wide, h]))
    model = Model([wide, deep], out, seed=0)
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["auc"])
    rng = np.random.default_rng(0)
    xw, xd = rng.normal(size=(256, 4)), rng.normal(size=(256, 12))
    y = (xw[:, 0] + xd[:, 0] > 0).astype(np.float32)
    model.fit({"wide": xw, "deep": xd}, y, batch_size=32, epochs=2, verbose=0)
    ```

    Args:
        inputs: An `Input` tensor, or a list (or dict) of them: the model's inputs, in the order `fit`
            takes a list of arrays.
        outputs: A layer's output tensor, or a list (or dict) of them: its names are the dict's keys, else
            its layers' names. An output must be flat (``[n, K]``);
            a `Dense` output with softmax or sigmoid that no other layer reads is a head the loss applies
            (see `sparkgrad.nn.losses`).
        name: The model's name, printed by `summary`.
        seed: Fixes the initial weights, the dropout masks and the shuffling (None: drawn from
            ``os.urandom``). Our extension.

    Attributes:
        layers (list[Layer]): The layers, in the order they were called (the graph's topological order); a
            layer called on several tensors (a shared layer: one set of weights, their gradients summed)
            is listed at each call.
        inputs (list[KerasTensor]): The input tensors; ``input_names`` their names.
        outputs (list[KerasTensor]): The output tensors; ``output_names`` their layers' names.
        input_shape (tuple[int, ...] | list[tuple[int, ...]]): The per-sample input shape, or a list of them
            with several inputs.
        seed (int): The seed in use (64 bits).
        param_table (list[ParamTensor]): Where each kernel and bias lives in ``params``, in Keras order.
        optimizer (Optimizer | None): The optimizer `compile` chose (None before).
        loss (str | list[str] | None): The function name of the loss `compile` chose (None before), e.g.
            ``"binary_crossentropy"`` (a list, one per output, with several outputs); ``loss_object`` is the
            `sparkgrad.nn.losses.Loss` itself (a list likewise).
        metrics (list[Metric]): The metrics `compile` chose (`sparkgrad.nn.metrics`), every output's; their
            keys in the logs are ``metrics_names[1:]``.
        state (TrainState): The live training state (step, epoch, position in the epoch).
        stop_training (bool): Set it to True (from a callback) to stop fit after the current log interval.
        epoch_sums (dict[str, tuple[float, int, np.ndarray]]): At an epoch's end, before the callbacks: the
            epoch's ``(weighted loss sum, rows, metric state)`` by log prefix (``""``, and ``"val_"`` with
            validation data). They add up across workers, so a callback can pool them exactly
            (`metric_values` of the summed state); ``hvd.callbacks.MetricAverageCallback`` does.

    Raises:
        ModelError: Inputs that are not `Input` tensors, outputs that do not depend on the inputs (the Input
            is named), an input the outputs do not use, or layers that do not fit together (the message
            names the layer and the shapes; a shared layer's calls must give its weights one shape).
    """

    def __init__(self, inputs, outputs, name: str = "functional", seed: int | None = None) -> None:
        g = _graph.collect(inputs, outputs)
        self._build(g, name, seed)

    def _build(self, g: _graph.Graph, name: str, seed: int | None) -> None:
        g, self._chains = _prep.split_graph(g)
        self._prep_cache: tuple = ((), None)
        for t, chain in zip(g.inputs, self._chains, strict=True):
            if chain is None and t.dtype == "string":
                raise ModelError(
                    f"Input {t.name!r} has dtype 'string': put a StringLookup or Hashing layer on it (strings are "
                    "mapped to ids in the batch gather)"
                )
        self.layers = list(g.layers)
        self.name = name
        self.inputs = list(g.inputs)
        self.outputs = list(g.output_tensors)
        self.input_names = [t.name for t in self.inputs]
        if len(set(self.input_names)) != len(self.input_names):
            raise ModelError(f"the model's inputs must have distinct names, not {self.input_names}")
        self._reads = [list(r) for r in g.reads]
        self._shares = list(g.shares) or [-1] * len(g.layers)
        shapes = [t.shape[1:] for t in self.inputs]
        self.input_shape = tuple(shapes[0]) if len(shapes) == 1 else [tuple(s) for s in shapes]
        nin = len(self.inputs)
        self.layer_names = _layer_names(self.layers)
        self.output_names = g.output_keys or [self.layer_names[t - nin] for t in g.outputs]
        if len(set(self.output_names)) != len(self.output_names):
            raise ModelError(f"the model's outputs must come from layers of distinct names, not {self.output_names}")
        self._outputs_as_dict = g.output_keys is not None
        specs = []
        for layer, reads, shares in zip(self.layers, g.reads, self._shares, strict=True):
            spec = dict(layer.spec())
            spec["inputs"] = reads
            if shares >= 0:
                spec["shares"] = shares
            specs.append(spec)
        core_shapes = [
            shape3((s or (1,)) if chain is None else _prep.chain_shape(chain, tuple(s)))
            for s, chain in zip(shapes, self._chains, strict=True)
        ]
        self._core_shapes = core_shapes
        try:
            self._core = _core.Model(core_shapes, specs, g.outputs)
        except ModelError as e:
            if self.is_chain:
                raise
            raise ModelError(self._named(str(e))) from None
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little")
        self.seed = int(seed) & (2**64 - 1)
        self._core.init_params(self.seed)
        self._core.set_rng(self.seed ^ 0x5DEECE66D, 0)
        self.param_table = [
            ParamTensor(i, bool(b), o, s, tuple(sh), n) for i, b, o, s, sh, n in self._core.param_table()
        ]
        self.buffer_table = [
            ParamTensor(i, bool(b), o, s, tuple(sh), n) for i, b, o, s, sh, n in self._core.state_table()
        ]
        # Keras' weight order: each layer's trainable tensors, then its non-trainable ones
        self._weight_order = sorted(
            [(t.layer, 0, k, t) for k, t in enumerate(self.param_table)]
            + [(t.layer, 1, k, t) for k, t in enumerate(self.buffer_table)],
            key=lambda e: e[:3],
        )
        # read once: fit's prefetch thread converts batches while the C core is busy
        self._outputs_core = [(int(t), int(k), str(h)) for t, k, h in self._core.outputs]
        self._classes = self._outputs_core[0][1]
        self.optimizer: _optimizers.Optimizer | None = None
        self.loss: str | list[str] | None = None
        self.loss_object: _losses.Loss | list[_losses.Loss] | None = None
        self.metrics: list[_metrics.Metric] = []
        self._metric_groups: list[list[_metrics.Metric]] = [[] for _ in self.outputs]
        self._metric_group_sizes = [0] * len(self.outputs)
        self.state = TrainState()  # step, epoch, position in the epoch (see sparkgrad.nn.state)
        self.input_transform: tuple[float | None, np.ndarray | None, np.ndarray | None] = (None, None, None)
        self.stop_training = False
        # the last epoch's sums by log prefix ("" training, "val_" validation): (loss_sum, seen, metric
        # state), which add up across ranks (hvd.callbacks.MetricAverageCallback pools them)
        self.epoch_sums: dict[str, tuple[float, int, np.ndarray]] = {}

    def _named(self, message: str) -> str:
        """A C message about a graph with its layers and tensors named: "layer 3 'add' (Add)", "('b')"."""
        tensors = self.input_names + self.layer_names
        message = re.sub(
            r"\blayer (\d+)(?= \(| shares|:)",
            lambda m: f"layer {m[1]} {self.layer_names[int(m[1])]!r}" if int(m[1]) < len(self.layer_names) else m[0],
            message,
        )
        return re.sub(
            r"\(tensor (\d+)\)",
            lambda m: f"({tensors[int(m[1])]!r})" if int(m[1]) < len(tensors) else m[0],
            message,
        )

    def _with_names(self, e: SparkgradError) -> SparkgradError:
        """A C error of a run with the layers and tensors of its message named (an Embedding's bad id)."""
        named = self._named(str(e))
        if named == str(e):
            return e
        return type(e)(named, **e.details)

    def get_layer(self, name: str | None = None, index: int | None = None) -> Layer:
        """A layer by its name (``"dense_1"``, or the ``name=`` it was given) or by its index in ``layers``,
        as Keras' ``Model.get_layer``.

        Raises:
            ValueError: Neither or both given, or no such layer (the message lists the names).
        """
        if (name is None) == (index is None):
            raise ValueError("get_layer: give a name or an index")
        if index is not None:
            if not -len(self.layers) <= index < len(self.layers):
                raise ValueError(f"get_layer: index {index} is outside the model's {len(self.layers)} layers")
            return self.layers[index]
        for layer, layer_name in zip(self.layers, self.layer_names, strict=True):
            if layer_name == name:
                return layer
        raise ValueError(f"get_layer: no layer named {name!r}; the layers are {sorted(set(self.layer_names))}")

    @property
    def is_chain(self) -> bool:
        """True when every layer reads the one before it (a `Sequential`'s shape)."""
        return len(self.inputs) == 1 and all(r == [k] for k, r in enumerate(self._reads))

    # ---- training state ---------------------------------------------------

    @property
    def step(self) -> int:
        """Optimizer steps taken by fit (under a parameter server: the global step)."""
        return self.state.step

    @step.setter
    def step(self, value: int) -> None:
        self.state.step = int(value)

    @property
    def epoch(self) -> int:
        """Epochs completed by fit."""
        return self.state.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.state.epoch = int(value)

    @property
    def rng(self) -> tuple[int, int]:
        """The model RNG (dropout masks, shuffling) as (seed, counter)."""
        return self._core.get_rng()

    @rng.setter
    def rng(self, value: tuple[int, int]) -> None:
        self._core.set_rng(int(value[0]), int(value[1]))

    def permutation(self, n: int) -> np.ndarray:
        """A permutation of ``range(n)`` (int64) drawn from the model RNG, as fit shuffles an epoch."""
        return self._core.shuffle(int(n))

    def train_state(self) -> TrainState:
        """A complete snapshot: the live state plus the RNG and the optimizer's state."""
        s = self.state.copy()
        s.rng = self.rng
        if self.optimizer is not None:
            s.optimizer_kind = self.optimizer.kind
            s.optimizer_steps, s.optimizer_slots = self.optimizer.get_state()
        return s

    def restore_train_state(self, s: TrainState) -> None:
        """Puts a snapshot from `train_state` back, whole.

        The optimizer state goes to the optimizer if the model is compiled, else it waits for `compile`
        (with an optimizer of the same kind).

        Raises:
            ModelError: The snapshot holds the state of another kind of optimizer than the model's.
        """
        opt = self.optimizer
        if opt is not None and (s.optimizer_kind or s.optimizer_slots.size):
            if opt.kind != s.optimizer_kind:
                raise ModelError(f"the state holds {s.optimizer_kind!r} optimizer state, the model uses {opt.kind!r}")
            opt.bind(self.num_params)
            opt.set_state(s.optimizer_steps, s.optimizer_slots)
        self.state = s.copy()
        self.rng = s.rng

    # ---- inputs -------------------------------------------------------------

    def set_input_transform(
        self, scale: float | None = None, mean: np.ndarray | None = None, std: np.ndarray | None = None
    ) -> None:
        """Declares what C applies to every input value as it gathers a batch in fit, evaluate and predict.

        Each value becomes ``(x * scale - mean[j]) / std[j]``, ``j`` its feature in the flattened input.
        Inputs then travel as they are, e.g. uint8 images with ``scale=1/255``, with no float copy in
        Python. Called with no arguments it removes the transform (uint8 inputs are then taken
        unscaled). Checkpoints do not save it (it is part of the model's definition); `save_model` does.

        Args:
            scale: Factor applied first; None is 1.
            mean: Per-feature means, one float per feature of the flattened input; None is 0.
            std: Per-feature standard deviations, nonzero; None is 1.

        Raises:
            InvalidArgumentError: ``mean`` or ``std`` has the wrong number of values, or ``std`` has zeros.
        """
        if len(self.inputs) > 1:
            raise ModelError("set_input_transform applies to a one-input model; scale the arrays of several inputs")
        if self._chains[0] is not None and (scale is not None or mean is not None or std is not None):
            raise ModelError("set_input_transform: the input has preprocessing layers, which map its values")
        row = int(np.prod(self.input_shape))

        def per_feature(a: np.ndarray | None, name: str) -> np.ndarray | None:
            if a is None:
                return None
            a = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
            if a.size != row:
                raise InvalidArgumentError(f"input {name} has {a.size} values; the input has {row} features")
            return a

        std_a = per_feature(std, "std")
        if std_a is not None and not np.all(std_a != 0):
            raise InvalidArgumentError("input std has zeros (use 1 for features that never vary)")
        self.input_transform = (None if scale is None else float(scale), per_feature(mean, "mean"), std_a)

    def _transform_kw(self) -> dict:
        scale, mean, std = self.input_transform
        kw: dict = {"mean": mean, "std": std}
        if scale is not None:
            kw["scale"] = scale
        preps = self.preprocessing_chains()
        if preps is not None:
            kw["preps"] = preps
        return kw

    @property
    def preprocessing(self) -> list[list[Layer] | None]:
        """Each input's preprocessing layers (`sparkgrad.nn.preprocessing`), run in C as batches are
        gathered, or None for an input without."""
        return [None if c is None else list(c) for c in self._chains]

    def preprocessing_state(self) -> list[list[dict] | None]:
        """The vocabularies and statistics of each input's preprocessing layers, as JSON values (None: an
        input without), what checkpoints and `save_model` keep."""
        return [None if c is None else [layer._state_config() for layer in c] for c in self._chains]

    def set_preprocessing_state(self, state: list, source: str = "preprocessing state") -> None:
        """Puts a `preprocessing_state` back into the layers.

        Raises:
            ModelError: It does not describe this model's chains (``source`` is named).
        """
        if len(state) != len(self._chains) or any(
            (c is None) != (v is None) or (c is not None and len(c) != len(v))
            for c, v in zip(self._chains, state, strict=True)
        ):
            raise ModelError(f"{source}: does not fit this model's preprocessing layers")
        for chain, values in zip(self._chains, state, strict=True):
            for layer, v in zip(chain or [], values or [], strict=True):
                layer._load_state(v)

    def preprocessing_chains(self) -> list | None:
        """The C chains (``_core.Prep``, one per input or None) of the inputs' preprocessing layers, built
        again when a layer's vocabulary or statistics changed (``adapt`` after the model was built).

        Raises:
            ModelError: A layer without its vocabulary or statistics, or one whose output's width no
                longer matches what the model was built for (the layer and both widths are named).
        """
        if not any(c is not None for c in self._chains):
            return None
        key = tuple(() if c is None else _prep.chain_version(c) for c in self._chains)
        if self._prep_cache[0] == key:
            return self._prep_cache[1]
        preps = []
        for i, (t, chain) in enumerate(zip(self.inputs, self._chains, strict=True)):
            if chain is None:
                preps.append(None)
                continue
            shape = tuple(t.shape[1:])
            desc = _prep.chain_desc(chain, shape, t.dtype == "string")
            p = _core.Prep(desc)
            want = int(np.prod(self._core_shapes[i]))
            if p.out_row != want:
                raise ModelError(
                    f"{desc['map_layer']} on input {t.name!r} now gives {p.out_row} values per row; the model was "
                    f"built for {want} (a vocabulary's size changed after the model was built)"
                )
            preps.append(p)
        self._prep_cache = (key, preps)
        return preps

    # ---- parameters -------------------------------------------------------

    @property
    def params(self) -> np.ndarray:
        """The flat float32 parameter buffer (a view: writes go to the model)."""
        return self._core.params

    @property
    def grads(self) -> np.ndarray:
        """The flat float32 gradient buffer (a view), as the last pass that wrote it left it.

        compute_gradients writes it, and so do training steps with any
        optimizer except plain SGD on a model of Dense, Embedding, merge,
        Dropout and Flatten layers in fp32: that update is folded into the
        weight-gradient products and leaves this buffer untouched. An
        Embedding table's range holds the rows the last pass touched
        (`touched_rows`) and zeros elsewhere.
        """
        return self._core.grads

    def touched_rows(self) -> list[tuple[int, int, int, np.ndarray]]:
        """Per `Embedding` table (a shared layer's once), ``(offset, rows, dim, ids)``: where its
        ``[rows, dim]`` table starts in ``params`` and the rows the last backward pass touched (int32,
        sorted, unique; a copy). The table's range of ``grads`` is zero outside them, so
        ``optimizer.apply(params, grads, rows=model.touched_rows())`` updates only those rows."""
        return self._core.touched_rows()

    @property
    def num_params(self) -> int:
        """The number of parameters (float32 values in ``params``)."""
        return int(self.params.size)

    @property
    def buffers(self) -> np.ndarray:
        """The flat float32 non-trainable state buffer (a view: writes go to the model): BatchNormalization's
        moving statistics, laid out by ``buffer_table``. Training steps update it in place; no gradient or
        optimizer touches it. Empty for a model without such layers."""
        return self._core.state

    def _buffer_view(self, t: ParamTensor, is_state: int) -> np.ndarray:
        flat = self.buffers if is_state else self.params
        return flat[t.offset : t.offset + t.size].reshape(t.shape)

    def tensor_sizes(self) -> list[int]:
        """The sizes of the tensors in ``params``, in order (``param_table``): what ``clipnorm`` clips each of."""
        return [t.size for t in self.param_table] or [self.num_params]

    @property
    def output_classes(self) -> int:
        """The width of the (first) output: the classes of a cross-entropy."""
        return self._classes

    @property
    def head(self) -> str:
        """``"softmax"``, ``"sigmoid"`` (the output Dense layer's activation, which the loss applies) or
        ``"linear"``; the first output's with several."""
        return self._core.head

    @property
    def metrics_names(self) -> list[str]:
        """``["loss", *metric names]``: the keys of `evaluate`'s results, in order (Keras' name). With
        several outputs: ``["loss", "<output>_loss", ..., "<output>_<metric>", ...]``."""
        return ["loss", *self._value_keys()]

    def _value_keys(self) -> list[str]:
        if len(self.outputs) == 1:
            return [m.name for m in self.metrics]
        keys = [f"{o}_loss" for o in self.output_names]
        for o, group in zip(self.output_names, self._metric_groups, strict=True):
            keys += [f"{o}_{m.name}" for m in group]
        return keys

    def metric_values(self, state: np.ndarray, seen: int = 0) -> dict[str, float]:
        """The metrics' values from a (summed) state array, by name; computed in C. With several outputs
        the state ends with each output's loss sum, reported as ``<output>_loss`` over ``seen`` rows."""
        if len(self.outputs) == 1:
            return _metrics.results(self.metrics, state)
        state = np.asarray(state, np.float64)
        n = len(self.outputs)
        tail = state[state.size - n :]
        out = {f"{o}_loss": float(v) / seen if seen else math.nan for o, v in zip(self.output_names, tail, strict=True)}
        at = 0
        for o, group, size in zip(self.output_names, self._metric_groups, self._metric_group_sizes, strict=True):
            out.update({f"{o}_{k}": v for k, v in _metrics.results(group, state[at : at + size]).items()})
            at += size
        return out

    def new_metric_state(self) -> np.ndarray:
        """A zeroed float64 state for the compiled metrics (the C passes add to it; states add up)."""
        return _metrics.new_state(self._core)

    def get_weights(self) -> list[np.ndarray]:
        """Copies of every tensor in Keras order and layout: each layer's trainable tensors (kernel, then bias;
        gamma, then beta), then its non-trainable ones (moving_mean, then moving_variance)."""
        return [self._buffer_view(t, b).copy() for _, b, _, t in self._weight_order]

    def set_weights(self, weights: Sequence[np.ndarray]) -> None:
        """Loads tensors in `get_weights`'s order and shapes (Keras layouts, so a Keras model's weights fit).

        Raises:
            InvalidArgumentError: The number of arrays or a shape differs from the model's.
        """
        weights = list(weights)
        if len(weights) != len(self._weight_order):
            raise InvalidArgumentError(
                f"set_weights: got {len(weights)} arrays, the model has {len(self._weight_order)}"
            )
        arrays = [np.asarray(w, dtype=np.float32) for w in weights]
        for i, ((_, _, _, t), w) in enumerate(zip(self._weight_order, arrays, strict=True)):
            if w.shape != t.shape:
                raise InvalidArgumentError(
                    f"set_weights: array {i} has shape {w.shape}, layer {t.layer} {self.layer_names[t.layer]!r} "
                    f"needs {t.shape} (its {t.name})"
                )
        for (_, b, _, t), w in zip(self._weight_order, arrays, strict=True):
            self._buffer_view(t, b)[...] = w

    def layer_weights(self, layer: int) -> list[np.ndarray]:
        """Views (no copy: writes change the model) of one layer's tensors, in `get_weights`' order.

        Args:
            layer: The layer's index (an empty list for a layer without parameters).
        """
        return [self._buffer_view(t, b) for lay, b, _, t in self._weight_order if lay == layer]

    def summary(self, print_fn: Callable[[str], None] | None = print) -> str:
        """A Keras-like table of the layers, their output shapes and parameter counts.

        Args:
            print_fn: Called with the table; None prints nothing.

        Returns:
            The table as text.
        """
        shapes = self._core.layer_shapes()
        counts = [0] * len(self.layers)
        for _, _, _, t in self._weight_order:
            counts[t.layer] += t.size
        chain = self.is_chain
        names = self.layer_names
        # an input with preprocessing reaches the layers as its chain's last output
        ends = [
            n if c is None else (c[-1].name or type(c[-1]).__name__.lower())
            for n, c in zip(self.input_names, self._chains, strict=True)
        ]
        tensor_names = ends + names
        rows = [("Layer (type)", "Output Shape", "Param #") + (() if chain else ("Connected to",))]
        if not chain:
            for t in self.inputs:
                shape = "".join(f", {d}" for d in t.shape[1:])  # "(None)" for one value per sample, as Keras 3
                rows.append((f"{t.name} (InputLayer)", f"(None{shape})", "0", "-"))
        for t, layers in zip(self.inputs, self._chains, strict=True):  # run in the gather, before the layers
            shape, source = tuple(t.shape[1:]), t.name
            for layer in layers or []:
                shape = _prep.chain_shape([layer], shape)
                name = layer.name or type(layer).__name__.lower()
                row = (f"{name} ({layer.type_name})", f"(None{''.join(f', {d}' for d in shape)})", "0")
                rows.append(row if chain else (*row, source))
                source = name
        for i, (layer, (_, out, _pad)) in enumerate(zip(self.layers, shapes, strict=True)):
            oh, ow, oc = out
            shape = (
                f"(None, {oc})"
                if oh == 1 and ow == 1
                else f"(None, {ow}, {oc})"
                if oh == 1
                else f"(None, {oh}, {ow}, {oc})"
            )
            row = (f"{names[i]} ({layer.type_name})", shape, str(counts[i]))
            if not chain:
                row += (", ".join(tensor_names[r] for r in self._reads[i]),)
            rows.append(row)
        cols = len(rows[0])
        widths = [max(len(r[c]) for r in rows) + 2 for c in range(cols)]
        line = "=" * sum(widths)
        text = [f'Model: "{self.name}"', line]
        for j, r in enumerate(rows):
            text.append("".join(r[c].ljust(widths[c]) for c in range(cols)))
            text.append(line if j == 0 else "-" * sum(widths))
        text[-1] = line
        nstate = int(self.buffers.size)
        text.append(f"Total params: {self.num_params + nstate}")
        if nstate:
            text.append(f"Trainable params: {self.num_params}")
            text.append(f"Non-trainable params: {nstate}")
        text.append(f"Parameter buffer: {self.num_params * 4} bytes, one contiguous float32 array")
        out = "\n".join(text)
        if print_fn is not None:
            print_fn(out)
        return out

    # ---- compile ----------------------------------------------------------

    def compile(
        self,
        optimizer: str | _optimizers.Optimizer = "sgd",
        loss: str | _losses.Loss | Sequence | Mapping = "sparse_categorical_crossentropy",
        metrics: Sequence[str | _metrics.Metric] | Mapping | None = None,
        loss_weights: Sequence[float] | Mapping[str, float] | None = None,
        precision: str = "fp32",
    ) -> None:
        """Chooses the optimizer (bound to the flat buffer), the loss, the metrics and the layers' precision.

        An optimizer state restored before compile (`load`, then compile) goes to the optimizer.

        Args:
            optimizer: An optimizer (`SGD`, `Adam`, ..., a `DistributedOptimizer`) or a name (``"sgd"``,
                ``"adam"``, ``"adamw"``, ``"rmsprop"``, ``"adadelta"``, ``"adagrad"``) with Keras's defaults.
            loss: A name or a `sparkgrad.nn.losses.Loss`: ``"sparse_categorical_crossentropy"`` (integer
                labels), ``"categorical_crossentropy"`` (one-hot targets), ``"binary_crossentropy"`` (targets
                in [0, 1]; a sigmoid head or ``BinaryCrossentropy(from_logits=True)``),
                ``"mean_squared_error"``/``"mse"``, ``"mean_absolute_error"``/``"mae"``, ``"huber"``,
                ``"poisson"``. The cross-entropies work on the logits of a linear last layer or of a softmax
                head. With several outputs: one loss for all, a list in output order, or a dict by output
                name (Keras' forms); the training loss is the sum of each output's, times its loss weight.
            metrics: Names or `sparkgrad.nn.metrics.Metric` objects: ``"accuracy"`` (binary, sparse or
                categorical by the loss and the outputs, as Keras resolves it), ``"binary_accuracy"``,
                ``"categorical_accuracy"``, ``"sparse_categorical_accuracy"``, ``"auc"``, ``"precision"``,
                ``"recall"``, ``"mse"``, ``"mae"``, ``"rmse"``. None (the default): ``["accuracy"]`` for the
                cross-entropies, none for the other losses. With several outputs: a list of lists in output
                order or a dict by output name (a flat list applies to every output); their keys in the
                logs are ``<output>_<metric>``.
            loss_weights: Each output's weight in the training loss: a list in output order or a dict by
                output name (default 1 each).
            precision: ``"fp32"``, or ``"bf16"``: the Dense and Conv2D primitives take bf16 copies of the
                activations, of the weights (converted from the float32 parameters once per step) and of
                the output gradients, and accumulate in float32; parameters, gradients, optimizer state,
                loss, pooling, dropout and checkpoints stay float32. Where the CPU has no native bf16
                (AVX512_BF16 or AMX, as oneDNN sees it) the model warns once and runs float32; `precision`
                says which is in use.

        Raises:
            ValueError: An unknown loss, metric, precision or optimizer name or argument.
            ModelError: The loss or a metric does not fit the model's output (a sigmoid head with a sparse
                cross-entropy, one output with a categorical loss...): the message names both.
        """
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
        names = self.output_names
        loss_objs = [_losses.get(v) for v in _per_output(loss, names, "loss")]
        weights = [1.0 if w is None else float(w) for w in _per_output(loss_weights, names, "loss_weights")]
        for name, w in zip(names, weights, strict=True):
            if not (w >= 0.0 and math.isfinite(w)):
                raise ValueError(f"loss_weights: output {name!r} has weight {w!r}; weights are finite and >= 0")
        if isinstance(metrics, Mapping) or (
            len(names) > 1 and isinstance(metrics, (list, tuple)) and metrics and isinstance(metrics[0], (list, tuple))
        ):
            per_metrics = _per_output(metrics, names, "metrics")
        else:
            per_metrics = [metrics] * len(names)
        groups = [
            _metrics.resolve(m, lo, k)
            for m, lo, (_, k, _h) in zip(per_metrics, loss_objs, self._outputs_core, strict=True)
        ]
        optimizer_obj = _optimizers.get(optimizer)
        for j, (lo, w) in enumerate(zip(loss_objs, weights, strict=True)):
            try:
                self._core.set_metrics([], output=j)
                self._core.set_loss(lo.kind, output=j, weight=w, **lo.core_args())
                self._core.set_metrics([m.spec() for m in groups[j]], output=j)
            except ModelError as e:
                if len(names) == 1:
                    raise
                raise ModelError(str(e).replace(f"output {j}: ", f"output {j} {names[j]!r}: ", 1)) from None
        self.optimizer = optimizer_obj
        self.optimizer.bind(self.num_params, self.tensor_sizes())
        s = self.state  # optimizer state restored before compile (load, then compile)
        if s.optimizer_kind == self.optimizer.kind and (s.optimizer_steps or s.optimizer_slots.size):
            self.optimizer.set_state(s.optimizer_steps, s.optimizer_slots)
        one = len(names) == 1
        self.loss = loss_objs[0].fn if one else [lo.fn for lo in loss_objs]
        self.loss_object = loss_objs[0] if one else loss_objs
        self.loss_weights = weights
        self._metric_groups = groups
        self._metric_group_sizes = [_metrics.state_size(g) for g in groups]  # the state's layout, once
        self.metrics = [m for g in groups for m in g]
        used = self._core.set_precision(precision)
        if used != precision:
            _warn_no_bf16()

    @property
    def precision(self) -> str:
        """``"fp32"`` or ``"bf16"``: the precision the Dense and Conv2D layers run in."""
        return self._core.precision

    # ---- data -------------------------------------------------------------

    def _arrays_by_name(self, v: object, names: list[str], what: str) -> list:
        """``v`` as one entry per input (or output): a dict by name, a list in order, or the one array."""
        if isinstance(v, Mapping):
            missing = [n for n in names if n not in v]
            unknown = sorted(set(v) - set(names))
            if missing or unknown:
                raise InvalidArgumentError(
                    f"{what} is a dict with keys {sorted(v)}; the model's {what == 'x' and 'inputs' or 'outputs'} are "
                    f"{names}" + (f" (missing {missing})" if missing else f" (unknown {unknown})")
                )
            return [v[n] for n in names]
        if len(names) == 1:
            return [v]
        if not isinstance(v, (list, tuple)) or len(v) != len(names):
            kind = "inputs" if what == "x" else "outputs"
            raise InvalidArgumentError(
                f"the model has {len(names)} {kind} {names}: give {what} as a list of {len(names)} arrays in that "
                f"order or a dict by name, not {type(v).__name__}"
                + (f" of {len(v)}" if isinstance(v, (list, tuple)) else "")
            )
        return list(v)

    def input_arrays(self, x: object) -> np.ndarray | list[np.ndarray]:
        """x as the C engine takes it: ``[n, features]`` float32, uint8, int32 or int64 rows (a list, one per
        input, with several inputs), from an array, a list in input order or a dict by input name.

        Raises:
            InvalidArgumentError: A missing or unknown input name, a wrong number of arrays, rows that do not
                match an input's shape, or inputs with different numbers of rows.
        """
        xs = [
            _batches.inputs(a, t.shape[1:], t.name)
            if chain is None
            else _prep.raw_column(chain, a, t.name, tuple(t.shape[1:]))
            for a, t, chain in zip(
                self._arrays_by_name(x, self.input_names, "x"), self.inputs, self._chains, strict=True
            )
        ]
        for name, a in zip(self.input_names[1:], xs[1:], strict=True):
            if a.shape[0] != xs[0].shape[0]:
                raise InvalidArgumentError(
                    f"input {name!r} has {a.shape[0]} rows, input {self.input_names[0]!r} {xs[0].shape[0]}"
                )
        return xs[0] if len(xs) == 1 else xs

    def engine_arrays(
        self, x: object, y: object, sample_weight: object = None, class_weight: Mapping[int, float] | None = None
    ) -> tuple[np.ndarray | list[np.ndarray], np.ndarray | list[np.ndarray], np.ndarray | None]:
        """``(x, y, weights)`` as the C engine takes them.

        x as `input_arrays` gives it; y per output: int32/int64 labels (a sparse loss) or float32 targets
        ``[n, outputs]`` (the other losses), a list with several outputs; float32 row weights
        (``sample_weight`` times ``class_weight`` of each row's class, of the first output) or None.

        Raises:
            InvalidArgumentError: x's rows do not match the inputs, y does not match x or the loss (or the
                outputs' names), or the weights do not match the rows.
        """
        xs = self.input_arrays(x)
        n = (xs[0] if isinstance(xs, list) else xs).shape[0]
        losses = self.loss_object if isinstance(self.loss_object, list) else [self.loss_object or self.loss]
        ys, first = [], None
        for yv, (_, k, _h), lo in zip(
            self._arrays_by_name(y, self.output_names, "y"), self._outputs_core, losses, strict=True
        ):
            labels, targets = _batches.targets(yv, n, k, lo)
            ys.append(labels if labels is not None else targets)
            first = first or (labels, targets)
        w = _batches.weights(sample_weight, class_weight, n, *first)
        return xs, ys[0] if len(ys) == 1 else ys, w

    def _require_compiled(self) -> None:
        if self.optimizer is None or self.loss is None:
            raise ModelError("call model.compile(optimizer=..., loss=...) first")

    # ---- training ---------------------------------------------------------

    def run_steps(
        self,
        x: np.ndarray | list[np.ndarray],
        y: np.ndarray | list[np.ndarray],
        order: np.ndarray | None = None,
        start: int = 0,
        batch_size: int | None = None,
        nsteps: int = 1,
        update: bool = True,
        hook: object = None,
        weights: np.ndarray | None = None,
        metrics: np.ndarray | None = None,
    ) -> tuple[float, int, int]:
        """Up to ``nsteps`` training steps in one call of the C loop.

        The one call that fit, `train_on_batch` and `compute_gradients` share.

        Args:
            x: Inputs as `engine_arrays` returns them.
            y: Targets as `engine_arrays` returns them: integer labels or float targets per output.
            order: Row order (int64 indices); None is ``0, 1, ...``.
            start: First position in ``order`` (or first row).
            batch_size: Rows per step; None is every row.
            nsteps: Maximum number of steps.
            update: Apply the optimizer (False: gradients only).
            hook: A gradient-hook capsule (`DistributedOptimizer.grad_hook`, a ps client's) the loop calls
                between backward and update.
            weights: Per-row sample weights (float32), or None.
            metrics: The metrics' state array (`new_metric_state`) the steps add to, or None.

        Returns:
            ``(loss_sum, seen, steps)``: the weighted loss summed over the ``seen`` rows, and the steps
            taken. ``state.step`` advances (under a ps hook, to the global step).

        Raises:
            NonFiniteLossError: A batch's loss was NaN or infinite (nothing of it was applied).
            SparkgradError: Any error of the loop carries ``step``, ``steps``, ``seen`` and ``loss_sum`` of the
                good steps before it, which were applied (``state.step`` follows them).
        """
        copt = self.optimizer.bind(self.num_params, self.tensor_sizes()) if update else None
        batch = int(batch_size or max((x[0] if isinstance(x, list) else x).shape[0], 1))
        try:
            r = self._core.train_steps(
                copt,
                x,
                y,
                order,
                int(start),
                batch,
                int(nsteps),
                hook=hook,
                step=self.state.step,
                weights=weights,
                metrics=metrics,
                **self._transform_kw(),
            )
        except SparkgradError as e:  # the good steps before the failing one were applied
            if (update or hook is not None) and isinstance(getattr(e, "step", None), int):
                self.state.step = int(e.step)
            named = self._with_names(e)
            if named is e:
                raise
            raise named from None
        if update or hook is not None:
            self.state.step = int(r[3])
        return r[:3]

    def _batch_result(self, loss_sum: float, seen: int, state: np.ndarray) -> float | list[float]:
        """Keras' return of a one-batch call: the mean loss, or ``[loss, *metrics]`` with metrics (and, with
        several outputs, each output's loss)."""
        loss = loss_sum / seen
        if len(self.metrics_names) == 1:
            return loss
        return [loss, *self.metric_values(state, seen).values()]

    def compute_gradients(
        self, x: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None
    ) -> float | list[float]:
        """Forward and backward on one batch: fills ``grads`` without updating the parameters.

        For parameter servers and allreduce loops that apply the update themselves (`apply_gradients`).

        Returns:
            The batch's mean loss, or ``[loss, *metrics]`` when the model has metrics.

        Raises:
            ModelError: The model is not compiled.
        """
        self._require_compiled()
        state = self.new_metric_state()
        xa, ya, w = self.engine_arrays(x, y, sample_weight)
        loss_sum, seen, _ = self.run_steps(xa, ya, update=False, weights=w, metrics=state)
        return self._batch_result(loss_sum, seen, state)

    def apply_gradients(self, grads: np.ndarray | None = None) -> None:
        """One optimizer step from ``grads`` (default: the model's ``grads``); advances the step count.

        Raises:
            ModelError: The model is not compiled.
        """
        self._require_compiled()
        self.optimizer.apply(self.params, self.grads if grads is None else grads)
        self.state.step += 1

    def train_on_batch(
        self,
        x: np.ndarray,
        y: np.ndarray,
        sample_weight: np.ndarray | None = None,
        class_weight: Mapping[int, float] | None = None,
    ) -> float | list[float]:
        """One training step (forward, backward, update) on one batch.

        Returns:
            The batch's mean loss before the update, or ``[loss, *metrics]`` when the model has metrics
            (Keras' return).

        Raises:
            ModelError: The model is not compiled.
            NonFiniteLossError: The loss was NaN or infinite (the update was not applied).
        """
        self._require_compiled()
        state = self.new_metric_state()
        xa, ya, w = self.engine_arrays(x, y, sample_weight, class_weight)
        loss_sum, seen, _ = self.run_steps(xa, ya, weights=w, metrics=state)
        return self._batch_result(loss_sum, seen, state)

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
        ps: object = None,
        sample_weight: np.ndarray | None = None,
        class_weight: Mapping[int, float] | None = None,
        **options: object,
    ) -> History:
        """Trains until epoch ``epochs`` or until ``max_steps`` optimizer steps, whichever comes first.

        On arrays, each epoch draws a permutation from the model's RNG and runs the inner loop (gather
        batch, forward, backward, update) in C with the GIL released, returning to Python every
        ``log_every`` steps for the progress bar, logging and callbacks. On an iterable, one C call per
        batch, with the next batches converted on a background thread. A model compiled with a
        `DistributedOptimizer` reduces the gradients across ranks every step; rank 0 alone writes
        checkpoints.

        Callbacks use Keras's names: objects with any of ``set_model(model)``, ``on_train_begin(logs)``,
        ``on_epoch_begin(epoch, logs)``, ``on_step_end(step, logs)``, ``on_epoch_end(epoch, logs)``,
        ``on_train_end(logs)``, or plain callables called as ``fn(step, logs)`` every log interval. At an
        epoch's end the callbacks run first, then History records what they left in ``logs``.

        Args:
            x: Inputs, an array of ``[n, *input_shape]`` (float32 and uint8 reach C as they are, other
                dtypes are converted to float32; see `set_input_transform`), or an iterable of batches
                (dicts of arrays, or ``(x, y)`` pairs), re-iterated each epoch when it can be, e.g. a
                `sparkgrad.data.TFRecordDataset`.
            y: Targets for array ``x``: integer labels ``[n]`` (sparse cross-entropy), one-hot
                ``[n, classes]`` (categorical), or floats ``[n]`` / ``[n, outputs]`` (binary cross-entropy,
                regression losses).
            batch_size: Rows per step, for array inputs (an iterable's batches are taken as they come).
            epochs: The epoch to stop at (Keras's meaning: with ``initial_epoch=2, epochs=5`` it trains
                3 epochs).
            verbose: 0 silent, 1 a progress bar (tqdm), 2 one line per epoch.
            validation_data: ``(x, y)`` or ``(x, y, sample_weight)`` evaluated after each epoch, as
                ``val_loss`` and ``val_<metric>``.
            max_steps: Stop once the model's step count reaches it (a resumed run counts its steps).
            shuffle: Shuffle array rows each epoch.
            log_every: Steps between two returns to Python (progress, `History.steps`, ``on_step_end``).
            callbacks: Callback objects or callables, as above.
            x_key: Key of the inputs in a dict batch.
            y_key: Key of the labels in a dict batch.
            initial_epoch: Epoch to start from; default 0, or the resumed checkpoint's epoch.
            input_mapping: ``{dataset key: "x" | "y"}``, e.g. ``{"image_raw": "x", "label": "y"}`` as in
                TensorFlowOnSpark; replaces ``x_key`` and ``y_key``.
            ps: A parameter-server client (``TFNode.ps_client(ctx, model)``) through which every step
                goes; the servers apply the update and the chief (worker 0) initialises them and writes
                checkpoints.
            sample_weight: Per-row weights ``[n]`` for array ``x``: each row's loss and metrics count with
                its weight (the loss is ``sum(w * loss) / batch_size``, as Keras). Dataset batches carry
                theirs as a ``"sample_weight"`` key or a third tuple element.
            class_weight: ``{class: weight}``: each row's weight is multiplied by its class's (the label;
                for one output, the rounded target). Every class present must have a weight.
            **options: ``checkpoint_dir`` (str): write ``ckpt-<step>.sgck`` there at each epoch end, and
                every ``checkpoint_every`` (int) steps, keeping the last ``keep_last`` (default 3); with
                ``resume`` (default True) fit resumes from the newest. ``save_best_only`` (bool): also keep
                ``best.sgck`` for the best ``monitor`` (default ``"val_loss"``; losses lower is better,
                accuracies higher). ``sync_dir`` (str): copy each finished checkpoint there, whole files,
                at most every ``sync_every_secs`` (default 60) and at the end. ``plot_path`` (str): a PNG
                of the loss and accuracy curves (needs matplotlib). ``tensorboard_dir`` (str): scalars
                for TensorBoard (`sparkgrad.summary.EventWriter`). ``prefetch`` (int, default 2): batches
                of an iterable prepared ahead (0: none), waiting at most ``prefetch_timeout`` (default
                600) seconds for each. ``mlflow`` (bool | None): log parameters, metrics, checkpoints and
                the model to MLflow from the chief (None: when mlflow is imported and a run is active).

        Returns:
            The `History` of this call.

        Raises:
            ModelError: The model is not compiled.
            InvalidArgumentError: Bad sizes or options (``batch_size <= 0``, ``log_every <= 0``, x without
                rows, y not matching x or the loss, a target outside what the loss takes, ``sync_dir`` or
                ``save_best_only`` without ``checkpoint_dir``).
            NonFiniteLossError: A batch's loss was NaN or infinite; the message names the step and the
                row. Nothing of that batch is applied and no checkpoint is written after it.
            SparkgradTimeout: An iterable gave no batch within ``prefetch_timeout``.
        """
        self._require_compiled()
        x_key, y_key = _batches.keys(input_mapping, x_key, y_key)
        trainer = Trainer(
            self, verbose=verbose, log_every=log_every, callbacks=callbacks, options=FitOptions.of(options)
        )
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
                ps=ps,
                sample_weight=sample_weight,
                class_weight=class_weight,
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
        sample_weight: np.ndarray | None = None,
    ) -> float | list[float] | dict[str, float]:
        """The loss and the compiled metrics over the data, in inference mode (dropout off).

        Args:
            x: An array of inputs (with ``y``) or an iterable of batches, as for `fit`.
            y: Targets for array ``x``; required then.
            batch_size: Rows per C call, for arrays.
            x_key: Key of the inputs in a dict batch.
            y_key: Key of the targets in a dict batch.
            verbose: Nonzero prints the result.
            return_dict: Return ``{"loss": ..., <metric name>: ...}``.
            input_mapping: As for `fit`.
            sample_weight: Per-row weights for array ``x``, as for `fit`.

        Returns:
            As Keras: the mean loss when the model has no metrics, else ``[loss, *metrics]`` in
            ``metrics_names`` order; or the dict.

        Raises:
            ModelError: The model is not compiled.
            InvalidArgumentError: ``y`` missing for an array, or no data.
        """
        self._require_compiled()
        x_key, y_key = _batches.keys(input_mapping, x_key, y_key)
        arrays = isinstance(x, (np.ndarray, Mapping)) or (
            isinstance(x, list) and len(x) == len(self.inputs) and all(isinstance(a, np.ndarray) for a in x)
        )
        if y is None and arrays:
            raise InvalidArgumentError("evaluate: y is required when x is an array (or the inputs' arrays)")
        state = self.new_metric_state()
        if y is None:
            loss_sum, seen = 0.0, 0
            for batch in x:
                xb, yb, wb = _batches.batch_parts(batch, x_key, y_key)
                first = next(iter(xb.values())) if isinstance(xb, Mapping) else xb[0] if isinstance(xb, list) else xb
                r = self._evaluate_arrays(xb, yb, max(len(first), 1), state, wb)
                loss_sum, seen = loss_sum + r[0], seen + r[1]
        else:
            loss_sum, seen, _ = self._evaluate_arrays(x, y, batch_size, state, sample_weight)
        if seen == 0:
            raise InvalidArgumentError("evaluate: no data")
        logs = {"loss": loss_sum / seen, **self.metric_values(state, seen)}
        if verbose:
            print("evaluate: " + " ".join(f"{k} {v:.4f}" for k, v in logs.items()))
        if return_dict:
            return logs
        return list(logs.values()) if len(logs) > 1 else logs["loss"]

    def _evaluate_arrays(
        self,
        x: np.ndarray,
        y: np.ndarray,
        batch_size: int,
        state: np.ndarray | None = None,
        sample_weight: np.ndarray | None = None,
    ) -> tuple[float, int, int]:
        """``(loss_sum, seen, steps)`` over arrays; the metrics add to ``state``."""
        xa, ya, w = self.engine_arrays(x, y, sample_weight)
        try:
            return self._core.evaluate(xa, ya, int(batch_size), weights=w, metrics=state, **self._transform_kw())
        except SparkgradError as e:
            raise self._with_names(e) from None

    def predict(self, x: object, batch_size: int = 128) -> np.ndarray | list[np.ndarray]:
        """The model's outputs for ``x``, in inference mode (dropout off).

        An ``[n, K]`` float32 array per output: the output layer's values with its activation applied
        (softmax or sigmoid probabilities for such a head; logits for a linear one). With several outputs
        a list in output order (a dict by output name when the model was given its outputs as a dict).

        Args:
            x: ``[n, *input_shape]`` inputs (the input transform applies); with several inputs a list in
                input order or a dict by input name.
            batch_size: Rows per C call.
        """
        try:
            out = self._core.predict(self.input_arrays(x), int(batch_size), **self._transform_kw())
        except SparkgradError as e:
            raise self._with_names(e) from None
        if self._outputs_as_dict:
            return dict(zip(self.output_names, out if isinstance(out, list) else [out], strict=True))
        return out

    # ---- persistence (sparkgrad.nn.checkpoint) ----------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Writes a checkpoint: the weights and the whole training state (step, epoch, RNG, optimizer state).

        For a file that rebuilds the model without its code, use `save_model` instead.
        """
        _checkpoint.save(self, path)

    def load(self, path: str | os.PathLike) -> None:
        """Restores a checkpoint that `save` (or fit's ``checkpoint_dir``) wrote into this model.

        Raises:
            CheckpointError: The file is damaged or was written by a model of another architecture.
        """
        _checkpoint.load(self, path)

    def export_npz(self, path: str | os.PathLike) -> None:
        """Writes the weights as a NumPy ``.npz``: arrays ``layer<i>_<name>`` (``layer0_kernel``, ``layer0_bias``,
        ``layer1_moving_mean``, ...), Keras layouts."""
        arrays = {}
        for (_, _, _, t), w in zip(self._weight_order, self.get_weights(), strict=True):
            arrays[f"layer{t.layer}_{t.name}"] = w
        with open(os.fspath(path), "wb") as f:
            np.savez(f, **arrays)


def steps_per_epoch(n: int, batch_size: int) -> int:
    return math.ceil(n / batch_size)


def _layer_names(layers: Sequence[Layer]) -> list[str]:
    """Each call's layer name: its own, or Keras' default (``dense``, ``dense_1``, ...), a shared layer's
    the same at each call."""
    taken = {layer.name for layer in layers if layer.name}
    by_id: dict[int, str] = {}
    counts: dict[str, int] = {}
    for layer in layers:
        if layer.name or id(layer) in by_id:
            continue
        base = _snake(type(layer).__name__)
        while True:
            k = counts.get(base, 0)
            counts[base] = k + 1
            name = base if k == 0 else f"{base}_{k}"
            if name not in taken:
                break
        taken.add(name)
        by_id[id(layer)] = name
    return [layer.name or by_id[id(layer)] for layer in layers]


def _snake(name: str) -> str:
    """``"MaxPool2D"`` -> ``"max_pool2d"``, as Keras names layers."""
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and (not name[i - 1].isupper() or (i + 1 < len(name) and name[i + 1].islower())):
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


class Sequential(Model):
    """A Keras-shaped stack of layers: the `Model` whose every layer reads the one before it.

    ```python
    model = Sequential([Dense(128, activation="relu", input_shape=(784,)), Dense(10)], seed=1)
    model.compile(optimizer=SGD(0.07), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, batch_size=100, epochs=5)
    ```

    Args:
        layers: The layers, in order; the first one, and only it, declares ``input_shape``. The output
            must be flat (put `Flatten` before the last `Dense`: Dense works on the last axis); a last
            `Dense` with softmax or sigmoid is the head the loss
            applies (see `sparkgrad.nn.losses`).
        seed: Fixes the initial weights, the dropout masks and the shuffling (None: drawn from
            ``os.urandom``).
        name: The model's name, printed by `summary`.

    Everything else is `Model`'s.

    Raises:
        ModelError: No layers, ``input_shape`` missing on the first layer or given on another, a merge layer
            (it needs the functional API), or layers that do not fit together (the message names the layer
            and the shapes).
    """

    def __init__(self, layers: Sequence[Layer], seed: int | None = None, name: str = "sequential") -> None:
        layers = list(layers)
        if not layers:
            raise ModelError("Sequential needs at least one layer")
        if _prep.is_preprocessing(layers[0]):
            raise ModelError(
                f"layer 0 ({layers[0].type_name}) is a preprocessing layer: put it on an Input(dtype=...) of a Model "
                "(it runs in the batch gather)"
            )
        if layers[0].input_shape is None:
            raise ModelError("the first layer needs input_shape=, e.g. Dense(128, input_shape=(784,))")
        for i, layer in enumerate(layers):
            if i and layer.input_shape is not None:
                raise ModelError(f"layer {i} ({layer.type_name}): only the first layer takes input_shape")
            if getattr(layer, "merge", False):
                raise ModelError(f"layer {i} ({layer.type_name}) merges tensors: build it with Input and Model")
            if _prep.is_preprocessing(layer):
                raise ModelError(
                    f"layer {i} ({layer.type_name}) is a preprocessing layer: put it on an Input(dtype=...) of a "
                    "Model (it runs in the batch gather)"
                )
        try:
            shape3(tuple(layers[0].input_shape))
        except ValueError as e:
            raise ModelError(str(e)) from None
        inp = KerasTensor((None, *(int(d) for d in layers[0].input_shape)), "float32", "input_layer")
        t = inp
        for layer in layers:
            t = KerasTensor(None, "float32", layer.name or layer.type_name.lower(), layer, (t,))
        self._build(_graph.Graph([inp], layers, [[k] for k in range(len(layers))], [len(layers)], [t]), name, seed)
