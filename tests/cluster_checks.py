"""Driver-side helpers shared by the cluster tests on classic Spark and on Spark Connect.

What runs on the nodes lives in cluster_nodes.py (shipped to the executors);
this module stays on the driver.
"""

from __future__ import annotations

import json
import os
import socket
import time

import cluster_nodes
import numpy as np
from sparkgrad import InputMode, TFCluster


def quiet(line: str) -> None:
    pass


class Lines:
    """Collects the driver's printed node lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)


def alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (a zombie counts until reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def port_closed(port: int, within: float = 0.0) -> bool:
    """True once nothing accepts on the port, checked until `within` seconds have passed."""
    deadline = time.monotonic() + within
    while True:
        with socket.socket() as s:
            s.settimeout(1.0)
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def check_training_from_a_dataframe(session) -> None:
    """cluster.train(df), 3 epochs of 1,000 blob rows in 5 partitions: every row reaches one worker, which learns."""
    x, y = cluster_nodes._blobs(np.random.default_rng(3), 1000)
    df = session.createDataFrame(
        [(x[i].tolist(), int(y[i])) for i in range(len(y))], "features array<float>, label long"
    ).repartition(5)
    args = {"columns": ("features", "label")}
    cluster = TFCluster.run(
        session, cluster_nodes.train_from_feed, args, 3, 1, input_mode=InputMode.SPARK, output=quiet
    )
    cluster.train(df, num_epochs=3, feed_timeout=60)
    cluster.shutdown(timeout=90)
    workers = [cluster.results[i] for i in (1, 2)]
    assert cluster.rows_fed == 3000
    assert sum(w["rows"] for w in workers) == 3000 and min(w["rows"] for w in workers) > 0
    assert sum(w["label_sum"] for w in workers) == 3 * int(y.sum())
    assert min(w["accuracy"] for w in workers) > 0.9


def check_driver_interrupt_ends_every_node(session, tmp_path) -> None:
    """A notebook's interrupt during shutdown(): KeyboardInterrupt, the Spark job ended, every node's port released.

    Spark reports the job cancelled before the executor's Python worker has
    finished exiting: the node's port must be released within seconds.
    """
    import _thread
    import threading

    import pytest

    args = {"dir": str(tmp_path), "target": "none"}
    cluster = TFCluster.run(
        session,
        cluster_nodes.busy_until_interrupted,
        args,
        2,
        0,
        output=Lines(),
        reservation_timeout=60,
        stop_grace=1.0,
    )
    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        cluster.shutdown(timeout=60)
    timer.join()
    assert all(launcher.finished() for launcher in cluster._launchers)
    assert time.monotonic() - started < 40
    for marker in tmp_path.glob("started-*.json"):
        assert port_closed(json.loads(marker.read_text())["port"], within=10.0)
