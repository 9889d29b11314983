"""What a training process needs to form its allreduce communicator, and the handle that holds it once formed.

A TFCluster with no ps (``num_ps=0``) and every ``sparkgrad.run`` /
``HorovodRunner`` rank opens a second listening socket per training node
(registered as ``comm_port``, kept in the spec), so the communicator never
competes with the node's own listener (taken by the FeedServer under
InputMode.SPARK). The node runner builds a `CommHandle` on the rank, the
topology and every rank's (host, comm_port) in rank order (a frozen
`CommSetup`) and assigns it here for the duration of map_fun, so
``sparkgrad.hvd.init()`` takes no arguments: it opens the handle's
communicator, and the node closes it when map_fun ended. Like
sparkgrad.cluster.rank, the assignment is the process's, or the thread's for
nodes that run as threads of the driver. A process no launcher set up (a
notebook, a script) gets a handle of one rank from `handle_for_init`.

``sparkgrad.hvd`` and ``sparkgrad.nn.distributed`` both find the process's
communicator through `communicator()`; neither imports the other for it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkgrad.cluster import rank as _rank
from sparkgrad.cluster import security as _security
from sparkgrad.cluster.context import NodeInfo
from sparkgrad.cluster.rank import Scoped
from sparkgrad.cluster.roles import TRAINING_ROLES
from sparkgrad.errors import StateError


@dataclass(frozen=True)
class CommSetup:
    """One training process's place among ``size`` ranks, and where every rank listens."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    addresses: tuple[tuple[str, int], ...]  # every rank's (host, comm_port), in rank order
    listener: Any = field(repr=False)  # this rank's sparkgrad._core.Listener (its comm_port)
    secret: bytes = field(repr=False)
    security: str | None = None  # the cluster's frame protection (None: the default)


def shared_memory_allowed() -> bool:
    """Whether rings of ranks on one host may move their data through shared memory (/dev/shm).

    On unless the rank's environment sets ``SPARKGRAD_SHARED_MEMORY=0`` (then TCP throughout, as
    between hosts).
    """
    return os.environ.get("SPARKGRAD_SHARED_MEMORY", "1").strip() != "0"


class CommHandle:
    """A rank's communicator: its fixed `CommSetup` and the ``sparkgrad._core.Communicator`` opened on it.

    ``open()`` (what ``hvd.init()`` calls) forms the communicator with every
    other rank once; ``close()`` (the node runner's, when map_fun ended, or
    ``hvd.shutdown()``) closes it, after which ``open()`` may form a new one.
    """

    def __init__(self, setup: CommSetup) -> None:
        self.setup = setup
        self._lock = threading.Lock()
        self._open = False
        self._communicator: Any = None  # None while closed, or in a build without collectives
        self._companions: dict[str, Any] = {}  # objects that live as long as the open communicator
        self._lent_to: str | None = None  # what else serves on the comm port meanwhile (`lent`)

    def __repr__(self) -> str:
        return f"CommHandle({self.setup!r}, open={self._open})"

    @property
    def is_open(self) -> bool:
        """Whether `open()` formed the communicator and `close()` did not close it since."""
        return self._open

    def open(self, timeout: float) -> None:
        """Forms the communicator with every other rank (a collective); a no-op when already open.

        Raises:
            SparkgradTimeout: Not every rank connected within ``timeout`` seconds.
        """
        from sparkgrad import _core

        with self._lock:
            if self._open:
                return
            if self._lent_to is not None:
                raise StateError(
                    f"sparkgrad.hvd cannot form its communicator here: this rank's comm port serves {self._lent_to}"
                )
            factory = getattr(_core, "Communicator", None)
            if factory is not None:
                setup = self.setup
                self._communicator = factory(
                    setup.listener, setup.secret, setup.rank, list(setup.addresses), float(timeout),
                    security=setup.security, shared_memory=shared_memory_allowed(),
                )  # fmt: skip
            self._open = True

    @contextlib.contextmanager
    def lent(self, to: str) -> Iterator[None]:
        """For the block, the comm port's listening socket serves ``to`` (another protocol): `open()` refuses.

        Raises:
            StateError: The communicator is open (it owns the port).
        """
        with self._lock:
            if self._open:
                raise StateError(f"the comm port cannot serve {to}: sparkgrad.hvd's communicator is open on it")
            self._lent_to = to
        try:
            yield
        finally:
            with self._lock:
                self._lent_to = None

    def communicator(self) -> Any:
        """The open ``sparkgrad._core.Communicator``.

        Raises:
            StateError: Not open (``hvd.init()`` was not called), or this build has no collectives.
        """
        with self._lock:
            if not self._open:
                raise StateError("sparkgrad.hvd is not initialized: call hvd.init() first (in every rank)")
            if self._communicator is None:
                raise StateError(
                    "this sparkgrad._core has no Communicator (built without the collectives): rebuild sparkgrad"
                )
            return self._communicator

    def companion(self, key: str, factory: Callable[[Any], Any]) -> Any:
        """The object ``key`` that lives as long as the open communicator: ``factory(communicator)`` on first use.

        ``close()`` closes the communicator first (a collective blocked in another thread fails at
        once), then calls each companion's ``close()`` (sparkgrad.hvd.torch keeps its background
        thread here).

        Raises:
            StateError: The communicator is not open.
        """
        comm = self.communicator()
        with self._lock:
            if self._communicator is not comm:
                raise StateError("sparkgrad.hvd's communicator was closed meanwhile (call hvd.init() again)")
            made = self._companions.get(key)
            if made is None:
                made = self._companions[key] = factory(comm)
            return made

    def close(self) -> None:
        """Closes the communicator if open (the launcher calls it when map_fun ends), then its companions."""
        with self._lock:
            comm, self._communicator, self._open = self._communicator, None, False
            companions, self._companions = list(self._companions.values()), {}
        if comm is not None:
            comm.close()
        for made in companions:
            made.close()


def topology(hosts: Sequence[str], rank: int) -> tuple[int, int, int, int]:
    """(local_rank, local_size, cross_rank, cross_size) of ``rank`` given every rank's host, as Horovod defines them.

    local: the ranks on this rank's host, in rank order. cross: the ranks
    with this rank's local_rank, one per host, hosts in order of their
    lowest rank.
    """
    host = hosts[rank]
    local = [r for r, h in enumerate(hosts) if h == host]
    local_rank = local.index(rank)
    host_order = list(dict.fromkeys(hosts))
    cross = [h for h in host_order if hosts.count(h) > local_rank]  # hosts with a rank of this local_rank
    return local_rank, len(local), cross.index(host), len(cross)


def handle_from_nodes(
    nodes: Sequence[NodeInfo], executor_id: int, listener: Any, secret: bytes, security: str | None = None
) -> CommHandle | None:
    """The handle of node ``executor_id`` among the registered nodes; None when the nodes have no comm_port."""
    training = sorted((n for n in nodes if n.role in TRAINING_ROLES), key=lambda n: n.executor_id)
    if not training or any(n.comm_port <= 0 for n in training) or listener is None:
        return None
    ranks = [n.executor_id for n in training]
    if executor_id not in ranks:
        return None
    rank = ranks.index(executor_id)
    hosts = [n.host for n in training]
    local_rank, local_size, cross_rank, cross_size = topology(hosts, rank)
    setup = CommSetup(
        rank=rank,
        size=len(training),
        local_rank=local_rank,
        local_size=local_size,
        cross_rank=cross_rank,
        cross_size=cross_size,
        addresses=tuple((n.host, n.comm_port) for n in training),
        listener=listener,
        secret=secret,
        security=security,
    )
    return CommHandle(setup)


_assigned: Scoped[CommHandle | None] = Scoped(None)
_solo_lock = threading.Lock()
_solo: CommHandle | None = None  # a plain process's own one-rank handle, made by its first hvd.init()


def current() -> CommHandle | None:
    """This thread's handle if a launcher set one for it, else the process's, else None (not launched)."""
    return _assigned.get()


def assigned(handle: CommHandle | None, thread_only: bool = False) -> contextlib.AbstractContextManager:
    """Sets the handle for the duration of the block (for the calling thread only when ``thread_only``).

    It does not close the handle: the node does, once it reported map_fun's
    outcome, so a failing rank's own error reaches the driver before its
    peers see the closed ring and report theirs.
    """
    return _assigned.assigned(handle, thread_only)


def in_use() -> CommHandle | None:
    """The handle ``hvd`` acts on: the launcher's, else the plain process's one-rank handle once made."""
    handle = current()
    if handle is not None:
        return handle
    with _solo_lock:
        return _solo


def handle_for_init() -> CommHandle:
    """The handle ``hvd.init()`` opens: the launcher's, else (in a plain process) one of a single rank.

    Raises:
        StateError: A launcher ran this process as a node that has no communicator (a cluster with ps).
    """
    global _solo
    handle = current()
    if handle is not None:
        return handle
    launched = _rank.current()
    if launched.role != "local":  # a launcher set a rank, but this process has no communicator address
        raise StateError(
            f"hvd.init(): this {launched.role} node has no allreduce communicator: TFCluster opens one on the "
            "training nodes of a cluster without parameter servers (TFCluster.run(..., num_ps=0)); with "
            "num_ps > 0 train through the ps (TFNode.ps_client) instead, or run fn with sparkgrad.run / "
            "HorovodRunner"
        )
    with _solo_lock:
        if _solo is None:
            from sparkgrad import _core

            listener = _core.Listener("127.0.0.1", 0)
            setup = CommSetup(
                rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1,
                addresses=(("127.0.0.1", listener.port),), listener=listener,
                secret=secrets.token_bytes(32), security=_security.default(),
            )  # fmt: skip
            _solo = CommHandle(setup)
        return _solo


def communicator() -> Any:
    """The communicator ``hvd.init()`` opened in this process (or this node thread).

    Raises:
        StateError: ``hvd.init()`` was not called, or this build has no collectives.
    """
    handle = in_use()
    if handle is None:
        raise StateError("sparkgrad.hvd is not initialized: call hvd.init() first (in every rank)")
    return handle.communicator()
