"""fit's declared state and the C loop's boundary: uint8/int64 inputs converted
in C (equal to NumPy's conversion, with no float copy), the gradient hook
through a real parameter server over loopback (fit(ps=...) equal to local
training, the global step, chief-only checkpoints), serve_parameters(model),
DistributedOptimizer as the wrapped optimizer, and the callback protocol."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import tracemalloc

import numpy as np
import pytest
from sparkgrad import TFNode, _core
from sparkgrad.cluster.context import NodeContext, NodeInfo, cluster_spec
from sparkgrad.errors import InvalidArgumentError, ModelError, SparkgradError
from sparkgrad.nn import (
    SGD,
    Adam,
    Add,
    Concatenate,
    Dense,
    DistributedOptimizer,
    Dropout,
    Input,
    Model,
    Sequential,
)

pytestmark = pytest.mark.timeout(120)


def mlp(seed=3, opt=None, inputs=12):
    m = Sequential([Dense(16, activation="relu", input_shape=(inputs,)), Dropout(0.2), Dense(4)], seed=seed)
    m.compile(optimizer=opt if opt is not None else Adam(0.01), loss="sparse_categorical_crossentropy")
    return m


def data(n=256, features=12, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, features), dtype=np.uint8)
    y = (x[:, 0] > 127).astype(np.int64) + 2 * (x[:, 1] > 127)
    return x, y


# ---- conversion at the boundary, in C -----------------------------------------


def test_uint8_inputs_scaled_and_standardised_in_c_equal_numpy_conversion():
    x, y = data()
    rng = np.random.default_rng(1)
    mean = rng.uniform(0.3, 0.7, 12).astype(np.float32)
    std = rng.uniform(0.2, 0.4, 12).astype(np.float32)
    in_c, in_numpy = mlp(), mlp()
    in_c.set_input_transform(scale=1 / 255, mean=mean, std=std)
    xf = (x.astype(np.float32) * np.float32(1 / 255) - mean) / std
    h1 = in_c.fit(x, y, batch_size=32, epochs=2, verbose=0)
    h2 = in_numpy.fit(xf, y.astype(np.int32), batch_size=32, epochs=2, verbose=0)
    np.testing.assert_allclose(in_c.params, in_numpy.params, rtol=1e-6, atol=1e-7)
    assert h1.history["loss"] == pytest.approx(h2.history["loss"], rel=1e-6)
    np.testing.assert_allclose(in_c.predict(x), in_numpy.predict(xf), rtol=1e-5, atol=1e-7)
    assert in_c.evaluate(x, y) == pytest.approx(in_numpy.evaluate(xf, y), rel=1e-6)
    # an iterable of uint8 batches takes the same path
    it = mlp()
    it.set_input_transform(scale=1 / 255, mean=mean, std=std)
    it.fit([{"image_raw": x[i : i + 32], "label": y[i : i + 32]} for i in range(0, 256, 32)], verbose=0)
    ref = mlp()
    ref.fit([(xf[i : i + 32], y[i : i + 32]) for i in range(0, 256, 32)], verbose=0)
    np.testing.assert_allclose(it.params, ref.params, rtol=1e-6, atol=1e-7)


def test_int32_and_int64_labels_train_identically():
    x, y = data()
    a, b = mlp(), mlp()
    a.fit(x, y.astype(np.int64), batch_size=32, epochs=1, verbose=0)
    b.fit(x, y.astype(np.int32), batch_size=32, epochs=1, verbose=0)
    np.testing.assert_array_equal(a.params, b.params)


def test_a_large_uint8_array_reaches_c_without_a_float_copy():
    n, features = 40_000, 784
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (n, features), dtype=np.uint8)
    y = rng.integers(0, 10, n).astype(np.int64)
    m = Sequential([Dense(10, input_shape=(features,))], seed=1)
    m.compile(optimizer=SGD(0.01), loss="sparse_categorical_crossentropy")
    m.set_input_transform(scale=1 / 255)
    float_copy = n * features * 4  # 125 MB
    tracemalloc.start()
    try:
        m.fit(x, y, batch_size=500, epochs=1, verbose=0, shuffle=True)
        m.evaluate(x, y, batch_size=1000)
        m.predict(x[:1000])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < float_copy / 20, f"peak {peak} bytes traced: a float32 copy of x ({float_copy} bytes) was made?"


def test_input_transform_and_dtype_errors_are_specific():
    m = mlp()
    with pytest.raises(InvalidArgumentError, match="input mean has 3 values; the input has 12"):
        m.set_input_transform(mean=np.zeros(3))
    with pytest.raises(InvalidArgumentError, match="std has zeros"):
        m.set_input_transform(std=np.zeros(12))
    with pytest.raises(InvalidArgumentError, match=r"y\[0\] must be contiguous int32 or int64 labels \[2\]"):
        m._core.evaluate(np.zeros((2, 12), np.float32), np.zeros(2, np.int16), 2)
    with pytest.raises(InvalidArgumentError, match="float32, uint8, int32 or int64"):
        m._core.predict(np.zeros((2, 12), np.float64), 2)


# ---- the hook ---------------------------------------------------------------------


def test_train_steps_takes_only_a_grad_hook_capsule_and_a_hook_error_names_the_row():
    m = mlp()
    x, y = data(64)
    with pytest.raises(InvalidArgumentError, match="sparkgrad._core.NnGradHook"):
        m._core.train_steps(None, x, y, None, 0, 32, 1, hook=object())
    with PsCluster(total=m.num_params + 1, workers=1, lr=0.1) as ps:
        client = _core.PsClient(ps.addresses, ps.secret, m.num_params + 1, 0, 10.0)
        client.init(np.zeros(m.num_params + 1, np.float32))
        hook = client.grad_hook()
        want = r"training step \d+ \(the batch at row 32 of the epoch\): gradient hook: ps client is for \d+ parameters"
        with pytest.raises(InvalidArgumentError, match=want):
            m._core.train_steps(None, x, y, None, 32, 32, 2, hook=hook)
        client.done()
        client.close()


class PsCluster:
    """One ps shard serving in a thread on loopback, with the NodeContexts of
    the ps and of ``workers`` training nodes (as TFCluster builds them)."""

    def __init__(self, total=None, workers=1, model=None, mode="async", lr=None) -> None:
        self.secret = os.urandom(32)
        self.listener = _core.Listener("127.0.0.1", 0)
        nodes = [NodeInfo(0, "ps", 0, "127.0.0.1", self.listener.port, os.getpid())]
        nodes += [NodeInfo(1 + i, "worker", i, "127.0.0.1", 1, os.getpid()) for i in range(workers)]
        spec = cluster_spec(nodes)

        def ctx(node, listener=None):
            return NodeContext(
                node.executor_id,
                node.role,
                node.index,
                spec,
                "file://",
                "/tmp",
                tuple(nodes),
                listener=listener,
                secret=self.secret,
            )

        self.ps_ctx = ctx(nodes[0], self.listener)
        self.workers = [ctx(n) for n in nodes[1:]]
        self.total = total
        self.result = None
        what = model if model is not None else total
        kw = {"lr": lr} if lr is not None else {}
        self.thread = threading.Thread(target=self._serve, args=(what, mode, kw))
        self.thread.start()

    def _serve(self, what, mode, kw) -> None:
        try:
            self.result = TFNode.start_cluster_server(self.ps_ctx).serve_parameters(what, mode=mode, timeout=60, **kw)
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            self.result = exc

    @property
    def addresses(self):
        return [("127.0.0.1", self.listener.port)]

    def run_workers(self, work) -> list:
        """work(i, ctx) on a thread per worker; their results (or errors), once every one returned."""
        results: list = [None] * len(self.workers)

        def one(i):
            try:
                results[i] = work(i, self.workers[i])
            except BaseException as exc:  # noqa: BLE001 - checked by the caller
                results[i] = exc

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(self.workers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return results

    def join(self):
        self.thread.join(30)
        assert not self.thread.is_alive(), "the ps did not exit"
        return self.result

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.ps_ctx.signal_stop()
        self.join()
        self.listener.close()


def test_fit_through_the_ps_equals_local_training_with_the_compiled_optimizer():
    """1 ps (serve_parameters(model): the model's Adam runs on the ps) + 1 worker
    fitting with ps=: the same parameters as fit without a ps, the global step
    in the model's state, the ps told done."""
    x, y = data()
    local = mlp()
    local.fit(x, y, batch_size=32, epochs=2, verbose=0)
    served = mlp()
    with PsCluster(workers=1, model=served) as cluster:
        worker = mlp()
        assert cluster.workers[0].worker_rank == 0 and cluster.ps_ctx.worker_rank is None
        with TFNode.ps_client(cluster.workers[0], worker) as ps:
            h = worker.fit(x, y, batch_size=32, epochs=2, verbose=0, ps=ps, log_every=3)
        assert cluster.join() == "done"
    np.testing.assert_allclose(worker.params, local.params, rtol=1e-6, atol=1e-7)
    assert worker.step == local.step == 16 and worker.epoch == 2
    assert [s["step"] for s in h.steps][-1] == 16
    assert worker.optimizer.iterations == 0  # the ps applied every update


def test_two_workers_on_a_sync_ps_share_the_global_step_and_only_the_chief_checkpoints(tmp_path):
    x, y = data(256)
    model = mlp(opt=SGD(0.1))
    dirs = [tmp_path / "chief", tmp_path / "other"]
    with PsCluster(workers=2, model=model, mode="sync") as cluster:

        def work(i, ctx):
            m = mlp(seed=3 + i, opt=SGD(0.1))  # the chief's initial weights win
            with TFNode.ps_client(ctx, m) as ps:
                part = slice(i * 128, (i + 1) * 128)
                m.fit(x[part], y[part], batch_size=32, epochs=2, verbose=0, ps=ps, checkpoint_dir=str(dirs[i]))
            return m

        results = cluster.run_workers(work)
        assert cluster.join() == "done"
    chief, other = results
    assert isinstance(chief, Sequential), chief
    assert isinstance(other, Sequential), other
    assert chief.step == 8  # 2 epochs x 4 batches, one global step per round of both workers
    assert sorted(os.listdir(dirs[1])) == []
    names = sorted(os.listdir(dirs[0]))
    assert names[-1] == "ckpt-0000000008.sgck", names
    fresh = mlp(seed=11, opt=SGD(0.1))
    fresh.load(dirs[0] / names[-1])
    np.testing.assert_array_equal(fresh.params, chief.params)  # the final parameters, after both workers
    assert fresh.step == 8


def test_serve_parameters_still_takes_a_total_and_lr():
    x, y = data(64)
    m = mlp(opt=SGD(0.05))
    ref = mlp(opt=SGD(0.05))
    with PsCluster(total=m.num_params, workers=1, lr=0.05) as cluster:
        with TFNode.ps_client(cluster.workers[0], m.num_params) as ps:
            m.fit(x, y, batch_size=64, epochs=1, verbose=0, ps=ps, shuffle=False)
        assert cluster.join() == "done"
    ref.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False)
    np.testing.assert_allclose(m.params, ref.params, rtol=1e-5, atol=1e-7)


# ---- DistributedOptimizer -------------------------------------------------------------


def test_distributed_optimizer_is_the_wrapped_optimizer_for_compile_and_checkpoints(tmp_path):
    inner = Adam(0.003)
    opt = DistributedOptimizer(inner, compression=type("C", (), {"name": "fp16"})(), op="sum")
    assert (opt.kind, opt.learning_rate, opt.compression, opt.op) == ("adam", pytest.approx(0.003), "fp16", "sum")
    m = mlp(opt=opt)
    x, y = data(64)
    m.train_on_batch(x, y)  # no communicator needed outside fit
    assert opt.iterations == inner.iterations == 1
    m.save(tmp_path / "m.sgck")
    plain = mlp(seed=8)
    plain.load(tmp_path / "m.sgck")
    np.testing.assert_array_equal(plain.optimizer.get_state()[1], inner.get_state()[1])
    with pytest.raises(InvalidArgumentError, match="compression"):
        DistributedOptimizer(SGD(), compression="int8")
    with pytest.raises(InvalidArgumentError, match="op must be"):
        DistributedOptimizer(SGD(), op="product")
    assert DistributedOptimizer(SGD()).bucket_bytes == 0
    assert DistributedOptimizer(SGD(), bucket_bytes=np.int64(1 << 20)).bucket_bytes == 1 << 20
    for bad in (-1, True, 2.5, "1MB"):
        with pytest.raises(InvalidArgumentError, match=r"bucket_bytes must be an int >= 0"):
            DistributedOptimizer(SGD(), bucket_bytes=bad)


def test_fit_with_a_distributed_optimizer_needs_a_communicator_and_refuses_a_ps():
    x, y = data(64)
    m = mlp(opt=DistributedOptimizer(SGD(0.1)))
    with pytest.raises(ModelError, match=r"hvd\.init\(\)"):
        m.fit(x, y, verbose=0)
    with pytest.raises(InvalidArgumentError, match="ps= and a DistributedOptimizer"):
        m.fit(x, y, verbose=0, ps=object())
    assert m.step == 0


def test_the_distributed_optimizer_finds_hvds_communicator_without_importing_hvd():
    """sparkgrad.hvd imports sparkgrad.nn.distributed (hvd.DistributedOptimizer), never the other way:
    both find the process's communicator in sparkgrad.cluster.collective."""
    code = (
        "import sys\n"
        "from sparkgrad.cluster import collective\n"
        "from sparkgrad.nn.distributed import DistributedOptimizer\n"
        "from sparkgrad.nn.optimizers import SGD\n"
        "assert 'sparkgrad.hvd' not in sys.modules, 'nn.distributed imported hvd'\n"
        "handle = collective.handle_for_init()\n"
        "handle.open(10.0)  # what hvd.init() does in a plain process\n"
        "assert DistributedOptimizer(SGD()).resolve_communicator() is handle.communicator()\n"
        "assert 'sparkgrad.hvd' not in sys.modules\n"
        "import sparkgrad.hvd as hvd\n"
        "assert hvd.DistributedOptimizer is DistributedOptimizer and hvd.communicator() is handle.communicator()\n"
        "hvd.shutdown()\n"
        "assert not handle.is_open\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# ---- callbacks ------------------------------------------------------------------------


def test_callbacks_get_keras_hooks_in_order():
    calls = []

    class Recorder:
        def set_model(self, model):
            calls.append(("set_model", model is m))

        def on_train_begin(self, logs):
            calls.append(("train_begin",))

        def on_epoch_begin(self, epoch, logs):
            calls.append(("epoch_begin", epoch))

        def on_step_end(self, step, logs):
            calls.append(("step_end", step))

        def on_epoch_end(self, epoch, logs):
            calls.append(("epoch_end", epoch))

        def on_train_end(self, logs):
            calls.append(("train_end",))

    m = mlp()
    x, y = data(64)
    m.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[Recorder()])
    assert calls == [
        ("set_model", True),
        ("train_begin",),
        ("epoch_begin", 0),
        ("step_end", 2),
        ("epoch_end", 0),
        ("epoch_begin", 1),
        ("step_end", 4),
        ("epoch_end", 1),
        ("train_end",),
    ]


def test_errors_from_the_ps_hook_are_sparkgrad_errors():
    """A ps that went away ends fit with an error, not a hang."""
    x, y = data(64)
    m = mlp()
    with PsCluster(workers=1, model=m) as cluster:
        ps = TFNode.ps_client(cluster.workers[0], m, timeout=5.0)
        ps.init(m.params)
        cluster.ps_ctx.signal_stop()
        assert cluster.join() == "stopped"
        with pytest.raises(SparkgradError):
            m.fit(x, y, batch_size=32, epochs=1, verbose=0, ps=ps)
        ps.close()


# ---- allreduce through DistributedOptimizer (needs _core.Communicator, csrc/net/coll*.c) ----


def two_ranks(work):
    """Two ranks (threads, a real ring over loopback): work(r, communicator) on each; their results (or
    errors)."""
    secret = os.urandom(32)
    listeners = [_core.Listener("127.0.0.1", 0) for _ in range(2)]
    addresses = [("127.0.0.1", lis.port) for lis in listeners]
    results: list = [None, None]

    def rank(r):
        try:
            with _core.Communicator(listeners[r], secret, r, addresses, timeout=30.0) as comm:
                results[r] = work(r, comm)
        except BaseException as exc:  # noqa: BLE001 - checked by the caller
            results[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for lis in listeners:
        lis.close()
    return results


def _fit_two_ranks(make_model, x, y, steps, callbacks=list):
    """Rank r of `two_ranks` fits rows 64r..64r+63 of every 128-row batch with make_model(communicator);
    their models (or errors)."""

    def work(r, comm):
        m = make_model(comm)
        rows = np.arange(steps * 128).reshape(steps, 2, 64)[:, r].reshape(-1)

        def take(v):  # one array, or one per input (output) of a functional model
            return [a[rows] for a in v] if isinstance(v, list) else v[rows]

        h = m.fit(take(x), take(y), batch_size=64, epochs=1, shuffle=False, verbose=0, callbacks=callbacks())
        m.history_of_last_fit = h.history
        return m

    return two_ranks(work)


@pytest.mark.skipif(not hasattr(_core, "Communicator"), reason="this build has no _core.Communicator yet")
@pytest.mark.parametrize("opt,bucket_bytes", [("sgd", 0), ("adam", 0), ("sgd", 256)])
def test_two_ranks_of_batch_64_equal_one_process_of_batch_128(opt, bucket_bytes):
    """20 steps: 2 ranks (threads, a real ring over loopback) each fitting its
    64 rows of every 128-row batch with DistributedOptimizer(op="average") end
    with the parameters of one model fitting the whole batches (to 1e-5).
    bucket_bytes > 0 (DistributedOptimizer's argument): the hook starts
    reducing each layer's gradients when the C backward calls ready() for it."""
    steps, features = 20, 12
    x, y = data(steps * 128, features, seed=4)
    make_opt = (lambda: SGD(0.1)) if opt == "sgd" else (lambda: Adam(0.01))

    def model(o):
        m = Sequential([Dense(16, activation="relu", input_shape=(features,)), Dense(4)], seed=7)
        m.compile(optimizer=o, loss="sparse_categorical_crossentropy")
        m.set_input_transform(scale=1 / 255)
        return m

    whole = model(make_opt())
    whole.fit(x, y, batch_size=128, epochs=1, shuffle=False, verbose=0)
    results = _fit_two_ranks(
        lambda comm: model(DistributedOptimizer(make_opt(), communicator=comm, bucket_bytes=bucket_bytes)), x, y, steps
    )
    for m in results:
        assert isinstance(m, Sequential), m
        assert m.step == steps
        np.testing.assert_allclose(m.params, whole.params, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(results[0].params, results[1].params)


# ---- bf16 models with bf16 gradients on the wire (issue 16) -------------------

needs_bf16 = pytest.mark.skipif(not _core.bf16_supported(), reason="this CPU has no native bf16")


def _bf16_mlp(seed=3, opt=None):
    m = Sequential([Dense(16, activation="relu", input_shape=(12,)), Dense(4)], seed=seed)
    m.compile(
        optimizer=opt if opt is not None else Adam(0.01), loss="sparse_categorical_crossentropy", precision="bf16"
    )
    m.set_input_transform(scale=1 / 255)
    return m


def _close_in_bf16(got, want, start, tol=1e-2):
    """got moved from start as want did, to bf16 rounding (about 1e-3 here)."""
    assert np.linalg.norm(got - want) <= tol * np.linalg.norm(want - start)


@needs_bf16
def test_a_bf16_model_fits_through_the_ps_with_bf16_gradients():
    x, y = data()
    local = _bf16_mlp()
    start = local.params.copy()
    local.fit(x, y, batch_size=32, epochs=2, verbose=0)
    served = _bf16_mlp()
    with PsCluster(workers=1, model=served) as cluster:
        worker = _bf16_mlp()
        assert worker.precision == "bf16"
        with TFNode.ps_client(cluster.workers[0], worker, compression="bf16") as ps:
            worker.fit(x, y, batch_size=32, epochs=2, verbose=0, ps=ps)
        assert cluster.join() == "done"
    assert worker.step == 16
    _close_in_bf16(worker.params, local.params, start)
    assert not np.array_equal(worker.params, local.params)  # the gradients were rounded on the wire


@needs_bf16
@pytest.mark.skipif(not hasattr(_core, "Communicator"), reason="this build has no _core.Communicator yet")
def test_two_bf16_ranks_allreducing_bf16_gradients_track_one_bf16_process():
    steps = 20
    x, y = data(steps * 128, 12, seed=4)
    whole = _bf16_mlp(seed=7, opt=SGD(0.1))
    start = whole.params.copy()
    whole.fit(x, y, batch_size=128, epochs=1, shuffle=False, verbose=0)
    results = _fit_two_ranks(
        lambda comm: _bf16_mlp(seed=7, opt=DistributedOptimizer(SGD(0.1), communicator=comm, compression="bf16")),
        x,
        y,
        steps,
    )
    for m in results:
        assert isinstance(m, Sequential), m
        assert m.step == steps and m.precision == "bf16"
        _close_in_bf16(m.params, whole.params, start)
    np.testing.assert_array_equal(results[0].params, results[1].params)


# ---- binary classification and regression in every mode (issue 29) --------------------------


def _binary(seed=3, opt=None):
    m = Sequential([Dense(16, activation="relu", input_shape=(12,)), Dense(1, activation="sigmoid")], seed=seed)
    m.compile(optimizer=opt if opt is not None else Adam(0.01), loss="binary_crossentropy", metrics=["accuracy", "auc"])
    m.set_input_transform(scale=1 / 255)
    return m


def test_a_binary_classifier_fits_through_the_ps_as_it_fits_locally():
    x, y = data()
    yb = (y >= 2).astype(np.float32)
    local = _binary()
    hl = local.fit(x, yb, batch_size=32, epochs=2, verbose=0)
    with PsCluster(workers=1, model=_binary()) as cluster:
        worker = _binary()
        with TFNode.ps_client(cluster.workers[0], worker) as ps:
            h = worker.fit(x, yb, batch_size=32, epochs=2, verbose=0, ps=ps, log_every=3)
        assert cluster.join() == "done"
    np.testing.assert_allclose(worker.params, local.params, rtol=1e-6, atol=1e-7)
    assert h.history["auc"] == pytest.approx(hl.history["auc"], abs=1e-9)
    assert h.history["loss"] == pytest.approx(hl.history["loss"], rel=1e-6)


@pytest.mark.skipif(not hasattr(_core, "Communicator"), reason="this build has no _core.Communicator yet")
def test_metric_average_pools_the_ranks_metric_states_so_each_reports_the_auc_of_all_rows():
    """A binary classifier on two ranks: the parameters of one process on the whole batches; without
    MetricAverageCallback each rank reports its own rows (as Horovod), with it each rank's epoch loss
    and AUC are those of all 2560 rows (the summed states), the same on both ranks."""
    steps = 20
    x, y = data(steps * 128, 12, seed=4)
    yb = (y % 2).astype(np.float32)
    whole = _binary(seed=7, opt=SGD(0.1))
    hw = whole.fit(x, yb, batch_size=128, epochs=1, shuffle=False, verbose=0)
    from sparkgrad.hvd.callbacks import MetricAverageCallback

    own = _fit_two_ranks(
        lambda comm: _binary(seed=7, opt=DistributedOptimizer(SGD(0.1), communicator=comm)), x, yb, steps
    )
    assert own[0].history_of_last_fit["auc"] != own[1].history_of_last_fit["auc"]  # each rank's own rows
    results = _fit_two_ranks(
        lambda comm: _binary(seed=7, opt=DistributedOptimizer(SGD(0.1), communicator=comm)),
        x,
        yb,
        steps,
        callbacks=lambda: [MetricAverageCallback()],  # one per rank: set_model binds it to its model
    )
    for m in results:
        assert isinstance(m, Sequential), m
        np.testing.assert_allclose(m.params, whole.params, rtol=1e-5, atol=1e-6)
    h0, h1 = (m.history_of_last_fit for m in results)
    assert h0["auc"] == h1["auc"] and h0["loss"] == h1["loss"]
    # the AUC of the ranks' summed states (their own runs took the same steps), not the average of their AUCs
    pooled_state = own[0].epoch_sums[""][2] + own[1].epoch_sums[""][2]
    assert h0["auc"][0] == own[0].metric_values(pooled_state)["auc"]
    mean_own = (own[0].history_of_last_fit["auc"][0] + own[1].history_of_last_fit["auc"][0]) / 2
    assert h0["auc"][0] != mean_own
    assert h0["loss"][0] == pytest.approx(hw.history["loss"][0], rel=1e-5)
    assert h0["auc"][0] == pytest.approx(hw.history["auc"][0], abs=2e-3)


@pytest.mark.skipif(not hasattr(_core, "Communicator"), reason="this build has no _core.Communicator yet")
def test_two_ranks_train_a_regression_as_one_process_does():
    steps = 20
    x, y = data(steps * 128, 12, seed=5)
    target = (x[:, 0].astype(np.float32) / 255 - 2 * x[:, 1].astype(np.float32) / 255).astype(np.float32)

    def model(opt):
        m = Sequential([Dense(16, activation="relu", input_shape=(12,)), Dense(1)], seed=7)
        m.compile(optimizer=opt, loss="huber", metrics=["mae"])
        m.set_input_transform(scale=1 / 255)
        return m

    whole = model(Adam(0.01))
    whole.fit(x, target, batch_size=128, epochs=1, shuffle=False, verbose=0)
    results = _fit_two_ranks(lambda comm: model(DistributedOptimizer(Adam(0.01), communicator=comm)), x, target, steps)
    for m in results:
        assert isinstance(m, Sequential), m
        np.testing.assert_allclose(m.params, whole.params, rtol=1e-5, atol=1e-6)


# ---- functional models in the distributed modes (issue 29) -------------------


def _functional(seed=7, opt=None):
    """Two inputs, a residual Add, a Concatenate and two outputs (regression and 4 classes)."""
    a, b = Input(shape=(12,), name="a"), Input(shape=(3,), name="b")
    h = Dense(16, activation="relu")(a)
    h = Add()([h, Dense(16, activation="relu")(h)])
    joined = Concatenate()([h, b])
    m = Model([a, b], [Dense(1, name="value")(joined), Dense(4, name="kind")(h)], seed=seed)
    m.compile(
        optimizer=opt if opt is not None else Adam(0.01),
        loss=["huber", "sparse_categorical_crossentropy"],
        loss_weights=[1.0, 0.5],
        metrics=[["mae"], ["accuracy"]],
    )
    return m


def _functional_data(n, seed=6):
    x, y = data(n, 12, seed=seed)
    xf = x.astype(np.float32) / 255
    b = np.random.default_rng(seed).normal(size=(n, 3)).astype(np.float32)
    value = (xf[:, 0] - 2 * xf[:, 1] + b[:, 0]).astype(np.float32)
    return [xf, b], [value, y]


@pytest.mark.skipif(not hasattr(_core, "Communicator"), reason="this build has no _core.Communicator yet")
def test_two_ranks_train_a_functional_model_with_two_inputs_and_outputs_as_one_process_does():
    steps = 20
    x, y = _functional_data(steps * 128)
    whole = _functional()
    whole.fit(x, y, batch_size=128, epochs=1, shuffle=False, verbose=0)
    results = _fit_two_ranks(
        lambda comm: _functional(opt=DistributedOptimizer(Adam(0.01), communicator=comm)), x, y, steps
    )
    for m in results:
        assert isinstance(m, Model), m
        assert set(m.history_of_last_fit) == {"loss", "value_loss", "kind_loss", "value_mae", "kind_accuracy"}
        np.testing.assert_allclose(m.params, whole.params, rtol=1e-5, atol=1e-6)


def test_a_functional_model_fits_through_the_ps_as_it_fits_locally():
    x, y = _functional_data(256)
    local = _functional(seed=3)
    local.fit(x, y, batch_size=32, epochs=2, verbose=0)
    served = _functional(seed=3)
    with PsCluster(workers=1, model=served) as cluster:
        worker = _functional(seed=3)
        with TFNode.ps_client(cluster.workers[0], worker) as ps:
            worker.fit(x, y, batch_size=32, epochs=2, verbose=0, ps=ps)
        assert cluster.join() == "done"
    np.testing.assert_allclose(worker.params, local.params, rtol=1e-6, atol=1e-7)
