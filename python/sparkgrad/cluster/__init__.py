"""The cluster layer: roles, node context, launchers (Spark, local) and the driver.

Users reach it as ``sparkgrad.TFCluster`` / ``sparkgrad.TFNode`` (names kept
from TensorFlowOnSpark) and ``sparkgrad.local``. The driver's modules
(Cluster, run) load on first use, so a node on an executor imports only the
node side.
"""

from __future__ import annotations

from typing import Any

from sparkgrad.cluster.context import NodeContext, NodeInfo, hdfs_path
from sparkgrad.cluster.roles import ClusterTemplate, InputMode, NodeRole, build_template


def __getattr__(name: str) -> Any:
    if name == "Cluster":
        from sparkgrad.cluster.driver import Cluster

        return Cluster
    if name == "run":
        from sparkgrad.cluster.launch import run

        return run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Cluster",
    "ClusterTemplate",
    "InputMode",
    "NodeContext",
    "NodeInfo",
    "NodeRole",
    "build_template",
    "hdfs_path",
    "run",
]
