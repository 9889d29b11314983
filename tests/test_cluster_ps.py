"""Training with parameter servers through the cluster layer (local processes and Spark)."""

from __future__ import annotations

import cluster_nodes
import numpy as np
import pytest
import sparkgrad
from sparkgrad import TFCluster

pytestmark = pytest.mark.timeout(120)


def _quiet(line: str) -> None:
    pass


def test_softmax_model_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    params = rng.normal(0, 0.1, cluster_nodes.NUM_PARAMS).astype(np.float64)
    x, y = cluster_nodes._blobs(rng, 16)
    _, grads = cluster_nodes.softmax_loss_grads(params, x.astype(np.float64), y)
    for i in (0, 7, cluster_nodes.NUM_PARAMS - 1):
        e = np.zeros_like(params)
        e[i] = 1e-5
        up, _ = cluster_nodes.softmax_loss_grads(params + e, x.astype(np.float64), y)
        down, _ = cluster_nodes.softmax_loss_grads(params - e, x.astype(np.float64), y)
        assert abs((up - down) / 2e-5 - grads[i]) < 1e-3


def test_sync_training_with_two_ps_steps_once_per_round_and_learns(tmp_path):
    args = {"mode": "sync", "steps": 40}
    cluster = sparkgrad.local.run(cluster_nodes.train_softmax, args, 4, 2, output=_quiet)
    cluster.shutdown(timeout=90)
    workers = [cluster.results[i] for i in (2, 3)]
    assert sorted(w["worker_id"] for w in workers) == [0, 1]
    for w in workers:
        # synchronous: both workers see the same global step sequence 1..steps
        assert w["steps"] == list(range(1, 41))
        assert w["accuracy"] > 0.9
    assert cluster.results[0] == cluster.results[1] == "done"  # both ps exit once the workers are done
    assert any(m.name == "loss" for m in cluster.metrics)


def test_async_training_advances_one_step_per_push(tmp_path):
    args = {"mode": "async", "steps": 30}
    cluster = sparkgrad.local.run(cluster_nodes.train_softmax, args, 3, 1, output=_quiet)
    cluster.shutdown(timeout=90)
    steps = sorted(cluster.results[1]["steps"] + cluster.results[2]["steps"])
    assert steps == list(range(1, 61))  # every push is applied on its own
    assert min(cluster.results[i]["accuracy"] for i in (1, 2)) > 0.9


@pytest.mark.spark
def test_sync_training_on_spark(spark_context):
    import pathlib

    spark_context.addPyFile(str(pathlib.Path(__file__).resolve().parent / "cluster_nodes.py"))
    args = {"mode": "sync", "steps": 30}
    cluster = TFCluster.run(spark_context, cluster_nodes.train_softmax, args, 3, 1, output=_quiet)
    cluster.shutdown(timeout=90)
    assert cluster.results[0] == "done"
    assert all(cluster.results[i]["steps"] == list(range(1, 31)) for i in (1, 2))
    assert min(cluster.results[i]["accuracy"] for i in (1, 2)) > 0.9
