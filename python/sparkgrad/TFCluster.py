"""TensorFlowOnSpark's ``TFCluster`` module, on sparkgrad: ``TFCluster.run(sc, map_fun, ...)``.

Porting from TensorFlowOnSpark is a change of import:
``from sparkgrad import TFCluster, TFNode``.

The driver's modules load on first use of ``run`` or ``TFCluster``: Spark
executors import the sparkgrad package to run a node, and a node never needs
the driver's code.
"""

from __future__ import annotations

from typing import Any

from sparkgrad.cluster.roles import InputMode


def __getattr__(name: str) -> Any:
    if name == "run":
        from sparkgrad.cluster.launch import run

        return run
    if name == "TFCluster":
        from sparkgrad.cluster.driver import Cluster

        return Cluster
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["InputMode", "TFCluster", "run"]
