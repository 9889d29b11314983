"""BatchNormalization and LayerNormalization (csrc/nn/nn_op_norm.c) and the model's non-trainable state
buffer they introduce: forward and backward against PyTorch (BatchNorm1d/2d with Keras' momentum
converted, LayerNorm) in training and inference, the moving statistics' update (Keras': the biased batch
variance), center/scale off, a layer on a model input and a shared layer, Keras' weight order, saving and
checkpoints of the state, the errors, and the statistics averaged across two allreduce ranks as one
average of what each rank computed alone (Keras' MirroredStrategy reads them so)."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from sparkgrad import _core
from sparkgrad.errors import InvalidArgumentError, ModelError
from sparkgrad.nn import (
    SGD,
    Adam,
    BatchNormalization,
    Conv2D,
    Dense,
    DistributedOptimizer,
    Flatten,
    Input,
    LayerNormalization,
    Model,
    Sequential,
    load_model,
    model_from_bytes,
    model_to_bytes,
    save_model,
)
from test_nn_distributed import PsCluster, two_ranks

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the test extra installs it
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch (pip install -e '.[test]')")
pytestmark = pytest.mark.timeout(120)


def _weights_set(model, rng):
    """Random weights everywhere, positive moving variances."""
    ws = []
    for (_, _, _, t), w in zip(model._weight_order, model.get_weights(), strict=True):
        if t.name == "moving_variance":
            ws.append(rng.uniform(0.5, 2.0, w.shape).astype(np.float32))
        else:
            ws.append(rng.normal(0, 0.5, w.shape).astype(np.float32))
    model.set_weights(ws)
    return ws


def _grad(model, t):
    return model.grads[t.offset : t.offset + t.size].reshape(t.shape)


@needs_torch
@pytest.mark.parametrize("center,scale", [(True, True), (False, True), (True, False), (False, False)])
def test_batchnorm_after_dense_matches_torch_batchnorm1d(center, scale):
    rng = np.random.default_rng(1)
    model = Sequential(
        [
            Dense(6, input_shape=(5,)),
            BatchNormalization(momentum=0.8, epsilon=1e-3, center=center, scale=scale),
            Dense(2),
        ]
    )
    model.compile(optimizer=SGD(0.0), loss="mse")
    ws = _weights_set(model, rng)
    x = (rng.normal(size=(32, 5)) * 3 + 1).astype(np.float32)
    y = rng.normal(size=(32, 2)).astype(np.float32)
    names = [t.name for _, _, _, t in model._weight_order]
    w = dict(zip(names[:2], ws[:2], strict=True))
    k0, b0 = (torch.tensor(v, requires_grad=True) for v in ws[:2])
    k2, b2 = (torch.tensor(v, requires_grad=True) for v in ws[-2:])
    bn_w = {n: v for n, v in zip(names[2:-2], ws[2:-2], strict=True)}
    bn = torch.nn.BatchNorm1d(6, eps=1e-3, momentum=1 - 0.8, affine=True)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor(bn_w.get("gamma", np.ones(6, np.float32))))
        bn.bias.copy_(torch.tensor(bn_w.get("beta", np.zeros(6, np.float32))))
        bn.running_mean.copy_(torch.tensor(bn_w["moving_mean"]))
        bn.running_var.copy_(torch.tensor(bn_w["moving_variance"]))
    bn.weight.requires_grad_(scale)
    bn.bias.requires_grad_(center)
    del w

    def torch_out(training):
        bn.train(training)
        h = torch.from_numpy(x) @ k0 + b0
        return h, bn(h) @ k2 + b2

    # inference: the moving statistics
    with torch.no_grad():
        np.testing.assert_allclose(model.predict(x), torch_out(False)[1].numpy(), rtol=1e-5, atol=1e-5)
    # training: the batch's statistics, gradients of everything trainable
    h, out = torch_out(True)
    loss = ((out - torch.from_numpy(y)) ** 2).mean()
    loss.backward()
    assert model.compute_gradients(x, y) == pytest.approx(loss.item(), rel=1e-5)
    want = [k0.grad, b0.grad] + [g for g, on in ((bn.weight.grad, scale), (bn.bias.grad, center)) if on]
    want += [k2.grad, b2.grad]
    for t, g in zip(model.param_table, want, strict=True):
        np.testing.assert_allclose(_grad(model, t), g.numpy(), rtol=1e-4, atol=1e-5, err_msg=t.name)
    # the moving statistics moved once: the mean as torch's; the variance with the biased batch variance
    # (Keras'), where torch keeps the unbiased one
    state = {t.name: model.buffers[t.offset : t.offset + t.size] for t in model.buffer_table}
    np.testing.assert_allclose(state["moving_mean"], bn.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    biased = h.detach().var(0, unbiased=False).numpy()
    want_var = 0.8 * bn_w["moving_variance"] + 0.2 * biased
    np.testing.assert_allclose(state["moving_variance"], want_var, rtol=1e-5, atol=1e-6)


@needs_torch
def test_batchnorm_after_conv2d_matches_torch_batchnorm2d_per_channel():
    rng = np.random.default_rng(2)
    model = Sequential([Conv2D(4, 3, padding="same", input_shape=(6, 6, 3)), BatchNormalization(), Flatten(), Dense(1)])
    model.compile(optimizer=SGD(0.0), loss="mse")
    ws = _weights_set(model, rng)
    x = rng.normal(size=(8, 6, 6, 3)).astype(np.float32)
    y = rng.normal(size=(8, 1)).astype(np.float32)
    leaves = [torch.tensor(w, requires_grad=True) for w in ws]
    kc, bc, gamma, beta, mm, mv, kd, bd = leaves

    def forward(training):
        t = torch.from_numpy(x).permute(0, 3, 1, 2)
        h = F.conv2d(t, kc.permute(3, 2, 0, 1), bc, padding=1)
        rm, rv = mm.detach().clone(), mv.detach().clone()
        n = F.batch_norm(h, rm, rv, gamma, beta, training=training, momentum=0.01, eps=1e-3)
        flat = n.permute(0, 2, 3, 1).reshape(8, -1)  # NHWC order, as Flatten
        return h, rm, flat @ kd + bd

    with torch.no_grad():
        np.testing.assert_allclose(model.predict(x), forward(False)[2].numpy(), rtol=1e-5, atol=1e-5)
    h, rm, out = forward(True)
    loss = ((out - torch.from_numpy(y)) ** 2).mean()
    loss.backward()
    assert model.compute_gradients(x, y) == pytest.approx(loss.item(), rel=1e-5)
    for t, g in zip(model.param_table, [kc, bc, gamma, beta, kd, bd], strict=True):
        np.testing.assert_allclose(_grad(model, t), g.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=t.name)
    mean_t, var_t = model.buffer_table
    np.testing.assert_allclose(model.buffers[: mean_t.size], rm.numpy(), rtol=1e-5, atol=1e-6)
    biased = h.detach().permute(0, 2, 3, 1).reshape(-1, 4).var(0, unbiased=False).numpy()
    np.testing.assert_allclose(model.buffers[var_t.offset :], 0.99 * ws[5] + 0.01 * biased, rtol=1e-5, atol=1e-6)


@needs_torch
@pytest.mark.parametrize("shape", [(7,), (3, 5)])
def test_layernorm_matches_torch_layernorm_on_rows_and_on_a_sequence(shape):
    rng = np.random.default_rng(3)
    model = Sequential([Dense(6, input_shape=shape), LayerNormalization(epsilon=1e-4), Flatten(), Dense(2)])
    model.compile(optimizer=SGD(0.0), loss="mse")
    ws = _weights_set(model, rng)
    assert model.buffers.size == 0  # no state
    x = (rng.normal(size=(16, *shape)) * 2 + 0.5).astype(np.float32)
    y = rng.normal(size=(16, 2)).astype(np.float32)
    k0, b0, gamma, beta, k1, b1 = leaves = [torch.tensor(w, requires_grad=True) for w in ws]
    h = F.layer_norm(torch.from_numpy(x) @ k0 + b0, (6,), gamma, beta, eps=1e-4)
    out = h.reshape(16, -1) @ k1 + b1
    np.testing.assert_allclose(model.predict(x), out.detach().numpy(), rtol=1e-5, atol=1e-5)
    loss = ((out - torch.from_numpy(y)) ** 2).mean()
    loss.backward()
    assert model.compute_gradients(x, y) == pytest.approx(loss.item(), rel=1e-5)
    for t, g in zip(model.param_table, leaves, strict=True):
        np.testing.assert_allclose(_grad(model, t), g.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=t.name)


@needs_torch
def test_batchnorm_on_a_model_input_and_a_shared_batchnorm_sum_their_gradients():
    """BatchNormalization straight on an Input (no input gradient is needed: the op's backward writes it to
    scratch), and one BatchNormalization called twice: its gradients add up and its moving statistics move
    at each call, in call order, as Keras' do."""
    rng = np.random.default_rng(4)
    a = Input(shape=(4,), name="a")
    bn = BatchNormalization(momentum=0.5)
    d = Dense(4)
    h = bn(d(bn(a)))
    model = Model(a, Dense(1)(h))
    model.compile(optimizer=SGD(0.0), loss="mse")
    assert [t.name for _, _, _, t in model._weight_order] == [
        "gamma",
        "beta",
        "moving_mean",
        "moving_variance",
        "kernel",
        "bias",
        "kernel",
        "bias",
    ]
    ws = _weights_set(model, rng)
    x = (rng.normal(size=(16, 4)) * 2 + 3).astype(np.float32)
    y = rng.normal(size=(16, 1)).astype(np.float32)
    gamma, beta, _, _, kd, bd, ko, bo = [torch.tensor(w, requires_grad=True) for w in ws]
    rm, rv = torch.tensor(ws[2]), torch.tensor(ws[3])
    n1 = F.batch_norm(torch.from_numpy(x), rm, rv, gamma, beta, training=True, momentum=0.5, eps=1e-3)
    h1 = n1 @ kd + bd
    out = F.batch_norm(h1, rm, rv, gamma, beta, training=True, momentum=0.5, eps=1e-3) @ ko + bo
    loss = ((out - torch.from_numpy(y)) ** 2).mean()
    loss.backward()
    assert model.compute_gradients(x, y) == pytest.approx(loss.item(), rel=1e-5)
    for t, g in zip(model.param_table, [gamma, beta, kd, bd, ko, bo], strict=True):
        np.testing.assert_allclose(_grad(model, t), g.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=t.name)
    np.testing.assert_allclose(model.buffers[:4], rm.numpy(), rtol=1e-5, atol=1e-6)  # two updates


def test_batchnorm_trains_evaluates_and_its_state_survives_save_and_checkpoints(tmp_path):
    rng = np.random.default_rng(5)
    x = (rng.normal(size=(512, 8)) * 4 + 2).astype(np.float32)
    y = (x[:, :2].sum(1) > 4).astype(np.float32)
    model = Sequential(
        [Dense(16, activation="relu", input_shape=(8,)), BatchNormalization(), Dense(1, activation="sigmoid")], seed=1
    )
    model.compile(optimizer=Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
    before = model.buffers.copy()
    np.testing.assert_array_equal(before, np.r_[np.zeros(16), np.ones(16)].astype(np.float32))
    h = model.fit(x, y, batch_size=32, epochs=8, verbose=0, checkpoint_dir=str(tmp_path / "ck"))
    assert h.history["accuracy"][-1] > 0.9
    assert not np.array_equal(model.buffers, before)  # training moved them
    ev = model.evaluate(x, y, return_dict=True)
    assert ev["accuracy"] > 0.85  # on the moving statistics
    state = model.buffers.copy()
    model.evaluate(x, y)
    model.predict(x)
    np.testing.assert_array_equal(model.buffers, state)  # inference reads them only
    summary = model.summary(print_fn=None)
    assert "Trainable params: 193" in summary and "Non-trainable params: 32" in summary
    # a saved model (format version 3) and a checkpoint (version 2) carry the state
    path = tmp_path / "m.sgm"
    save_model(model, path)
    assert int.from_bytes(path.read_bytes()[8:12], "little") == 3
    loaded = load_model(path)
    np.testing.assert_array_equal(loaded.buffers, state)
    assert loaded.evaluate(x, y, return_dict=True) == pytest.approx(ev)
    ckpts = sorted((tmp_path / "ck").iterdir())
    assert int.from_bytes(ckpts[-1].read_bytes()[8:12], "little") == 2
    fresh = Sequential(
        [Dense(16, activation="relu", input_shape=(8,)), BatchNormalization(), Dense(1, activation="sigmoid")], seed=9
    )
    fresh.compile(optimizer=Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
    fresh.load(ckpts[-1])
    np.testing.assert_array_equal(fresh.buffers, state)
    np.testing.assert_array_equal(fresh.params, model.params)
    # a model without state is still written as the versions every release reads
    plain = Sequential([Dense(2, input_shape=(3,))])
    assert int.from_bytes(model_to_bytes(plain)[8:12], "little") == 1
    # a file one state value short (its CRC made to fit) is named as such
    body = model_to_bytes(model)[:-8]
    with pytest.raises(ModelError, match="bytes, the header describes"):
        model_from_bytes(body + struct.pack("<I", zlib.crc32(body)))


def test_normalization_errors_are_specific():
    with pytest.raises(ValueError, match=r"BatchNormalization\(axis=1\): only axis=-1"):
        BatchNormalization(axis=1)
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\], not 1.5"):
        BatchNormalization(momentum=1.5)
    with pytest.raises(ValueError, match="LayerNormalization epsilon must be > 0"):
        LayerNormalization(epsilon=0)
    model = Sequential([Dense(3, input_shape=(2,)), BatchNormalization(), Dense(1)])
    ws = model.get_weights()
    ws[4] = np.ones(4, np.float32)
    with pytest.raises(
        InvalidArgumentError,
        match=r"array 4 has shape \(4,\), layer 1 'batch_normalization' needs \(3,\) \(its moving_mean\)",
    ):
        model.set_weights(ws)
    with pytest.raises(InvalidArgumentError, match="got 7 arrays, the model has 8"):
        model.set_weights(ws[:-1])
    spec = BatchNormalization().spec() | {"epsilon": -1.0}
    with pytest.raises(ModelError, match=r"layer 0 \(BatchNormalization\): epsilon must be > 0, not -1"):
        _core.Model([(1, 1, 3)], [spec])


def _parts(seed):
    """Two workers' rows whose statistics differ (the second's features shifted by 3)."""
    rng = np.random.default_rng(seed)
    return [
        ((rng.normal(size=(64, 5)) + shift).astype(np.float32), rng.normal(size=(64, 1)).astype(np.float32))
        for shift in (0.0, 3.0)
    ]


def _held_still(opt=None):
    """A model with a BatchNormalization whose parameters SGD(0) holds still."""
    m = Sequential([Dense(4, input_shape=(5,)), BatchNormalization(momentum=0.7), Dense(1)], seed=3)
    m.compile(optimizer=opt if opt is not None else SGD(0.0), loss="mse")
    return m


def _alone(parts):
    """Each part's moving statistics after 2 epochs of a single process."""
    out = []
    for x, y in parts:
        m = _held_still()
        m.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        out.append(m.buffers.copy())
    return out


@pytest.mark.skipif(not hasattr(_core, "Communicator"), reason="this build has no _core.Communicator")
def test_two_allreduce_ranks_end_with_the_average_of_the_moving_statistics_each_computed():
    """Each rank moves its statistics on its own batches; reading them averages across the ranks. With the
    parameters held still (learning rate 0) each rank's statistics are what a single process computes on
    its rows, so the ranks must end with the mean of two such local runs (the averages are linear, so
    averaging at each epoch's end gives the same). Without the averaging the ranks would differ."""
    parts = _parts(6)
    alone = _alone(parts)
    assert not np.allclose(alone[0], alone[1])

    def work(r, comm):
        m = _held_still(DistributedOptimizer(SGD(0.0), communicator=comm))
        m.fit(*parts[r], batch_size=16, epochs=2, shuffle=False, verbose=0)
        return m

    results = two_ranks(work)
    for m in results:
        assert isinstance(m, Sequential), m
        np.testing.assert_allclose(m.buffers, (alone[0] + alone[1]) / 2, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(results[0].buffers, results[1].buffers)


def test_through_the_ps_the_chief_ends_with_the_mean_of_each_workers_moving_statistics(tmp_path):
    """Two workers on a ps, the parameters held still (the ps' SGD at rate 0): each worker moves its own
    statistics as a single process would on its rows; the chief's final model and last checkpoint hold the
    mean of both workers' final statistics, and the other worker keeps its own (it reads none)."""
    from sparkgrad import TFNode

    parts = _parts(7)
    alone = _alone(parts)
    with PsCluster(workers=2, model=_held_still(), mode="async") as cluster:

        def work(i, ctx):
            m = _held_still()
            with TFNode.ps_client(ctx, m) as ps:
                ckpt = str(tmp_path / str(i))
                m.fit(*parts[i], batch_size=16, epochs=2, shuffle=False, verbose=0, ps=ps, checkpoint_dir=ckpt)
            return m

        results = cluster.run_workers(work)
        assert cluster.join() == "done"
    chief, other = results
    assert isinstance(chief, Sequential), chief
    assert isinstance(other, Sequential), other
    np.testing.assert_allclose(chief.buffers, (alone[0] + alone[1]) / 2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(other.buffers, alone[1], rtol=1e-5, atol=1e-6)
    last = sorted((tmp_path / "0").iterdir())[-1]
    fresh = _held_still()
    fresh.load(last)
    np.testing.assert_array_equal(fresh.buffers, chief.buffers)
