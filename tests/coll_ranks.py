"""Rank processes for tests/test_net_coll.py and bench/bench_allreduce.py.

`launch(n, scenario, ...)` starts n "spawn" processes; each binds a Listener
on 127.0.0.1, reports its port, receives every rank's address, forms a
_core.Communicator and runs `scenario(comm, *args)` (a function of this
module, by name). Results and errors come back through a multiprocessing
queue (a local pipe, never sparkgrad's sockets). Every wait is bounded and
every process is killed in `Ranks.close()`.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import time
import traceback

import numpy as np

# ---- the rank side ------------------------------------------------------------------


class _Sender:
    """A rank's own pipe to the parent. One pipe per rank, not one shared queue: a rank
    SIGKILLed while writing to a shared multiprocessing.Queue dies holding its lock and
    blocks every other rank's report."""

    def __init__(self, conn) -> None:
        self.conn = conn

    def put(self, item) -> None:
        self.conn.send(item)


def _rank_main(
    rank: int, n: int, secret: bytes, scenario: str, args: tuple, timeout: float, conn, inbox, security=None,
    shared_memory: bool = True, private_shm: bool = False,
) -> None:  # fmt: skip
    from sparkgrad import _core

    out = _Sender(conn)
    try:
        if private_shm:
            _private_dev_shm()
        lis = _core.Listener("127.0.0.1", 0)
        out.put(("port", rank, lis.port))
        addresses = inbox.get(timeout=60)
        comm = _core.Communicator(
            lis, secret, rank, addresses, timeout=timeout, security=security, shared_memory=shared_memory
        )
        value = globals()[scenario](comm, out, *args)
        out.put(("done", rank, value))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the test
        out.put(("error", rank, (type(exc).__name__, str(exc), time.monotonic(), traceback.format_exc())))


def _private_dev_shm() -> None:
    """This process moves to a mount namespace of its own with an empty tmpfs on /dev/shm, as a
    process in another container of the same host sees it (root only)."""
    import ctypes
    import subprocess

    clone_newns = 0x00020000
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(clone_newns) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", "/dev/shm"], check=True)


def shm_isolated(comm, out) -> dict:
    """An allreduce and the communicator's stats (a rank may live behind its own /dev/shm)."""
    a = np.full(100_003, comm.rank + 1, np.float32)
    comm.allreduce(a)
    return {"sum": float(a[0]), "shared_memory": comm.stats()["shared_memory"]}


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def _inputs(case: int, r: int, length: int, dtype) -> np.ndarray:
    rng = np.random.default_rng(1000 * case + r)
    if np.dtype(dtype).kind == "f":
        return rng.uniform(0.5, 1.5, length).astype(dtype)
    return rng.integers(-1000, 1000, length).astype(dtype)


def _expected(op: str, xs: list[np.ndarray]) -> np.ndarray:
    s = np.stack(xs)
    if op == "min":
        return s.min(axis=0)
    if op == "max":
        return s.max(axis=0)
    total = s.sum(axis=0, dtype=s.dtype)
    if op == "sum":
        return total
    if s.dtype.kind == "f":
        return total / s.dtype.type(len(xs))
    return (np.sign(total) * (np.abs(total) // len(xs))).astype(s.dtype)  # C truncation


def allreduce_cases(comm, out, cases: list) -> dict:
    """cases: (length, dtype name, op, compression); checks against NumPy here
    and returns a digest per case so the parent can compare ranks."""
    n, r = comm.size, comm.rank
    digests = {}
    for i, (length, dtype, op, comp) in enumerate(cases):
        xs = [_inputs(i, q, length, dtype) for q in range(n)]
        a = xs[r].copy()
        got = comm.allreduce(a, op=op, compression=comp)
        assert got is a
        want = _expected(op, xs)
        what = f"rank {r} of {n}: allreduce length {length} {dtype} {op} compression={comp}"
        if comp is not None:
            rtol = {"fp16": 1e-3, "bf16": 8e-3}[comp] * n
            np.testing.assert_allclose(a, want, rtol=rtol, err_msg=what)
        elif np.dtype(dtype).kind == "i" or op in ("min", "max"):
            np.testing.assert_array_equal(a, want, err_msg=what)
        else:
            rtol = 1e-6 if dtype == "float32" else 1e-13
            np.testing.assert_allclose(a, want, rtol=rtol, err_msg=what)
        digests[i] = _digest(a)
    return digests


def wire_rounding(comm, out) -> str:
    """x on rank 0 plus zeros elsewhere, summed with compression: every rank
    ends with x rounded to fp16 / bf16 (to nearest even), which NumPy gives
    for fp16 and the bit recipe below for bf16."""
    rng = np.random.default_rng(7)
    x = np.concatenate(
        [
            rng.standard_normal(5000).astype(np.float32) * np.float32(1000),
            rng.uniform(-6e-5, 6e-5, 2000).astype(np.float32),  # fp16 subnormals
            np.float32([65504, 65519, 65520, 1e6, -1e6, 0.0, -0.0, 1 + 2**-11, 1 + 3 * 2**-11, 2**-25, 2**-24]),
            np.float16(rng.standard_normal(1000)).astype(np.float32) + np.float32(2**-12),  # ties
        ]
    )
    u = x.view(np.uint32).astype(np.uint64)
    bf16 = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    with np.errstate(over="ignore"):
        f16 = x.astype(np.float16).astype(np.float32)
    for comp, want in (("fp16", f16 + np.float32(0)), ("bf16", bf16 + np.float32(0))):  # -0 + 0 = +0
        a = x.copy() if comm.rank == 0 else np.zeros_like(x)
        comm.allreduce(a, compression=comp)
        bad = np.flatnonzero(a.view(np.uint32) != want.view(np.uint32))
        assert bad.size == 0, f"{comp}: {x[bad[:5]]} -> {a[bad[:5]]}, expected {want[bad[:5]]}"
    return "ok"


def other_collectives(comm, out) -> dict:
    n, r = comm.size, comm.rank
    root = n - 1
    b = np.arange(1000, dtype=np.float64) * (r + 1)
    comm.broadcast(b, root=root)
    np.testing.assert_array_equal(b, np.arange(1000, dtype=np.float64) * (root + 1))
    one = np.array([r], np.int32)
    comm.broadcast(one, root=0)
    assert one[0] == 0
    # unequal rows, rank 0 contributes none
    mine = np.full((r, 3), r, np.int64)
    got = comm.allgather(mine)
    want = np.concatenate([np.full((q, 3), q, np.int64) for q in range(n)])
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    np.testing.assert_array_equal(got, want)
    flat = comm.allgather(np.arange(r + 1, dtype=np.float32))
    np.testing.assert_array_equal(flat, np.concatenate([np.arange(q + 1, dtype=np.float32) for q in range(n)]))
    blobs = comm.allgather_bytes(bytes([r]) * (r * 7))
    assert blobs == [bytes([q]) * (q * 7) for q in range(n)], blobs
    text = comm.broadcast_bytes(b"from the root" if r == root else None, root=root)
    assert text == b"from the root"
    empty = comm.broadcast_bytes(b"" if r == 0 else None, root=0)
    assert empty == b""
    comm.barrier()
    stats = comm.stats()
    return {"stats": stats}


def hook_checks(comm, out) -> str:
    from sparkgrad import _core

    n, r = comm.size, comm.rank
    total = 10_000
    g = [_inputs(50 + q, 0, total, np.float32) for q in range(n)]
    g2 = [_inputs(70 + q, 0, total, np.float32) for q in range(n)]
    params = np.ones(total, np.float32)

    # step(): the average over ranks, then the loop's own optimizer (rc 0)
    hook = comm.grad_hook()
    grads = g[r].copy()
    rc, step = _core._grad_hook_step(hook, params, grads, 5)
    assert (rc, step) == (0, 5), (rc, step)
    np.testing.assert_allclose(grads, np.mean(g, axis=0, dtype=np.float64), rtol=1e-6)
    assert np.all(params == 1)
    plain = grads.copy()

    # backward_passes_per_step=2: the first call accumulates (rc 1, params
    # untouched), the second reduces the mean of both passes
    hook2 = comm.grad_hook(backward_passes_per_step=2)
    for cycle in range(2):
        a = g[r].copy()
        rc, _ = _core._grad_hook_step(hook2, params, a)
        assert rc == 1 and np.all(params == 1), (cycle, rc)
        b = g2[r].copy()
        rc, _ = _core._grad_hook_step(hook2, params, b)
        assert rc == 0, (cycle, rc)
        want = np.mean([(x + y) / 2 for x, y in zip(g, g2, strict=True)], axis=0)
        np.testing.assert_allclose(b, want, rtol=1e-6, err_msg=f"cycle {cycle}")

    # buckets: ready() for layers from the end (one layer not reported), then step()
    layers = [(0, 1490), (1490, 10), (1500, 2500), (4000, 3000), (7000, 3000)]
    for bucket_bytes in (4096, 16 << 10, 1 << 20):
        hook3 = comm.grad_hook(bucket_bytes=bucket_bytes)
        for _ in range(2):
            c = g[r].copy()
            for off, cnt in reversed(layers):
                if off != 1490:
                    _core._grad_hook_ready(hook3, c, off, cnt)
            rc, _ = _core._grad_hook_step(hook3, params, c)
            assert rc == 0
            np.testing.assert_allclose(c, plain, rtol=1e-6, err_msg=f"bucket_bytes={bucket_bytes}")

    # buckets with accumulation
    hook4 = comm.grad_hook(backward_passes_per_step=2, bucket_bytes=8192)
    a = g[r].copy()
    for off, cnt in reversed(layers):
        _core._grad_hook_ready(hook4, a, off, cnt)
    assert _core._grad_hook_step(hook4, params, a)[0] == 1
    b = g2[r].copy()
    for off, cnt in reversed(layers):
        _core._grad_hook_ready(hook4, b, off, cnt)
    assert _core._grad_hook_step(hook4, params, b)[0] == 0
    np.testing.assert_allclose(b, np.mean([(x + y) / 2 for x, y in zip(g, g2, strict=True)], axis=0), rtol=1e-6)
    del hook, hook2, hook3, hook4
    return "ok"


# Two tables in a flat gradient buffer of 340 floats: A [50, 3] at 100 and B [20, 2] at 300,
# dense ranges around them ([0, 100), [250, 300)).
TABLES = ((100, 50, 3), (300, 20, 2))
TABLE_LAYERS = ((250, 50), (0, 100))  # the dense ranges, as ready() would see them (from the end)


def _table_grads(case: int, r: int, touched: list) -> np.ndarray:
    """Rank r's gradients of `case`: random dense ranges, random rows where it touched, zero elsewhere."""
    rng = np.random.default_rng(500 * case + r)
    g = np.zeros(340, np.float32)
    for off, cnt in TABLE_LAYERS:
        g[off : off + cnt] = rng.uniform(-1, 1, cnt)
    for (off, rows, dim), ids in zip(TABLES, touched, strict=True):
        view = g[off : off + rows * dim].reshape(rows, dim)
        view[ids] = rng.uniform(-1, 1, (len(ids), dim))
    return g


def hook_table_checks(comm, out) -> dict:
    """A sparse hook's step() on two tables (ids per rank below): the gradients equal NumPy's op over the
    ranks' dense buffers, each table's ids become the union, the comm's stats count which path each
    table took. Returns the digests and stats for the parent to compare across ranks."""
    from sparkgrad import _core

    n, r = comm.size, comm.rank
    assert n == 2
    params = np.zeros(340, np.float32)
    cases = [
        # (touched[rank][table], op, compression, bucket_bytes, expected paths (rows, dense))
        ([[[1, 5, 7], []], [[5, 9, 49], [0, 19]]], "average", None, 0, (2, 0)),  # rank 0: no row of B
        ([[[], [3]], [[], []]], "sum", None, 0, (2, 0)),  # nobody touched A
        ([[[0, 2], list(range(10))], [[2, 3], list(range(10, 20))]], "average", None, 64, (1, 1)),  # B whole
        ([[list(range(0, 50, 2)), [4]], [list(range(1, 50, 2)), [4]]], "max", None, 0, (1, 1)),  # A whole
        ([[[1, 5, 7], [2]], [[5, 9, 49], [2, 3]]], "average", "bf16", 64, (2, 0)),
    ]
    digests, paths = {}, {}
    for i, (touched, op, comp, bucket_bytes, expect) in enumerate(cases):
        hook = comm.grad_hook(op=op, compression=comp, bucket_bytes=bucket_bytes)
        xs = [_table_grads(i, q, touched[q]) for q in range(n)]
        want = _expected(op, xs)
        grads = xs[r].copy()
        for off, cnt in TABLE_LAYERS:
            _core._grad_hook_ready(hook, grads, off, cnt)
        tables = [
            (off, rows, dim, np.array(ids, np.int32)) for (off, rows, dim), ids in zip(TABLES, touched[r], strict=True)
        ]
        before = comm.stats()
        rc, step, ids = _core._grad_hook_step_rows(hook, params, grads, tables, 3)
        after = comm.stats()
        assert (rc, step) == (0, 3), (rc, step)
        for t, got in enumerate(ids):
            union = sorted(set(touched[0][t]) | set(touched[1][t]))
            np.testing.assert_array_equal(got, union, err_msg=f"case {i} table {t}")
        what = f"rank {r} case {i}: {op} compression={comp}"
        if comp is None:
            np.testing.assert_allclose(grads, want, rtol=1e-6, atol=1e-7, err_msg=what)
        else:
            # bf16 keeps 8 significant bits: each rank's values and the result rounded once (2^-9
            # relative each) leave the average of values in [-1, 1] within 2^-8 of float32's
            np.testing.assert_allclose(grads, want, rtol=0, atol=2**-8, err_msg=what)
            assert np.any(grads != want), what  # bf16 did round
        digests[i] = _digest(grads)
        paths[i] = tuple(after[k] - before[k] for k in ("tables_as_rows", "tables_dense"))
        assert paths[i] == expect, (what, paths[i], expect)
        assert after["table_bytes_sent"] > before["table_bytes_sent"], what
        del hook
    return {"digests": digests, "paths": paths}


def hook_table_mismatch(comm, out) -> list:
    """Rank 1's table A is [50, 4]: both ranks' step() fail naming the table and the ranks; the ring
    stays usable."""
    from sparkgrad import _core

    r = comm.rank
    hook = comm.grad_hook()
    dim = 3 + r
    grads, params = np.zeros(100 + 50 * dim, np.float32), np.zeros(100 + 50 * dim, np.float32)
    msgs = []
    try:
        _core._grad_hook_step_rows(hook, params, grads, [(100, 50, dim, np.array([1, 2], np.int32))])
    except Exception as exc:  # noqa: BLE001 - the message is checked by the test
        msgs.append(f"{type(exc).__name__}: {exc}")
    else:
        msgs.append("no error")
    ok = np.full(5, r + 1, np.int32)
    comm.allreduce(ok)
    assert np.all(ok == 3)
    return msgs


def hook_peer_leaves(comm, out) -> str:
    """Rank 1 closes its communicator; rank 0's bucketed step() must fail
    naming it (the error of the communication thread reaches step())."""
    from sparkgrad import _core

    if comm.rank == 1:
        comm.close()
        return "closed"
    hook = comm.grad_hook(bucket_bytes=4096)
    grads, params = np.ones(100_000, np.float32), np.ones(100_000, np.float32)
    for off in range(90_000, -1, -10_000):
        _core._grad_hook_ready(hook, grads, off, 10_000)
    try:
        _core._grad_hook_step(hook, params, grads)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def mismatch(comm, out) -> str:
    r = comm.rank
    msgs = []
    for make in (
        lambda: np.zeros(10 + r, np.float32),  # length
        lambda: np.zeros(10, np.float32 if r == 0 else np.float64),  # dtype
    ):
        try:
            comm.allreduce(make())
        except Exception as exc:  # noqa: BLE001 - the message is checked by the test
            msgs.append(f"{type(exc).__name__}: {exc}")
        else:
            msgs.append("no error")
    try:
        comm.allreduce(np.zeros(4, np.float32), op="sum" if r == 0 else "max")
    except Exception as exc:  # noqa: BLE001
        msgs.append(f"{type(exc).__name__}: {exc}")
    try:
        comm.allgather(np.zeros((2, 3 + r), np.float32))
    except Exception as exc:  # noqa: BLE001
        msgs.append(f"{type(exc).__name__}: {exc}")
    try:
        comm.broadcast(np.zeros(8 + r, np.uint8), root=1)
    except Exception as exc:  # noqa: BLE001
        msgs.append(f"{type(exc).__name__}: {exc}")
    ok = np.full(5, r + 1, np.int32)
    comm.allreduce(ok)  # the ring is still usable after a mismatch
    assert np.all(ok == sum(range(1, comm.size + 1)))
    comm.close()
    try:
        comm.barrier()
    except Exception as exc:  # noqa: BLE001
        msgs.append(f"{type(exc).__name__}: {exc}")
    return "\n".join(msgs)


def straggler(comm, out, late: int, delay: float) -> str:
    """Rank `late` enters the allreduce `delay` seconds after the others."""
    if comm.rank == late:
        time.sleep(delay)
    t0 = time.monotonic()
    try:
        comm.allreduce(np.ones(1000, np.float32))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return f"{type(exc).__name__} after {time.monotonic() - t0:.2f}s: {exc}"
    return "no error"


def loop_allreduce(comm, out, length: int) -> str:
    a = np.ones(length, np.float32)
    comm.allreduce(a)
    out.put(("started", comm.rank, None))
    for _ in range(100_000):
        comm.allreduce(a, op="average")
    return "finished"


def security_cases(comm, out) -> dict:
    """The same allreduces (checked against NumPy), broadcast and allgather in any
    security mode: digests the parent compares across ranks and modes."""
    big = 10**6 + 3
    cases = [(length, "float32", "sum", None) for length in (1, 7, 1000, big)]
    cases += [(length, "int64", "sum", None) for length in (7, big)]
    cases += [(length, "float32", "average", "bf16") for length in (1, 7, 1000, big)]
    digests = {f"allreduce {c}": d for c, d in zip(cases, allreduce_cases(comm, out, cases).values(), strict=True)}
    n, r = comm.size, comm.rank
    for length in (1, 7, 1000, big):
        b = _inputs(90, r, length, np.float64)
        comm.broadcast(b, root=n - 1)
        np.testing.assert_array_equal(b, _inputs(90, n - 1, length, np.float64))
        digests[f"broadcast {length}"] = _digest(b)
        got = comm.allgather(_inputs(91, r, length + r, np.int32))
        np.testing.assert_array_equal(got, np.concatenate([_inputs(91, q, length + q, np.int32) for q in range(n)]))
        digests[f"allgather {length}"] = _digest(got)
    text = comm.broadcast_bytes(b"x" * 70_000 if r == 0 else None, root=0)
    assert text == b"x" * 70_000
    comm.barrier()
    return digests


def fail_one_allreduce(comm, out, length: int) -> tuple:
    """One allreduce expected to fail: (class, message, seconds it took)."""
    a = np.ones(length, np.float32)
    t0 = time.monotonic()
    try:
        comm.allreduce(a)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return (type(exc).__name__, str(exc), time.monotonic() - t0)
    return ("no error", "", time.monotonic() - t0)


def bench_allreduce(comm, out, plan: list) -> dict:
    """plan: (bytes, iterations); returns bytes -> seconds per float32 allreduce."""
    res = {}
    for nbytes, iters in plan:
        a = np.ones(nbytes // 4, np.float32)
        comm.allreduce(a)
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            comm.allreduce(a)
        res[nbytes] = (time.perf_counter() - t0) / iters
    return res


def bench_latency(comm, out, nbytes: int, runs: int) -> list:
    a = np.ones(nbytes // 4, np.float32)
    for _ in range(20):
        comm.allreduce(a)
    times = []
    for _ in range(runs):
        comm.barrier()
        t0 = time.perf_counter()
        comm.allreduce(a)
        times.append(time.perf_counter() - t0)
    return times


def bench_embedding(comm, out, rows: int, dim: int, batch: int, steps: int, sparse_tables: bool) -> dict:
    """Fits ids (1,) -> Embedding(rows, dim) -> Dense(1) with SGD through DistributedOptimizer, `batch`
    uniform ids per rank and step: seconds per step and bytes this rank sent per step (all of it, and
    for the tables' ids and rows alone)."""
    from sparkgrad.nn import SGD, Dense, DistributedOptimizer, Embedding, Flatten, Input, Model

    ids = Input(shape=(1,), dtype="int32")
    m = Model(ids, Dense(1)(Flatten()(Embedding(rows, dim)(ids))), seed=1)
    m.compile(optimizer=DistributedOptimizer(SGD(0.1), communicator=comm, sparse_tables=sparse_tables), loss="mse")
    rng = np.random.default_rng(comm.rank)
    warm = 2
    x = rng.integers(0, rows, size=((steps + warm) * batch, 1)).astype(np.int32)
    y = rng.normal(size=((steps + warm) * batch, 1)).astype(np.float32)
    m.fit(x[: warm * batch], y[: warm * batch], batch_size=batch, epochs=1, shuffle=False, verbose=0)
    comm.barrier()
    before = comm.stats()
    t0 = time.perf_counter()
    m.fit(x[warm * batch :], y[warm * batch :], batch_size=batch, epochs=1, shuffle=False, verbose=0)
    seconds = time.perf_counter() - t0
    after = comm.stats()
    return {
        "step_s": seconds / steps,
        "bytes_per_step": (after["bytes_sent"] - before["bytes_sent"]) / steps,
        "table_bytes_per_step": (after["table_bytes_sent"] - before["table_bytes_sent"]) / steps,
        "as_rows": after["tables_as_rows"] - before["tables_as_rows"],
        "dense": after["tables_dense"] - before["tables_dense"],
    }


# ---- the parent side ----------------------------------------------------------------


class RankError(AssertionError):
    pass


class Ranks:
    """n rank processes running one scenario; use as a context manager."""

    def __init__(
        self,
        n: int,
        scenario: str,
        args: tuple = (),
        secrets=None,
        timeout: float = 30.0,
        security=None,
        relay_in_front_of: int | None = None,
        relay_kw: dict | None = None,
        shared_memory: bool | None = None,
        private_shm: tuple = (),
    ):
        """security: one mode for every rank or a list (None: _core's default).
        relay_in_front_of: a rank whose listener the others reach through a
        tests/tamper_relay.TamperRelay(**relay_kw) run here (self.relay).
        shared_memory: the Communicators' (None: on, but off with a relay, whose
        bytes would otherwise bypass it). private_shm: ranks that run behind a
        /dev/shm of their own (coll_ranks._private_dev_shm; root only)."""
        if shared_memory is None:
            shared_memory = relay_in_front_of is None
        ctx = mp.get_context("spawn")
        modes = security if isinstance(security, (list, tuple)) else [security] * n
        self.relay = None
        self._relay_at, self._relay_kw = relay_in_front_of, relay_kw or {}
        secret = os.urandom(32)
        self.secrets = secrets or [secret] * n
        self.n = n
        pipes = [ctx.Pipe(duplex=False) for _ in range(n)]
        self.readers = [reader for reader, _ in pipes]
        self._writers = [writer for _, writer in pipes]  # closed here once the ranks hold them
        self.inboxes = [ctx.Queue() for _ in range(n)]
        self.procs = [
            ctx.Process(
                target=_rank_main,
                args=(
                    r,
                    n,
                    self.secrets[r],
                    scenario,
                    args,
                    timeout,
                    pipes[r][1],
                    self.inboxes[r],
                    modes[r],
                    shared_memory,
                    r in private_shm,
                ),  # fmt: skip
                daemon=True,
            )
            for r in range(n)
        ]
        self.results: dict[int, tuple] = {}
        self.started: set[int] = set()
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        n = self.n
        for p in self.procs:
            p.start()
        for writer in self._writers:
            writer.close()
        ports = {}
        deadline = time.monotonic() + 120
        while len(ports) < n:
            kind, rank, value = self._next(deadline, "rank ports")
            if kind == "port":
                ports[rank] = value
            else:
                self._record(kind, rank, value)
        addresses = [("127.0.0.1", ports[r]) for r in range(n)]
        if self._relay_at is not None:
            from tamper_relay import TamperRelay

            self.relay = TamperRelay("127.0.0.1", ports[self._relay_at], **self._relay_kw).__enter__()
            addresses[self._relay_at] = (self.relay.host, self.relay.port)
        for box in self.inboxes:
            box.put(addresses)

    def _next(self, deadline: float, what: str):
        """The next message from any rank; a rank whose pipe closed (it died) is dropped."""
        while True:
            left = deadline - time.monotonic()
            if not self.readers:
                raise RankError(f"every rank process ended before {what}; results so far: {self.results}")
            if left <= 0:
                raise RankError(f"timed out waiting for {what}; results so far: {self.results}")
            for reader in mp.connection.wait(self.readers, timeout=left):
                try:
                    return reader.recv()
                except (EOFError, OSError):
                    self.readers.remove(reader)

    def _record(self, kind, rank, value):
        if kind == "started":
            self.started.add(rank)
        else:
            self.results[rank] = (kind, value)

    def wait_started(self, ranks, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not set(ranks) <= self.started:
            self._record(*self._next(deadline, f"ranks {sorted(ranks)} to start"))

    def collect(self, timeout: float = 60.0, ranks=None) -> dict[int, tuple]:
        ranks = set(range(self.n) if ranks is None else ranks)
        deadline = time.monotonic() + timeout
        while not ranks <= set(self.results):
            self._record(*self._next(deadline, f"results of ranks {sorted(ranks - set(self.results))}"))
        return {r: self.results[r] for r in ranks}

    def values(self, timeout: float = 60.0) -> list:
        res = self.collect(timeout)
        errors = [f"rank {r}: {v[3]}" for r, (k, v) in sorted(res.items()) if k == "error"]
        if errors:
            raise RankError("\n".join(errors))
        return [res[r][1] for r in range(self.n)]

    def kill(self, rank: int) -> float:
        os.kill(self.procs[rank].pid, signal.SIGKILL)
        return time.monotonic()

    def close(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        if self.relay is not None:
            self.relay.close()

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
