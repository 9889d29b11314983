"""What a training process needs to form its allreduce communicator: set by the launcher, read by hvd.init().

A TFCluster with no ps (``num_ps=0``) and every ``sparkgrad.run`` /
``HorovodRunner`` rank opens a second listening socket per training node
(registered as ``comm_port``, kept in the spec), so the communicator never
competes with the node's own listener (taken by the FeedServer under
InputMode.SPARK). The node runner stores here, for the duration of map_fun,
the rank, the topology and every rank's (host, comm_port) in rank order; so
``sparkgrad.hvd.init()`` takes no arguments. Like sparkgrad.cluster.rank,
the holder is the process's, or the thread's for nodes that run as threads
of the driver.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkgrad.cluster.context import NodeInfo
from sparkgrad.cluster.rank import Scoped
from sparkgrad.cluster.roles import TRAINING_ROLES


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
    # hvd's per-process state on this setup (its Communicator once hvd.init() formed it); released at the end
    state: dict = field(default_factory=dict, repr=False, compare=False)

    def release(self) -> None:
        """Closes what hvd.init() opened on this setup (the launcher calls it when map_fun ends)."""
        comm = self.state.pop("comm", None)
        self.state.clear()
        if comm is not None:
            comm.close()


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


def setup_from_nodes(
    nodes: Sequence[NodeInfo], executor_id: int, listener: Any, secret: bytes, security: str | None = None
) -> CommSetup | None:
    """The CommSetup of node ``executor_id`` among the registered nodes; None when the nodes have no comm_port."""
    training = sorted((n for n in nodes if n.role in TRAINING_ROLES), key=lambda n: n.executor_id)
    if not training or any(n.comm_port <= 0 for n in training) or listener is None:
        return None
    ranks = [n.executor_id for n in training]
    if executor_id not in ranks:
        return None
    rank = ranks.index(executor_id)
    hosts = [n.host for n in training]
    local_rank, local_size, cross_rank, cross_size = topology(hosts, rank)
    return CommSetup(
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


_setup: Scoped[CommSetup | None] = Scoped(None)


def current() -> CommSetup | None:
    """This thread's setup if a launcher set one for it, else the process's, else None (not launched)."""
    return _setup.get()


def assigned(setup: CommSetup | None, thread_only: bool = False) -> contextlib.AbstractContextManager[CommSetup | None]:
    """Sets the setup for the duration of the block (for the calling thread only when ``thread_only``).

    It does not release the setup: the node does, once it reported map_fun's
    outcome, so a failing rank's own error reaches the driver before its
    peers see the closed ring and report theirs.
    """
    return _setup.assigned(setup, thread_only)
