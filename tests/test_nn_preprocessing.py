"""Preprocessing layers (sparkgrad.nn.preprocessing) run in C in the batch gather: each against Keras' own
layer on the same inputs (tests/fixtures/keras/preprocessing.npz, from make_preprocessing.py), adapt,
models that read string and integer columns, save/load and checkpoints, and the errors."""

import json
import pathlib

import numpy as np
import pytest
from sparkgrad import _core
from sparkgrad.errors import InvalidArgumentError, ModelError
from sparkgrad.nn import (
    Adam,
    CategoryEncoding,
    Dense,
    Hashing,
    Input,
    IntegerLookup,
    Model,
    Normalization,
    StringColumn,
    StringLookup,
    load_model,
    save_model,
)
from sparkgrad.nn import checkpoint as ckpt
from sparkgrad.nn import preprocessing as prep

FIXTURES = np.load(pathlib.Path(__file__).parent / "fixtures" / "keras" / "preprocessing.npz")
CASES = sorted({k.split("/")[0] for k in FIXTURES.files})


def _layer(case):
    meta = json.loads(str(FIXTURES[f"{case}/args"]))
    layer = getattr(prep, meta["class"])(**meta["args"])
    if meta["adapt"]:
        data = [FIXTURES[k] for k in sorted(k for k in FIXTURES.files if k.startswith(f"{case}/adapt"))]
        layer.adapt(data[0] if len(data) == 1 else iter(data))
    return layer, meta


@pytest.mark.parametrize("case", CASES)
def test_layer_gives_what_keras_gives(case):
    layer, meta = _layer(case)
    out, want = layer(FIXTURES[f"{case}/in"]), FIXTURES[f"{case}/out"]
    assert out.shape == want.shape
    # ids and encodings exactly; Normalization in float32, in Keras' order of operations: also exactly
    np.testing.assert_array_equal(out, want.astype(out.dtype))
    if meta["adapt"] and meta["class"] == "Normalization":
        np.testing.assert_array_equal(layer.mean.reshape(-1), FIXTURES[f"{case}/mean"])
        np.testing.assert_array_equal(layer.variance.reshape(-1), FIXTURES[f"{case}/variance"])
    elif meta["adapt"] and meta["class"] == "Discretization":
        np.testing.assert_array_equal(np.float32(layer.bin_boundaries), FIXTURES[f"{case}/bounds"])
    elif meta["adapt"]:
        assert [str(v) for v in layer.get_vocabulary()] == FIXTURES[f"{case}/vocab"].tolist()


def test_hashes_are_tensorflows():
    # tf.strings.to_hash_bucket_fast / _strong on these strings, num_buckets 1000003, key [7, 11]
    words = [b"", b"a", b"hello", "Köln".encode(), b"x" * 100]
    assert [_core.fingerprint64(w) % 1000003 for w in words] == [377723, 291400, 497363, 336206, 107918]
    assert [_core.siphash(7, 11, w) % 1000003 for w in words] == [360241, 54883, 37178, 475753, 316934]


def _city_model(seed=0):
    city = Input(shape=(1,), dtype="string", name="city")
    lookup = StringLookup(vocabulary=["paris", "rome", "oslo"], name="lookup")
    onehot = CategoryEncoding(num_tokens=lookup.vocabulary_size(), output_mode="one_hot", name="onehot")
    out = Dense(1, activation="sigmoid", name="click")(onehot(lookup(city)))
    return Model(city, out, seed=seed), lookup, onehot


def test_string_chain_predicts_what_its_dense_gives_on_the_eager_encoding():
    model, lookup, onehot = _city_model()
    x = np.array(["paris", "oslo", "berlin", "rome", "oslo"])
    enc = onehot(lookup(x.reshape(-1, 1)))
    kernel, bias = model.get_weights()
    want = 1 / (1 + np.exp(-(enc @ kernel + bias)))
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-6)
    assert model.preprocessing == [[lookup, onehot]]
    assert model.input_shape == (1,)


def test_input_string_lookup_category_encoding_dense_trains():
    model, _, _ = _city_model()
    rng = np.random.default_rng(0)
    x = np.array(["paris", "rome", "oslo", "berlin"])[rng.integers(0, 4, 512)]
    y = np.isin(x, ["oslo", "berlin"]).astype(np.float32)  # berlin is out of vocabulary: the OOV id
    model.compile(optimizer=Adam(learning_rate=0.1), loss="binary_crossentropy", metrics=["accuracy"])
    first = model.evaluate(x, y, verbose=0)
    model.fit(x, y, batch_size=32, epochs=10, verbose=0)
    loss, acc = model.evaluate(x, y, verbose=0)
    assert loss < first[0] / 3 and acc == 1.0


def test_arrow_layout_with_int32_offsets_is_read_as_numpy_strings():
    model, _, _ = _city_model()
    x = np.array(["rome", "", "oslo", "köln"])
    data = np.frombuffer("".join(x).encode(), np.uint8)
    offsets = np.concatenate([[0], np.cumsum([len(s.encode()) for s in x])]).astype(np.int32)
    np.testing.assert_array_equal(model.predict(StringColumn(offsets, data, 1)), model.predict(x))
    np.testing.assert_array_equal(model.predict(x.astype(object)), model.predict(np.array([s.encode() for s in x])))


def test_string_column_takes_rows_like_an_array():
    col = StringColumn.from_array(np.array(["a", "bb", "", "ccc", "d", "ee"]), 2)
    part = col[np.array([2, 0])]
    assert part.shape == (2, 2)
    assert StringLookup(vocabulary=["a", "bb", "d", "ee"])(part).tolist() == [[3, 4], [1, 2]]


def test_integer_and_hashed_columns_feed_one_model():
    ids = Input(shape=(2,), dtype="int64", name="ids")
    words = Input(shape=(1,), dtype="string", name="words")
    a = IntegerLookup(vocabulary=[10, 20, 30], output_mode="multi_hot")(ids)
    b = Hashing(num_bins=8, output_mode="one_hot")(words)
    h = Dense(4, activation="relu")(prep_concat([a, b]))
    model = Model([ids, words], Dense(1)(h), seed=1)
    model.compile(optimizer="sgd", loss="mse")
    x = {"ids": np.array([[10, 99], [30, 20], [5, 10]]), "words": np.array(["a", "b", "c"])}
    model.fit(x, np.zeros(3, np.float32), batch_size=2, epochs=1, verbose=0)
    assert model.predict(x).shape == (3, 1)


def prep_concat(ts):
    from sparkgrad.nn import Concatenate

    return Concatenate()(ts)


def test_normalization_in_a_model_standardizes_the_gathered_rows():
    rng = np.random.default_rng(2)
    x = rng.normal(4.0, 3.0, size=(64, 3)).astype(np.float32)
    norm = Normalization()
    norm.adapt(x)
    inp = Input(shape=(3,))
    model = Model(inp, Dense(2)(norm(inp)), seed=0)
    kernel, bias = model.get_weights()
    np.testing.assert_allclose(model.predict(x), norm(x) @ kernel + bias, rtol=1e-5, atol=1e-6)


def test_adapt_after_the_model_is_built_is_used_by_the_next_call():
    words = Input(shape=(1,), dtype="string")
    lookup = StringLookup()
    model = Model(words, Dense(1)(lookup(words)), seed=0)
    lookup.adapt(np.array(["b", "a", "b"]))
    model.set_weights([np.ones((1, 1), np.float32), np.zeros(1, np.float32)])
    np.testing.assert_array_equal(model.predict(np.array(["b", "a", "zz"])).ravel(), [1.0, 2.0, 0.0])


def test_save_and_load_keep_the_adapted_vocabulary(tmp_path):
    model, lookup, _ = _city_model(seed=4)
    x = np.array(["paris", "oslo", "berlin", "rome"])
    save_model(model, tmp_path / "m.sgmodel")
    back = load_model(tmp_path / "m.sgmodel")
    np.testing.assert_array_equal(back.predict(x), model.predict(x))
    assert back.preprocessing[0][0].get_vocabulary() == lookup.get_vocabulary()
    assert back.inputs[0].dtype == "string"


def test_checkpoint_carries_the_vocabulary_into_a_model_built_again(tmp_path):
    def build(vocab):
        words = Input(shape=(1,), dtype="string")
        lookup = StringLookup(vocabulary=vocab)
        return Model(words, Dense(1)(lookup(words)), seed=0), lookup

    model, _ = build(["x", "y"])
    ckpt.save(model, tmp_path / "c.sgck")
    other, lookup = build(["q", "r"])
    ckpt.load(other, tmp_path / "c.sgck")
    assert lookup.get_vocabulary() == ["[UNK]", "x", "y"]
    np.testing.assert_array_equal(other.predict(np.array(["y", "q"])), model.predict(np.array(["y", "q"])))


def test_mlflow_pyfunc_scores_a_string_dataframe(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("mlflow")
    import sparkgrad.mlflow as sgm

    model, _, _ = _city_model()
    sgm.save_model(model, tmp_path / "mlm")
    import mlflow.pyfunc

    loaded = mlflow.pyfunc.load_model(str(tmp_path / "mlm"))
    df = pd.DataFrame({"city": ["rome", "oslo", "lima"]})
    np.testing.assert_array_equal(loaded.predict(df), model.predict(np.array(["rome", "oslo", "lima"])))


# ---- errors -----------------------------------------------------------------------------------------


def test_a_string_column_fed_to_a_numeric_input_names_the_input():
    inp = Input(shape=(1,), name="price")
    model = Model(inp, Dense(1)(inp), seed=0)
    with pytest.raises(InvalidArgumentError, match="input 'price' takes numbers, but a string column"):
        model.predict(np.array(["1.5", "2"]))


def test_numbers_fed_to_a_string_lookup_name_the_input_and_layer():
    model, _, _ = _city_model()
    with pytest.raises(InvalidArgumentError, match="input 'city' feeds StringLookup 'lookup', which takes strings"):
        model.predict(np.array([1.0, 2.0]))


def test_a_missing_vocabulary_file_is_named(tmp_path):
    with pytest.raises(InvalidArgumentError, match="vocabulary file .*nope.txt' does not exist"):
        StringLookup(vocabulary=str(tmp_path / "nope.txt"))


def test_a_vocabulary_file_with_duplicates_names_the_lines(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("a\nb\nc\nb\n")
    with pytest.raises(InvalidArgumentError, match=r"repeats 'b' on lines 2 and 4"):
        StringLookup(vocabulary=str(path))
    path.write_text("a\nb\nc\n")
    assert StringLookup(vocabulary=str(path)).get_vocabulary() == ["[UNK]", "a", "b", "c"]


def test_a_repeated_token_in_a_list_is_named():
    with pytest.raises(InvalidArgumentError, match=r"repeats \[7\]"):
        IntegerLookup(vocabulary=[1, 7, 7])


@pytest.mark.parametrize("layer", [StringLookup(), IntegerLookup(), Normalization()])
def test_adapt_on_an_empty_dataset_is_an_error(layer):
    with pytest.raises(InvalidArgumentError, match="adapt got no values"):
        layer.adapt(iter([]))


def test_oov_without_oov_indices_names_the_row_and_column():
    words = Input(shape=(2,), dtype="string")
    model = Model(words, Dense(1)(StringLookup(vocabulary=["a", "b"], num_oov_indices=0, name="strict")(words)))
    with pytest.raises(
        InvalidArgumentError, match=r"StringLookup 'strict': value 'zz' of row 1 \(column 1\) is not in"
    ):
        model.predict(np.array([["a", "b"], ["b", "zz"]]))


def test_an_id_outside_category_encoding_names_the_row():
    ids = Input(shape=(2,), dtype="int64")
    model = Model(ids, Dense(1)(CategoryEncoding(num_tokens=4, name="enc")(ids)))
    with pytest.raises(InvalidArgumentError, match=r"CategoryEncoding 'enc': value 9 of row 2 \(column 0\)"):
        model.predict(np.array([[0, 1], [2, 3], [9, 0]]))


def test_a_preprocessing_layer_after_another_layer_says_where_it_goes():
    inp = Input(shape=(3,))
    with pytest.raises(ModelError, match="go directly on a model Input"):
        Model(inp, Dense(1)(Hashing(num_bins=4)(Dense(2)(inp))))


def test_a_string_input_without_a_lookup_is_refused():
    words = Input(shape=(1,), dtype="string", name="w")
    with pytest.raises(ModelError, match="Input 'w' has dtype 'string': put a StringLookup or Hashing"):
        Model(words, Dense(1)(words))


def test_an_input_read_by_a_lookup_and_another_layer_is_refused():
    ids = Input(shape=(1,), dtype="int64", name="ids")
    with pytest.raises(ModelError, match="Input 'ids' feeds a preprocessing layer and others"):
        Model(ids, prep_concat([Dense(1)(ids), Dense(1)(IntegerLookup(vocabulary=[1])(ids))]))


def test_a_vocabulary_that_changes_an_encodings_width_after_build_is_an_error():
    words = Input(shape=(1,), dtype="string")
    lookup = StringLookup(vocabulary=["a"], output_mode="one_hot")
    model = Model(words, Dense(1)(lookup(words)))
    lookup.set_vocabulary(["a", "b"])
    with pytest.raises(ModelError, match="now gives 3 values per row; the model was built for 2"):
        model.predict(np.array(["a"]))


def test_sequential_refuses_a_preprocessing_layer():
    from sparkgrad.nn import Sequential

    with pytest.raises(ModelError, match=r"layer 0 \(StringLookup\) is a preprocessing layer: put it on an Input"):
        Sequential([StringLookup(vocabulary=["a"]), Dense(1)])


def test_every_layers_state_survives_save_and_load(tmp_path):
    from sparkgrad.nn import Discretization

    rng = np.random.default_rng(5)
    words = np.array(["a", "b", "c", "d"])[rng.integers(0, 4, (40, 2))]
    ids = rng.integers(0, 9, (40, 3))
    nums = rng.normal(size=(40, 2)).astype(np.float32)
    lookup = StringLookup(mask_token="", num_oov_indices=2, output_mode="count")
    lookup.adapt(words)
    ilookup = IntegerLookup(oov_method="farmhash", salt=3)
    ilookup.adapt(ids)
    norm = Normalization()
    norm.adapt(nums)
    disc = Discretization(num_bins=3, output_mode="multi_hot")
    disc.adapt(nums)
    ins = [
        Input(shape=(2,), dtype="string", name="w"),
        Input(shape=(3,), dtype="int64", name="i"),
        Input(shape=(2,), name="n"),
        Input(shape=(2,), name="d"),
        Input(shape=(2,), dtype="string", name="h"),
    ]
    parts = [lookup(ins[0]), ilookup(ins[1]), norm(ins[2]), disc(ins[3]), Hashing(5, salt=(1, 2))(ins[4])]
    model = Model(ins, Dense(2)(prep_concat(parts)), seed=2)
    x = {"w": words, "i": ids, "n": nums, "d": nums, "h": words}
    save_model(model, tmp_path / "all.sgmodel")
    back = load_model(tmp_path / "all.sgmodel")
    np.testing.assert_array_equal(back.predict(x), model.predict(x))
    got = back.preprocessing
    assert got[0][0].get_vocabulary() == lookup.get_vocabulary() and got[3][0].bin_boundaries == disc.bin_boundaries


def test_summary_lists_the_preprocessing_layers_before_the_others():
    model, _, _ = _city_model()
    text = model.summary(print_fn=None)
    assert "lookup (StringLookup)" in text and "onehot (CategoryEncoding)  (None, 4)" in text
    assert text.index("onehot") < text.index("click (Dense)")


def test_keras_arguments_not_supported_here_are_refused_by_name():
    with pytest.raises(ValueError, match=r"StringLookup\(invert=True\) is not supported"):
        StringLookup(vocabulary=["a"], invert=True)
    with pytest.raises(ValueError, match=r"CategoryEncoding\(sparse=True\) is not supported"):
        CategoryEncoding(3, sparse=True)
