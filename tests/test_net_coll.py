"""Ring collectives of csrc/net/coll.c between real rank processes on
loopback: allreduce against NumPy for every dtype, op and compression on 1 to 4
and 8 ranks, broadcast, allgather of unequal sizes, barrier; a rank killed
mid-allreduce, a rank with a wrong secret, mismatched calls; the data path
tests run over both links, shared memory (the default for ranks of one host,
coll_shm.c) and TCP (shared_memory=False, as between hosts); the gradient hook
of nn/nn_hook.h (average, accumulation over backward passes, buckets); the
security modes (the same results in "none", "auth" and "encrypt", mismatched
modes, a byte altered on the way)."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest
from coll_ranks import Ranks
from sparkgrad import _core, errors
from tamper_relay import HANDSHAKE_C2S, HANDSHAKE_S2C, HEADER, SEQ

pytestmark = pytest.mark.timeout(120)

# the two ways a ring of one host's ranks moves its data
LINKS = pytest.mark.parametrize("shm", [True, False], ids=["shm", "tcp"])

BIG = 10**6 + 3


def cases_for(n: int) -> list:
    lengths = (1, 7, 1000, BIG) if n <= 4 else (1, 7, 1000, 100_003)
    cases = []
    for length in lengths:
        for dtype in ("float32", "float64", "int32", "int64"):
            cases.append((length, dtype, "sum", None))
        if length <= 1000:
            for dtype in ("float32", "int64"):
                for op in ("average", "min", "max"):
                    cases.append((length, dtype, op, None))
    cases += [(0, "float32", "sum", None), (0, "int64", "max", None)]
    cases += [(1000, "float32", "average", None), (BIG if n <= 4 else 1000, "float32", "average", None)]
    cases += [(length, "float32", "sum", comp) for length in (7, 1000, 65_537) for comp in ("fp16", "bf16")]
    return cases


@LINKS
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_allreduce_matches_numpy_and_ranks_agree(n, shm):
    if n == 1 and not shm:
        pytest.skip("a ring of one has no links")
    cases = cases_for(n)
    with Ranks(n, "allreduce_cases", (cases,), shared_memory=shm) as ranks:
        digests = ranks.values(timeout=100)
    for i, case in enumerate(cases):
        assert len({d[i] for d in digests}) == 1, f"ranks ended with different values for {case}"


@LINKS
@pytest.mark.parametrize("n", [1, 2, 3])
def test_broadcast_allgather_unequal_sizes_and_barrier(n, shm):
    with Ranks(n, "other_collectives", shared_memory=shm) as ranks:
        out = ranks.values()
    for r, v in enumerate(out):
        s = v["stats"]
        # an array allgather is two: shapes, then rows
        assert s["allgathers"] == 5 and s["broadcasts"] == 4 and s["barriers"] == 1, (r, s)
        assert (s["bytes_sent"] > 0) == (n > 1) and not s["broken"]
        assert s["shared_memory"] == (shm and n > 1), (r, s)


@LINKS
@pytest.mark.parametrize("n", [2, 3])
def test_fp16_and_bf16_on_the_wire_round_to_nearest_even(n, shm):
    with Ranks(n, "wire_rounding", shared_memory=shm) as ranks:
        assert ranks.values() == ["ok"] * n


def test_gradient_hook_average_accumulation_and_buckets():
    with Ranks(3, "hook_checks") as ranks:
        assert ranks.values() == ["ok"] * 3


@LINKS
def test_gradient_hook_step_fails_naming_a_rank_that_left(shm):
    with Ranks(2, "hook_peer_leaves", shared_memory=shm) as ranks:
        out = ranks.values()
    assert out[1] == "closed"
    assert out[0].startswith("NodeFailure: rank 1 (127.0.0.1:"), out[0]


def test_sparse_hook_reduces_tables_as_the_union_of_rows_or_densely_when_every_row_is_touched():
    """Two tables, five cases (a rank touching no row of a table, nobody touching one, a table touched
    whole, sum / average / max, bf16 on the wire, buckets for the dense ranges): the gradients equal the
    dense reduction, each table's ids become the union, and the stats count the path the rule chose."""
    with Ranks(2, "hook_table_checks") as ranks:
        out = ranks.values()
    assert out[0]["digests"] == out[1]["digests"]  # every rank ends with identical gradients
    assert out[0]["paths"] == out[1]["paths"] == {0: (2, 0), 1: (2, 0), 2: (1, 1), 3: (1, 1), 4: (2, 0)}


def test_ranks_with_differing_embedding_tables_fail_naming_the_table():
    with Ranks(2, "hook_table_mismatch") as ranks:
        out = ranks.values()
    assert out[0] == ["ClusterError: Embedding table 0 is 50 x 4 on rank 1, 50 x 3 here"], out
    assert "is 50 x 3 on rank 0, 50 x 4 here" in out[1][0], out


def _can_unshare_mounts() -> bool:
    return os.geteuid() == 0 and os.path.isdir("/dev/shm") and shutil.which("mount") is not None


@pytest.mark.skipif(not _can_unshare_mounts(), reason="needs root to give a rank a /dev/shm of its own")
def test_a_rank_behind_another_dev_shm_keeps_the_whole_ring_on_tcp():
    """Rank 1 runs in a mount namespace of its own, with an empty /dev/shm (a rank in another container
    of the same host): it cannot open its neighbours' segments, so no rank uses shared memory and the
    allreduce still comes out right over TCP."""
    with Ranks(3, "shm_isolated", private_shm=(1,)) as ranks:
        out = ranks.values()
    assert out == [{"sum": 6.0, "shared_memory": False}] * 3, out


def test_a_ring_of_one_hosts_ranks_uses_shared_memory_and_leaves_no_file_behind():
    with Ranks(3, "shm_isolated") as ranks:
        out = ranks.values()
        # each rank's segment is named after its pid, and unlinked once its neighbours mapped it
        mine = tuple(f"sparkgrad-coll-{p.pid}-" for p in ranks.procs)
        left = [f for f in os.listdir("/dev/shm") if f.startswith(mine)]
    assert out == [{"sum": 6.0, "shared_memory": True}] * 3, out
    assert not left, left


@LINKS
def test_killed_rank_fails_the_others_naming_it(shm):
    with Ranks(4, "loop_allreduce", (1 << 21,), timeout=60.0, shared_memory=shm) as ranks:
        ranks.wait_started([0, 1, 2, 3])
        killed_at = ranks.kill(2)
        res = ranks.collect(timeout=30, ranks=[0, 1, 3])
    for r in (0, 1, 3):
        kind, (cls, msg, when, _) = res[r]
        assert kind == "error", res[r]
        assert cls == "NodeFailure", (r, cls, msg)
        assert "rank 2 (127.0.0.1:" in msg and "is gone" in msg, (r, msg)
        assert when - killed_at < 10, f"rank {r} failed {when - killed_at:.1f}s after the kill"


@LINKS
def test_rank_that_does_not_come_times_out_the_others_naming_it(shm):
    with Ranks(3, "straggler", (2, 4.0), timeout=1.0, shared_memory=shm) as ranks:
        out = ranks.values(timeout=60)
    for r in (0, 1):
        cls, rest = out[r].split(" after ", 1)
        assert cls == "SparkgradTimeout", out[r]
        assert float(rest.split("s:", 1)[0]) < 3.0, out[r]
        assert "waiting for rank 2 (127.0.0.1:" in rest, out[r]
    assert out[2].startswith(("SparkgradTimeout", "NodeFailure")), out[2]


def test_wrong_secret_is_refused_and_formation_names_the_rank():
    secret = os.urandom(32)
    with Ranks(3, "mismatch", secrets=[secret, secret, os.urandom(32)], timeout=4.0) as ranks:
        res = ranks.collect(timeout=60)
    kind, (cls, msg, _, _) = res[2]
    assert kind == "error" and cls == "AuthError", res[2]
    for r in (0, 1):
        kind, (cls, msg, _, _) = res[r]
        assert kind == "error", res[r]
        assert cls in ("AuthError", "SparkgradTimeout", "PeerClosedError"), (r, cls, msg)
        assert "rank 2 (127.0.0.1:" in msg, (r, msg)


def test_mismatched_calls_name_the_ranks_and_values():
    with Ranks(2, "mismatch") as ranks:
        out = ranks.values()
    for msgs in out:
        length, dtype, op, gather, bcast, closed = msgs.split("\n")
        assert length.startswith("ClusterError") and "rank 0: 10, rank 1: 11" in length, length
        assert dtype.startswith("ClusterError") and "rank 0: float32, rank 1: float64" in dtype, dtype
        assert op.startswith("ClusterError") and "rank 0: sum, rank 1: max" in op, op
        assert gather.startswith("ClusterError") and "rank 1 has float32[*,4], rank 0 has float32[*,3]" in gather
        assert bcast.startswith("ClusterError") and "count (bytes): rank 0: 8, rank 1: 9" in bcast, bcast
        assert closed.startswith("StateError"), closed


def test_communicator_arguments_are_checked():
    with _core.Listener("127.0.0.1", 0) as lis:
        with pytest.raises(errors.InvalidArgumentError, match="16"):
            _core.Communicator(lis, b"short", 0, [("127.0.0.1", lis.port)])
        with pytest.raises(errors.InvalidArgumentError, match="rank 3"):
            _core.Communicator(lis, os.urandom(32), 3, [("127.0.0.1", lis.port)])
        with pytest.raises(ValueError, match="'plain'"):
            _core.Communicator(lis, os.urandom(32), 0, [("127.0.0.1", lis.port)], security="plain")
        with _core.Communicator(lis, os.urandom(32), 0, [("127.0.0.1", lis.port)], security="encrypt") as comm:
            assert (comm.rank, comm.size) == (0, 1)
            a = np.arange(5, dtype=np.float32)
            assert comm.allreduce(a, op="average") is a and np.all(a == np.arange(5))
            with pytest.raises(errors.InvalidArgumentError, match="float32"):
                comm.allreduce(np.zeros(3, np.uint8))
            with pytest.raises(errors.InvalidArgumentError, match="float32 arrays only"):
                comm.allreduce(np.zeros(3), compression="fp16")
            with pytest.raises(errors.InvalidArgumentError, match="op"):
                comm.allreduce(a, op="prod")
            with pytest.raises(errors.InvalidArgumentError, match="in place"):
                comm.allreduce(np.zeros((4, 4), np.float32)[:, 1])
            assert comm.allgather_bytes(b"x") == [b"x"]
            assert comm.broadcast_bytes(b"y") == b"y"
            hook = comm.grad_hook()
            assert type(hook).__name__ == "PyCapsule"
        with pytest.raises(errors.StateError):
            comm.allreduce(a)


# ---- security modes (coll.h "Security") ----

TAG = 16


@pytest.mark.parametrize("n", [2, 3])
def test_security_modes_give_the_same_results(n):
    by_mode = {}
    for mode in ("none", "auth", "encrypt"):
        with Ranks(n, "security_cases", security=mode) as ranks:
            digests = ranks.values(timeout=100)
        assert all(d == digests[0] for d in digests), f"{mode}: ranks ended with different values"
        by_mode[mode] = digests[0]
    assert by_mode["auth"] == by_mode["none"] and by_mode["encrypt"] == by_mode["none"]


def test_mismatched_security_modes_fail_the_ring_naming_both():
    with Ranks(2, "fail_one_allreduce", (10,), security=["auth", "encrypt"], timeout=10.0) as ranks:
        res = ranks.collect(timeout=60)
    for r in (0, 1):
        kind, (cls, msg, _, _) = res[r]
        assert kind == "error" and cls == "AuthError", res[r]
        assert "security='auth'" in msg and "security='encrypt'" in msg, (r, msg)
        assert f"rank {1 - r} (127.0.0.1:" in msg, (r, msg)


def test_altered_data_byte_fails_every_rank_naming_the_peer():
    # rank 0 reaches rank 1 through the relay; past rank 0's handshake, its
    # HELLO (16 bytes) and the two 60-byte header records of the allreduce,
    # the byte flipped is payload byte 1000 of the first data record
    flip = HANDSHAKE_C2S + (HEADER + SEQ + 16 + TAG) + 2 * (SEQ + 60 + TAG) + SEQ + 1000
    relay = {"direction": "c2s", "flip_at": flip}
    with Ranks(3, "fail_one_allreduce", (1 << 20,), timeout=30.0, relay_in_front_of=1, relay_kw=relay) as ranks:
        res = ranks.values(timeout=60)
        assert ranks.relay.flipped == 1
        deadline = time.monotonic() + 10
        for p in ranks.procs:
            p.join(max(0.1, deadline - time.monotonic()))
        assert not any(p.is_alive() for p in ranks.procs)
    for r, (cls, msg, took) in enumerate(res):
        assert cls != "no error", r
        assert took < 5, f"rank {r} failed after {took:.1f}s: {msg}"
    cls, msg, _ = res[1]
    assert cls == "AuthError", res[1]
    assert "integrity" in msg and "rank 0 (127.0.0.1:" in msg, msg


def test_altered_hello_ok_fails_the_formation_naming_the_peer():
    # the other direction of rank 0's connection to rank 1 carries only
    # frames: HELLO_OK, then a notice or a goodbye; flip a byte of HELLO_OK
    relay = {"direction": "s2c", "flip_at": HANDSHAKE_S2C + HEADER + SEQ + 3}
    with Ranks(2, "fail_one_allreduce", (10,), timeout=10.0, relay_in_front_of=1, relay_kw=relay) as ranks:
        res = ranks.collect(timeout=60)
    kind, (cls, msg, *_) = res[0]
    assert kind == "error" and cls == "AuthError", res[0]
    assert "integrity" in msg and "rank 1 (127.0.0.1:" in msg, msg
    kind, value = res[1]  # formed (rank 0 served its listener) and then failed, or failed forming
    assert kind == "error" or (value[0] != "no error" and value[2] < 5), res[1]
