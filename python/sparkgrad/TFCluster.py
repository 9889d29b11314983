"""TensorFlowOnSpark's ``TFCluster`` module, on sparkgrad: ``TFCluster.run(sc, map_fun, ...)``.

Porting from TensorFlowOnSpark is a change of import:
``from sparkgrad import TFCluster, TFNode``.
"""

from sparkgrad.cluster.driver import Cluster as TFCluster
from sparkgrad.cluster.launch import run
from sparkgrad.cluster.roles import InputMode

__all__ = ["InputMode", "TFCluster", "run"]
