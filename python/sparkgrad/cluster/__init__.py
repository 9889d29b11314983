"""The cluster layer: roles, node context, launchers (Spark, local) and the driver.

Users reach it as ``sparkgrad.TFCluster`` / ``sparkgrad.TFNode`` (names kept
from TensorFlowOnSpark) and ``sparkgrad.local``.
"""

from sparkgrad.cluster.context import NodeContext, NodeInfo, hdfs_path
from sparkgrad.cluster.driver import Cluster
from sparkgrad.cluster.launch import run
from sparkgrad.cluster.roles import ClusterTemplate, InputMode, NodeRole, build_template

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
