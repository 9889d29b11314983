"""``hvd.DistributedOptimizer`` for torch: gradients reduced by hooks as backward produces them, in fused buckets.

Each parameter gets a post-accumulate-grad hook (torch >= 2.1). When a
parameter's gradient is final for the step (its ``backward_passes_per_step``-th
accumulation), the hook adds it to the open bucket of its reduce dtype. A
bucket is copied once into its fusion buffer and queued to the background
thread, which reduces it on the C ring while backward goes on, as soon as
it holds the bucket size: 1 MiB for the step's first bucket, 25 MiB for the
later ones (PyTorch DDP's sizes), never more than the fusion threshold
(``HOROVOD_FUSION_THRESHOLD`` bytes, default 64 MiB; 0 reduces every
gradient alone). Horovod launches whatever is ready every cycle
(``HOROVOD_CYCLE_TIME``, 1 ms) after its coordinator has negotiated which
tensors every rank has; sparkgrad has no coordinator (ranks must issue the
same collectives in the same order), so its buckets close at sizes every
rank computes alike, which gives the same overlap without a negotiation
per cycle. A group (``groups=``) is one bucket, queued once all its
gradients are ready. ``synchronize()`` gives the parameters whose hook did
not fire a zero gradient (as Horovod's does, so every rank reduces the
same tensors), queues the open buckets, waits, and copies the results back
into ``p.grad``; ``step()`` synchronizes and steps the wrapped optimizer's
class.

Buckets are formed in the order the hooks fire, which is the same on every
rank running the same model; the descriptor check of hvd/engine.py names
both ranks' buckets if not.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch

from sparkgrad.errors import InvalidArgumentError, StateError
from sparkgrad.hvd import Average, Compression, Sum
from sparkgrad.hvd import torch as _hvd

DEFAULT_FUSION_THRESHOLD = 64 * 1024 * 1024  # bytes, Horovod's default before 0.21 (128 MiB since)
FIRST_BUCKET_BYTES = 1024 * 1024  # a step's first bucket: small, so the ring starts early in backward (DDP's)
BUCKET_BYTES = 25 * 1024 * 1024  # the later ones (DDP's bucket_cap_mb=25)


def fusion_threshold() -> int:
    """The bucket size in bytes: ``HOROVOD_FUSION_THRESHOLD``, else 64 MiB."""
    raw = os.environ.get("HOROVOD_FUSION_THRESHOLD", "")
    try:
        value = int(raw) if raw else DEFAULT_FUSION_THRESHOLD
    except ValueError:
        raise InvalidArgumentError(f"HOROVOD_FUSION_THRESHOLD must be a number of bytes, got {raw!r}") from None
    if value < 0:
        raise InvalidArgumentError(f"HOROVOD_FUSION_THRESHOLD must be >= 0, got {value}")
    return value


class _Distributed:
    """The methods a DistributedOptimizer adds in front of the wrapped optimizer's class."""

    def __init__(
        self, params: Any, named_parameters: Any, compression: Any, backward_passes_per_step: int, op: str,
        gradient_predivide_factor: float, groups: Any, sparse_as_dense: bool,
    ) -> None:  # fmt: skip
        if not hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
            raise StateError(
                f"hvd.DistributedOptimizer needs torch 2.1 or later (its gradient hooks); this is torch "
                f"{torch.__version__}: pip install 'torch>=2.1'"
            )
        super().__init__(params)  # type: ignore[call-arg]  # the wrapped optimizer's class, on its param groups
        self._rank = _hvd.rank()
        self._compression = _hvd._wire_compression(compression, "DistributedOptimizer")
        if op == _hvd.Adasum:
            raise InvalidArgumentError("hvd.DistributedOptimizer: op=Adasum is not supported by sparkgrad")
        if op not in (Average, Sum):
            raise InvalidArgumentError(f"hvd.DistributedOptimizer: op must be hvd.Average or hvd.Sum, got {op!r}")
        if not gradient_predivide_factor > 0:
            raise InvalidArgumentError(
                f"hvd.DistributedOptimizer: gradient_predivide_factor must be > 0, got {gradient_predivide_factor}"
            )
        if gradient_predivide_factor != 1.0 and op != Average:
            raise InvalidArgumentError("hvd.DistributedOptimizer: gradient_predivide_factor needs op=Average")
        self._op = op
        self._prescale = 1.0 / gradient_predivide_factor
        self._postscale = float(gradient_predivide_factor)
        self._sparse_as_dense = sparse_as_dense
        self._threshold = fusion_threshold()
        self._params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]  # type: ignore[attr-defined]
        self._names = self._name_params(named_parameters)
        self._groups, self._group_of = self._make_groups(groups)
        self.set_backward_passes_per_step(backward_passes_per_step)
        self._buffers: dict[tuple[str, ...], torch.Tensor] = {}  # fusion buffers by bucket, reused every step
        self._should_synchronize = True
        self._lock = threading.RLock()  # hooks may fire on autograd's device threads (CUDA)
        self._reset()
        self._hook_handles = [p.register_post_accumulate_grad_hook(self._hook) for p in self._params]

    # -- set-up ------------------------------------------------------------------------------------------

    def _name_params(self, named_parameters: Any) -> dict[torch.Tensor, str]:
        if named_parameters is None:
            return {p: f"param.{i}" for i, p in enumerate(self._params)}
        named = list(named_parameters)
        if any(not (isinstance(x, tuple) and len(x) == 2) for x in named):
            raise InvalidArgumentError("hvd.DistributedOptimizer: named_parameters must be (name, tensor) pairs")
        names: dict[torch.Tensor, str] = {}
        seen: set[str] = set()
        for name, p in named:
            if name in seen:
                raise InvalidArgumentError(f"hvd.DistributedOptimizer: named_parameters names {name!r} twice")
            seen.add(name)
            names[p] = str(name)
        for g, group in enumerate(self.param_groups):  # type: ignore[attr-defined]
            for i, p in enumerate(group["params"]):
                if p.requires_grad and p not in names:
                    raise InvalidArgumentError(
                        f"hvd.DistributedOptimizer on rank {self._rank}: the optimizer's parameter "
                        f"param_groups[{g}]['params'][{i}] ({_hvd._dtype_name(p.dtype)}{list(p.shape)}) is missing "
                        "from named_parameters, so its gradient's allreduce would have no name; pass "
                        "model.named_parameters() of the model the optimizer trains",
                        collective="allreduce", tensor=f"param_groups[{g}]['params'][{i}]", rank=self._rank,
                    )  # fmt: skip
        return names

    def _make_groups(self, groups: Any) -> tuple[list[list[torch.Tensor]], dict[torch.Tensor, int]]:
        if groups is None or groups == 0:
            return [], {}
        if isinstance(groups, int):
            if groups < 0:
                raise InvalidArgumentError(f"hvd.DistributedOptimizer: groups must be >= 0, got {groups}")
            n = min(groups, len(self._params))
            made = [self._params[i * len(self._params) // n : (i + 1) * len(self._params) // n] for i in range(n)]
        else:
            made = [list(g) for g in groups]
        group_of: dict[torch.Tensor, int] = {}
        for k, group in enumerate(made):
            for p in group:
                if p not in self._names:
                    raise InvalidArgumentError(
                        f"hvd.DistributedOptimizer: groups[{k}] holds a tensor the optimizer does not train"
                    )
                if p in group_of:
                    raise InvalidArgumentError(f"hvd.DistributedOptimizer: {self._names[p]!r} is in two groups")
                group_of[p] = k
        return made, group_of

    def set_backward_passes_per_step(self, passes: int) -> None:
        """How many backward passes accumulate locally (autograd sums them) before the gradients are reduced."""
        if int(passes) < 1:
            raise InvalidArgumentError(f"hvd.DistributedOptimizer: backward_passes_per_step must be >= 1, got {passes}")
        self.backward_passes_per_step = int(passes)
        self._delay = dict.fromkeys(self._params, self.backward_passes_per_step)

    def _reset(self) -> None:
        self._delay = dict.fromkeys(self._params, self.backward_passes_per_step)
        self._ready: set[torch.Tensor] = set()
        self._group_ready: dict[int, set[torch.Tensor]] = {}
        self._open: dict[torch.dtype, list[torch.Tensor]] = {}  # by reduce dtype, in order of opening
        self._open_bytes: dict[torch.dtype, int] = {}
        self._pending: list[tuple[list[torch.Tensor], torch.Tensor, Any]] = []

    # -- backward's side -----------------------------------------------------------------------------------

    def _hook(self, p: torch.Tensor) -> None:
        if p.grad is not None and p.grad.layout != torch.strided:
            if not self._sparse_as_dense:
                raise InvalidArgumentError(
                    f"hvd.DistributedOptimizer: the gradient of {self._names[p]!r} is {p.grad.layout}; pass "
                    "sparse_as_dense=True to reduce it as a dense tensor"
                )
            p.grad = p.grad.to_dense()
        self._delay[p] -= 1
        if self._delay[p] < 0:
            raise StateError(
                f"hvd.DistributedOptimizer: the gradient of {self._names[p]!r} was computed more than "
                f"backward_passes_per_step={self.backward_passes_per_step} times before step(); raise "
                "backward_passes_per_step to accumulate more passes"
            )
        if self._delay[p] == 0:
            with self._lock:
                self._make_ready(p)

    def _make_ready(self, p: torch.Tensor) -> None:
        self._ready.add(p)
        k = self._group_of.get(p)
        if k is not None:
            ready = self._group_ready.setdefault(k, set())
            ready.add(p)
            if len(ready) == len(self._groups[k]):
                for dtype_params in self._by_dtype(self._groups[k]):
                    self._submit(dtype_params)
            return
        dtype = self._reduce_dtype(p)
        bucket = self._open.setdefault(dtype, [])
        bucket.append(p)
        self._open_bytes[dtype] = self._open_bytes.get(dtype, 0) + p.numel() * p.element_size()
        if self._open_bytes[dtype] >= self._bucket_bytes():
            self._submit(self._open.pop(dtype))
            del self._open_bytes[dtype]

    def _bucket_bytes(self) -> int:
        """The size at which the open bucket is queued: the step's first one early, then larger ones."""
        return min(self._threshold, BUCKET_BYTES if self._pending else FIRST_BUCKET_BYTES)

    def _reduce_dtype(self, p: torch.Tensor) -> torch.dtype:
        return _hvd.reduce_dtype(p, self._compression, "DistributedOptimizer", self._names[p])

    def _by_dtype(self, params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        split: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in params:
            split.setdefault(self._reduce_dtype(p), []).append(p)
        return list(split.values())

    def _submit(self, params: list[torch.Tensor]) -> None:
        names = tuple(self._names[p] for p in params)
        op, buffer = _hvd.fuse(
            [p.grad for p in params], names, f"DistributedOptimizer.{names[0]}", self._op, self._compression,
            self._prescale, "DistributedOptimizer", self._buffers.get(names),
        )  # fmt: skip
        self._buffers[names] = buffer
        self._pending.append((params, buffer, _hvd._engine_now().submit(op)))

    # -- step's side -------------------------------------------------------------------------------------------

    def synchronize(self) -> None:
        """Waits until every gradient is reduced and in ``p.grad`` (reducing those whose hook did not fire)."""
        with self._lock:
            pending = self._flush()
        first_error = None
        for params, buffer, op in pending:  # wait for all, even after an error, so none is left running
            try:
                op.wait()
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the rest
                first_error = first_error or exc
                continue
            _hvd.unfuse(buffer, [p.grad for p in params], self._postscale)
        if first_error is not None:
            raise first_error

    def _flush(self) -> list[tuple[list[torch.Tensor], torch.Tensor, Any]]:
        """Queues every bucket not queued yet (zero gradients where no hook fired); returns all pending ones."""
        if not self._ready and not self._pending:
            return []
        for p in self._params:  # as Horovod: every rank reduces every parameter, zeros where none was computed
            if p not in self._ready:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._make_ready(p)
        for dtype in list(self._open):
            self._submit(self._open.pop(dtype))
        pending = self._pending
        self._reset()
        return pending

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within it, ``step()`` does not synchronize (call `synchronize()` yourself first, e.g. to clip)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        """Synchronizes (unless inside `skip_synchronize`), then applies the wrapped optimizer's step."""
        if self._should_synchronize:
            self.synchronize()
        return super().step(closure)  # type: ignore[misc]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As the wrapped optimizer's; refused between backward() and step() while gradients are being reduced."""
        if self._pending or self._ready:
            raise StateError(
                "hvd.DistributedOptimizer: zero_grad() was called after backward() and before step() or "
                "synchronize(), while gradients are being reduced; call step() (or synchronize()) first"
            )
        super().zero_grad(set_to_none)  # type: ignore[misc]


def DistributedOptimizer(  # noqa: N802 - Horovod's name for a factory
    optimizer: torch.optim.Optimizer, named_parameters: Any = None, compression: Any = Compression.none,
    backward_passes_per_step: int = 1, op: str = Average, gradient_predivide_factor: float = 1.0,
    num_groups: int = 0, groups: Any = None, sparse_as_dense: bool = False, process_set: Any = None,
) -> torch.optim.Optimizer:  # fmt: skip
    """``optimizer`` made distributed: an instance of its class whose gradients are averaged over the ranks.

    Args:
        optimizer: A torch optimizer; the result shares its param groups (and its state so far).
        named_parameters: ``model.named_parameters()``: names for the gradients' collectives; every
            trained parameter must be in it (InvalidArgumentError names the one missing).
        compression: ``Compression.none``, ``fp16`` or ``bf16`` on the wire.
        backward_passes_per_step: Backward passes whose gradients autograd sums locally before one
            reduction.
        op: ``Average`` (default) or ``Sum``; ``Adasum`` is refused.
        gradient_predivide_factor: With Average, gradients are divided by it before the sum and the
            sum multiplied by ``factor / size()``.
        num_groups: Horovod's older spelling of an integer ``groups``.
        groups: An int (that many groups of consecutive parameters) or lists of parameters; each group
            is reduced as one fused collective once all its gradients are ready.
        sparse_as_dense: Reduce sparse gradients as dense tensors (else they are refused).
        process_set: Only the global set (None).

    Raises:
        InvalidArgumentError: Any argument above out of range.
        StateError: `sparkgrad.hvd.torch.init` was not called.
    """
    _hvd._process_set(process_set, "DistributedOptimizer")
    cls = type(type(optimizer).__name__, (_Distributed, type(optimizer)), {"__module__": __name__})
    made = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups if groups is not None else num_groups, sparse_as_dense)  # fmt: skip
    made.defaults = optimizer.defaults
    made.state.update(optimizer.state)
    return made
