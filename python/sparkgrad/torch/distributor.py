"""``sparkgrad.torch.Distributor``: PySpark's TorchDistributor on sparkgrad's launcher.

``Distributor(num_processes, local_mode, use_gpu).run(train_object, *args)``
takes TorchDistributor's constructor and ``run``: ``train_object`` is a
function (its rank 0 value comes back) or the path of a script (run as
``python script *args`` in each rank, as torchrun would start it; None comes
back). The ranks are sparkgrad ranks (`sparkgrad.run`): on Spark's executors
as one barrier stage (``local_mode=False``) or as processes of the driver
(``local_mode=True``), with sparkgrad's formation, live output, NodeFailure
and timeouts.

How a rank learns ``torch.distributed``'s rendezvous, with no port race:
every sparkgrad rank already holds a listening socket the launcher bound
before the ranks registered (its ``comm_port``), and every rank knows rank
0's. Rank 0 hands a duplicate of that socket to a ``torch.distributed.
TCPStore`` server (``master_listen_fd``) before ``train_object`` starts, so
the port torch connects to is held from the moment it was chosen by the
process that serves it. Every rank (rank 0 included) then finds, in its
environment, what ``init_process_group()``'s ``env://`` reads: MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK /
NODE_RANK, and ``TORCHELASTIC_USE_AGENT_STORE=True`` (with
``TORCHELASTIC_RESTART_COUNT=0``, as torchrun's agent sets), which makes every
rank a client of the store already served (as under torchrun's agent). The
store lives until every rank said it was done with it (a count in the store
itself), bounded by its timeout.

The store's wire is torch's own: unauthenticated, as under TorchDistributor
and torchrun. The rank's comm port serves it for the job, so ``sparkgrad.hvd``
cannot form its communicator inside a Distributor job (it says so).

GPUs (``use_gpu=True``): on Spark each task gets its own (``CUDA_VISIBLE_DEVICES``
from the task's ``gpu`` resources, set with ``spark.task.resource.gpu.amount``);
with ``local_mode=True`` every rank sees the driver's first ``num_processes``
GPUs and picks ``cuda:LOCAL_RANK``, as TorchDistributor's local mode does.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sparkgrad.cluster import collective
from sparkgrad.errors import ClusterError, InvalidArgumentError, StateError

DEFAULT_STORE_TIMEOUT = 1800.0  # seconds: torch's default process-group timeout
DONE_KEY = "sparkgrad/done"


def _visible_gpus() -> list[str]:
    """The GPUs this process may use: $CUDA_VISIBLE_DEVICES's entries, else torch's count of devices."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def _task_gpus() -> list[str] | None:
    """The ``gpu`` addresses Spark gave this task, or None outside a Spark task."""
    if "pyspark" not in sys.modules:
        return None
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        return None
    res = tc.resources().get("gpu")
    return list(res.addresses) if res is not None else []


def rank_environment(setup: collective.CommSetup, gpus: list[str] | None) -> dict[str, str]:
    """What ``init_process_group(env://)`` and torchrun-style scripts read, for the rank ``setup`` describes."""
    host, port = setup.addresses[0]
    env = {
        "MASTER_ADDR": host,
        "MASTER_PORT": str(port),
        "RANK": str(setup.rank),
        "WORLD_SIZE": str(setup.size),
        "LOCAL_RANK": str(setup.local_rank),
        "LOCAL_WORLD_SIZE": str(setup.local_size),
        "GROUP_RANK": str(setup.cross_rank),
        "NODE_RANK": str(setup.cross_rank),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",  # torchrun's agent sets it; torch 2.1 reads it beside the agent store
    }
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return env


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _store(setup: collective.CommSetup, timeout: float) -> Iterator[None]:
    """Rank 0 serves the TCPStore on its comm port while the block runs. A rank whose block ended well says
    so in the store, and rank 0 serves on until every rank did (bounded by ``timeout``); a block that
    raised leaves at once, so its error reaches the launcher, which stops the others."""
    import torch.distributed as dist

    host, port = setup.addresses[0]
    delta = datetime.timedelta(seconds=timeout)
    server = None
    if setup.rank == 0:
        fd = os.dup(setup.listener.fileno())  # the store owns (and closes) its copy
        try:
            server = dist.TCPStore(host, port, setup.size, True, delta, wait_for_workers=False, master_listen_fd=fd)
        except BaseException:
            os.close(fd)
            raise
    yield
    client = server if server is not None else dist.TCPStore(host, port, setup.size, False, delta)
    client.set(f"{DONE_KEY}/{setup.rank}", "1")
    if server is not None:
        try:
            server.wait([f"{DONE_KEY}/{r}" for r in range(setup.size)], delta)
        except Exception as exc:  # noqa: BLE001 - torch raises its own DistStoreError / RuntimeError
            raise ClusterError(
                f"torch.distributed's store: not every one of {setup.size} ranks finished within {timeout:.0f} s "
                f"after rank 0 did ({exc})"
            ) from exc


@contextlib.contextmanager
def _group_released() -> Iterator[None]:
    """Around a rank's function: the process groups it destroys live on until it has returned, and the default
    group it left initialized is destroyed.

    Keeping the groups: the common ending ``dist.destroy_process_group(); return loss`` leaves a
    DistributedDataParallel model in the function's frame, and its reducer then holds the last reference to
    the gloo group. Freeing the frame frees the reducer with the GIL held, and the group's destructor joins its
    worker threads; a worker still finishing a collective started inside backward must take the GIL to drop
    the Python context PyTorch (2.13) keeps in that collective's thread-local state: a deadlock, seen in one of
    seven runs of the guide's example. Here ``destroy_process_group`` (while the function runs) keeps the
    groups it removes, and they are dropped after the function's frame is gone, through PyTorch's Python
    handle, whose destructor releases the GIL. A script (``train_object`` a path) runs in a process of its own
    and is left as it is.

    Destroying what is left: a Spark task's Python worker is reused by the next run
    (``spark.python.worker.reuse``), where ``init_process_group`` would find it formed. After a failure the
    launcher ends the ranks instead."""
    dist = sys.modules.get("torch.distributed")
    c10d = getattr(dist, "distributed_c10d", None)
    world = getattr(c10d, "_world", None)
    original = getattr(c10d, "destroy_process_group", None)
    # no torch.distributed, or one without these internals: nothing to keep
    if world is None or original is None or not hasattr(world, "pg_map"):
        yield
    else:
        kept: list[Any] = []

        @functools.wraps(original)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            kept.extend(world.pg_map)  # every group: destroying the default one destroys them all
            return original(*args, **kwargs)

        dist.destroy_process_group = c10d.destroy_process_group = destroy_process_group
        try:
            yield
        finally:
            dist.destroy_process_group = c10d.destroy_process_group = original
            kept.clear()
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _forward(stream: Any, sink: Any) -> None:
    for line in iter(stream.readline, ""):
        sink.write(line)
        sink.flush()


def _run_script(path: str, args: tuple, env: dict[str, str], rank: int) -> None:
    """``python path *args`` under ``env``, its output forwarded line by line to this rank's stdout/stderr."""
    proc = subprocess.Popen(
        [sys.executable, path, *map(str, args)],
        env=dict(os.environ, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    pumps = [
        threading.Thread(target=_forward, args=(proc.stdout, sys.stdout), daemon=True),
        threading.Thread(target=_forward, args=(proc.stderr, sys.stderr), daemon=True),
    ]
    for t in pumps:
        t.start()
    try:
        code = proc.wait()
    except BaseException:  # stopped (another rank failed): end the script too
        proc.kill()
        proc.wait()
        raise
    finally:
        for t in pumps:
            t.join()
    if code != 0:
        raise ClusterError(f"rank {rank}: {path} exited with status {code}")


@dataclass(frozen=True)
class _TorchRank:
    """Each rank's fn under sparkgrad.run: the environment and the store, then the function or the script."""

    train_object: Callable[..., Any] | str
    args: tuple
    kwargs: dict
    use_gpu: bool
    local_mode: bool
    num_processes: int
    store_timeout: float

    def gpus(self, setup: collective.CommSetup | None) -> list[str] | None:
        if not self.use_gpu:
            return None
        if self.local_mode:
            visible = _visible_gpus()
            if len(visible) < self.num_processes:
                raise ClusterError(
                    f"Distributor(use_gpu=True, local_mode=True): {self.num_processes} processes need as many "
                    f"GPUs on the driver, it has {len(visible)}"
                    + (f" (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']})" if visible else "")
                    + "; pass use_gpu=False to train on CPU"
                )
            return visible[: self.num_processes]
        task = _task_gpus()
        if not task:
            who = f"rank {setup.rank}'s" if setup is not None else "this"
            raise ClusterError(
                f"Distributor(use_gpu=True): {who} Spark task has no 'gpu' resources; set "
                "spark.task.resource.gpu.amount (and the executors' GPU resources) or pass use_gpu=False"
            )
        return task

    def __call__(self) -> Any:
        handle = collective.current()
        if handle is None:
            raise StateError("sparkgrad.torch.Distributor: this process was not started by sparkgrad's launcher")
        setup = handle.setup
        env = rank_environment(setup, self.gpus(setup))
        with handle.lent("torch.distributed's store of a sparkgrad.torch.Distributor job"):
            with _store(setup, self.store_timeout):
                if isinstance(self.train_object, str):
                    _run_script(self.train_object, self.args, env, setup.rank)
                    return None
                with _environ(env), _group_released():
                    return self.train_object(*self.args, **self.kwargs)


class Distributor:
    """PySpark's ``TorchDistributor`` on sparkgrad: ``Distributor(num_processes=2).run(train, *args)``.

    Runs a ``torch.distributed`` job: each rank finds MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
    LOCAL_RANK and LOCAL_WORLD_SIZE in its environment, so ``torch.distributed.init_process_group("gloo")``
    (``"nccl"`` on GPUs) needs no arguments, as under TorchDistributor and torchrun. The port those name is
    held from the start by the process that serves torch's store on it: no port race.

    ```python
    def train(lr):
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        ...
        return final_loss

    loss = Distributor(num_processes=2, local_mode=True, use_gpu=False).run(train, 0.01)
    ```

    Args:
        num_processes: Number of ranks (one per Spark task when ``local_mode`` is False).
        local_mode: True: the ranks are processes of this machine (the driver); False: a barrier stage
            of ``num_processes`` tasks on the active Spark session (classic or Connect).
        use_gpu: Give each rank its GPUs (see the module's text); False trains on CPU.
        spark: The Spark session for ``local_mode=False`` (default the active one).
        store_timeout: Seconds torch's store waits for a rank (and rank 0 waits for every rank to finish
            with it); default 1800, torch's default process-group timeout.
        security: As for `sparkgrad.run` (sparkgrad's own connections; torch's store is torch's).

    Raises:
        InvalidArgumentError: ``num_processes`` is not a positive int.
    """

    def __init__(
        self,
        num_processes: int = 1,
        local_mode: bool = True,
        use_gpu: bool = True,
        *,
        spark: Any = None,
        store_timeout: float = DEFAULT_STORE_TIMEOUT,
        security: str | None = None,
    ) -> None:
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
            raise InvalidArgumentError(f"num_processes must be a positive int, got {num_processes!r}")
        if not store_timeout > 0:
            raise InvalidArgumentError(f"store_timeout must be > 0 seconds, got {store_timeout!r}")
        self.num_processes = num_processes
        self.local_mode = bool(local_mode)
        self.use_gpu = bool(use_gpu)
        self._spark = spark
        self._store_timeout = float(store_timeout)
        self._security = security

    def run(self, train_object: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Any:
        """Runs ``train_object`` on every rank: a function (``train_object(*args, **kwargs)``; rank 0's
        value is returned) or a script path (``python train_object *args`` with torchrun's environment;
        returns None).

        Raises:
            NodeFailure: A rank raised, its script exited with a non-zero status, or a rank was lost.
            InvalidArgumentError: ``train_object`` is neither callable nor a path to an existing file, or
                keyword arguments were given with a script.
            ClusterError: ``local_mode=False`` with no Spark session.
        """
        from sparkgrad.runner import active_spark, run

        if isinstance(train_object, (str, os.PathLike)):
            train_object = os.fspath(train_object)
            if not os.path.isfile(train_object):
                raise InvalidArgumentError(f"Distributor.run: no script at {train_object!r}")
            if kwargs:
                raise InvalidArgumentError("Distributor.run: a script takes positional arguments only")
        elif not callable(train_object):
            raise InvalidArgumentError(
                f"Distributor.run: train_object must be a function or a script path, not {type(train_object).__name__}"
            )
        spark = None
        if self.local_mode and self.use_gpu:  # the driver's GPUs: checked before any rank starts
            _TorchRank(train_object, (), {}, True, True, self.num_processes, self._store_timeout).gpus(None)
        if not self.local_mode:
            spark = self._spark if self._spark is not None else active_spark()
            if spark is None:
                raise ClusterError(
                    "Distributor(local_mode=False) runs its ranks as Spark tasks and no Spark session is active; "
                    "start one, pass spark=, or use local_mode=True"
                )
        rank = _TorchRank(
            train_object, tuple(args), dict(kwargs), self.use_gpu, self.local_mode, self.num_processes,
            self._store_timeout,
        )  # fmt: skip
        values = run(
            rank, num_proc=self.num_processes, spark=spark, local=self.local_mode, security=self._security,
            preload=("torch",),
        )  # fmt: skip
        return values[0]


__all__ = ["Distributor", "rank_environment"]
