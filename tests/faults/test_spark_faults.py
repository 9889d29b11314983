"""Faults on a real standalone Spark cluster (a master, three one-core workers, each a JVM; conftest.standalone).

The driver is this process (one SparkSession on the cluster for the module).
Each test aims its fault at the process that holds a role (the executor JVM,
or the Python worker under it), then checks the named error, how long it took
and that nothing is left: no node process, no Python worker under the
executors (spark.python.worker.reuse is off, so an idle worker is a stray), no
listening node port, no sparkgrad thread in the driver. After an executor JVM
is killed, the standalone worker starts a new one: the next test waits for
three executors again.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import fault_nodes
import pytest
from cluster_checks import port_closed
from sparkgrad import InputMode, TFCluster
from sparkgrad.errors import InsufficientSlotsError, NodeFailure
from standalone import alive

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

HERE = Path(__file__).resolve().parent
PYTHON_DIR = str(HERE.parents[1] / "python")


def quiet(line: str) -> None:
    pass


@pytest.fixture(scope="module")
def sc(standalone):
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(standalone.url)
        .appName("sparkgrad-faults")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.python.worker.reuse", "false")
        .config("spark.python.task.killTimeout", "2s")
        .config("spark.executorEnv.PYTHONPATH", os.pathsep.join([PYTHON_DIR, str(HERE)]))
        .getOrCreate()
    )
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    sc.addPyFile(str(HERE / "fault_nodes.py"))
    try:
        yield sc
    finally:
        spark.stop()


def executors(sc) -> int:
    return len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1  # less the driver


@pytest.fixture
def cluster3(sc, standalone):
    """The session with three live executors (one per worker), waited for up to 90 s."""
    deadline = time.monotonic() + 90
    while (executors(sc) < 3 or len(standalone.executor_jvms()) < 3) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert executors(sc) == 3, f"only {executors(sc)} executors after 90 s"
    return sc


def _markers(tmp_path: Path, what: str, n: int, timeout: float) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {}
        for p in tmp_path.glob(f"{what}-*.json"):
            try:
                info = json.loads(p.read_text())
            except ValueError:
                continue
            found[info["name"]] = info
        if len(found) >= n:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{len(found)} of {n} nodes wrote {what} markers within {timeout} s: {sorted(found)}")


def strays(standalone, nodes: dict[str, dict], within: float = 30.0) -> list[str]:
    """What is left once the nodes should be gone: node processes, Python workers under executors,
    processes in the cluster's directories that belong to no live executor, open node ports."""
    deadline = time.monotonic() + within
    while True:
        left = [f"node {name} pid {n['pid']} alive" for name, n in nodes.items() if alive(n["pid"])]
        left += [f"python under an executor: {pid} {line}" for pid, line in standalone.python_under_executors()]
        jvms = set(standalone.executor_jvms())
        from standalone import descendants

        under = set(jvms)
        for j in jvms:
            under.update(descendants(j))
        left += [f"orphan {pid}: {line}" for pid, line in standalone.leftovers() if pid not in under]
        left += [f"port {n['port']} of {name} open" for name, n in nodes.items() if not port_closed(n["port"])]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.5)


def _run_and_fault(sc, tmp_path, fault, target: str, kill, *, num_ps=1, master_node=None, heartbeat=10.0):
    """Starts a 3-node ps cluster training until stopped, applies kill(marker) to the target once every
    node trains, and returns (NodeFailure, seconds from the fault to the error, the markers)."""
    args = {"dir": str(tmp_path)}
    cluster = TFCluster.run(
        sc,
        fault_nodes.train_until_stopped,
        args,
        3,
        num_ps,
        master_node=master_node,
        output=quiet,
        reservation_timeout=90,
        heartbeat_timeout=heartbeat,
        stop_grace=3.0,
    )
    try:
        nodes = _markers(tmp_path, "started", 3, 60)
        _markers(tmp_path, "training", 3 - num_ps, 60)
        fault.start()
        kill(nodes[target])
        with pytest.raises(NodeFailure) as info:
            cluster.shutdown(timeout=90)
        seconds = fault.stop()
    finally:
        if not all(launcher.finished() for launcher in cluster._launchers):
            cluster._abort("test teardown")
    assert all(launcher.finished() for launcher in cluster._launchers)
    return info.value, seconds, nodes


def _sigkill(pid_key: str):
    def kill(node: dict) -> None:
        os.kill(node[pid_key], signal.SIGKILL)

    return kill


@pytest.mark.parametrize(
    "target,master_node",
    [("ps:0", None), ("worker:0", None), ("chief:0", "chief")],
    ids=["ps", "worker", "chief"],
)
def test_sigkill_of_the_executor_jvm(cluster3, standalone, tmp_path, fault, target, master_node):
    fault.describe(
        f"SIGKILL of the executor JVM holding {target} (standalone, 3 executors)",
        f"NodeFailure naming {target}, its host and Spark executor; the others stopped",
    )
    jvms = set(standalone.executor_jvms())
    exc, seconds, nodes = _run_and_fault(cluster3, tmp_path, fault, target, _sigkill("jvm"), master_node=master_node)
    assert nodes[target]["jvm"] in jvms, (nodes[target], jvms)  # the fault hit an executor JVM, not something else
    role, index = target.split(":")
    assert (exc.role, exc.index, exc.host) == (role, int(index), "127.0.0.1"), str(exc)
    assert seconds < 30, f"NodeFailure after {seconds} s"
    fault.observed(f"NodeFailure after {seconds:.1f} s: {str(exc).splitlines()[0]}")
    fault.leftovers(strays(standalone, nodes))


def test_sigkill_of_a_python_worker(cluster3, standalone, tmp_path, fault):
    fault.describe(
        "SIGKILL of the Python worker process running worker:0 (its executor JVM lives)",
        "NodeFailure naming worker:0 and its host; the others stopped",
    )
    exc, seconds, nodes = _run_and_fault(cluster3, tmp_path, fault, "worker:0", _sigkill("pid"))
    assert (exc.role, exc.index, exc.host) == ("worker", 0, "127.0.0.1"), str(exc)
    assert seconds < 30
    fault.observed(f"NodeFailure after {seconds:.1f} s: {str(exc).splitlines()[0]}")
    fault.leftovers(strays(standalone, nodes))


def test_sigstop_of_a_worker(cluster3, standalone, tmp_path, fault):
    fault.describe(
        "SIGSTOP of worker:1's Python process (silent, not dead), heartbeat_timeout=4 s",
        "NodeFailure naming worker:1 (no heartbeat) within the heartbeat timeout + slack",
    )
    stopped: list[int] = []

    def freeze(node: dict) -> None:
        os.kill(node["pid"], signal.SIGSTOP)
        stopped.append(node["pid"])

    try:
        exc, seconds, nodes = _run_and_fault(cluster3, tmp_path, fault, "worker:1", freeze, heartbeat=4.0)
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert (exc.role, exc.index, exc.host) == ("worker", 1, "127.0.0.1"), str(exc)
    assert "heartbeat" in str(exc).lower() or "silent" in str(exc).lower(), str(exc)
    assert seconds < 4.0 + 20, f"NodeFailure after {seconds} s"
    fault.observed(f"NodeFailure after {seconds:.1f} s: {str(exc).splitlines()[0]}")
    fault.leftovers(strays(standalone, nodes))


def test_too_few_slots(cluster3, standalone, tmp_path, fault):
    fault.describe(
        "5 nodes asked of a cluster with 3 one-core executors",
        "InsufficientSlotsError before any node starts, naming what is needed and what Spark has",
    )
    fault.start()
    with pytest.raises(InsufficientSlotsError) as info:
        TFCluster.run(
            cluster3, fault_nodes.train_until_stopped, {"dir": str(tmp_path)}, 5, 1, output=quiet, slots_timeout=5
        )
    seconds = fault.stop()
    assert "5 task slots" in str(info.value) and "3" in str(info.value), str(info.value)
    assert seconds < 30
    assert not list(tmp_path.glob("started-*.json"))  # no node ran
    fault.observed(f"InsufficientSlotsError after {seconds:.1f} s: {str(info.value).splitlines()[0]}")
    fault.leftovers(strays(standalone, {}))


def test_ten_thousand_partitions_to_one_worker_under_ulimit_256(cluster3, standalone, tmp_path, fault):
    n_parts, per_part = 10_000, 3
    fault.describe(
        f"{n_parts:,} partitions fed (InputMode.SPARK) to one worker whose RLIMIT_NOFILE is 256",
        "training finishes: every row reaches the worker, no descriptor exhaustion",
    )
    rdd = cluster3.parallelize(range(n_parts * per_part), n_parts)
    cluster = TFCluster.run(
        cluster3,
        fault_nodes.count_feed,
        {"dir": str(tmp_path), "nofile": 256, "feed_timeout": 60},
        1,
        0,
        input_mode=InputMode.SPARK,
        output=quiet,
        reservation_timeout=90,
    )
    nodes = {}
    try:
        nodes = _markers(tmp_path, "started", 1, 60)
        assert nodes["worker:0"]["nofile"] == 256
        fault.start()
        cluster.train(rdd, num_epochs=1, feed_timeout=120)
        cluster.shutdown(timeout=120)
        seconds = fault.stop()
    finally:
        if not all(launcher.finished() for launcher in cluster._launchers):
            cluster._abort("test teardown")
    result = cluster.results[0]
    n = n_parts * per_part
    assert result["rows"] == n and result["sum"] == n * (n - 1) // 2, result
    fault.observed(f"finished in {seconds:.1f} s, {result['rows']:,} rows")
    fault.leftovers(strays(standalone, nodes))
