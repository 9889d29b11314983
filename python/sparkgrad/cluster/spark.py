"""Running nodes on Spark executors: the session kinds, pre-flight checks, addresses, the barrier job.

Two kinds of Spark session reach TFCluster.run: a classic SparkContext (or a
classic SparkSession, whose context is used) and a Spark Connect session,
which has no SparkContext and no RDDs (Databricks Standard access mode,
serverless, Databricks Connect). ClassicSpark and ConnectSpark give the rest
of sparkgrad the same few things: configuration keys, the master, the task
slots, the default filesystem, one barrier stage, and cancelling the jobs a
thread started (job groups on classic Spark, tags on Connect).

The node job is one barrier stage of one partition per node
(``rdd.barrier().mapPartitions`` on classic Spark, ``mapInArrow(...,
barrier=True)`` on Connect), so Spark starts every node at once or not at
all, and fails the stage as a whole. Before submitting it the driver checks
that dynamic allocation is off and that enough task slots exist, so a cluster
that cannot form fails at once with a reason instead of waiting for
reservations. The job runs in a background thread under its own job group or
tag, which is what cancel() cancels.

Addresses come from Spark's own configuration and task info, never from
connecting to a public address. What this module does not do: decide what a
node's failure means (driver.py) or run the node (node.py).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sparkgrad.cluster.node import MapFun, NodeConfig, run_node, run_node_keeping_result
from sparkgrad.errors import ClusterError, InsufficientSlotsError

logger = logging.getLogger(__name__)

SLOT_POLL_SECONDS = 0.5
STATUS_SCHEMA = "status string"  # the Connect node stage's output: one row per node, its JSON status
RESULT_SCHEMA = "status string, result binary"  # the same with map_fun's pickled value (sparkgrad.run)

# Masters whose slots the master string alone tells: local, local[N], local[*], local[N,F], local-cluster[n,c,m]
_LOCAL_MASTER = re.compile(r"local(?:\[\s*(\*|\d+)\s*(?:,\s*\d+\s*)?\])?")
_LOCAL_CLUSTER_MASTER = re.compile(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]")


def spark_conf(sc: Any) -> Any:
    """The context's live configuration, read key by key.

    ``sc.getConf()`` copies every entry through py4j (two calls per entry to
    read it, one to write it into a new JVM SparkConf): 10-20 ms on each
    run(), for the five keys read here.
    """
    conf = getattr(sc, "_conf", None)
    return conf if conf is not None else sc.getConf()


def is_local_master(master: str) -> bool:
    return str(master).startswith("local[") or str(master) == "local"


def _task_cpus(value: str | None) -> int:
    try:
        return max(1, int(value or "1"))
    except ValueError:
        return 1


@dataclass(frozen=True)
class SlotCount:
    """Task slots Spark can run at once (None: unknown) and where the number came from."""

    slots: int | None
    source: str


def slots_from_conf(master: str, conf: Callable[[str], str | None]) -> SlotCount:
    """The task slots a master string and configuration promise, for sessions that cannot ask the scheduler.

    local[N] / local-cluster[n,c,m] tell it directly (local[*]: this
    machine's cores, right when the server runs here); other masters count
    spark.executor.instances x spark.executor.cores when both are set. Every
    count is divided by spark.task.cpus. None when nothing tells.
    """
    cpus = _task_cpus(conf("spark.task.cpus"))
    local = _LOCAL_MASTER.fullmatch(master)
    if local:
        cores = (os.cpu_count() or 1) if local.group(1) == "*" else int(local.group(1) or "1")
        return SlotCount(cores // cpus, f"master {master}, spark.task.cpus={cpus}")
    cluster = _LOCAL_CLUSTER_MASTER.fullmatch(master)
    if cluster:
        cores = int(cluster.group(1)) * int(cluster.group(2))
        return SlotCount(cores // cpus, f"master {master}, spark.task.cpus={cpus}")
    instances, cores = conf("spark.executor.instances"), conf("spark.executor.cores")
    if instances and cores and instances.isdigit() and cores.isdigit():
        return SlotCount(
            int(instances) * int(cores) // cpus,
            f"master {master}, spark.executor.instances={instances} x spark.executor.cores={cores} / "
            f"spark.task.cpus={cpus}",
        )
    return SlotCount(None, f"master {master or '(not exposed)'}")


class ClassicSpark:
    """A classic SparkContext: RDDs, job groups, the scheduler's own slot count."""

    connect = False

    def __init__(self, sc: Any) -> None:
        self.sc = sc

    @property
    def master(self) -> str:
        return str(self.sc.master)

    def conf(self, key: str, default: str | None = None) -> str | None:
        return spark_conf(self.sc).get(key, default)

    def slot_count(self) -> SlotCount:
        jsc = self.sc._jsc.sc()
        cpus = _task_cpus(self.conf("spark.task.cpus"))
        source = f"master {self.master}, spark.task.cpus={cpus}"
        try:
            profile = jsc.resourceProfileManager().defaultResourceProfile()
            return SlotCount(int(jsc.maxNumConcurrentTasks(profile)), source)  # what Spark's barrier check counts
        except Exception:  # noqa: BLE001 - py4j errors of older Sparks: fall back to the public estimate
            return SlotCount(int(self.sc.defaultParallelism) // cpus, source)

    @property
    def executors_may_join(self) -> bool:
        """Executors of a non-local master register asynchronously: worth waiting for."""
        return not is_local_master(self.master)

    def default_fs(self) -> str:
        return str(self.sc._jsc.hadoopConfiguration().get("fs.defaultFS") or "file://")

    def tag_thread(self, tag: str, description: str) -> None:
        self.sc.setJobGroup(tag, description, interruptOnCancel=True)

    def untag_thread(self, tag: str) -> None:
        pass  # a job group belongs to the thread, which ends with the job

    def cancel_tag(self, tag: str) -> None:
        self.sc.cancelJobGroup(tag)

    def run_barrier(self, n: int, task: SparkNodeTask) -> list[Any]:
        return self.sc.parallelize(range(n), n).barrier().mapPartitions(task).collect()


# The error conditions a Connect server answers a conf key with when it has no value for the
# client: withheld from clients (Databricks serverless) or unknown to the server.
WITHHELD_CONF_CONDITIONS = ("CONFIG_NOT_AVAILABLE", "SQL_CONF_NOT_FOUND")


def conf_withheld(exc: BaseException) -> bool:
    """True when ``exc``, raised by a Connect session's ``conf.get``, means "no value for you"."""
    # pyspark 4 names it getCondition (and deprecates getErrorClass, which 3.x has)
    getter = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    condition = getter() if callable(getter) else None
    if condition:
        return condition in WITHHELD_CONF_CONDITIONS
    # A server's error whose condition was not carried over keeps it in its message: "[COND] ..."
    return any(f"[{c}]" in str(exc) for c in WITHHELD_CONF_CONDITIONS)


class ConnectSpark:
    """A Spark Connect session: no SparkContext, no RDDs; DataFrames, tags and ``spark.conf`` only."""

    connect = True
    executors_may_join = False  # Connect exposes no executor count to wait on: the configuration is all there is

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    @property
    def master(self) -> str:
        return self.conf("spark.master") or ""

    def conf(self, key: str, default: str | None = None) -> str | None:
        """A conf key as the server exposes it; ``default`` where it is unset or withheld (serverless).

        Any other failure (the server gone, a refused session) is a ClusterError naming the key:
        taken for "unset", it would send the checks after it down the wrong path."""
        from pyspark.errors import PySparkException

        try:
            value = self.spark.conf.get(key, default)
        except PySparkException as e:
            if conf_withheld(e):
                return default
            raise ClusterError(f"reading Spark conf key {key} from the Spark Connect server failed: {e}") from e
        return None if value is None else str(value)

    def slot_count(self) -> SlotCount:
        return slots_from_conf(self.master, self.conf)

    def default_fs(self) -> str:
        return self.conf("spark.hadoop.fs.defaultFS") or self.conf("fs.defaultFS") or "file://"

    def tag_thread(self, tag: str, description: str) -> None:
        self.spark.addTag(tag)  # tags are the client thread's own, like job groups

    def untag_thread(self, tag: str) -> None:
        self.spark.removeTag(tag)

    def cancel_tag(self, tag: str) -> None:
        self.spark.interruptTag(tag)

    def run_barrier(self, n: int, task: SparkNodeTask) -> list[Any]:
        schema = RESULT_SCHEMA if task.keep_result else STATUS_SCHEMA
        df = self.spark.range(n, numPartitions=n).mapInArrow(ArrowNodeTask(task), schema, barrier=True)
        rows = df.collect()  # collect(): barrier stages refuse show()/take()
        if task.keep_result:
            return [(row.status, None if row.result is None else bytes(row.result)) for row in rows]
        return [row.status for row in rows]


SparkSessionKind = ClassicSpark | ConnectSpark


def is_connect_session(obj: Any) -> bool:
    """True for a Spark Connect SparkSession (its class lives under pyspark.sql.connect)."""
    return type(obj).__module__.startswith("pyspark.sql.connect")


def spark_session(obj: Any) -> SparkSessionKind:
    """The session kind behind what the user passed: a SparkContext, a SparkSession, or a Connect session.

    Told apart by the object's class, not by pyspark's process-wide
    "connect mode" flag: a process may hold both kinds (a notebook with a
    classic session that also connects somewhere).
    """
    if isinstance(obj, (ClassicSpark, ConnectSpark)):
        return obj
    if is_connect_session(obj):
        return ConnectSpark(obj)
    if hasattr(obj, "parallelize"):  # a SparkContext (a SparkSession has _jsc too, but no parallelize)
        return ClassicSpark(obj)
    if hasattr(obj, "sparkContext"):  # a classic SparkSession
        return ClassicSpark(obj.sparkContext)
    raise ClusterError(
        f"TFCluster.run needs a SparkContext, a SparkSession or a Spark Connect session, got {type(obj).__name__}"
    )


WILDCARD_ADDRESSES = frozenset({"0.0.0.0", "::", "[::]", "*"})


def driver_address(session: SparkSessionKind) -> tuple[str, str]:
    """(advertised host, bind host) of the driver's rendezvous server.

    Advertised: env SPARKGRAD_DRIVER_HOST, else Spark conf
    spark.sparkgrad.driver.host, else spark.driver.host (the address executors
    already use to reach the driver). Bound: spark.sparkgrad.driver.bindAddress
    (taken as given, a wildcard included: the explicit way to listen on every
    interface), else the override, else spark.driver.bindAddress unless it is
    a wildcard (0.0.0.0, ::), else the advertised host: the rendezvous listens
    only where the executors are told to connect, not on every interface of
    the driver's machine.

    On Spark Connect, spark.driver.host is the Connect server's driver: right
    where this Python process runs on that machine (a Databricks notebook in
    Standard access mode runs on the driver node). A Connect client elsewhere
    (Databricks Connect on a laptop) is not reachable from the executors at
    all: its rendezvous cannot bind the server's address, and no override
    makes the executors reach a laptop behind a NAT.
    """
    override = os.environ.get("SPARKGRAD_DRIVER_HOST") or session.conf("spark.sparkgrad.driver.host")
    spark_host = session.conf("spark.driver.host")
    host = override or spark_host
    if not host:
        raise ClusterError(
            "cannot tell the executors where the driver is: spark.driver.host is not set; "
            "set SPARKGRAD_DRIVER_HOST or spark.sparkgrad.driver.host"
        )
    spark_bind = session.conf("spark.driver.bindAddress")
    if spark_bind is not None and spark_bind.strip() in WILDCARD_ADDRESSES:
        spark_bind = None
    bind = session.conf("spark.sparkgrad.driver.bindAddress") or override or spark_bind or host
    return host, bind


def task_host(address: str) -> str:
    """The host part of a BarrierTaskInfo address ("host:port", "[v6]:port")."""
    host = address.rpartition(":")[0] if ":" in address else address
    return host.strip("[]") or address


def check_spark(
    session: SparkSessionKind,
    num_nodes: int,
    slots_timeout: float,
    feed_slots: int = 0,
    warn: Callable[[str], None] = logger.warning,
) -> None:
    """Refuses dynamic allocation and raises InsufficientSlotsError when Spark lacks slots.

    On a classic non-local master, executors may still be registering: the
    check re-reads the slot count until ``slots_timeout`` seconds have
    passed. A Connect session whose configuration does not tell the slots
    gets ``warn``-ed that the check was skipped, and the stage is submitted.
    """
    if (session.conf("spark.dynamicAllocation.enabled") or "false").strip().lower() == "true":
        raise ClusterError(
            "spark.dynamicAllocation.enabled=true: sparkgrad runs its nodes as one barrier stage that needs all "
            "executors at once for the whole training, and Spark neither runs barrier stages under dynamic "
            "allocation nor keeps executors that it may remove mid-training; disable dynamic allocation "
            "(and autoscaling on Databricks) for this cluster"
        )
    needed = num_nodes + feed_slots
    deadline = time.monotonic() + (slots_timeout if session.executors_may_join else 0.0)
    count = session.slot_count()
    while count.slots is not None and count.slots < needed and time.monotonic() < deadline:
        threading.Event().wait(SLOT_POLL_SECONDS)  # executors register asynchronously; Spark has no callback
        count = session.slot_count()
    if count.slots is None:
        warn(
            f"sparkgrad: cannot check the task slots before starting {needed} barrier tasks: this Spark Connect "
            f"session exposes no slot count ({count.source}; neither spark.executor.instances nor "
            "spark.executor.cores is set); a cluster with too few slots fails when Spark refuses the stage"
        )
        return
    if count.slots < needed:
        waited = f", after waiting {slots_timeout:g} s for executors" if session.executors_may_join else ""
        raise InsufficientSlotsError(
            f"the cluster needs {needed} task slots ({num_nodes} nodes, one per task, all running at once in a "
            f"barrier stage{f', plus {feed_slots} for the feeding tasks of InputMode.SPARK' if feed_slots else ''}) "
            f"but Spark has {count.slots} ({count.source}{waited}): "
            "add executors, lower num_executors, or lower spark.task.cpus",
            needed=needed,
            available=count.slots,
        )


# Levels of parent processes spark_executor_id looks through for the executor JVM (the Python
# worker's parent is pyspark's daemon, whose parent is the JVM; a few more allow for wrappers).
_PARENT_LEVELS = 6


def _parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2 :].split()[1])  # after "pid (comm) state": ppid


def spark_executor_id(local_master: bool) -> str:
    """Spark's id of the executor this Python worker runs for ("2"; "driver" on a local master; "" unknown).

    pyspark's TaskContext does not carry it (3.4 to 4.0): it comes from
    SPARK_EXECUTOR_ID where the cluster manager sets it (Kubernetes), else
    from the ``--executor-id`` argument of the executor JVM this worker
    descends from (standalone, local-cluster and YARN start executors with
    it), read from /proc. A local master's tasks run in the driver's JVM,
    whose executor Spark calls "driver".
    """
    env = os.environ.get("SPARK_EXECUTOR_ID")
    if env:
        return env
    pid = os.getppid()
    for _ in range(_PARENT_LEVELS):
        if pid <= 1:
            break
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            if b"--executor-id" in args:
                at = args.index(b"--executor-id") + 1
                if at < len(args) and args[at]:
                    return args[at].decode("utf-8", "replace")
            pid = _parent_pid(pid)
        except (OSError, ValueError, IndexError):
            break
    return "driver" if local_master else ""


@dataclass(frozen=True)
class SparkNodeTask:
    """The barrier-partition function: partition i runs the node of executor_ids[i].

    ``echo``: also write the node's output to the executor's own stdout/stderr
    (its executor log). Off on a local master, whose Python workers share the
    driver's terminal: there the driver's role:index-prefixed copy is the one
    line shown.

    ``keep_result``: yield ``(status, map_fun's pickled value)`` instead of
    the status alone, so the value comes back in Spark's own task results.
    """

    cfg: NodeConfig
    executor_ids: tuple[int, ...]
    map_fun: MapFun
    tf_args: Any
    echo: bool = True
    keep_result: bool = False

    def __call__(self, _rows: Iterator[Any]) -> Iterator[Any]:
        from pyspark import BarrierTaskContext

        task = BarrierTaskContext.get()
        part = task.partitionId()
        spark_host = task_host(task.getTaskInfos()[part].address)
        host = os.environ.get("SPARKGRAD_NODE_HOST") or spark_host
        spark = (spark_executor_id(not self.echo), spark_host)  # echo is off exactly on a local master
        eid = self.executor_ids[part]
        if self.keep_result:
            yield run_node_keeping_result(self.cfg, eid, host, self.map_fun, self.tf_args, echo=self.echo, spark=spark)
        else:
            yield run_node(self.cfg, eid, host, self.map_fun, self.tf_args, echo=self.echo, spark=spark)


@dataclass(frozen=True)
class ArrowNodeTask:
    """The Connect node stage's mapInArrow function: runs the partition's node, yields its status as one batch.

    Its input (the ids of ``spark.range``) is not read; the output is one
    record batch of one row matching STATUS_SCHEMA.
    """

    task: SparkNodeTask

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for out in self.task(batches):
            if self.task.keep_result:
                status, result = out
                yield pa.RecordBatch.from_pydict(
                    {"status": [status], "result": [result]},
                    schema=pa.schema([("status", pa.string()), ("result", pa.binary())]),
                )
            else:
                yield pa.RecordBatch.from_pydict({"status": [out]})


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
    """One Spark action run in a background thread under its own job group or tag (so it can be cancelled)."""

    CANCEL_WAIT_SECONDS = 30.0  # Spark kills a cancelled task's Python worker after spark.python.task.killTimeout

    def __init__(self, session: SparkSessionKind, description: str) -> None:
        self.group = f"sparkgrad-{uuid.uuid4().hex[:12]}"
        self.description = description
        self.result: Any = None
        self.error: str | None = None
        self.cancelled = False
        self._session = session
        self._ended = threading.Event()

    def start(self, action: Callable[[], Any]) -> None:
        def run() -> None:
            try:
                self._session.tag_thread(self.group, self.description)
                try:
                    if not self.cancelled:  # a cancel that came before the action was submitted
                        self.result = action()
                finally:
                    self._session.untag_thread(self.group)
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
        """Cancels the action and waits (bounded) for it to end.

        Job groups and tags act only on jobs already running, so the cancel
        is repeated each second until the action has ended: a job submitted
        just after the first cancel is cancelled by the next.
        """
        self.cancelled = True
        deadline = time.monotonic() + self.CANCEL_WAIT_SECONDS
        while True:
            self._session.cancel_tag(self.group)
            left = deadline - time.monotonic()
            if self._ended.wait(max(0.0, min(1.0, left))) or left <= 0:
                return


class SparkLauncher:
    """Runs nodes as one barrier stage of a background SparkJob (classic Spark or Connect)."""

    def __init__(
        self,
        session: SparkSessionKind,
        cfg: NodeConfig,
        executor_ids: tuple[int, ...],
        map_fun: MapFun,
        tf_args: Any,
        keep_result: bool = False,
    ):
        self.executor_ids = executor_ids
        self._session = session
        echo = not is_local_master(session.master)
        self._task = SparkNodeTask(cfg, executor_ids, map_fun, tf_args, echo=echo, keep_result=keep_result)
        self._job = SparkJob(session, f"sparkgrad cluster of {len(executor_ids)} nodes")

    def start(self) -> None:
        self._job.start(lambda: self._session.run_barrier(len(self.executor_ids), self._task))

    @property
    def statuses(self) -> list[str]:
        rows = list(self._job.result or [])
        return [row[0] for row in rows] if self._task.keep_result else rows

    def results(self) -> dict[int, bytes | None]:
        """keep_result: map_fun's pickled value by executor id, from the finished stage's rows."""
        if not self._task.keep_result:
            return {}
        out: dict[int, bytes | None] = {}
        for status, payload in self._job.result or []:
            out[int(json.loads(status)["executor_id"])] = payload
        return out

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
        hint = (
            f"Spark could not start all {len(self.executor_ids)} barrier tasks at once (too few free task slots, "
            "or other jobs hold the executors), or executors cannot reach the driver's port (firewall, "
            "wrong spark.driver.host: set SPARKGRAD_DRIVER_HOST)"
        )
        if self._session.connect:
            hint += (
                "; on Spark Connect the rendezvous runs in this Python process, so it must run where the "
                "executors can reach it (a notebook on the cluster's driver node): a Databricks Connect client "
                "on a laptop is not reachable from the executors"
            )
        return hint
