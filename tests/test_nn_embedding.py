"""Embedding (csrc/nn/nn_op_embedding.c) and the touched-row updates of its table (csrc/nn/nn_optim.c):
forward and backward against PyTorch's ``nn.Embedding`` (repeated ids, ids of shape (), (k,) and (t, k), a
shared layer), the table's gradient range holding the touched rows alone, sparse SGD and Adagrad steps
equal to the dense step of the same gradient, lazy momentum, lazy Adam against ``torch.optim.SparseAdam``,
folded plain SGD, a wide-and-deep model that learns a known structure, two allreduce ranks against one
process, weights, summary, saving and checkpoints, bf16, and the errors naming the input, row and column."""

from __future__ import annotations

import numpy as np
import pytest
from sparkgrad import _core
from sparkgrad.errors import InvalidArgumentError, ModelError
from sparkgrad.nn import (
    SGD,
    Adagrad,
    Adam,
    Concatenate,
    Dense,
    DistributedOptimizer,
    Embedding,
    Flatten,
    Input,
    Model,
    Sequential,
    get_num_threads,
    load_model,
    save_model,
    set_num_threads,
)
from test_nn_distributed import _fit_two_ranks, two_ranks

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the test extra installs it
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch (pip install -e '.[test]')")
pytestmark = pytest.mark.timeout(120)


def _ids_model(k=4, rows=50, dim=6, seed=1, dtype="int32"):
    """ids (k,) -> Embedding -> Flatten -> Dense(3), mean squared error."""
    ids = Input(shape=(k,), dtype=dtype, name="ids")
    out = Dense(3, name="out")(Flatten()(Embedding(rows, dim, name="emb")(ids)))
    m = Model(ids, out, seed=seed)
    m.compile(optimizer=SGD(0.1), loss="mse")
    return m


def _table(model, layer_name="emb"):
    t = next(t for t in model.param_table if model.layer_names[t.layer] == layer_name)
    return t


def _torch_forward(model, x, table, kernel, bias):
    e = F.embedding(torch.from_numpy(np.asarray(x, np.int64)), table)  # [B, k, D]
    return e.reshape(e.shape[0], -1) @ kernel + bias


@needs_torch
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_forward_and_backward_match_torch_embedding_with_repeated_ids(dtype):
    m = _ids_model(dtype=dtype)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 50, size=(16, 4)).astype(dtype)
    x[3] = [7, 7, 7, 2]  # repeats within a row and across rows add up in one row of the gradient
    x[9, 0] = 7
    y = rng.normal(size=(16, 3)).astype(np.float32)
    table, kernel, bias = (torch.tensor(w, requires_grad=True) for w in m.get_weights())
    z = _torch_forward(m, x, table, kernel, bias)
    np.testing.assert_allclose(m.predict(x), z.detach().numpy(), rtol=1e-5, atol=1e-6)
    F.mse_loss(z, torch.from_numpy(y)).backward()
    m.compute_gradients(x, y)
    t = _table(m)
    np.testing.assert_allclose(m.grads[t.offset : t.offset + t.size].reshape(t.shape), table.grad.numpy(), atol=1e-6)
    k = m.param_table[1]
    np.testing.assert_allclose(m.grads[k.offset : k.offset + k.size].reshape(k.shape), kernel.grad.numpy(), atol=1e-6)
    ((offset, rows, dim, ids),) = m.touched_rows()
    assert (offset, rows, dim) == (t.offset, 50, 6)
    np.testing.assert_array_equal(ids, np.unique(x))


@needs_torch
def test_ids_of_shape_empty_and_t_by_k_give_keras_shapes():
    """Input(shape=()) gives (None, D) rows; (t, k) ids give (None, t, k, D), stored (t, k, D)."""
    scalar = Input(shape=(), dtype="int64", name="user")
    m = Model(scalar, Dense(2)(Embedding(10, 3)(scalar)), seed=0)
    assert "(None, 3)" in m.summary(print_fn=None)
    x = np.array([4, 0, 9, 4], np.int64)
    table, kernel, bias = (torch.tensor(w) for w in m.get_weights())
    np.testing.assert_allclose(m.predict(x), (table[x] @ kernel + bias).numpy(), rtol=1e-5, atol=1e-6)

    seq = Input(shape=(2, 3), dtype="int32", name="seq")
    m2 = Model(seq, Dense(1)(Flatten()(Embedding(10, 4)(seq))), seed=0)
    assert m2._core.layer_shapes()[0][1] == (2, 3, 4)
    x2 = np.arange(12, dtype=np.int32).reshape(2, 2, 3) % 10
    table, kernel, bias = (torch.tensor(w) for w in m2.get_weights())
    ref = table[torch.from_numpy(x2.astype(np.int64))].reshape(2, -1) @ kernel + bias
    np.testing.assert_allclose(m2.predict(x2), ref.numpy(), rtol=1e-5, atol=1e-6)


def test_the_tables_gradient_holds_only_the_last_passes_rows():
    m = _ids_model()
    t = _table(m)
    y = np.ones((2, 3), np.float32)
    m.compute_gradients(np.array([[1, 2, 3, 4], [1, 1, 1, 1]], np.int32), y)
    m.compute_gradients(np.array([[10, 11, 12, 13], [14, 15, 16, 17]], np.int32), y)
    g = m.grads[t.offset : t.offset + t.size].reshape(t.shape)
    nonzero = np.flatnonzero(np.abs(g).sum(axis=1))
    np.testing.assert_array_equal(nonzero, np.arange(10, 18))
    np.testing.assert_array_equal(m.touched_rows()[0][3], np.arange(10, 18))


@pytest.mark.parametrize("rows", [300, 3_000_000])
def test_touched_rows_are_the_sorted_unique_ids_of_small_and_large_tables(rows):
    """A table of few rows for its batch collects its ids through a bitmap, a large one by radix sort."""
    m = _ids_model(k=6, rows=rows, dim=1)
    rng = np.random.default_rng(3)
    x = rng.integers(0, rows, size=(5, 6)).astype(np.int32)
    x[1] = x[0]  # repeats
    x[2, :2] = [0, rows - 1]
    for _ in range(2):  # the second pass reuses the buffers (the bitmap left clear)
        m.compute_gradients(x, np.ones((5, 3), np.float32))
        ((_, _, _, ids),) = m.touched_rows()
        np.testing.assert_array_equal(ids, np.unique(x))
        x = (x + 1) % rows


def _sparse_problem(seed, rows=40, dim=5, extra=7):
    """params of [extra dense | table rows x dim | extra dense], and gradients zero outside some rows."""
    rng = np.random.default_rng(seed)
    n = 2 * extra + rows * dim
    p = rng.normal(size=n).astype(np.float32)
    ids = np.unique(rng.integers(0, rows, size=6)).astype(np.int32)
    g = np.zeros(n, np.float32)
    g[:extra] = rng.normal(size=extra)
    g[-extra:] = rng.normal(size=extra)
    table = g[extra : extra + rows * dim].reshape(rows, dim)
    table[ids] = rng.normal(size=(ids.size, dim))
    return p, g, [(extra, rows, dim, ids)]


@pytest.mark.parametrize(
    "make",
    [
        lambda: SGD(0.1),
        lambda: Adagrad(0.1),
        lambda: SGD(0.1, global_clipnorm=0.5),
        lambda: SGD(0.1, clipnorm=0.5),
        lambda: Adagrad(0.1, clipvalue=0.3),
    ],
)
def test_sparse_sgd_and_adagrad_steps_equal_the_dense_step_of_the_same_gradient(make):
    sparse, dense = make(), make()
    assert sparse.sparse_rows
    p_sparse, _, _ = _sparse_problem(0)
    p_dense = p_sparse.copy()
    for step in range(4):
        _, g, rows = _sparse_problem(step + 10)
        sparse.bind(p_sparse.size, [7, 200, 7])
        dense.bind(p_dense.size, [7, 200, 7])
        sparse.apply(p_sparse, g, rows=rows)
        dense.apply(p_dense, g)
        np.testing.assert_allclose(p_sparse, p_dense, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(sparse.get_state()[1], dense.get_state()[1], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("nesterov", [False, True])
def test_sparse_momentum_is_lazy_untouched_rows_keep_their_velocity_unapplied(nesterov):
    """SGD momentum on a table updates the touched rows alone (TensorFlow's sparse momentum): against NumPy."""
    opt = SGD(0.1, momentum=0.9, nesterov=nesterov)
    p, _, _ = _sparse_problem(0)
    ref, v = p.astype(np.float64), np.zeros(p.size)
    for step in range(4):
        _, g, rows = _sparse_problem(step + 10)
        opt.apply(p, g, rows=rows)
        off, nrows, dim, ids = rows[0]
        live = np.ones(p.size, bool)
        live[off : off + nrows * dim] = False
        for i in ids:
            live[off + i * dim : off + (i + 1) * dim] = True
        v[live] = 0.9 * v[live] + g[live]
        ref[live] -= 0.1 * (g[live] + 0.9 * v[live] if nesterov else v[live])
        np.testing.assert_allclose(p, ref, rtol=1e-5, atol=1e-6)


def test_dense_only_optimizers_and_weight_decay_update_tables_densely():
    from sparkgrad.nn import RMSprop

    for make in (lambda: RMSprop(0.01), lambda: SGD(0.1, weight_decay=0.01), lambda: Adam(0.01, weight_decay=0.1)):
        a, b = make(), make()
        assert not a.sparse_rows
        p, g, rows = _sparse_problem(3)
        q = p.copy()
        a.apply(p, g, rows=rows)
        b.apply(q, g)
        np.testing.assert_array_equal(p, q)


def test_bad_rows_are_refused_by_the_optimizer():
    p, g, ((off, n, dim, ids),) = _sparse_problem(0)
    with pytest.raises(InvalidArgumentError, match="out of order"):
        SGD(0.1).apply(p, g, rows=[(off, n, dim, ids[::-1].copy())])
    with pytest.raises(InvalidArgumentError, match="outside"):
        SGD(0.1).apply(p, g, rows=[(off, n + 100, dim, ids)])


@needs_torch
def test_lazy_adam_equals_torch_sparse_adam_after_several_steps():
    k, rows, dim = 3, 30, 4
    ids_in = Input(shape=(k,), dtype="int64", name="ids")
    m = Model(ids_in, Dense(1)(Flatten()(Embedding(rows, dim, name="emb")(ids_in))), seed=2)
    m.compile(optimizer=Adam(0.05, epsilon=1e-6), loss="mse")
    emb = torch.nn.Embedding(rows, dim, sparse=True)
    lin = torch.nn.Linear(k * dim, 1)
    table, kernel, bias = m.get_weights()
    with torch.no_grad():
        emb.weight.copy_(torch.from_numpy(table))
        lin.weight.copy_(torch.from_numpy(kernel.T))
        lin.bias.copy_(torch.from_numpy(bias))
    sparse_adam = torch.optim.SparseAdam(emb.parameters(), lr=0.05, eps=1e-6)
    adam = torch.optim.Adam(lin.parameters(), lr=0.05, eps=1e-6)
    rng = np.random.default_rng(5)
    for _ in range(6):
        x = rng.integers(0, 12, size=(8, k))  # rows 12.. never touched: their moments stay zero
        y = rng.normal(size=(8, 1)).astype(np.float32)
        m.train_on_batch(x, y)
        sparse_adam.zero_grad()
        adam.zero_grad()
        F.mse_loss(lin(emb(torch.from_numpy(x)).reshape(8, -1)), torch.from_numpy(y)).backward()
        sparse_adam.step()
        adam.step()
    np.testing.assert_allclose(m.get_weights()[0], emb.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.get_weights()[1], lin.weight.detach().numpy().T, rtol=1e-5, atol=1e-6)
    moments = m.optimizer.get_state()[1][: m.num_params]
    t = _table(m)
    assert not moments[t.offset + 12 * dim : t.offset + t.size].any()


def test_folded_plain_sgd_equals_the_optimizer_step_on_touched_rows():
    """Plain SGD folds into the backward (Embedding and Dense); a clipping SGD takes the optimizer's
    sparse path; with a clip that never bites both give the same parameters."""
    rng = np.random.default_rng(1)
    x = rng.integers(0, 50, size=(96, 4)).astype(np.int32)
    y = rng.normal(size=(96, 3)).astype(np.float32)
    a, b = _ids_model(), _ids_model()
    b.compile(optimizer=SGD(0.1, clipvalue=1e9), loss="mse")
    a.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    b.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(a.params, b.params, rtol=1e-6, atol=1e-7)


def test_adagrad_training_equals_dense_steps_of_the_same_gradients():
    rng = np.random.default_rng(2)
    x = rng.integers(0, 50, size=(64, 4)).astype(np.int32)
    y = rng.normal(size=(64, 3)).astype(np.float32)
    a, b = _ids_model(), _ids_model()
    a.compile(optimizer=Adagrad(0.1), loss="mse")
    dense = Adagrad(0.1)
    for s in range(0, 64, 16):
        a.train_on_batch(x[s : s + 16], y[s : s + 16])
        b.compute_gradients(x[s : s + 16], y[s : s + 16])
        dense.apply(b.params, b.grads)
    np.testing.assert_allclose(a.params, b.params, rtol=1e-6, atol=1e-7)


@needs_torch
def test_a_shared_embedding_sums_the_gradients_of_both_calls():
    user, item = Input(shape=(2,), dtype="int32", name="user"), Input(shape=(2,), dtype="int32", name="item")
    emb = Embedding(20, 3, name="shared")
    z = Concatenate()([Flatten()(emb(user)), Flatten()(emb(item))])
    m = Model([user, item], Dense(1)(z), seed=4)
    m.compile(optimizer=SGD(0.1), loss="mse")
    assert len(m.param_table) == 3  # one table
    xu = np.array([[1, 2], [3, 1]], np.int32)
    xi = np.array([[2, 9], [9, 9]], np.int32)
    y = np.array([[1.0], [-1.0]], np.float32)
    table, kernel, bias = (torch.tensor(w, requires_grad=True) for w in m.get_weights())
    both = [table[torch.from_numpy(v).long()].reshape(2, -1) for v in (xu, xi)]
    zt = torch.cat(both, 1)
    F.mse_loss(zt @ kernel + bias, torch.from_numpy(y)).backward()
    m.compute_gradients({"user": xu, "item": xi}, y)
    t = m.param_table[0]
    np.testing.assert_allclose(m.grads[t.offset : t.offset + t.size].reshape(t.shape), table.grad.numpy(), atol=1e-6)
    assert len(m.touched_rows()) == 1
    np.testing.assert_array_equal(m.touched_rows()[0][3], [1, 2, 3, 9])
    before = m.params.copy()
    m.train_on_batch({"user": xu, "item": xi}, y)
    moved = np.flatnonzero(np.abs(m.params - before)[t.offset : t.offset + t.size].reshape(t.shape).sum(1))
    np.testing.assert_array_equal(moved, [1, 2, 3, 9])


def _click_data(n, seed):
    """Three id columns and four numeric ones; the label is known: a per-id score plus a numeric one."""
    rng = np.random.default_rng(seed)
    cards = (1000, 50, 7)
    ids = [rng.integers(0, c, size=(n, 1)).astype(np.int64) for c in cards]
    num = rng.normal(size=(n, 4)).astype(np.float32)
    score_rng = np.random.default_rng(99)
    scores = [score_rng.normal(size=c) for c in cards]
    logit = sum(s[i[:, 0]] for s, i in zip(scores, ids, strict=True)) + num @ np.array([1.0, -1.0, 0.5, 0.0])
    return ids, num, (logit > 0).astype(np.float32)


def test_a_small_wide_and_deep_model_learns_a_known_structure():
    cards = (1000, 50, 7)
    cats = [Input(shape=(1,), dtype="int64", name=f"c{j}") for j in range(3)]
    num = Input(shape=(4,), name="num")
    embedded = [Flatten()(Embedding(c, 8)(t)) for c, t in zip(cards, cats, strict=True)]
    h = Dense(32, activation="relu")(Concatenate()([*embedded, num]))
    m = Model([*cats, num], Dense(1, activation="sigmoid")(h), seed=3)
    m.compile(optimizer=Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
    ids, x, y = _click_data(12000, seed=1)
    m.fit([*ids, x], y, batch_size=64, epochs=6, verbose=0)
    tids, tx, ty = _click_data(3000, seed=2)
    _, acc = m.evaluate([*tids, tx], ty, verbose=0)
    assert acc > 0.85, acc


@pytest.mark.skipif(not hasattr(_core, "Communicator"), reason="this build has no _core.Communicator")
@pytest.mark.parametrize("make_opt", [lambda: SGD(0.1), lambda: Adagrad(0.1)])
def test_two_allreduce_ranks_equal_one_process_of_the_whole_batch(make_opt):
    """The ring averages the table's gradient over the rows either rank touched (here every step touches all
    40 rows, so the hook reduces the table densely), and the optimizer updates those rows."""
    steps = 6
    rng = np.random.default_rng(3)
    x = rng.integers(0, 40, size=(steps * 128, 3)).astype(np.int32)
    y = rng.normal(size=(steps * 128, 2)).astype(np.float32)

    def model(opt):
        ids = Input(shape=(3,), dtype="int32", name="ids")
        m = Model(ids, Dense(2)(Flatten()(Embedding(40, 4)(ids))), seed=7)
        m.compile(optimizer=opt, loss="mse")
        return m

    whole = model(make_opt())
    whole.fit(x, y, batch_size=128, epochs=1, shuffle=False, verbose=0)
    results = _fit_two_ranks(lambda comm: model(DistributedOptimizer(make_opt(), communicator=comm)), x, y, steps)
    for r in results:
        assert isinstance(r, Model), r
        np.testing.assert_allclose(r.params, whole.params, rtol=1e-5, atol=1e-6)


# ---- tables reduced as rows across ranks (csrc/net/coll_rows.c) ----------------------------------

needs_comm = pytest.mark.skipif(not hasattr(_core, "Communicator"), reason="this build has no _core.Communicator")


def _two_table_data(steps, seed=5):
    """ids for a 1000-row table (rank 0's rows of each 128-row batch draw from [0, 600), rank 1's from
    [400, 1000): rows both touch and rows only one does), ids for a 5-row table (every row touched each
    step), 4 numbers, 2 targets."""
    rng = np.random.default_rng(seed)
    n = steps * 128
    rank = (np.arange(n) // 64) % 2
    big = (rng.integers(0, 600, size=(n, 3)) + 400 * rank[:, None]).astype(np.int32)
    small = rng.integers(0, 5, size=(n, 2)).astype(np.int32)
    num = rng.normal(size=(n, 4)).astype(np.float32)
    y = rng.normal(size=(n, 2)).astype(np.float32)
    return [big, small, num], y


def _two_table_model(opt, seed=7):
    big, small = Input(shape=(3,), dtype="int32", name="big"), Input(shape=(2,), dtype="int32", name="small")
    num = Input(shape=(4,), name="num")
    h = Concatenate()([Flatten()(Embedding(1000, 4)(big)), Flatten()(Embedding(5, 3)(small)), num])
    m = Model([big, small, num], Dense(2)(Dense(8, activation="relu")(h)), seed=seed)
    m.compile(optimizer=opt, loss="mse")
    return m


def _fit_ranks_with_stats(make_opt, steps, **dist):
    """Both ranks fit their 64 rows of each 128-row batch through DistributedOptimizer(make_opt(), **dist);
    each rank's (model, the table counters of its communicator's stats)."""
    x, y = _two_table_data(steps)

    def work(r, comm):
        m = _two_table_model(DistributedOptimizer(make_opt(), communicator=comm, **dist))
        rows = np.arange(steps * 128).reshape(steps, 2, 64)[:, r].reshape(-1)
        m.fit([a[rows] for a in x], y[rows], batch_size=64, epochs=1, shuffle=False, verbose=0)
        s = comm.stats()
        return m, {k: s[k] for k in ("tables_as_rows", "tables_dense", "table_bytes_sent")}

    results = two_ranks(work)
    for res in results:
        assert isinstance(res, tuple), res
    np.testing.assert_array_equal(results[0][0].params, results[1][0].params)  # ranks agree exactly
    if dist.get("sparse_tables", True):
        # after fit (its hook gone) each rank's tables list the last step's union over both ranks, in the
        # model's own memory
        last = slice((steps - 1) * 128, steps * 128)
        for m, _ in results:
            touched = m.touched_rows()
            np.testing.assert_array_equal(touched[0][3], np.unique(x[0][last]))
            np.testing.assert_array_equal(touched[1][3], np.unique(x[1][last]))
    return results


@needs_comm
@pytest.mark.parametrize("bucket_bytes", [0, 256])
@pytest.mark.parametrize("make_opt", [lambda: SGD(0.1), lambda: Adagrad(0.1)], ids=["sgd", "adagrad"])
def test_tables_reduced_as_rows_train_as_tables_reduced_densely(make_opt, bucket_bytes):
    """SGD and Adagrad update a row with a zero gradient by nothing, so the lazy update of the union's rows
    equals the dense update of the whole table: the rows hook (the 1000-row table as rows, the 5-row one
    touched whole, so dense) ends where sparse_tables=False does, and the counters say which path ran."""
    steps = 6
    rows = _fit_ranks_with_stats(make_opt, steps, bucket_bytes=bucket_bytes)
    dense = _fit_ranks_with_stats(make_opt, steps, bucket_bytes=bucket_bytes, sparse_tables=False)
    for (m, stats), (d, dstats) in zip(rows, dense, strict=True):
        assert m.step == steps
        np.testing.assert_allclose(m.params, d.params, rtol=1e-5, atol=1e-6)
        assert stats["tables_as_rows"] == steps and stats["tables_dense"] == steps, stats
        assert dstats == {"tables_as_rows": 0, "tables_dense": 0, "table_bytes_sent": 0}, dstats


@needs_comm
def test_lazy_adam_on_two_ranks_equals_one_process_of_the_global_batch():
    """Adam's untouched rows keep their moments unapplied (lazy, as torch.optim.SparseAdam): two ranks of 64
    rows, the union of their rows updated with the average gradient, end where one process fitting the
    128-row batches does; a dense reduction (Adam moving every row) does not."""
    steps = 6
    x, y = _two_table_data(steps)
    whole = _two_table_model(Adam(0.01))
    whole.fit(x, y, batch_size=128, epochs=1, shuffle=False, verbose=0)
    for m, stats in _fit_ranks_with_stats(lambda: Adam(0.01), steps):
        np.testing.assert_allclose(m.params, whole.params, rtol=1e-5, atol=1e-6)
        assert stats["tables_as_rows"] == steps and stats["tables_dense"] == steps, stats
    m, _ = _fit_ranks_with_stats(lambda: Adam(0.01), steps, sparse_tables=False)[0]
    assert not np.allclose(m.params, whole.params, rtol=1e-5, atol=1e-6)


@needs_comm
def test_a_bf16_wire_keeps_rows_training_close_to_float32():
    """compression="bf16" rounds the packed rows as it rounds dense gradients: after 6 SGD steps the
    parameters stay within 1e-3 of the float32 reduction's (values of order 0.1 to 1)."""
    steps = 6
    exact = _fit_ranks_with_stats(lambda: SGD(0.1), steps)[0][0]
    (m, stats), _ = _fit_ranks_with_stats(lambda: SGD(0.1), steps, compression="bf16")
    assert stats["tables_as_rows"] == steps, stats
    np.testing.assert_allclose(m.params, exact.params, rtol=0, atol=1e-3)
    assert not np.array_equal(m.params, exact.params)


def test_weights_summary_saving_and_checkpoints_carry_the_table(tmp_path):
    m = _ids_model()
    table = m.get_weights()[0]
    assert table.shape == (50, 6) and _table(m).name == "embeddings"
    assert np.abs(table).max() <= 0.05 and table.std() > 0.02  # Keras' uniform(-0.05, 0.05)
    text = m.summary(print_fn=None)
    assert "emb (Embedding)" in text and "(None, 4, 6)" in text and "300" in text
    rng = np.random.default_rng(4)
    x = rng.integers(0, 50, size=(64, 4)).astype(np.int32)
    y = rng.normal(size=(64, 3)).astype(np.float32)
    m.compile(optimizer=Adam(0.01), loss="mse")
    m.fit(x, y, batch_size=16, epochs=1, verbose=0)
    save_model(m, tmp_path / "m.sgm")
    np.testing.assert_array_equal(load_model(tmp_path / "m.sgm").predict(x), m.predict(x))
    m.save(tmp_path / "c.sgck")
    other = _ids_model(seed=9)
    other.compile(optimizer=Adam(0.01), loss="mse")
    other.load(tmp_path / "c.sgck")
    m.fit(x, y, batch_size=16, epochs=2, verbose=0)
    other.fit(x, y, batch_size=16, epochs=2, verbose=0)
    np.testing.assert_array_equal(other.params, m.params)
    fresh = _ids_model(seed=5)
    fresh.set_weights(m.get_weights())
    np.testing.assert_array_equal(fresh.params, m.params)


def test_a_bf16_model_keeps_the_embedding_in_float32():
    seq = Sequential([Embedding(30, 16, input_shape=(2,)), Flatten(), Dense(16, activation="relu"), Dense(1)], seed=0)
    seq.compile(optimizer=SGD(0.05), loss="mse", precision="bf16")
    x = (np.arange(64).reshape(32, 2) % 30).astype(np.int32)
    y = np.ones((32, 1), np.float32)
    h = seq.fit(x, y, batch_size=16, epochs=3, verbose=0)
    assert np.isfinite(h.history["loss"]).all() and h.history["loss"][-1] < h.history["loss"][0]
    if seq.precision == "bf16":
        assert seq._core.bf16_layers(16) == 2  # the Dense layers; the Embedding is not one
    # the gather stays exact: float32 rows of the table, not bf16 roundings of them
    emb = Sequential([Embedding(30, 16, input_shape=(2,)), Flatten()], seed=0)
    emb.compile(optimizer=SGD(0.05), loss="mse", precision="bf16")
    table = seq.get_weights()[0]
    emb.set_weights([table])
    np.testing.assert_array_equal(emb.predict(x), table[x].reshape(32, -1))


def test_bad_ids_name_the_input_the_data_row_and_the_column():
    m = _ids_model()
    rng = np.random.default_rng(6)
    x = rng.integers(0, 50, size=(40, 4)).astype(np.int64)
    y = np.zeros((40, 3), np.float32)
    bad = x.copy()
    bad[29, 2] = 50
    message = r"'emb' \(Embedding\): id 50 in column 2 of row 29 of input 0 \('ids'\) is outside \[0, 50\)"
    with pytest.raises(InvalidArgumentError, match=message):
        m.fit(bad, y, batch_size=8, epochs=1, verbose=0)  # shuffled: the data row, not the batch row
    bad = x.copy()
    bad[3, 0] = -1
    with pytest.raises(InvalidArgumentError, match=r"id -1 in column 0 of row 3 .* is outside"):
        m.predict(bad)
    floats = x.astype(np.float32)
    floats[11, 1] = 2.5
    with pytest.raises(InvalidArgumentError, match=r"id 2.5 in column 1 of row 11 .* is not an integer"):
        m.evaluate(floats, y, verbose=0)
    m.predict(x.astype(np.float32))  # whole floats are ids too
    huge = x.copy()
    huge[0, 0] = 2**40
    with pytest.raises(InvalidArgumentError, match="outside"):
        m.predict(huge)


def test_bad_declarations_are_refused():
    with pytest.raises(ValueError, match="2\\^24"):
        Embedding(2**24 + 1, 4)
    with pytest.raises(ValueError, match="output_dim"):
        Embedding(10, 0)
    with pytest.raises(ValueError, match="initializer"):
        Embedding(10, 4, embeddings_initializer="orthogonal")
    img = Input(shape=(2, 2, 2), dtype="int32")
    with pytest.raises(ModelError, match=r"Embedding.*takes ids of shape \(k,\) or \(t, k\)"):
        Model(img, Dense(1)(Flatten()(Embedding(10, 4)(img))))
    with pytest.raises(ModelError, match="input_dim must be 1 to 16777216"):
        _core.Model([(1, 1, 2)], [{"kind": _core.LAYER_KINDS.index("Embedding"), "input_dim": 2**24 + 1, "units": 4}])


def test_mask_zero_is_accepted_and_changes_nothing_numerically():
    ids = Input(shape=(3,), dtype="int32")
    a = Model(ids, Dense(1)(Flatten()(Embedding(10, 2, mask_zero=True)(ids))), seed=0)
    ids2 = Input(shape=(3,), dtype="int32")
    b = Model(ids2, Dense(1)(Flatten()(Embedding(10, 2)(ids2))), seed=0)
    x = np.array([[0, 0, 3], [1, 0, 9]], np.int32)
    np.testing.assert_array_equal(a.predict(x), b.predict(x))


def test_a_model_takes_a_column_per_input_beyond_sixteen():
    """A tabular model has an input per column (26 categorical ones in Criteo): up to 64 inputs."""
    cols = [Input(shape=(1,), dtype="int32", name=f"c{j}") for j in range(26)]
    parts = [Flatten()(Embedding(5, 2)(c)) for c in cols]
    m = Model(cols, Dense(1)(Concatenate()(parts)), seed=0)  # one Concatenate of 26, as Keras users write it
    m.compile(optimizer=Adam(0.01), loss="mse")
    x = [np.full((8, 1), j % 5, np.int32) for j in range(26)]
    m.fit(x, np.ones((8, 1), np.float32), batch_size=4, epochs=1, verbose=0)
    assert len(m.touched_rows()) == 26
    many = [Input(shape=(1,)) for _ in range(65)]
    with pytest.raises(ModelError, match="2 to 64 tensors"):
        Concatenate()(many)
    parts = [Concatenate()(many[i : i + 64]) if len(many[i : i + 64]) > 1 else many[i] for i in range(0, 65, 64)]
    with pytest.raises(ModelError, match="1 to 64 inputs"):
        Model(many, Dense(1)(Concatenate()(parts)))


@pytest.mark.parametrize("dim", [16, 1])
def test_training_on_one_or_three_threads_gives_the_same_tables(dim):
    """Batches large enough for the threaded gather, scatter-add (rows split by thread) and lazy Adam
    train bit for bit as on one thread."""
    rng = np.random.default_rng(5)
    rows = 60_000
    x = rng.integers(0, rows, size=(1024, 26)).astype(np.int32)
    x[:, 0] = x[0, 0]  # one row repeated through the whole batch
    y = rng.normal(size=(1024, 26 * dim)).astype(np.float32)
    old = get_num_threads()
    params = []
    try:
        for threads in (1, 3):
            set_num_threads(threads)
            ids = Input(shape=(26,), dtype="int32", name="ids")
            m = Model(ids, Flatten()(Embedding(rows, dim)(ids)), seed=4)
            m.compile(optimizer=Adam(0.01), loss="mse")
            m.fit(x, y, batch_size=512, epochs=2, verbose=0, shuffle=False)
            params.append(m.params.copy())
    finally:
        set_num_threads(old)
    np.testing.assert_array_equal(params[0], params[1])
