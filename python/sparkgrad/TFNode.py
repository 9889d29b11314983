"""TensorFlowOnSpark's ``TFNode`` helpers for code running inside map_fun.

Usage inside map_fun:

server = TFNode.start_cluster_server(ctx)   # also: cluster_spec, server = ...
if ctx.job_name == "ps":
    server.join()                            # returns when the driver says stop
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sparkgrad.cluster.context import NodeContext, hdfs_path
from sparkgrad.cluster.feed import DataFeed
from sparkgrad.cluster.ps import ParameterClient, serve_parameters
from sparkgrad.errors import SparkgradTimeout


class ClusterServer:
    """This node's server: the listening socket bound before registration, and join()."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.cluster_spec = ctx.cluster_spec
        self.listener = ctx.listener
        self.target = f"{ctx.host}:{ctx.port}"

    def join(self, timeout: float | None = None) -> None:
        """Blocks until the driver stops this node (ps/evaluator at shutdown, or any node on failure).

        With ``timeout`` (s), raises SparkgradTimeout if no stop came by then.
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
        """On a ps node: serves its shard of the flat parameter buffer of ``total``, a
        compiled model (its optimizer and learning rate run on the ps) or a
        parameter count (see sparkgrad.cluster.ps)."""
        return serve_parameters(self.ctx, total, mode=mode, lr=lr, init=init, timeout=timeout, optimizer=optimizer)

    def __iter__(self) -> Iterator[Any]:
        """``cluster_spec, server = start_cluster_server(ctx)`` as in TensorFlowOnSpark."""
        return iter((self.cluster_spec, self))


def start_cluster_server(ctx: NodeContext, num_gpus: int = 0, rdma: bool = False) -> ClusterServer:
    """The node's server; ``num_gpus`` and ``rdma`` are accepted for compatibility (CPU only)."""
    return ClusterServer(ctx)


def ps_client(ctx: NodeContext, total: Any, timeout: float = 60.0, compression: str | None = None) -> ParameterClient:
    """On a training node: a client of every ps shard of the parameter buffer of
    ``total``, a model (``model.fit(..., ps=TFNode.ps_client(ctx, model))``) or
    a parameter count; ``compression="bf16"`` pushes bf16 gradients."""
    return ParameterClient(ctx, total, timeout, compression)


__all__ = [
    "ClusterServer",
    "DataFeed",
    "ParameterClient",
    "hdfs_path",
    "ps_client",
    "serve_parameters",
    "start_cluster_server",
]
