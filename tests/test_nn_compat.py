"""Files written by sparkgrad 0.1 still load: a saved model and a checkpoint committed in
tests/fixtures/compat (written by its make_compat.py at the commit before the loss table), and a file
of an unknown format version is an error naming both versions."""

from __future__ import annotations

import pathlib
import struct

import numpy as np
import pytest
from sparkgrad.errors import CheckpointError, ModelError
from sparkgrad.nn import Adam, Dense, Dropout, Sequential, load_model, model_from_bytes

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "compat"


@pytest.fixture(scope="module")
def expected():
    with np.load(FIXTURES / "expected-0.1.npz") as f:
        return {k: f[k] for k in f.files}


def test_a_model_saved_by_0_1_loads_compiled_and_gives_its_outputs(expected):
    m = load_model(FIXTURES / "model-0.1.sgmodel")
    assert m.name == "compat" and m.loss == "sparse_categorical_crossentropy" and m.head == "softmax"
    assert [x.name for x in m.metrics] == ["accuracy"]
    np.testing.assert_array_equal(m.params, expected["params"])
    # 0.1 computed exp(log_softmax) through oneDNN; the loss table divides the exponentials by their sum:
    # a few float32 roundings apart
    np.testing.assert_allclose(m.predict(expected["x"]), expected["predict"], rtol=1e-5, atol=1e-7)
    loss, acc = m.evaluate(expected["x"], expected["y"])
    assert loss == pytest.approx(float(expected["loss"]), rel=1e-6)
    assert acc == float(expected["accuracy"])


def test_a_checkpoint_written_by_0_1_restores_weights_step_and_optimizer_and_training_goes_on(expected):
    m = Sequential(
        [Dense(16, activation="relu", input_shape=(12,)), Dropout(0.1), Dense(3, activation="softmax")], seed=99
    )
    m.compile(optimizer=Adam(0.01), loss="sparse_categorical_crossentropy")
    m.load(FIXTURES / "checkpoint-0.1.sgck")
    np.testing.assert_array_equal(m.params, expected["params"])
    assert m.step == int(expected["step"])
    steps, slots = m.optimizer.get_state()
    assert steps == int(expected["step"]) and np.any(slots != 0)  # Adam's moments came back
    m.fit(expected["x"], expected["y"], batch_size=16, epochs=1, verbose=0)
    assert m.step == int(expected["step"]) + 4 and np.all(np.isfinite(m.params))


def test_unknown_format_versions_name_both_versions(tmp_path):
    data = bytearray((FIXTURES / "model-0.1.sgmodel").read_bytes())
    struct.pack_into("<I", data, 8, 7)
    with pytest.raises(ModelError, match="format version 7 at offset 8; this sparkgrad reads versions 1, 2, 3"):
        model_from_bytes(bytes(data), "m.sgmodel")
    ckpt = bytearray((FIXTURES / "checkpoint-0.1.sgck").read_bytes())
    struct.pack_into("<I", ckpt, 8, 9)
    path = tmp_path / "c.sgck"
    path.write_bytes(bytes(ckpt))
    m = load_model(FIXTURES / "model-0.1.sgmodel")
    with pytest.raises(CheckpointError, match="format version 9 at byte 8; this sparkgrad reads versions 1, 2"):
        m.load(path)
