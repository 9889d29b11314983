"""Embedding rows on the parameter-server wire (csrc/net/ps.h PULL_ROWS, PUSH_PULL_ROWS): a model with a
table trained by 2 workers on 2 shards (the table split between them) reaches the same parameters with the
table sent as rows and sent dense (SGD, Adagrad), lazy Adam through one worker equals one process's lazy
Adam, async rows training lowers the loss, whole-row shard splits, byte counts, and the errors: rows of a
table a shard does not hold, a mismatched table layout, a peer of another frame version."""

from __future__ import annotations

import os
import socket
import struct
import threading

import numpy as np
import pytest
from sparkgrad import TFNode, _core, errors
from sparkgrad.nn import SGD, Adagrad, Adam, Dense, Embedding, Flatten, Input, Model
from test_net_ps import Cluster, run_workers
from test_nn_distributed import PsCluster

pytestmark = pytest.mark.timeout(60)

ROWS, DIM, K = 200, 4, 3


def table_model(opt, rows: int = ROWS, seed: int = 3) -> Model:
    """ids (K,) -> Embedding(rows, DIM) -> Flatten -> Dense(8, relu) -> Dense(2), mean squared error."""
    ids = Input(shape=(K,), dtype="int32", name="ids")
    h = Dense(8, activation="relu", name="hidden")(Flatten()(Embedding(rows, DIM, name="emb")(ids)))
    m = Model(ids, Dense(2, name="out")(h), seed=seed)
    m.compile(optimizer=opt, loss="mse")
    return m


def tables_of(model: Model) -> list[tuple[int, int, int]]:
    return [(off, rows, dim) for off, rows, dim, _ in model.touched_rows()]


def worker_data(w: int, n: int, rows: int = ROWS) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(10 + w)
    x = rng.integers(0, rows, size=(n, K)).astype(np.int32)
    y = np.stack([np.sin(x.sum(1) / 50.0), np.cos(x[:, 0] / 30.0)], 1).astype(np.float32)
    return x, y


class RowsCluster(Cluster):
    """num_ps shards of a model with tables, serving in threads on loopback."""

    def __init__(self, model: Model, num_ps: int, num_workers: int, mode: str, optimizer, tables=None):
        self.secret = os.urandom(32)
        self.total = model.num_params
        self.tables = tables_of(model) if tables is None else tables
        self.listeners = [_core.Listener("127.0.0.1", 0) for _ in range(num_ps)]
        self.ranges = [_core.ps_shard_range(self.total, num_ps, i, tables=self.tables) for i in range(num_ps)]
        self.servers = [
            _core.PsServer(
                lis,
                self.secret,
                off,
                cnt,
                self.total,
                num_workers,
                mode=mode,
                params=model.params[off : off + cnt].copy(),
                optimizer=optimizer,
                tables=self.tables,
            )
            for lis, (off, cnt) in zip(self.listeners, self.ranges, strict=True)
        ]
        self._start()

    def client(self, w: int, tables=None) -> _core.PsClient:
        addresses = [("127.0.0.1", lis.port) for lis in self.listeners]
        return _core.PsClient(
            addresses, self.secret, self.total, w, 10.0, tables=self.tables if tables is None else tables
        )

    def params(self) -> np.ndarray:
        return np.concatenate([s.get_state()[0] for s in self.servers])


def train(make_opt, sparse, num_ps: int = 2, workers: int = 2, steps: int = 8, mode: str = "sync", batches=None):
    """Each worker trains its own data (`batches` batches of 16 rows, again and again; None: `steps`) through
    the ps; (the shards' final parameters, bytes per worker, losses)."""
    batches = batches or steps
    ref = table_model(make_opt())
    cluster = RowsCluster(ref, num_ps, workers, mode, make_opt())
    try:

        def work(w):
            m = table_model(make_opt())
            x, y = worker_data(w, 16 * batches)
            client = cluster.client(w)
            hook = client.grad_hook(sparse=sparse[w] if isinstance(sparse, tuple) else sparse)
            losses = []
            for s in range(steps):
                loss, seen, _ = m.run_steps(
                    *m.engine_arrays(x, y)[:2], start=16 * (s % batches), batch_size=16, nsteps=1, hook=hook
                )
                losses.append(loss / seen)
            client.done()
            return client.bytes, losses

        out = run_workers(work, workers)
        for r in out:
            assert not isinstance(r, BaseException), r
        return cluster.params(), [r[0] for r in out], [r[1] for r in out]
    finally:
        cluster.close()


def test_shards_hold_whole_rows_and_cover_the_buffer():
    m = table_model(SGD(0.1))
    tables = tables_of(m)
    (off, rows, dim), total = tables[0], m.num_params
    for num_ps in (1, 2, 3, 7):
        ranges = [_core.ps_shard_range(total, num_ps, i, tables=tables) for i in range(num_ps)]
        assert ranges[0][0] == 0 and sum(c for _, c in ranges) == total
        for (o1, c1), (o2, _) in zip(ranges, ranges[1:], strict=False):
            assert o1 + c1 == o2
        for o, _ in ranges:
            assert not (off < o < off + rows * dim) or (o - off) % dim == 0
    # a split point inside a row moves to the row's start
    assert _core.ps_shard_range(12, 2, 0) == (0, 6)
    assert _core.ps_shard_range(12, 2, 0, tables=[(0, 3, 4)]) == (0, 4)
    assert _core.ps_shard_range(12, 2, 1, tables=[(0, 3, 4)]) == (4, 8)
    with pytest.raises(errors.InvalidArgumentError, match="holds no whole embedding row"):
        _core.ps_shard_range(20, 2, 0, tables=[(0, 1, 20)])


@pytest.mark.parametrize("make_opt", [lambda: SGD(0.2), lambda: Adagrad(0.3)], ids=["sgd", "adagrad"])
def test_sync_rows_and_dense_table_reach_the_same_parameters(make_opt):
    """2 workers, 2 shards (the 200-row table split between them), 8 synchronous steps: the table sent as
    the rows each step touched ends where the table sent whole does, to fp32 rounding, and every row the
    workers never touched keeps its initial value."""
    sparse, sparse_bytes, _ = train(make_opt, sparse=True)
    dense, dense_bytes, _ = train(make_opt, sparse=False)
    init = table_model(make_opt()).params
    assert not np.array_equal(sparse, init)
    np.testing.assert_allclose(sparse, dense, rtol=1e-6, atol=1e-7)
    off, rows, dim = tables_of(table_model(make_opt()))[0]
    touched = np.zeros(rows, bool)
    for w in range(2):
        touched[worker_data(w, 16 * 8)[0].reshape(-1)] = True
    table = sparse[off : off + rows * dim].reshape(rows, dim)
    np.testing.assert_array_equal(table[~touched], init[off : off + rows * dim].reshape(rows, dim)[~touched])
    assert sum(sum(b) for b in sparse_bytes) < sum(sum(b) for b in dense_bytes)


def test_a_sync_step_of_a_rows_push_and_a_dense_push_is_applied_as_the_dense_one():
    """One worker sends rows, the other the whole table: the shard applies that step densely, the same
    update (for SGD) as both sending the whole table."""
    mixed, _, _ = train(lambda: SGD(0.2), sparse=(True, False))
    dense, _, _ = train(lambda: SGD(0.2), sparse=False)
    np.testing.assert_allclose(mixed, dense, rtol=1e-6, atol=1e-7)


def test_lazy_adam_through_the_ps_equals_one_process():
    """One worker, 2 shards, Adam: the shards update the rows a step touched lazily (SparseAdam), as one
    process's fit updates them."""
    steps = 6
    params, _, _ = train(lambda: Adam(0.01), sparse=True, workers=1, steps=steps)
    local = table_model(Adam(0.01))
    x, y = worker_data(0, 16 * steps)
    local.run_steps(*local.engine_arrays(x, y)[:2], batch_size=16, nsteps=steps)
    np.testing.assert_allclose(params, local.params, rtol=1e-5, atol=1e-6)


def test_fit_through_the_ps_with_a_checkpoint_equals_local_lazy_adam(tmp_path):
    """fit(ps=TFNode.ps_client(ctx, model)) of a model with a table on serve_parameters(model): rows on the
    wire, the same parameters as fit without a ps (lazy Adam both), and a last checkpoint holding the
    final parameters and the servers' Adam moments."""
    x, y = worker_data(0, 64)
    local = table_model(Adam(0.01))
    local.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    with PsCluster(workers=1, model=table_model(Adam(0.01))) as cluster:
        worker = table_model(Adam(0.01))
        with TFNode.ps_client(cluster.workers[0], worker) as ps:
            assert ps.sparse_rows
            worker.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, ps=ps, checkpoint_dir=str(tmp_path))
        assert cluster.join() == "done"
    np.testing.assert_allclose(worker.params, local.params, rtol=1e-5, atol=1e-6)
    fresh = table_model(Adam(0.01))
    fresh.load(tmp_path / sorted(os.listdir(tmp_path))[-1])
    np.testing.assert_array_equal(fresh.params, worker.params)
    np.testing.assert_allclose(fresh.optimizer.get_state()[1], local.optimizer.get_state()[1], rtol=1e-5, atol=1e-6)


def test_async_rows_training_lowers_the_loss():
    """2 workers push rows as they go (each push applied on its own): the parameters the shards end with
    fit both workers' data clearly better than the initial ones."""
    final, _, _ = train(lambda: SGD(0.1), sparse=True, mode="async", steps=40, batches=2)
    m = table_model(SGD(0.1))
    data = [worker_data(w, 32) for w in range(2)]
    before = [m.evaluate(x, y, verbose=0) for x, y in data]
    m.params[:] = final
    after = [m.evaluate(x, y, verbose=0) for x, y in data]
    for b, a in zip(before, after, strict=True):
        assert a < 0.75 * b, (before, after)


def test_bf16_rows_push_trains_like_f32():
    ref = table_model(SGD(0.2))
    cluster = RowsCluster(ref, 2, 1, "sync", SGD(0.2))
    try:
        client = _core.PsClient(
            [("127.0.0.1", lis.port) for lis in cluster.listeners],
            cluster.secret,
            cluster.total,
            0,
            10.0,
            "bf16",
            tables=cluster.tables,
        )
        m = table_model(SGD(0.2))
        x, y = worker_data(0, 64)
        m.run_steps(*m.engine_arrays(x, y)[:2], batch_size=16, nsteps=4, hook=client.grad_hook())
        client.done()
        got = cluster.params()
    finally:
        cluster.close()
    local = table_model(SGD(0.2))
    local.run_steps(*local.engine_arrays(x, y)[:2], batch_size=16, nsteps=4)
    np.testing.assert_allclose(got, local.params, rtol=2e-2, atol=2e-3)


def test_pull_rows_reads_the_servers_rows_and_refuses_bad_ids():
    m = table_model(SGD(0.1))
    cluster = RowsCluster(m, 2, 1, "sync", SGD(0.1))
    try:
        client = cluster.client(0)
        off, rows, dim = cluster.tables[0]
        params = np.zeros(m.num_params, np.float32)
        ids = np.array([0, 3, 114, 115, 199], np.int32)  # both shards
        client.pull_rows(params, 0, ids)
        want = m.params[off : off + rows * dim].reshape(rows, dim)
        np.testing.assert_array_equal(params[off : off + rows * dim].reshape(rows, dim)[ids], want[ids])
        with pytest.raises(errors.InvalidArgumentError, match="row 200 of embedding table 0"):
            client.pull_rows(params, 0, np.array([5, 200], np.int32))
        with pytest.raises(errors.InvalidArgumentError, match="embedding table 1"):
            client.pull_rows(params, 1, np.array([0], np.int32))
        client.done()
    finally:
        cluster.close()


def test_a_worker_with_another_table_layout_is_refused_at_hello():
    m = table_model(SGD(0.1))
    cluster = RowsCluster(m, 1, 1, "sync", SGD(0.1))
    try:
        (off, rows, dim) = cluster.tables[0]
        with pytest.raises(errors.ClusterError, match=r"embedding table 0 at offset \d+ as \[100, 8\]"):
            cluster.client(0, tables=[(off, 100, 8)])
        with pytest.raises(errors.ClusterError, match="has 0 embedding tables, this ps was given 1"):
            cluster.client(0, tables=[])
    finally:
        cluster.close()


def test_a_peer_of_the_old_frame_version_gets_a_clear_error():
    """A ps of frame version 1 (before embedding rows) answering a client: the error names both versions."""
    lis = socket.socket()
    lis.bind(("127.0.0.1", 0))
    lis.listen(1)
    port = lis.getsockname()[1]

    def old_server():
        conn, _ = lis.accept()
        with conn:
            conn.settimeout(5)
            try:
                # magic, version 1, a frame type, flags, length 0: the challenge of a frame-version-1 sparkgrad
                conn.sendall(struct.pack("<IBBHI", 0x4E544753, 1, 1, 0, 0))
                conn.recv(4096)
            except OSError:
                pass

    t = threading.Thread(target=old_server)
    t.start()
    try:
        with pytest.raises(errors.ProtocolError, match="unsupported frame version 1 .*this build speaks 2"):
            _core.PsClient([("127.0.0.1", port)], os.urandom(32), 10, 0, 5.0, security="none")
    finally:
        t.join(10)
        lis.close()
