"""The functional API's symbolic tensors: `Input`, a layer called on tensors, and the graph a `Model`
is built from.

A `KerasTensor` holds no values: it records which layer made it from which tensors. `Model(inputs,
outputs)` walks back from its outputs, numbers the tensors as the C core does (the model's inputs
0..n-1, then each layer call's output in Keras 3's order, a topological order: `_keras_order`)
and hands C one typed description per layer (`Layer.spec` plus the ids of the tensors it reads).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from sparkgrad.errors import ModelError

_counter = itertools.count()


@dataclass(eq=False)
class KerasTensor:
    """A symbolic tensor: an `Input`, or the output of a layer called on tensors.

    Attributes:
        shape (tuple): ``(None, *per-sample shape)`` for an `Input` (as Keras shows it); None for a
            layer's output until a model computes it (`Model.summary` prints the shapes).
        dtype (str): ``"float32"``, ``"uint8"`` for an Input that takes bytes as they are, ``"int32"`` or
            ``"int64"`` for ids.
        name (str): The Input's name (its key in a dict of inputs); a layer output's is its layer's.
    """

    shape: tuple | None
    dtype: str
    name: str
    layer: object = None  # the layer that made it (None: an Input)
    inbound: tuple[KerasTensor, ...] = ()
    order: int = field(default_factory=lambda: next(_counter))

    def __repr__(self) -> str:
        what = f"Input {self.name!r}" if self.layer is None else f"output of {type(self.layer).__name__}"
        return f"<KerasTensor {what} shape={self.shape}>"


_input_names = itertools.count()
# "string": raw columns for the preprocessing layers (sparkgrad.nn.preprocessing); "int32" and "int64":
# ids (an Embedding's, or a preprocessing layer's input)
INPUT_DTYPES = ("float32", "uint8", "string", "int32", "int64")


def Input(shape: Sequence[int], dtype: str = "float32", name: str | None = None) -> KerasTensor:  # noqa: N802
    """A model input, as ``keras.Input``: the per-sample shape, without the batch axis.

    ```python
    from sparkgrad.nn import Dense, Input, Model

    x = Input(shape=(8,), name="features")
    model = Model(x, Dense(1)(Dense(16, activation="relu")(x)), seed=0)
    ```

    Args:
        shape: 0 to 3 dimensions (``()`` one value, e.g. an id; ``(features,)``, ``(steps, features)``,
            ``(h, w, channels)``).
        dtype: ``"float32"`` (the default; other numeric arrays are converted) or ``"uint8"``; ``"int32"`` or
            ``"int64"`` for ids (an `Embedding`'s; int32 and int64 arrays reach C as they are); ``"string"``,
            ``"int32"`` or ``"int64"`` for an Input that a preprocessing layer reads (`StringLookup`,
            `Hashing`, `IntegerLookup`, `CategoryEncoding`), whose column is mapped in C.
        name: Its name, the key of its array when `fit` and `predict` take a dict (default
            ``"input_layer"``, ``"input_layer_1"``, ... as Keras names them).

    Raises:
        ValueError: A shape of another rank, a size of 0 or less, or another dtype.
    """
    from sparkgrad.nn.layers import shape3

    shape = tuple(int(s) for s in (shape if isinstance(shape, Sequence) else (shape,)))
    shape3(shape or (1,), "Input shape")
    if dtype not in INPUT_DTYPES:
        raise ValueError(f"Input dtype must be one of {INPUT_DTYPES}, not {dtype!r}")
    if name is None:
        k = next(_input_names)
        name = "input_layer" if k == 0 else f"input_layer_{k}"
    return KerasTensor((None, *shape), dtype, str(name))


def call_layer(layer, inputs) -> KerasTensor:
    """``layer(inputs)`` in the functional API: the output tensor, recording the call."""
    merge = getattr(layer, "merge", False)
    name = type(layer).__name__
    if merge:
        most = getattr(layer, "max_inputs", 64)
        if not isinstance(inputs, (list, tuple)) or not 2 <= len(inputs) <= most:
            count = "exactly 2" if most == 2 else f"2 to {most}"
            raise ModelError(f"{name} is called on a list of {count} tensors, not {inputs!r}")
        ins = tuple(inputs)
    else:
        if isinstance(inputs, (list, tuple)):
            if len(inputs) != 1:
                raise ModelError(f"{name} is called on one tensor, not a list of {len(inputs)}")
            inputs = inputs[0]
        ins = (inputs,)
    for t in ins:
        if not isinstance(t, KerasTensor):
            raise ModelError(
                f"{name} was called on {type(t).__name__}; call layers on sparkgrad.nn.Input(...) or on "
                "another layer's output (arrays go to fit and predict)"
            )
    if layer.input_shape is not None and not merge:
        raise ModelError(f"{name}(input_shape=...) is for Sequential; in a functional model give Input(shape=...)")
    return KerasTensor(None, "float32", layer.name or name.lower(), layer, ins)


@dataclass
class Graph:
    """What `Model` builds the C core from: the inputs, the layers in order (a shared layer at each of
    its calls) with the ids of the tensors each reads, the earlier call whose parameters each uses (-1:
    its own), and the outputs' ids."""

    inputs: list[KerasTensor]
    layers: list
    reads: list[list[int]]
    outputs: list[int]
    output_tensors: list[KerasTensor]
    shares: list[int] = field(default_factory=list)
    output_keys: list[str] | None = None  # the keys of outputs given as a dict (their names)


def _listed(x, what: str) -> list[KerasTensor]:
    if isinstance(x, dict):
        x = list(x.values())
    items = list(x) if isinstance(x, (list, tuple)) else [x]
    for t in items:
        if not isinstance(t, KerasTensor):
            raise ModelError(f"Model {what} must be tensors (Input(...), a layer's output), not {type(t).__name__}")
    if not items:
        raise ModelError(f"Model needs at least one of its {what}")
    return items


def _keras_order(outputs, outs: list[KerasTensor]) -> list[KerasTensor]:
    """The layer calls (their output tensors) in Keras 3's order (keras/src/ops/function.py, map_graph):
    by depth (layers between the call and an output) from the deepest, ties by the order a depth-first
    walk from the outputs (a dict's in sorted key order) first meets each layer. A topological order, and
    the one Keras' `get_weights` follows, so weights move between the two models as lists."""
    walk = [outputs[k] for k in sorted(outputs)] if isinstance(outputs, dict) else outs
    index: dict[int, int] = {}  # layer -> first visit
    post: list[KerasTensor] = []  # calls, inputs first
    done: set[int] = set()

    def visit(t: KerasTensor) -> None:
        stack = [(t, False)]
        while stack:
            u, expanded = stack.pop()
            if u.layer is None or id(u) in done:
                continue
            if expanded:
                done.add(id(u))
                post.append(u)
                continue
            index.setdefault(id(u.layer), len(index))
            stack.append((u, True))
            stack.extend((i, False) for i in reversed(u.inbound))

    for t in walk:
        visit(t)
    depth: dict[int, int] = {}
    layer_depth: dict[int, int] = {}
    for u in reversed(post):
        d = max(depth.setdefault(id(u), 0), layer_depth.get(id(u.layer), 0))
        layer_depth[id(u.layer)] = d
        depth[id(u)] = d
        for i in u.inbound:
            if i.layer is not None:
                depth[id(i)] = max(d + 1, depth.get(id(i), 0))
    return sorted(post, key=lambda u: (-depth[id(u)], index[id(u.layer)], u.order))


def collect(inputs, outputs) -> Graph:
    """The graph between ``inputs`` and ``outputs`` (a tensor, a list or a dict of them).

    Raises:
        ModelError: An output that does not depend on the inputs given (the Input it needs is named), an
            input the outputs do not use, or repeated inputs or outputs.
    """
    ins = _listed(inputs, "inputs")
    outs = _listed(outputs, "outputs")
    for t in ins:
        if t.layer is not None:
            raise ModelError(f"Model inputs must be Input(...) tensors, not the {t!r}")
    if len({id(t) for t in ins}) != len(ins):
        raise ModelError("Model inputs repeat a tensor")
    if len({id(t) for t in outs}) != len(outs):
        raise ModelError("Model outputs repeat a tensor")
    seen: dict[int, KerasTensor] = {}
    stack = list(outs)
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen[id(t)] = t
        if t.layer is None:
            if not any(t is i for i in ins):
                raise ModelError(f"the outputs depend on Input {t.name!r}, which is not among the model's inputs")
            continue
        stack.extend(t.inbound)
    for t in ins:
        if id(t) not in seen:
            raise ModelError(f"input {t.name!r} is not connected to the outputs")
    made = _keras_order(outputs, outs)
    # a layer object called on several tensors is a shared layer: its later calls use the first's parameters
    first: dict[int, int] = {}
    shares = []
    for k, t in enumerate(made):
        shares.append(first.get(id(t.layer), -1))
        first.setdefault(id(t.layer), k)
    ids = {id(t): i for i, t in enumerate(ins)}
    for k, t in enumerate(made):
        ids[id(t)] = len(ins) + k
    if any(t.layer is None for t in outs):
        raise ModelError("a model output must be a layer's output, not an Input")
    return Graph(
        ins,
        [t.layer for t in made],
        [[ids[id(i)] for i in t.inbound] for t in made],
        [ids[id(t)] for t in outs],
        outs,
        shares,
        [str(k) for k in outputs] if isinstance(outputs, dict) else None,
    )
