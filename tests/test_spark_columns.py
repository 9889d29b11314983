"""sparkgrad.spark.columns.FeatureSpec: column arrays -> the model's x and y (no Spark: what an Estimator worker
runs on its ParquetDataset batches and a scoring task on its Arrow columns)."""

from __future__ import annotations

import numpy as np
import pytest
from sparkgrad.errors import InvalidArgumentError
from sparkgrad.spark.columns import FeatureSpec, InputColumns, input_columns

pa = pytest.importorskip("pyarrow")


def _spec(features, width, shape, label=None, loss="sparse_categorical_crossentropy", classes=0):
    """The spec of a model of one float32 input of ``shape`` fed by ``features``."""
    assert int(np.prod(shape)) == width
    return FeatureSpec((InputColumns("x", tuple(features), "float32", tuple(shape)),), label, loss, classes)


def test_input_columns_are_flattened_and_concatenated_in_order_and_labels_become_int64():
    spec = _spec(("a", "b", "c"), 6, (6,), "y", classes=3)
    cols = {
        "a": np.array([[1, 2], [3, 4]], np.float32),
        "b": np.array([[[5, 6], [7, 8]], [[9, 10], [11, 12]]], np.uint8),  # [rows, 2, 2] -> 4 values
        "c": np.array([], np.float32).reshape(2, 0),
        "y": np.array([2.0, 0.0]),  # StringIndexer's doubles
    }
    x, y = spec.x(cols, 0, 0), spec.y(cols, 0, 0)
    assert x.dtype == np.float32 and x.tolist() == [[1, 2, 5, 6, 7, 8], [3, 4, 9, 10, 11, 12]]
    assert y.dtype == np.int64 and y.tolist() == [2, 0]


def test_a_single_binary_column_stays_uint8_and_an_empty_frame_has_the_model_width():
    spec = _spec(("raw",), 4, (2, 2))
    x = spec.x({"raw": np.arange(8, dtype=np.uint8).reshape(2, 4)}, 0, 0)
    assert x.dtype == np.uint8 and x.shape == (2, 4)
    assert spec.x({"raw": np.zeros((0, 0), np.uint8)}, 0, 0).shape == (0, 4)


@pytest.mark.parametrize(
    ("y", "message"),
    [
        (np.array([1, 3]), r"^partition 5, row 11: label column 'y' holds 3; sparse_categorical_crossentropy"),
        (np.array([1.5, 0.0]), r"^partition 5, row 10: label column 'y' holds 1.5; "),
        (
            np.array([-1, 0]),
            r"^partition 5, row 10: label column 'y' holds -1; .* in \[0, 3\) \(the model has 3 outputs\)$",
        ),
    ],
    ids=["too_big", "fraction", "negative"],
)
def test_labels_out_of_range_are_refused_naming_partition_row_and_range(y, message):
    spec = _spec(("x",), 1, (1,), "y", classes=3)
    with pytest.raises(InvalidArgumentError, match=message) as e:
        spec.y({"x": np.zeros((2, 1), np.float32), "y": y}, 5, 10)
    assert e.value.column == "y" and e.value.partition == 5


def test_binary_labels_become_float32_targets_and_values_outside_0_1_name_partition_and_row():
    spec = _spec(("x",), 1, (1,), "y", "binary_crossentropy", classes=1)
    x = np.zeros((3, 1), np.float32)
    for y in (np.array([0.0, 1.0, 0.25]), np.array([False, True, False])):
        out = spec.y({"x": x, "y": y}, 0, 0)
        assert out.dtype == np.float32 and out.shape == (3, 1) and out[1, 0] == 1.0
    for y, message in (
        (np.array([0.0, 2.0, 1.0]), r"^partition 5, row 11: label column 'y' holds 2.0; binary_crossentropy takes "),
        (np.array([0.0, 1.0, np.nan]), r"^partition 5, row 12: label column 'y' holds nan; .* values in \[0, 1\]$"),
    ):
        with pytest.raises(InvalidArgumentError, match=message) as e:
            spec.y({"x": x, "y": y}, 5, 10)
        assert e.value.column == "y" and e.value.partition == 5


def test_regression_targets_must_be_finite_and_of_the_models_output_width():
    spec = _spec(("x",), 1, (1,), "t", "mean_squared_error", classes=2)
    x = np.zeros((2, 1), np.float32)
    assert spec.y({"x": x, "t": np.array([[1.5, -2.0], [0.0, 3.0]])}, 0, 0).tolist() == [[1.5, -2.0], [0.0, 3.0]]
    with pytest.raises(
        InvalidArgumentError,
        match=r"^partition 1, label column 't' holds 1 values per row; mean_squared_error takes targets of 2 "
        r"\(the model's outputs\)$",
    ):
        spec.y({"x": x, "t": np.array([1.0, 2.0])}, 1, 0)
    with pytest.raises(
        InvalidArgumentError, match=r"^partition 1, row 8: label column 't' holds \[0.0, inf\]; .* finite"
    ):
        spec.y({"x": x, "t": np.array([[1.0, 2.0], [0.0, np.inf]])}, 1, 7)


def test_output_kind_and_binary_scores_follow_the_loss_and_the_head():
    from sparkgrad.nn import Dense, Sequential, losses
    from sparkgrad.spark.columns import Task, binary_scores, output_kind, resolve_loss

    sigmoid = Sequential([Dense(1, activation="sigmoid", input_shape=(3,))], seed=0)
    linear = Sequential([Dense(1, input_shape=(3,))], seed=0)
    assert output_kind(sigmoid, resolve_loss(None, sigmoid, "M")) == (Task.BINARY, True)  # by the head
    assert output_kind(linear, resolve_loss(None, linear, "M")) == (Task.CLASSES, False)
    assert output_kind(linear, resolve_loss("mse", linear, "M")) == (Task.REGRESSION, False)
    linear.compile(loss=losses.BinaryCrossentropy(from_logits=True))
    assert output_kind(linear, resolve_loss(None, linear, "M")) == (Task.BINARY, False)
    assert resolve_loss("binary_crossentropy", linear, "M").from_logits  # the compiled loss keeps its arguments
    with pytest.raises(InvalidArgumentError, match=r"^M: loss must be one of .*not 'hinge'$"):
        resolve_loss("hinge", linear, "M")
    p, z = binary_scores(np.array([[0.0], [0.5], [0.9], [1.0]], np.float32), probabilities=True)
    assert p[:, 0].tolist() == pytest.approx([0.0, 0.5, 0.9, 1.0])
    assert z[:, 0].tolist() == pytest.approx([-16.118, 0.0, np.log(9), 16.118], abs=1e-3)  # clipped at 1e-7
    p, z = binary_scores(np.array([[-800.0], [0.0], [2.0]], np.float32), probabilities=False)
    assert z[:, 0].tolist() == [-800.0, 0.0, 2.0] and p[:, 0].tolist() == pytest.approx(
        [0.0, 0.5, 1 / (1 + np.exp(-2))]
    )


def test_rows_of_the_wrong_width_are_refused_naming_columns_partition_and_rows():
    spec = _spec(("a", "b"), 5, (5,))
    with pytest.raises(
        InvalidArgumentError,
        match=r"^partition 2, rows 100..102: columns 'a', 'b' hold 4 values per row together; the model takes 5 "
        r"\(input_shape \(5,\)\)$",
    ):
        spec.x({"a": np.zeros((3, 2)), "b": np.zeros((3, 2))}, 2, 100)


def test_one_input_takes_input_mapping_then_input_cols_then_features_col():
    from sparkgrad.nn import Dense, Sequential

    one = Sequential([Dense(1, input_shape=(3,))])
    name = one.input_names[0]

    def cols(*args):
        return [inp.columns for inp in input_columns(one, *args, "E")]

    assert cols("f", None, {"p": "x", "q": "x", "l": "y"}) == [("p", "q")]
    assert cols("f", None, {"p": name, "l": "y"}) == [("p",)]  # the Input's own name works too
    assert cols("f", ["a", "b"], None) == [("a", "b")]
    assert cols("f", None, None) == [("f",)]
    with pytest.raises(InvalidArgumentError, match=r"input_mapping maps columns to 'x' \(features\) or 'y'"):
        cols("f", None, {"p": "image"})


def _tabular_model():
    from sparkgrad.nn import CategoryEncoding, Concatenate, Dense, Input, Model, StringLookup

    city = Input(shape=(1,), dtype="string", name="city")
    ids = Input(shape=(1,), dtype="int64", name="shop")
    amount = Input(shape=(2,), name="amount")
    hot = CategoryEncoding(num_tokens=4, output_mode="one_hot")(StringLookup(vocabulary=["a", "b", "c"])(city))
    return Model([city, ids, amount], Dense(1)(Concatenate()([hot, ids, amount])), seed=0)


def test_several_inputs_take_columns_by_input_name_or_by_input_mapping():
    model = _tabular_model()
    by_name = input_columns(model, "features", ["amount", "city", "shop"], None, "E")
    assert [(i.name, i.columns, i.dtype, i.shape) for i in by_name] == [
        ("city", ("city",), "string", (1,)),
        ("shop", ("shop",), "int64", (1,)),
        ("amount", ("amount",), "float32", (2,)),
    ]
    mapped = input_columns(model, None, None, {"town": "city", "a1": "amount", "a2": "amount", "s": "shop"}, "E")
    assert [i.columns for i in mapped] == [("town",), ("s",), ("a1", "a2")]  # a1 and a2 are concatenated


@pytest.mark.parametrize(
    ("cols", "mapping", "message"),
    [
        (None, None, r"^E: the model has inputs \['city', 'shop', 'amount'\]: set inputCols to columns named as"),
        (["city", "shop"], None, r"^E: input 'amount' of the model has no column: name a column as the input"),
        (["city", "shop", "amount", "extra"], None, r"^E: inputCols has 'extra', which is not an input of the model"),
        (None, {"c": "city", "s": "shop", "a": "x"}, r"^E: input_mapping maps column 'a' to 'x', which is not an"),
        (None, {"c": "city", "d": "city", "s": "shop", "a": "amount"}, r"^E: input 'city' takes strings .* from one"),
    ],
    ids=["nothing_mapped", "input_without_column", "unknown_column", "x_for_several", "two_string_columns"],
)
def test_a_mapping_that_does_not_fit_the_inputs_names_the_column_or_the_input(cols, mapping, message):
    with pytest.raises(InvalidArgumentError, match=message):
        input_columns(_tabular_model(), "features", cols, mapping, "E")


def test_a_parquet_batch_of_strings_ids_and_lists_is_the_models_x_as_arrays_are(tmp_path):
    import pyarrow.parquet as pq
    from sparkgrad.spark.training import TableRead

    model = _tabular_model()
    spec = FeatureSpec(input_columns(model, None, ["city", "shop", "amount"], None, "E"), "y", "mse", 1)
    table = pa.table(
        {
            "city": pa.array(["zz", "a", "köln", "", None, "b"]),
            "shop": pa.array(np.array([3, 1, 4, 1, 5, 9], np.int64)),
            "amount": pa.array([[1.0, float(i)] for i in range(6)], pa.list_(pa.float64())),
            "y": pa.array(np.arange(6.0)),
        }
    )
    pq.write_table(table, str(tmp_path / "t.parquet"), row_group_size=4)
    read = TableRead((str(tmp_path / "t.parquet"),), (("city", "skip"),), (("amount", 2),), 0, 0, 1)
    (batch,) = list(read.dataset(spec, 8, 0))  # one shard: every row but the null city's
    x = spec.x(batch, None, 0)
    assert x["shop"].dtype == np.int64 and x["shop"].ravel().tolist() == [3, 1, 4, 1, 9]
    want = {
        "city": np.array(["zz", "a", "köln", "", "b"], object),
        "shop": np.array([3, 1, 4, 1, 9], np.int64),
        "amount": np.array([[1.0, i] for i in (0, 1, 2, 3, 5)], np.float32),
    }
    np.testing.assert_array_equal(model.predict(x), model.predict(want))
    assert spec.y(batch, None, 0).ravel().tolist() == [0.0, 1.0, 2.0, 3.0, 5.0]


def test_nulls_strings_for_numbers_and_fractional_ids_name_the_column_and_row():
    from sparkgrad.cluster.arrow_feed import batch_to_columns

    spec = FeatureSpec(input_columns(_tabular_model(), None, ["city", "shop", "amount"], None, "E"))
    amount = pa.array([[1.0, 2.0]] * 3, pa.list_(pa.float64()))

    def frame(city, shop):
        return batch_to_columns(pa.RecordBatch.from_pydict({"city": city, "shop": shop, "amount": amount}), 2, 40, True)

    with pytest.raises(
        InvalidArgumentError, match=r"^partition 2: column 'city' .* 1 of its strings are null \(the first in row 41\)"
    ):
        frame(pa.array(["a", None, "b"]), pa.array([1, 2, 3]))
    with pytest.raises(
        InvalidArgumentError,
        match=r"^partition 2, row 42: column 'shop' holds 2.5; input 'shop' \(Input 'shop'\) takes int64 ids",
    ):
        spec.x(frame(pa.array(["a", "b", "c"]), pa.array([1.0, 2.0, 2.5])), 2, 40)
    with pytest.raises(
        InvalidArgumentError,
        match=r"^partition 2, column 'shop' holds strings; input 'shop' \(Input 'shop', dtype 'int64'\)",
    ):
        spec.x(frame(pa.array(["a", "b", "c"]), pa.array(["1", "2", "3"])), 2, 40)


def test_importing_sparkgrad_spark_does_not_import_pyspark():
    import subprocess
    import sys

    code = "import sys, sparkgrad, sparkgrad.spark, sparkgrad.spark.columns; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_a_workers_table_batches_of_a_string_input_train_as_model_fit_on_arrays_does(tmp_path):
    import pyarrow.parquet as pq
    from sparkgrad.nn import Adam, CategoryEncoding, Dense, Input, Model, StringLookup
    from sparkgrad.spark.training import TableBatches, TableRead

    def model():
        city = Input(shape=(1,), dtype="string", name="city")
        hot = CategoryEncoding(num_tokens=4, output_mode="one_hot")(StringLookup(vocabulary=["a", "b", "c"])(city))
        m = Model(city, Dense(1, activation="sigmoid")(hot), seed=3)
        m.compile(optimizer=Adam(0.05), loss="binary_crossentropy")
        return m

    rng = np.random.default_rng(0)
    cities = np.array(["a", "b", "c", "dd"])[rng.integers(0, 4, 256)]
    y = np.isin(cities, ["b", "dd"]).astype(np.float32)
    pq.write_table(pa.table({"city": cities, "y": y}), str(tmp_path / "t.parquet"), row_group_size=100)
    spec = FeatureSpec((InputColumns("city", ("city",), "string", (1,)),), "y", "binary_crossentropy", 1)
    batches = TableBatches(
        TableRead((str(tmp_path / "t.parquet"),), (), (), 0, 0, 1).dataset(spec, 64, 0), spec, 0, None
    )
    read, arrays = model(), model()
    read.fit(batches, epochs=2, verbose=0)  # what an Estimator worker's fit gets (files' order: no shuffle)
    arrays.fit(cities, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    assert batches.rows == 2 * 256
    for a, b in zip(read.get_weights(), arrays.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
