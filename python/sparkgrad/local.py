"""Run a cluster's map_fun as processes on this machine, without Spark.

``sparkgrad.local.run(map_fun, args, num_executors, num_ps)`` is
``TFCluster.run(None, ...)``: the step between a single process and Spark in
TensorFlowOnSpark's conversion guide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkgrad.cluster.driver import Cluster
    from sparkgrad.cluster.node import MapFun


def run(map_fun: MapFun, tf_args: Any, num_executors: int, num_ps: int = 0, **kwargs: Any) -> Cluster:
    """Starts ``map_fun(tf_args, ctx)`` on ``num_executors`` local processes: ``TFCluster.run(None, ...)``.

    The step between a single process and Spark in TensorFlowOnSpark's conversion guide: the same
    ``map_fun``, roles, rendezvous and transport, without Spark.

    Args:
        map_fun: ``map_fun(tf_args, ctx)``, run on every node.
        tf_args: Passed to every ``map_fun``.
        num_executors: Nodes, parameter servers included.
        num_ps: Parameter servers among them.
        **kwargs: As for ``TFCluster.run``; ``cluster.train`` needs Spark, so local nodes read their own data.

    Returns:
        The running cluster; call its ``shutdown()``.
    """
    from sparkgrad.cluster.launch import run as _run  # the driver's code loads when a driver runs

    return _run(None, map_fun, tf_args, num_executors, num_ps, **kwargs)


__all__ = ["run"]
