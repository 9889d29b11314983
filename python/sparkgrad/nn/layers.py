"""Keras-named layer declarations for sparkgrad.nn models.

Each layer is a frozen description; the C core (csrc/nn/nn_model.h) builds the
oneDNN kernels from it. A layer goes in a `Sequential` list, or is called on
tensors (`sparkgrad.nn.Input`, another layer's output) to build a functional
`Model`. Activations are NHWC (Keras' channels_last), kernels
use Keras' layouts (Dense [in, out], Conv2D [kh, kw, in, out]), so weights move
between Keras and sparkgrad unchanged.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sparkgrad import _core
from sparkgrad.nn.graph import KerasTensor, call_layer


def _kind(name: str) -> int:
    """The C op table's kind number of the op named ``name`` (csrc/nn/nn_model.h's NN_OPS)."""
    return _core.LAYER_KINDS.index(name)


class Kind(enum.IntEnum):
    """LayerKind of csrc/nn/nn_model.h, by the op table's names."""

    DENSE = _kind("Dense")
    CONV2D = _kind("Conv2D")
    MAXPOOL = _kind("MaxPool2D")
    AVGPOOL = _kind("AveragePooling2D")
    DROPOUT = _kind("Dropout")
    FLATTEN = _kind("Flatten")
    ACTIVATION = _kind("Activation")
    RESHAPE = _kind("Reshape")
    ADD = _kind("Add")
    CONCATENATE = _kind("Concatenate")
    BATCHNORM = _kind("BatchNormalization")
    LAYERNORM = _kind("LayerNormalization")
    SUBTRACT = _kind("Subtract")
    MULTIPLY = _kind("Multiply")
    AVERAGE = _kind("Average")
    MAXIMUM = _kind("Maximum")
    MINIMUM = _kind("Minimum")
    DOT = _kind("Dot")
    EMBEDDING = _kind("Embedding")


class Act(enum.IntEnum):
    """NnAct of csrc/nn/nn_ref.h."""

    NONE = 0
    RELU = 1
    TANH = 2
    SIGMOID = 3
    SOFTMAX = 4
    LEAKY_RELU = 5
    ELU = 6
    SELU = 7
    GELU = 8
    SWISH = 9
    SOFTPLUS = 10


class Init(enum.IntEnum):
    """NnInit of csrc/nn/nn_model.h."""

    GLOROT_UNIFORM = 0
    TRUNCATED_NORMAL = 1
    HE_NORMAL = 2
    HE_UNIFORM = 3
    ZEROS = 4
    UNIFORM = 5


_ACTS = {None: Act.NONE, "linear": Act.NONE, "relu": Act.RELU, "tanh": Act.TANH, "sigmoid": Act.SIGMOID}
_ACTS["softmax"] = Act.SOFTMAX
_ACTS.update(
    leaky_relu=Act.LEAKY_RELU,
    elu=Act.ELU,
    selu=Act.SELU,
    gelu=Act.GELU,
    swish=Act.SWISH,
    silu=Act.SWISH,
    softplus=Act.SOFTPLUS,
)
# what Dense and Conv2D fuse into their primitive as a post-op (the backward runs from the output); the
# others (gelu, selu, swish, softplus) run as eltwise primitives after it, from its output
FUSED = frozenset({None, "linear", "relu", "leaky_relu", "elu", "tanh", "sigmoid", "softmax"})
_INITS = {
    "glorot_uniform": Init.GLOROT_UNIFORM,
    "truncated_normal": Init.TRUNCATED_NORMAL,
    "he_normal": Init.HE_NORMAL,
    "he_uniform": Init.HE_UNIFORM,
    "zeros": Init.ZEROS,
    "uniform": Init.UNIFORM,
    "random_uniform": Init.UNIFORM,
}


def _act(name: str | None) -> Act:
    if name not in _ACTS:
        raise ValueError(f"unknown activation {name!r}; one of {sorted(k for k in _ACTS if k)}")
    return _ACTS[name]


def _fused(layer: str, name: str | None) -> Act:
    """A weighted layer's activation: any of Keras' list (softmax only on a model output's Dense)."""
    return _act(name)


def _init(name: str) -> Init:
    if name not in _INITS:
        raise ValueError(f"unknown kernel_initializer {name!r}; one of {sorted(_INITS)}")
    return _INITS[name]


def _pair(v: int | tuple[int, int], what: str) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    if len(v) != 2:
        raise ValueError(f"{what} must be an int or a pair, not {v!r}")
    return (int(v[0]), int(v[1]))


def _padding(p: str) -> int:
    if p not in ("valid", "same"):
        raise ValueError(f"padding must be 'valid' or 'same', not {p!r}")
    return int(p == "same")


@dataclass(frozen=True, eq=False)
class Layer:
    """Base of the layer declarations; ``input_shape`` only on the first layer of a `Sequential`.

    Calling a layer on a tensor (or, for a merge, a list of tensors) returns its output tensor, as in
    Keras' functional API: ``y = Dense(8)(x)``.
    """

    input_shape: tuple[int, ...] | None = None
    name: str | None = None

    def spec(self) -> dict:
        """The typed description the C core builds the layer from: ``kind`` (an index of
        ``_core.LAYER_KINDS``) and the fields the kind takes (``units``, ``kernel_size``, ``strides``,
        ``padding``, ``activation``, ``rate``, ``initializer``, ``target_shape``)."""
        raise NotImplementedError

    def __call__(self, inputs: KerasTensor | list[KerasTensor]) -> KerasTensor:
        return call_layer(self, inputs)

    @property
    def type_name(self) -> str:
        """The class name (``"Dense"``, ...), as `Sequential.summary` prints it."""
        return type(self).__name__


@dataclass(frozen=True, eq=False)
class Dense(Layer):
    """Fully connected layer: ``activation(x @ kernel + bias)``, one fused oneDNN primitive.

    The kernel has Keras's layout ``[in, units]``; a Dense after a 3-D input or a Conv2D needs a
    `Flatten` first. A last Dense with softmax or sigmoid is the model's head: the loss applies that
    activation in its stable fused form (see `sparkgrad.nn.losses`).

    Args:
        units (int): Number of outputs.
        activation (str | None): ``None`` or ``"linear"`` (none), ``"relu"``, ``"leaky_relu"`` (slope
            0.2), ``"elu"``, ``"tanh"``, ``"sigmoid"`` or ``"softmax"`` (last layer only): fused into the
            primitive. ``"gelu"``, ``"selu"``, ``"swish"``/``"silu"`` and ``"softplus"`` go in an `Activation`
            layer after a linear Dense (their backward needs the layer's output before them).
        input_shape (tuple[int, ...] | None): The shape of one sample without the batch dimension, e.g.
            ``(784,)``; on the first layer only.
        kernel_initializer (str): ``"glorot_uniform"`` (Keras's default), ``"truncated_normal"`` (stddev
            ``1/sqrt(fan_in)``), ``"he_normal"``, ``"he_uniform"`` or ``"zeros"``; biases start at zero.
        name (str | None): The name `Sequential.summary` shows (default ``dense_<index>``).

    Raises:
        ValueError: An unknown activation or initializer.
    """

    units: int = 0
    activation: str | None = None
    kernel_initializer: str = "glorot_uniform"

    def __init__(self, units, activation=None, input_shape=None, kernel_initializer="glorot_uniform", name=None):
        object.__setattr__(self, "units", int(units))
        object.__setattr__(self, "activation", activation)
        object.__setattr__(self, "kernel_initializer", kernel_initializer)
        object.__setattr__(self, "input_shape", tuple(input_shape) if input_shape is not None else None)
        object.__setattr__(self, "name", name)
        _fused("Dense", activation), _init(kernel_initializer)

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        return {
            "kind": int(Kind.DENSE),
            "units": self.units,
            "activation": int(_act(self.activation)),
            "initializer": int(_init(self.kernel_initializer)),
        }


@dataclass(frozen=True, eq=False)
class Conv2D(Layer):
    """2-D convolution over NHWC (channels-last) input, with a bias, on oneDNN.

    The kernel has Keras's layout ``[kh, kw, in, filters]``.

    Args:
        filters (int): Number of output channels.
        kernel_size (int | tuple[int, int]): ``kh, kw``; an int is a square kernel.
        strides (int | tuple[int, int]): Step of the window; a pair must have equal values.
        padding (str): ``"valid"`` (no padding) or ``"same"`` (output size ``ceil(in / stride)``).
        activation (str | None): As for `Dense`, softmax excepted.
        input_shape (tuple[int, ...] | None): ``(H, W, C)`` of one sample (``(H, W)`` means one channel);
            on the first layer only.
        kernel_initializer (str): As for `Dense`.
        name (str | None): The name `Sequential.summary` shows.

    Raises:
        ValueError: Unequal strides, or an unknown padding, activation or initializer.
    """

    filters: int = 0
    kernel_size: tuple[int, int] = (3, 3)
    strides: int = 1
    padding: str = "valid"
    activation: str | None = None
    kernel_initializer: str = "glorot_uniform"

    def __init__(
        self,
        filters,
        kernel_size,
        strides=1,
        padding="valid",
        activation=None,
        input_shape=None,
        kernel_initializer="glorot_uniform",
        name=None,
    ):
        s = _pair(strides, "strides")
        if s[0] != s[1]:
            raise ValueError(f"Conv2D: only equal strides are supported, not {strides!r}")
        object.__setattr__(self, "filters", int(filters))
        object.__setattr__(self, "kernel_size", _pair(kernel_size, "kernel_size"))
        object.__setattr__(self, "strides", s[0])
        object.__setattr__(self, "padding", padding)
        object.__setattr__(self, "activation", activation)
        object.__setattr__(self, "kernel_initializer", kernel_initializer)
        object.__setattr__(self, "input_shape", tuple(input_shape) if input_shape is not None else None)
        object.__setattr__(self, "name", name)
        _fused("Conv2D", activation), _init(kernel_initializer), _padding(padding)

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        return {
            "kind": int(Kind.CONV2D),
            "units": self.filters,
            "kernel_size": tuple(self.kernel_size),
            "strides": int(self.strides),
            "padding": self.padding,
            "activation": int(_act(self.activation)),
            "initializer": int(_init(self.kernel_initializer)),
        }


@dataclass(frozen=True, eq=False)
class _Pool(Layer):
    pool_size: tuple[int, int] = (2, 2)
    strides: int | None = None
    padding: str = "valid"

    def __init__(self, pool_size=2, strides=None, padding="valid", input_shape=None, name=None):
        ps = _pair(pool_size, "pool_size")
        if strides is not None:
            s = _pair(strides, "strides")
            if s[0] != s[1]:
                raise ValueError(f"{type(self).__name__}: only equal strides are supported")
            strides = s[0]
        object.__setattr__(self, "pool_size", ps)
        object.__setattr__(self, "strides", strides)
        object.__setattr__(self, "padding", padding)
        object.__setattr__(self, "input_shape", tuple(input_shape) if input_shape is not None else None)
        object.__setattr__(self, "name", name)
        _padding(padding)

    _kind = Kind.MAXPOOL

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        kh, kw = self.pool_size
        stride = self.strides if self.strides is not None else kh
        return {"kind": int(self._kind), "kernel_size": (kh, kw), "strides": int(stride), "padding": self.padding}


class MaxPool2D(_Pool):
    """2-D max pooling over NHWC input (oneDNN, with a workspace for the backward pass).

    Args:
        pool_size (int | tuple[int, int]): Window ``kh, kw``; an int is a square window.
        strides (int | tuple[int, int] | None): Step of the window, equal in both directions; None: the
            window's height.
        padding (str): ``"valid"`` or ``"same"``.
        input_shape (tuple[int, ...] | None): ``(H, W, C)`` of one sample, on the first layer only.
        name (str | None): The name `Sequential.summary` shows.

    Raises:
        ValueError: Unequal strides or an unknown padding.
    """

    _kind = Kind.MAXPOOL


class AveragePooling2D(_Pool):
    """2-D average pooling over NHWC input.

    With ``padding="same"`` padded cells are left out of the mean, as Keras does.

    Args:
        pool_size (int | tuple[int, int]): Window ``kh, kw``; an int is a square window.
        strides (int | tuple[int, int] | None): Step of the window, equal in both directions; None: the
            window's height.
        padding (str): ``"valid"`` or ``"same"``.
        input_shape (tuple[int, ...] | None): ``(H, W, C)`` of one sample, on the first layer only.
        name (str | None): The name `Sequential.summary` shows.

    Raises:
        ValueError: Unequal strides or an unknown padding.
    """

    _kind = Kind.AVGPOOL


MaxPooling2D = MaxPool2D
"""Keras's other name for `MaxPool2D` (the same class)."""
AvgPool2D = AveragePooling2D
"""Keras's other name for `AveragePooling2D` (the same class)."""


@dataclass(frozen=True, eq=False)
class Dropout(Layer):
    """Inverted dropout, in training only; masks come from the model's seeded RNG.

    In training each value is zeroed with probability ``rate`` and the others scaled by
    ``1 / (1 - rate)``; in evaluate and predict it passes values through.

    Args:
        rate (float): Fraction of values dropped, in ``[0, 1)``.
        input_shape (tuple[int, ...] | None): On the first layer only.
        name (str | None): The name `Sequential.summary` shows.

    Raises:
        ValueError: ``rate`` outside ``[0, 1)``.
    """

    rate: float = 0.0

    def __init__(self, rate, input_shape=None, name=None):
        object.__setattr__(self, "rate", float(rate))
        object.__setattr__(self, "input_shape", tuple(input_shape) if input_shape is not None else None)
        object.__setattr__(self, "name", name)
        if not 0.0 <= self.rate < 1.0:
            raise ValueError(f"Dropout rate must be in [0, 1), not {rate!r}")

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        return {"kind": int(Kind.DROPOUT), "rate": self.rate}


@dataclass(frozen=True, eq=False)
class Flatten(Layer):
    """Reshapes ``[B, H, W, C]`` to ``[B, H*W*C]`` in NHWC order, as Keras does, without copying.

    Args:
        input_shape (tuple[int, ...] | None): On the first layer only.
        name (str | None): The name `Sequential.summary` shows.
    """

    def __init__(self, input_shape=None, name=None):
        object.__setattr__(self, "input_shape", tuple(input_shape) if input_shape is not None else None)
        object.__setattr__(self, "name", name)

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        return {"kind": int(Kind.FLATTEN)}


@dataclass(frozen=True, eq=False)
class Activation(Layer):
    """Applies an activation to its input, elementwise (Keras' ``Activation`` layer).

    Every activation of Keras' list that sparkgrad has: ``"relu"``, ``"leaky_relu"`` (negative slope 0.2,
    as ``keras.activations.leaky_relu``), ``"elu"``, ``"selu"``, ``"gelu"`` (the exact erf form, Keras'
    ``approximate=False``), ``"swish"`` (also ``"silu"``), ``"softplus"``, ``"tanh"``, ``"sigmoid"`` and
    ``"linear"``. oneDNN eltwise primitives, backward from the layer's input. ``"softmax"`` is a head:
    give the last `Dense` ``activation="softmax"``.

    ```python
    from sparkgrad.nn import Activation, Dense, Sequential

    model = Sequential([Dense(64, input_shape=(20,)), Activation("gelu"), Dense(1)], seed=0)
    ```

    Args:
        activation (str): The activation's name.
        input_shape (tuple[int, ...] | None): On the first layer only.
        name (str | None): The name `Sequential.summary` shows.

    Raises:
        ValueError: An unknown activation, or softmax.
    """

    activation: str = "linear"

    def __init__(self, activation, input_shape=None, name=None):
        object.__setattr__(self, "activation", "linear" if activation is None else activation)
        object.__setattr__(self, "input_shape", tuple(input_shape) if input_shape is not None else None)
        object.__setattr__(self, "name", name)
        if _act(self.activation) == Act.SOFTMAX:
            raise ValueError('Activation("softmax"): softmax is a head here; give the last Dense activation="softmax"')

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        return {"kind": int(Kind.ACTIVATION), "activation": int(_act(self.activation))}


def shape3(shape: tuple[int, ...], what: str = "input_shape") -> tuple[int, int, int]:
    """The (h, w, c) the C core stores a per-sample shape of rank 1 to 3 as: ``(c,)`` is ``(1, 1, c)``,
    ``(t, c)`` is ``(1, t, c)`` (so that Dense works on the last axis, as Keras'), ``(h, w, c)`` itself."""
    try:
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a tuple of ints, not {shape!r}") from None
    if any(s <= 0 for s in shape) or not 1 <= len(shape) <= 3:
        raise ValueError(f"{what} must have 1 to 3 positive dimensions (without the batch), not {shape!r}")
    return ((1, 1) + shape)[-3:] if len(shape) < 3 else shape  # type: ignore[return-value]


@dataclass(frozen=True, eq=False)
class Reshape(Layer):
    """Gives its input another shape of as many values (Keras' ``Reshape``; the batch axis is kept).

    No copy: activations are contiguous NHWC, so the output is the input's buffer read another way.

    Args:
        target_shape (tuple[int, ...]): The shape without the batch axis, 1 to 3 dimensions.
        input_shape (tuple[int, ...] | None): On the first layer of a `Sequential` only.
        name (str | None): The layer's name.
    """

    target_shape: tuple[int, ...] = ()

    def __init__(self, target_shape, input_shape=None, name=None):
        object.__setattr__(self, "target_shape", tuple(int(s) for s in target_shape))
        object.__setattr__(self, "input_shape", tuple(input_shape) if input_shape is not None else None)
        object.__setattr__(self, "name", name)
        if any(s == -1 for s in self.target_shape):
            raise ValueError(f"Reshape{self.target_shape}: give every dimension (-1 is not inferred here)")
        shape3(self.target_shape, "Reshape target_shape")

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        return {"kind": int(Kind.RESHAPE), "target_shape": shape3(self.target_shape)}


@dataclass(frozen=True, eq=False)
class _Merge(Layer):
    """A layer called on a list of 2 to ``max_inputs`` tensors."""

    merge = True
    max_inputs = 64  # NN_MAX_NODE_INPUTS

    def __init__(self, name=None, input_shape=None):
        if input_shape is not None:
            raise ValueError(f"{type(self).__name__} takes no input_shape: it is called on tensors (Input(...))")
        object.__setattr__(self, "input_shape", None)
        object.__setattr__(self, "name", name)


@dataclass(frozen=True, eq=False)
class Add(_Merge):
    """The elementwise sum of its inputs, all of one shape (Keras' ``Add``): ``Add()([x, y])``.

    Args:
        name (str | None): The layer's name.
    """

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        return {"kind": int(Kind.ADD)}


@dataclass(frozen=True, eq=False)
class Subtract(_Merge):
    """The difference of exactly 2 inputs of one shape, ``x - y`` (Keras' ``Subtract``):
    ``Subtract()([x, y])``.

    Args:
        name (str | None): The layer's name.
    """

    max_inputs = 2

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        return {"kind": int(Kind.SUBTRACT)}


@dataclass(frozen=True, eq=False)
class Multiply(_Merge):
    """The elementwise product of its inputs, all of one shape (Keras' ``Multiply``): ``Multiply()([x, y])``.

    Args:
        name (str | None): The layer's name.
    """

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        return {"kind": int(Kind.MULTIPLY)}


@dataclass(frozen=True, eq=False)
class Average(_Merge):
    """The elementwise mean of its inputs, all of one shape (Keras' ``Average``): ``Average()([x, y])``.

    Args:
        name (str | None): The layer's name.
    """

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        return {"kind": int(Kind.AVERAGE)}


@dataclass(frozen=True, eq=False)
class Maximum(_Merge):
    """The elementwise maximum of its inputs, all of one shape (Keras' ``Maximum``): ``Maximum()([x, y])``.

    The gradient of each value goes to the input that holds the maximum; where several inputs tie, to the
    first of them (as TensorFlow's gradient of ``maximum(x, y)`` goes to ``x`` where ``x >= y``, Keras
    folding the inputs left to right). PyTorch's ``torch.maximum`` splits a tie's gradient in halves instead.

    Args:
        name (str | None): The layer's name.
    """

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        return {"kind": int(Kind.MAXIMUM)}


@dataclass(frozen=True, eq=False)
class Minimum(_Merge):
    """The elementwise minimum of its inputs, all of one shape (Keras' ``Minimum``): ``Minimum()([x, y])``.

    The gradient goes to the input that holds the minimum, on a tie to the first of them (as `Maximum`).

    Args:
        name (str | None): The layer's name.
    """

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        return {"kind": int(Kind.MINIMUM)}


def _dot_axes(axes) -> tuple[int, int]:
    """Dot's ``axes`` as a pair, checked as Keras checks it."""
    if isinstance(axes, bool) or not isinstance(axes, (int, list, tuple)):
        raise TypeError(f"Dot axes must be an int or a pair of ints, not {axes!r}")
    pair = (axes, axes) if isinstance(axes, int) else tuple(axes)
    if len(pair) != 2 or not all(isinstance(a, int) and not isinstance(a, bool) for a in pair):
        raise ValueError(f"Dot axes must be an int or a pair of ints, not {axes!r}")
    if 0 in pair:
        raise ValueError(f"Dot(axes={axes!r}): axis 0 is the batch axis; the dot product is taken within a sample")
    return pair  # type: ignore[return-value]


def _sample_rank(t: KerasTensor) -> int | None:
    """The rank of one sample of tensor ``t`` as Keras counts it (the batch axis excluded), where the layers
    that made it tell (None: a layer that changes it in a way not followed here)."""
    while t.layer is not None:
        layer = t.layer
        if isinstance(layer, Reshape):
            return len(layer.target_shape)
        if isinstance(layer, Flatten):
            return 1
        if isinstance(layer, (Conv2D, _Pool)):
            return 3
        if isinstance(layer, Dot):
            return 1
        if not isinstance(layer, (Dense, Dropout, Activation, BatchNormalization, LayerNormalization, _Merge)):
            return None
        t = t.inbound[0]
    return len(t.shape) - 1


@dataclass(frozen=True, eq=False)
class Dot(_Merge):
    """The dot product of 2 inputs along their last axis (Keras' ``Dot``), the score of a two-tower model.

    Both inputs are ``[batch, d]`` (or ``[batch, 1, d]``, as an Embedding of one id gives); the output is
    ``[batch, 1]``, ``sum(x * y)`` over the ``d`` values of each sample. With ``normalize=True`` each input
    is first L2-normalized along that axis as Keras does it, ``x * min(1 / ||x||, 1 / 1e-7)`` (``1e-7``:
    Keras' epsilon), so the output is the cosine similarity and an all-zero row scores 0. Gradients flow to
    both inputs.

    ```python
    from sparkgrad.nn import Dense, Dot, Input, Model

    user, item = Input((12,), name="user"), Input((20,), name="item")
    u = Dense(8)(Dense(16, activation="relu")(user))
    v = Dense(8)(Dense(16, activation="relu")(item))
    model = Model([user, item], Dot(axes=-1, normalize=True)([u, v]), seed=0)
    ```

    Keras' Dot also takes other axes and inputs of several axes (a batched matrix product); here only the
    last axis of inputs that have no other axis longer than 1. On ``[batch, 1, d]`` inputs Keras gives
    ``[batch, 1, 1]``; here ``[batch, 1]``, what a model output is.

    Args:
        axes (int | tuple[int, int]): The axis of each input to contract: ``-1``, or the last axis'
            index (``1`` for ``[batch, d]``, ``2`` for ``[batch, 1, d]``); an int means both inputs'.
        normalize (bool): L2-normalize both inputs along the axis first (cosine similarity).
        name (str | None): The layer's name.

    Raises:
        ValueError: Axis 0 (the batch axis) or an axes pair of another length; when called, an axis that
            is not an input's last, or a positive axis of an input whose rank the layers before it do not
            tell (give ``-1``).
        TypeError: ``axes`` that is not an int or a pair.
    """

    max_inputs = 2
    axes: int | tuple[int, int] = -1
    normalize: bool = False

    def __init__(self, axes, normalize=False, name=None, input_shape=None):
        super().__init__(name=name, input_shape=input_shape)
        pair = _dot_axes(axes)
        object.__setattr__(self, "axes", axes if isinstance(axes, int) else pair)
        object.__setattr__(self, "normalize", bool(normalize))

    def __call__(self, inputs: KerasTensor | list[KerasTensor]) -> KerasTensor:
        if isinstance(inputs, (list, tuple)) and len(inputs) == 2 and all(isinstance(t, KerasTensor) for t in inputs):
            for k, (t, a) in enumerate(zip(inputs, _dot_axes(self.axes), strict=True)):
                if a == -1:
                    continue
                rank = _sample_rank(t)
                if rank is None:
                    raise ValueError(
                        f"Dot(axes={self.axes!r}): the rank of input {k} ({t!r}) is not known here; give axes=-1 "
                        "(the last axis)"
                    )
                if a != rank:
                    raise ValueError(
                        f"Dot(axes={self.axes!r}): axis {a} of input {k}, a tensor of rank {rank + 1} with the "
                        f"batch axis, is not its last; only the last axis (axes=-1, here {rank}) is supported"
                    )
        return call_layer(self, inputs)

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        return {"kind": int(Kind.DOT), "normalize": int(self.normalize)}


@dataclass(frozen=True, eq=False)
class Concatenate(_Merge):
    """Joins its inputs along the last axis (Keras' ``Concatenate(axis=-1)``): ``Concatenate()([x, y])``.

    The inputs must agree in every other axis.

    Args:
        axis (int): -1 (the last axis), the only one supported.
        name (str | None): The layer's name.

    Raises:
        ValueError: Another axis.
    """

    axis: int = -1

    def __init__(self, axis=-1, name=None, input_shape=None):
        super().__init__(name=name, input_shape=input_shape)
        if axis != -1:
            raise ValueError(f"Concatenate(axis={axis!r}): only axis=-1 (the last axis) is supported")
        object.__setattr__(self, "axis", -1)

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        return {"kind": int(Kind.CONCATENATE)}


def _normalization(layer: Layer, axis, epsilon, center, scale, input_shape, name) -> None:
    """Sets what BatchNormalization and LayerNormalization share, checked."""
    kind = type(layer).__name__
    epsilon = float(epsilon)
    if not epsilon > 0.0 or epsilon == float("inf"):
        raise ValueError(f"{kind} epsilon must be > 0 and finite, not {epsilon!r}")
    if axis not in (-1, [-1], (-1,)):
        raise ValueError(f"{kind}(axis={axis!r}): only axis=-1 (the last axis, the channels) is supported")
    object.__setattr__(layer, "axis", -1)
    object.__setattr__(layer, "epsilon", epsilon)
    object.__setattr__(layer, "center", bool(center))
    object.__setattr__(layer, "scale", bool(scale))
    object.__setattr__(layer, "input_shape", tuple(input_shape) if input_shape is not None else None)
    object.__setattr__(layer, "name", name)


@dataclass(frozen=True, eq=False)
class BatchNormalization(Layer):
    """Normalizes each channel (the last axis) over the batch, as Keras' ``BatchNormalization``.

    ``y = (x - mean) / sqrt(var + epsilon) * gamma + beta``. In training ``mean`` and ``var`` are the
    batch's, over every axis but the last (the biased variance, as Keras), and each training step moves
    the layer's moving statistics towards them: ``moving = moving * momentum + batch * (1 - momentum)``.
    In `evaluate` and `predict` the moving statistics are used. ``gamma`` and ``beta`` are trained;
    ``moving_mean`` and ``moving_variance`` are the model's non-trainable state (``model.buffers``), in
    `get_weights` after the layer's trainable weights, as Keras orders them. Under distribution each
    worker updates its own, and they are averaged across workers whenever they are read (each epoch's
    end, checkpoints, the final model), as Keras' ``MirroredStrategy`` does.

    ```python
    from sparkgrad.nn import BatchNormalization, Dense, Sequential

    model = Sequential([Dense(64, input_shape=(20,)), BatchNormalization(), Dense(1)], seed=0)
    ```

    Args:
        axis (int): -1, the last axis (the channels of an image), the only one supported.
        momentum (float): Of the moving statistics, in ``[0, 1]`` (Keras' 0.99; PyTorch's ``momentum``
            is ``1 -`` this).
        epsilon (float): Added to the variance, > 0 (Keras' 0.001).
        center (bool): Learn ``beta``, an offset.
        scale (bool): Learn ``gamma``, a factor.
        input_shape (tuple[int, ...] | None): On the first layer of a `Sequential` only.
        name (str | None): The layer's name.

    Raises:
        ValueError: Another axis, a momentum outside ``[0, 1]`` or an epsilon that is not > 0.
    """

    axis: int = -1
    momentum: float = 0.99
    epsilon: float = 0.001
    center: bool = True
    scale: bool = True

    def __init__(self, axis=-1, momentum=0.99, epsilon=0.001, center=True, scale=True, input_shape=None, name=None):
        _normalization(self, axis, epsilon, center, scale, input_shape, name)
        object.__setattr__(self, "momentum", float(momentum))
        if not 0.0 <= self.momentum <= 1.0:
            raise ValueError(f"BatchNormalization momentum must be in [0, 1], not {momentum!r}")

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        return {
            "kind": int(Kind.BATCHNORM),
            "momentum": self.momentum,
            "epsilon": self.epsilon,
            "center": int(self.center),
            "scale": int(self.scale),
        }


@dataclass(frozen=True, eq=False)
class LayerNormalization(Layer):
    """Normalizes each sample's last axis, as Keras' ``LayerNormalization(axis=-1)``.

    ``y = (x - mean) / sqrt(var + epsilon) * gamma + beta`` with ``mean`` and ``var`` over the last axis
    of each position (each row of a ``(batch, features)`` input, each time step of a sequence), in
    training and inference alike; no state.

    Args:
        axis (int): -1, the last axis, the only one supported.
        epsilon (float): Added to the variance, > 0 (Keras' 0.001).
        center (bool): Learn ``beta``, an offset.
        scale (bool): Learn ``gamma``, a factor.
        input_shape (tuple[int, ...] | None): On the first layer of a `Sequential` only.
        name (str | None): The layer's name.

    Raises:
        ValueError: Another axis or an epsilon that is not > 0.
    """

    axis: int = -1
    epsilon: float = 0.001
    center: bool = True
    scale: bool = True

    def __init__(self, axis=-1, epsilon=0.001, center=True, scale=True, input_shape=None, name=None):
        _normalization(self, axis, epsilon, center, scale, input_shape, name)

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        return {
            "kind": int(Kind.LAYERNORM),
            "epsilon": self.epsilon,
            "center": int(self.center),
            "scale": int(self.scale),
        }


MAX_EMBEDDING_ROWS = 1 << 24
"""The most rows an `Embedding` table has: ids travel through the engine as float32 values, exact below 2^24."""


@dataclass(frozen=True, eq=False)
class Embedding(Layer):
    """Turns integer ids into rows of a trained table, as Keras' ``Embedding``: ``table[ids]``.

    Ids of shape ``(k,)`` per sample give ``(k, output_dim)`` (``k = 1`` included, as Keras), ids of shape
    ``()`` give ``(output_dim,)``, ids of shape ``(t, k)`` give ``(t, k, output_dim)``; a `Flatten` after it
    gives ``k * output_dim`` features. The table is the weight ``"embeddings"``, ``[input_dim,
    output_dim]``. Feed ids as int32 or int64 arrays (``Input(shape=(k,), dtype="int32")``; float arrays
    of whole numbers work too): they reach C as they are and become float32 values in the batch gather,
    exact below 2^24, so ``input_dim`` is at most 2^24 (16,777,216) rows. An id that is negative, not
    below ``input_dim`` or not an integer stops the step with `InvalidArgumentError` naming the layer,
    the input, the data row and the column.

    The gradient of the table is the set of rows a batch touched (an id repeated in a batch adds up in
    one row): SGD (with or without momentum), Adagrad and Adam update only those rows, so a table of
    millions of rows trains at the speed of the rows a batch uses. SGD without momentum and Adagrad give
    exactly the dense update; SGD's momentum and Adam are *lazy* on the table: the momentum and moments
    of rows a step does not touch stay as they are (TensorFlow's sparse momentum update,
    ``torch.optim.SparseAdam``), where Keras' dense Adam would decay them, and Adam's touched rows follow
    SparseAdam's arithmetic (bias corrections from the global step). With weight decay, and for AdamW,
    RMSprop and Adadelta, the table is updated densely (correct, in time proportional to the table).
    Under `bf16` precision the Embedding stays float32.

    ```python
    import numpy as np
    from sparkgrad.nn import Dense, Embedding, Flatten, Input, Model

    ids = Input(shape=(3,), dtype="int32", name="ids")
    x = Flatten()(Embedding(input_dim=1000, output_dim=8)(ids))
    model = Model(ids, Dense(1, activation="sigmoid")(x), seed=0)
    model.compile(optimizer="adam", loss="binary_crossentropy")
    rng = np.random.default_rng(0)
    x_ids = rng.integers(0, 1000, size=(256, 3)).astype(np.int32)
    model.fit(x_ids, (x_ids[:, 0] % 2).astype(np.float32), batch_size=32, epochs=1, verbose=0)
    ```

    Args:
        input_dim (int): Rows of the table: ids are ``0 .. input_dim - 1`` (at most 2^24).
        output_dim (int): Width of each row.
        embeddings_initializer (str): ``"uniform"`` (Keras' default: uniform in ``[-0.05, 0.05]``), or any
            of `Dense`'s ``kernel_initializer`` names (fan-in ``input_dim``, fan-out ``output_dim``).
        mask_zero (bool): Keras' meaning: id 0 is padding, and the layer would hand a mask to the layers
            after it. No layer here consumes a mask, so it has no numeric effect (as in Keras when the next
            layers ignore masks): row 0 is an ordinary row, trained like the others, and ``input_dim``
            counts it (a vocabulary of ``n`` words with 0 for padding needs ``input_dim = n + 1``).
        input_shape (tuple[int, ...] | None): The ids' shape per sample, on the first layer of a
            `Sequential` only.
        name (str | None): The layer's name.

    Raises:
        ValueError: ``input_dim`` outside ``[1, 2^24]``, ``output_dim`` < 1 or an unknown initializer.
    """

    input_dim: int = 0
    output_dim: int = 0
    embeddings_initializer: str = "uniform"
    mask_zero: bool = False

    def __init__(
        self,
        input_dim,
        output_dim,
        embeddings_initializer="uniform",
        mask_zero=False,
        input_shape=None,
        name=None,
    ):
        object.__setattr__(self, "input_dim", int(input_dim))
        object.__setattr__(self, "output_dim", int(output_dim))
        object.__setattr__(self, "embeddings_initializer", embeddings_initializer)
        object.__setattr__(self, "mask_zero", bool(mask_zero))
        object.__setattr__(self, "input_shape", tuple(input_shape) if input_shape is not None else None)
        object.__setattr__(self, "name", name)
        if not 1 <= self.input_dim <= MAX_EMBEDDING_ROWS:
            raise ValueError(
                f"Embedding input_dim must be 1 to 2^24 = {MAX_EMBEDDING_ROWS} (ids travel as float32 values, "
                f"exact below 2^24), not {input_dim!r}"
            )
        if self.output_dim < 1:
            raise ValueError(f"Embedding output_dim must be >= 1, not {output_dim!r}")
        _init(embeddings_initializer)

    def spec(self) -> dict:
        """The C core's layer description (see `Layer.spec`)."""
        return {
            "kind": int(Kind.EMBEDDING),
            "input_dim": self.input_dim,
            "units": self.output_dim,
            "initializer": int(_init(self.embeddings_initializer)),
            "mask_zero": int(self.mask_zero),
        }
