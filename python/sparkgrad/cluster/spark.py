"""Running nodes on Spark executors: pre-flight checks, addresses, the barrier job.

The node job is one barrier stage (``rdd.barrier().mapPartitions``) of one
partition per node, so Spark starts every node at once or not at all, and
fails the stage as a whole. Before submitting it the driver checks that
dynamic allocation is off and that enough task slots exist, so a cluster that
cannot form fails at once with a reason instead of waiting for reservations.
The job runs in a background thread under its own job group, which is what
cancel() cancels.

Addresses come from Spark's own configuration and task info, never from
connecting to a public address.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sparkgrad.cluster.node import MapFun, NodeConfig, run_node
from sparkgrad.errors import ClusterError, InsufficientSlotsError

SLOT_POLL_SECONDS = 0.5


def spark_conf(sc: Any) -> Any:
    """The context's live configuration, read key by key.

    ``sc.getConf()`` copies every entry through py4j (two calls per entry to
    read it, one to write it into a new JVM SparkConf): 10-20 ms on each
    run(), for the five keys read here.
    """
    conf = getattr(sc, "_conf", None)
    return conf if conf is not None else sc.getConf()


def driver_address(sc: Any) -> tuple[str, str]:
    """(advertised host, bind host) of the driver's rendezvous server.

    Advertised: env SPARKGRAD_DRIVER_HOST, else Spark conf
    spark.sparkgrad.driver.host, else spark.driver.host (the address executors
    already use to reach the driver). Bound: spark.sparkgrad.driver.bindAddress,
    else the override, else spark.driver.bindAddress, else the advertised host.
    """
    conf = spark_conf(sc)
    override = os.environ.get("SPARKGRAD_DRIVER_HOST") or conf.get("spark.sparkgrad.driver.host")
    spark_host = conf.get("spark.driver.host")
    host = override or spark_host
    if not host:
        raise ClusterError(
            "cannot tell the executors where the driver is: spark.driver.host is not set; "
            "set SPARKGRAD_DRIVER_HOST or spark.sparkgrad.driver.host"
        )
    bind = conf.get("spark.sparkgrad.driver.bindAddress") or override or conf.get("spark.driver.bindAddress") or host
    return host, bind


def task_host(address: str) -> str:
    """The host part of a BarrierTaskInfo address ("host:port", "[v6]:port")."""
    host = address.rpartition(":")[0] if ":" in address else address
    return host.strip("[]") or address


def is_local_master(sc: Any) -> bool:
    return str(sc.master).startswith("local[") or str(sc.master) == "local"


def available_slots(sc: Any) -> int:
    """Task slots Spark can run at once (what its own barrier check counts)."""
    jsc = sc._jsc.sc()
    try:
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # noqa: BLE001 - py4j errors of older Sparks: fall back to the public estimate
        cpus = int(spark_conf(sc).get("spark.task.cpus", "1"))
        return int(sc.defaultParallelism) // max(cpus, 1)


def check_spark(sc: Any, num_nodes: int, slots_timeout: float, feed_slots: int = 0) -> None:
    """Refuses dynamic allocation and raises InsufficientSlotsError when Spark lacks slots.

    On a non-local master, executors may still be registering: the check
    re-reads the slot count until ``slots_timeout`` seconds have passed.
    """
    conf = spark_conf(sc)
    if conf.get("spark.dynamicAllocation.enabled", "false").strip().lower() == "true":
        raise ClusterError(
            "spark.dynamicAllocation.enabled=true: sparkgrad runs its nodes as one barrier stage that needs all "
            "executors at once for the whole training, and Spark neither runs barrier stages under dynamic "
            "allocation nor keeps executors that it may remove mid-training; disable dynamic allocation "
            "(and autoscaling on Databricks) for this cluster"
        )
    deadline = time.monotonic() + (0.0 if is_local_master(sc) else slots_timeout)
    needed = num_nodes + feed_slots
    slots = available_slots(sc)
    while slots < needed and time.monotonic() < deadline:
        threading.Event().wait(SLOT_POLL_SECONDS)  # executors register asynchronously; Spark has no callback
        slots = available_slots(sc)
    if slots < needed:
        cpus = conf.get("spark.task.cpus", "1")
        raise InsufficientSlotsError(
            f"the cluster needs {needed} task slots ({num_nodes} nodes, one per task, all running at once in a "
            f"barrier stage{f', plus {feed_slots} for the feeding tasks of InputMode.SPARK' if feed_slots else ''}) "
            f"but Spark has {slots} (master {sc.master}, spark.task.cpus={cpus}"
            f"{'' if is_local_master(sc) else f', after waiting {slots_timeout:g} s for executors'}): "
            "add executors, lower num_executors, or lower spark.task.cpus",
            needed=needed,
            available=slots,
        )


@dataclass(frozen=True)
class SparkNodeTask:
    """The barrier-partition function: partition i runs the node of executor_ids[i].

    ``echo``: also write the node's output to the executor's own stdout/stderr
    (its executor log). Off on a local master, whose Python workers share the
    driver's terminal: there the driver's role:index-prefixed copy is the one
    line shown.
    """

    cfg: NodeConfig
    executor_ids: tuple[int, ...]
    map_fun: MapFun
    tf_args: Any
    echo: bool = True

    def __call__(self, _rows: Iterator[Any]) -> Iterator[str]:
        from pyspark import BarrierTaskContext

        task = BarrierTaskContext.get()
        part = task.partitionId()
        host = os.environ.get("SPARKGRAD_NODE_HOST") or task_host(task.getTaskInfos()[part].address)
        yield run_node(self.cfg, self.executor_ids[part], host, self.map_fun, self.tf_args, echo=self.echo)


def _spark_error(exc: BaseException) -> str:
    """Spark's failure without the JVM stack: its first line and any Python traceback inside it."""
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else f"{type(exc).__name__}: {exc}"
    lines = text.splitlines()
    keep = lines[:1]
    in_python = False
    for line in lines[1:]:
        if "Traceback (most recent call last):" in line:
            in_python = True
        elif line.startswith("\tat ") or line.startswith("\t... "):
            if in_python:
                break
            continue
        if in_python:
            keep.append(line)
    return "\n".join(keep[:60])


class SparkJob:
    """One Spark action run in a background thread under its own job group (so it can be cancelled)."""

    CANCEL_WAIT_SECONDS = 30.0  # Spark kills a cancelled task's Python worker after spark.python.task.killTimeout

    def __init__(self, sc: Any, description: str) -> None:
        self.group = f"sparkgrad-{uuid.uuid4().hex[:12]}"
        self.description = description
        self.result: Any = None
        self.error: str | None = None
        self.cancelled = False
        self._sc = sc
        self._ended = threading.Event()

    def start(self, action: Callable[[], Any]) -> None:
        def run() -> None:
            try:
                self._sc.setJobGroup(self.group, self.description, interruptOnCancel=True)
                self.result = action()
            except BaseException as exc:  # noqa: BLE001 - kept for the caller in .error
                self.error = _spark_error(exc)
            finally:
                self._ended.set()

        threading.Thread(target=run, name=f"sparkgrad-job-{self.group}", daemon=True).start()

    def wait(self, timeout: float) -> bool:
        return self._ended.wait(timeout)

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def cancel(self) -> None:
        self.cancelled = True
        self._sc.cancelJobGroup(self.group)
        self._ended.wait(self.CANCEL_WAIT_SECONDS)


class SparkLauncher:
    """Runs nodes as one barrier stage of a background SparkJob."""

    def __init__(self, sc: Any, cfg: NodeConfig, executor_ids: tuple[int, ...], map_fun: MapFun, tf_args: Any):
        self.executor_ids = executor_ids
        self._sc = sc
        self._task = SparkNodeTask(cfg, executor_ids, map_fun, tf_args, echo=not is_local_master(sc))
        self._job = SparkJob(sc, f"sparkgrad cluster of {len(executor_ids)} nodes")

    def start(self) -> None:
        n = len(self.executor_ids)
        self._job.start(lambda: self._sc.parallelize(range(n), n).barrier().mapPartitions(self._task).collect())

    @property
    def statuses(self) -> list[str]:
        return list(self._job.result or [])

    def failure(self) -> str | None:
        return None if self._job.cancelled else self._job.error

    def finished(self) -> bool:
        return self._job.ended

    def join(self, timeout: float) -> bool:
        return self._job.wait(timeout)

    def cancel(self, grace: float) -> None:
        if not self._job.wait(grace):
            self._job.cancel()

    def missing_hint(self) -> str:
        return (
            f"Spark could not start all {len(self.executor_ids)} barrier tasks at once (too few free task slots, "
            "or other jobs hold the executors), or executors cannot reach the driver's port (firewall, "
            "wrong spark.driver.host: set SPARKGRAD_DRIVER_HOST)"
        )
