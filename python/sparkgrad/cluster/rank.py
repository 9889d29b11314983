"""Which training process this is: the one definition of rank that code acting
on one process only (the chief's checkpoints, MLflow logging, returning rank
0's value) consults.

The launchers set it before user code runs: TFCluster nodes from their
context (rank among the training nodes; ps and evaluator nodes have none),
``sparkgrad.run`` / ``HorovodRunner`` ranks from their rank and size. A
process that no launcher set (a notebook cell, a plain script) is a single
process of rank 0 and is its own chief.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class ProcessRank:
    """``rank`` among ``size`` training processes; ``rank`` is None on a node that does not train (ps, evaluator)."""

    rank: int | None
    size: int
    role: str = "worker"

    @property
    def is_chief(self) -> bool:
        return self.rank == 0


class Scoped(Generic[T]):
    """A value a launcher sets for the duration of a block: for the whole process, or for one
    thread (nodes that run as threads of the driver, driver_ps_nodes, set their own)."""

    def __init__(self, default: T) -> None:
        self._default = default
        self._process = default
        self._local = threading.local()

    def get(self) -> T:
        """This thread's value if set for it, else the process's, else the default."""
        value = getattr(self._local, "value", None)
        return value if value is not None else self._process

    @contextlib.contextmanager
    def assigned(self, value: T, thread_only: bool = False) -> Iterator[T]:
        """Sets the value for the block (for the calling thread only when ``thread_only``)."""
        if thread_only:
            saved = getattr(self._local, "value", None)
            self._local.value = value
            try:
                yield value
            finally:
                self._local.value = saved
            return
        saved = self._process
        self._process = value
        try:
            yield value
        finally:
            self._process = saved


_rank: Scoped[ProcessRank] = Scoped(ProcessRank(0, 1, "local"))
_attempt: Scoped[int] = Scoped(0)


def current() -> ProcessRank:
    """This thread's rank if a launcher set one for it, else the process's, else a single process of rank 0."""
    return _rank.get()


def is_chief() -> bool:
    return current().is_chief


def attempt() -> int:
    """How many times the driver restarted the cluster before this run (0: the first run).

    Under ``sparkgrad.run(..., max_restarts=N)`` and ``TFCluster.run(...,
    max_restarts=N)`` a hand-written loop resumes from its last checkpoint
    when this is > 0 (``ctx.attempt`` says the same on TFCluster nodes).
    """
    return _attempt.get()


def assigned(rank: ProcessRank, thread_only: bool = False) -> contextlib.AbstractContextManager[ProcessRank]:
    """Sets the rank for the duration of the block (for the calling thread only when ``thread_only``)."""
    return _rank.assigned(rank, thread_only)


def attempt_assigned(value: int, thread_only: bool = False) -> contextlib.AbstractContextManager[int]:
    """Sets attempt() for the duration of the block (for the calling thread only when ``thread_only``)."""
    return _attempt.assigned(int(value), thread_only)
