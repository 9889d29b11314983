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


@dataclass(frozen=True)
class ProcessRank:
    """``rank`` among ``size`` training processes; ``rank`` is None on a node that does not train (ps, evaluator)."""

    rank: int | None
    size: int
    role: str = "worker"

    @property
    def is_chief(self) -> bool:
        return self.rank == 0


_SINGLE = ProcessRank(0, 1, "local")
_local = threading.local()  # nodes that run as threads of the driver (driver_ps_nodes) set their own
_process: ProcessRank = _SINGLE


def current() -> ProcessRank:
    """This thread's rank if a launcher set one for it, else the process's, else a single process of rank 0."""
    return getattr(_local, "rank", None) or _process


def is_chief() -> bool:
    return current().is_chief


@contextlib.contextmanager
def assigned(rank: ProcessRank, thread_only: bool = False) -> Iterator[ProcessRank]:
    """Sets the rank for the duration of the block (for the calling thread only when ``thread_only``)."""
    global _process
    if thread_only:
        saved = getattr(_local, "rank", None)
        _local.rank = rank
        try:
            yield rank
        finally:
            _local.rank = saved
        return
    saved_process = _process
    _process = rank
    try:
        yield rank
    finally:
        _process = saved_process
