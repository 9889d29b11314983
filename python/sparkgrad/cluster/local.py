"""Running nodes on this machine, outside Spark's executors.

The same node code path as on Spark (node.run_node), registering with the
driver's rendezvous like any other node, so failures, logs and stop behave
as on a cluster.

- LocalLauncher (the local launcher, ``sc=None``): each node is a
  ``multiprocessing`` "spawn" process. map_fun and its args reach the child
  through the process start pipe (cloudpickle when available, so closures
  work as on Spark); nothing is pickled on a network socket.
- DriverThreadLauncher (``driver_ps_nodes=True`` on Spark): each ps node is a
  thread of the driver, as in TensorFlowOnSpark. It starts at once (a spawned
  process re-imports everything first, about 0.4 s beside Spark's tasks), and
  the ps loop runs in C with the GIL released, so the driver's own Python
  keeps running.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import wait
from typing import Any

from sparkgrad.cluster.node import MapFun, NodeConfig, dumps_result, run_node, run_node_keeping_result

KILL_WAIT_SECONDS = 5.0


def _local_node_main(
    cfg: NodeConfig, executor_id: int, host: str, payload: bytes, threads: int, result_pipe: Any = None
) -> None:
    map_fun, tf_args = pickle.loads(payload)
    if result_pipe is None:
        run_node(cfg, executor_id, host, map_fun, tf_args, echo=False, threads=threads)
        return
    _status, result = run_node_keeping_result(cfg, executor_id, host, map_fun, tf_args, echo=False, threads=threads)
    if result is not None:  # the value goes back through the process's own pipe, never a sparkgrad socket
        result_pipe.send_bytes(result)
    result_pipe.close()


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class LocalLauncher:
    """Runs each node in its own spawned process on this machine."""

    def __init__(
        self,
        cfg: NodeConfig,
        executor_ids: tuple[int, ...],
        map_fun: MapFun,
        tf_args: Any,
        host: str = "127.0.0.1",
        keep_result: bool = False,
    ):
        """``keep_result``: each process sends map_fun's pickled value back on a pipe (see results())."""
        self.executor_ids = executor_ids
        self._keep_result = keep_result
        self._pipes: dict[int, Any] = {}  # executor id -> the reading end of its result pipe
        self._results: dict[int, bytes] = {}
        self._cfg = cfg
        self._host = host
        self._payload = dumps_result((map_fun, tf_args))
        self._mp = multiprocessing.get_context("spawn")
        self._procs: dict[int, Any] = {}
        self._cancelled = False

    def start(self) -> None:
        threads = max(1, (os.cpu_count() or 1) // max(1, len(self.executor_ids)))  # each node's share of the cores
        for eid in self.executor_ids:
            role = self._cfg.template.node(eid)
            writer = None
            if self._keep_result:
                self._pipes[eid], writer = self._mp.Pipe(duplex=False)
            proc = self._mp.Process(
                target=_local_node_main,
                args=(self._cfg, eid, self._host, self._payload, threads, writer),
                name=f"sparkgrad-{role.role}-{role.index}",
                daemon=False,
            )
            proc.start()
            if writer is not None:
                writer.close()  # the child's copy is the one left: its exit makes our end readable (EOF)
            self._procs[eid] = proc

    def _read_results(self, timeout: float = 0.0) -> None:
        """Takes what the result pipes have (a child blocks on a large value until it is read)."""
        if not self._pipes:
            return
        by_conn = {conn: eid for eid, conn in self._pipes.items()}
        for conn in wait(list(by_conn), timeout):
            eid = by_conn[conn]
            try:
                self._results[eid] = conn.recv_bytes()
            except (EOFError, OSError):
                pass  # ended without a value (failed, or returned nothing to keep)
            conn.close()
            del self._pipes[eid]

    def results(self) -> dict[int, bytes | None]:
        """keep_result: map_fun's pickled value by executor id (None for a process that sent none)."""
        self._read_results()
        return {eid: self._results.get(eid) for eid in self.executor_ids}

    @property
    def pids(self) -> dict[int, int]:
        return {eid: p.pid for eid, p in self._procs.items()}

    def failure(self) -> str | None:
        if self._cancelled:
            return None
        for eid, proc in self._procs.items():
            if proc.exitcode not in (None, 0):
                role = self._cfg.template.node(eid)
                return f"{role.name} (pid {proc.pid}) {_exit_reason(proc.exitcode)}"
        return None

    def finished(self) -> bool:
        return all(p.exitcode is not None for p in self._procs.values())

    def join(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        pending = [p for p in self._procs.values() if p.exitcode is None]
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            wait([p.sentinel for p in pending] + list(self._pipes.values()), left)
            self._read_results()
            pending = [p for p in pending if p.exitcode is None]
        self._read_results()
        for proc in self._procs.values():
            proc.join(0)
        return True

    def cancel(self, grace: float) -> None:
        self._cancelled = True
        if self.join(grace):
            return
        for proc in self._procs.values():
            if proc.exitcode is None:
                proc.terminate()
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)  # a stopped (SIGSTOP) node acts on SIGTERM only once resumed
        if self.join(KILL_WAIT_SECONDS):
            return
        for proc in self._procs.values():
            if proc.exitcode is None:
                proc.kill()
        self.join(KILL_WAIT_SECONDS)

    def missing_hint(self) -> str:
        return "a local node process could not start or import map_fun (see its output above)"


class DriverThreadLauncher:
    """Runs nodes as daemon threads of the driver process (driver_ps_nodes=True on Spark).

    A thread cannot be killed: it ends on the driver's stop (serve_parameters
    and server.join() return at once), and map_fun gets NodeStopped raised
    stop_grace seconds later if it has not returned; one blocked where no
    exception reaches it stays a daemon thread after cancel() has waited.
    """

    def __init__(
        self,
        cfg: NodeConfig,
        executor_ids: tuple[int, ...],
        map_fun: MapFun,
        tf_args: Any,
        host: str,
        bind_host: str | None = None,
    ) -> None:
        self.executor_ids = executor_ids
        self._cfg = cfg
        self._host = host
        self._bind_host = bind_host or host  # the driver's bind address: the ps listens there
        self._map_fun = map_fun
        self._tf_args = tf_args
        self._threads: dict[int, threading.Thread] = {}
        self._errors: dict[int, str] = {}
        self._cancelled = False

    def start(self) -> None:
        for eid in self.executor_ids:
            role = self._cfg.template.node(eid)
            thread = threading.Thread(
                target=self._run, args=(eid,), name=f"sparkgrad-{role.role}-{role.index}", daemon=True
            )
            thread.start()
            self._threads[eid] = thread

    def _run(self, eid: int) -> None:
        try:
            # one OpenMP thread: applies to this thread only, and a ps must not take the workers' cores
            run_node(
                self._cfg,
                eid,
                self._host,
                self._map_fun,
                self._tf_args,
                echo=False,
                threads=1,
                in_driver=True,
                bind_host=self._bind_host,
            )
        except BaseException as exc:  # noqa: BLE001 - kept for failure(), and shown with its traceback
            name = self._cfg.template.node(eid).name
            self._errors[eid] = f"{type(exc).__name__}: {exc}"
            print(f"sparkgrad: {name} (a thread of the driver) failed:\n{traceback.format_exc()}", file=sys.stderr)

    def failure(self) -> str | None:
        if self._cancelled:
            return None
        for eid, error in list(self._errors.items()):  # a copy: other ps threads may add theirs meanwhile
            return f"{self._cfg.template.node(eid).name} (a thread of the driver) could not run: {error}"
        return None

    def finished(self) -> bool:
        return not any(t.is_alive() for t in self._threads.values())

    def join(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for thread in self._threads.values():
            thread.join(max(0.0, deadline - time.monotonic()))
        return self.finished()

    def cancel(self, grace: float) -> None:
        self._cancelled = True
        # the driver's stop went out first; NodeStopped follows stop_grace later
        self.join(grace + self._cfg.stop_grace + KILL_WAIT_SECONDS)

    def missing_hint(self) -> str:
        return "a ps thread of the driver could not register (see its error above)"
