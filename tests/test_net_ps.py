"""Parameter server over loopback: shard split, async and sync modes,
failure of a worker mid-step, stop(), automatic exit, state for checkpoints,
protected frames (security modes, a mismatch, a byte altered each way)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from sparkgrad import _core, errors
from sparkgrad.cluster.context import NodeContext, NodeInfo, cluster_spec
from sparkgrad.cluster.ps import ParameterClient
from tamper_relay import HANDSHAKE_C2S, HANDSHAKE_S2C, SEQ, TamperRelay

pytestmark = pytest.mark.timeout(60)


class Cluster:
    """num_ps shards serving in background threads on loopback."""

    def __init__(
        self,
        total: int,
        num_ps: int,
        num_workers: int,
        mode: str,
        lr: float = 0.1,
        init=True,
        optimizer=None,
        security: str | None = None,
    ):
        self.secret = os.urandom(32)
        self.total = total
        self.init = np.linspace(-1, 1, total, dtype=np.float32)
        self.listeners = [_core.Listener("127.0.0.1", 0) for _ in range(num_ps)]
        self.servers = []
        for i, lis in enumerate(self.listeners):
            off, cnt = _core.ps_shard_range(total, num_ps, i)
            params = self.init[off : off + cnt].copy() if init else None
            how = {"lr": lr} if optimizer is None else {"optimizer": optimizer}
            self.servers.append(
                _core.PsServer(
                    lis, self.secret, off, cnt, total, num_workers, mode=mode, params=params, security=security, **how
                )
            )
        self._start()

    def _start(self) -> None:
        """Serves each of self.servers in a thread of its own."""
        self.results: list[str | BaseException | None] = [None] * len(self.servers)
        self.threads = [threading.Thread(target=self._serve, args=(i,)) for i in range(len(self.servers))]
        for t in self.threads:
            t.start()

    def _serve(self, i: int) -> None:
        try:
            self.results[i] = self.servers[i].serve(timeout=30)
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            self.results[i] = exc

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", lis.port) for lis in self.listeners]

    def client(self, worker_id: int, timeout: float = 10.0, security: str | None = None) -> _core.PsClient:
        return _core.PsClient(self.addresses, self.secret, self.total, worker_id, timeout, security=security)

    def join(self, timeout: float = 10.0) -> list:
        for t in self.threads:
            t.join(timeout)
            assert not t.is_alive(), "a ps serve loop did not exit"
        return self.results

    def close(self) -> None:
        for s in self.servers:
            s.stop()
        self.join()
        for lis in self.listeners:
            lis.close()


def run_workers(fn, n: int) -> list:
    out: list = [None] * n

    def run(w: int) -> None:
        try:
            out[w] = fn(w)
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            out[w] = exc

    threads = [threading.Thread(target=run, args=(w,)) for w in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a worker thread hung"
    return out


def test_shard_ranges_are_contiguous_and_balanced():
    for total in (1, 2, 7, 100, 1001, 2**20 + 3):
        for num_ps in range(1, min(total, 6) + 1):
            ranges = [_core.ps_shard_range(total, num_ps, i) for i in range(num_ps)]
            assert ranges[0][0] == 0 and sum(c for _, c in ranges) == total
            assert all(ranges[i][0] + ranges[i][1] == ranges[i + 1][0] for i in range(num_ps - 1))
            assert max(c for _, c in ranges) - min(c for _, c in ranges) <= 1
    with pytest.raises(errors.InvalidArgumentError):
        _core.ps_shard_range(3, 4, 0)
    with pytest.raises(errors.InvalidArgumentError):
        _core.ps_shard_range(10, 2, 2)


@pytest.mark.parametrize("num_ps", [1, 2])
def test_async_applies_every_gradient_as_it_arrives(num_ps):
    total, pushes = 1001, 20
    cl = Cluster(total, num_ps, 2, "async", lr=0.1)
    try:

        def worker(w: int) -> list[int]:
            c = cl.client(w)
            grads = np.full(total, 0.5 * (w + 1), dtype=np.float32)
            params = np.empty(total, dtype=np.float32)
            steps = [c.push_pull(grads, params) for _ in range(pushes)]
            c.done()
            c.close()
            return steps

        steps = run_workers(worker, 2)
        assert all(isinstance(s, list) for s in steps), steps
        # Each push bumps the step by one; the two workers interleave.
        assert sorted(steps[0] + steps[1]) == list(range(1, 2 * pushes + 1))
        assert cl.join() == ["done"] * num_ps
        final = np.concatenate([s.get_state()[0] for s in cl.servers])
        expect = cl.init - 0.1 * pushes * (0.5 + 1.0)
        np.testing.assert_allclose(final, expect, rtol=1e-5, atol=1e-5)
        assert all(s.step == 2 * pushes for s in cl.servers)
    finally:
        cl.close()


@pytest.mark.parametrize("num_ps", [1, 2])
def test_sync_averages_one_gradient_per_worker_per_step(num_ps):
    total, steps = 513, 5
    cl = Cluster(total, num_ps, 2, "sync", lr=0.1)
    try:

        def worker(w: int):
            c = cl.client(w)
            params = np.empty(total, dtype=np.float32)
            assert c.pull(params) == 0
            np.testing.assert_array_equal(params, cl.init)
            seen = []
            for _ in range(steps):
                grads = np.full(total, float(w + 1), dtype=np.float32)  # worker 0: 1, worker 1: 2
                seen.append((c.push_pull(grads, params), params.copy()))
            c.done()
            return seen

        out = run_workers(worker, 2)
        assert all(isinstance(o, list) for o in out), out
        for k in range(steps):
            (s0, p0), (s1, p1) = out[0][k], out[1][k]
            assert s0 == s1 == k + 1
            np.testing.assert_array_equal(p0, p1)
            np.testing.assert_allclose(p0, cl.init - 0.1 * 1.5 * (k + 1), rtol=1e-5, atol=1e-5)
        assert cl.join() == ["done"] * num_ps
    finally:
        cl.close()


def test_sync_stops_waiting_for_a_worker_that_said_done():
    total = 64
    cl = Cluster(total, 1, 2, "sync", lr=1.0)
    try:

        def worker(w: int):
            c = cl.client(w)
            grads = np.ones(total, dtype=np.float32)
            n = 1 if w == 0 else 4  # uneven partitions
            steps = [c.push(grads) for _ in range(n)]
            c.done()
            return steps

        out = run_workers(worker, 2)
        assert out[0] == [1] and out[1] == [1, 2, 3, 4]
        assert cl.join() == ["done"]
        np.testing.assert_allclose(cl.servers[0].get_state()[0], cl.init - 4.0, atol=1e-6)
    finally:
        cl.close()


def _push_in_thread(client, total: int) -> tuple[threading.Thread, list]:
    """Starts client.push(ones) in a thread; the list receives its result or exception."""
    result: list = []

    def push() -> None:
        try:
            result.append(client.push(np.ones(total, dtype=np.float32)))
        except BaseException as exc:  # noqa: BLE001 - checked by the caller
            result.append(exc)

    t = threading.Thread(target=push)
    t.start()
    return t, result


def test_sync_worker_dying_mid_step_fails_the_others_instead_of_hanging():
    total = 32
    cl = Cluster(total, 2, 2, "sync")
    try:
        dying = cl.client(1)
        survivor = cl.client(0)
        t, result = _push_in_thread(survivor, total)
        t.join(0.2)  # the survivor's push waits for worker 1's: it cannot return on its own
        assert t.is_alive() and not result
        dying.close()  # like a SIGKILL: the connection drops without "done"
        t.join(10)
        assert not t.is_alive()  # failed, not left waiting
        assert isinstance(result[0], errors.NodeFailure), result
        assert "worker 1" in str(result[0]) and "without saying done" in str(result[0])
        with pytest.raises(errors.NodeFailure):
            cl.client(0).push(np.ones(total, dtype=np.float32))
    finally:
        cl.close()


def test_stop_exits_the_serve_loop_promptly_and_cancels_waiting_pushes():
    total = 16
    cl = Cluster(total, 1, 2, "sync")
    c = cl.client(0)
    t, result = _push_in_thread(c, total)
    t.join(0.2)  # the push waits for worker 1's, which never comes
    assert t.is_alive() and not result
    cl.servers[0].stop()
    assert cl.join(5) == ["stopped"]
    t.join(10)
    assert not t.is_alive()  # the stop woke the waiting push
    assert isinstance(result[0], errors.CancelledError | errors.PeerClosedError), result
    cl.listeners[0].close()


def test_state_for_checkpoints_and_init_by_the_first_worker():
    total = 100
    cl = Cluster(total, 2, 2, "async", init=False)
    try:
        c0, c1 = cl.client(0), cl.client(1)
        params = np.arange(total, dtype=np.float32)
        assert c0.init(params) is True
        assert c1.init(np.zeros(total, dtype=np.float32)) is False
        got = np.empty(total, dtype=np.float32)
        assert c1.pull(got) == 0
        np.testing.assert_array_equal(got, params)
        c0.set_state(params * 2, 41)
        state, step, opt = cl.servers[1].get_state()
        off, cnt = _core.ps_shard_range(total, 2, 1)
        assert step == 41 and np.array_equal(state, params[off : off + cnt] * 2) and opt is None
        whole, step, opts = c1.get_state()
        assert step == 41 and np.array_equal(whole, params * 2) and opts == [None, None]
        cl.servers[0].set_state(np.full(cl.servers[0].shard[1], 7, dtype=np.float32), 50)
        assert c1.pull(got) == 50 and got[0] == 7
    finally:
        cl.close()


def test_clients_are_checked_against_the_shard_and_the_secret():
    cl = Cluster(50, 2, 1, "async")
    try:
        with pytest.raises(errors.ClusterError, match="expects shard"):
            _core.PsClient(cl.addresses, cl.secret, 51, 0, 5.0)
        with pytest.raises(errors.ClusterError, match="worker 3"):
            _core.PsClient(cl.addresses, cl.secret, 50, 3, 5.0)
        with pytest.raises(errors.AuthError):
            _core.PsClient(cl.addresses, os.urandom(32), 50, 0, 5.0)
        c = cl.client(0)
        with pytest.raises(errors.InvalidArgumentError, match="float32 array of 50 values"):
            c.push(np.ones(50, dtype=np.float64))
        with pytest.raises(errors.InvalidArgumentError, match="writable"):
            ro = np.ones(50, dtype=np.float32)
            ro.flags.writeable = False
            c.pull(ro)
        with pytest.raises(TypeError):
            c.push([1.0] * 50)
        c.close()
        with pytest.raises(errors.StateError, match="closed"):
            c.pull(np.ones(50, dtype=np.float32))
    finally:
        cl.close()


def test_push_before_init_is_refused_and_the_client_stays_usable():
    cl = Cluster(10, 1, 1, "async", init=False)
    try:
        c = cl.client(0)
        with pytest.raises(errors.StateError, match="before the ps shard was initialized"):
            c.push(np.ones(10, dtype=np.float32))
        assert c.init(np.zeros(10, dtype=np.float32)) is True
        assert c.push(np.ones(10, dtype=np.float32)) == 1
    finally:
        cl.close()


KILLED_WORKER = """
import sys, time
from sparkgrad import _core
port, secret, total = int(sys.argv[1]), bytes.fromhex(sys.argv[2]), int(sys.argv[3])
c = _core.PsClient([("127.0.0.1", port)], secret, total, 1, 10.0)
print("connected", flush=True)
time.sleep(60)
"""


def test_sync_worker_killed_with_sigkill_fails_the_others_with_node_failure():
    import signal
    import subprocess
    import sys

    total = 32
    cl = Cluster(total, 1, 2, "sync")
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WORKER, str(cl.listeners[0].port), cl.secret.hex(), str(total)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert proc.stdout.readline().strip() == b"connected"
        survivor = cl.client(0)
        t, result = _push_in_thread(survivor, total)
        t.join(0.2)  # the survivor's push waits for worker 1's: it cannot return on its own
        assert t.is_alive() and not result
        proc.send_signal(signal.SIGKILL)
        t.join(10)
        assert not t.is_alive()
        assert isinstance(result[0], errors.NodeFailure) and "worker 1" in str(result[0]), result
    finally:
        proc.kill()
        proc.wait(10)
        cl.close()


@pytest.mark.parametrize("num_ps", [1, 2])
def test_wait_others_returns_the_final_parameters_once_every_other_worker_is_done(num_ps):
    total = 11
    cl = Cluster(total, num_ps=num_ps, num_workers=3, mode="async", lr=1.0)
    try:
        chief = cl.client(0)
        finished = threading.Event()
        final = np.zeros(total, dtype=np.float32)
        box: dict = {}

        def wait() -> None:
            try:
                box["step"] = chief.wait_others(final, 20.0)
            except BaseException as exc:  # noqa: BLE001 - checked below
                box["error"] = exc
            finished.set()

        waiter = threading.Thread(target=wait)
        waiter.start()
        for w in (1, 2):
            c = cl.client(w)
            c.push(np.ones(total, dtype=np.float32))
            assert not finished.wait(0.3), "wait_others returned before every other worker was done"
            c.done()
            c.close()
        waiter.join(10)
        assert "error" not in box, box.get("error")
        assert box["step"] == 2
        np.testing.assert_allclose(final, cl.init - 2.0)  # both pushes applied with lr 1
        chief.done()
        chief.close()
        assert cl.join() == ["done"] * num_ps
    finally:
        cl.close()


def test_wait_others_times_out_naming_how_many_workers_finished():
    cl = Cluster(5, num_ps=1, num_workers=3, mode="async")
    try:
        chief, other = cl.client(0), cl.client(1)
        other.done()
        start = time.monotonic()
        with pytest.raises(errors.SparkgradTimeout, match="1 of 2 said done"):
            chief.wait_others(np.zeros(5, dtype=np.float32), 1.0)
        assert 1.0 * 0.9 <= time.monotonic() - start < 1.0 + 10  # it waited its timeout, then failed
        chief.close()
        other.close()
    finally:
        cl.close()


def _bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> nearest bf16 (ties to even), as float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("num_ps", [1, 3])
def test_bf16_compression_pushes_bf16_gradients_that_the_shards_widen_to_float32(num_ps):
    total, steps = 1001, 3
    cl = Cluster(total, num_ps, 2, "sync", lr=1.0)
    rng = np.random.default_rng(5)
    grads = [rng.standard_normal((steps, total)).astype(np.float32) for _ in range(2)]
    try:

        def worker(w: int):
            c = _core.PsClient(cl.addresses, cl.secret, total, w, 10.0, compression="bf16")
            params = np.empty(total, dtype=np.float32)
            out = [(c.push_pull(grads[w][k], params), params.copy()) for k in range(steps)]
            c.done()
            return out

        out = run_workers(worker, 2)
        assert all(isinstance(o, list) for o in out), out
        expect, exact = cl.init.copy(), cl.init.copy()
        for k in range(steps):
            expect -= (_bf16(grads[0][k]) + _bf16(grads[1][k])) / np.float32(2)
            exact -= (grads[0][k] + grads[1][k]) / np.float32(2)
            assert out[0][k][0] == out[1][k][0] == k + 1
            np.testing.assert_allclose(out[0][k][1], expect, rtol=0, atol=1e-6)
        # bf16 on the wire, not float32
        assert np.abs(out[0][-1][1] - exact).max() > 1e-4
        assert cl.join() == ["done"] * num_ps
    finally:
        cl.close()


def test_ps_compression_other_than_bf16_is_refused():
    cl = Cluster(8, 1, 1, "async")
    try:
        with pytest.raises(errors.InvalidArgumentError, match="bf16"):
            _core.PsClient(cl.addresses, cl.secret, 8, 0, 5.0, compression="fp16")
        c = _core.PsClient(cl.addresses, cl.secret, 8, 0, 5.0, compression=None)
        c.push(np.ones(8, np.float32))
        c.done()
    finally:
        cl.close()


# ---- protected frames (issue 15, part 2) ----

HEAD = 12  # frame header
TAG = 16
OP = 32  # ps op header
HELLO_FRAME = HEAD + SEQ + OP + TAG  # the first protected frame each way: HELLO and its reply


def _round_trip(security: str) -> tuple:
    """Pushes, pulls and optimizer state through two Adam shards of 40000 floats (several
    encryption blocks each) in one security mode."""
    total = 80_000
    cl = Cluster(total, 2, 2, "async", optimizer="adam", security=security)
    try:
        c = cl.client(0, security=security)
        rng = np.random.default_rng(7)
        params = np.empty(total, np.float32)
        steps = [c.push_pull(rng.standard_normal(total).astype(np.float32), params) for _ in range(3)]
        c16 = _core.PsClient(cl.addresses, cl.secret, total, 1, 10.0, compression="bf16", security=security)
        c16.push(np.full(total, 0.5, np.float32))
        c16.close()
        pulled = np.empty(total, np.float32)
        steps.append(c.pull(pulled))
        whole, step, opts = c.get_state()
        c.set_state(whole, step + 1, opts)
        assert c.pull(np.empty(total, np.float32)) == step + 1
        c.done()
        return steps, params, pulled, whole, [(o[0], o[1].copy()) for o in opts]
    finally:
        cl.close()


def test_round_trips_give_the_same_results_in_every_security_mode():
    none, auth, enc = (_round_trip(m) for m in ("none", "auth", "encrypt"))
    assert none[0] == [1, 2, 3, 4]
    for other in (auth, enc):
        assert other[0] == none[0]
        for a, b in zip(other[1:4], none[1:4], strict=True):
            np.testing.assert_array_equal(a, b)
        assert [o[0] for o in other[4]] == [o[0] for o in none[4]] == [4, 4]
        for (_, a), (_, b) in zip(other[4], none[4], strict=True):
            np.testing.assert_array_equal(a, b)
    assert _core.SECURITY_DEFAULT in ("auth", "encrypt")


def test_a_client_in_another_security_mode_is_refused_naming_both_modes():
    cl = Cluster(10, 1, 1, "async", security="auth")
    try:
        t0 = time.monotonic()
        with pytest.raises(errors.AuthError, match="security='auth'.*security='encrypt'"):
            cl.client(0, timeout=20.0, security="encrypt")
        assert time.monotonic() - t0 < 5
        with pytest.raises(ValueError, match="tls"):
            cl.client(0, security="tls")
        c = cl.client(0, security="auth")
        assert c.push(np.ones(10, np.float32)) == 1
    finally:
        cl.close()


@pytest.mark.parametrize(
    "security,where", [("auth", "gradient"), ("encrypt", "gradient"), ("auth", "op header"), ("encrypt", "op header")]
)
def test_a_gradient_altered_on_the_way_is_refused_and_never_applied(security, where):
    total = 1000
    cl = Cluster(total, 1, 2, "async", security=security)
    try:
        host, port = cl.addresses[0]
        # in the PUSH_PULL that follows HELLO: byte 100 of the gradient, or byte 5 of the op
        # header's wire format (which the shard checks before the tag: still named an alteration)
        at = OP + 100 if where == "gradient" else 5
        flip = HANDSHAKE_C2S + HELLO_FRAME + HEAD + SEQ + at
        with TamperRelay(host, port, direction="c2s", flip_at=flip) as relay:
            c = _core.PsClient([(relay.host, relay.port)], cl.secret, total, 0, 20.0, security=security)
            t0 = time.monotonic()
            with pytest.raises(errors.AuthError, match=r"ps frame 1 failed its integrity check") as ei:
                c.push_pull(np.ones(total, np.float32), np.empty(total, np.float32))
            assert time.monotonic() - t0 < 5
            assert f"{relay.host}:{relay.port}" in str(ei.value) and relay.flipped == 1
            with pytest.raises(errors.AuthError, match="unusable"):
                c.pull(np.empty(total, np.float32))
            c.close()
        params, step, _ = cl.servers[0].get_state()
        assert step == 0 and np.array_equal(params, cl.init)  # nothing of it was applied
        assert cl.servers[0].integrity_failures == 1
        fresh = cl.client(1, security=security)
        out = np.empty(total, np.float32)
        assert fresh.push_pull(np.ones(total, np.float32), out) == 1
        np.testing.assert_allclose(out, cl.init - np.float32(0.1), rtol=0, atol=1e-6)
    finally:
        cl.close()


@pytest.mark.parametrize("security", ["auth", "encrypt"])
def test_parameters_altered_on_the_way_back_fail_the_client_naming_the_shard(security):
    total = 1000
    cl = Cluster(total, 1, 2, "async", security=security)
    try:
        host, port = cl.addresses[0]
        # byte 40 of the parameters in the PULL reply that follows HELLO's
        flip = HANDSHAKE_S2C + HELLO_FRAME + HEAD + SEQ + OP + 40
        with TamperRelay(host, port, direction="s2c", flip_at=flip) as relay:
            c = _core.PsClient([(relay.host, relay.port)], cl.secret, total, 0, 20.0, security=security)
            t0 = time.monotonic()
            with pytest.raises(errors.AuthError) as ei:
                c.pull(np.empty(total, np.float32))
            assert time.monotonic() - t0 < 5
            msg = str(ei.value)
            assert f"ps shard 0: {relay.host}:{relay.port}: ps frame 1 failed its integrity check" in msg, msg
            assert relay.flipped == 1
            with pytest.raises(errors.AuthError, match="unusable"):
                c.push(np.ones(total, np.float32))
            c.close()
        assert cl.servers[0].integrity_failures == 0
        fresh = cl.client(1, security=security)
        got = np.empty(total, np.float32)
        assert fresh.pull(got) == 0
        np.testing.assert_array_equal(got, cl.init)
    finally:
        cl.close()


# ---- model state (PUT_STATE / MEAN_STATE): BatchNorm statistics averaged over the workers ----


@pytest.mark.parametrize("num_ps,security", [(1, "none"), (2, "auth"), (2, "encrypt")])
def test_model_state_mean_is_over_the_workers_and_a_put_replaces_the_workers_own(num_ps, security):
    cl = Cluster(30, num_ps, 3, "async", security=security)
    try:
        c = [cl.client(w, security=security) for w in range(3)]
        got = np.full(6, -7.0, np.float32)
        assert c[0].mean_state(got) == 0  # nothing put yet: left as it is
        np.testing.assert_array_equal(got, np.full(6, -7.0, np.float32))
        states = [np.arange(6, dtype=np.float32) * (w + 1) + 0.5 * w for w in range(3)]
        assert [c[w].put_state(states[w]) for w in (0, 1)] == [1, 2]
        assert c[2].mean_state(got) == 2  # a worker that put nothing reads the others' mean
        np.testing.assert_array_equal(got, (states[0] + states[1]) / 2)
        assert c[2].put_state(states[2]) == 3
        states[0] = np.full(6, 100.0, np.float32)
        assert c[0].put_state(states[0]) == 3  # replaces worker 0's own: still three workers
        assert c[1].mean_state(got) == 3
        np.testing.assert_allclose(got, np.mean(states, axis=0, dtype=np.float64), rtol=1e-6)
        for x in c:
            x.done()
        assert cl.join() == ["done"] * num_ps
    finally:
        cl.close()


def test_model_state_of_another_size_is_refused_naming_both_and_the_clients_stay_usable():
    cl = Cluster(10, 1, 2, "async")
    try:
        c0, c1 = cl.client(0), cl.client(1)
        assert c0.put_state(np.ones(4, np.float32)) == 1
        with pytest.raises(
            errors.ClusterError, match="worker 1 put 5 floats of model state, the workers before it put 4"
        ):
            c1.put_state(np.ones(5, np.float32))
        with pytest.raises(errors.ClusterError, match="mean of 3 floats of model state, the workers put 4"):
            c1.mean_state(np.empty(3, np.float32))
        got = np.empty(4, np.float32)
        assert c1.mean_state(got) == 1 and np.array_equal(got, np.ones(4, np.float32))
        assert c1.put_state(np.full(4, 3.0, np.float32)) == 2
        assert c0.mean_state(got) == 2 and np.array_equal(got, np.full(4, 2.0, np.float32))
        with pytest.raises(errors.InvalidArgumentError, match="1-D C-contiguous float32"):
            c0.put_state(np.ones(4, np.float64))
        with pytest.raises(errors.InvalidArgumentError, match="not 1-D|of 2 dimensions"):
            c0.put_state(np.ones((2, 2), np.float32))
        ro = np.ones(4, np.float32)
        ro.flags.writeable = False
        with pytest.raises(errors.InvalidArgumentError, match="writable"):
            c0.mean_state(ro)
    finally:
        cl.close()


def test_model_state_puts_from_many_threads_each_keep_their_last():
    workers, rounds, n = 6, 20, 1000
    cl = Cluster(10, 1, workers, "async")
    try:

        def worker(w: int) -> list[int]:
            c = cl.client(w)
            held = [c.put_state(np.full(n, float(w * rounds + r), np.float32)) for r in range(rounds)]
            c.close()
            return held

        held = run_workers(worker, workers)
        assert all(isinstance(h, list) and 1 <= min(h) and max(h) <= workers for h in held), held
        got = np.empty(n, np.float32)
        assert cl.client(0).mean_state(got) == workers
        # the mean of every worker's last put, w * rounds + rounds - 1
        np.testing.assert_array_equal(got, np.full(n, np.mean([w * rounds + rounds - 1 for w in range(workers)])))
    finally:
        cl.close()


def test_parameter_clients_average_their_model_state_through_two_encrypted_shards():
    total = 21
    cl = Cluster(total, 2, 2, "async", security="encrypt")
    try:
        nodes = [NodeInfo(i, "ps", i, host, port, os.getpid()) for i, (host, port) in enumerate(cl.addresses)]
        nodes += [NodeInfo(2 + w, "worker", w, "127.0.0.1", 1, os.getpid()) for w in range(2)]
        spec = cluster_spec(nodes)
        ctxs = [
            NodeContext(
                n.executor_id,
                n.role,
                n.index,
                spec,
                "file://",
                "/tmp",
                tuple(nodes),
                secret=cl.secret,
                security="encrypt",
            )
            for n in nodes[2:]
        ]
        with ParameterClient(ctxs[0], total, timeout=10.0) as chief, ParameterClient(ctxs[1], total, 10.0) as other:
            got = np.zeros(8, np.float32)
            assert chief.mean_state(got) == 0 and not got.any()
            assert chief.put_state(np.full(8, 1.0, np.float32)) == 1
            assert other.put_state(np.arange(8, dtype=np.float32)) == 2
            assert chief.mean_state(got) == 2
            np.testing.assert_array_equal(got, (1.0 + np.arange(8, dtype=np.float32)) / 2)
        assert cl.join() == ["done", "done"]
    finally:
        cl.close()


@pytest.mark.parametrize("security", ["auth", "encrypt"])
def test_a_model_state_altered_on_the_way_is_refused_and_never_kept(security):
    cl = Cluster(10, 1, 2, "async", security=security)
    try:
        host, port = cl.addresses[0]
        # byte 8 of the state in the PUT_STATE that follows HELLO
        flip = HANDSHAKE_C2S + HELLO_FRAME + HEAD + SEQ + OP + 8
        with TamperRelay(host, port, direction="c2s", flip_at=flip) as relay:
            c = _core.PsClient([(relay.host, relay.port)], cl.secret, 10, 0, 20.0, security=security)
            with pytest.raises(errors.AuthError, match=r"ps frame 1 failed its integrity check"):
                c.put_state(np.ones(4, np.float32))
            assert relay.flipped == 1
            c.close()
        assert cl.servers[0].integrity_failures == 1
        fresh = cl.client(1, security=security)
        assert fresh.mean_state(np.empty(4, np.float32)) == 0  # nothing of it was kept
    finally:
        cl.close()
