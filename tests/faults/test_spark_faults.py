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

import os
import signal

import fault_nodes
import pytest
from faults_spark import markers as _markers
from faults_spark import quiet, session, strays, wait_executors
from sparkgrad import TFCluster
from sparkgrad.errors import InsufficientSlotsError, NodeFailure

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def sc(standalone):
    spark = session(standalone, "sparkgrad-faults", reuse_python_workers=False)
    try:
        yield spark.sparkContext
    finally:
        spark.stop()


@pytest.fixture
def cluster3(sc, standalone):
    """The session with three live executors (one per worker)."""
    wait_executors(sc, standalone, 3)
    return sc


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
    fault.observed(f"NodeFailure after {seconds:.1f} s: {str(exc).splitlines()[0]}")
    left = strays(standalone, nodes)
    fault.row["leftovers"] = "none" if not left else "; ".join(left)[:300]
    assert nodes[target]["jvm"] in jvms, (nodes[target], jvms)  # the fault hit an executor JVM, not something else
    role, index = target.split(":")
    named = f"{exc.role}:{exc.index} on {exc.host}"
    assert (exc.role, exc.index, exc.host) == (role, int(index), "127.0.0.1"), (
        f"NodeFailure names {named}, not {target}"
    )
    assert seconds < 30, f"NodeFailure after {seconds} s"
    fault.leftovers(left)


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
    assert "died" not in str(exc), str(exc)  # stopped, not dead: the message must not say otherwise
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
