"""The queue that runs sparkgrad.hvd.torch's collectives in order on one background thread, checked and join-aware.

Every torch-level collective (synchronous ones too, so that they stay in
order with pending async ones) becomes an `Op` queued here; one thread per
communicator runs the queue in order on the C ring
(``sparkgrad._core.Communicator``). NumPy arrays only: the torch layer
(hvd/torch/) hands in views of tensor storage or fusion buffers.

Before each op the ranks allgather a small descriptor (kind, name, dtype,
shape, op, root, the names of a bucket's tensors, and whether the rank has
joined). Every rank sees the same descriptors and takes the same decision
from them, so the ring stays in step:

* the ranks that have not joined disagree (another kind, name, dtype,
  shape, op, root): every one of them fails with ClusterError naming each
  rank's collective and tensor, before any data moves;
* some rank has joined (`join`): it answers the others' descriptors,
  contributing zeros to allreduces, no rows to allgathers and alltoalls, and
  receiving broadcasts, until every rank has joined; an op it cannot take
  part in (a Min/Max allreduce, a broadcast from it, allgather_object) fails
  on the other ranks and the joined rank goes on waiting.

Not here: tensors, fusion and hooks (hvd/torch/), negotiation of order
(ranks must issue the same collectives in the same order, as the C ring
requires; a mismatch is an error, never a reordering as Horovod's
coordinator does).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkgrad.errors import ClusterError, InvalidArgumentError, ProtocolError, SparkgradError, StateError

ALLREDUCE = "allreduce"
ALLGATHER = "allgather"
BROADCAST = "broadcast"
ALLTOALL = "alltoall"
BARRIER = "barrier"
BROADCAST_OBJECT = "broadcast_object"
ALLGATHER_OBJECT = "allgather_object"
JOIN = "join"


@dataclass(frozen=True)
class Desc:
    """What a rank is about to do; the ranks compare these before any data moves."""

    kind: str
    name: str
    dtype: str = ""  # the tensor's dtype as the user sees it ("float32", "bfloat16")
    wire: str = ""  # the NumPy dtype that travels ("float32"; "int16" for a bfloat16 broadcast)
    shape: tuple[int, ...] = ()
    op: str = ""
    compression: str = ""
    root: int = -1
    names: tuple[str, ...] = ()  # a bucket's tensors
    splits: tuple[int, ...] = ()  # alltoall: rows to each rank
    joined: int = -1  # >= 0: this rank has joined, at this exchange

    def encode(self) -> bytes:
        """JSON of the fields (strings and ints only: nothing on the wire is executable)."""
        fields = (self.kind, self.name, self.dtype, self.wire, self.shape, self.op, self.compression, self.root,
                  self.names, self.splits, self.joined)  # fmt: skip
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes, rank: int) -> Desc:
        try:
            kind, name, dtype, wire, shape, op, comp, root, names, splits, joined = json.loads(data)
            return cls(kind, name, dtype, wire, tuple(shape), op, comp, root, tuple(names), tuple(splits), joined)
        except (ValueError, TypeError) as exc:
            raise ProtocolError(f"hvd: rank {rank} sent a malformed collective descriptor ({exc})") from None

    def key(self) -> tuple:
        """The fields every rank that has not joined must agree on."""
        if self.kind == ALLREDUCE:
            return (self.kind, self.name, self.dtype, self.shape, self.op, self.compression, self.names)
        if self.kind == BROADCAST:
            return (self.kind, self.name, self.dtype, self.shape, self.root, self.names)
        if self.kind in (ALLGATHER, ALLTOALL):
            return (self.kind, self.name, self.dtype, self.shape[1:])
        if self.kind == BROADCAST_OBJECT:
            return (self.kind, self.name, self.root)
        return (self.kind, self.name)

    def __str__(self) -> str:
        if self.joined >= 0:
            return "join()"
        what = f"{self.kind} {self.name!r}"
        if self.dtype:
            what += f" {self.dtype}{list(self.shape)}"
        if self.kind == ALLREDUCE:
            what += f" op={self.op}" + (f" compression={self.compression}" if self.compression else "")
        if self.root >= 0:
            what += f" root={self.root}"
        if self.names and self.names != (self.name,):
            shown = ", ".join(self.names[:8]) + (f", ... ({len(self.names)} tensors)" if len(self.names) > 8 else "")
            what += f" [{shown}]"
        return what


@dataclass
class Op:
    """One queued collective: its descriptor, this rank's data, and (once run) its result or error."""

    desc: Desc
    array: np.ndarray | None = None  # allreduce / broadcast: in place; allgather / alltoall: the rows sent
    data: Any = None  # broadcast_object / allgather_object: the encoded bytes
    result: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def wait(self, timeout: float | None = None) -> Any:
        """The op's result once it ran; re-raises its error."""
        if not self.done.wait(timeout):
            raise StateError(f"hvd: {self.desc} did not finish within {timeout} s")
        if self.error is not None:
            raise self.error
        return self.result


class Engine:
    """One communicator's queue of collectives and the thread that runs them in order.

    ``submit`` queues an op and returns it; ``Op.wait`` gives its result.
    Async handles (Horovod's ints) are numbered here.
    """

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.rank = comm.rank
        self.size = comm.size
        self._queue: queue.SimpleQueue[Op | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running = threading.Lock()  # held while an op runs: by the thread, or by a caller running inline
        self._unfinished = 0  # ops submitted and not yet run
        self._closed = False
        self._unnamed: dict[str, int] = {}  # per kind: how many unnamed ops this rank issued
        self._handles: dict[int, tuple[Op, Any]] = {}
        self._next_handle = 0
        self._exchanges = 0  # descriptor exchanges so far: the same count on every rank
        self.descriptor_seconds = 0.0  # time spent exchanging descriptors (the cost of the checks)
        self._thread = threading.Thread(target=self._loop, name="sparkgrad-hvd-torch", daemon=True)
        self._thread.start()

    # -- the caller's side ------------------------------------------------------------------------------

    def name(self, kind: str, name: str | None) -> str:
        """``name``, or the next ``<kind>.noname.<n>`` (the same on every rank that issues ops in the same order)."""
        if name is not None:
            return str(name)
        with self._lock:
            n = self._unnamed.get(kind, 0)
            self._unnamed[kind] = n + 1
        return f"{kind}.noname.{n}"

    def submit(self, op: Op) -> Op:
        with self._lock:
            if self._closed:
                raise StateError("sparkgrad.hvd.torch: the communicator was shut down (call hvd.init() again)")
            self._unfinished += 1
            self._queue.put(op)
        return op

    def run(self, op: Op) -> Any:
        """Runs ``op`` after every pending one and returns its result.

        With nothing pending it runs on the calling thread (no hand-over to the thread and back);
        an op submitted meanwhile waits for it, so the order stays the order of the calls.
        """
        with self._lock:
            inline = not self._closed and self._unfinished == 0
            if inline:
                self._unfinished += 1
                self._running.acquire()  # free: nothing is pending, so the thread runs nothing
        if not inline:
            return self.submit(op).wait()
        try:
            self._run_one(op)
        finally:
            self._running.release()
            with self._lock:
                self._unfinished -= 1
        return op.wait()

    def handle(self, op: Op, finish: Any) -> int:
        """A Horovod handle for ``op``; `synchronize` returns ``finish(result)``."""
        with self._lock:
            self._next_handle += 1
            self._handles[self._next_handle] = (op, finish)
            return self._next_handle

    def _entry(self, handle: int) -> tuple[Op, Any]:
        with self._lock:
            entry = self._handles.get(handle)
        if entry is None:
            raise InvalidArgumentError(f"hvd: unknown or already synchronized handle {handle!r}")
        return entry

    def poll(self, handle: int) -> bool:
        return self._entry(handle)[0].done.is_set()

    def synchronize(self, handle: int) -> Any:
        op, finish = self._entry(handle)
        try:
            return finish(op.wait())
        finally:
            with self._lock:
                self._handles.pop(handle, None)

    def close(self) -> None:
        """Stops the thread once the ops queued before run (the communicator is closed first: they fail at once)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._thread.join(timeout=30)

    # -- the thread -------------------------------------------------------------------------------------

    def _run_one(self, op: Op) -> None:
        try:
            op.result = self._join() if op.desc.kind == JOIN else self._execute(op)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            op.error = exc
        op.done.set()

    def _loop(self) -> None:
        while True:
            op = self._queue.get()
            if op is None:
                break
            with self._running:
                self._run_one(op)
            with self._lock:
                self._unfinished -= 1
        # nothing follows the None that close() queued: submit() refuses once closed

    def _exchange(self, desc: Desc) -> list[Desc] | None:
        """Every rank's descriptor, or None when every rank sent the same bytes as this one (the usual case)."""
        started = time.perf_counter()
        mine = desc.encode()
        try:
            got = self.comm.allgather_bytes(mine)
        except SparkgradError as exc:
            raise _named(exc, desc, self.rank) from exc
        self._exchanges += 1
        same = all(b == mine for b in got)
        descs = None if same else [Desc.decode(b, r) for r, b in enumerate(got)]
        self.descriptor_seconds += time.perf_counter() - started
        return descs

    def _agreed(self, descs: list[Desc]) -> tuple[Desc, list[int]]:
        """The descriptor the ranks that have not joined agree on, and the joined ranks; raises if they disagree."""
        joined = [r for r, d in enumerate(descs) if d.joined >= 0]
        active = [r for r, d in enumerate(descs) if d.joined < 0]
        first = descs[active[0]]
        if any(descs[r].key() != first.key() for r in active):
            lines = "; ".join(f"rank {r}: {d}" for r, d in enumerate(descs))
            raise ClusterError(
                f"hvd.{first.kind}: the ranks called different collectives or tensors ({lines}); every rank must "
                "issue the same collectives, on tensors of the same name, dtype and shape, in the same order",
                collective=first.kind, tensor=first.name, ranks=[str(d) for d in descs],
            )  # fmt: skip
        why = None
        if joined and first.kind == ALLREDUCE and first.op not in ("sum", "average"):
            why = f"op={first.op} cannot take a joined rank's zeros"
        elif joined and first.kind in (BROADCAST, BROADCAST_OBJECT) and first.root in joined:
            why = f"its root rank {first.root} has joined"
        elif joined and first.kind == ALLGATHER_OBJECT:
            why = "a joined rank has no object to give"
        if why is not None:
            raise ClusterError(
                f"hvd.{first.kind} of {first.name!r}: rank(s) {joined} called join() and {why}",
                collective=first.kind, tensor=first.name, ranks=joined,
            )  # fmt: skip
        return first, joined

    def _execute(self, op: Op) -> Any:
        descs = self._exchange(op.desc)
        if descs is None:  # every rank described the same collective
            descs, joined = [op.desc] * self.size, []
        else:
            _, joined = self._agreed(descs)
        try:
            return self._data(op.desc, descs, joined, op.array, op.data)
        except SparkgradError as exc:
            raise _named(exc, op.desc, self.rank) from exc

    def _data(self, desc: Desc, descs: list[Desc], joined: list[int], array: Any, data: Any) -> Any:
        """Moves the data of an agreed collective (``desc`` is this rank's, or the others' for a joined rank)."""
        comm, kind = self.comm, desc.kind
        if kind == ALLREDUCE:
            comp = desc.compression or None
            return comm.allreduce(array, op=desc.op, compression=comp)
        if kind == BROADCAST:
            return comm.broadcast(array, root=desc.root)
        if kind == ALLGATHER:
            return comm.allgather(array)
        if kind == ALLTOALL:
            return self._alltoall(array, descs, joined)
        if kind == BARRIER:
            return comm.barrier()
        if kind == BROADCAST_OBJECT:
            return comm.broadcast_bytes(data if self.rank == desc.root else None, root=desc.root)
        if kind == ALLGATHER_OBJECT:
            return comm.allgather_bytes(data)
        raise InvalidArgumentError(f"hvd: unknown collective {kind!r}")

    def _alltoall(self, rows: np.ndarray, descs: list[Desc], joined: list[int]) -> tuple[np.ndarray, list[int]]:
        """Alltoall over allgather: each rank gives the rows it sends to the others, and keeps the blocks for it.

        A rank's own block never travels; the others reach every rank, so with n ranks this moves
        n - 1 times the bytes of a direct alltoall (the same bytes at 2 ranks).
        """
        splits = [(0,) * self.size if r in joined else d.splits for r, d in enumerate(descs)]
        me = self.rank
        offsets = np.concatenate([[0], np.cumsum(splits[me])]).astype(np.int64)  # my rows' block bounds
        own = rows[offsets[me] : offsets[me + 1]]
        others = np.concatenate([rows[: offsets[me]], rows[offsets[me + 1] :]])
        everything = self.comm.allgather(others)
        parts, start = [], 0
        for source in range(self.size):
            sent = splits[source]
            if source == me:
                parts.append(own)
            else:
                begin = start + sum(sent[d] for d in range(me) if d != source)  # its blocks skip its own
                parts.append(everything[begin : begin + sent[me]])
            start += sum(sent) - sent[source]
        return np.concatenate(parts), [splits[s][me] for s in range(self.size)]

    def _join(self) -> int:
        """Answers the other ranks' collectives with zeros until every rank has joined; returns the last to join."""
        mine = Desc(JOIN, "join", joined=self._exchanges)
        while True:
            descs = self._exchange(mine)
            if descs is None:  # every rank joined at the same exchange
                return self.size - 1
            if all(d.joined >= 0 for d in descs):
                return max(range(self.size), key=lambda r: (descs[r].joined, r))
            try:
                agreed, joined = self._agreed(descs)
            except ClusterError:
                continue  # the ranks that have not joined fail this one; nothing moves
            try:
                self._data(agreed, descs, joined, *_stand_in(agreed))
            except SparkgradError as exc:
                raise _named(exc, agreed, self.rank) from exc


def _stand_in(desc: Desc) -> tuple[np.ndarray | None, Any]:
    """What a joined rank contributes to ``desc``: zeros to an allreduce, no rows to a gather, a receiving buffer."""
    if desc.kind in (ALLREDUCE, BROADCAST):
        return np.zeros(desc.shape, dtype=desc.wire), None
    if desc.kind in (ALLGATHER, ALLTOALL):
        return np.zeros((0, *desc.shape[1:]), dtype=desc.wire), None
    return None, None


def _named(exc: SparkgradError, desc: Desc, rank: int) -> SparkgradError:
    """``exc`` again, its message naming this rank, the collective and the tensor."""
    what = f"{desc.name!r}"
    if len(desc.names) > 1:
        shown = ", ".join(desc.names[:4]) + (", ..." if len(desc.names) > 4 else "")
        what += f" (a bucket of {len(desc.names)} tensors: {shown})"
    message = f"hvd.{desc.kind} of {what} on rank {rank}: {exc.message or exc}"
    try:
        named = type(exc)(message, **{**exc.details, "collective": desc.kind, "tensor": desc.name, "rank": rank})
    except TypeError:  # an error class with its own constructor: keep it as it is
        return exc
    named.code = exc.code
    return named


__all__ = ["Desc", "Engine", "Op"]
