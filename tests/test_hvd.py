"""sparkgrad.hvd: the object codec, the topology, init's errors, and the collectives on 2-3 real ranks."""

from __future__ import annotations

import io

import numpy as np
import pytest
import runner_fns
import sparkgrad
import sparkgrad.hvd as hvd
from sparkgrad import _core
from sparkgrad.cluster import collective
from sparkgrad.cluster import rank as _rank
from sparkgrad.errors import StateError
from sparkgrad.hvd import codec

pytestmark = pytest.mark.timeout(120)

needs_comm = pytest.mark.skipif(
    not hasattr(_core, "Communicator"), reason="this _core has no Communicator yet (the collectives' branch)"
)


# -- the codec ---------------------------------------------------------------------------------------


def test_codec_round_trips_every_supported_type_exactly():
    value = {
        "none": None,
        "flags": [True, False],
        "ints": (0, -1, 2**70, -(2**65)),
        "float": [1.5, float("inf"), -0.0],
        "text": "épée \U0001f600",
        b"raw": b"\x00\xff" * 3,
        3: {"nested": [[], (), {}]},
        "arrays": [np.arange(6, dtype=np.int16).reshape(2, 3), np.zeros((0, 4), np.float32), np.float64(2.5)],
        "big-endian": np.array([1, 2], dtype=">u4"),
    }
    back = codec.decode(codec.encode(value))
    assert back.keys() == value.keys()
    assert back["ints"] == value["ints"] and isinstance(back["ints"], tuple)
    assert back["text"] == value["text"] and back[b"raw"] == value[b"raw"] and back[3] == value[3]
    assert back["none"] is None and back["flags"] == [True, False] and type(back["flags"][0]) is bool
    assert str(back["float"][2]) == "-0.0" and back["float"][:2] == [1.5, float("inf")]
    for got, want in zip(back["arrays"], value["arrays"], strict=True):
        assert got.dtype == want.dtype and got.shape == np.shape(want)
        np.testing.assert_array_equal(got, want)
    assert isinstance(back["arrays"][2], np.float64)
    assert back["big-endian"].dtype == np.dtype(">u4") and back["big-endian"].tolist() == [1, 2]


def test_codec_refuses_other_types_naming_them_and_where():
    class Thing:
        pass

    with pytest.raises(TypeError, match=r"obj\['k'\]\[1\]: cannot send a .*Thing"):
        codec.encode({"k": [1, Thing()]})
    with pytest.raises(TypeError, match="set"):
        codec.encode({1, 2})
    with pytest.raises(TypeError, match="dtype object"):
        codec.encode(np.array([None, 1]))


def test_codec_rejects_truncated_or_malformed_bytes_with_the_offset():
    data = codec.encode({"a": np.arange(10)})
    with pytest.raises(ValueError, match="truncated"):
        codec.decode(data[:-5])
    with pytest.raises(ValueError, match="after its end"):
        codec.decode(data + b"N")
    with pytest.raises(ValueError, match="unknown tag b'Z' at offset 0"):
        codec.decode(b"Z")
    with pytest.raises(ValueError, match="exceeds the data"):
        codec.decode(b"l" + (2**60).to_bytes(8, "little"))


# -- topology and state ----------------------------------------------------------------------------------


def test_topology_of_ranks_on_hosts_as_horovod_defines_it():
    hosts = ["a", "a", "b", "a", "b", "c"]
    got = [collective.topology(hosts, r) for r in range(len(hosts))]
    # (local_rank, local_size, cross_rank, cross_size)
    assert got == [(0, 3, 0, 3), (1, 3, 0, 2), (0, 2, 1, 3), (2, 3, 0, 1), (1, 2, 1, 2), (0, 1, 2, 3)]


def test_before_init_the_functions_say_to_call_init():
    hvd.shutdown()  # whatever an earlier test of this process left
    assert not hvd.is_initialized()
    with pytest.raises(StateError, match=r"call hvd.init\(\) first"):
        hvd.rank()
    with pytest.raises(StateError, match=r"call hvd.init\(\) first"):
        hvd.communicator()


def test_init_on_a_node_of_a_cluster_with_a_ps_says_why_there_is_no_communicator():
    with _rank.assigned(_rank.ProcessRank(0, 2, "worker")):
        with pytest.raises(StateError, match=r"num_ps=0"):
            hvd.init()


def test_distributed_optimizer_and_callbacks_are_reachable_from_hvd():
    from sparkgrad.hvd import callbacks

    assert hvd.callbacks is callbacks
    assert hvd.Compression.fp16.name == "fp16" and hvd.Compression.none.name == "none"
    try:
        from sparkgrad.nn.distributed import DistributedOptimizer
    except ImportError:
        with pytest.raises(AttributeError, match="sparkgrad.nn.distributed"):
            hvd.DistributedOptimizer  # noqa: B018
    else:
        assert hvd.DistributedOptimizer is DistributedOptimizer


def test_distributed_optimizer_is_one_class_at_top_level_in_hvd_and_in_nn():
    from sparkgrad.nn.distributed import DistributedOptimizer

    assert sparkgrad.DistributedOptimizer is hvd.DistributedOptimizer is DistributedOptimizer
    assert "DistributedOptimizer" in sparkgrad.__all__


def test_distributed_optimizer_serves_every_optimizer_method_from_the_wrapped_one():
    from sparkgrad import nn

    inner = nn.optimizers.Adam(0.5)
    opt = hvd.DistributedOptimizer(inner)
    names = [n for n in dir(nn.optimizers.Optimizer) if not n.startswith("__")]
    for name in names:  # every attribute of the base class is reachable (none raises)
        getattr(opt, name)
    params = np.ones(4, np.float32)
    opt.apply(params, np.ones(4, np.float32))
    assert opt.iterations == inner.iterations == 1 and opt.kind == "adam"
    opt.set_learning_rate(0.125)
    assert opt.learning_rate == inner.learning_rate == 0.125 and inner.config["lr"] == 0.125
    before = params.copy()
    opt.apply(params, np.ones(4, np.float32))
    np.testing.assert_allclose(before - params, 0.125, rtol=1e-4)  # Adam's step is about lr for a constant grad
    steps, state = opt.get_state()
    fresh = hvd.DistributedOptimizer(nn.optimizers.Adam(0.5))
    fresh.bind(4)
    fresh.set_state(steps, state)
    assert fresh.iterations == 2
    with pytest.raises(AttributeError, match="no_such_thing"):
        opt.no_such_thing  # noqa: B018


def test_optimizer_learning_rate_can_be_set_between_steps():
    from sparkgrad import nn

    opt = nn.optimizers.SGD(0.5)
    params = np.ones(4, np.float32)
    opt.apply(params, np.ones(4, np.float32))
    np.testing.assert_allclose(params, 0.5)
    opt.set_learning_rate(0.25)
    opt.apply(params, np.ones(4, np.float32))
    np.testing.assert_allclose(params, 0.25)
    assert opt.learning_rate == 0.25 and opt.config["lr"] == 0.25


# -- collectives on real ranks ----------------------------------------------------------------------------


@needs_comm
@pytest.mark.parametrize("n", [2, 3])
def test_collectives_on_local_ranks_equal_numpy(n):
    got = sparkgrad.run(runner_fns.collectives, args=(7,), num_proc=n, stdout=io.StringIO(), local=True)
    xs = np.stack([g["x"] for g in got])
    ints = np.stack([g["ints"] for g in got])
    for g in got:
        np.testing.assert_allclose(g["sum"], xs.sum(0), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(g["avg"], xs.mean(0), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(g["min"], xs.min(0))
        np.testing.assert_array_equal(g["max"], xs.max(0))
        np.testing.assert_array_equal(g["isum"], ints.sum(0))
        assert g["isum"].dtype == np.int64
        np.testing.assert_allclose(g["fp16"], xs.sum(0), rtol=1e-2, atol=1e-2)
        want_gather = np.concatenate([np.full((r + 1, 2), r, np.float32) for r in range(n)])
        np.testing.assert_array_equal(g["gather"], want_gather)
        np.testing.assert_array_equal(g["bcast"], xs[n - 1])
        assert g["obj"]["from"] == 0 and g["obj"]["t"] == (1, 2.5, None, True) and g["obj"]["b"] == b"\x00\xff"
        np.testing.assert_array_equal(g["obj"]["a"], np.zeros(4))
        assert g["objs"] == [["rank", r, {"k": r * 1.5}] for r in range(n)]
        assert 0 <= g["last"] < n
    assert len({g["last"] for g in got}) == 1


@needs_comm
def test_local_ranks_use_shared_memory_unless_their_environment_turns_it_off():
    on = sparkgrad.run(runner_fns.ring_transport, num_proc=2, stdout=io.StringIO(), local=True)
    off = sparkgrad.run(
        runner_fns.ring_transport, num_proc=2, stdout=io.StringIO(), local=True, env={"SPARKGRAD_SHARED_MEMORY": "0"}
    )
    assert on == [{"shared_memory": True, "sum": 3.0}] * 2, on
    assert off == [{"shared_memory": False, "sum": 3.0}] * 2, off


@needs_comm
def test_broadcast_parameters_and_optimizer_state_make_the_models_equal():
    got = sparkgrad.run(runner_fns.models_after_broadcast, args=(11,), num_proc=2, stdout=io.StringIO(), local=True)
    assert not np.array_equal(got[0]["before"], got[1]["before"])  # different seeds, different models
    np.testing.assert_array_equal(got[1]["after"], got[0]["before"])
    np.testing.assert_array_equal(got[0]["after"], got[0]["before"])
    assert got[0]["steps"] == got[1]["steps"] == 1
    np.testing.assert_array_equal(got[1]["state"], got[0]["state"])


@needs_comm
def test_tfcluster_without_ps_nodes_form_a_communicator_and_allreduce():
    from sparkgrad import TFCluster

    cluster = TFCluster.run(None, runner_fns.tf_allreduce, None, 2, 0, output=lambda line: None)
    cluster.shutdown(timeout=60)
    assert [cluster.results[i]["rank"] for i in range(2)] == [0, 1]
    assert all(cluster.results[i]["sum"] == [3.0] * 5 and cluster.results[i]["size"] == 2 for i in range(2))


@needs_comm
def test_a_single_process_forms_a_communicator_of_one():
    hvd.init()
    try:
        assert (hvd.rank(), hvd.size(), hvd.local_size()) == (0, 1, 1)
        x = np.arange(5, dtype=np.float32)
        np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum), x)
        assert hvd.broadcast_object({"a": 1}) == {"a": 1} and hvd.allgather_object(3) == [3]
        hvd.shutdown()
        hvd.init()  # again after a shutdown, on the same listener
        np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Max), x)
    finally:
        hvd.shutdown()
    assert not hvd.is_initialized()


def test_callbacks_broadcast_average_metrics_and_warm_up_the_learning_rate():
    # the model's optimizer is a DistributedOptimizer: the warmup sets the wrapped optimizer's rate through it
    got = sparkgrad.run(runner_fns.callbacks_flow, args=(2,), num_proc=2, stdout=io.StringIO(), local=True)
    np.testing.assert_array_equal(got[0]["params"], got[1]["params"])
    for g in got:
        assert g["logs"] == [{"loss": 0.5, "val_loss": 5.0, "note": "text"}] * 3
        # initial_lr 0.8 over 2 ranks: from 0.4 at epoch 0 to 0.8 at epoch 2, by fractional epoch
        np.testing.assert_allclose(g["lrs"], [0.4, 0.5, 0.6, 0.7, 0.8, 0.8], rtol=1e-6)


@needs_comm
@pytest.mark.parametrize("on", ["local", pytest.param("spark", marks=pytest.mark.spark)])
def test_tfcluster_without_ps_trains_with_fit_and_a_distributed_optimizer(on, request):
    import pathlib

    from sparkgrad import TFCluster

    sc = None
    if on == "spark":  # TensorFlowOnSpark's way: TFCluster.run(sc, map_fun, ..., num_ps=0) on real local Spark
        sc = request.getfixturevalue("spark_context")
        sc.addPyFile(str(pathlib.Path(__file__).resolve().parent / "runner_fns.py"))
    cluster = TFCluster.run(sc, runner_fns.tf_fit, None, 2, 0, output=lambda line: None)
    cluster.shutdown(timeout=90)
    a, b = cluster.results[0], cluster.results[1]
    assert (a["rank"], b["rank"]) == (0, 1)
    np.testing.assert_array_equal(a["params"], b["params"])  # one model: broadcast, then the same reduced steps
    assert a["own_loss"][-1] < a["own_loss"][0] and b["own_loss"][-1] < b["own_loss"][0]
    assert a["own_loss"] != b["own_loss"]  # each rank's own shard
    # the callbacks after MetricAverageCallback, and History, see the loss averaged over the ranks
    assert a["averaged_loss"] == b["averaged_loss"] == a["history_loss"] == b["history_loss"]
    np.testing.assert_allclose(a["averaged_loss"], (np.array(a["own_loss"]) + b["own_loss"]) / 2, rtol=1e-12)


@needs_comm
def test_history_and_checkpoints_see_averaged_metrics_and_only_rank_0_writes(tmp_path):
    from sparkgrad.nn.checkpoint import decode

    got = sparkgrad.run(
        runner_fns.fit_logs_and_checkpoints, args=(str(tmp_path),), num_proc=2, stdout=io.StringIO(), local=True
    )
    a, b = got
    assert (a["rank"], a["is_chief"], b["rank"], b["is_chief"]) == (0, True, 1, False)
    assert a["own"] != b["own"]  # validation sets differ by rank
    np.testing.assert_allclose(a["averaged"], (np.array(a["own"]) + b["own"]) / 2, rtol=1e-12)
    assert a["history"] == b["history"] == a["averaged"] == b["averaged"]
    # rank 0 wrote one checkpoint per epoch and the best; rank 1, given a directory too, wrote nothing
    assert b["files"] == []
    ckpts = [f for f in a["files"] if f.startswith("ckpt-")]
    assert len(ckpts) == 3 and "best.sgck" in a["files"]
    metrics = [decode((tmp_path / "rank0" / f).read_bytes(), f)["metric"] for f in ckpts]
    assert metrics == a["averaged"]  # the checkpoints' monitor is the averaged val_loss, not rank 0's own
    assert decode((tmp_path / "rank0" / "best.sgck").read_bytes(), "best.sgck")["metric"] == min(a["averaged"])


@needs_comm
@pytest.mark.parametrize("how", ["kill", "raise"])
def test_a_rank_killed_or_raising_during_allreduce_ends_the_run_naming_it_before_any_timeout(how):
    import time

    from sparkgrad.errors import NodeFailure

    started = time.monotonic()
    with pytest.raises(NodeFailure) as info:
        sparkgrad.run(runner_fns.kill_during_allreduce, args=(1, how), num_proc=3, stderr=io.StringIO(), local=True)
    assert time.monotonic() - started < 20  # the ranks would otherwise go on (or wait) for 30 s and more
    if how == "raise":
        assert info.value.rank == 1 and "RuntimeError: rank 1 gives up" in info.value.remote_traceback
    # the dead rank's "lost" (or a peer's error naming it, should that arrive first) ends the run
    assert "rank 1" in str(info.value).splitlines()[0]


@needs_comm
@pytest.mark.spark
def test_collectives_on_spark_ranks_equal_numpy(spark_context):
    import pathlib

    spark_context.addPyFile(str(pathlib.Path(__file__).resolve().parent / "runner_fns.py"))
    got = sparkgrad.run(runner_fns.collectives, args=(3,), num_proc=2, stdout=io.StringIO(), spark=spark_context)
    xs = np.stack([g["x"] for g in got])
    for g in got:
        np.testing.assert_allclose(g["sum"], xs.sum(0), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(g["bcast"], xs[1])
        assert g["objs"] == [["rank", r, {"k": r * 1.5}] for r in range(2)]


@needs_comm
def test_horovod_runner_flow_returns_rank_0s_best_checkpoint_which_loads_into_a_fresh_model(tmp_path):
    pytest.importorskip("sparkgrad.nn.distributed", reason="DistributedOptimizer (the training loop's branch)")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    data = sparkgrad.HorovodRunner(np=-2).run(runner_fns.hvd_flow, ckpt_dir=str(ckpt))
    assert isinstance(data, bytes) and data
    path = tmp_path / "best.sgck"
    path.write_bytes(data)
    model = runner_fns.build_blob_model(seed=99)
    model.compile(optimizer="adadelta", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.load(str(path))
    x, y = runner_fns._blobs(512, 2)
    accuracy = float((model.predict(x).argmax(1) == y).mean())
    assert accuracy > 0.95, accuracy


@needs_comm
@pytest.mark.spark
def test_tfcluster_input_mode_spark_without_ps_feeds_and_allreduces(spark_context):
    import pathlib

    from sparkgrad import InputMode, TFCluster

    spark_context.addPyFile(str(pathlib.Path(__file__).resolve().parent / "runner_fns.py"))
    cluster = TFCluster.run(
        spark_context, runner_fns.feed_then_allreduce, None, 2, 0, input_mode=InputMode.SPARK, output=lambda line: None
    )
    cluster.train(spark_context.parallelize([(float(i), i % 2) for i in range(300)], 4))
    cluster.shutdown(timeout=60)
    got = [cluster.results[i] for i in range(2)]
    assert sum(g["rows"] for g in got) == 300 and all(g["total"] == 300 for g in got)
    assert all(n.comm_port not in (0, n.port) for n in cluster.nodes)
