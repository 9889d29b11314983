"""Horovod's torch API on sparkgrad's C ring: ``import sparkgrad.hvd.torch as hvd``.

A Horovod PyTorch program runs by changing its import (and starting its
ranks with ``sparkgrad.run`` instead of ``horovodrun``). The functions keep
Horovod's names, arguments and return values; what differs:

* Every collective of this module is queued to one background thread per
  process (a synchronous one with nothing pending runs on the calling
  thread) and runs on the ring in the order the ranks issue it (the ring
  needs the same collectives in the same order on every rank; Horovod's
  coordinator would reorder them by name). Before each one the ranks
  exchange a small descriptor: a rank whose collective, tensor name, dtype
  or shape differs fails on every rank with ClusterError naming each rank's
  call, instead of a hang (hvd/engine.py).
* Data: an in-place collective (``allreduce_``, ``broadcast_``) on a
  contiguous CPU tensor of float32, float64, int32 or int64 hands the
  tensor's own storage to the ring (no copy). ``allreduce`` copies once into
  its result, a grouped allreduce or a DistributedOptimizer bucket once into
  a fusion buffer. float16 and bfloat16 are reduced in float32 (a copy each
  way); other dtypes are refused by the reductions, naming the tensor
  (allgather and broadcast move any dtype). A CUDA tensor goes through host
  memory: copied to the CPU, reduced there, copied back.
* ``Compression.fp16`` / ``bf16`` are the ring's wire formats (values sum
  in float32); floating tensors of other dtypes are reduced through float32
  when compressed, integer tensors are sent as they are.
* ``op=Adasum`` is refused (InvalidArgumentError); ``process_set`` accepts
  only the global set (None or ``global_process_set``).
* ``allreduce`` (Average, Sum), ``allgather`` and ``broadcast`` are
  differentiable, as Horovod's: the backward of each is a collective too
  (named ``<name>.grad``), so every rank must run backward through the
  result. The in-place and async forms are not.
* ``broadcast_object`` / ``allgather_object`` move values through the
  tagged codec of sparkgrad.hvd (tensors included, returned on the CPU),
  never pickle: other types raise TypeError naming them.

``join()`` is Horovod's: a rank out of data calls it and keeps answering
the other ranks' collectives (zeros to allreduces, so an Average still
divides by ``size()``, as Horovod's does; no rows to allgathers) until
every rank has joined; it returns the rank that joined last.

Importing ``sparkgrad`` never imports torch; this module does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

try:
    import torch
except ImportError as exc:
    raise ImportError(f"sparkgrad.hvd.torch needs PyTorch >= 2.1: pip install 'sparkgrad[torch]' ({exc})") from exc
if not hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):  # DistributedOptimizer's hooks
    raise ImportError(f"sparkgrad.hvd.torch needs PyTorch 2.1 or later; this is torch {torch.__version__}")

from sparkgrad.cluster import collective
from sparkgrad.errors import InvalidArgumentError, StateError
from sparkgrad.hvd import (
    Average,
    Compression,
    Max,
    Min,
    Sum,
    codec,
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from sparkgrad.hvd import engine as _engine
from sparkgrad.hvd.engine import Desc, Op

Adasum = "adasum"
"""``op=`` as Horovod spells it; sparkgrad does not implement Adasum and refuses it."""

_DIRECT = (torch.float32, torch.float64, torch.int32, torch.int64)  # the ring reduces these in place
_VIA_FLOAT32 = (torch.float16, torch.bfloat16)  # reduced in float32
_TENSOR_TAG = "sparkgrad.hvd.torch.Tensor"  # how the object collectives carry a tensor through the codec


def _engine_now() -> _engine.Engine:
    handle = collective.in_use()
    if handle is None or not handle.is_open:
        raise StateError("sparkgrad.hvd.torch is not initialized: call hvd.init() first (in every rank)")
    return handle.companion("sparkgrad.hvd.torch", _engine.Engine)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor(value: Any, what: str, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise InvalidArgumentError(f"hvd.{what}: {name!r} must be a torch.Tensor, got {type(value).__name__}")
    if value.layout != torch.strided:
        raise InvalidArgumentError(
            f"hvd.{what}: tensor {name!r} on rank {rank()} is {value.layout} (dense tensors only)",
            collective=what, tensor=name,
        )  # fmt: skip
    return value


def _op_name(op: Any, average: bool | None, what: str) -> str:
    """The ring's op for Horovod's ``op`` / deprecated ``average``."""
    if op is None:
        op = Sum if average is False else Average
    elif average is not None:
        raise InvalidArgumentError(f"hvd.{what}: give op= or the deprecated average=, not both")
    if op == Adasum:
        raise InvalidArgumentError(f"hvd.{what}: op=Adasum is not supported by sparkgrad (use Average or Sum)")
    if op not in (Average, Sum, Min, Max):
        raise InvalidArgumentError(f"hvd.{what}: op must be hvd.Average, Sum, Min or Max, got {op!r}")
    return op


def _wire_compression(compression: Any, what: str) -> str:
    if compression is None:
        return ""
    if compression not in (Compression.none, Compression.fp16, Compression.bf16):
        raise InvalidArgumentError(
            f"hvd.{what}: compression must be hvd.Compression.none, fp16 or bf16, got {compression!r}"
        )
    return compression.wire or ""


class _GlobalProcessSet:
    """Every rank: the only process set sparkgrad has."""

    def __repr__(self) -> str:
        return "hvd.global_process_set"


global_process_set = _GlobalProcessSet()
"""The process set of every rank, Horovod's default ``process_set=``; the only one sparkgrad supports."""


def _process_set(process_set: Any, what: str) -> None:
    if process_set is not None and process_set is not global_process_set:
        raise InvalidArgumentError(f"hvd.{what}: process sets are not supported (only hvd.global_process_set)")


def nccl_built() -> bool:
    """False: the ring is sparkgrad's own TCP ring (no NCCL); CUDA tensors go through host memory."""
    return False


def mpi_built() -> bool:
    """False: sparkgrad starts and connects its ranks itself (no MPI)."""
    return False


def gloo_built() -> bool:
    """False: sparkgrad's ring is not Gloo."""
    return False


def cuda_built() -> bool:
    """False: the collectives run on the CPU (a CUDA tensor is copied to host memory and back)."""
    return False


def reduce_dtype(tensor: torch.Tensor, compression: str, what: str, name: str) -> torch.dtype:
    """The dtype the ring reduces ``tensor`` in; InvalidArgumentError naming the tensor when there is none."""
    if compression and tensor.is_floating_point():
        return torch.float32
    if tensor.dtype in _DIRECT:
        return tensor.dtype
    if tensor.dtype in _VIA_FLOAT32:
        return torch.float32
    raise InvalidArgumentError(
        f"hvd.{what}: tensor {name!r} on rank {rank()} has dtype {_dtype_name(tensor.dtype)}; the reductions take "
        "float32, float64, int32, int64, and float16 / bfloat16 (reduced in float32)",
        collective=what, tensor=name,
    )  # fmt: skip


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor's storage (bfloat16, which NumPy lacks, as int16)."""
    t = tensor.detach()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


def _from_numpy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    out = torch.from_numpy(array)
    return out.view(torch.bfloat16) if dtype == torch.bfloat16 else out


def _check_scale(tensor: torch.Tensor, prescale: float, postscale: float, what: str, name: str) -> None:
    if (prescale != 1.0 or postscale != 1.0) and not tensor.is_floating_point():
        raise InvalidArgumentError(f"hvd.{what}: prescale/postscale factors need a floating tensor ({name!r})")


# -- allreduce ------------------------------------------------------------------------------------------


def _allreduce(
    tensor: Any, name: Any, op: str, compression: str, prescale: float, postscale: float, inplace: bool, what: str
) -> tuple[Op, Any]:
    eng = _engine_now()
    name = eng.name("allreduce", name)
    tensor = _tensor(tensor, what, name)
    work = reduce_dtype(tensor, compression, what, name)
    _check_scale(tensor, prescale, postscale, what, name)
    direct = inplace and tensor.device.type == "cpu" and tensor.is_contiguous() and work == tensor.dtype
    if direct:
        buf = tensor.detach()  # the tensor's own storage
    else:
        buf = tensor.detach().to(device="cpu", dtype=work, memory_format=torch.contiguous_format, copy=True)
    if prescale != 1.0:
        buf.mul_(prescale)
    array = buf.numpy()
    desc = Desc(_engine.ALLREDUCE, name, _dtype_name(tensor.dtype), str(array.dtype), tuple(tensor.shape), op=op,
                compression=compression if work == torch.float32 else "")  # fmt: skip

    def finish(_: Any) -> torch.Tensor:
        if postscale != 1.0:
            buf.mul_(postscale)
        if not inplace:
            return buf.to(device=tensor.device, dtype=tensor.dtype)
        if not direct:
            with torch.no_grad():
                tensor.copy_(buf.view(tensor.shape))
        return tensor

    return Op(desc, array=array), finish


def allreduce_async(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: str | None = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None,
    compression: Any = Compression.none,
) -> int:  # fmt: skip
    """Starts an allreduce of ``tensor`` and returns a handle for `synchronize` (which returns a new tensor)."""
    _process_set(process_set, "allreduce_async")
    op = _op_name(op, average, "allreduce_async")
    comp = _wire_compression(compression, "allreduce_async")
    work, finish = _allreduce(tensor, name, op, comp, prescale_factor, postscale_factor, False, "allreduce_async")
    eng = _engine_now()
    return eng.handle(eng.submit(work), finish)


def allreduce(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None, compression: Any = Compression.none,
    op: str | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None,
) -> torch.Tensor:  # fmt: skip
    """The reduction of ``tensor`` over every rank, as a new tensor of its dtype and device (a collective).

    Args:
        tensor: The same name, dtype and shape on every rank: float32, float64, int32, int64,
            float16 or bfloat16 (the last two reduced in float32).
        average: Deprecated Horovod spelling of ``op`` (True: Average, False: Sum).
        name: The name every rank gives this collective; default an automatic one.
        compression: ``Compression.none``, ``fp16`` or ``bf16`` on the wire.
        op: ``Average`` (default), ``Sum``, ``Min`` or ``Max``; ``Adasum`` is refused.
        prescale_factor: Multiplies ``tensor`` before the reduction.
        postscale_factor: Multiplies the result.
        process_set: Only the global set (None).

    Raises:
        InvalidArgumentError: A dtype the ring cannot reduce, an unknown op or compression.
        ClusterError: The ranks called different collectives or tensors (every rank fails).
    """
    _process_set(process_set, "allreduce")
    op = _op_name(op, average, "allreduce")
    comp = _wire_compression(compression, "allreduce")
    if op in (Average, Sum) and _differentiable(tensor):
        name = _engine_now().name("allreduce", name)
        return _AllreduceFunction.apply(tensor, name, op, comp, prescale_factor, postscale_factor)
    work, finish = _allreduce(tensor, name, op, comp, prescale_factor, postscale_factor, False, "allreduce")
    return finish(_engine_now().run(work))


def allreduce_async_(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: str | None = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None,
) -> int:  # fmt: skip
    """Starts an in-place allreduce of ``tensor``; `synchronize` returns ``tensor`` once it holds the result."""
    _process_set(process_set, "allreduce_async_")
    op = _op_name(op, average, "allreduce_async_")
    work, finish = _allreduce(tensor, name, op, "", prescale_factor, postscale_factor, True, "allreduce_async_")
    eng = _engine_now()
    return eng.handle(eng.submit(work), finish)


def allreduce_(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: str | None = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None,
) -> torch.Tensor:  # fmt: skip
    """`allreduce` in place: a contiguous CPU float32/float64/int32/int64 tensor is reduced in its own storage."""
    _process_set(process_set, "allreduce_")
    op = _op_name(op, average, "allreduce_")
    work, finish = _allreduce(tensor, name, op, "", prescale_factor, postscale_factor, True, "allreduce_")
    return finish(_engine_now().run(work))


def fuse(
    tensors: Sequence[torch.Tensor], names: Sequence[str], name: str, op: str, compression: str, prescale: float,
    what: str, buffer: torch.Tensor | None = None,
) -> tuple[Op, torch.Tensor]:  # fmt: skip
    """One allreduce of ``tensors`` (one reduce dtype) through a flat fusion buffer, each copied into it once.

    ``buffer`` (reused across calls by DistributedOptimizer) must have the total size and the reduce dtype.
    """
    work = reduce_dtype(tensors[0], compression, what, names[0])
    total = sum(t.numel() for t in tensors)
    if buffer is None:
        buffer = torch.empty(total, dtype=work)
    offset = 0
    for t in tensors:
        n = t.numel()
        buffer[offset : offset + n].copy_(t.detach().reshape(-1))
        offset += n
    if prescale != 1.0:
        buffer.mul_(prescale)
    array = buffer.numpy()
    desc = Desc(_engine.ALLREDUCE, name, _dtype_name(work), str(array.dtype), (total,), op=op,
                compression=compression if work == torch.float32 else "", names=tuple(names))  # fmt: skip
    return Op(desc, array=array), buffer


def unfuse(buffer: torch.Tensor, outputs: Sequence[torch.Tensor], postscale: float) -> None:
    """Copies a reduced fusion buffer back into ``outputs`` (in the order `fuse` took them), scaled."""
    if postscale != 1.0:
        buffer.mul_(postscale)
    offset = 0
    with torch.no_grad():
        for t in outputs:
            n = t.numel()
            t.copy_(buffer[offset : offset + n].view(t.shape))
            offset += n


def _grouped(
    tensors: Sequence[torch.Tensor], name: Any, op: str, compression: str, prescale: float, postscale: float,
    inplace: bool, what: str,
) -> tuple[list[Op], Any]:  # fmt: skip
    eng = _engine_now()
    base = eng.name("grouped_allreduce", name)
    tensors = [_tensor(t, what, f"{base}.{i}") for i, t in enumerate(tensors)]
    if not tensors:
        raise InvalidArgumentError(f"hvd.{what}: takes a non-empty list of tensors")
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(reduce_dtype(t, compression, what, f"{base}.{i}"), []).append(i)
        _check_scale(t, prescale, postscale, what, f"{base}.{i}")
    ops, parts = [], []
    for k, idx in enumerate(by_dtype.values()):
        names = [f"{base}.{i}" for i in idx]
        work, buffer = fuse([tensors[i] for i in idx], names, f"{base}#{k}", op, compression, prescale, what)
        ops.append(work)
        parts.append((idx, buffer))

    def finish(_: Any) -> list[torch.Tensor]:
        outputs = list(tensors) if inplace else [torch.empty_like(t) for t in tensors]
        for idx, buffer in parts:
            unfuse(buffer, [outputs[i] for i in idx], postscale)
        return outputs

    return ops, finish


def grouped_allreduce(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    compression: Any = Compression.none, op: str | None = None, prescale_factor: float = 1.0,
    postscale_factor: float = 1.0, process_set: Any = None,
) -> list[torch.Tensor]:  # fmt: skip
    """The reductions of ``tensors`` as new tensors, fused: one collective per reduce dtype (a collective)."""
    _process_set(process_set, "grouped_allreduce")
    op = _op_name(op, average, "grouped_allreduce")
    comp = _wire_compression(compression, "grouped_allreduce")
    ops, finish = _grouped(tensors, name, op, comp, prescale_factor, postscale_factor, False, "grouped_allreduce")
    eng = _engine_now()
    for work in [eng.submit(w) for w in ops]:
        work.wait()
    return finish(None)


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None, op: str | None = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None,
) -> list[torch.Tensor]:  # fmt: skip
    """`grouped_allreduce` in place: each tensor receives its reduction."""
    _process_set(process_set, "grouped_allreduce_")
    op = _op_name(op, average, "grouped_allreduce_")
    ops, finish = _grouped(tensors, name, op, "", prescale_factor, postscale_factor, True, "grouped_allreduce_")
    eng = _engine_now()
    for work in [eng.submit(w) for w in ops]:
        work.wait()
    return finish(None)


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    compression: Any = Compression.none, op: str | None = None, prescale_factor: float = 1.0,
    postscale_factor: float = 1.0, process_set: Any = None,
) -> int:  # fmt: skip
    """Starts a `grouped_allreduce`; `synchronize` returns the list of new tensors."""
    _process_set(process_set, "grouped_allreduce_async")
    op = _op_name(op, average, "grouped_allreduce_async")
    comp = _wire_compression(compression, "grouped_allreduce_async")
    ops, finish = _grouped(tensors, name, op, comp, prescale_factor, postscale_factor, False, "grouped_allreduce_async")
    return _grouped_handle(ops, finish)


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None, op: str | None = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None,
) -> int:  # fmt: skip
    """Starts a `grouped_allreduce_`; `synchronize` returns the tensors once they hold their reductions."""
    _process_set(process_set, "grouped_allreduce_async_")
    op = _op_name(op, average, "grouped_allreduce_async_")
    ops, finish = _grouped(tensors, name, op, "", prescale_factor, postscale_factor, True, "grouped_allreduce_async_")
    return _grouped_handle(ops, finish)


def _grouped_handle(ops: list[Op], finish: Any) -> int:
    eng = _engine_now()
    submitted = [eng.submit(w) for w in ops]
    last = submitted[-1]  # the queue runs in order: once the last is done, all are

    def finish_all(_: Any) -> list[torch.Tensor]:
        for w in submitted:
            w.wait()
        return finish(None)

    return eng.handle(last, finish_all)


def poll(handle: int) -> bool:
    """Whether the async collective of ``handle`` finished (`synchronize` will not block)."""
    return _engine_now().poll(handle)


def synchronize(handle: int) -> Any:
    """Waits for the async collective of ``handle`` and returns its result; raises its error."""
    return _engine_now().synchronize(handle)


# -- allgather, broadcast, alltoall ------------------------------------------------------------------------


def _allgather(tensor: Any, name: Any, what: str) -> tuple[Op, Any]:
    eng = _engine_now()
    name = eng.name("allgather", name)
    tensor = _tensor(tensor, what, name)
    rows = tensor.detach().to("cpu").contiguous()
    rows = rows.reshape(1) if rows.dim() == 0 else rows
    array = _numpy(rows)
    desc = Desc(_engine.ALLGATHER, name, _dtype_name(tensor.dtype), str(array.dtype), tuple(rows.shape))

    def finish(result: np.ndarray) -> torch.Tensor:
        return _from_numpy(result, tensor.dtype).to(tensor.device)

    return Op(desc, array=array), finish


def allgather(tensor: torch.Tensor, name: str | None = None, process_set: Any = None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dimension 0 in rank order (first dimensions may differ)."""
    _process_set(process_set, "allgather")
    if _differentiable(tensor):
        return _AllgatherFunction.apply(tensor, _engine_now().name("allgather", name))
    work, finish = _allgather(tensor, name, "allgather")
    return finish(_engine_now().run(work))


def allgather_async(tensor: torch.Tensor, name: str | None = None, process_set: Any = None) -> int:
    """Starts an `allgather`; `synchronize` returns the gathered tensor."""
    _process_set(process_set, "allgather_async")
    work, finish = _allgather(tensor, name, "allgather_async")
    eng = _engine_now()
    return eng.handle(eng.submit(work), finish)


def _broadcast(tensor: Any, root_rank: int, name: Any, inplace: bool, what: str) -> tuple[Op, Any]:
    eng = _engine_now()
    name = eng.name("broadcast", name)
    tensor = _tensor(tensor, what, name)
    root = int(root_rank)
    if not 0 <= root < eng.size:
        raise InvalidArgumentError(f"hvd.{what}: root_rank {root} is not a rank of {eng.size}")
    direct = inplace and tensor.device.type == "cpu" and tensor.is_contiguous()
    buf = tensor.detach() if direct else tensor.detach().to("cpu", memory_format=torch.contiguous_format, copy=True)
    array = _numpy(buf)
    desc = Desc(_engine.BROADCAST, name, _dtype_name(tensor.dtype), str(array.dtype), tuple(tensor.shape), root=root)

    def finish(_: Any) -> torch.Tensor:
        if not inplace:
            return buf.to(tensor.device)
        if not direct:
            with torch.no_grad():
                tensor.copy_(buf)
        return tensor

    return Op(desc, array=array), finish


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None) -> torch.Tensor:
    """Rank ``root_rank``'s ``tensor`` on every rank, as a new tensor (same name, dtype and shape on every rank)."""
    _process_set(process_set, "broadcast")
    if _differentiable(tensor):
        return _BroadcastFunction.apply(tensor, int(root_rank), _engine_now().name("broadcast", name))
    work, finish = _broadcast(tensor, root_rank, name, False, "broadcast")
    return finish(_engine_now().run(work))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None) -> torch.Tensor:
    """`broadcast` in place: a contiguous CPU tensor receives the root's values in its own storage."""
    _process_set(process_set, "broadcast_")
    work, finish = _broadcast(tensor, root_rank, name, True, "broadcast_")
    return finish(_engine_now().run(work))


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None) -> int:
    """Starts a `broadcast`; `synchronize` returns the new tensor."""
    _process_set(process_set, "broadcast_async")
    work, finish = _broadcast(tensor, root_rank, name, False, "broadcast_async")
    eng = _engine_now()
    return eng.handle(eng.submit(work), finish)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None) -> int:
    """Starts a `broadcast_`; `synchronize` returns ``tensor``."""
    _process_set(process_set, "broadcast_async_")
    work, finish = _broadcast(tensor, root_rank, name, True, "broadcast_async_")
    eng = _engine_now()
    return eng.handle(eng.submit(work), finish)


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None, process_set: Any = None) -> Any:
    """Sends rows of ``tensor`` to each rank and returns the rows every rank sent to this one, in rank order.

    ``splits[i]`` rows (along dimension 0, in order) go to rank i; without ``splits`` the rows are cut
    into ``size()`` equal blocks. Built on the ring's allgather: every rank receives the rows every
    other rank sends away and keeps its blocks, so with n ranks it moves n - 1 times the bytes of a
    direct alltoall (the same bytes at 2 ranks).

    Returns:
        The received tensor; with ``splits`` given, ``(tensor, received_splits)`` where
        ``received_splits`` (int32) counts the rows from each rank.
    """
    _process_set(process_set, "alltoall")
    eng = _engine_now()
    name = eng.name("alltoall", name)
    tensor = _tensor(tensor, "alltoall", name)
    if tensor.dim() == 0:
        raise InvalidArgumentError(f"hvd.alltoall: tensor {name!r} needs at least one dimension")
    rows = int(tensor.shape[0])
    if splits is None:
        if rows % eng.size:
            raise InvalidArgumentError(
                f"hvd.alltoall: tensor {name!r} has {rows} rows, not divisible by {eng.size} ranks; give splits"
            )
        cut = [rows // eng.size] * eng.size
    else:
        cut = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
        if len(cut) != eng.size or min(cut) < 0 or sum(cut) != rows:
            raise InvalidArgumentError(
                f"hvd.alltoall: splits of {name!r} must be {eng.size} non-negative counts summing to its {rows} "
                f"rows, got {cut}"
            )
    data = tensor.detach().to("cpu").contiguous()
    array = _numpy(data)
    desc = Desc(_engine.ALLTOALL, name, _dtype_name(tensor.dtype), str(array.dtype), tuple(tensor.shape),
                splits=tuple(cut))  # fmt: skip
    got, received = eng.run(Op(desc, array=array))
    out = _from_numpy(got, tensor.dtype).to(tensor.device)
    return out if splits is None else (out, torch.tensor(received, dtype=torch.int32))


# -- gradients through allreduce, allgather and broadcast ------------------------------------------------------
#
# Each backward is a collective too (named "<name>.grad"): every rank must run backward through the result.


def _differentiable(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled()


class _AllreduceFunction(torch.autograd.Function):
    """allreduce with a gradient: the same allreduce of the output's gradient (a sum's or mean's derivative)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str, op: str, comp: str, pre: float, post: float) -> Any:
        ctx.args = (name, op, comp, pre, post)
        work, finish = _allreduce(tensor, name, op, comp, pre, post, False, "allreduce")
        return finish(_engine_now().run(work))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        name, op, comp, pre, post = ctx.args
        work, finish = _allreduce(grad.contiguous(), f"{name}.grad", op, comp, pre, post, False, "allreduce")
        return finish(_engine_now().run(work)), None, None, None, None, None


class _AllgatherFunction(torch.autograd.Function):
    """allgather with a gradient: the sum over the ranks of the output's gradient, at this rank's rows."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str) -> Any:
        ctx.name, ctx.rows = name, int(tensor.shape[0]) if tensor.dim() else 1
        ctx.scalar = tensor.dim() == 0
        work, finish = _allgather(tensor, name, "allgather")
        return finish(_engine_now().run(work))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        eng = _engine_now()
        work, finish = _allreduce(grad.contiguous(), f"{ctx.name}.grad", Sum, "", 1.0, 1.0, False, "allgather")
        summed = finish(eng.run(work))
        work, finish = _allgather(torch.tensor([ctx.rows]), f"{ctx.name}.grad.rows", "allgather")
        rows = finish(eng.run(work)).tolist()
        mine = summed.narrow(0, sum(rows[: eng.rank]), ctx.rows)
        return (mine.reshape(()) if ctx.scalar else mine), None


class _BroadcastFunction(torch.autograd.Function):
    """broadcast with a gradient: on the root, the sum over the ranks of the output's gradient; zeros elsewhere."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root: int, name: str) -> Any:
        ctx.root, ctx.name = root, name
        work, finish = _broadcast(tensor, root, name, False, "broadcast")
        return finish(_engine_now().run(work))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        eng = _engine_now()
        work, finish = _allreduce(grad.contiguous(), f"{ctx.name}.grad", Sum, "", 1.0, 1.0, False, "broadcast")
        summed = finish(eng.run(work))
        return (summed if eng.rank == ctx.root else torch.zeros_like(summed)), None, None


# -- objects, barrier, join ---------------------------------------------------------------------------------


def _to_plain(obj: Any) -> Any:
    """``obj`` with every tensor replaced by a tagged tuple of NumPy values the codec carries."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        return (_TENSOR_TAG, _dtype_name(t.dtype), _numpy(t).copy())
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_plain(v) for v in obj)
    return obj


def _from_plain(obj: Any) -> Any:
    if isinstance(obj, tuple) and len(obj) == 3 and obj[0] == _TENSOR_TAG:
        return _from_numpy(np.ascontiguousarray(obj[2]), getattr(torch, obj[1]))
    if isinstance(obj, dict):
        return {k: _from_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_from_plain(v) for v in obj)
    return obj


def broadcast_object(obj: Any = None, root_rank: int = 0, name: str | None = None, process_set: Any = None) -> Any:
    """Rank ``root_rank``'s ``obj`` on every rank, through sparkgrad.hvd's codec (never pickle).

    ``obj`` may hold what `sparkgrad.hvd.broadcast_object` takes and torch tensors (they arrive on the CPU).
    """
    _process_set(process_set, "broadcast_object")
    eng = _engine_now()
    root = int(root_rank)
    data = codec.encode(_to_plain(obj)) if eng.rank == root else None
    desc = Desc(_engine.BROADCAST_OBJECT, eng.name("broadcast_object", name), root=root)
    out = eng.run(Op(desc, data=data))
    return obj if eng.rank == root else _from_plain(codec.decode(out))


def allgather_object(obj: Any, name: str | None = None, process_set: Any = None) -> list[Any]:
    """Every rank's ``obj`` as a list in rank order (the types of `broadcast_object`)."""
    _process_set(process_set, "allgather_object")
    eng = _engine_now()
    desc = Desc(_engine.ALLGATHER_OBJECT, eng.name("allgather_object", name))
    got = eng.run(Op(desc, data=codec.encode(_to_plain(obj))))
    return [_from_plain(codec.decode(b)) for b in got]


def barrier(process_set: Any = None) -> None:
    """Blocks until every rank reached it (after this rank's pending collectives)."""
    _process_set(process_set, "barrier")
    eng = _engine_now()
    eng.run(Op(Desc(_engine.BARRIER, eng.name("barrier", None))))


def join(device: int = -1) -> int:
    """Tells the others this rank is out of data; returns the rank that joined last, once every rank has.

    Until then this rank takes part in the others' collectives: zeros to their allreduces (an
    Average still divides by `size()`), no rows to allgathers and alltoalls, and it receives
    broadcasts. A Min or Max allreduce, a broadcast from a joined root and allgather_object fail
    on the ranks that called them. ``device`` is accepted for Horovod compatibility and unused.
    """
    return int(_engine_now().run(Op(Desc(_engine.JOIN, "join"))))


# -- parameters and optimizer state ---------------------------------------------------------------------------


def _named_tensors(params: Any, what: str) -> list[tuple[str, torch.Tensor]]:
    if isinstance(params, dict):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    elif isinstance(params, Iterable):
        items = [p if isinstance(p, tuple) else (f"param.{i}", p) for i, p in enumerate(params)]
    else:
        raise InvalidArgumentError(f"hvd.{what}: takes a state_dict, named_parameters() or a list of tensors")
    for key, value in items:
        if not isinstance(value, torch.Tensor):
            raise InvalidArgumentError(
                f"hvd.{what}: {key!r} is a {type(value).__name__}, not a tensor (use broadcast_object for it)"
            )
    return [(str(k), v) for k, v in items]


def broadcast_parameters(params: Any, root_rank: int = 0) -> None:
    """Overwrites every rank's tensors with rank ``root_rank``'s, in place (a collective).

    Args:
        params: A ``state_dict()`` (broadcast in sorted key order), ``named_parameters()``, or a list of
            tensors; the same names, dtypes and shapes on every rank.
        root_rank: The rank whose values every rank receives.

    The tensors travel as one broadcast of their bytes (one copy into a buffer and one back).
    """
    items = _named_tensors(params, "broadcast_parameters")
    if not items:
        return
    eng = _engine_now()
    flats = [t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8) for _, t in items]
    buf = torch.cat(flats)
    names = tuple(f"{k}:{_dtype_name(t.dtype)}{list(t.shape)}" for k, t in items)
    desc = Desc(_engine.BROADCAST, "broadcast_parameters", "uint8", "uint8", tuple(buf.shape), root=int(root_rank),
                names=names)  # fmt: skip
    eng.run(Op(desc, array=buf.numpy()))
    offset = 0
    with torch.no_grad():
        for (_, t), flat in zip(items, flats, strict=True):
            n = flat.numel()
            t.copy_(buf[offset : offset + n].view(t.dtype).view(t.shape))
            offset += n


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Gives every rank rank ``root_rank``'s optimizer state (its ``state_dict()``: slots, steps, learning rates)."""
    state = broadcast_object(optimizer.state_dict() if rank() == int(root_rank) else None, root_rank)
    if rank() != int(root_rank):
        try:
            optimizer.load_state_dict(state)
        except (ValueError, KeyError) as exc:
            raise InvalidArgumentError(
                f"hvd.broadcast_optimizer_state: rank {rank()}'s optimizer does not match rank {root_rank}'s: {exc}"
            ) from exc


def descriptor_seconds() -> float:
    """Seconds this process spent exchanging the descriptors that check the ranks agree (a cost measure)."""
    return _engine_now().descriptor_seconds


from sparkgrad.hvd.torch.optimizer import DistributedOptimizer  # noqa: E402 - it uses the functions above

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
    "Average", "Sum", "Min", "Max", "Adasum", "Compression",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather", "allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall",
    "poll", "synchronize", "broadcast_object", "allgather_object", "barrier", "join",
    "broadcast_parameters", "broadcast_optimizer_state", "DistributedOptimizer", "descriptor_seconds",
    "global_process_set", "nccl_built", "mpi_built", "gloo_built", "cuda_built",
]  # fmt: skip
