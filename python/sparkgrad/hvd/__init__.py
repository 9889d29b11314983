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
"""

from __future__ import annotations

import importlib
import os
import secrets
import threading
import time
from typing import Any

import numpy as np

from sparkgrad.cluster import collective, security
from sparkgrad.cluster import rank as _rank
from sparkgrad.errors import InvalidArgumentError, StateError
from sparkgrad.hvd import codec

DEFAULT_TIMEOUT = 60.0  # seconds to form the communicator (env SPARKGRAD_COMM_TIMEOUT)

# reduction ops, as horovod spells them (the values are the Communicator's op names)
Average = "average"
Sum = "sum"
Min = "min"
Max = "max"
_OPS = (Average, Sum, Min, Max)


class _Compressor:
    """A wire compression for allreduce: ``.name`` ("none", "fp16", "bf16"); sums accumulate in fp32."""

    def __init__(self, name: str, wire: str | None) -> None:
        self.name = name
        self.wire = wire

    def __repr__(self) -> str:
        return f"Compression.{self.name}"


class Compression:
    """``Compression.none``, ``Compression.fp16``, ``Compression.bf16`` (horovod's spelling)."""

    none = _Compressor("none", None)
    fp16 = _Compressor("fp16", "fp16")
    bf16 = _Compressor("bf16", "bf16")


_solo_lock = threading.Lock()
_solo: collective.CommSetup | None = None  # a plain process's own one-rank setup


def _solo_setup() -> collective.CommSetup:
    global _solo
    with _solo_lock:
        if _solo is None:
            from sparkgrad import _core

            listener = _core.Listener("127.0.0.1", 0)
            _solo = collective.CommSetup(
                rank=0,
                size=1,
                local_rank=0,
                local_size=1,
                cross_rank=0,
                cross_size=1,
                addresses=(("127.0.0.1", listener.port),),
                listener=listener,
                secret=secrets.token_bytes(32),
                security=security.default(),
            )
        return _solo


def _setup() -> collective.CommSetup:
    setup = collective.current()
    if setup is not None:
        return setup
    launched = _rank.current()
    if launched.role != "local":  # a launcher set a rank, but this process has no communicator address
        raise StateError(
            f"hvd.init(): this {launched.role} node has no allreduce communicator: TFCluster opens one on the "
            "training nodes of a cluster without parameter servers (TFCluster.run(..., num_ps=0)); with "
            "num_ps > 0 train through the ps (TFNode.ps_client) instead, or run fn with sparkgrad.run / "
            "HorovodRunner"
        )
    return _solo_setup()


def init(timeout: float | None = None) -> None:
    """Forms this process's communicator with every other rank (a collective: every rank calls it).

    Calling it again is a no-op. ``timeout`` (s, default 60 or env
    SPARKGRAD_COMM_TIMEOUT) bounds the wait for the other ranks to connect.
    """
    setup = _setup()
    if setup.state.get("initialized"):
        return
    from sparkgrad import _core

    if timeout is None:
        timeout = float(os.environ.get("SPARKGRAD_COMM_TIMEOUT", DEFAULT_TIMEOUT))
    factory = getattr(_core, "Communicator", None)
    if factory is not None:
        setup.state["comm"] = factory(
            setup.listener, setup.secret, setup.rank, list(setup.addresses), float(timeout), security=setup.security
        )
    setup.state["initialized"] = True


def shutdown() -> None:
    """Closes this process's communicator; init() may form a new one afterwards."""
    setup = collective.current() or _solo
    if setup is not None:
        setup.release()


def is_initialized() -> bool:
    setup = collective.current() or _solo
    return setup is not None and bool(setup.state.get("initialized"))


def _initialized() -> collective.CommSetup:
    setup = collective.current() or _solo
    if setup is None or not setup.state.get("initialized"):
        raise StateError("sparkgrad.hvd is not initialized: call hvd.init() first (in every rank)")
    return setup


def rank() -> int:
    return _initialized().rank


def size() -> int:
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
    """The process's ``sparkgrad._core.Communicator`` (hvd.init() forms it)."""
    setup = _initialized()
    comm = setup.state.get("comm")
    if comm is None:
        raise StateError("this sparkgrad._core has no Communicator (built without the collectives): rebuild sparkgrad")
    return comm


def _array(value: Any, what: str) -> np.ndarray:
    arr = np.array(value, copy=True, order="C")
    if arr.dtype.hasobject:
        raise InvalidArgumentError(f"hvd.{what}: takes numeric arrays, got dtype {arr.dtype}")
    return arr


def allreduce(
    array: Any, op: str = Average, compression: _Compressor = Compression.none, name: str | None = None
) -> Any:
    """The elementwise reduction of ``array`` over every rank (a new array; ``name`` is accepted and unused)."""
    if op not in _OPS:
        raise InvalidArgumentError(f"hvd.allreduce: op must be one of hvd.Average, Sum, Min, Max, got {op!r}")
    if not isinstance(compression, _Compressor):
        raise InvalidArgumentError(
            f"hvd.allreduce: compression must be hvd.Compression.none/fp16/bf16, got {compression!r}"
        )
    arr = _array(array, "allreduce")
    return communicator().allreduce(arr, op=op, compression=compression.wire)


def allgather(array: Any, name: str | None = None) -> np.ndarray:
    """Every rank's ``array`` concatenated along axis 0 in rank order (first dimensions may differ)."""
    arr = _array(array, "allgather")
    if arr.ndim == 0:
        arr = arr.reshape(1)
    return communicator().allgather(arr)


def broadcast(array: Any, root_rank: int, name: str | None = None) -> np.ndarray:
    """Rank ``root_rank``'s ``array`` on every rank (a new array; shapes and dtypes must agree)."""
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
    """Overwrites every rank's parameters with rank ``root_rank``'s, in place.

    ``model``: a sparkgrad.nn.Sequential (its flat ``params`` buffer), a dict
    of NumPy arrays (by sorted key) or a list of arrays.
    """
    comm = communicator()
    if hasattr(model, "params") and isinstance(model.params, np.ndarray):
        comm.broadcast(model.params, root=int(root_rank))
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
    """Gives every rank rank ``root_rank``'s optimizer state (step count and slots such as Adam's moments)."""
    opt = _inner_optimizer(optimizer_or_model)
    steps, state = opt.get_state()
    steps, state = broadcast_object((int(steps), np.asarray(state)), root_rank)
    if rank() != int(root_rank) and (steps or state.size):
        opt.set_state(steps, state)


def broadcast_object(obj: Any = None, root_rank: int = 0) -> Any:
    """Rank ``root_rank``'s ``obj`` on every rank (see hvd.codec for the types it carries)."""
    comm = communicator()
    root = int(root_rank)
    data = codec.encode(obj) if comm.rank == root else None
    out = comm.broadcast_bytes(data, root=root)
    return obj if comm.rank == root else codec.decode(out)


def allgather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order."""
    return [codec.decode(b) for b in communicator().allgather_bytes(codec.encode(obj))]


def barrier() -> None:
    """Returns once every rank called barrier()."""
    communicator().barrier()


def join() -> int:
    """A barrier for ranks that ran out of data; returns the rank that reached it last (see the module doc)."""
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


__all__ = [
    "Average",
    "Compression",
    "DistributedOptimizer",
    "Max",
    "Min",
    "Sum",
    "allgather",
    "allgather_object",
    "allreduce",
    "barrier",
    "broadcast",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "communicator",
    "cross_rank",
    "cross_size",
    "init",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "rank",
    "shutdown",
    "size",
]
