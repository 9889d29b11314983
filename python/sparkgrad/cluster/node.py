"""The node side: what runs in a Spark task (or a local process) for one executor.

run_node() is the one code path of every launcher: it binds the node's
listening socket first (kept open until the node ends: no bind-close-rebind
race), registers with the driver's rendezvous through an authenticated
ControlClient, builds ctx from the spec the driver sends (ctx.env: TF_CONFIG
and the launcher's env=, exported to os.environ only by a node that is its
own process, never by a thread of the driver), forwards the node's log
records and stdout/stderr lines to the driver, runs map_fun(args, ctx),
and reports "done" or the exception with its traceback.
Training nodes of a cluster without ps also bind a second socket, the
allreduce communicator's (registered as comm_port), and run map_fun with
the communicator's handle assigned in sparkgrad.cluster.collective (what
hvd.init() opens), closed when map_fun ended; run_node_keeping_result
keeps map_fun's value (pickled) for the launcher's own result path.
A watcher thread listens for the driver's "stop" (or the loss of the driver)
and stops the node; sockets are always closed on the way out.

What it does not do: choose roles (roles.py), talk to Spark's scheduler
(spark.py), or decide what a failure means for the cluster (driver.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sparkgrad.cluster import collective, rank
from sparkgrad.cluster.context import NodeContext, NodeInfo, cluster_spec, tf_config
from sparkgrad.cluster.roles import PS, TRAINING_ROLES, ClusterTemplate, InputMode
from sparkgrad.cluster.transport import net
from sparkgrad.errors import CancelledError, ClusterError, SparkgradError

logger = logging.getLogger(__name__)

MapFun = Callable[[Any, NodeContext], Any]


@dataclass(frozen=True)
class NodeConfig:
    """Everything a node needs from the driver; shipped in the task closure."""

    driver_host: str
    driver_port: int
    secret: bytes = field(repr=False)
    template: ClusterTemplate
    default_fs: str = "file://"
    working_dir: str = "."
    input_mode: InputMode = InputMode.TENSORFLOW
    log_dir: str | None = None
    register_timeout: float = 600.0  # seconds a node waits for the whole cluster to register
    stop_grace: float = 5.0  # seconds map_fun gets to return after "stop" before it is interrupted
    feed_capacity_bytes: int = 256 << 20  # per input, on each training node (InputMode.SPARK)
    # Test hook: executor ids that never register (they wait register_timeout, then fail).
    hold_registration: frozenset[int] = frozenset()
    # Environment variables of every node's map_fun (sparkgrad.run's and TFCluster.run's env=): in ctx.env, and
    # in os.environ while map_fun runs on a node that is its own process.
    env: tuple[tuple[str, str], ...] = ()
    # Restarts of the cluster before this generation of nodes (TFCluster.run's max_restarts): ctx.attempt.
    attempt: int = 0
    # Protection of every connection after its handshake (TFCluster.run's security=), decided on the driver;
    # None: the C core's default (_core.SECURITY_DEFAULT), never a second copy of it here.
    security: str | None = None

    @property
    def opens_comm_port(self) -> bool:
        """Training nodes of a cluster without ps get a second listener for the allreduce communicator."""
        return not self.template.executors(PS)


class NodeStopped(CancelledError):
    """Raised inside map_fun when it did not return within stop_grace of the driver's stop."""


@dataclass
class _Outcome:
    status: str  # "done", "error" or "stopped"
    result: str  # JSON text


def _json_result(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return json.dumps(repr(value))


class _LineForwarder(io.TextIOBase):
    """A text stream that keeps writing to ``original`` and sends each complete line to the driver."""

    def __init__(self, send: Callable[[str], None], original: Any) -> None:
        super().__init__()
        self._send = send
        self._original = original
        self._partial = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self._original is not None:
            self._original.write(text)
        with self._lock:
            self._partial += text
            *lines, self._partial = self._partial.split("\n")
        for line in lines:
            self._send(line)
        return len(text)

    def flush(self) -> None:
        if self._original is not None:
            self._original.flush()

    def drain(self) -> None:
        with self._lock:
            rest, self._partial = self._partial, ""
        if rest:
            self._send(rest)


class _ForwardHandler(logging.Handler):
    """Sends formatted log records to the driver (as lines of the node's stderr)."""

    def __init__(self, send: Callable[[str], None]) -> None:
        super().__init__()
        self._send = send
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._send(self.format(record))
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)


class _ThreadRouter:
    """sys.stdout or sys.stderr while nodes run as threads of the driver.

    A node thread's writes go to its node's forwarder; every other thread's
    (the driver's own, the notebook's) go to the stream this one replaced,
    which answers everything else (fileno, encoding, isatty, buffer...): with
    no route left, the router is a plain pass-through, so one left inside a
    redirection the user made meanwhile changes nothing.
    """

    def __init__(self, original: Any) -> None:
        self.original = original
        self.routes: dict[int, _LineForwarder] = {}

    def write(self, text: str) -> int:
        target = self.routes.get(threading.get_ident(), self.original)
        return len(text) if target is None else target.write(text)  # None: print() to no stream does nothing

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.original is not None:
            self.original.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


_routing_lock = threading.Lock()


@contextlib.contextmanager
def _route_thread_output(send: Callable[[str], None], send_err: Callable[[str], None] | None = None) -> Iterator[None]:
    """Sends this thread's prints to the driver, leaving every other thread's output alone.

    Its log records are the driver process's own and follow the driver's
    logging set-up (with none, Python's last-resort handler writes them to
    sys.stderr, which routes them here); a handler on the root logger would
    change how the driver's other threads log.
    """
    me = threading.get_ident()
    forwarders = {
        "stdout": _LineForwarder(send, None),
        "stderr": _LineForwarder(send_err or send, None),
    }
    routers: dict[str, _ThreadRouter] = {}
    with _routing_lock:
        for name, forwarder in forwarders.items():
            router = getattr(sys, name)
            if not isinstance(router, _ThreadRouter):
                router = _ThreadRouter(router)
                setattr(sys, name, router)
            router.routes[me] = forwarder
            routers[name] = router
    try:
        yield
    finally:
        with _routing_lock:
            for name, router in routers.items():
                router.routes.pop(me, None)
                if not router.routes and getattr(sys, name) is router:  # else wrapped since: stays, inert
                    setattr(sys, name, router.original)
        for forwarder in forwarders.values():
            forwarder.drain()


@contextlib.contextmanager
def _forward_output(
    send: Callable[[str], None], echo: bool, send_err: Callable[[str], None] | None = None
) -> Iterator[None]:
    """stdout goes to ``send``; stderr and log records to ``send_err`` (default ``send``)."""
    out = _LineForwarder(send, sys.stdout if echo else None)
    err = _LineForwarder(send_err or send, sys.stderr if echo else None)
    handler = _ForwardHandler(send_err or send)
    saved = sys.stdout, sys.stderr
    root = logging.getLogger()
    root.addHandler(handler)
    sys.stdout, sys.stderr = out, err
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        root.removeHandler(handler)
        out.drain()
        err.drain()


@contextlib.contextmanager
def _exported(values: tuple[tuple[str, str], ...]) -> Iterator[None]:
    """Sets the variables in os.environ for the block, then restores them: for a node that is its own process."""
    saved = {name: os.environ.get(name) for name, _ in values}
    for name, value in values:
        os.environ[name] = value
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def _raise_in_thread(thread_id: int, exc_type: type[BaseException]) -> None:
    """Asks the interpreter to raise exc_type in another thread at its next bytecode."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc_type))


# Exit status of a node process whose map_fun neither returned on the driver's stop (or the loss of the driver)
# nor took the NodeStopped raised stop_grace later: it is blocked in native code (a torch.distributed wait, a
# read) that no Python exception reaches, and the process ends itself stop_grace after that.
STUCK_EXIT = 86


class _StopWatcher:
    """Listens for the driver's messages while map_fun runs; "stop" (or a lost driver) stops the node.

    Stopping goes in three steps, stop_grace apart: ctx's stop signal, NodeStopped raised in map_fun's thread,
    and, in a node that is its own process, the end of that process (STUCK_EXIT). The last step is what frees
    a rank blocked in a native wait whose driver is gone: nobody else would end it. Where the driver is gone,
    the control client's C guard takes that step itself a stop_grace later, for a process whose Python cannot
    run this thread.
    """

    POLL_SECONDS = 5.0  # recv timeout; __exit__ interrupts the wait, so this is only a safety net

    def __init__(
        self,
        client: Any,
        stop: Callable[[], None],
        grace: float,
        name: str,
        on_message: Callable[[dict], None] | None = None,
        own_process: bool = False,
    ) -> None:
        self._client = client
        self._own_process = own_process
        self._on_message = on_message
        self._stop = stop
        self._grace = grace
        self._name = name
        self._finished = threading.Event()
        # held while deciding to interrupt: once __exit__ has it, map_fun's thread is never
        # interrupted (in a driver thread, the thread id could soon belong to another thread)
        self._interrupt_lock = threading.Lock()
        self._target = threading.get_ident()
        self.reason = ""
        self._thread = threading.Thread(target=self._run, name=f"sparkgrad-stop-{name}", daemon=True)

    def __enter__(self) -> _StopWatcher:
        self._thread.start()
        if self._own_process:
            # the last step again, a stop_grace later, from a C thread: this one needs the GIL, which a
            # thread stuck in native code may hold (PyTorch's gloo teardown has); ends on client.close()
            self._client.exit_when_orphaned(
                3 * self._grace,
                STUCK_EXIT,
                f"sparkgrad: {self._name}: ending the process: its driver's control connection broke "
                f"{3 * self._grace:g} s ago and its Python did not end it (a thread holds the GIL in native code)",
            )
        return self

    def __exit__(self, *exc: object) -> None:
        with self._interrupt_lock:
            self._finished.set()
        self._client.interrupt()  # its recv returns now and sees _finished
        self._thread.join(self.POLL_SECONDS * 2)

    def _run(self) -> None:
        while not self._finished.is_set():
            try:
                msg = self._client.recv(self.POLL_SECONDS)
            except SparkgradError as exc:
                msg = {"type": "stop", "reason": f"lost the driver's control connection ({exc})"}
            if msg is None:
                continue
            if msg.get("type") != "stop":
                if self._on_message is not None:
                    self._on_message(msg)
                continue
            self.reason = str(msg.get("reason", "the driver asked to stop"))
            logger.info("%s: stopping: %s", self._name, self.reason)
            self._stop()
            if not self._finished.wait(self._grace):
                with self._interrupt_lock:
                    if not self._finished.is_set():
                        _raise_in_thread(self._target, NodeStopped)
            if self._own_process and not self._finished.wait(self._grace):
                self._end_process()
            return

    def _end_process(self) -> None:
        # the forwarded output may have no driver left to reach: the process's own stderr says why
        with contextlib.suppress(Exception):
            print(
                f"sparkgrad: {self._name}: ending the process ({self.reason}): map_fun did not return on stop "
                f"nor {self._grace:g} s after NodeStopped was raised in it (blocked in native code)",
                file=sys.__stderr__,
                flush=True,
            )
        os._exit(STUCK_EXIT)


def _register(
    cfg: NodeConfig,
    executor_id: int,
    host: str,
    port: int,
    comm_port: int = 0,
    spark: tuple[str, str] | None = None,
) -> Any:
    role = cfg.template.node(executor_id)
    if executor_id in cfg.hold_registration:
        threading.Event().wait(cfg.register_timeout)
        raise ClusterError(f"{role.name} (executor {executor_id}) held back from registering by the test hook")
    node = {
        "host": host,
        "port": port,
        "role": role.role,
        "index": role.index,
        "executor_id": executor_id,
        "pid": os.getpid(),
    }
    if comm_port:
        node["comm_port"] = comm_port
    if spark is not None:  # Spark's executor id and host, so the driver names the node as Spark's log does
        node["spark_executor"], node["spark_host"] = spark
    return net().ControlClient.register(
        cfg.driver_host, cfg.driver_port, cfg.secret, node, cfg.register_timeout, security=cfg.security
    )


def _feed_messages(ctx: NodeContext) -> Callable[[dict], None] | None:
    """The driver's feed control messages for this node's FeedServer ("feed_end": an input ended)."""
    feed = ctx.mgr
    if feed is None:
        return None

    def handle(msg: dict) -> None:
        if msg.get("type") == "feed_end":
            feed.finish(msg.get("input"))

    return handle


def _node_rank(ctx: NodeContext) -> rank.ProcessRank:
    """The node's rank among the training nodes (None on ps and evaluator nodes)."""
    return rank.ProcessRank(ctx.worker_rank, ctx.num_workers, ctx.job_name)


def _run_map_fun(
    cfg: NodeConfig,
    ctx: NodeContext,
    client: Any,
    map_fun: MapFun,
    tf_args: Any,
    echo: bool,
    in_driver: bool,
    comm: collective.CommHandle | None = None,
) -> _Outcome:
    name = f"{ctx.job_name}:{ctx.task_index}"

    def send_err(line: str) -> None:  # the driver tells the node's stderr from its stdout
        client.log(line, stream="stderr")

    # A node in a thread of the driver shares the driver's process (and its other node threads'): only its own
    # thread's output is forwarded, and its environment stays in ctx.env, out of the process's os.environ.
    output = _route_thread_output(client.log, send_err) if in_driver else _forward_output(client.log, echo, send_err)
    exported = () if in_driver else tuple(ctx.env.items())
    with output, _exported(exported):
        if ctx.mgr is not None:  # on stop, closing the feed wakes a map_fun blocked in next_batch (CancelledError)
            ctx.on_stop(ctx.mgr.close)
        watcher = _StopWatcher(
            client, ctx.signal_stop, cfg.stop_grace, name, _feed_messages(ctx), own_process=not in_driver
        )
        try:
            with (
                watcher,
                rank.assigned(_node_rank(ctx), thread_only=in_driver),
                rank.attempt_assigned(ctx.attempt, thread_only=in_driver),
            ):
                with collective.assigned(comm, thread_only=in_driver):
                    value = map_fun(tf_args, ctx)
        except SystemExit as exc:  # map_fun ended its "process": success if the code says so
            if exc.code in (None, 0):
                return _Outcome("done", "null")
            client.error(f"SystemExit: map_fun exited with code {exc.code!r}", traceback.format_exc(), ctx.host)
            return _Outcome("error", json.dumps({"error": f"SystemExit({exc.code!r})"}))
        except BaseException as exc:  # noqa: BLE001 - reported to the driver, which raises it
            if ctx.stop_event.is_set():
                return _Outcome("stopped", json.dumps({"stopped": watcher.reason or str(exc)}))
            client.error(f"{type(exc).__name__}: {exc}", traceback.format_exc(), ctx.host)
            return _Outcome("error", json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    return _Outcome("done", _json_result(value))


def run_node(
    cfg: NodeConfig,
    executor_id: int,
    host: str,
    map_fun: MapFun,
    tf_args: Any,
    echo: bool = True,
    threads: int | None = None,
    in_driver: bool = False,
    spark: tuple[str, str] | None = None,
    bind_host: str | None = None,
) -> str:
    """Runs one node to its end; returns a JSON status ({"executor_id", "status", "result"}).

    The node listens on ``bind_host`` (default: env SPARKGRAD_NODE_BIND, else
    ``host``) and registers ``host``, the address the others connect to
    (they differ behind a NAT: a ps run by the driver binds the driver's bind
    address and advertises its advertised host).

    ``echo`` keeps the node's output on its own stdout/stderr too (executor
    logs); local processes share the driver's terminal and do not echo.
    The C core's thread count comes from OMP_NUM_THREADS, else the Spark
    task's spark.task.cpus, else ``threads``: nodes sharing a machine must not
    each start one OpenMP thread per core (oversubscribed OpenMP threads spin
    against each other and training slows down tenfold).

    ``in_driver``: the node is a thread of the driver process
    (driver_ps_nodes; DriverThreadLauncher is the one launcher that says
    so): its output is told apart by thread, and neither TF_CONFIG nor the
    launcher's env= is exported to os.environ (map_fun reads ctx.env). ``spark``: (Spark's executor id, its
    host) of the task running the node, carried in the registration.

    A map_fun exception is reported to the driver (which raises NodeFailure)
    and returned as status "error"; failures to reach the driver raise.
    """
    from sparkgrad._threads import configure_threads  # not via sparkgrad.nn: that imports the whole network code

    configure_threads(threads)
    role = cfg.template.node(executor_id)
    bind_host = bind_host or os.environ.get("SPARKGRAD_NODE_BIND", host)
    listener = net().Listener(bind_host, 0)
    comm_listener = None
    try:
        if cfg.opens_comm_port and role.role in TRAINING_ROLES:
            comm_listener = net().Listener(bind_host, 0)
        client = _register(cfg, executor_id, host, listener.port, comm_listener.port if comm_listener else 0, spark)
        try:
            nodes = tuple(sorted((NodeInfo.from_dict(d) for d in client.spec), key=lambda n: n.executor_id))
            feed = None
            if cfg.input_mode == InputMode.SPARK and role.role in TRAINING_ROLES:
                feed = net().FeedServer(
                    listener, cfg.secret, capacity_bytes=cfg.feed_capacity_bytes, security=cfg.security
                )
            spec = cluster_spec(nodes)
            env = {"TF_CONFIG": tf_config(spec, role.role, role.index), **dict(cfg.env)}
            ctx = NodeContext(
                executor_id=executor_id,
                job_name=role.role,
                task_index=role.index,
                cluster_spec=spec,
                defaultFS=cfg.default_fs,
                working_dir=cfg.working_dir,
                nodes=nodes,
                input_mode=cfg.input_mode,
                host=host,
                port=listener.port,
                listener=listener,
                secret=cfg.secret,
                security=cfg.security,
                log_dir=cfg.log_dir,
                mgr=feed,
                attempt=cfg.attempt,
                env=MappingProxyType(env),
                _metric_sink=client.metric,
            )
            comm = collective.handle_from_nodes(nodes, executor_id, comm_listener, cfg.secret, cfg.security)
            try:
                outcome = _run_map_fun(cfg, ctx, client, map_fun, tf_args, echo, in_driver, comm)
            finally:
                if feed is not None:
                    feed.close()
                if comm is not None:  # after an error was reported: the cause reaches the driver first
                    comm.close()
            if outcome.status != "error":
                client.done(outcome.result)
        finally:
            client.close()
    finally:
        listener.close()
        if comm_listener is not None:
            comm_listener.close()
    return json.dumps({"executor_id": executor_id, "status": outcome.status, "result": json.loads(outcome.result)})


def cloudpickle_module() -> Any:
    """The cloudpickle that ships a map_fun and its value: pyspark's when installed (as Spark ships
    closures), else the ``cloudpickle`` package, else None (plain pickle)."""
    try:
        from pyspark import cloudpickle
    except ImportError:
        try:
            import cloudpickle  # type: ignore[no-redef]
        except ImportError:
            return None
    return cloudpickle


def dumps_result(obj: Any) -> bytes:
    """A map_fun (with its args) or its value as bytes for the launcher's own paths (the local process
    start pipe, Spark's task result, the local result pipe).

    cloudpickle when available (`cloudpickle_module`), else pickle; these bytes never travel on
    sparkgrad's sockets.
    """
    import pickle

    pickler = cloudpickle_module()
    return pickle.dumps(obj) if pickler is None else pickler.dumps(obj)


def run_node_keeping_result(
    cfg: NodeConfig, executor_id: int, host: str, map_fun: MapFun, tf_args: Any, **kwargs: Any
) -> tuple[str, bytes | None]:
    """run_node, with map_fun's value kept as pickled bytes for the launcher (None unless map_fun returned).

    The value is pickled inside the node's map_fun call, so a value that
    cannot be pickled fails the node with its traceback like any error; the
    driver's "done" carries null.
    """
    kept: list[bytes] = []

    def keep(args: Any, ctx: NodeContext) -> None:
        kept.append(dumps_result(map_fun(args, ctx)))

    status = run_node(cfg, executor_id, host, keep, tf_args, **kwargs)
    return status, (kept[0] if kept else None)
