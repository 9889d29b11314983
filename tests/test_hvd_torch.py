"""sparkgrad.hvd.torch: Horovod's torch API on 2 real ranks (local processes of sparkgrad.run), checked with torch."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hvd_torch_fns  # noqa: E402
import sparkgrad  # noqa: E402
import sparkgrad.hvd as hvd  # noqa: E402
from sparkgrad import _core  # noqa: E402
from sparkgrad.errors import InvalidArgumentError, NodeFailure, StateError  # noqa: E402

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not hasattr(_core, "Communicator"), reason="this _core has no Communicator"),
]


def _run(fn, *args, **kwargs):
    return sparkgrad.run(fn, args=args, kwargs=kwargs, num_proc=2, stdout=io.StringIO(), local=True)


_CALLS = [  # one 2-rank run serves the tests below (each rank start-up imports torch: seconds)
    ("collectives", (), {}),
    ("mismatches", (), {}),
    ("gradients", (0,), {}),
    ("gradients_big", (64 << 20,), {}),
    ("train_steps", (16, 5, 0.1), {"backward_passes_per_step": 1}),
    ("train_steps_accumulating", (16, 5, 0.1), {"backward_passes_per_step": 2}),
    ("join_uneven", ([3, 5],), {}),
    ("peer_leaves", (1,), {}),  # last: rank 1 shuts its communicator down
]


@pytest.fixture(scope="module")
def ring():
    """Each call of _CALLS on both ranks: ``ring[name]`` is the (rank 0, rank 1) pair of its values."""
    calls = [(name.removesuffix("_big").removesuffix("_accumulating"), args, kwargs) for name, args, kwargs in _CALLS]
    got = _run(hvd_torch_fns.several_named, calls, [name for name, _, _ in _CALLS])
    return {name: (got[0][name], got[1][name]) for name, _, _ in _CALLS}


def test_importing_sparkgrad_and_sparkgrad_hvd_does_not_import_torch():
    code = "import sys, sparkgrad, sparkgrad.hvd; assert 'torch' not in sys.modules, 'torch was imported'"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def test_collectives_equal_their_definitions_on_two_ranks(ring):
    a, b = ring["collectives"]
    xs = np.stack([a["x"], b["x"]])
    for g in (a, b):
        np.testing.assert_allclose(g["avg"], xs.mean(0), rtol=1e-6)
        np.testing.assert_allclose(g["sum"], xs.sum(0), rtol=1e-6)
        np.testing.assert_array_equal(g["min"], xs.min(0))
        np.testing.assert_array_equal(g["max"], xs.max(0))
        np.testing.assert_allclose(g["scaled"], 1.5 * xs.sum(0), rtol=1e-6)
        np.testing.assert_allclose(g["inplace"], xs.sum(0), rtol=1e-6)
        assert g["inplace_same_storage"]
        np.testing.assert_allclose(g["strided"], xs.sum(0).T, rtol=1e-6)
        for k, got in enumerate(g["async"]):
            np.testing.assert_allclose(got, k * xs.sum(0), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(g["async_"], xs.sum(0), rtol=1e-6)
        assert g["polled"]
        np.testing.assert_allclose(g["half"], xs.sum(0), rtol=2e-3, atol=2e-3)  # float16 in and out
        np.testing.assert_allclose(g["bf16"], xs.sum(0), rtol=2e-2, atol=2e-2)
        np.testing.assert_array_equal(g["ints"], np.arange(5) * 3)
        np.testing.assert_allclose(g["fp16"], xs.sum(0), rtol=1e-3, atol=1e-3)  # fp16 on the wire
        np.testing.assert_allclose(g["bf16wire"], xs.sum(0), rtol=1e-2, atol=2e-2)
        np.testing.assert_allclose(g["grouped"][0], xs.sum(0), rtol=1e-6)
        np.testing.assert_allclose(g["grouped"][1], 2 * xs.astype(np.float64).sum(0), rtol=1e-12)
        np.testing.assert_array_equal(g["grouped"][2], [3])
        assert g["grouped_dtypes"] == ["torch.float32", "torch.float64", "torch.int64"]
        np.testing.assert_array_equal(g["gather"], [[0, 0], [1, 1], [1, 1]])
        np.testing.assert_array_equal(g["gather_bf16"], [[0.5, 0.5], [1.5, 1.5]])
        np.testing.assert_array_equal(g["bcast"], b["x"])
        np.testing.assert_array_equal(g["bcast_"], a["x"])
        assert g["objs"] == [[0, {"k": 0.0}], [1, {"k": 1.5}]]
        assert g["obj"]["r"] == 1 and g["obj"]["s"] == "text"
        np.testing.assert_array_equal(g["obj"]["t"], [1.0, 1.0])
    for g in (a, b):  # issued as first, middle, last; waited for as last, middle, first
        np.testing.assert_array_equal(g["interleaved"][0], [0, 1])
        np.testing.assert_array_equal(g["interleaved"][1], [10.0, 10.0])
        np.testing.assert_array_equal(g["interleaved"][2], [1.0, 1.0])
    # broadcast_parameters and broadcast_optimizer_state: rank 1 ends with rank 0's model and optimizer
    assert a["state_dict"].keys() == b["state_dict"].keys() and "1.num_batches_tracked" in a["state_dict"]
    for key in a["state_dict"]:
        np.testing.assert_array_equal(a["state_dict"][key], b["state_dict"][key], err_msg=key)
    assert a["state_dict"]["1.num_batches_tracked"] == 1
    for mine, root in zip(b["momentum"], a["momentum"], strict=True):
        np.testing.assert_array_equal(mine, root)
    assert a["lr"] == b["lr"] == 0.1
    # gradients through the collectives: every rank's loss weighs the result by (rank + 1) (broadcast: rank + 2)
    for g in (a, b):
        np.testing.assert_array_equal(g["grad_allreduce"], [3.0, 3.0, 3.0])  # 1 + 2, for each element
    np.testing.assert_array_equal(a["grad_allgather"], [[0.0, 0.0]])  # row 0 weighs 0 on both ranks
    np.testing.assert_array_equal(b["grad_allgather"], [[3.0, 3.0], [6.0, 6.0]])  # rows 1, 2: 1 * 3 and 2 * 3
    np.testing.assert_array_equal(a["grad_broadcast"], [0.0, 0.0])  # not the root
    np.testing.assert_array_equal(b["grad_broadcast"], [5.0, 5.0])  # 2 + 3
    # alltoall: rank 0 sends [0] | [1, 2, 3], rank 1 sends [10, 11] | [12, 13]
    np.testing.assert_array_equal(a["a2a_even"], [0, 1, 10, 11])
    np.testing.assert_array_equal(b["a2a_even"], [2, 3, 12, 13])
    np.testing.assert_array_equal(a["a2a"], [0, 10, 11])
    np.testing.assert_array_equal(b["a2a"], [1, 2, 3, 12, 13])
    assert a["a2a_received"] == [1, 2] and b["a2a_received"] == [3, 2]


@pytest.mark.parametrize("threshold", [0, 64 << 20])
def test_distributed_optimizer_gradients_are_the_mean_of_every_ranks(ring, threshold):
    a, b = ring["gradients" if threshold == 0 else "gradients_big"]
    # (rtol, atol): fp32 rounding, fp16 and bf16 on the wire
    tolerance = {"none": (1e-6, 1e-7), "fp16": (2e-3, 1e-4), "bf16": (2e-2, 1e-3), "groups": (1e-6, 1e-7)}
    tolerance["predivide"] = (1e-6, 1e-7)
    for comp, (rtol, atol) in tolerance.items():
        ga, gb = a[comp], b[comp]
        for name in ga["local"]:
            mean = (ga["local"][name] + gb["local"][name]) / 2
            np.testing.assert_allclose(ga["reduced"][name], mean, rtol=rtol, atol=atol, err_msg=f"{comp} {name}")
            np.testing.assert_array_equal(ga["reduced"][name], gb["reduced"][name])  # identical on both ranks
            np.testing.assert_array_equal(ga["params"][name], gb["params"][name])
        assert not all(np.array_equal(ga["local"][n], gb["local"][n]) for n in ga["local"])  # each rank its data
        # threshold 0: each gradient is its own bucket, queued by its hook while backward goes on;
        # 64 MiB: the one bucket is queued by synchronize(); groups=2: each group once it is complete
        want = 2 if comp == "groups" else 6 if threshold == 0 else 0
        assert ga["buckets_during_backward"] == gb["buckets_during_backward"] == want, comp
    assert 0 < a["descriptor_seconds"] < 10


def _reference_training(global_batch, steps, lr):
    x, y = hvd_torch_fns._data(torch, global_batch * steps, seed=7)
    model = hvd_torch_fns._net(torch, seed=2)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for s in range(steps):
        opt.zero_grad()
        part = slice(s * global_batch, (s + 1) * global_batch)
        torch.nn.functional.cross_entropy(model(x[part]), y[part]).backward()
        opt.step()
    return {n: p.detach().numpy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("passes", [1, 2])
def test_two_ranks_match_one_process_at_the_same_global_batch(ring, passes):
    want = _reference_training(16, 5, 0.1)
    a, b = ring["train_steps" if passes == 1 else "train_steps_accumulating"]
    for name, ref in want.items():
        np.testing.assert_array_equal(a[name], b[name])
        np.testing.assert_allclose(a[name], ref, rtol=1e-5, atol=1e-6, err_msg=name)


def test_ranks_that_call_different_collectives_fail_on_both_naming_them(ring):
    a, b = ring["mismatches"]
    for g in (a, b):
        errors = g["errors"]
        for case in ("name", "shape", "dtype", "kind", "root"):
            assert errors[case] is not None and errors[case][0] == "ClusterError", (case, errors[case])
        assert "rank 0: allreduce 'grad.0'" in errors["name"][1] and "rank 1: allreduce 'grad.1'" in errors["name"][1]
        assert "float32[4]" in errors["shape"][1] and "float32[5]" in errors["shape"][1]
        assert "float64[4]" in errors["dtype"][1]
        assert "rank 1: broadcast 'w'" in errors["kind"][1] and errors["kind"][2] == "allreduce"
        assert "root=0" in errors["root"][1] and "root=1" in errors["root"][1]
        np.testing.assert_array_equal(g["after"], [1.0, 1.0, 1.0])  # the ring stayed usable


def test_join_lets_a_rank_out_of_data_contribute_zeros_until_all_joined(ring):
    a, b = ring["join_uneven"]
    assert a["last"] == b["last"] == 1
    assert len(a["steps"]) == 3 and len(b["steps"]) == 5
    for s in range(3):  # both ranks stepping: the mean of the two
        for name, (local_a, reduced_a) in a["steps"][s].items():
            local_b, reduced_b = b["steps"][s][name]
            np.testing.assert_allclose(reduced_a, (local_a + local_b) / 2, rtol=1e-6, atol=1e-7)
            np.testing.assert_array_equal(reduced_a, reduced_b)
    for s in (3, 4):  # rank 0 joined: its zeros count in the average, as Horovod's
        for local_b, reduced_b in b["steps"][s].values():
            np.testing.assert_allclose(reduced_b, local_b / 2, rtol=1e-6, atol=1e-7)
    for name in a["params"]:
        np.testing.assert_array_equal(a["params"][name], b["params"][name])
    np.testing.assert_array_equal(a["gathered"], [0.0, 1.0])


def test_alltoall_on_three_ranks_with_uneven_splits_and_a_joined_rank():
    got = sparkgrad.run(hvd_torch_fns.alltoall_three, num_proc=3, stdout=io.StringIO(), local=True)
    splits = hvd_torch_fns.ALLTOALL_SPLITS
    for r, g in enumerate(got):
        blocks = [got[s]["x"][sum(splits[s][:r]) : sum(splits[s][: r + 1])] for s in range(3)]
        np.testing.assert_array_equal(g["got"], np.concatenate(blocks))
        assert g["received"] == [splits[s][r] for s in range(3)]
        np.testing.assert_array_equal(g["even"], [2 * r, 2 * r + 1, 10 + 2 * r, 11 + 2 * r, 20 + 2 * r, 21 + 2 * r])
        assert g["last"] == 1  # rank 2 joined first; ranks 0 and 1 together, the higher counts as last
    np.testing.assert_array_equal(got[0]["with_joined"], [0])
    np.testing.assert_array_equal(got[1]["with_joined"], [1, 10, 11])
    assert got[0]["with_joined_received"] == [1, 0, 0] and got[1]["with_joined_received"] == [1, 2, 0]


def test_a_rank_leaving_mid_step_fails_the_others_step_naming_rank_tensor_and_collective(ring):
    got, left = ring["peer_leaves"]
    assert left is None
    assert got["type"] == "NodeFailure" and got["collective"] == "allreduce", got
    assert got["tensor"].startswith("DistributedOptimizer.")
    assert got["message"].startswith("hvd.allreduce of 'DistributedOptimizer.")
    assert "on rank 0: rank 1" in got["message"]
    assert "a bucket of 6 tensors" in got["message"]
    assert got["seconds"] < hvd.DEFAULT_TIMEOUT  # before the communicator's timeout: the ring reported the loss


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_rank_failing_mid_step_ends_the_run_naming_it(how):
    with pytest.raises(NodeFailure) as info:
        sparkgrad.run(hvd_torch_fns.raise_mid_step, args=(1, how), num_proc=2, stderr=io.StringIO(), local=True)
    if how == "raise":
        assert info.value.rank == 1 and "RuntimeError: rank 1 fails in step 2" in info.value.remote_traceback
    assert "rank 1" in str(info.value).splitlines()[0]


@pytest.mark.skipif(
    not os.path.exists("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"),
    reason="Debian's dataset-fashion-mnist is not installed",
)
def test_horovods_pytorch_mnist_shape_trains_on_two_ranks():
    a, b = _run(hvd_torch_fns.mnist, 1280, 32, 1, 0.1)
    np.testing.assert_array_equal(a["params"], b["params"])  # one model on both ranks
    assert len(a["losses"]) == len(b["losses"]) == 20  # 640 rows per rank, 32 a batch
    first, last = np.mean(a["losses"][:3] + b["losses"][:3]), np.mean(a["losses"][-3:] + b["losses"][-3:])
    assert last < first - 0.3, (first, last)
    assert a["accuracy"] == b["accuracy"] > 0.3  # averaged over the ranks by hvd.allreduce


# -- one process: argument checks -------------------------------------------------------------------------


@pytest.fixture
def one_rank():
    import sparkgrad.hvd.torch as hvd

    hvd.init()
    yield hvd
    hvd.shutdown()


def test_unsupported_dtype_adasum_and_process_sets_are_refused_naming_the_tensor(one_rank):
    hvd = one_rank
    with pytest.raises(InvalidArgumentError, match=r"allreduce: tensor 'flags' on rank 0 has dtype bool"):
        hvd.allreduce(torch.zeros(3, dtype=torch.bool), name="flags")
    with pytest.raises(InvalidArgumentError, match="Adasum is not supported"):
        hvd.allreduce(torch.zeros(3), op=hvd.Adasum)
    with pytest.raises(InvalidArgumentError, match="process sets"):
        hvd.allreduce(torch.zeros(3), process_set=object())
    hvd.allreduce(torch.zeros(3), process_set=hvd.global_process_set)  # Horovod's default, spelled out
    assert not (hvd.nccl_built() or hvd.mpi_built() or hvd.gloo_built() or hvd.cuda_built())
    model = torch.nn.Linear(2, 2)
    with pytest.raises(InvalidArgumentError, match="Adasum"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum)
    with pytest.raises(InvalidArgumentError, match="splits"):
        hvd.alltoall(torch.zeros(3), splits=[1, 1])
    np.testing.assert_array_equal(hvd.allreduce(torch.ones(2), op=hvd.Sum).numpy(), [1.0, 1.0])  # still usable


def test_a_parameter_missing_from_named_parameters_is_named(one_rank):
    hvd = one_rank
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    named = list(model.named_parameters())[:3]  # the last bias left out
    with pytest.raises(InvalidArgumentError, match=r"param_groups\[0\]\['params'\]\[3\] \(float32\[1\]\) is missing"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named)


def test_in_place_collectives_hand_the_tensors_own_storage_to_the_ring(one_rank):
    import sparkgrad.hvd.torch as hvd_torch

    t = torch.arange(6, dtype=torch.float64)
    op, _ = hvd_torch._allreduce(t, "t", "sum", "", 1.0, 1.0, True, "allreduce_")
    assert np.shares_memory(op.array, t.numpy())  # no copy: the ring reduces the tensor's storage
    op, _ = hvd_torch._broadcast(t, 0, "t", True, "broadcast_")
    assert np.shares_memory(op.array, t.numpy())
    op, _ = hvd_torch._allreduce(t[::2], "s", "sum", "", 1.0, 1.0, True, "allreduce_")
    assert not np.shares_memory(op.array, t.numpy())  # a strided view goes through a copy


def test_distributed_optimizer_reuses_its_fusion_buffers_across_steps(one_rank):
    hvd = one_rank
    model = torch.nn.Linear(3, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    buffers = []
    for _ in range(3):
        opt.zero_grad()
        model(torch.ones(4, 3)).sum().backward()
        opt.step()
        buffers.append({k: v.data_ptr() for k, v in opt._buffers.items()})
    assert len(buffers[0]) == 1 and buffers[0] == buffers[1] == buffers[2]


def test_distributed_optimizer_is_the_wrapped_class_and_refuses_zero_grad_mid_step(one_rank):
    hvd = one_rank
    model = torch.nn.Linear(3, 2)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.1), model.named_parameters())
    assert isinstance(opt, torch.optim.Adam)
    model(torch.ones(4, 3)).sum().backward()
    with pytest.raises(StateError, match="zero_grad"):
        opt.zero_grad()
    opt.step()
    opt.zero_grad()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.state_dict()["state"][0]["step"].item() == 1.0


def test_collectives_before_init_say_to_call_init():
    import sparkgrad.hvd.torch as hvd

    hvd.shutdown()
    with pytest.raises(StateError, match=r"call hvd.init\(\) first"):
        hvd.allreduce(torch.ones(2))


def test_the_first_buckets_allreduce_starts_while_backward_is_still_running(one_rank, monkeypatch):
    from sparkgrad.hvd import engine

    hvd = one_rank
    started: list = []  # the DistributedOptimizer buckets the engine began to reduce, in order
    first_started = __import__("threading").Event()
    execute = engine.Engine._execute

    def recording(self, op):
        if op.desc.name.startswith("DistributedOptimizer"):
            started.append(op.desc.names)
            first_started.set()
        return execute(self, op)

    monkeypatch.setattr(engine.Engine, "_execute", recording)
    torch.manual_seed(0)
    # 2.weight alone is 1 MiB: with 4.* it fills the first bucket; 0.* comes last in backward
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    seen_in_backward: list = []
    # after the optimizer's own hook on the gradient backward computes last: backward waits here for the engine
    model[0].weight.register_post_accumulate_grad_hook(lambda p: seen_in_backward.append(first_started.wait(60)))
    model(torch.ones(8, 64)).sum().backward()
    assert seen_in_backward == [True]  # the first bucket's allreduce began before backward's last gradient was done
    assert set(started[0]) == {"4.weight", "4.bias", "2.weight", "2.bias"}
    opt.step()
    assert [set(b) for b in started] == [{"4.weight", "4.bias", "2.weight", "2.bias"}, {"0.weight", "0.bias"}]
