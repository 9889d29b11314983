"""Roles, ctx, cluster spec, TF_CONFIG and hdfs_path (no network, no Spark)."""

from __future__ import annotations

import dataclasses
import getpass
import json

import pytest
from sparkgrad import InputMode, TFCluster, TFNode
from sparkgrad.cluster import NodeContext, NodeInfo, build_template
from sparkgrad.cluster.context import cluster_spec, tf_config
from sparkgrad.errors import InvalidArgumentError, SparkgradTimeout


def test_template_orders_ps_then_chief_then_evaluator_then_workers():
    t = build_template(6, 2, master_node="chief", eval_node=True)
    assert [(n.executor_id, n.role, n.index) for n in t.nodes] == [
        (0, "ps", 0),
        (1, "ps", 1),
        (2, "chief", 0),
        (3, "evaluator", 0),
        (4, "worker", 0),
        (5, "worker", 1),
    ]
    assert t.as_dict() == {"ps": [0, 1], "chief": [2], "evaluator": [3], "worker": [4, 5]}


def test_template_without_master_is_ps_then_workers():
    t = build_template(3, 1)
    assert t.as_dict() == {"ps": [0], "worker": [1, 2]}
    assert t.node(2).name == "worker:1"
    assert t.node(0).is_serving and not t.node(1).is_serving


def test_template_master_name_is_kept():
    assert build_template(2, 0, master_node="master").as_dict() == {"master": [0], "worker": [1]}


def test_template_is_frozen():
    t = build_template(2, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.nodes[0].role = "worker"  # type: ignore[misc]


@pytest.mark.parametrize(
    "args, words",
    [
        ((1, 1), "no chief or worker"),
        ((2, 1, None, True), "no chief or worker"),
        ((0, 0), "at least 1"),
        ((3, -1), "num_ps"),
        ((3, 1, "boss"), "master_node"),
    ],
)
def test_template_rejects_impossible_clusters(args, words):
    with pytest.raises(InvalidArgumentError, match=words):
        build_template(*args)


def test_template_rejects_unknown_executor():
    with pytest.raises(InvalidArgumentError, match="executor_id 3"):
        build_template(3, 1).node(3)


def _nodes() -> tuple[NodeInfo, ...]:
    specs = [(0, "ps", 0, 7000), (1, "chief", 0, 7001), (2, "evaluator", 0, 7002), (3, "worker", 0, 7003)]
    return tuple(NodeInfo(e, r, i, f"10.0.0.{e}", p, 100 + e) for e, r, i, p in specs)


def _ctx(**over) -> NodeContext:
    nodes = _nodes()
    base = dict(
        executor_id=3,
        job_name="worker",
        task_index=0,
        cluster_spec=cluster_spec(nodes),
        defaultFS="hdfs://nn:8020",
        working_dir="/home/me/job",
        nodes=nodes,
    )
    base.update(over)
    return NodeContext(**base)


def test_cluster_spec_lists_addresses_by_role_in_task_order():
    assert cluster_spec(_nodes()) == {
        "ps": ["10.0.0.0:7000"],
        "chief": ["10.0.0.1:7001"],
        "evaluator": ["10.0.0.2:7002"],
        "worker": ["10.0.0.3:7003"],
    }


def test_ctx_has_tensorflowonspark_fields():
    ctx = _ctx()
    assert ctx.worker_num == ctx.executor_id == 3
    assert ctx.num_workers == 2  # chief + worker; not ps, not evaluator
    assert not ctx.is_chief
    assert _ctx(executor_id=1, job_name="chief").is_chief
    assert [n.name for n in ctx.nodes_of("ps")] == ["ps:0"]


def test_tf_config_names_the_task_and_leaves_the_evaluator_out_of_the_cluster():
    cfg = json.loads(_ctx().tf_config)
    assert cfg["task"] == {"type": "worker", "index": 0}
    assert cfg["cluster"] == {"ps": ["10.0.0.0:7000"], "chief": ["10.0.0.1:7001"], "worker": ["10.0.0.3:7003"]}
    assert json.loads(tf_config({"worker": ["a:1"]}, "evaluator", 0))["task"]["type"] == "evaluator"


@pytest.mark.parametrize(
    "fs, path, expected",
    [
        ("hdfs://nn:8020", "s3a://bucket/x", "s3a://bucket/x"),
        ("hdfs://nn:8020", "dbfs:/mnt/x", "dbfs:/mnt/x"),
        ("hdfs://nn:8020", "/data/x", "hdfs://nn:8020/data/x"),
        ("hdfs://nn:8020/", "/data/x", "hdfs://nn:8020/data/x"),
        ("hdfs://nn:8020", "data/x", f"hdfs://nn:8020/user/{getpass.getuser()}/data/x"),
        ("viewfs://c", "data", f"viewfs://c/user/{getpass.getuser()}/data"),
        ("file://", "/tmp/x", "file:///tmp/x"),
        ("file:///", "/tmp/x", "file:///tmp/x"),
        ("file://", "rel/x", "file:///home/me/job/rel/x"),
        ("abfss://c@acct", "rel", "abfss://c@acct/rel"),
    ],
)
def test_hdfs_path_follows_tensorflowonspark(fs, path, expected):
    ctx = _ctx(defaultFS=fs)
    assert TFNode.hdfs_path(ctx, path) == expected
    assert ctx.absolute_path(path) == expected


def test_cluster_server_join_returns_on_stop_and_times_out_otherwise():
    ctx = _ctx(host="10.0.0.3", port=7003)
    server = TFNode.start_cluster_server(ctx)
    spec, same = server
    assert spec == ctx.cluster_spec and same is server
    with pytest.raises(SparkgradTimeout, match="10.0.0.3:7003.*stop"):
        server.join(timeout=0.05)
    ctx.stop_event.set()
    server.join(timeout=0.05)
    assert ctx.should_stop()


def test_stop_hooks_run_once_on_stop_and_at_once_after_it():
    ctx = _ctx()
    calls: list[str] = []
    ctx.on_stop(lambda: calls.append("a"))
    unhook = ctx.on_stop(lambda: calls.append("dropped"))
    unhook()
    ctx.signal_stop()
    ctx.signal_stop()
    assert calls == ["a"] and ctx.should_stop()
    ctx.on_stop(lambda: calls.append("late"))
    assert calls == ["a", "late"]


def test_public_names_match_tensorflowonspark():
    assert TFCluster.InputMode is InputMode
    assert InputMode.TENSORFLOW == 0 and InputMode.SPARK == 1
    assert callable(TFCluster.run)
