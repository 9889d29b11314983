"""Checkpoints (format in sparkgrad/nn/checkpoint.py): atomic writes, keep
last N, resume with parameters, optimizer state, step and RNG restored
(bit-identical to an uninterrupted run), best-only, sync_dir, save/load,
.npz export, corruption detection; progress bar, TensorBoard scalars, PNG."""

from __future__ import annotations

import os
import struct
import sys
import types

import numpy as np
import pytest
from sparkgrad.errors import CheckpointError
from sparkgrad.nn import SGD, Adam, Dense, Dropout, Sequential
from sparkgrad.nn import checkpoint as ck


def model(seed=4, opt=None):
    m = Sequential([Dense(16, activation="relu", input_shape=(10,)), Dropout(0.3), Dense(3)], seed=seed)
    m.compile(optimizer=opt or Adam(0.01), loss="sparse_categorical_crossentropy")
    return m


def data(n=200):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, 10)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1)


def test_save_load_restores_everything_and_training_continues_identically(tmp_path):
    x, y = data()
    a = model()
    a.fit(x, y, batch_size=32, epochs=1, verbose=0)
    a.save(tmp_path / "m.sgck")
    b = model(seed=99)
    b.load(tmp_path / "m.sgck")
    np.testing.assert_array_equal(a.params, b.params)
    assert (b.step, b.epoch) == (a.step, a.epoch) == (7, 1)
    assert b._core.get_rng() == a._core.get_rng()
    assert b.optimizer.get_state()[0] == 7
    np.testing.assert_array_equal(a.optimizer.get_state()[1], b.optimizer.get_state()[1])
    a.fit(x, y, batch_size=32, epochs=3, verbose=0)
    b.fit(x, y, batch_size=32, epochs=3, verbose=0)
    np.testing.assert_array_equal(a.params, b.params)
    # a model loaded before compile gets its optimizer state at compile
    c = Sequential([Dense(16, activation="relu", input_shape=(10,)), Dropout(0.3), Dense(3)], seed=1)
    c.load(tmp_path / "m.sgck")
    c.compile(optimizer=Adam(0.01), loss="sparse_categorical_crossentropy")
    assert c.optimizer.iterations == 7


def test_resume_after_interruption_matches_an_uninterrupted_run(tmp_path):
    x, y = data()
    whole = model()
    whole.fit(x, y, batch_size=32, epochs=3, verbose=0)
    first = model()
    first.fit(x, y, batch_size=32, epochs=3, max_steps=10, verbose=0, checkpoint_dir=str(tmp_path), checkpoint_every=5)
    assert first.step == 10 and first.epoch == 1
    names = sorted(os.listdir(tmp_path))
    assert names == ["ckpt-0000000005.sgck", "ckpt-0000000007.sgck", "ckpt-0000000010.sgck"]
    resumed = model(seed=123)  # different initial weights: everything comes from the checkpoint
    resumed.fit(x, y, batch_size=32, epochs=3, verbose=0, checkpoint_dir=str(tmp_path), keep_last=2)
    assert resumed.step == whole.step == 21
    np.testing.assert_array_equal(resumed.params, whole.params)
    assert resumed._core.get_rng() == whole._core.get_rng()
    assert sorted(os.listdir(tmp_path)) == ["ckpt-0000000014.sgck", "ckpt-0000000021.sgck"]
    assert not [n for n in os.listdir(tmp_path) if ".tmp" in n]


def test_best_only_checkpoint_follows_the_monitored_metric(tmp_path):
    x, y = data()
    m = model()
    h = m.fit(
        x,
        y,
        batch_size=32,
        epochs=4,
        verbose=0,
        validation_data=(x[:50], y[:50]),
        checkpoint_dir=str(tmp_path),
        save_best_only=True,
        monitor="val_loss",
    )
    best = ck.decode((tmp_path / "best.sgck").read_bytes(), "best")
    assert best["metric"] == pytest.approx(min(h.history["val_loss"]))
    assert best["epoch"] == 1 + int(np.argmin(h.history["val_loss"]))


def test_sync_dir_mirrors_whole_checkpoints(tmp_path):
    x, y = data()
    local, remote = tmp_path / "local", tmp_path / "dbfs"
    m = model()
    m.fit(
        x,
        y,
        batch_size=32,
        epochs=4,
        verbose=0,
        validation_data=(x[:50], y[:50]),
        checkpoint_dir=str(local),
        keep_last=2,
        save_best_only=True,
        sync_dir=str(remote),
        sync_every_secs=3600,
    )
    assert (
        sorted(os.listdir(remote))
        == sorted(os.listdir(local))
        == ["best.sgck", "ckpt-0000000021.sgck", "ckpt-0000000028.sgck"]
    )
    for name in os.listdir(local):
        assert (local / name).read_bytes() == (remote / name).read_bytes()
    # a node that lost its local disk resumes from the synced copy
    fresh = model(seed=5)
    fresh.fit(
        x, y, batch_size=32, epochs=5, verbose=0, checkpoint_dir=str(tmp_path / "new-local"), sync_dir=str(remote)
    )
    assert fresh.step == 35


def test_corrupt_truncated_and_foreign_checkpoints_are_rejected(tmp_path):
    m = model()
    path = tmp_path / "m.sgck"
    m.save(path)
    raw = bytearray(path.read_bytes())
    assert raw[:8] == ck.MAGIC and struct.unpack_from("<I", raw, 8)[0] == 1
    assert len(raw) == 128 + 4 * (m.num_params + 2 * m.num_params) + 4
    bad = bytearray(raw)
    bad[200] ^= 0x40
    (tmp_path / "bad.sgck").write_bytes(bad)
    with pytest.raises(CheckpointError, match="CRC mismatch"):
        m.load(tmp_path / "bad.sgck")
    (tmp_path / "short.sgck").write_bytes(raw[:-10])
    with pytest.raises(CheckpointError, match="announces"):
        m.load(tmp_path / "short.sgck")
    (tmp_path / "junk.sgck").write_bytes(b"x" * 300)
    with pytest.raises(CheckpointError, match="bad magic"):
        m.load(tmp_path / "junk.sgck")
    other = Sequential([Dense(8, input_shape=(10,)), Dense(3)], seed=1)
    with pytest.raises(CheckpointError, match="different architecture"):
        other.load(path)
    sgd = model(opt=SGD(0.1))
    with pytest.raises(CheckpointError, match="'adam' optimizer state"):
        sgd.load(path)


def test_export_npz_writes_keras_layout_weights(tmp_path):
    m = model()
    m.export_npz(tmp_path / "w.npz")
    z = np.load(tmp_path / "w.npz")
    assert sorted(z.files) == ["layer0_bias", "layer0_kernel", "layer2_bias", "layer2_kernel"]
    np.testing.assert_array_equal(z["layer0_kernel"], m.get_weights()[0])
    assert z["layer2_kernel"].shape == (16, 3)


def test_progress_bar_can_be_on_or_off(capsys):
    x, y = data()
    model().fit(x, y, batch_size=32, epochs=1, verbose=1)
    err = capsys.readouterr().err
    assert "7/7" in err and "step" in err
    model().fit(x, y, batch_size=32, epochs=1, verbose=0)
    out = capsys.readouterr()
    assert out.err == "" and out.out == ""


def test_tensorboard_scalars_go_through_the_event_writer(monkeypatch, tmp_path):
    written = []

    class EventWriter:
        def __init__(self, logdir):
            self.logdir = logdir

        def scalar(self, tag, value, step):
            written.append((tag, float(value), int(step)))

        def close(self):
            written.append(("closed", 0.0, 0))

    monkeypatch.setitem(sys.modules, "sparkgrad.summary", types.SimpleNamespace(EventWriter=EventWriter))
    x, y = data()
    model().fit(x, y, batch_size=32, epochs=2, verbose=0, log_every=3, tensorboard_dir=str(tmp_path))
    tags = {t for t, _, _ in written}
    assert {"train/loss", "train/accuracy", "train/lr", "epoch/loss", "epoch/accuracy", "closed"} <= tags
    assert [s for t, _, s in written if t == "train/loss"] == [3, 6, 7, 10, 13, 14]


def test_png_of_curves_on_request(tmp_path):
    pytest.importorskip("matplotlib")
    x, y = data()
    model().fit(x, y, batch_size=32, epochs=2, verbose=0, validation_data=(x, y), plot_path=str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
