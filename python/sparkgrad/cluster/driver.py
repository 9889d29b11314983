"""The driver side of a cluster: rendezvous, live node output, failures, shutdown.

Cluster.start() starts the launchers (a Spark barrier job, local processes,
or both), waits for every node to register with the RendezvousServer, and
then keeps a pump thread reading the nodes' events: log lines and metrics are
printed live prefixed with role:index; "error" and "lost" become a
NodeFailure, after which every other node is told to stop and the launchers
cancel what is left (Spark job group, local processes). The main thread sees
the failure at its next call (run, shutdown, train) and raises it.

Recovery (``max_restarts`` > 0): once every node of the failed generation
has ended, the driver prints the restart with its cause and starts a new
generation of every node (a new rendezvous with a fresh secret, new
launchers: a new barrier stage on Spark) whose ctx.attempt counts the
restarts; training resumes from the chief's last checkpoint (model.fit with
checkpoint_dir does). The failure is raised only when no restart is left,
or when the restarted cluster cannot form.

Launchers only start and stop nodes; this module decides what an event means.
"""

from __future__ import annotations

import functools
import json
import secrets
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sparkgrad.cluster.context import NodeInfo, cluster_spec
from sparkgrad.cluster.feed import DEFAULT_INPUT, FeedTarget, PartitionFeeder
from sparkgrad.cluster.roles import SERVING_ROLES, ClusterTemplate, InputMode
from sparkgrad.errors import (
    CancelledError,
    ClusterError,
    InvalidArgumentError,
    NodeFailure,
    RendezvousTimeout,
    SparkgradError,
    SparkgradTimeout,
)

# How long the driver keeps reading events after a launcher reports a failure,
# so the node's own report (traceback, "lost") wins over the launcher's summary.
LAUNCHER_FAILURE_GRACE = 3.0
EVENT_POLL_SECONDS = 0.5
# Seconds beyond stop_grace the driver waits for every node to end after a failure
# (Spark kills a cancelled task's Python worker after spark.python.task.killTimeout).
ABORT_WAIT_SECONDS = 15.0
# Seconds registered-but-idle nodes get to end after a failed formation.
FORMATION_CANCEL_GRACE = 1.0
# A node that raised because a peer vanished (its connection closed, its step timed out) often reports
# before the driver hears that the peer itself was lost; a loss reported this soon after such an error
# is the cause and is raised instead.
ROOT_CAUSE_WINDOW_SECONDS = 2.0
CONSEQUENCE_ERRORS = ("PeerClosedError", "NodeFailure", "SparkgradTimeout", "ProtocolError", "CancelledError")


class Launcher(Protocol):
    """Starts and stops a set of nodes; knows nothing about the rendezvous."""

    executor_ids: tuple[int, ...]

    def start(self) -> None: ...

    def failure(self) -> str | None:
        """A failure the launcher saw itself (job failed, process died), or None."""

    def finished(self) -> bool: ...

    def cancel(self, grace: float) -> None:
        """Gives nodes ``grace`` seconds to end, then ends them; returns when they are gone (bounded)."""

    def join(self, timeout: float) -> bool:
        """Waits up to ``timeout`` s for every node to end; True if they did."""

    def missing_hint(self) -> str:
        """Why nodes of this launcher usually fail to register."""


@dataclass
class Generation:
    """One start of every node: its rendezvous server, its launchers and its secret (see Cluster.restart)."""

    server: Any
    launchers: Sequence[Launcher]
    secret: bytes = field(repr=False)


def default_output(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


@dataclass(frozen=True)
class Metric:
    role: str
    index: int
    name: str
    value: float
    step: int


def _is_dataframe(data: Any) -> bool:
    """A DataFrame (classic or Connect) rather than an RDD: it is fed through mapInArrow."""
    return hasattr(data, "mapInArrow")


def _select_mapped(what: str, data: Any, input_mapping: dict[str, str] | None, prepare: Any) -> Any:
    """The DataFrame's columns that ``input_mapping`` names (sorted, as TensorFlowOnSpark selects them)."""
    if not _is_dataframe(data):
        if input_mapping is not None or prepare is not None:
            raise InvalidArgumentError(f"cluster.{what}(rdd): input_mapping= and prepare= apply to a DataFrame only")
        return data
    if input_mapping is None:
        return data
    if not isinstance(input_mapping, dict) or not input_mapping:
        raise InvalidArgumentError(f"cluster.{what}: input_mapping must be a non-empty dict {{column: tensor name}}")
    columns = list(data.columns)
    missing = sorted(c for c in input_mapping if c not in columns)
    if missing:
        raise InvalidArgumentError(
            f"cluster.{what}: input_mapping names column(s) {', '.join(map(repr, missing))} that the DataFrame "
            f"does not have (it has {', '.join(map(repr, columns))})",
            column=missing[0],
        )
    return data.select(*sorted(input_mapping))


def new_secret() -> bytes:
    """A random per-cluster secret for the HMAC handshake (32 bytes)."""
    return secrets.token_bytes(32)


class Cluster:
    """A running cluster, TensorFlowOnSpark's ``TFCluster``: `TFCluster.run` returns it, `shutdown` ends it.

    While it runs, the driver prints the nodes' output live, prefixed with ``role:index``; a node
    that raises, dies or goes silent becomes a `NodeFailure`, after which every other node is
    stopped and the failure is raised by the driver's next call (`train`, `shutdown`, ...). With
    ``max_restarts`` the driver starts every node again instead, while restarts are left.

    ```python
    cluster = TFCluster.run(sc, map_fun, args, num_executors=3, num_ps=1, input_mode=InputMode.SPARK)
    cluster.train(df, num_epochs=2)
    cluster.shutdown()
    ```

    Attributes:
        cluster_spec (dict[str, list[str]]): ``{role: ["host:port", ...]}`` of the registered nodes, as
            ``ctx.cluster_spec`` sees it.
        nodes (tuple): The registered nodes (``executor_id``, ``role``, ``index``, ``host``, ``port``, ...).
        input_mode (InputMode): How the training nodes get their data.
        rows_fed (int): Rows the last `train` fed, over all its epochs.
        metrics (list): The metrics nodes sent with ``ctx.metric()`` (``role``, ``index``, ``name``, ``value``,
            ``step``).
        results (dict[int, Any]): Results nodes reported to the driver, by executor id.
        restarts (int): Restarts so far (``max_restarts``).
        restart_causes (list[str]): The first line of each failure that caused a restart.
    """

    def __init__(
        self,
        *,
        template: ClusterTemplate,
        server: Any,
        launchers: Sequence[Launcher],
        input_mode: InputMode,
        stop_grace: float,
        output: Callable[[str], None] = default_output,
        tensorboard: Any = None,
        spark: Any = None,
        secret: bytes = b"",
        label: Callable[[dict], str] | None = None,
        on_log: Callable[[dict], None] | None = None,
        relaunch: Callable[[int], Generation] | None = None,
        max_restarts: int = 0,
        security: str | None = None,
    ) -> None:
        """``label(event)``: how the node of an event is named in output and failures (default role:index);
        ``on_log(event)``: takes the nodes' log events (with "line", and "stream": "stderr" for the
        node's stderr) instead of ``output``. ``relaunch(attempt)``: a new Generation of every node,
        which the cluster starts after a node failure, up to ``max_restarts`` times."""
        self._label = label or (lambda ev: f"{ev.get('role')}:{ev.get('index')}")
        self._on_log = on_log
        self._spark = spark  # spark.ClassicSpark or spark.ConnectSpark; None for a local cluster
        self._secret = secret
        self._security = security
        self.rows_fed = 0
        self.template = template
        self.input_mode = input_mode
        self.nodes: tuple[NodeInfo, ...] = ()
        self.cluster_spec: dict[str, list[str]] = {}
        self.metrics: list[Metric] = []
        self.results: dict[int, Any] = {}
        self._server = server
        self._launchers = tuple(launchers)
        self._stop_grace = stop_grace
        self._output = output
        self._tensorboard = tensorboard
        self._cond = threading.Condition()
        self._failure: BaseException | None = None
        self._failure_at = 0.0  # time.monotonic() of the first failure
        self._finished: set[int] = set()
        self._gone: set[int] = set()  # nodes that ended: done, error or lost
        self._closed = threading.Event()
        self._pump: threading.Thread | None = None
        self._settled = False  # a failure's stop/cancel (and restart attempt) has completed: raise it
        self._launcher_failed_at: float | None = None
        self._relaunch = relaunch
        self._max_restarts = max(0, int(max_restarts))
        self._reservation_timeout = 600.0
        self._generation = 0  # bumped by each restart: the old pump and its events are ignored
        self.restarts = 0
        self.restart_causes: list[str] = []  # the first line of each failure that caused a restart

    # -- formation ---------------------------------------------------------

    def start(self, reservation_timeout: float) -> None:
        """Starts the nodes and waits until all registered (`TFCluster.run` calls it).

        Raises:
            RendezvousTimeout: Not every node registered within ``reservation_timeout`` seconds; names the
                missing ones.
            NodeFailure: A node failed before the cluster formed.
        """
        self._reservation_timeout = float(reservation_timeout)
        try:
            for launcher in self._launchers:
                launcher.start()
            spec = self._await_registration(reservation_timeout)
        except BaseException as exc:
            # No map_fun runs yet: drop the registrations at once, then end the tasks.
            self._broadcast_stop(f"cluster formation failed: {type(exc).__name__}")
            self._close()
            for launcher in self._launchers:
                launcher.cancel(FORMATION_CANCEL_GRACE)
            raise
        self.nodes = tuple(NodeInfo.from_dict(d) for d in spec)
        self.cluster_spec = cluster_spec(self.nodes)
        self._output(f"sparkgrad: cluster formed: {json.dumps(self.cluster_spec, sort_keys=True)}")
        self._pump = threading.Thread(
            target=self._pump_events, args=(self._server, self._generation), name="sparkgrad-events", daemon=True
        )
        self._pump.start()

    def _await_registration(self, timeout: float) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return self._server.wait(max(0.05, min(1.0, left)))
            except RendezvousTimeout as exc:
                failure = self._launcher_failure()
                if failure is not None:
                    raise ClusterError(f"a node failed before the cluster formed: {failure}") from None
                if deadline - time.monotonic() <= 0:
                    raise self._rendezvous_timeout(timeout, str(exc)) from None

    def _rendezvous_timeout(self, timeout: float, detail: str) -> RendezvousTimeout:
        hints = "; ".join(h for h in (launcher.missing_hint() for launcher in self._launchers) if h)
        return RendezvousTimeout(
            f"waited {timeout:g} s for {self.template.num_nodes} nodes to register with the driver "
            f"({self._server.host}:{self._server.port}): {detail}. Usual reasons: {hints}",
            timeout=timeout,
        )

    def _launcher_failure(self) -> str | None:
        for launcher in self._launchers:
            failure = launcher.failure()
            if failure is not None:
                return failure
        return None

    # -- events --------------------------------------------------------------

    def _pump_events(self, server: Any, generation: int) -> None:
        while not self._closed.is_set() and generation == self._generation:
            try:
                event = server.next_event(EVENT_POLL_SECONDS)
                if generation != self._generation:
                    return  # restarted meanwhile: the old generation's events mean nothing now
                if event is not None:
                    self._handle(event)
                self._check_launchers()
            except Exception as exc:  # noqa: BLE001 - a dead event loop would leave shutdown() waiting blind
                if not self._closed.is_set() and generation == self._generation:
                    self._fail(ClusterError(f"the driver's event loop failed: {type(exc).__name__}: {exc}"))
                return

    def _registered(self, executor_id: int) -> NodeInfo | None:
        for node in self.nodes:
            if node.executor_id == executor_id:
                return node
        return None

    def _where(self, ev: dict) -> tuple[str, dict]:
        """ " (executor 1; Spark executor 2 on host)" for a failure's message, and its details."""
        eid = int(ev["executor_id"])
        node = self._registered(eid)
        spark = node.spark_name if node is not None else ""
        details = {"spark_executor": node.spark_executor, "spark_host": node.spark_host} if spark else {}
        return f"(executor {eid}{f'; Spark {spark}' if spark else ''})", details

    def _handle(self, ev: dict) -> None:
        kind, name = ev.get("type"), self._label(ev)
        if kind in ("done", "error", "lost"):
            with self._cond:
                self._gone.add(int(ev["executor_id"]))
                self._cond.notify_all()
        if kind == "log":
            if self._on_log is not None:
                self._on_log(ev)
            else:
                self._output(f"{name} {ev['line']}")
        elif kind == "metric":
            metric = Metric(ev["role"], int(ev["index"]), ev["name"], float(ev["value"]), int(ev["step"]))
            with self._cond:
                self.metrics.append(metric)
            self._output(f"{name} metric {metric.name}={metric.value:g} step={metric.step}")
        elif kind == "done":
            with self._cond:
                self._finished.add(int(ev["executor_id"]))
                self.results[int(ev["executor_id"])] = json.loads(ev.get("result") or "null")
                self._cond.notify_all()
        elif kind == "error":
            tb = ev.get("traceback", "")
            where, spark = self._where(ev)
            self._fail(
                NodeFailure(
                    f"{name} {where} on {ev.get('host')} raised {ev.get('message')}\n--- traceback on {name} ---\n{tb}",
                    node=name,
                    role=ev["role"],
                    index=int(ev["index"]),
                    host=ev.get("host"),
                    executor_id=int(ev["executor_id"]),
                    remote_traceback=tb,
                    **spark,
                )
            )
        elif kind == "lost":
            if self._closed.is_set():
                return
            where, spark = self._where(ev)
            reason = str(ev.get("reason") or "its connection ended")
            # A silent node (no heartbeat) may be alive but stopped or cut off: its reason says so. A closed
            # connection without a done or error event is a process that ended without reporting.
            why = (
                ""
                if reason.startswith("no heartbeat")
                else (". Its process died without reporting (killed, out of memory, or its executor was removed)")
            )
            (self._fail if self._failure is None else self._prefer_cause)(
                NodeFailure(
                    f"{name} {where} on {ev.get('host')} was lost: {reason}{why}",
                    node=name,
                    role=ev["role"],
                    index=int(ev["index"]),
                    host=ev.get("host"),
                    executor_id=int(ev["executor_id"]),
                    remote_traceback="",
                    **spark,
                )
            )

    def _check_launchers(self) -> None:
        if self._failure is not None:
            return
        failure = self._launcher_failure()
        if failure is None:
            return
        now = time.monotonic()
        if self._launcher_failed_at is None:
            self._launcher_failed_at = now
        elif now - self._launcher_failed_at >= LAUNCHER_FAILURE_GRACE:
            self._fail(ClusterError(f"the cluster's job failed: {failure}"))

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._failure is not None:
                return
            self._failure = exc
            self._failure_at = time.monotonic()
            self._settled = False
            self._cond.notify_all()
        self._output(f"sparkgrad: {exc}".splitlines()[0] + " - stopping every node")
        reason = f"another node failed: {str(exc).splitlines()[0]}"
        threading.Thread(
            target=self._abort_then_signal, args=(reason, exc), name="sparkgrad-abort", daemon=True
        ).start()

    def _prefer_cause(self, lost: NodeFailure) -> None:
        """A node lost just after another raised because of a vanished peer: the loss is the failure raised."""
        with self._cond:
            first = self._failure
            message = str(first).split(" raised ", 1)[-1] if isinstance(first, NodeFailure) else ""
            if (
                first is None
                or self._settled
                or not getattr(first, "remote_traceback", "")
                or not message.startswith(CONSEQUENCE_ERRORS)
                or getattr(first, "executor_id", None) == lost.executor_id
                or time.monotonic() - self._failure_at > ROOT_CAUSE_WINDOW_SECONDS
            ):
                return
            lost.__context__ = first
            self._failure = lost
        first_node = getattr(first, "node", "another node")
        self._output(f"sparkgrad: {lost}".splitlines()[0] + f" (the cause of {first_node}'s error)")

    def _may_restart(self, exc: BaseException) -> bool:
        """A lost or failed node (or the nodes' job) while training, with a restart left."""
        with self._cond:
            training_left = not self._training_ids() <= self._finished
        return (
            isinstance(exc, ClusterError)
            and self._relaunch is not None
            and self.restarts < self._max_restarts
            and training_left
            and not self._closed.is_set()
        )

    def _abort_then_signal(self, reason: str, exc: BaseException) -> None:
        restarted = False
        failure: BaseException = exc
        try:
            self._abort(reason)
            if self._may_restart(exc):
                restarted = self._restart(exc)
        except BaseException as error:  # noqa: BLE001 - the restarted cluster did not form: that is raised
            error.__cause__ = exc
            failure = error
        finally:
            with self._cond:
                if restarted:
                    self._failure = None
                else:
                    if failure is not exc or self._failure is None:  # else _prefer_cause may have put the cause there
                        self._failure = failure
                    self._settled = True
                self._cond.notify_all()

    def _restart(self, exc: BaseException) -> bool:
        """Starts a new generation of every node (the old one has ended); raises if it cannot form."""
        self.restarts += 1
        cause = str(exc).splitlines()[0]
        self.restart_causes.append(cause)
        self._output(
            f"sparkgrad: restart {self.restarts} of {self._max_restarts}: starting every node again after: {cause}"
        )
        old_server, old_pump = self._server, self._pump
        with self._cond:
            self._generation += 1
        old_server.close()
        if old_pump is not None and old_pump is not threading.current_thread():
            old_pump.join(EVENT_POLL_SECONDS * 4)
        assert self._relaunch is not None
        generation = self._relaunch(self.restarts)
        if self._closed.is_set():  # the driver was interrupted meanwhile: start nothing
            generation.server.close()
            raise CancelledError(f"restart {self.restarts} cancelled: the cluster was closed")
        with self._cond:
            self._server = generation.server
            self._launchers = tuple(generation.launchers)
            self._secret = generation.secret
            self._finished.clear()
            self._gone.clear()
            self.results.clear()
            self._launcher_failed_at = None
            self._pump = None
        self.start(self._reservation_timeout)
        return True

    def _stop_node(self, executor_id: int, reason: str) -> None:
        self._send_quietly(executor_id, {"type": "stop", "reason": reason})

    def _send_quietly(self, executor_id: int, message: dict) -> None:
        try:
            self._server.send(executor_id, message)
        except ClusterError:
            pass  # it finished (and disconnected) since we looked: its "done" is on its way

    def _broadcast_stop(self, reason: str) -> None:
        try:
            self._server.broadcast({"type": "stop", "reason": reason})
        except SparkgradError:  # best effort: nodes also stop when the driver's socket closes
            pass

    def _abort(self, reason: str) -> None:
        """Tells every node to stop, then has the launchers end whatever is left."""
        self._broadcast_stop(reason)
        for launcher in self._launchers:
            launcher.cancel(self._stop_grace)
        self._wait_gone(self._stop_grace + ABORT_WAIT_SECONDS)

    def _wait_gone(self, timeout: float) -> None:
        """Waits (bounded) until every node has ended, so no node outlives the raised error."""
        if self._pump is None or not self._pump.is_alive():
            return
        everyone = {n.executor_id for n in self.template.nodes}
        deadline = time.monotonic() + timeout
        with self._cond:
            while not everyone <= self._gone:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(min(left, EVENT_POLL_SECONDS))

    def _raise_failure(self) -> bool:
        """Raises a failure once every node has ended; False when there is none, True when the cluster
        restarted instead (the caller waits for the new generation)."""
        with self._cond:
            if self._failure is None:
                return False
            # cancel + wait_gone, and a restart's formation: bounded
            bound = 2 * self._stop_grace + ABORT_WAIT_SECONDS + 45.0
            if self._max_restarts:
                bound += self._reservation_timeout + 30.0
            deadline = time.monotonic() + bound
            while self._failure is not None and not self._settled:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 1.0))
            failure = self._failure
        if failure is None:
            return True
        self._close()
        raise failure

    # -- user API --------------------------------------------------------------

    def _training_ids(self) -> set[int]:
        return {n.executor_id for n in self.template.nodes if n.role not in SERVING_ROLES}

    def _wait_finished(self, ids: set[int], deadline: float | None, what: str) -> None:
        with self._cond:
            while not ids <= self._finished and self._failure is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    missing = sorted(self.template.node(i).name for i in ids - self._finished)
                    raise SparkgradTimeout(f"shutdown: timed out waiting for {what}: {', '.join(missing)}")
                self._cond.wait(1.0 if left is None else min(left, 1.0))

    def shutdown(self, ssc: Any = None, grace_secs: float = 0, timeout: float = 259200) -> None:
        """Waits for the training nodes to finish, then stops the ps and evaluator nodes and ends the job.

        Under ``InputMode.SPARK`` it first tells every worker that its input ended.

        Args:
            ssc: Accepted for TensorFlowOnSpark compatibility (a StreamingContext), unused.
            grace_secs: Seconds to wait after the training nodes finished before stopping the others.
            timeout: Seconds the whole call may take (default 3 days); -1 for no limit. On expiry the nodes
                are stopped and SparkgradTimeout is raised.

        Raises:
            NodeFailure: A node failed; raised once the other nodes are stopped.
            SparkgradTimeout: ``timeout`` passed.
        """
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        try:
            if self.input_mode == InputMode.SPARK:  # no more data: every input of every worker ends
                for eid in self._training_ids() - self._finished:
                    self._send_quietly(eid, {"type": "feed_end", "input": None})
            while True:  # again after each restart (max_restarts)
                self._wait_finished(self._training_ids(), deadline, "training nodes")
                if not self._raise_failure():
                    break
            if grace_secs > 0:
                self._closed.wait(grace_secs)
            for node in self.template.nodes:
                if node.is_serving and node.executor_id not in self._finished:
                    self._stop_node(node.executor_id, "training finished")
            everyone = {n.executor_id for n in self.template.nodes}
            self._wait_finished(everyone, deadline, "ps/evaluator nodes to stop")
            self._raise_failure()
            for launcher in self._launchers:
                left = 30.0 if deadline is None else max(0.0, deadline - time.monotonic())
                if not launcher.join(min(left, 30.0)):
                    launcher.cancel(self._stop_grace)
            self._raise_failure()
        except (KeyboardInterrupt, SparkgradTimeout):
            self._abort(
                "the driver was interrupted" if sys.exc_info()[0] is KeyboardInterrupt else "shutdown timed out"
            )
            self._close()
            raise
        self._close()

    def abort(self, reason: str) -> None:
        """Stops every node now, as a failure does, and ends the cluster.

        For callers whose own step failed (as `sparkgrad.spark.Estimator`'s can); ``reason`` is told to
        the nodes and printed.
        """
        if not self._closed.is_set():
            self._abort(reason)
        self._close()

    def node_results(self) -> dict[int, bytes | None]:
        """With ``keep_results=True``: each node's ``map_fun`` return value, pickled, by executor id.

        Read after `shutdown`; the launchers bring the values back (None for a node that returned none).
        """
        out: dict[int, bytes | None] = {}
        for launcher in self._launchers:
            results = getattr(launcher, "results", None)
            if results is not None:
                out.update(results())
        return out

    def train(
        self,
        data_rdd: Any,
        num_epochs: int = 1,
        feed_timeout: float = 600,
        qname: str = DEFAULT_INPUT,
        *,
        input_mapping: dict[str, str] | None = None,
        prepare: Any = None,
    ) -> None:
        """Streams ``data_rdd`` to the training nodes, ``num_epochs`` times (``InputMode.SPARK``).

        Returns once every row is queued on its worker and each worker was told that input ``qname``
        ended (``DataFeed.should_stop()`` turns true once it has taken the rest).

        Args:
            data_rdd: An RDD (classic Spark), or a DataFrame (classic Spark or Spark Connect) whose Arrow
                record batches reach the feed without a Python object per row (vector, array, binary and
                number columns).
            num_epochs: Passes over the data.
            feed_timeout: Seconds a feeding task waits for its worker to take a batch.
            qname: The input's name, as ``DataFeed(ctx.mgr, qname_in=...)`` reads it (default ``"input"``).
            input_mapping: DataFrames only: ``{column: tensor name}``, as TensorFlowOnSpark's; just those
                columns are fed (sorted by name), and the workers read them with
                ``DataFeed(ctx.mgr, input_mapping=...)``.
            prepare: DataFrames only: a picklable ``prepare(columns, partition, first_row) -> columns``
                run in the feeding task on each frame before it is sent; string columns reach it as
                `sparkgrad.nn.StringColumn` s (Arrow's offsets and bytes), which it turns into numbers.

        Raises:
            InvalidArgumentError: The cluster is not ``InputMode.SPARK``, was started without Spark, or the
                data does not suit the options (an RDD on Spark Connect, a missing mapped column).
            NodeFailure: A node failed during feeding.
            ClusterError: The feeding job failed.
        """
        self._check_feedable("train", data_rdd)
        data_rdd = _select_mapped("train", data_rdd, input_mapping, prepare)
        training = [n for n in self.nodes if n.role not in SERVING_ROLES]
        target = FeedTarget(self._feed_targets(), self._secret, qname, float(feed_timeout), security=self._security)
        epochs = max(1, int(num_epochs))
        if _is_dataframe(data_rdd):
            from sparkgrad.cluster.arrow_feed import COUNT_SCHEMA, ArrowFeeder

            df = functools.reduce(lambda a, b: a.union(b), [data_rdd] * epochs)

            def action() -> int:
                feeder = ArrowFeeder(target, prepare=prepare)
                return sum(row.rows for row in df.mapInArrow(feeder, COUNT_SCHEMA).collect())

        else:
            rdd = data_rdd if epochs == 1 else self._spark.sc.union([data_rdd] * epochs)

            def action() -> int:
                return rdd.mapPartitionsWithIndex(PartitionFeeder(target)).sum()

        from sparkgrad.cluster.spark import SparkJob

        job = SparkJob(self._spark, f"sparkgrad feed of {num_epochs} epoch(s) to {len(training)} nodes")
        job.start(action)
        try:
            while not job.wait(EVENT_POLL_SECONDS):
                if self._failure is not None:
                    job.cancel()
                    self._raise_failure()
        except KeyboardInterrupt:
            job.cancel()
            self._abort("the driver was interrupted")
            self._close()
            raise
        if job.error is not None:
            # a feeding task fails when its worker dies: prefer the node's own report
            self._closed.wait(LAUNCHER_FAILURE_GRACE) if self._failure is None else None
            self._raise_failure()
            raise ClusterError(f"feeding {qname!r} failed: {job.error}")
        for node in training:
            self._server.send(node.executor_id, {"type": "feed_end", "input": qname})
        self.rows_fed = int(job.result or 0)

    def inference(
        self,
        data_rdd: Any,
        feed_timeout: float = 600,
        qname: str = DEFAULT_INPUT,
        *,
        schema: str | None = None,
        input_mapping: dict[str, str] | None = None,
        prepare: Any = None,
    ) -> Any:
        """``map_fun``'s results for ``data_rdd``, in input order, computed lazily (``InputMode.SPARK``).

        Each partition is fed to one training node, whose ``map_fun`` reads it with
        ``DataFeed(ctx.mgr, train_mode=False)`` and answers with ``batch_results()``; call `shutdown`
        after using the results to end the nodes' input.

        Args:
            data_rdd: An RDD or a DataFrame, as for `train`.
            feed_timeout: Seconds a feeding task waits for its worker.
            qname: The input's name.
            schema: DataFrames only: Spark DDL of numeric columns, one per result column in
                ``batch_results`` order (a dict's columns by name, numbered ones first), each result cast
                to its column's type; default ``"result double"``.
            input_mapping: As for `train` (DataFrames only).
            prepare: As for `train` (DataFrames only).

        Returns:
            For an RDD, an RDD of results (a value per row, or a tuple for several result columns); for a
            DataFrame, a DataFrame of ``schema``.
        """
        self._check_feedable("inference", data_rdd)
        data_rdd = _select_mapped("inference", data_rdd, input_mapping, prepare)
        target = FeedTarget(
            self._feed_targets(), self._secret, qname, float(feed_timeout), want_results=True, security=self._security
        )
        if _is_dataframe(data_rdd):
            from sparkgrad.cluster.arrow_feed import DEFAULT_RESULT_SCHEMA, ArrowFeeder, result_fields

            ddl = schema or DEFAULT_RESULT_SCHEMA
            return data_rdd.mapInArrow(ArrowFeeder(target, result_fields(ddl), prepare), ddl)
        if schema is not None:
            raise InvalidArgumentError("cluster.inference(rdd): schema= applies to a DataFrame only")
        return data_rdd.mapPartitionsWithIndex(PartitionFeeder(target), preservesPartitioning=True)

    def _check_feedable(self, what: str, data: Any) -> None:
        if self.input_mode != InputMode.SPARK:
            raise InvalidArgumentError(
                f"cluster.{what}(data) feeds InputMode.SPARK clusters; this one reads its own data"
            )
        if self._spark is None:
            raise InvalidArgumentError(f"cluster.{what}(data) needs a cluster started with a Spark session")
        if not _is_dataframe(data) and self._spark.connect:
            raise InvalidArgumentError(
                f"cluster.{what}(data) on Spark Connect takes a DataFrame (Connect has no RDDs), "
                f"got {type(data).__name__}"
            )
        self._raise_failure()

    def _feed_targets(self) -> tuple[tuple[str, int], ...]:
        return tuple((n.host, n.port) for n in self.nodes if n.role not in SERVING_ROLES)

    def start_tensorboard(self, log_dir: str, host: str) -> None:
        """Serves ``log_dir`` with TensorBoard on the driver if it is installed (else says so).

        ``run(..., tensorboard=True)`` calls it.

        Returns at once: TensorBoard's start (seconds, more where it imports TensorFlow) runs beside the
        cluster's work, and its URL or the reason it has none is printed when known; `tensorboard_url`
        waits for it.
        """
        from sparkgrad.cluster import tensorboard

        if not tensorboard.installed():
            self._output(f"sparkgrad: tensorboard is not installed; event files go to {log_dir}")
            return

        def ready(url: str | None, error: ClusterError | None) -> None:
            if self._closed.is_set():
                return
            if error is not None:
                self._output(f"sparkgrad: {error}")
            else:
                self._output(f"sparkgrad: TensorBoard at {url} (log_dir {log_dir})")

        self._tensorboard = tensorboard.TensorBoard(log_dir, host, on_ready=ready)

    def tensorboard_url(self) -> str | None:
        """The URL of the TensorBoard started by ``tensorboard=True``, or None if none runs.

        Waits while TensorBoard is still starting (up to its start timeout, 120 s).
        """
        if self._tensorboard is None:
            return None
        try:
            return self._tensorboard.wait()
        except ClusterError:
            return None  # why was printed through the cluster's output when it happened

    def _close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._server.close()  # also wakes the pump from next_event at once
        if self._pump is not None and self._pump is not threading.current_thread():
            self._pump.join(EVENT_POLL_SECONDS * 4)
        if self._tensorboard is not None:
            self._tensorboard.close()
