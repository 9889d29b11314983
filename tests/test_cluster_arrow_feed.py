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


def _vector_column(rows):
    """An Arrow array shaped as Spark sends a VectorUDT column: ("dense", values) or ("sparse", size, {i: v})."""
    kinds, sizes, indices, values = [], [], [], []
    for r in rows:
        if r is None:
            kinds.append(None)
            sizes.append(None)
            indices.append(None)
            values.append(None)
        elif r[0] == "dense":
            kinds.append(1)
            sizes.append(None)
            indices.append(None)
            values.append(list(r[1]))
        else:
            kinds.append(0)
            sizes.append(r[1])
            indices.append(sorted(r[2]))
            values.append([r[2][i] for i in sorted(r[2])])
    struct = pa.struct(
        [
            pa.field("type", pa.int8(), nullable=False),
            pa.field("size", pa.int32()),
            pa.field("indices", pa.list_(pa.int32())),
            pa.field("values", pa.list_(pa.float64())),
        ]
    )
    mask = pa.array([r is None for r in rows])
    children = [
        pa.array([k or 0 for k in kinds], pa.int8()),
        pa.array(sizes, pa.int32()),
        pa.array(indices, pa.list_(pa.int32())),
        pa.array(values, pa.list_(pa.float64())),
    ]
    return pa.StructArray.from_arrays(children, fields=list(struct), mask=mask)


def test_dense_vectors_are_the_values_buffer_and_sparse_ones_are_densified():
    dense = _vector_column([("dense", [i, i + 0.5, -i]) for i in range(4)])
    mixed = _vector_column([("dense", [1, 2, 3]), ("sparse", 3, {2: 7.0}), ("sparse", 3, {}), ("dense", [0, 0, 9])])
    cols = batch_to_columns(pa.RecordBatch.from_arrays([dense, mixed], names=["d", "m"]))
    assert cols["d"].dtype == np.float32 and cols["d"].shape == (4, 3)
    assert cols["d"][2].tolist() == [2, 2.5, -2]
    assert cols["m"].tolist() == [[1, 2, 3], [0, 0, 7], [0, 0, 0], [0, 0, 9]]
    sliced = batch_to_columns(pa.RecordBatch.from_arrays([mixed], names=["m"]).slice(1, 2))
    assert sliced["m"].tolist() == [[0, 0, 7], [0, 0, 0]]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([("dense", [1, 2]), ("dense", [1, 2, 3])], r"dense vectors differ in length \(row 10: 2, row 11: 3\)"),
        ([("dense", [1, 2]), ("sparse", 5, {4: 1.0})], r"vectors differ in size \(row 10: 2, row 11: 5\)"),
        ([("dense", [1, 2]), None], r"1 of its vectors are null \(the first in row 11\)"),
    ],
    ids=["dense_lengths", "sparse_size", "null"],
)
def test_vectors_of_different_sizes_or_nulls_are_refused_naming_partition_and_row(rows, message):
    batch = pa.RecordBatch.from_arrays([_vector_column(rows)], names=["vec"])
    with pytest.raises(
        InvalidArgumentError, match=r"^partition 3: column 'vec' has Arrow type struct<.*" + message
    ) as e:
        batch_to_columns(batch, partition=3, first_row=10)
    assert e.value.column == "vec" and e.value.partition == 3
