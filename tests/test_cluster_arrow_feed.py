"""Arrow record batches -> feed columns (cluster/arrow_feed.py); pyarrow only, no Spark."""

from __future__ import annotations

import numpy as np
import pytest
from sparkgrad.cluster.arrow_feed import batch_to_columns, result_fields
from sparkgrad.cluster.feed import rows_to_columns
from sparkgrad.errors import InvalidArgumentError

pa = pytest.importorskip("pyarrow")


def test_numbers_are_zero_copy_views_and_float64_becomes_float32():
    ids = pa.array(np.arange(6, dtype=np.int64))
    batch = pa.RecordBatch.from_arrays(
        [ids, pa.array([0.5] * 6), pa.array([True, False] * 3), pa.array(np.ones(6, np.float32))],
        names=["id", "x", "flag", "w"],
    )
    cols = batch_to_columns(batch)
    assert cols["id"].dtype == np.int64 and cols["id"].tolist() == list(range(6))
    assert np.shares_memory(cols["id"], np.frombuffer(ids.buffers()[1], np.int64))  # the Arrow buffer, not a copy
    assert cols["x"].dtype == np.float32 and cols["x"].tolist() == [0.5] * 6
    assert cols["flag"].dtype == np.bool_ and cols["flag"].tolist() == [True, False] * 3
    assert cols["w"].dtype == np.float32


def test_fixed_size_and_equal_length_lists_become_rows_by_width():
    values = pa.array(np.arange(12, dtype=np.float64))
    fixed = pa.FixedSizeListArray.from_arrays(values, 3)
    lists = pa.array([[1, 2], [3, 4], [5, 6], [7, 8]], pa.list_(pa.int32()))
    nested = pa.array([[[1, 2], [3, 4]]] * 4, pa.list_(pa.list_(pa.int64(), 2)))
    cols = batch_to_columns(pa.RecordBatch.from_arrays([fixed, lists, nested], names=["f", "l", "n"]))
    assert cols["f"].shape == (4, 3) and cols["f"].dtype == np.float32 and cols["f"][3].tolist() == [9, 10, 11]
    assert cols["l"].shape == (4, 2) and cols["l"].dtype == np.int32 and cols["l"][2].tolist() == [5, 6]
    assert cols["n"].shape == (4, 2, 2) and cols["n"][0].tolist() == [[1, 2], [3, 4]]


def test_binary_values_of_one_length_become_uint8_rows_like_the_row_path():
    raw = [bytes([i] * 5) for i in range(7)]
    batch = pa.RecordBatch.from_arrays(
        [pa.array(raw, pa.binary()), pa.array(raw, pa.large_binary()), pa.array(raw, pa.binary(5))],
        names=["b", "lb", "fb"],
    )
    expected = rows_to_columns([(r,) for r in raw])["0"]  # the RDD path's packing
    for name, col in batch_to_columns(batch).items():
        assert col.dtype == np.uint8 and col.shape == (7, 5), name
        np.testing.assert_array_equal(col, expected)


def test_a_sliced_batch_gives_only_its_rows():
    raw = [bytes([i] * 3) for i in range(10)]
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(raw),
            pa.array(raw, pa.binary(3)),
            pa.array([[i, i] for i in range(10)], pa.list_(pa.int64())),
            pa.FixedSizeListArray.from_arrays(pa.array(np.arange(20, dtype=np.int64)), 2),
            pa.array(range(10), pa.int64()),
        ],
        names=["b", "fb", "l", "f", "id"],
    )
    cols = batch_to_columns(batch.slice(4, 3))
    assert cols["id"].tolist() == [4, 5, 6]
    assert cols["b"][:, 0].tolist() == cols["fb"][:, 0].tolist() == [4, 5, 6]
    assert cols["l"].tolist() == [[4, 4], [5, 5], [6, 6]]
    assert cols["f"].tolist() == [[8, 9], [10, 11], [12, 13]]


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (pa.array([[1.0, 2.0], [3.0]], pa.list_(pa.float64())), r"'col' has Arrow type list<item: double>.*row 1: 1"),
        (pa.array([b"ab", b"abc"]), r"'col' has Arrow type binary: binary values differ in length"),
        (pa.array(["a", "b"]), r"'col' has Arrow type string: not a number"),
        (pa.array([1, None], pa.int64()), r"'col' has Arrow type int64: 1 of its values are null"),
        (pa.array([[1, None]], pa.list_(pa.int64())), r"'col' has Arrow type int64: 1 of its values are null"),
    ],
    ids=["ragged_list", "variable_binary", "string", "null", "null_in_list"],
)
def test_columns_that_cannot_be_fed_are_refused_naming_column_and_type(array, message):
    batch = pa.RecordBatch.from_arrays([pa.array(range(len(array))), array], names=["ok", "col"])
    with pytest.raises(InvalidArgumentError, match=message) as info:
        batch_to_columns(batch)
    assert info.value.column == "col"


def test_empty_batches_keep_their_column_shapes():
    batch = pa.RecordBatch.from_arrays(
        [pa.array([], pa.int64()), pa.array([], pa.binary(4)), pa.array([], pa.binary())], names=["id", "fb", "b"]
    )
    cols = batch_to_columns(batch)
    assert cols["id"].shape == (0,) and cols["fb"].shape == (0, 4) and cols["b"].shape == (0, 0)


def test_inference_schema_is_parsed_to_arrow_types_or_refused():
    assert [(f.name, f.arrow_type) for f in result_fields("id long, score DOUBLE")] == [
        ("id", "int64"),
        ("score", "float64"),
    ]
    with pytest.raises(InvalidArgumentError, match="'label string' is not 'name type' with a numeric type"):
        result_fields("id long, label string")


def test_inference_results_match_the_schema_by_name_or_by_position():
    from sparkgrad.cluster.arrow_feed import _result_batch

    fields = result_fields("score double, id long")
    named = _result_batch({"id": np.array([7, 8]), "score": np.array([0.5, 0.25])}, fields)
    assert named.schema.names == ["score", "id"]
    assert named.column(0).to_pylist() == [0.5, 0.25] and named.column(1).to_pylist() == [7, 8]
    positional = _result_batch({"0": np.array([0.5, 0.25]), "1": np.array([7, 8])}, fields)
    assert positional.column(1).to_pylist() == [7, 8]


@pytest.mark.parametrize(
    ("cols", "match"),
    [
        ({"id": np.array([1]), "prob": np.array([0.5])}, "result columns id, prob for a schema of score, id"),
        ({"0": np.array([0.5])}, "1 result column"),
        ({"score": np.zeros((2, 3)), "id": np.array([1, 2])}, r"'score' has shape \(2, 3\)"),
        ({"score": np.array([0.5, 1.0]), "id": np.array([1.5, 2.0])}, "'id' .* does not fit id int64"),
    ],
)
def test_inference_results_that_do_not_fit_the_schema_are_refused_by_column(cols, match):
    from sparkgrad.cluster.arrow_feed import _result_batch
    from sparkgrad.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match=match):
        _result_batch(cols, result_fields("score double, id long"))
