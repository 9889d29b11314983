"""Checkpoint faults: a checkpoint directory that fills up (a 1 MB tmpfs), a corrupt checkpoint on resume."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
from sparkgrad.errors import CheckpointError
from sparkgrad.nn import Adam, Dense, Sequential
from sparkgrad.nn import checkpoint as ck

pytestmark = pytest.mark.timeout(120)


def _model(seed=4):
    # 10 -> 2560 -> 3: 35,843 parameters, 430 KB per checkpoint with Adam (two fit in 1 MB, three do not)
    m = Sequential([Dense(2560, activation="relu", input_shape=(10,)), Dense(3)], seed=seed)
    m.compile(optimizer=Adam(0.01), loss="sparse_categorical_crossentropy")
    return m


def _data(n=256):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, 10)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64)


@pytest.fixture
def small_tmpfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "ckpt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        r = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, f"umount {mnt}: {r.stderr}"


def test_checkpoint_dir_fills_up(small_tmpfs, fault):
    fault.describe(
        "checkpoint directory fills up (1 MB tmpfs, 430 KB checkpoints, keep_last=3)",
        "CheckpointError naming the path (No space left); earlier checkpoints intact; no partial file",
    )
    x, y = _data()
    m = _model()
    size = 128 + 4 * 3 * m.num_params + 4
    assert 2 * size < 1 << 20 < 3 * size, size
    fault.start()
    with pytest.raises(CheckpointError) as info:
        m.fit(
            x, y, batch_size=32, epochs=4, verbose=0, checkpoint_dir=str(small_tmpfs), checkpoint_every=2, keep_last=3
        )
    fault.stop()
    exc = info.value
    assert "No space left" in str(exc), exc
    assert str(small_tmpfs) in exc.path and exc.path.endswith(".sgck"), exc.path
    names = sorted(os.listdir(small_tmpfs))
    assert names == ["ckpt-0000000002.sgck", "ckpt-0000000004.sgck"], names  # the third one failed, whole
    for n in names:
        ck.decode((small_tmpfs / n).read_bytes(), n)  # each complete and valid
    resumed = _model(seed=9)
    resumed.load(small_tmpfs / names[-1])
    assert resumed.step == 4
    fault.observed(f"{type(exc).__name__}: {exc}; left {names}, both valid")
    fault.leftovers([n for n in os.listdir(small_tmpfs) if ".tmp" in n])


def test_corrupt_checkpoint_on_resume(tmp_path, fault):
    fault.describe(
        "latest checkpoint corrupted (one byte flipped) before resume",
        "CheckpointError naming the file and the byte offset",
    )
    x, y = _data()
    m = _model()
    m.fit(x, y, batch_size=32, epochs=1, verbose=0, checkpoint_dir=str(tmp_path), checkpoint_every=4)
    latest = sorted(tmp_path.glob("ckpt-*.sgck"))[-1]
    raw = bytearray(latest.read_bytes())
    raw[128 + 4 * 1000] ^= 0x10
    latest.write_bytes(bytes(raw))
    resumed = _model(seed=3)
    fault.start()
    with pytest.raises(CheckpointError) as info:
        resumed.fit(x, y, batch_size=32, epochs=2, verbose=0, checkpoint_dir=str(tmp_path))
    fault.stop()
    exc = info.value
    assert exc.path == str(latest), (exc.path, latest)
    assert exc.offset == len(raw) - 4 and f"byte {len(raw) - 4}" in str(exc), str(exc)
    fault.observed(f"{type(exc).__name__}: {exc}")
    fault.leftovers([n for n in os.listdir(tmp_path) if ".tmp" in n])
