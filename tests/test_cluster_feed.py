"""Rows of a Spark partition become typed NumPy columns for the C feed (no pickle)."""

from __future__ import annotations

import numpy as np
import pytest
from sparkgrad.cluster.feed import DataFeed, rows_to_columns
from sparkgrad.errors import InvalidArgumentError


def test_tuples_become_numbered_columns_with_float32_features():
    cols = rows_to_columns([([1.0, 2.0], 3), ([4.0, 5.0], 6)])
    assert list(cols) == ["0", "1"]
    assert cols["0"].dtype == np.float32 and cols["0"].shape == (2, 2)
    assert cols["1"].dtype == np.int64 and cols["1"].tolist() == [3, 6]


def test_spark_rows_keep_their_field_names():
    pyspark_sql = pytest.importorskip("pyspark.sql")
    row = pyspark_sql.Row(image=[0, 255], label=7)
    cols = rows_to_columns([row, row])
    assert list(cols) == ["image", "label"] and cols["image"].shape == (2, 2)


def test_binary_values_become_one_uint8_column_packed_in_c():
    pyspark_sql = pytest.importorskip("pyspark.sql")
    example = pyspark_sql.Row("image_raw", "label")
    rows = [example(bytes([i, 255 - i, 7]), i) for i in range(5)]
    rows[1] = example(bytearray(rows[1].image_raw), 1)  # any bytes-like value
    cols = rows_to_columns(rows)
    assert cols["image_raw"].dtype == np.uint8 and cols["image_raw"].shape == (5, 3)
    assert cols["image_raw"][:, 0].tolist() == [0, 1, 2, 3, 4] and cols["image_raw"][3, 1] == 252
    assert cols["label"].tolist() == [0, 1, 2, 3, 4]


def test_binary_values_of_different_lengths_are_refused_naming_row_and_column():
    with pytest.raises(InvalidArgumentError, match=r"column '0'.*row 2 holds 1 bytes, expected 2"):
        rows_to_columns([(b"ab", 0), (b"cd", 1), (b"e", 2)])
    with pytest.raises(InvalidArgumentError, match="row 1 is int, not bytes"):
        rows_to_columns([(b"ab", 0), (5, 1)])


def test_bare_values_are_one_column():
    assert rows_to_columns([1.5, 2.5])["0"].tolist() == [1.5, 2.5]


def test_strings_and_ragged_rows_are_refused_naming_the_column():
    with pytest.raises(InvalidArgumentError, match="column '1' has dtype"):
        rows_to_columns([(1, "a"), (2, "b")])
    with pytest.raises(InvalidArgumentError, match="column '0': rows differ in shape or length"):
        rows_to_columns([([1, 2], 0), ([1], 0)])


def test_datafeed_needs_a_feed():
    with pytest.raises(InvalidArgumentError, match="InputMode.SPARK"):
        DataFeed(None)
