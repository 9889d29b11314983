"""Batched SequenceExample parsing (parse_sequence_examples): against
TensorFlow's tf.io.parse_sequence_example on fixtures TensorFlow wrote
(tests/fixtures/tf/make_fixtures.py), and on bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sparkgrad.data import (
    FixedLenFeature,
    FixedLenSequenceFeature,
    Ragged,
    RaggedSequence,
    Schema,
    VarLenFeature,
    encode_example,
    encode_sequence_example,
    parse_sequence_examples,
    tfrecord_iterator,
)
from sparkgrad.errors import ExampleDecodeError, SchemaError
from tf_fixtures import FIXTURES, plain, same

EXPECTED = json.loads((FIXTURES / "expected.json").read_text())["sequence_batch"]


def spec(s):
    if s["type"] == "fixed":
        return FixedLenFeature(s["shape"], s["dtype"], s.get("default"))
    if s["type"] == "fixedseq":
        return FixedLenSequenceFeature(s["shape"], s["dtype"], allow_missing=s["allow_missing"])
    return VarLenFeature(s["dtype"])


def parse_fixture():
    records = list(tfrecord_iterator(FIXTURES / "sequence_batch.tfrecord"))
    assert len(records) == EXPECTED["records"]
    ctx = {k: spec(s) for k, s in EXPECTED["context_schema"].items()}
    lists = {k: spec(s) for k, s in EXPECTED["list_schema"].items()}
    return parse_sequence_examples(records, ctx, lists, name="sequence_batch.tfrecord")


def test_sequence_context_matches_tensorflow():
    context, _, _ = parse_fixture()
    want = EXPECTED["parse_sequence_example"]["context"]
    assert set(context) == set(want)
    for key, w in want.items():
        got = context[key]
        if "row_splits" in w:
            assert isinstance(got, Ragged)
            assert same(list(got.values) if got.values.dtype == object else got.values.tolist(), plain(w["values"]))
            assert got.row_splits.tolist() == w["row_splits"]
        else:
            assert list(got.shape) == w["shape"]
            assert same(got.tolist(), plain(w["values"])), key


def test_fixed_len_sequence_lists_are_padded_as_tensorflow_does():
    _, lists, lengths = parse_fixture()
    want = EXPECTED["parse_sequence_example"]
    for key in ("pos", "score", "word"):
        w = want["feature_lists"][key]
        assert list(lists[key].shape) == w["shape"], key
        assert same(lists[key].tolist(), plain(w["values"])), key
        assert lengths[key].tolist() == want["lengths"][key], key
    assert lists["pos"].dtype == np.int64 and lists["score"].dtype == np.float32
    assert set(lengths) == {"pos", "score", "word"}


def test_varlen_sequence_lists_match_tensorflow_ragged_and_sparse():
    _, lists, _ = parse_fixture()
    w = EXPECTED["parse_sequence_example"]["feature_lists"]["ids"]
    ids = lists["ids"]
    assert isinstance(ids, RaggedSequence)
    assert ids.values.tolist() == w["values"]
    assert ids.step_splits.tolist() == w["step_splits"]
    assert ids.row_splits.tolist() == w["row_splits"]
    # the same values at the same [record, step, position] as TF's SparseTensor
    indices = [
        [r, s - ids.row_splits[r], k - ids.step_splits[s]]
        for r in range(len(ids.row_splits) - 1)
        for s in range(ids.row_splits[r], ids.row_splits[r + 1])
        for k in range(ids.step_splits[s], ids.step_splits[s + 1])
    ]
    assert indices == w["sparse_indices"]
    assert ids.values.tolist() == w["sparse_values"]
    assert [s.tolist() for s in ids.row(0)] == [[7], [], [8, 9, -10]]


SEQ_A = encode_sequence_example(
    {"c": 1}, {"x": [np.array([1, 2]), np.array([3, 4])], "v": [np.array([1]), np.array([2, 3])]}
)
SEQ_NO_X = encode_sequence_example({}, {"v": [np.array([9])]})


def test_missing_required_list_names_file_record_and_list():
    with pytest.raises(SchemaError, match=r"f\.tfrecord: record 1: feature list 'x': required .*but missing"):
        parse_sequence_examples(
            [SEQ_A, SEQ_NO_X], None, {"x": FixedLenSequenceFeature([2], "int64")}, name="f.tfrecord"
        )
    _, lists, lengths = parse_sequence_examples(
        [SEQ_A, SEQ_NO_X], None, {"x": FixedLenSequenceFeature([2], "int64", allow_missing=True)}
    )
    assert lists["x"].tolist() == [[[1, 2], [3, 4]], [[0, 0], [0, 0]]] and lengths["x"].tolist() == [2, 0]


def test_step_with_wrong_count_or_type_is_a_schema_error():
    with pytest.raises(SchemaError, match=r"record 0: feature list 'v' step 1: expected 1 int64 value, found 2 int64"):
        parse_sequence_examples([SEQ_A], None, {"v": FixedLenSequenceFeature([1], "int64")}, name="f")
    with pytest.raises(SchemaError, match=r"feature list 'x' step 0: expected 2 float values, found 2 int64"):
        parse_sequence_examples([SEQ_A], None, {"x": FixedLenSequenceFeature([2], "float32")}, name="f")
    with pytest.raises(SchemaError, match=r"feature list 'v' step 0: expected a bytes list, found 1 int64"):
        parse_sequence_examples([SEQ_A], None, {"v": VarLenFeature("bytes")}, name="f")


def test_context_errors_follow_parse_example():
    with pytest.raises(SchemaError, match=r"f: record 1: feature 'c': required"):
        parse_sequence_examples([SEQ_A, SEQ_NO_X], {"c": FixedLenFeature([], "int64")}, None, name="f")
    context, lists, lengths = parse_sequence_examples([SEQ_A, SEQ_NO_X], {"c": FixedLenFeature([], "int64", -1)})
    assert context["c"].tolist() == [1, -1] and lists == {} and lengths == {}


def test_context_schema_may_be_compiled_once_and_reused():
    schema = Schema({"c": FixedLenFeature([], "int64", -1)})
    by_dict = parse_sequence_examples([SEQ_A, SEQ_NO_X], {"c": FixedLenFeature([], "int64", -1)})[0]
    for _ in range(2):
        assert parse_sequence_examples([SEQ_A, SEQ_NO_X], schema)[0]["c"].tolist() == by_dict["c"].tolist()


def test_garbage_and_truncated_sequence_examples_raise_decode_errors():
    for bad in (b"\x12\x05\x0a\x03", b"\xff" * 12, SEQ_A[:-3]):
        with pytest.raises(ExampleDecodeError, match="record 0"):
            parse_sequence_examples([bad], None, {"v": VarLenFeature("int64")}, name="f")


def test_an_example_is_a_sequence_example_without_lists():
    # same wire layout for the context: Example.features == SequenceExample.context
    rec = encode_example({"c": 5})
    context, lists, _ = parse_sequence_examples(
        [rec], {"c": FixedLenFeature([], "int64")}, {"v": VarLenFeature("int64")}
    )
    assert context["c"].tolist() == [5]
    assert lists["v"].row_splits.tolist() == [0, 0] and lists["v"].values.tolist() == []


def test_bad_specs_are_rejected():
    with pytest.raises(SchemaError, match="FixedLenSequence/VarLen"):
        parse_sequence_examples([SEQ_A], None, {"x": FixedLenFeature([2], "int64")})
    with pytest.raises(SchemaError, match="dtype"):
        FixedLenSequenceFeature([2], "uint8")._spec("x")
