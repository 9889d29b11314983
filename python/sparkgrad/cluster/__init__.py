"""The cluster layer: roles, node context, launchers (Spark, local) and the driver.

Users reach it as ``sparkgrad.TFCluster`` / ``sparkgrad.TFNode`` (names kept
from TensorFlowOnSpark) and ``sparkgrad.local``. The driver's modules
(Cluster, run) load on first use, so a node on an executor imports only the
node side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkgrad.cluster.context import NodeContext, NodeInfo, hdfs_path
from sparkgrad.cluster.roles import ClusterTemplate, InputMode, NodeRole, build_template

if TYPE_CHECKING:
    from sparkgrad.cluster.driver import Cluster
    from sparkgrad.cluster.launch import run


def load_driver_name(name: str) -> Any:
    """``Cluster`` or ``run``, importing the driver's modules on first use."""
    if name == "Cluster":
        from sparkgrad.cluster.driver import Cluster

        return Cluster
    if name == "run":
        from sparkgrad.cluster.launch import run

        return run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __getattr__(name: str) -> Any:
    return load_driver_name(name)


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
