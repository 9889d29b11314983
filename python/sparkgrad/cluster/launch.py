"""TFCluster.run: builds the template, the secret and the rendezvous, then starts the nodes.

With a SparkContext the nodes run on executors (a barrier stage; with
driver_ps_nodes the ps nodes run as threads of the driver); with
``sc=None`` every node is a local process (the local launcher), through the
same node code path.
"""

from __future__ import annotations

import os
from typing import Any

from sparkgrad.cluster.driver import Cluster, default_output, new_secret
from sparkgrad.cluster.node import MapFun, NodeConfig
from sparkgrad.cluster.roles import PS, InputMode, build_template
from sparkgrad.cluster.transport import net
from sparkgrad.errors import InvalidArgumentError

LOCAL_HOST = "127.0.0.1"


def _held_executors() -> frozenset[int]:
    """Test hook: SPARKGRAD_TEST_HOLD_REGISTRATION="1,2" keeps those executors from registering."""
    raw = os.environ.get("SPARKGRAD_TEST_HOLD_REGISTRATION", "")
    return frozenset(int(x) for x in raw.split(",") if x.strip())


def _default_fs(sc: Any) -> str:
    if sc is None:
        return "file://"
    fs = str(sc._jsc.hadoopConfiguration().get("fs.defaultFS") or "file://")
    while fs.endswith("/") and not fs.endswith("://"):  # "file:///" -> "file://", as TensorFlowOnSpark
        fs = fs[:-1]
    return fs


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
) -> Cluster:
    """Starts map_fun(tf_args, ctx) on num_executors nodes and returns once all registered.

    sc=None runs the nodes as local processes. ``queues`` and ``release_port``
    are accepted for TensorFlowOnSpark compatibility and have no effect: data
    moves over the C feed, and every node's listening socket stays bound
    (ctx.listener) until the node ends. ``heartbeat_timeout`` (s) bounds how
    long a silent node counts as alive; ``stop_grace`` (s) is how long nodes
    get to end after a stop before they are ended; ``slots_timeout`` (s) how
    long to wait for executors to provide enough task slots.
    """
    if driver_ps_nodes and input_mode != InputMode.TENSORFLOW:
        raise InvalidArgumentError("driver_ps_nodes=True is only supported with InputMode.TENSORFLOW")
    if eval_node and input_mode != InputMode.TENSORFLOW:
        raise InvalidArgumentError("eval_node=True is only supported with InputMode.TENSORFLOW")
    template = build_template(num_executors, num_ps, master_node, eval_node)
    ps_ids = template.executors(PS)
    local_ids = tuple(range(num_executors)) if sc is None else (ps_ids if driver_ps_nodes else ())
    spark_ids = tuple(i for i in range(num_executors) if i not in local_ids)

    if sc is None:
        host = os.environ.get("SPARKGRAD_DRIVER_HOST", LOCAL_HOST)
        bind = host
    else:
        from sparkgrad.cluster.spark import check_spark, driver_address

        # InputMode.SPARK: the feeding tasks need a slot beside the nodes' barrier tasks
        feed_slots = 1 if InputMode(input_mode) == InputMode.SPARK else 0
        check_spark(sc, len(spark_ids), slots_timeout, feed_slots)
        host, bind = driver_address(sc)

    if tensorboard and log_dir is None:  # TensorFlowOnSpark's default: a fixed path under the working directory
        log_dir = os.path.join(os.getcwd(), "tensorboard")
    secret = new_secret()
    server = net().RendezvousServer(secret, num_executors, bind, 0)
    try:
        server.heartbeat_timeout = float(heartbeat_timeout)
        cfg = NodeConfig(
            driver_host=host,
            driver_port=server.port,
            secret=secret,
            template=template,
            default_fs=_default_fs(sc),
            working_dir=os.getcwd(),
            input_mode=InputMode(input_mode),
            log_dir=log_dir,
            register_timeout=float(reservation_timeout),
            stop_grace=float(stop_grace),
            hold_registration=_held_executors(),
        )
        launchers: list[Any] = []
        if spark_ids:  # first: Spark's barrier job is the slow part to start
            from sparkgrad.cluster.spark import SparkLauncher

            launchers.append(SparkLauncher(sc, cfg, spark_ids, map_fun, tf_args))
        if local_ids and sc is None:
            from sparkgrad.cluster.local import LocalLauncher  # multiprocessing: loaded only when used

            launchers.append(LocalLauncher(cfg, local_ids, map_fun, tf_args, host=host))
        elif local_ids:
            from sparkgrad.cluster.local import DriverThreadLauncher

            launchers.append(DriverThreadLauncher(cfg, local_ids, map_fun, tf_args, host=host))
    except BaseException:
        server.close()
        raise
    cluster = Cluster(
        template=template,
        server=server,
        launchers=launchers,
        input_mode=InputMode(input_mode),
        stop_grace=float(stop_grace),
        output=output,
        sc=sc,
        secret=secret,
    )
    cluster.start(float(reservation_timeout))
    if tensorboard:
        cluster.start_tensorboard(cfg.log_dir or "", host)
    return cluster
