"""Driver-side helpers of the fault suite's Spark tests: the session on the standalone cluster, waits, leftovers."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from cluster_checks import port_closed
from standalone import alive, descendants, listening_ports

HERE = Path(__file__).resolve().parent
PYTHON_DIR = str(HERE.parents[1] / "python")


def quiet(line: str) -> None:
    pass


def session(standalone, name: str, reuse_python_workers: bool):
    """A SparkSession on the standalone cluster, one core per executor; fault_nodes.py shipped."""
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(standalone.url)
        .appName(name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.python.worker.reuse", "true" if reuse_python_workers else "false")
        .config("spark.python.task.killTimeout", "2s")
        .config("spark.executorEnv.PYTHONPATH", os.pathsep.join([PYTHON_DIR, str(HERE)]))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.sparkContext.addPyFile(str(HERE / "fault_nodes.py"))
    return spark


def executors(sc) -> int:
    return len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1  # less the driver


def wait_executors(sc, standalone, n: int, timeout: float = 90.0) -> None:
    """Until the session has n executors (after a kill the standalone worker starts a new one)."""
    deadline = time.monotonic() + timeout
    while (executors(sc) < n or len(standalone.executor_jvms()) < n) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert executors(sc) == n, f"only {executors(sc)} executors after {timeout} s"


def markers(tmp_path: Path, what: str, n: int, timeout: float) -> dict[str, dict]:
    """The <what>-*.json files of n nodes (fault_nodes._mark), by node name, waited for up to timeout."""
    deadline = time.monotonic() + timeout
    found: dict[str, dict] = {}
    while time.monotonic() < deadline:
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


def _threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def strays(standalone, nodes: dict[str, dict], within: float = 30.0, reused: bool = False) -> list[str]:
    """What is left once the nodes should be gone, rechecked until `within` s: node processes, Python
    workers under the executors, processes in the cluster's directories under no live executor, open
    node ports. With `reused` (spark.python.worker.reuse on) a node's process may go back to Spark's
    pool of idle workers: then it must hold no listening socket and no thread but its main one."""
    deadline = time.monotonic() + within
    while True:
        left = []
        for name, n in nodes.items():
            if not alive(n["pid"]):
                continue
            if not reused:
                left.append(f"node {name} pid {n['pid']} alive")
            elif listening_ports(n["pid"]) or _threads(n["pid"]) > 1:
                left.append(
                    f"node {name} pid {n['pid']}: {_threads(n['pid'])} threads, listening on "
                    f"{sorted(listening_ports(n['pid']))}"
                )
        if not reused:
            left += [f"python under an executor: {pid} {line}" for pid, line in standalone.python_under_executors()]
        jvms = set(standalone.executor_jvms())
        under = set(jvms)
        for j in jvms:
            under.update(descendants(j))
        left += [f"orphan {pid}: {line}" for pid, line in standalone.leftovers() if pid not in under]
        left += [f"port {n['port']} of {name} open" for name, n in nodes.items() if not port_closed(n["port"])]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.5)
