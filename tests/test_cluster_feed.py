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


def test_bare_values_are_one_column():
    assert rows_to_columns([1.5, 2.5])["0"].tolist() == [1.5, 2.5]


def test_strings_and_ragged_rows_are_refused_naming_the_column():
    with pytest.raises(InvalidArgumentError, match="column '1' has dtype"):
        rows_to_columns([(1, "a"), (2, "b")])
    with pytest.raises(InvalidArgumentError, match="column '0'"):
        rows_to_columns([([1, 2], 0), ([1], 0)])


def test_datafeed_needs_a_feed():
    with pytest.raises(InvalidArgumentError, match="InputMode.SPARK"):
        DataFeed(None)
