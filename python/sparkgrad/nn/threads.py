"""The C core's thread count, as part of sparkgrad.nn (defined in sparkgrad._threads).

The functions live outside the nn package so that a cluster node can set its
thread count before anything imports the network code.
"""

from sparkgrad._threads import configure_threads, get_num_threads, set_num_threads, spark_task_cpus

__all__ = ["configure_threads", "get_num_threads", "set_num_threads", "spark_task_cpus"]
