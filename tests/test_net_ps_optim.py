"""Optimizer state on the parameter servers: the C optimizers of nn_optim.h
applied per shard, compared with sparkgrad.nn.optimizers run locally on the
same gradients; optimizer state in get_state/set_state and across shards."""

from __future__ import annotations

import numpy as np
import pytest
from sparkgrad import _core, errors
from sparkgrad.nn import optimizers
from test_net_ps import Cluster, run_workers

pytestmark = pytest.mark.timeout(60)

TOTAL = 101  # odd: shards of different sizes


def grads_for(worker: int, step: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * worker + step)
    return rng.standard_normal(TOTAL).astype(np.float32)


def local_reference(opt: optimizers.Optimizer, init: np.ndarray, grads: list[np.ndarray]) -> np.ndarray:
    params = init.copy()
    for g in grads:
        opt.apply(params, g)
    return params


@pytest.mark.parametrize("num_ps", [1, 2])
def test_async_adam_on_the_ps_matches_adam_applied_locally(num_ps):
    steps = 12
    cl = Cluster(TOTAL, num_ps, 1, "async", optimizer=optimizers.Adam(0.05))
    try:
        c = cl.client(0)
        got = np.empty(TOTAL, np.float32)
        for t in range(steps):
            assert c.push_pull(grads_for(0, t), got) == t + 1
        c.done()
        assert cl.join() == ["done"] * num_ps
    finally:
        cl.close()
    want = local_reference(optimizers.Adam(0.05), cl.init, [grads_for(0, t) for t in range(steps)])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # Adam really ran (not plain SGD with lr 0.05): the first step moves every value by ~lr
    sgd = cl.init - 0.05 * grads_for(0, 0)
    assert not np.allclose(local_reference(optimizers.Adam(0.05), cl.init, [grads_for(0, 0)]), sgd, atol=1e-3)
    for s in cl.servers:
        _, step, (opt_step, slots) = s.get_state()
        assert step == steps and opt_step == steps and slots.size == 2 * s.shard[1]


@pytest.mark.parametrize("num_ps", [1, 2])
def test_sync_mode_applies_the_average_with_the_optimizer(num_ps):
    steps = 5
    spec = {"kind": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}
    cl = Cluster(TOTAL, num_ps, 2, "sync", optimizer=spec)
    try:

        def work(w: int) -> np.ndarray:
            c = cl.client(w)
            p = np.empty(TOTAL, np.float32)
            for t in range(steps):
                assert c.push_pull(grads_for(w, t), p) == t + 1
            c.done()
            return p

        out = run_workers(work, 2)
        assert cl.join() == ["done"] * num_ps
    finally:
        cl.close()
    for r in out:
        assert isinstance(r, np.ndarray), r
    avg = [(grads_for(0, t) + grads_for(1, t)) * np.float32(0.5) for t in range(steps)]
    ref = optimizers.SGD(0.1, momentum=0.9, nesterov=True, weight_decay=0.01)
    want = local_reference(ref, cl.init, avg)
    np.testing.assert_allclose(out[0], want, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(out[0], out[1])


def test_state_round_trip_across_shards_resumes_exactly():
    """A checkpoint by the chief (client.get_state) restored into fresh ps shards
    continues exactly as the uninterrupted run."""
    opt = optimizers.RMSprop(0.01, momentum=0.5, centered=True)
    first, second = 4, 3
    cl = Cluster(TOTAL, 2, 1, "async", optimizer=opt)
    try:
        c = cl.client(0)
        p = np.empty(TOTAL, np.float32)
        for t in range(first):
            c.push_pull(grads_for(0, t), p)
        params, step, opt_state = c.get_state()
        np.testing.assert_array_equal(params, p)
        assert step == first and len(opt_state) == 2
        for i, (opt_step, slots) in enumerate(opt_state):
            assert opt_step == first and slots.dtype == np.float32
            assert slots.size == 3 * cl.servers[i].shard[1]  # square avg, grad avg, momentum
            assert np.any(slots != 0)
        c.done()
        cl.join()
    finally:
        cl.close()

    cl2 = Cluster(TOTAL, 2, 1, "async", optimizer=opt, init=False)
    try:
        c = cl2.client(0)
        c.set_state(params, step, opt_state)
        after = c.get_state()
        np.testing.assert_array_equal(after[0], params)
        for (s1, a1), (s2, a2) in zip(opt_state, after[2], strict=True):
            assert s1 == s2 and np.array_equal(a1, a2)
        for t in range(first, first + second):
            assert c.push_pull(grads_for(0, t), p) == t + 1
        c.done()
        cl2.join()
    finally:
        cl2.close()
    want = local_reference(
        optimizers.RMSprop(0.01, momentum=0.5, centered=True), cl.init, [grads_for(0, t) for t in range(first + second)]
    )
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-6)


def test_server_state_round_trip_and_mismatches_are_refused():
    cl = Cluster(TOTAL, 1, 1, "async", optimizer="adam")  # Keras defaults by name
    try:
        c = cl.client(0)
        c.push(grads_for(0, 0))
        s = cl.servers[0]
        params, step, (opt_step, slots) = s.get_state()
        assert step == 1 and opt_step == 1 and slots.size == 2 * TOTAL
        s.set_state(params + 1, 7, (3, slots * 2))
        p2, step2, (o2, slots2) = s.get_state()
        assert step2 == 7 and o2 == 3 and np.array_equal(p2, params + 1) and np.array_equal(slots2, slots * 2)
        s.set_state(params, 8)  # None: the optimizer stays as it is
        assert s.get_state()[2][0] == 3
        with pytest.raises(errors.InvalidArgumentError, match="optimizer state has 5 floats"):
            s.set_state(params, 9, (1, np.zeros(5, np.float32)))
        with pytest.raises(errors.InvalidArgumentError, match="optimizer state has 5 floats"):
            c.set_state(params, 9, [(1, np.zeros(5, np.float32))])
        with pytest.raises(errors.InvalidArgumentError, match="2 entries"):
            c.set_state(params, 9, [None, None])
        assert c.pull(np.empty(TOTAL, np.float32)) == 8  # refused requests changed nothing
        c.done()
        cl.join()
    finally:
        cl.close()

    plain = Cluster(TOTAL, 1, 1, "async")
    try:
        c = plain.client(0)
        with pytest.raises(errors.InvalidArgumentError, match="has no optimizer"):
            c.set_state(plain.init, 1, [(1, np.zeros(0, np.float32))])
        c.done()
        plain.join()
    finally:
        plain.close()


def test_sgd_schedule_step_travels_with_the_state():
    """SGD without momentum keeps no slots, but its step drives the schedule."""
    opt = optimizers.SGD(0.1, schedule="step", step_size=2, gamma=0.5)
    cl = Cluster(TOTAL, 2, 1, "async", optimizer=opt)
    try:
        c = cl.client(0)
        p = np.empty(TOTAL, np.float32)
        for t in range(3):
            c.push_pull(grads_for(0, t), p)
        params, step, opt_state = c.get_state()
        assert [(s, a.size) for s, a in opt_state] == [(3, 0), (3, 0)]
        c.set_state(params, step, [(0, np.zeros(0, np.float32))] * 2)
        assert [s for s, _ in c.get_state()[2]] == [0, 0]
        c.done()
        cl.join()
    finally:
        cl.close()


def test_optimizer_arguments_are_checked():
    lis = _core.Listener("127.0.0.1", 0)
    secret = b"s" * 32
    try:
        with pytest.raises(errors.InvalidArgumentError, match="not both"):
            _core.PsServer(lis, secret, 0, 10, 10, 1, lr=0.1, optimizer="adam")
        with pytest.raises(errors.InvalidArgumentError, match='needs a "kind"'):
            _core.PsServer(lis, secret, 0, 10, 10, 1, optimizer={"lr": 0.1})
        with pytest.raises(errors.InvalidArgumentError, match="optimizer must be"):
            _core.PsServer(lis, secret, 0, 10, 10, 1, optimizer=3)
        with pytest.raises(ValueError, match="unknown optimizer"):
            _core.PsServer(lis, secret, 0, 10, 10, 1, optimizer="adamax")
        # global-norm clipping needs the whole gradient: refused on one shard of several ...
        with pytest.raises(errors.InvalidArgumentError, match=r"clipping by global norm .* \[5, \+5\) of 10"):
            _core.PsServer(lis, secret, 5, 5, 10, 1, optimizer=optimizers.Adam(global_clipnorm=1.0))
        # ... accepted when the shard is everything, and by value on any shard
        _core.PsServer(lis, secret, 0, 10, 10, 1, optimizer=optimizers.Adam(global_clipnorm=1.0))
        _core.PsServer(lis, secret, 5, 5, 10, 1, optimizer=optimizers.Adam(clipvalue=0.5))
    finally:
        lis.close()


def test_global_norm_clipping_on_a_single_ps_matches_local():
    opt = optimizers.SGD(0.1, momentum=0.9, global_clipnorm=0.5)
    cl = Cluster(TOTAL, 1, 1, "async", optimizer=opt)
    try:
        c = cl.client(0)
        p = np.empty(TOTAL, np.float32)
        for t in range(4):
            c.push_pull(grads_for(0, t) * 10, p)
        c.done()
        cl.join()
    finally:
        cl.close()
    want = local_reference(
        optimizers.SGD(0.1, momentum=0.9, global_clipnorm=0.5), cl.init, [grads_for(0, t) * 10 for t in range(4)]
    )
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-6)


def test_async_applies_each_workers_gradient_individually():
    """Two workers in async mode, pushing in a known order: the ps steps Adam once per push."""
    cl = Cluster(TOTAL, 2, 2, "async", optimizer=optimizers.Adam(0.02))
    try:
        c0, c1 = cl.client(0), cl.client(1)
        order = [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2)]
        p = np.empty(TOTAL, np.float32)
        for n, (w, t) in enumerate(order, 1):
            assert (c0 if w == 0 else c1).push_pull(grads_for(w, t), p) == n
        c0.done()
        c1.done()
        assert cl.join() == ["done", "done"]
    finally:
        cl.close()
    want = local_reference(optimizers.Adam(0.02), cl.init, [grads_for(w, t) for w, t in order])
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-6)
