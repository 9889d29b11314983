"""TensorFlowOnSpark's ``TFNode`` helpers for code running inside map_fun.

Usage inside map_fun:

```python
server = TFNode.start_cluster_server(ctx)   # also: cluster_spec, server = ...
if ctx.job_name == "ps":
    server.join()                            # returns when the driver says stop
```
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sparkgrad.cluster.context import NodeContext, hdfs_path
from sparkgrad.cluster.feed import DataFeed
from sparkgrad.cluster.ps import ParameterClient, serve_parameters
from sparkgrad.errors import SparkgradTimeout


class ClusterServer:
    """This node's server, TensorFlowOnSpark's ``tf.train.Server`` stand-in.

    It holds the listening socket the node bound before it registered, `join`, and `serve_parameters`
    on a ps.

    ``cluster_spec, server = TFNode.start_cluster_server(ctx)`` unpacks as in TensorFlowOnSpark.

    Attributes:
        ctx: The node's context.
        cluster_spec (dict[str, list[str]]): ``{role: ["host:port", ...]}``.
        listener: The node's listening socket (``ctx.listener``).
        target (str): ``"host:port"`` of this node.
    """

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.cluster_spec = ctx.cluster_spec
        self.listener = ctx.listener
        self.target = f"{ctx.host}:{ctx.port}"

    def join(self, timeout: float | None = None) -> None:
        """Blocks until the driver stops this node (a ps or evaluator at shutdown, any node on a failure).

        Args:
            timeout: Seconds to wait at most; None: no limit.

        Raises:
            SparkgradTimeout: No stop came within ``timeout``.
        """
        try:
            self.ctx.wait_for_stop(timeout)
        except SparkgradTimeout as exc:
            raise SparkgradTimeout(f"{self.target}: {exc}") from None

    def serve_parameters(
        self,
        total: Any,
        mode: str = "async",
        lr: float | None = None,
        init: Any = None,
        timeout: float | None = None,
        optimizer: Any = None,
    ) -> str:
        """On a ps node: serves its shard of the flat parameter buffer (`serve_parameters` with this node's ``ctx``)."""
        return serve_parameters(self.ctx, total, mode=mode, lr=lr, init=init, timeout=timeout, optimizer=optimizer)

    def __iter__(self) -> Iterator[Any]:
        """``cluster_spec, server = start_cluster_server(ctx)`` as in TensorFlowOnSpark."""
        return iter((self.cluster_spec, self))


def start_cluster_server(ctx: NodeContext, num_gpus: int = 0, rdma: bool = False) -> ClusterServer:
    """This node's `ClusterServer`, as TensorFlowOnSpark's ``start_cluster_server`` returns it.

    Args:
        ctx: The node's context, ``map_fun``'s second argument.
        num_gpus: Accepted for compatibility, unused (sparkgrad trains on CPUs).
        rdma: Accepted for compatibility, unused.
    """
    return ClusterServer(ctx)


def ps_client(
    ctx: NodeContext, total: Any, timeout: float = 60.0, compression: str | None = None, sparse: bool = True
) -> ParameterClient:
    """On a training node: a `ParameterClient` of every ps shard, for ``model.fit(..., ps=ps_client(ctx, model))``.

    Args:
        ctx: The node's context.
        total: The model, or its number of parameters.
        timeout: Seconds to connect and to wait for each answer.
        compression: ``"bf16"`` pushes bf16 gradients; None float32.
        sparse: A model's Embedding tables travel as the rows each step touches and reads (True) or
            whole, as any other parameters (False).
    """
    return ParameterClient(ctx, total, timeout, compression, sparse)


__all__ = [  # in the order the API reference lists them
    "start_cluster_server",
    "ClusterServer",
    "DataFeed",
    "ps_client",
    "ParameterClient",
    "serve_parameters",
    "hdfs_path",
]
