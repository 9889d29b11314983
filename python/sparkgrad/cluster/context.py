"""The node context (``ctx``) that map_fun receives, and the cluster spec.

``ctx`` carries TensorFlowOnSpark's fields (executor_id, worker_num, job_name,
task_index, cluster_spec, num_workers, defaultFS, working_dir,
absolute_path()) plus sparkgrad's own: the node's listening socket (bound
before registration and kept open), the registered nodes, a stop event set
when the driver says stop, a metric() channel to the driver, and ``env``, the
node's own environment variables (TF_CONFIG and the launcher's env=), which
hold for nodes that run as threads of the driver too. The cluster spec is
built from the registration list the driver sends, never guessed.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sparkgrad.cluster.roles import EVALUATOR, ROLE_ORDER, TRAINING_ROLES, InputMode
from sparkgrad.errors import ClusterError, SparkgradTimeout

logger = logging.getLogger(__name__)

# Schemes of Hadoop-compatible file systems (plus Databricks' and the clouds'):
# paths that start with one are already absolute and are returned unchanged.
FS_SCHEMES = (
    "abfs://",
    "abfss://",
    "adl://",
    "dbfs:/",
    "file://",
    "gs://",
    "hdfs://",
    "oss://",
    "s3://",
    "s3a://",
    "s3n://",
    "swift://",
    "viewfs://",
    "wasb://",
    "wasbs://",
)


@dataclass(frozen=True)
class NodeInfo:
    """One registered node, as the rendezvous reports it."""

    executor_id: int
    role: str
    index: int
    host: str
    port: int
    pid: int
    comm_port: int = 0  # the allreduce communicator's listening port (training nodes of a cluster without ps)
    spark_executor: str = ""  # Spark's id of the executor running the node ("2", "driver"); "" off Spark
    spark_host: str = ""  # that executor's host, as Spark names it

    @property
    def spark_name(self) -> str:
        """``executor 2 on host`` as Spark's own log names the node's executor ("" off Spark)."""
        if not self.spark_executor:
            return ""
        return f"executor {self.spark_executor} on {self.spark_host or self.host}"

    @property
    def name(self) -> str:
        return f"{self.role}:{self.index}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def from_dict(cls, d: dict) -> NodeInfo:
        return cls(
            executor_id=int(d["executor_id"]),
            role=str(d["role"]),
            index=int(d["index"]),
            host=str(d["host"]),
            port=int(d["port"]),
            pid=int(d["pid"]),
            comm_port=int(d.get("comm_port") or 0),
            spark_executor=str(d.get("spark_executor") or ""),
            spark_host=str(d.get("spark_host") or ""),
        )


def cluster_spec(nodes: Sequence[NodeInfo]) -> dict[str, list[str]]:
    """``{"ps": ["host:port"], "worker": [...]}``: addresses by role, each list in task_index order."""
    spec: dict[str, list[str]] = {}
    for role in ROLE_ORDER:
        members = sorted((n for n in nodes if n.role == role), key=lambda n: n.index)
        if members:
            spec[role] = [n.address for n in members]
    return spec


def tf_config(spec: dict[str, list[str]], job_name: str, task_index: int) -> str:
    """The TF_CONFIG JSON of one node.

    The evaluator is left out of "cluster": TensorFlow's estimator and
    multi-worker strategies reject a cluster that contains it (the evaluator
    only reads checkpoints); its own TF_CONFIG still names it as the task.
    """
    cluster = {role: list(addrs) for role, addrs in spec.items() if role != EVALUATOR}
    return json.dumps(
        {"cluster": cluster, "task": {"type": job_name, "index": task_index}, "environment": "cloud"},
        sort_keys=True,
    )


def hdfs_path(ctx: Any, path: str) -> str:
    """An absolute, scheme-qualified path for ``path``, as TensorFlowOnSpark's ``TFNode.hdfs_path`` makes it.

    A path with a file-system scheme (``hdfs://``, ``dbfs:/``, ``s3a://``, ``file://``, ...) is returned as
    is; an absolute path gets ``ctx.defaultFS`` prepended; a relative path goes under ``/user/<user>`` on
    ``hdfs://`` and ``viewfs://``, under ``ctx.working_dir`` on ``file://``, and directly under defaultFS
    otherwise (with a warning).

    Args:
        ctx: The node's context (its ``defaultFS`` and ``working_dir``).
        path: The path to qualify.
    """
    if path.startswith(FS_SCHEMES):
        return path
    default_fs = ctx.defaultFS
    while default_fs.endswith("/") and not default_fs.endswith("://"):  # "file:///" -> "file://"
        default_fs = default_fs[:-1]
    if path.startswith("/"):
        return default_fs + path
    if default_fs.startswith(("hdfs://", "viewfs://")):
        import getpass  # here: it loads termios and pwd, which no other path needs

        return f"{default_fs}/user/{getpass.getuser()}/{path}"
    if default_fs.startswith("file://"):
        return f"{default_fs}/{ctx.working_dir.lstrip('/')}/{path}"
    logger.warning("relative path %r on file system %r with no known home: placed at its root", path, default_fs)
    return f"{default_fs}/{path}"


@dataclass(frozen=True)
class NodeContext:
    """What map_fun(args, ctx) knows about its node and the cluster."""

    executor_id: int
    job_name: str
    task_index: int
    cluster_spec: dict[str, list[str]]
    defaultFS: str
    working_dir: str
    nodes: tuple[NodeInfo, ...] = ()
    input_mode: InputMode = InputMode.TENSORFLOW
    host: str = "127.0.0.1"
    port: int = 0
    listener: Any = None  # sparkgrad._core.Listener, bound since before registration
    secret: bytes = field(default=b"", repr=False)  # authenticates peers of this cluster
    security: str | None = None  # frame protection of the cluster's connections (None: the default)
    log_dir: str | None = None
    mgr: Any = None  # the node's FeedServer on training nodes under InputMode.SPARK (for TFNode.DataFeed)
    # How many times the driver restarted the cluster before this run of map_fun (max_restarts): 0 on the
    # first run; > 0 means resume from the last checkpoint (model.fit with checkpoint_dir does by default).
    attempt: int = 0
    # The node's environment: TF_CONFIG, then the launcher's env= (sparkgrad.run, TFCluster.run). A node in its
    # own process also has them in os.environ while map_fun runs; a node in a thread of the driver only here.
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    stop_event: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    _metric_sink: Callable[[str, float, int], None] | None = field(default=None, repr=False, compare=False)
    _stop_hooks: list[Callable[[], None]] = field(default_factory=list, repr=False, compare=False)
    _stop_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def worker_num(self) -> int:
        """TensorFlowOnSpark's older name for executor_id."""
        return self.executor_id

    @property
    def num_workers(self) -> int:
        """Number of training nodes: chief, master and workers (not ps, not evaluator)."""
        return sum(len(self.cluster_spec.get(role, ())) for role in TRAINING_ROLES)

    @property
    def is_training_node(self) -> bool:
        """chief, master or worker: a node that trains (not ps, not evaluator)."""
        return self.job_name in TRAINING_ROLES

    @property
    def worker_rank(self) -> int | None:
        """This node's rank among the training nodes (chief/master first, then
        workers, by executor id), 0-based; None on ps and evaluator nodes. The
        one definition of rank: the node runner sets sparkgrad.cluster.rank from
        it, the ps client uses it as its worker id, rank 0 is the chief that
        initialises the parameter servers and writes checkpoints."""
        if not self.is_training_node:
            return None
        training = sorted((n for n in self.nodes if n.role in TRAINING_ROLES), key=lambda n: n.executor_id)
        for rank, node in enumerate(training):
            if node.executor_id == self.executor_id:
                return rank
        raise ClusterError(
            f"{self.job_name}:{self.task_index} (executor {self.executor_id}) is not among the registered "
            "training nodes"
        )

    @property
    def is_restart(self) -> bool:
        """True when the driver restarted the cluster after a lost node (ctx.attempt > 0)."""
        return self.attempt > 0

    @property
    def tf_config(self) -> str:
        return tf_config(self.cluster_spec, self.job_name, self.task_index)

    @property
    def is_chief(self) -> bool:
        """chief:0 / master:0, or worker:0 when the cluster has neither (TensorFlow's convention)."""
        if self.job_name in ("chief", "master"):
            return self.task_index == 0
        has_chief = "chief" in self.cluster_spec or "master" in self.cluster_spec
        return self.job_name == "worker" and self.task_index == 0 and not has_chief

    def absolute_path(self, path: str) -> str:
        return hdfs_path(self, path)

    def nodes_of(self, role: str) -> tuple[NodeInfo, ...]:
        return tuple(sorted((n for n in self.nodes if n.role == role), key=lambda n: n.index))

    def should_stop(self) -> bool:
        """True once the driver has asked this node to stop (or the driver is gone)."""
        return self.stop_event.is_set()

    def wait_for_stop(self, timeout: float | None = None) -> None:
        """Blocks until the driver says stop; raises SparkgradTimeout after ``timeout`` seconds."""
        if not self.stop_event.wait(timeout):
            raise SparkgradTimeout(
                f"{self.job_name}:{self.task_index} waited {timeout} s for the driver's stop message",
                node=f"{self.job_name}:{self.task_index}",
            )

    def on_stop(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Calls ``hook()`` once when the driver says stop (at once if it already has).

        Returns a function that unregisters the hook; how a blocking call
        (a ps serving, a feed being read) is woken by the stop without polling.
        """
        with self._stop_lock:
            if not self.stop_event.is_set():
                self._stop_hooks.append(hook)
                return lambda: self._drop_hook(hook)
        hook()
        return lambda: None

    def _drop_hook(self, hook: Callable[[], None]) -> None:
        with self._stop_lock:
            if hook in self._stop_hooks:
                self._stop_hooks.remove(hook)

    def signal_stop(self) -> None:
        """Sets stop_event and runs the on_stop hooks (the node's stop watcher calls this)."""
        with self._stop_lock:
            self.stop_event.set()
            hooks = list(self._stop_hooks)
            self._stop_hooks.clear()
        for hook in hooks:
            hook()

    def metric(self, name: str, value: float, step: int = 0) -> None:
        """Streams one scalar to the driver, which prints it prefixed with role:index."""
        if self._metric_sink is None:
            raise ClusterError(f"{self.job_name}:{self.task_index} has no connection to the driver for metrics")
        self._metric_sink(name, float(value), int(step))
