"""Horovod's API on sparkgrad: ``import sparkgrad.hvd as hvd``.

Inside ``sparkgrad.run`` / ``HorovodRunner`` ranks and the training nodes of
a ``TFCluster.run(..., num_ps=0)`` cluster, ``hvd.init()`` forms the
process's allreduce communicator (``sparkgrad._core.Communicator``) with no
arguments: the launcher stored the rank, the topology, this rank's listening
socket and every rank's address (sparkgrad.cluster.collective). In a plain
process (a notebook, a script) ``init()`` forms a communicator of one rank,
so the same code runs unchanged on one process.

Collectives take NumPy arrays and return new ones (``allreduce``,
``allgather``, ``broadcast``); ``broadcast_parameters`` and
``broadcast_optimizer_state`` act on a model in place; the object
collectives move values through a small tagged codec (hvd/codec.py), never
pickle.

``join()``: sparkgrad's collectives need every rank; a rank cannot leave
early and have the others reduce without it (Horovod's join semantics for
uneven data are not implemented). ``join()`` is a barrier every rank calls
once it ran out of data, and returns the rank that reached it last by wall
clock (exact among ranks of one host). Give the ranks equal shards (e.g.
``x[hvd.rank()::hvd.size()][: len(x) // hvd.size()]``) so they take the
same number of steps.

PyTorch programs use ``sparkgrad.hvd.torch`` (Horovod's torch API, with
Horovod's join), which shares this module's init and topology.
"""

from __future__ import annotations

import importlib
import os
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkgrad.cluster import collective
from sparkgrad.errors import InvalidArgumentError, StateError
from sparkgrad.hvd import codec

if TYPE_CHECKING:  # loaded on first use by __getattr__ below (it imports sparkgrad.nn, which never imports hvd)
    from sparkgrad.nn.distributed import DistributedOptimizer

DEFAULT_TIMEOUT = 60.0  # seconds to form the communicator (env SPARKGRAD_COMM_TIMEOUT)

# reduction ops, as horovod spells them (the values are the Communicator's op names)
Average = "average"
"""``op=`` of `allreduce`: the elementwise mean over the ranks (the sum divided by `size()`); the default."""
Sum = "sum"
"""``op=`` of `allreduce`: the elementwise sum over the ranks."""
Min = "min"
"""``op=`` of `allreduce`: the elementwise minimum over the ranks."""
Max = "max"
"""``op=`` of `allreduce`: the elementwise maximum over the ranks."""
_OPS = (Average, Sum, Min, Max)


class _Compressor:
    """A wire compression for allreduce: ``.name`` ("none", "fp16", "bf16"); sums accumulate in fp32."""

    def __init__(self, name: str, wire: str | None) -> None:
        self.name = name
        self.wire = wire

    def __repr__(self) -> str:
        return f"Compression.{self.name}"


class Compression:
    """The wire compressions of `allreduce` and `DistributedOptimizer`, spelled as horovod spells them.

    A compressed allreduce sends float32 values as 16-bit floats between ranks and accumulates the
    sums in float32; it applies to float32 arrays only (other dtypes raise InvalidArgumentError).
    """

    none = _Compressor("none", None)
    """No compression: values travel as they are (the default)."""
    fp16 = _Compressor("fp16", "fp16")
    """IEEE half precision on the wire (5-bit exponent: values above 65504 overflow)."""
    bf16 = _Compressor("bf16", "bf16")
    """bfloat16 on the wire (float32's exponent range, 8 bits of mantissa)."""


def init(timeout: float | None = None) -> None:
    """Forms this process's communicator with every other rank (a collective: every rank calls it).

    Inside ranks started by `sparkgrad.run`, `HorovodRunner` or a `TFCluster.run(..., num_ps=0)`
    cluster it connects to the other ranks; in a plain process it forms a communicator of one rank.
    Calling it again is a no-op.

    Args:
        timeout: Seconds to wait for the other ranks to connect; default 60, or the environment
            variable ``SPARKGRAD_COMM_TIMEOUT``.

    Raises:
        StateError: On a node of a cluster with parameter servers (``num_ps > 0``), which has no
            allreduce communicator.
        SparkgradTimeout: Not every rank connected within ``timeout``.
    """
    handle = collective.handle_for_init()
    if timeout is None:
        timeout = float(os.environ.get("SPARKGRAD_COMM_TIMEOUT", DEFAULT_TIMEOUT))
    handle.open(float(timeout))


def shutdown() -> None:
    """Closes this process's communicator; init() may form a new one afterwards."""
    handle = collective.in_use()
    if handle is not None:
        handle.close()


def is_initialized() -> bool:
    """Whether `init()` formed this process's communicator (and `shutdown()` did not close it since)."""
    handle = collective.in_use()
    return handle is not None and handle.is_open


def _initialized() -> collective.CommSetup:
    handle = collective.in_use()
    if handle is None or not handle.is_open:
        raise StateError("sparkgrad.hvd is not initialized: call hvd.init() first (in every rank)")
    return handle.setup


def rank() -> int:
    """This process's rank, 0 to ``size() - 1`` (rank 0 is the one whose value ``HorovodRunner.run`` returns).

    Raises:
        StateError: `init()` was not called in this process.
    """
    return _initialized().rank


def size() -> int:
    """The number of ranks in the communicator (1 in a plain process).

    Raises:
        StateError: `init()` was not called in this process.
    """
    return _initialized().size


def local_rank() -> int:
    """This rank's index among the ranks on its host."""
    return _initialized().local_rank


def local_size() -> int:
    """How many ranks run on this rank's host."""
    return _initialized().local_size


def cross_rank() -> int:
    """This rank's host's index among the hosts that have a rank with this local_rank."""
    return _initialized().cross_rank


def cross_size() -> int:
    """How many hosts have a rank with this rank's local_rank."""
    return _initialized().cross_size


def communicator() -> Any:
    """The process's ``sparkgrad._core.Communicator``, which `init()` formed; the collectives here call it.

    Raises:
        StateError: `init()` was not called, or this build of sparkgrad has no collectives.
    """
    return collective.communicator()


def _array(value: Any, what: str) -> np.ndarray:
    arr = np.array(value, copy=True, order="C")
    if arr.dtype.hasobject:
        raise InvalidArgumentError(f"hvd.{what}: takes numeric arrays, got dtype {arr.dtype}")
    return arr


def allreduce(
    array: Any, op: str = Average, compression: _Compressor = Compression.none, name: str | None = None
) -> Any:
    """The elementwise reduction of ``array`` over every rank (a collective: every rank calls it).

    Args:
        array: A NumPy array or anything ``np.array`` takes; float32, float64, int32 or int64, the
            same shape and dtype on every rank. It is copied, never changed.
        op: `Average` (default), `Sum`, `Min` or `Max`.
        compression: ``Compression.none`` (default), ``Compression.fp16`` or ``Compression.bf16``
            (float32 arrays only).
        name: Accepted for horovod compatibility and unused.

    Returns:
        A new array of the same shape and dtype holding the reduction.

    Raises:
        InvalidArgumentError: An unknown ``op`` or ``compression``, a dtype other than the four
            above, or compression of a non-float32 array.
        StateError: `init()` was not called.
    """
    if op not in _OPS:
        raise InvalidArgumentError(f"hvd.allreduce: op must be one of hvd.Average, Sum, Min, Max, got {op!r}")
    if not isinstance(compression, _Compressor):
        raise InvalidArgumentError(
            f"hvd.allreduce: compression must be hvd.Compression.none/fp16/bf16, got {compression!r}"
        )
    arr = _array(array, "allreduce")
    return communicator().allreduce(arr, op=op, compression=compression.wire)


def allgather(array: Any, name: str | None = None) -> np.ndarray:
    """Every rank's ``array`` concatenated along axis 0, in rank order (a collective).

    Args:
        array: A numeric array; ranks may pass different first dimensions, but the dtype and the
            trailing dimensions must agree. A scalar counts as one row.
        name: Accepted for horovod compatibility and unused.

    Returns:
        A new array with the rows of rank 0, then rank 1, and so on.

    Raises:
        InvalidArgumentError: An object array, or ranks whose dtype or trailing shape differ.
    """
    arr = _array(array, "allgather")
    if arr.ndim == 0:
        arr = arr.reshape(1)
    return communicator().allgather(arr)


def broadcast(array: Any, root_rank: int, name: str | None = None) -> np.ndarray:
    """Rank ``root_rank``'s ``array`` on every rank (a collective).

    Args:
        array: A numeric array of the same shape and dtype on every rank (its values matter only on
            the root); it is copied, never changed.
        root_rank: The rank whose values every rank receives.
        name: Accepted for horovod compatibility and unused.

    Returns:
        A new array holding the root's values.
    """
    arr = _array(array, "broadcast")
    return communicator().broadcast(arr, root=int(root_rank))


def _inner_optimizer(obj: Any) -> Any:
    """The sparkgrad optimizer behind a model, a DistributedOptimizer or an optimizer."""
    opt = getattr(obj, "optimizer", None) if not hasattr(obj, "get_state") else obj
    while opt is not None and not hasattr(opt, "get_state") and hasattr(opt, "optimizer"):
        opt = opt.optimizer
    if opt is None or not hasattr(opt, "get_state"):
        raise InvalidArgumentError(
            f"hvd.broadcast_optimizer_state: {type(obj).__name__} has no optimizer state "
            "(pass a compiled model or its optimizer)"
        )
    return opt


def broadcast_parameters(model: Any, root_rank: int = 0) -> None:
    """Overwrites every rank's parameters with rank ``root_rank``'s, in place (a collective).

    Call it once after building the model, so every rank starts from the same weights.

    Args:
        model: A `sparkgrad.nn.Sequential` or `Model` (its flat ``params`` buffer, and its ``buffers`` of
            non-trainable state when it has BatchNormalization layers), a dict of NumPy arrays
            (broadcast in sorted key order) or a list of arrays; every array must be C-contiguous
            and writable.
        root_rank: The rank whose parameters every rank receives.

    Raises:
        InvalidArgumentError: ``model`` is none of these, or one of its arrays cannot be updated
            in place.
    """
    comm = communicator()
    if hasattr(model, "params") and isinstance(model.params, np.ndarray):
        comm.broadcast(model.params, root=int(root_rank))
        buffers = getattr(model, "buffers", None)
        if isinstance(buffers, np.ndarray) and buffers.size:  # the moving statistics start equal too
            comm.broadcast(buffers, root=int(root_rank))
        return
    if isinstance(model, dict):
        arrays = [model[k] for k in sorted(model)]
    elif isinstance(model, (list, tuple)):
        arrays = list(model)
    else:
        raise InvalidArgumentError(
            f"hvd.broadcast_parameters takes a sparkgrad model, a dict or a list of arrays, got {type(model).__name__}"
        )
    for i, arr in enumerate(arrays):
        if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous or not arr.flags.writeable:
            raise InvalidArgumentError(
                f"hvd.broadcast_parameters: item {i} is not a writable C-contiguous NumPy array (updated in place)"
            )
        comm.broadcast(arr, root=int(root_rank))


def broadcast_optimizer_state(optimizer_or_model: Any, root_rank: int = 0) -> None:
    """Gives every rank the optimizer state of rank ``root_rank``: its step count and slots such as Adam's moments.

    Args:
        optimizer_or_model: A compiled model, a `DistributedOptimizer` or a sparkgrad optimizer.
        root_rank: The rank whose state every rank receives.

    Raises:
        InvalidArgumentError: The object carries no optimizer state.
    """
    opt = _inner_optimizer(optimizer_or_model)
    steps, state = opt.get_state()
    steps, state = broadcast_object((int(steps), np.asarray(state)), root_rank)
    if rank() != int(root_rank) and (steps or state.size):
        opt.set_state(steps, state)


def broadcast_object(obj: Any = None, root_rank: int = 0) -> Any:
    """Rank ``root_rank``'s ``obj`` on every rank (a collective), sent through a tagged codec, never pickle.

    Args:
        obj: The value to send (only the root's matters): None, bool, int, float, str, bytes,
            NumPy arrays and scalars (not object dtype), and lists, tuples and dicts of these,
            nested at most 100 levels.
        root_rank: The rank whose value every rank receives.

    Returns:
        The root's value (on the root, ``obj`` itself).

    Raises:
        TypeError: ``obj`` holds a value of another type; the message says where it sits.
    """
    comm = communicator()
    root = int(root_rank)
    data = codec.encode(obj) if comm.rank == root else None
    out = comm.broadcast_bytes(data, root=root)
    return obj if comm.rank == root else codec.decode(out)


def allgather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj`` as a list in rank order (a collective); the same types as `broadcast_object`."""
    return [codec.decode(b) for b in communicator().allgather_bytes(codec.encode(obj))]


def barrier() -> None:
    """Blocks until every rank has called `barrier()`."""
    communicator().barrier()


def join() -> int:
    """A barrier for ranks that ran out of data; returns the rank that reached it last by wall clock.

    Unlike horovod's, it does not let the other ranks go on reducing without the ranks that
    joined: give every rank the same number of steps (see the module description).
    """
    arrived = allgather(np.array([time.time()], dtype=np.float64))
    return int(np.argmax(arrived))


def __getattr__(name: str) -> Any:
    if name == "DistributedOptimizer":
        try:
            module = importlib.import_module("sparkgrad.nn.distributed")
        except ImportError as exc:
            raise AttributeError(
                f"sparkgrad.hvd.DistributedOptimizer needs sparkgrad.nn.distributed, which this copy lacks ({exc})"
            ) from None
        return module.DistributedOptimizer
    if name == "callbacks":
        return importlib.import_module("sparkgrad.hvd.callbacks")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [  # in the order the API reference lists them
    "init",
    "shutdown",
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "cross_rank",
    "cross_size",
    "allreduce",
    "Average",
    "Sum",
    "Min",
    "Max",
    "Compression",
    "allgather",
    "broadcast",
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "broadcast_object",
    "allgather_object",
    "barrier",
    "join",
    "DistributedOptimizer",
    "communicator",
]
