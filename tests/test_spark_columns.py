"""sparkgrad.spark.columns.FeatureSpec: feed frames -> the model's x and y (no Spark: what the feeding tasks run)."""

from __future__ import annotations

import numpy as np
import pytest
from sparkgrad.errors import InvalidArgumentError
from sparkgrad.spark.columns import FeatureSpec, feature_columns

pa = pytest.importorskip("pyarrow")


def test_input_columns_are_flattened_and_concatenated_in_order_and_labels_become_int64():
    spec = FeatureSpec(("a", "b", "c"), 6, (6,), "y", classes=3)
    cols = {
        "a": np.array([[1, 2], [3, 4]], np.float32),
        "b": np.array([[[5, 6], [7, 8]], [[9, 10], [11, 12]]], np.uint8),  # [rows, 2, 2] -> 4 values
        "c": np.array([], np.float32).reshape(2, 0),
        "y": np.array([2.0, 0.0]),  # StringIndexer's doubles
    }
    out = spec(cols, 0, 0)
    assert out["x"].dtype == np.float32 and out["x"].tolist() == [[1, 2, 5, 6, 7, 8], [3, 4, 9, 10, 11, 12]]
    assert out["y"].dtype == np.int64 and out["y"].tolist() == [2, 0]


def test_a_single_binary_column_stays_uint8_and_an_empty_frame_has_the_model_width():
    spec = FeatureSpec(("raw",), 4, (2, 2))
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
    spec = FeatureSpec(("x",), 1, (1,), "y", classes=3)
    with pytest.raises(InvalidArgumentError, match=message) as e:
        spec({"x": np.zeros((2, 1), np.float32), "y": y}, 5, 10)
    assert e.value.column == "y" and e.value.partition == 5


def test_binary_labels_become_float32_targets_and_values_outside_0_1_name_partition_and_row():
    spec = FeatureSpec(("x",), 1, (1,), "y", "binary_crossentropy", classes=1)
    x = np.zeros((3, 1), np.float32)
    for y in (np.array([0.0, 1.0, 0.25]), np.array([False, True, False])):
        out = spec({"x": x, "y": y}, 0, 0)["y"]
        assert out.dtype == np.float32 and out.shape == (3, 1) and out[1, 0] == 1.0
    for y, message in (
        (np.array([0.0, 2.0, 1.0]), r"^partition 5, row 11: label column 'y' holds 2.0; binary_crossentropy takes "),
        (np.array([0.0, 1.0, np.nan]), r"^partition 5, row 12: label column 'y' holds nan; .* values in \[0, 1\]$"),
    ):
        with pytest.raises(InvalidArgumentError, match=message) as e:
            spec({"x": x, "y": y}, 5, 10)
        assert e.value.column == "y" and e.value.partition == 5


def test_regression_targets_must_be_finite_and_of_the_models_output_width():
    spec = FeatureSpec(("x",), 1, (1,), "t", "mean_squared_error", classes=2)
    x = np.zeros((2, 1), np.float32)
    assert spec({"x": x, "t": np.array([[1.5, -2.0], [0.0, 3.0]])}, 0, 0)["y"].tolist() == [[1.5, -2.0], [0.0, 3.0]]
    with pytest.raises(
        InvalidArgumentError,
        match=r"^partition 1, label column 't' holds 1 values per row; mean_squared_error takes targets of 2 "
        r"\(the model's outputs\)$",
    ):
        spec({"x": x, "t": np.array([1.0, 2.0])}, 1, 0)
    with pytest.raises(
        InvalidArgumentError, match=r"^partition 1, row 8: label column 't' holds \[0.0, inf\]; .* finite"
    ):
        spec({"x": x, "t": np.array([[1.0, 2.0], [0.0, np.inf]])}, 1, 7)


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
    spec = FeatureSpec(("a", "b"), 5, (5,))
    with pytest.raises(
        InvalidArgumentError,
        match=r"^partition 2, rows 100..102: columns 'a', 'b' hold 4 values per row together; the model takes 5 "
        r"\(input_shape \(5,\)\)$",
    ):
        spec.x({"a": np.zeros((3, 2)), "b": np.zeros((3, 2))}, 2, 100)


def test_feature_columns_come_from_input_mapping_then_input_cols_then_features_col():
    assert feature_columns("f", None, {"p": "x", "q": "x", "l": "y"}, "E") == ("p", "q")
    assert feature_columns("f", ["a", "b"], None, "E") == ("a", "b")
    assert feature_columns("f", None, None, "E") == ("f",)
    with pytest.raises(InvalidArgumentError, match=r"input_mapping maps columns to 'x' \(features\) or 'y'"):
        feature_columns("f", None, {"p": "image"}, "E")


def test_importing_sparkgrad_spark_does_not_import_pyspark():
    import subprocess
    import sys

    code = "import sys, sparkgrad, sparkgrad.spark, sparkgrad.spark.columns; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False", out.stderr
