"""TFCluster.run: builds the template, the secret and the rendezvous, then starts the nodes.

With a SparkContext, a SparkSession or a Spark Connect session the nodes run
on executors (a barrier stage; with driver_ps_nodes the ps nodes run as
threads of the driver); with ``sc=None`` every node is a local process (the
local launcher), through the same node code path.
"""

from __future__ import annotations

import os
from typing import Any

from sparkgrad.cluster.driver import Cluster, Generation, default_output, new_secret
from sparkgrad.cluster.node import MapFun, NodeConfig
from sparkgrad.cluster.roles import PS, InputMode, build_template
from sparkgrad.cluster.security import resolve as resolve_security
from sparkgrad.cluster.transport import net
from sparkgrad.errors import ClusterError, InvalidArgumentError, SparkgradError

LOCAL_HOST = "127.0.0.1"


def held_executors() -> frozenset[int]:
    """Executor ids kept from registering (NodeConfig.hold_registration): none.

    A test hook: a test replaces this function (``monkeypatch.setattr(launch, "held_executors", ...)``)
    to make nodes miss the rendezvous; production code never sets it.
    """
    return frozenset()


def _default_fs(session: Any) -> str:
    if session is None:
        return "file://"
    fs = session.default_fs()
    while fs.endswith("/") and not fs.endswith("://"):  # "file:///" -> "file://", as TensorFlowOnSpark
        fs = fs[:-1]
    return fs


def _rendezvous_server(secret: bytes, num_nodes: int, bind: str, session: Any, security: str) -> Any:
    """The driver's RendezvousServer on ``bind`` (port 0: the port bound is the one reported)."""
    try:
        return net().RendezvousServer(secret, num_nodes, bind, 0, security=security)
    except SparkgradError as exc:
        if session is None or not session.connect:
            raise
        raise ClusterError(
            f"cannot listen on {bind}, the Spark Connect server's driver address ({exc}): the rendezvous runs in "
            "this Python process, which must run where the executors can reach it (a notebook on the cluster's "
            "driver node); a Databricks Connect client on a laptop is not reachable from the executors. Set "
            "SPARKGRAD_DRIVER_HOST (and spark.sparkgrad.driver.bindAddress) to an address of this machine that "
            "the executors reach"
        ) from None


def run(
    sc: Any,
    map_fun: MapFun,
    tf_args: Any,
    num_executors: int,
    num_ps: int,
    tensorboard: bool = False,
    input_mode: InputMode = InputMode.TENSORFLOW,
    log_dir: str | None = None,
    driver_ps_nodes: bool = False,
    master_node: str | None = None,
    reservation_timeout: float = 600,
    queues: Any = None,
    eval_node: bool = False,
    release_port: bool = True,
    *,
    heartbeat_timeout: float = 10.0,
    stop_grace: float = 5.0,
    slots_timeout: float = 30.0,
    output: Any = default_output,
    keep_results: bool = False,
    env: dict[str, str] | None = None,
    label: Any = None,
    on_log: Any = None,
    max_restarts: int = 0,
    security: str | None = None,
    preload: tuple[str, ...] = (),
) -> Cluster:
    """Starts ``map_fun(tf_args, ctx)`` on ``num_executors`` nodes and returns the cluster once all registered.

    TensorFlowOnSpark's ``TFCluster.run``: the first ``num_ps`` executors are parameter servers, then a
    chief (with ``master_node``), an evaluator (with ``eval_node``), and the rest workers. Each node's
    ``ctx`` carries TensorFlowOnSpark's fields (``job_name``, ``task_index``, ``cluster_spec``,
    ``num_workers``, ``defaultFS``, ``absolute_path()``, ...) and ``ctx.mgr`` for `TFNode.DataFeed`.

    ```python
    cluster = TFCluster.run(sc, map_fun, args, num_executors=4, num_ps=1, input_mode=InputMode.SPARK)
    cluster.train(df, num_epochs=1)
    cluster.shutdown()
    ```

    Args:
        sc: A SparkContext, a SparkSession (a classic one runs through its SparkContext), a Spark
            Connect session (the nodes run as a barrier ``mapInArrow`` stage), or None to run the
            nodes as local processes of this machine.
        map_fun: ``map_fun(tf_args, ctx)``, run on every node; picklable.
        tf_args: Passed to every ``map_fun`` (an argparse Namespace, a dict, ...).
        num_executors: Nodes in the cluster, parameter servers included.
        num_ps: Parameter servers among them; 0 gives the training nodes an allreduce communicator
            (``sparkgrad.hvd``) instead.
        tensorboard: Serve TensorBoard from the driver on ``log_dir`` (see `TFCluster.tensorboard_url`).
        input_mode: ``InputMode.TENSORFLOW`` (each worker reads its own data) or ``InputMode.SPARK``
            (``cluster.train`` feeds it).
        log_dir: The nodes' ``ctx.log_dir`` and TensorBoard's directory (default ``./tensorboard`` with
            ``tensorboard``).
        driver_ps_nodes: Run the ps nodes as threads of the driver (``InputMode.TENSORFLOW`` only).
        master_node: The chief's role name (``"chief"`` or ``"master"``); None: no chief, worker 0 leads.
        reservation_timeout: Seconds to wait for every node to register.
        queues: Accepted for TensorFlowOnSpark compatibility, no effect (data moves over the C feed).
        eval_node: Make one node an evaluator (``InputMode.TENSORFLOW`` only).
        release_port: Accepted for TensorFlowOnSpark compatibility, no effect: every node's listening
            socket stays bound (``ctx.listener``) until the node ends.
        heartbeat_timeout: Seconds a silent node still counts as alive.
        stop_grace: Seconds nodes get to end after a stop before they are ended.
        slots_timeout: Seconds to wait for Spark's executors to provide enough task slots.
        output: Called with each line of the nodes' live output (default: print to stdout).
        keep_results: Bring ``map_fun``'s return values back (`TFCluster.node_results` after shutdown).
        env: Environment variables of every node's ``map_fun``: in ``ctx.env``, and set in ``os.environ``
            while ``map_fun`` runs on a node that is its own process (not on a ps run as a thread of the
            driver, whose environment stays the driver's).
        label: ``label(event)`` names a node in output and failures (default ``role:index``).
        on_log: ``on_log(event)`` takes the nodes' log events instead of ``output``.
        max_restarts: When a node is lost or fails while training (its process died, it raised, it went
            silent, its task failed), stop the others and start every node again, up to this many
            times, printing each restart with its cause; the last NodeFailure is raised once none is
            left. Restarted nodes see ``ctx.attempt`` (the restarts so far), and ``model.fit`` with a
            ``checkpoint_dir`` resumes from the chief's last checkpoint, so at most one checkpoint
            interval of training is lost. 0 (default): a failure is raised at once.
            ``InputMode.TENSORFLOW`` only (fed data cannot be rewound to a checkpoint).
        security: What protects every connection of the cluster after its handshake: ``"auth"`` (each
            frame authenticated and numbered, so altered, injected, replayed or truncated frames are
            refused and named), ``"encrypt"`` (authenticated and encrypted), or ``"none"`` (an explicit
            opt-out that logs a warning). Default: ``$SPARKGRAD_SECURITY``, else
            ``sparkgrad.cluster.security.default()`` (the documentation's "Security and the wire" page
            says what each costs).
        preload: Modules that local node processes (``sc=None``) find already imported: they are forked
            from a server (one per driver process) that imported them once, so later runs skip those
            imports. Default none: each node is a spawned process.

    Returns:
        The running cluster (`TFCluster.TFCluster`).

    Raises:
        InvalidArgumentError: An option that does not fit the input mode, or a bad role layout.
        InsufficientSlotsError: Spark has fewer task slots than the cluster needs after ``slots_timeout``.
        RendezvousTimeout: Not every node registered within ``reservation_timeout``.
        NodeFailure: A node failed while the cluster formed.
    """
    security = resolve_security(security)
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise InvalidArgumentError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
    if max_restarts and InputMode(input_mode) != InputMode.TENSORFLOW:
        raise InvalidArgumentError(
            "max_restarts > 0 needs InputMode.TENSORFLOW: with InputMode.SPARK the data fed by cluster.train() "
            "cannot be rewound to the position of a checkpoint"
        )
    if driver_ps_nodes and input_mode != InputMode.TENSORFLOW:
        raise InvalidArgumentError("driver_ps_nodes=True is only supported with InputMode.TENSORFLOW")
    if eval_node and input_mode != InputMode.TENSORFLOW:
        raise InvalidArgumentError("eval_node=True is only supported with InputMode.TENSORFLOW")
    template = build_template(num_executors, num_ps, master_node, eval_node)
    ps_ids = template.executors(PS)
    local_ids = tuple(range(num_executors)) if sc is None else (ps_ids if driver_ps_nodes else ())
    spark_ids = tuple(i for i in range(num_executors) if i not in local_ids)

    session = None
    if sc is None:
        host = os.environ.get("SPARKGRAD_DRIVER_HOST", LOCAL_HOST)
        bind = host
    else:
        from sparkgrad.cluster.spark import check_spark, driver_address, spark_session

        session = spark_session(sc)
        # InputMode.SPARK: the feeding tasks need a slot beside the nodes' barrier tasks
        feed_slots = 1 if InputMode(input_mode) == InputMode.SPARK else 0
        check_spark(session, len(spark_ids), slots_timeout, feed_slots, warn=output)
        host, bind = driver_address(session)

    if tensorboard and log_dir is None:  # TensorFlowOnSpark's default: a fixed path under the working directory
        log_dir = os.path.join(os.getcwd(), "tensorboard")

    def generation(attempt: int) -> Generation:
        """A fresh rendezvous (new secret, new port) and launchers for every node; attempt: restarts so far."""
        secret = new_secret()
        server = _rendezvous_server(secret, num_executors, bind, session, security)
        try:
            server.heartbeat_timeout = float(heartbeat_timeout)
            launchers = launchers_for(secret, server.port, attempt)
        except BaseException:
            server.close()
            raise
        return Generation(server, launchers, secret)

    def launchers_for(secret: bytes, port: int, attempt: int) -> list[Any]:
        cfg = NodeConfig(
            driver_host=host,
            driver_port=port,
            secret=secret,
            template=template,
            default_fs=_default_fs(session),
            working_dir=os.getcwd(),
            input_mode=InputMode(input_mode),
            log_dir=log_dir,
            register_timeout=float(reservation_timeout),
            stop_grace=float(stop_grace),
            hold_registration=held_executors(),
            env=tuple(sorted((str(k), str(v)) for k, v in (env or {}).items())),
            attempt=attempt,
            security=security,
        )
        launchers: list[Any] = []
        if spark_ids:  # first: Spark's barrier job is the slow part to start
            from sparkgrad.cluster.spark import SparkLauncher

            launchers.append(SparkLauncher(session, cfg, spark_ids, map_fun, tf_args, keep_result=keep_results))
        if local_ids and sc is None:
            from sparkgrad.cluster.local import LocalLauncher  # multiprocessing: loaded only when used

            launchers.append(
                LocalLauncher(cfg, local_ids, map_fun, tf_args, host=host, keep_result=keep_results, preload=preload)
            )
        elif local_ids:
            from sparkgrad.cluster.local import DriverThreadLauncher

            launchers.append(DriverThreadLauncher(cfg, local_ids, map_fun, tf_args, host=host, bind_host=bind))
        return launchers

    first = generation(0)
    cluster = Cluster(
        template=template,
        server=first.server,
        launchers=first.launchers,
        input_mode=InputMode(input_mode),
        stop_grace=float(stop_grace),
        output=output,
        spark=session,
        secret=first.secret,
        security=security,
        label=label,
        on_log=on_log,
        relaunch=generation,
        max_restarts=max_restarts,
    )
    cluster.start(float(reservation_timeout))
    if tensorboard:
        cluster.start_tensorboard(log_dir or "", host)
    return cluster
