"""Saved models (sparkgrad.nn.saved): architecture, weights and input transform in one file."""

import numpy as np
import pytest
from sparkgrad.errors import ModelError
from sparkgrad.nn import (
    Conv2D,
    Dense,
    Dropout,
    Flatten,
    MaxPool2D,
    Sequential,
    load_model,
    model_from_bytes,
    model_to_bytes,
    save_model,
)


def _cnn():
    model = Sequential(
        [
            Conv2D(4, 3, padding="same", activation="relu", input_shape=(8, 8, 1)),
            MaxPool2D(2),
            Flatten(),
            Dropout(0.25),
            Dense(5, activation="softmax"),
        ],
        seed=3,
        name="tiny_cnn",
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (64, 8, 8, 1), dtype=np.uint8)
    y = rng.integers(0, 5, 64)
    mean = rng.normal(size=64).astype(np.float32)
    std = rng.uniform(0.5, 2, 64).astype(np.float32)
    model.set_input_transform(1 / 255, mean, std)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    return model, x, y


def test_a_saved_model_loads_with_its_architecture_weights_transform_and_loss(tmp_path):
    model, x, y = _cnn()
    path = tmp_path / "m.sgmodel"
    save_model(model, path)
    loaded = load_model(path)
    assert loaded.name == "tiny_cnn" and [type(a) for a in loaded.layers] == [type(a) for a in model.layers]
    assert loaded.layers[0].kernel_size == (3, 3) and loaded.layers[3].rate == 0.25
    np.testing.assert_array_equal(loaded.params, model.params)
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))
    assert loaded.evaluate(x, y, verbose=0) == pytest.approx(model.evaluate(x, y, verbose=0))
    assert model_to_bytes(loaded) == model_to_bytes(model)


def test_an_uncompiled_model_without_transform_round_trips():
    model = Sequential([Dense(3, input_shape=(4,))], seed=1)
    loaded = model_from_bytes(model_to_bytes(model))
    assert loaded.loss is None and loaded.input_transform == (None, None, None)
    np.testing.assert_array_equal(loaded.params, model.params)


def test_damaged_saved_models_are_refused_with_the_offset():
    data = bytearray(model_to_bytes(Sequential([Dense(3, input_shape=(4,))], seed=1)))
    with pytest.raises(ModelError, match=r"m\.bin: .*bad magic .* at offset 0"):
        model_from_bytes(b"X" + bytes(data[1:]), "m.bin")
    flipped = bytearray(data)
    flipped[-10] ^= 1
    with pytest.raises(ModelError, match=r"crc32 mismatch .* at offset"):
        model_from_bytes(flipped, "m.bin")
    with pytest.raises(ModelError, match="shorter than"):
        model_from_bytes(data[:10], "m.bin")
    with pytest.raises(ModelError, match=r"cannot read the saved model"):
        load_model("/nonexistent/m.sgmodel")
