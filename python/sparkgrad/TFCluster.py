"""TensorFlowOnSpark's ``TFCluster`` module, on sparkgrad: ``TFCluster.run(sc, map_fun, ...)``.

Porting from TensorFlowOnSpark is a change of import:
``from sparkgrad import TFCluster, TFNode``.

The driver's modules load on first use of ``run`` or ``TFCluster``: Spark
executors import the sparkgrad package to run a node, and a node never needs
the driver's code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkgrad.cluster import load_driver_name
from sparkgrad.cluster.roles import InputMode

if TYPE_CHECKING:
    from sparkgrad.cluster.driver import Cluster as TFCluster
    from sparkgrad.cluster.launch import run

_DRIVER_NAMES = {"TFCluster": "Cluster", "run": "run"}


def __getattr__(name: str) -> Any:
    if name in _DRIVER_NAMES:
        return load_driver_name(_DRIVER_NAMES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["InputMode", "TFCluster", "run"]
