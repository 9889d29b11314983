"""Running nodes on this machine, outside Spark's executors.

The same node code path as on Spark (node.run_node), registering with the
driver's rendezvous like any other node, so failures, logs and stop behave
as on a cluster.

- LocalLauncher (the local launcher, ``sc=None``): each node is a
  ``multiprocessing`` "spawn" process. map_fun and its args reach the child
  through the process start pipe (cloudpickle when available, so closures
  work as on Spark); nothing is pickled on a network socket.
  With ``preload`` (the modules every node imports first, e.g. torch, whose
  import takes seconds), the nodes are forked instead from multiprocessing's
  "forkserver", one per driver process, which imported those modules once
  when it started: a notebook's second and later runs start nodes with them
  already imported. Each node is still a new process (a fresh fork of a
  server that ran nothing but those imports), prepared as a spawned one is
  (the driver's sys.path, working directory and ``__main__``), with the
  driver's environment of the moment. The server is single-threaded Python;
  importing torch starts no OpenMP or CUDA threads, so forking after it is
  safe (torch's own guidance: fork before the first parallel op or CUDA call).
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

from sparkgrad.cluster.node import (
    MapFun,
    NodeConfig,
    cloudpickle_module,
    dumps_result,
    run_node,
    run_node_keeping_result,
)

KILL_WAIT_SECONDS = 5.0
# Exit status of a node process that found itself started from an import of the driver's main script
# (a script without the ``if __name__ == "__main__":`` guard); failure() names the cause.
MAIN_GUARD_EXIT = 87
# Imported by the forkserver besides the preload asked for: what every node imports before map_fun.
NODE_MODULES = ("sparkgrad.cluster.node",)
# What a node that imports a preloaded module goes on to import before its first step, preloaded with it: a
# rank's first torch.optim optimizer imports torch._dynamo (and with it torch.distributed and sympy: some 830
# modules, 1.5 to 2.4 s), which a server that imported torch alone leaves to every node of every run.
PRELOAD_WITH = {"torch": ("torch._dynamo",)}


def _forkserver(preload: tuple[str, ...]) -> Any:
    """multiprocessing's forkserver context, its server importing ``preload`` (and the node's code) when it starts.

    The server is one per process (multiprocessing's): it starts on the first node started through it and
    serves every later run of this driver. One already running (started by another caller) keeps the modules
    it started with.
    """
    from multiprocessing import forkserver

    # and the cloudpickle that unpickles map_fun: pyspark's imports all of pyspark, a quarter of a second
    # that each node of a later run would pay again before it registers
    pickler = cloudpickle_module()
    unpickle = (pickler.__name__,) if pickler is not None else ()
    following = tuple(m for name in preload for m in PRELOAD_WITH.get(name, ()))
    # not "__main__": the script is not run
    forkserver.set_forkserver_preload([*preload, *following, *NODE_MODULES, *unpickle])
    return multiprocessing.get_context("forkserver")


def _adopt_environment(environ: dict[str, str] | None) -> None:
    """A forked node takes the driver's environment of now (the server has the one it started with).

    torch, imported in the server, read its thread count then: OMP_NUM_THREADS of now is applied to it.
    """
    if environ is None:
        return
    os.environ.clear()
    os.environ.update(environ)
    torch = sys.modules.get("torch")
    omp = environ.get("OMP_NUM_THREADS", "").split(",")[0]
    if torch is not None and omp.isdigit() and int(omp) > 0:
        torch.set_num_threads(int(omp))


def _let_the_server_end_with_its_driver() -> None:
    """In a node forked from the forkserver, closing its copy of the driver's end of the server's alive pipe.

    multiprocessing hands every forked process a duplicate of that end (so that it could start processes through
    the same server); the server, which ends on EOF of the pipe, would then outlive a killed driver for as long
    as any node lives, and a node stuck with the GIL held lives on. A node that starts processes through a
    forkserver of its own gets a server of its own (multiprocessing starts one: this process started none).
    """
    from multiprocessing import forkserver

    server = forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None and getattr(server, "_forkserver_pid", 0) is None:  # inherited, not a server of its own
        server._forkserver_alive_fd = None
        os.close(fd)


def _local_node_main(
    cfg: NodeConfig,
    executor_id: int,
    host: str,
    payload: bytes,
    threads: int,
    result_pipe: Any = None,
    environ: dict[str, str] | None = None,
) -> None:
    _adopt_environment(environ)
    _let_the_server_end_with_its_driver()
    map_fun, tf_args = pickle.loads(payload)
    if result_pipe is None:
        run_node(cfg, executor_id, host, map_fun, tf_args, echo=False, threads=threads)
        return
    _status, result = run_node_keeping_result(cfg, executor_id, host, map_fun, tf_args, echo=False, threads=threads)
    if result is not None:  # the value goes back through the process's own pipe, never a sparkgrad socket
        result_pipe.send_bytes(result)
    result_pipe.close()


def _main_script() -> str:
    main = sys.modules.get("__mp_main__") or sys.modules.get("__main__")  # a node imports it as __mp_main__
    return str(getattr(main, "__file__", None) or "the main script")


def _refuse_start_from_an_import_of_main() -> None:
    """In a node process that is still importing the driver's main script, ending it with MAIN_GUARD_EXIT.

    A spawned or forkserver node imports ``__main__`` again (as ``__mp_main__``) to find map_fun; a script
    that starts nodes outside ``if __name__ == "__main__":`` would start nodes from each node. The driver
    names the cause from the exit status.
    """
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return
    print(
        f"sparkgrad: {_main_script()} started nodes while a node was importing it: put the code that starts "
        'them under `if __name__ == "__main__":`',
        file=sys.stderr,
        flush=True,
    )
    os._exit(MAIN_GUARD_EXIT)  # a node still bootstrapping: raising would only print multiprocessing's own error


def _exit_reason(code: int | None) -> str:
    if code == MAIN_GUARD_EXIT:
        return (
            f"exited with code {code}: it imports {_main_script()} to find map_fun, and that script started "
            'nodes again while being imported; put the code that starts them under `if __name__ == "__main__":`'
        )
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class LocalLauncher:
    """Runs each node in its own process on this machine: spawned, or forked from a server that preloaded modules."""

    def __init__(
        self,
        cfg: NodeConfig,
        executor_ids: tuple[int, ...],
        map_fun: MapFun,
        tf_args: Any,
        host: str = "127.0.0.1",
        keep_result: bool = False,
        preload: tuple[str, ...] = (),
    ):
        """``keep_result``: each process sends map_fun's pickled value back on a pipe (see results()).
        ``preload``: modules the nodes find imported (forked from the forkserver); none: spawned processes."""
        self.executor_ids = executor_ids
        self._keep_result = keep_result
        self._pipes: dict[int, Any] = {}  # executor id -> the reading end of its result pipe
        self._results: dict[int, bytes] = {}
        self._cfg = cfg
        self._host = host
        self._payload = dumps_result((map_fun, tf_args))
        self._mp = _forkserver(tuple(preload)) if preload else multiprocessing.get_context("spawn")
        self._procs: dict[int, Any] = {}
        self._cancelled = False

    def start(self) -> None:
        _refuse_start_from_an_import_of_main()
        threads = max(1, (os.cpu_count() or 1) // max(1, len(self.executor_ids)))  # each node's share of the cores
        environ = dict(os.environ) if self._mp.get_start_method() == "forkserver" else None
        for eid in self.executor_ids:
            role = self._cfg.template.node(eid)
            writer = None
            if self._keep_result:
                self._pipes[eid], writer = self._mp.Pipe(duplex=False)
            proc = self._mp.Process(
                target=_local_node_main,
                args=(self._cfg, eid, self._host, self._payload, threads, writer, environ),
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
