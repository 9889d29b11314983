"""``sparkgrad.run`` and ``sparkgrad.HorovodRunner``: fn on N ranks, its values back by rank.

Both run a cluster of ``num_proc`` training nodes and no ps through the
cluster machinery of TFCluster (the driver's rendezvous, the nodes' control
connections, live output, NodeFailure, the Spark barrier stage or the local
processes). Each node's map_fun calls ``fn(*args, **kwargs)`` with the
node's rank set (``sparkgrad.cluster.rank``), ``env`` in its environment,
and what ``sparkgrad.hvd.init()`` needs to form the allreduce communicator
(``sparkgrad.cluster.collective``). fn's value is pickled in its process and
comes back through the launcher's own result path: the barrier stage's
collected rows on Spark (classic or Connect), the process's pipe locally;
never on sparkgrad's sockets.

Where the ranks run: on the ``spark=`` session, else the active
SparkSession / SparkContext (as horovod.spark.run), else as local processes
on this machine (development without Spark).
"""

from __future__ import annotations

import datetime
import os
import pickle
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkgrad.cluster.security import resolve as resolve_security
from sparkgrad.errors import ClusterError, InvalidArgumentError, NodeFailure

DEFAULT_START_TIMEOUT = 600.0
STOP_GRACE = 2.0  # seconds the other ranks of a failed run get to end before they are interrupted / ended


def active_spark() -> Any:
    """The active SparkSession (classic or Connect) or SparkContext of this process, else None.

    Looked up only when pyspark is already imported: a process that never
    imported it has no session, and the lookup costs it no import.
    """
    if "pyspark" not in sys.modules:
        return None
    connect = sys.modules.get("pyspark.sql.connect.session")
    if connect is not None:
        session = connect.SparkSession.getActiveSession()
        if session is not None:
            return session
    try:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
    except Exception:  # noqa: BLE001 - a pyspark that cannot answer has no usable session
        session = None
    if session is not None:
        return session
    from pyspark import SparkContext

    return SparkContext._active_spark_context


@dataclass(frozen=True)
class _RankMain:
    """The map_fun of each rank: fn(*args, **kwargs), its value returned to the launcher."""

    fn: Callable[..., Any]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def __call__(self, _tf_args: Any, _ctx: Any) -> Any:
        return self.fn(*self.args, **self.kwargs)


class _RankOutput:
    """Writes the ranks' lines to ``stdout`` / ``stderr`` (file-like, else the driver's own), prefixed ``rank N``."""

    def __init__(self, stdout: Any, stderr: Any, timestamps: bool) -> None:
        self._stdout = stdout
        self._stderr = stderr
        self._timestamps = timestamps
        self._lock = threading.Lock()

    def _stream(self, name: str | None) -> Any:
        if name == "stderr":
            return self._stderr if self._stderr is not None else sys.stderr
        return self._stdout if self._stdout is not None else sys.stdout

    def prefix(self, ev: dict) -> str:
        stamp = f"{datetime.datetime.now().isoformat(sep=' ', timespec='milliseconds')} " if self._timestamps else ""
        return f"{stamp}rank {ev.get('executor_id')}"

    def log(self, ev: dict) -> None:
        self.write(f"{self.prefix(ev)}: {ev.get('line', '')}", ev.get("stream"))

    def write(self, line: str, stream: str | None = None) -> None:
        with self._lock:
            out = self._stream(stream)
            out.write(line + "\n")
            out.flush()


def _label(ev: dict) -> str:
    return f"rank {ev.get('executor_id')}"


def _driver_output(out: _RankOutput, verbose: int) -> Callable[[str], None]:
    def write(line: str) -> None:
        routine = line.startswith("sparkgrad: cluster formed")
        if verbose >= 2 or (verbose >= 1 and not routine):
            out.write(line, "stderr")

    return write


def _check_num_proc(num_proc: Any) -> int:
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise InvalidArgumentError(f"num_proc must be a positive int, got {num_proc!r}")
    return num_proc


def _spark_slots(session: Any) -> int:
    from sparkgrad.cluster.spark import spark_session

    count = spark_session(session).slot_count()
    if count.slots is None or count.slots < 1:
        raise InvalidArgumentError(
            f"num_proc was not given and this Spark session does not tell its task slots ({count.source}): "
            "pass num_proc"
        )
    return int(count.slots)


def run(
    fn: Callable[..., Any],
    args: tuple = (),
    kwargs: dict | None = None,
    num_proc: int | None = None,
    start_timeout: float | None = None,
    env: dict[str, str] | None = None,
    stdout: Any = None,
    stderr: Any = None,
    verbose: int = 1,
    prefix_output_with_timestamp: bool = False,
    spark: Any = None,
    *,
    local: bool = False,
    max_restarts: int = 0,
    security: str | None = None,
    preload: tuple[str, ...] | None = None,
) -> list[Any]:
    """Runs ``fn(*args, **kwargs)`` on ``num_proc`` ranks and returns its values, by rank (as horovod.spark.run).

    In each rank, ``sparkgrad.hvd.init()`` forms the allreduce communicator with the others. Each
    rank's output streams here as it is written, every line prefixed ``rank N:``.

    ```python
    def train(epochs):
        hvd.init()
        ...
        return hvd.rank()

    sparkgrad.run(train, kwargs={"epochs": 2}, num_proc=2)  # [0, 1]
    ```

    A rank that raises fails the run: NodeFailure naming the rank (``.rank``) and host, with that
    rank's traceback (``.remote_traceback``); one that dies without a word (killed, out of memory) is
    named as lost. The other ranks are stopped and every process ends before the error is raised.

    Args:
        fn: The function each rank runs; it and its arguments must be picklable.
        args: Positional arguments of ``fn``.
        kwargs: Keyword arguments of ``fn``.
        num_proc: Number of ranks; default the session's task slots (locally: this machine's cores).
        start_timeout: Seconds to wait for every rank to start and register; default 600, or the
            environment variable ``SPARKGRAD_START_TIMEOUT``.
        env: Environment variables set in every rank while ``fn`` runs.
        stdout: File-like object that gets the ranks' stdout lines (default this process's stdout).
        stderr: File-like object that gets the ranks' stderr lines and log records (default this
            process's stderr).
        verbose: 0 shows only the ranks' output, 1 also sparkgrad's failure messages, 2 also the
            cluster's formation.
        prefix_output_with_timestamp: Put a timestamp before each line's ``rank N:``.
        spark: A SparkContext, SparkSession or Spark Connect session to run the ranks on, as one barrier
            stage; default the active one; with none, the ranks are processes of this machine.
        local: Run the ranks as processes of this machine even when a Spark session is active.
        max_restarts: After a rank is lost or fails, stop the others and run every rank again (a new
            barrier stage), up to this many times, each restart printed with its cause (verbose >= 1);
            then the last NodeFailure is raised. In the restarted ranks
            ``sparkgrad.cluster.rank.attempt()`` is the number of restarts so far, and ``model.fit``
            with a ``checkpoint_dir`` resumes from rank 0's last checkpoint. Default 0: the first failure
            is raised.
        security: The protection of the ranks' connections after their handshake, ``"auth"``,
            ``"encrypt"`` or ``"none"``, as for ``TFCluster.run`` (default ``$SPARKGRAD_SECURITY``, else
            sparkgrad's default).
        preload: Modules the local ranks (no Spark) find already imported: the ranks fork from a server
            that imported them once per driver process, so a second ``run`` skips those imports (torch's
            takes seconds). Each rank is still a fresh process. Default ``("torch",)`` when this process
            has imported torch, else none (each rank a spawned process).

    Returns:
        ``fn``'s return value in each rank, in rank order. They come back pickled through Spark's task
        results or the local process's pipe, never on sparkgrad's sockets.

    Raises:
        NodeFailure: A rank raised or was lost (after any restarts).
        InvalidArgumentError: A ``num_proc`` that is not a positive int, or another bad argument.
        InsufficientSlotsError: Spark has fewer task slots than ``num_proc``.
        RendezvousTimeout: Not every rank registered within ``start_timeout``.
    """
    from sparkgrad.cluster.launch import run as launch

    session = None if local else (spark if spark is not None else active_spark())
    if num_proc is None:
        num_proc = _spark_slots(session) if session is not None else (os.cpu_count() or 1)
    num_proc = _check_num_proc(num_proc)
    if start_timeout is None:
        start_timeout = float(os.environ.get("SPARKGRAD_START_TIMEOUT", DEFAULT_START_TIMEOUT))
    if preload is None:
        preload = ("torch",) if "torch" in sys.modules else ()
    out = _RankOutput(stdout, stderr, bool(prefix_output_with_timestamp))
    main = _RankMain(fn, tuple(args), dict(kwargs or {}))
    cluster = launch(
        session,
        main,
        None,
        num_proc,
        0,
        reservation_timeout=float(start_timeout),
        stop_grace=STOP_GRACE,
        output=_driver_output(out, int(verbose)),
        keep_results=True,
        env=dict(env or {}),
        label=_label,
        on_log=out.log,
        max_restarts=max_restarts,
        security=security,
        preload=tuple(preload),
    )
    try:
        cluster.shutdown(timeout=-1)
    except NodeFailure as exc:
        exc.rank = exc.details["rank"] = exc.details.get("executor_id")
        raise
    results = cluster.node_results()
    values = []
    for rank in range(num_proc):
        payload = results.get(rank)
        if payload is None:
            raise ClusterError(f"rank {rank} finished but its value did not come back through the launcher")
        values.append(pickle.loads(payload))
    return values


class HorovodRunner:
    """Databricks' HorovodRunner on sparkgrad: ``HorovodRunner(np=2).run(main, **kwargs)`` is rank 0's value.

    ```python
    hr = HorovodRunner(np=-2)  # two processes on this machine
    accuracy = hr.run(train, epochs=2)
    ```

    Args:
        np: ``np > 0``: a barrier stage of ``np`` tasks on the active Spark session (as local processes
            when there is none, for development); ``np < 0``: ``-np`` processes on this machine (the
            driver), Spark or not. ``np == 0`` (all task slots in old Databricks releases) is refused.
        driver_log_verbosity: ``"all"`` (default) streams every rank's output; ``"log_callback_only"``
            (Databricks' default for ``np > 0``) keeps rank output off the driver except failures.
        spark: The Spark session to run on (default the active one).
        security: As for `sparkgrad.run`.

    Raises:
        InvalidArgumentError: ``np`` is 0 or not an int, an unknown ``driver_log_verbosity``, or an
            unknown ``security`` mode.
    """

    def __init__(
        self, np: int, driver_log_verbosity: str = "all", spark: Any = None, *, security: str | None = None
    ) -> None:
        if isinstance(np, bool) or not isinstance(np, int) or np == 0:
            raise InvalidArgumentError(
                f"HorovodRunner(np={np!r}): np is the number of processes, > 0 on Spark's executors, < 0 on the driver"
            )
        if driver_log_verbosity not in ("all", "log_callback_only"):
            raise InvalidArgumentError(
                f"driver_log_verbosity must be 'all' or 'log_callback_only', got {driver_log_verbosity!r}"
            )
        self.num_processor = np
        self.driver_log_verbosity = driver_log_verbosity
        self._spark = spark
        if security is not None:
            resolve_security(security, warn=False)  # a bad mode fails here, not in run()
        self._security = security

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """Runs ``main(**kwargs)`` on every process (see `sparkgrad.run`); returns rank 0's value.

        Raises:
            NodeFailure: A rank raised or was lost.
        """
        np = self.num_processor
        quiet = self.driver_log_verbosity == "log_callback_only"
        sink = _Discard() if quiet else None
        if np > 0 and self._spark is None and active_spark() is None:
            print(
                f"sparkgrad: HorovodRunner(np={np}): no active Spark session, running {np} processes on this "
                "machine (np < 0 says so explicitly)",
                file=sys.stderr,
                flush=True,
            )
        values = run(
            main,
            kwargs=kwargs,
            num_proc=abs(np),
            spark=self._spark,
            local=np < 0,
            stdout=sink,
            stderr=sink,
            verbose=1,
            security=self._security,
        )
        return values[0]


class _Discard:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


__all__ = ["HorovodRunner", "active_spark", "run"]
