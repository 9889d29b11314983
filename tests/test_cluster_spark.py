"""TFCluster.run on a real local Spark (local[4], barrier mode): formation, ctx, failures."""

from __future__ import annotations

import json
import os
import pathlib
import time

import cluster_nodes
import pytest
from cluster_checks import Lines, check_driver_interrupt_ends_every_node, port_closed
from sparkgrad import TFCluster
from sparkgrad.cluster import launch, rank
from sparkgrad.errors import ClusterError, InsufficientSlotsError, NodeFailure, RendezvousTimeout

pytestmark = [pytest.mark.spark, pytest.mark.timeout(120)]

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def sc(spark_context):
    spark_context.addPyFile(str(HERE / "cluster_nodes.py"))
    return spark_context


def test_cluster_forms_with_roles_spec_and_tf_config(sc, tmp_path):
    out = Lines()
    started = time.monotonic()
    cluster = TFCluster.run(
        sc, cluster_nodes.write_ctx, {"dir": str(tmp_path)}, 3, 1, output=out, reservation_timeout=60
    )
    formed = time.monotonic() - started
    cluster.shutdown(timeout=60)
    ctxs = {i: json.loads((tmp_path / f"ctx-{i}.json").read_text()) for i in range(3)}
    spec = ctxs[0]["cluster_spec"]
    assert set(spec) == {"ps", "worker"} and len(spec["ps"]) == 1 and len(spec["worker"]) == 2
    assert spec == cluster.cluster_spec
    assert [(c["job_name"], c["task_index"]) for c in ctxs.values()] == [("ps", 0), ("worker", 0), ("worker", 1)]
    for i, c in ctxs.items():
        assert c["executor_id"] == c["worker_num"] == i
        assert c["num_workers"] == 2
        assert c["defaultFS"].startswith("file://")
        assert c["tf_config"]["cluster"] == spec
        assert c["tf_config"]["task"] == {"type": c["job_name"], "index": c["task_index"]}
        # the port in the spec is the node's own listening socket, bound before registration
        assert spec[c["job_name"]][c["task_index"]] == f"127.0.0.1:{c['listener_port']}"
        assert port_closed(c["listener_port"])
    assert cluster.results == {0: "ps stopped", 1: {"task_index": 0}, 2: {"task_index": 1}}
    assert any(line.startswith("worker:1 ") and "stdout line from worker:1" in line for line in out.lines)
    assert any(line.startswith("ps:0 ") and "node ps:0 up on" in line for line in out.lines)
    assert sorted((m.role, m.index, m.name, m.value) for m in cluster.metrics) == [
        ("worker", 0, "loss", 1.0),
        ("worker", 1, "loss", 0.5),
    ]
    assert formed < 30


def test_nodes_echo_to_executor_logs_only_off_a_local_master(sc):
    from types import SimpleNamespace

    from sparkgrad.cluster.spark import ClassicSpark, SparkLauncher

    def echo(master_sc) -> bool:
        return SparkLauncher(ClassicSpark(master_sc), None, (0,), cluster_nodes.write_ctx, None)._task.echo

    assert not echo(sc)  # local[...]: the driver's prefixed copy is the only one
    assert echo(SimpleNamespace(master="local-cluster[2,1,1024]"))
    assert echo(SimpleNamespace(master="spark://host:7077"))


def test_driver_ps_nodes_run_the_ps_as_a_thread_of_the_driver(sc, tmp_path, capsys, caplog):
    import logging
    import sys
    import threading

    out = Lines()
    stdout_before, stderr_before = sys.stdout, sys.stderr
    root_handlers = list(logging.getLogger().handlers)
    cluster = TFCluster.run(sc, cluster_nodes.write_ctx, {"dir": str(tmp_path)}, 3, 1, driver_ps_nodes=True, output=out)
    print("the driver's own line")  # while the ps thread runs: stays on the driver's stdout, not forwarded
    cluster.shutdown(timeout=60)
    ctxs = [json.loads((tmp_path / f"ctx-{i}.json").read_text()) for i in range(3)]
    ps = ctxs[0]
    assert ps["job_name"] == "ps" and ps["pid"] == os.getpid() and ps["thread"] == "sparkgrad-ps-0"
    # the ps thread's rank is its own; the driver's thread stays a single process of rank 0
    assert ps["rank"] == [None, 2, "ps"] and rank.current() == rank.ProcessRank(0, 1, "local")
    assert all(c["pid"] != os.getpid() for c in ctxs[1:])  # Spark's Python workers
    assert cluster.results == {0: "ps stopped", 1: {"task_index": 0}, 2: {"task_index": 1}}
    # the driver's environment gets no TF_CONFIG; ctx has it, and the executors' environments too
    assert ps["tf_config"] is None and "TF_CONFIG" not in os.environ
    assert ps["ctx_tf_config"]["task"] == {"type": "ps", "index": 0}
    assert all(c["tf_config"] == c["ctx_tf_config"] for c in ctxs[1:])
    # the ps thread's print reaches the driver prefixed, once; the driver's own output is not forwarded
    assert sum(line == "ps:0 stdout line from ps:0" for line in out.lines) == 1
    assert not any("the driver's own line" in line for line in out.lines)
    assert "the driver's own line" in capsys.readouterr().out
    # its log records are the driver's own, handled by the driver's logging (here pytest's)
    assert any(r.threadName == "sparkgrad-ps-0" and "node ps:0 up on" in r.getMessage() for r in caplog.records)
    assert (sys.stdout, sys.stderr) == (stdout_before, stderr_before)  # the per-thread routing is gone
    assert logging.getLogger().handlers == root_handlers
    assert not [t.name for t in threading.enumerate() if t.name.startswith("sparkgrad-ps")]
    assert port_closed(ps["listener_port"])


def test_rendezvous_and_driver_ps_bind_the_bind_host_and_never_spark_s_wildcard(sc, tmp_path):
    """spark.driver.bindAddress=0.0.0.0 (Spark's wildcard) is not taken for the rendezvous: it binds
    the advertised host; an explicit spark.sparkgrad.driver.bindAddress is, and the ps run by the
    driver (driver_ps_nodes) listens there too while the spec keeps the advertised host."""
    from sparkgrad.cluster.spark import ClassicSpark, driver_address

    conf = sc._conf  # the live configuration: changed for this test only, and restored
    saved = conf.get("spark.driver.bindAddress")
    try:
        conf.set("spark.driver.bindAddress", "0.0.0.0")
        assert driver_address(ClassicSpark(sc)) == ("127.0.0.1", "127.0.0.1")
        conf.set("spark.sparkgrad.driver.bindAddress", "0.0.0.0")
        assert driver_address(ClassicSpark(sc)) == ("127.0.0.1", "0.0.0.0")
        cluster = TFCluster.run(sc, cluster_nodes.write_ctx, {"dir": str(tmp_path)}, 2, 1, driver_ps_nodes=True)
        cluster.shutdown(timeout=60)
        ps = json.loads((tmp_path / "ctx-0.json").read_text())
        assert ps["job_name"] == "ps" and ps["listener_host"] == "0.0.0.0"
        assert ps["cluster_spec"]["ps"] == [f"127.0.0.1:{ps['listener_port']}"]
    finally:
        conf._jconf.remove("spark.sparkgrad.driver.bindAddress")
        conf.set("spark.driver.bindAddress", saved)


def test_exception_in_a_driver_ps_thread_raises_node_failure_and_stops_the_workers(sc, tmp_path):
    import threading

    args = {"dir": str(tmp_path), "target": "ps:0"}
    cluster = TFCluster.run(
        sc, cluster_nodes.raise_on_target, args, 3, 1, driver_ps_nodes=True, output=Lines(), reservation_timeout=60
    )
    with pytest.raises(NodeFailure) as info:
        cluster.shutdown(timeout=60)
    assert (info.value.role, info.value.index, info.value.executor_id) == ("ps", 0, 0)
    assert "ValueError: boom from ps:0" in str(info.value) and "raise_on_target" in info.value.remote_traceback
    assert sorted(p.name for p in tmp_path.glob("stopped-*.json")) == ["stopped-1.json", "stopped-2.json"]
    assert not [t.name for t in threading.enumerate() if t.name.startswith("sparkgrad-ps")]


def test_exception_in_map_fun_raises_node_failure_with_remote_traceback(sc, tmp_path):
    args = {"dir": str(tmp_path), "target": "worker:1"}
    cluster = TFCluster.run(sc, cluster_nodes.raise_on_target, args, 3, 1, output=Lines(), reservation_timeout=60)
    with pytest.raises(NodeFailure) as info:
        cluster.shutdown(timeout=60)
    exc = info.value
    assert (exc.role, exc.index, exc.host, exc.executor_id) == ("worker", 1, "127.0.0.1", 2)
    assert "ValueError: boom from worker:1" in str(exc)
    assert "raise_on_target" in exc.remote_traceback
    # the other nodes were told to stop and ended
    assert sorted(p.name for p in tmp_path.glob("stopped-*.json")) == ["stopped-0.json", "stopped-1.json"]


@pytest.mark.parametrize("driver_ps_nodes", [False, True], ids=["ps_task", "ps_in_driver"])
def test_sigkill_of_a_worker_raises_node_failure_and_stops_the_rest(sc, tmp_path, driver_ps_nodes):
    args = {"dir": str(tmp_path), "target": "worker:0"}
    cluster = TFCluster.run(
        sc,
        cluster_nodes.kill_target,
        args,
        3,
        1,
        driver_ps_nodes=driver_ps_nodes,
        output=Lines(),
        reservation_timeout=60,
    )
    started = time.monotonic()
    with pytest.raises(NodeFailure) as info:
        cluster.shutdown(timeout=60)
    assert time.monotonic() - started < 30
    assert (info.value.role, info.value.index) == ("worker", 0)
    assert "lost" in str(info.value)
    assert sorted(p.name for p in tmp_path.glob("stopped-*.json")) == ["stopped-0.json", "stopped-2.json"]
    for marker in tmp_path.glob("started-*.json"):
        assert port_closed(json.loads(marker.read_text())["port"])
    assert all(launcher.finished() for launcher in cluster._launchers)  # the ps thread too, when in the driver


def test_sigkill_of_the_ps_raises_node_failure(sc, tmp_path):
    args = {"dir": str(tmp_path), "target": "ps:0"}
    cluster = TFCluster.run(sc, cluster_nodes.kill_target, args, 3, 1, output=Lines(), reservation_timeout=60)
    with pytest.raises(NodeFailure) as info:
        cluster.shutdown(timeout=60)
    assert (info.value.role, info.value.index) == ("ps", 0)
    assert sorted(p.name for p in tmp_path.glob("stopped-*.json")) == ["stopped-1.json", "stopped-2.json"]
    assert all(launcher.finished() for launcher in cluster._launchers)


def test_node_that_ignores_stop_is_interrupted(sc, tmp_path):
    args = {"dir": str(tmp_path), "target": "worker:1"}
    # worker:1 raises; worker:0 spins without looking at should_stop() and must still end
    cluster = TFCluster.run(
        sc, cluster_nodes.raise_on_target, args, 2, 0, output=Lines(), reservation_timeout=60, stop_grace=1.0
    )
    with pytest.raises(NodeFailure):
        cluster.shutdown(timeout=60)
    cluster = TFCluster.run(
        sc, cluster_nodes.busy_until_interrupted, args, 2, 0, output=Lines(), reservation_timeout=60, stop_grace=1.0
    )
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        cluster.shutdown(timeout=2)
    assert all(launcher.finished() for launcher in cluster._launchers)
    assert time.monotonic() - started < 30


def test_more_nodes_than_slots_fails_fast(sc, tmp_path):
    started = time.monotonic()
    with pytest.raises(InsufficientSlotsError, match=r"needs 5 task slots \(5 nodes.* Spark has 4"):
        TFCluster.run(sc, cluster_nodes.write_ctx, {"dir": str(tmp_path)}, 5, 1, output=Lines())
    assert time.monotonic() - started < 20  # refused without waiting slots_timeout (30 s) for more slots


def test_dynamic_allocation_is_refused_with_the_reason(sc, tmp_path):
    sc._conf.set("spark.dynamicAllocation.enabled", "true")
    try:
        with pytest.raises(ClusterError, match="barrier stage"):
            TFCluster.run(sc, cluster_nodes.write_ctx, {"dir": str(tmp_path)}, 2, 0, output=Lines())
    finally:
        sc._conf.set("spark.dynamicAllocation.enabled", "false")


def test_reservation_timeout_names_the_missing_node(sc, tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "held_executors", lambda: frozenset({2}))
    started = time.monotonic()
    with pytest.raises(RendezvousTimeout) as info:
        TFCluster.run(sc, cluster_nodes.write_ctx, {"dir": str(tmp_path)}, 3, 1, output=Lines(), reservation_timeout=4)
    assert 4 * 0.9 <= time.monotonic() - started < 30  # it waited reservation_timeout for the held node
    message = str(info.value)
    assert "missing" in message and "2" in message
    assert "slots" in message and "firewall" in message
    # the cluster's job is gone: a new cluster gets every slot at once
    monkeypatch.setattr(launch, "held_executors", frozenset)  # every node registers
    cluster = TFCluster.run(
        sc, cluster_nodes.write_ctx, {"dir": str(tmp_path)}, 4, 1, output=Lines(), reservation_timeout=60
    )
    cluster.shutdown(timeout=60)


def test_driver_interrupt_cancels_the_spark_job(sc, tmp_path):
    check_driver_interrupt_ends_every_node(sc, tmp_path)
