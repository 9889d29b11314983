"""Roles of a sparkgrad cluster and the template that assigns them.

Executors are numbered 0..num_executors-1 and take roles in TensorFlowOnSpark's
order: the first ``num_ps`` are parameter servers, then one chief (or master)
when ``master_node`` is given, then one evaluator when ``eval_node`` is set, and
the rest are workers. This module only computes that assignment; it does not
start anything.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sparkgrad.errors import InvalidArgumentError


class InputMode(enum.IntEnum):
    """How the training nodes of a `TFCluster` get their data (the values are TensorFlowOnSpark's)."""

    TENSORFLOW = 0  # each worker reads its own shard (TFRecords) itself
    """Each worker reads its own shard itself; ``cluster.train`` is not used.

    For example a `sparkgrad.data.TFRecordDataset` with ``shard_index=ctx.task_index``.
    """
    SPARK = 1  # the driver streams RDD partitions to the workers (cluster.train)
    """Spark feeds the workers: ``cluster.train(rdd_or_df)`` streams partitions to them.

    ``map_fun`` reads them with ``TFNode.DataFeed(ctx.mgr)``.
    """


PS = "ps"
CHIEF = "chief"
MASTER = "master"
EVALUATOR = "evaluator"
WORKER = "worker"

# Roles that train and count in ctx.num_workers; ps and evaluator serve until stopped.
TRAINING_ROLES = (CHIEF, MASTER, WORKER)
SERVING_ROLES = (PS, EVALUATOR)
ROLE_ORDER = (PS, CHIEF, MASTER, EVALUATOR, WORKER)


@dataclass(frozen=True)
class NodeRole:
    """The role of one executor: ``role:index`` (e.g. ``worker:1``)."""

    executor_id: int
    role: str
    index: int

    @property
    def name(self) -> str:
        return f"{self.role}:{self.index}"

    @property
    def is_serving(self) -> bool:
        """ps and evaluator nodes run until the driver stops them."""
        return self.role in SERVING_ROLES


@dataclass(frozen=True)
class ClusterTemplate:
    """Which executor holds which role, ordered by executor_id."""

    nodes: tuple[NodeRole, ...]

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    def node(self, executor_id: int) -> NodeRole:
        if not 0 <= executor_id < len(self.nodes):
            raise InvalidArgumentError(
                f"executor_id {executor_id} is outside the cluster of {len(self.nodes)} nodes",
                executor_id=executor_id,
            )
        return self.nodes[executor_id]

    def executors(self, role: str) -> tuple[int, ...]:
        return tuple(n.executor_id for n in self.nodes if n.role == role)

    def as_dict(self) -> dict[str, list[int]]:
        """``{"ps": [0], "worker": [1, 2]}`` in role order (TensorFlowOnSpark's cluster_template)."""
        out: dict[str, list[int]] = {}
        for role in ROLE_ORDER:
            ids = self.executors(role)
            if ids:
                out[role] = list(ids)
        return out


def build_template(
    num_executors: int, num_ps: int, master_node: str | None = None, eval_node: bool = False
) -> ClusterTemplate:
    """Assigns roles to executors 0..num_executors-1 in TensorFlowOnSpark's order.

    Raises InvalidArgumentError when the numbers leave no chief or worker, or
    when master_node is neither "chief" nor "master".
    """
    if num_executors < 1:
        raise InvalidArgumentError(f"num_executors must be at least 1, got {num_executors}")
    if num_ps < 0:
        raise InvalidArgumentError(f"num_ps must be at least 0, got {num_ps}")
    if master_node not in (None, CHIEF, MASTER):
        raise InvalidArgumentError(f"master_node must be None, 'chief' or 'master', got {master_node!r}")
    num_master = 1 if master_node else 0
    num_eval = 1 if eval_node else 0
    num_workers = num_executors - num_ps - num_master - num_eval
    if num_workers < 0 or num_master + num_workers == 0:
        raise InvalidArgumentError(
            f"num_executors={num_executors} leaves no chief or worker after num_ps={num_ps}"
            f"{', a ' + master_node if master_node else ''}{', an evaluator' if eval_node else ''}: "
            "a cluster needs at least one training node",
            num_executors=num_executors,
            num_ps=num_ps,
        )
    counts = [(PS, num_ps), (master_node or CHIEF, num_master), (EVALUATOR, num_eval), (WORKER, num_workers)]
    nodes: list[NodeRole] = []
    for role, count in counts:
        for index in range(count):
            nodes.append(NodeRole(executor_id=len(nodes), role=role, index=index))
    return ClusterTemplate(nodes=tuple(nodes))
