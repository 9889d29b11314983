"""Training with parameter servers through the cluster layer (local processes and Spark)."""

from __future__ import annotations

import cluster_nodes
import numpy as np
import pytest
import sparkgrad
from cluster_checks import check_training_from_a_dataframe, quiet
from sparkgrad import TFCluster

pytestmark = pytest.mark.timeout(120)


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
    cluster = sparkgrad.local.run(cluster_nodes.train_softmax, args, 4, 2, output=quiet)
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
    cluster = sparkgrad.local.run(cluster_nodes.train_softmax, args, 3, 1, output=quiet)
    cluster.shutdown(timeout=90)
    steps = sorted(cluster.results[1]["steps"] + cluster.results[2]["steps"])
    assert steps == list(range(1, 61))  # every push is applied on its own
    assert min(cluster.results[i]["accuracy"] for i in (1, 2)) > 0.9


def test_adam_on_two_ps_keeps_its_state_on_each_shard(tmp_path):
    args = {"mode": "sync", "steps": 40, "optimizer": {"kind": "adam", "lr": 0.05}}
    cluster = sparkgrad.local.run(cluster_nodes.train_softmax, args, 4, 2, output=quiet)
    cluster.shutdown(timeout=90)
    for i in (2, 3):
        assert cluster.results[i]["optimizer_state_shards"] == [True, True]
        assert cluster.results[i]["accuracy"] > 0.9


def test_fit_of_an_embedding_model_moves_rows_and_ends_with_the_servers_parameters():
    """1 ps + 2 workers (processes) fit a model with an Embedding table in sync mode, once with the table's
    rows on the wire and once with the table whole: the same final model on both workers (the servers'
    parameters after every step) and in both runs, the same validation losses, fewer bytes with rows."""
    runs = {}
    for sparse in (True, False):
        cluster = sparkgrad.local.run(cluster_nodes.fit_embedding, {"sparse": sparse}, 3, 1, output=quiet)
        cluster.shutdown(timeout=90)
        assert cluster.results[0] == "done"
        runs[sparse] = [cluster.results[i] for i in (1, 2)]
    for sparse, workers in runs.items():
        assert sorted(w["chief"] for w in workers) == [False, True]
        assert all(w["sparse_rows"] == sparse and w["step"] == 16 for w in workers)
        np.testing.assert_array_equal(workers[0]["params"], workers[1]["params"])
    rows, dense = runs[True][0], runs[False][0]
    np.testing.assert_allclose(rows["params"], dense["params"], rtol=1e-6, atol=1e-7)
    for r, d in zip(runs[True], runs[False], strict=True):
        np.testing.assert_allclose(r["val_loss"], d["val_loss"], rtol=1e-5)
        assert r["bytes"] < d["bytes"] / 2


@pytest.mark.spark
@pytest.mark.parametrize("driver_ps_nodes", [False, True], ids=["ps_task", "ps_in_driver"])
def test_sync_training_on_spark(spark_context, driver_ps_nodes):
    import pathlib

    spark_context.addPyFile(str(pathlib.Path(__file__).resolve().parent / "cluster_nodes.py"))
    args = {"mode": "sync", "steps": 30}
    cluster = TFCluster.run(
        spark_context, cluster_nodes.train_softmax, args, 3, 1, driver_ps_nodes=driver_ps_nodes, output=quiet
    )
    cluster.shutdown(timeout=90)
    assert cluster.results[0] == "done"
    assert all(cluster.results[i]["steps"] == list(range(1, 31)) for i in (1, 2))
    assert min(cluster.results[i]["accuracy"] for i in (1, 2)) > 0.9


@pytest.mark.spark
def test_spark_input_mode_feeds_every_row_of_every_epoch_and_trains(spark_context):
    import pathlib

    from sparkgrad import InputMode

    spark_context.addPyFile(str(pathlib.Path(__file__).resolve().parent / "cluster_nodes.py"))
    x, y = cluster_nodes._blobs(np.random.default_rng(3), 1000)
    rows = [(x[i].tolist(), int(y[i])) for i in range(len(y))]
    rdd = spark_context.parallelize(rows, 5)  # 3 epochs x 5 partitions over 2 workers: 8 and 7, uneven on purpose
    # Encrypted: rendezvous, control, ps and feed connections on Spark (the other tests run the default, auth).
    cluster = TFCluster.run(
        spark_context,
        cluster_nodes.train_from_feed,
        {},
        3,
        1,
        input_mode=InputMode.SPARK,
        output=quiet,
        security="encrypt",
    )
    cluster.train(rdd, num_epochs=3, feed_timeout=60)
    cluster.shutdown(timeout=90)
    workers = [cluster.results[i] for i in (1, 2)]
    assert cluster.rows_fed == 3000
    assert sorted(w["rows"] for w in workers) == [1400, 1600]
    assert [w["security"] for w in workers] == ["encrypt", "encrypt"]
    assert sum(w["label_sum"] for w in workers) == 3 * int(y.sum())
    assert min(w["accuracy"] for w in workers) > 0.9


@pytest.mark.spark
def test_spark_inference_returns_results_in_input_order(spark_context):
    import pathlib

    from sparkgrad import InputMode

    spark_context.addPyFile(str(pathlib.Path(__file__).resolve().parent / "cluster_nodes.py"))
    rows = [(i, [float(i), 1.0]) for i in range(500)]
    cluster = TFCluster.run(
        spark_context, cluster_nodes.infer_from_feed, {}, 3, 1, input_mode=InputMode.SPARK, output=quiet
    )
    results = cluster.inference(spark_context.parallelize(rows, 4), feed_timeout=60).collect()
    cluster.shutdown(timeout=90)
    assert results == [3 * i + 1 for i in range(500)]
    assert cluster.results[1]["rows"] + cluster.results[2]["rows"] == 500


@pytest.mark.spark
def test_spark_input_mode_feeds_a_dataframe_through_arrow_on_classic_spark(spark, spark_context):
    """cluster.train(df): the DataFrame's Arrow batches reach the workers as the RDD's rows would."""
    import pathlib

    spark_context.addPyFile(str(pathlib.Path(__file__).resolve().parent / "cluster_nodes.py"))
    check_training_from_a_dataframe(spark)


@pytest.mark.spark
def test_spark_inference_over_a_dataframe_returns_a_dataframe_of_results(spark, spark_context):
    import pathlib

    from sparkgrad import InputMode

    spark_context.addPyFile(str(pathlib.Path(__file__).resolve().parent / "cluster_nodes.py"))
    df = spark.createDataFrame([(i, [float(i), 1.0]) for i in range(500)], "id long, x array<double>").coalesce(4)
    args = {"columns": ("id", "x")}
    cluster = TFCluster.run(spark, cluster_nodes.infer_from_feed, args, 3, 1, input_mode=InputMode.SPARK, output=quiet)
    results = cluster.inference(df, feed_timeout=60, schema="y long")
    assert results.schema.simpleString() == "struct<y:bigint>"
    values = [row.y for row in results.collect()]
    cluster.shutdown(timeout=90)
    assert values == [3 * i + 1 for i in range(500)]
    assert cluster.results[1]["rows"] + cluster.results[2]["rows"] == 500
