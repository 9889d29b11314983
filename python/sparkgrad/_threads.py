"""Thread count of the C core (oneDNN and the C loops run on OpenMP).

OpenMP itself honours OMP_NUM_THREADS. On a Spark executor the task's share
is ``spark.task.cpus`` (TaskContext.cpus()); ``configure_threads()`` applies it
when OMP_NUM_THREADS is not set. ``set_num_threads`` applies to the calling
thread's later C calls (fit runs in the calling thread).
"""

from __future__ import annotations

import os

from sparkgrad import _core


def set_num_threads(n: int) -> None:
    """Uses ``n`` OpenMP threads for the oneDNN kernels and the C loops of the calling thread's later C calls.

    fit, evaluate and predict run in the calling thread, so this sets their thread count.

    Args:
        n: Number of threads, > 0.

    Raises:
        InvalidArgumentError: ``n`` is not positive.
    """
    _core.set_num_threads(int(n))


def get_num_threads() -> int:
    """The number of OpenMP threads the calling thread's C calls use.

    ``OMP_NUM_THREADS`` or OpenMP's default, until `set_num_threads` or `configure_threads` changes it.
    """
    return int(_core.get_num_threads())


def spark_task_cpus() -> int | None:
    """``spark.task.cpus`` of the running Spark task, or None outside a task."""
    try:
        from pyspark import TaskContext
    except ImportError:
        return None
    ctx = TaskContext.get()
    if ctx is None:
        return None
    cpus = getattr(ctx, "cpus", None)
    if callable(cpus):
        return int(cpus())
    value = ctx.getLocalProperty("spark.task.cpus")
    return int(value) if value else None


def configure_threads(default: int | None = None) -> int:
    """Sets the thread count from the environment and returns it.

    The count is the first number of ``OMP_NUM_THREADS`` if set, else ``spark.task.cpus`` inside a Spark
    task, else ``default`` (the local launcher passes each node its share of the cores), else OpenMP's
    default (left unchanged). fit calls it on a Spark executor.

    Args:
        default: The count to use outside a Spark task when ``OMP_NUM_THREADS`` is not set.

    Returns:
        The thread count now in use (`get_num_threads`).
    """
    env = os.environ.get("OMP_NUM_THREADS")
    if env:
        n = int(env.split(",")[0])
    else:
        n = spark_task_cpus() or default or 0
    if n > 0:
        set_num_threads(n)
    return get_num_threads()


def configure_task_threads() -> None:
    """Inside a Spark task, `configure_threads` (the task's ``spark.task.cpus``, or ``OMP_NUM_THREADS``);
    elsewhere nothing.

    Spark runs as many tasks at once as an executor has cores over ``spark.task.cpus``: each task that
    runs the C core in OpenMP's default (every core) oversubscribes the executor, and its threads wait on
    each other (a scoring task of a small MLP on 2 cores ran 3 to 4 times slower than with its share).
    """
    if spark_task_cpus() is not None:
        configure_threads()
