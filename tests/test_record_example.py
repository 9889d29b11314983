"""tf.train.Example codec and schema parsing (parse_example semantics)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from sparkgrad.data.example import (
    FixedLenFeature,
    RawBytesFeature,
    Schema,
    VarLenFeature,
    decode_example,
    decode_sequence_example,
    encode_example,
    encode_sequence_example,
    parse_example,
    parse_examples,
)
from sparkgrad.errors import ExampleDecodeError, InvalidArgumentError, SchemaError


# Hand-built protobuf, independent of the C encoder.
def varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def ld(field: int, payload: bytes) -> bytes:
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def entry(key: bytes, feature: bytes) -> bytes:
    return ld(1, ld(1, key) + ld(2, feature))


def example(*entries: bytes) -> bytes:
    return ld(1, b"".join(entries))


def int64_unpacked(*values: int) -> bytes:
    return ld(3, b"".join(varint(1 << 3 | 0) + varint(v) for v in values))


def float_unpacked(*values: float) -> bytes:
    return ld(2, b"".join(varint(1 << 3 | 5) + struct.pack("<f", v) for v in values))


def test_encoding_matches_hand_built_protobuf():
    got = encode_example({"a": np.array([1, -2], dtype=np.int64)})
    packed = ld(1, varint(1) + varint(-2))
    assert got == example(entry(b"a", ld(3, packed)))
    assert len(varint(-2)) == 10  # negative int64s are 10-byte varints
    assert encode_example({"f": [0.5]}) == example(entry(b"f", ld(2, ld(1, struct.pack("<f", 0.5)))))
    assert encode_example({"b": [b"x", b""]}) == example(entry(b"b", ld(1, ld(1, b"x") + ld(1, b""))))


def test_round_trip_every_kind():
    features = {
        "i": np.array([0, 1, -1, 2**63 - 1, -(2**63)], dtype=np.int64),
        "f": np.array([1.5, -0.0, np.inf], dtype=np.float32),
        "b": [b"", b"\xff\x00", "text"],
        "empty_i": ("int64", []),
        "empty_f": np.array([], dtype=np.float32),
        "empty_b": ("bytes", []),
        "scalar": 7,
        "u8": np.arange(3, dtype=np.uint8),
    }
    got = decode_example(encode_example(features))
    np.testing.assert_array_equal(got["i"], features["i"])
    np.testing.assert_array_equal(got["f"], features["f"])
    assert got["b"] == [b"", b"\xff\x00", b"text"]
    assert got["empty_i"].dtype == np.int64 and got["empty_i"].size == 0
    assert got["empty_f"].dtype == np.float32 and got["empty_f"].size == 0
    assert got["empty_b"] == []
    assert got["scalar"].tolist() == [7] and got["u8"].tolist() == [0, 1, 2]


def test_empty_python_list_needs_a_type():
    with pytest.raises(InvalidArgumentError, match="empty list"):
        encode_example({"x": []})


def test_unpacked_lists_and_mixed_packing_decode():
    data = example(
        entry(b"i", int64_unpacked(5, -3)),
        entry(b"f", float_unpacked(1.0, 2.0)),
        entry(b"m", ld(3, ld(1, varint(1) + varint(2)) + varint(8) + varint(3))),
    )
    got = decode_example(data)
    assert got["i"].tolist() == [5, -3]
    assert got["f"].tolist() == [1.0, 2.0]
    assert got["m"].tolist() == [1, 2, 3]
    parsed = parse_examples([data], {"i": FixedLenFeature([2], "int64"), "m": VarLenFeature("int64")})
    assert parsed["i"].tolist() == [[5, -3]]
    assert parsed["m"].values.tolist() == [1, 2, 3]


def test_duplicate_keys_last_wins():
    data = example(entry(b"k", int64_unpacked(1)), entry(b"k", int64_unpacked(2)))
    assert decode_example(data)["k"].tolist() == [2]
    assert parse_examples([data], {"k": FixedLenFeature([], "int64")})["k"].tolist() == [2]


def test_feature_without_list_decodes_as_none():
    assert decode_example(example(entry(b"k", b""))) == {"k": None}


SCHEMA = {
    "label": FixedLenFeature([], "int64"),
    "image": FixedLenFeature([2, 2], "float32"),
    "name": FixedLenFeature([], bytes, default=b"?"),
    "weight": FixedLenFeature([], "float32", default=1.0),
    "tags": VarLenFeature("int64"),
    "words": VarLenFeature(bytes),
}


def test_schema_batch_shapes_defaults_and_ragged():
    recs = [
        encode_example({"label": 1, "image": [1.0, 2, 3, 4], "tags": [1, 2, 3], "words": [b"a"]}),
        encode_example({"label": 2, "image": [5.0, 6, 7, 8], "name": b"n", "weight": 0.5, "tags": ("int64", [])}),
    ]
    out = parse_examples(recs, Schema(SCHEMA))
    assert out["label"].dtype == np.int64 and out["label"].tolist() == [1, 2]
    assert out["image"].shape == (2, 2, 2) and out["image"].dtype == np.float32
    assert out["image"][1].tolist() == [[5, 6], [7, 8]]
    assert out["name"].tolist() == [b"?", b"n"]
    assert out["weight"].tolist() == [1.0, 0.5]
    assert out["tags"].values.tolist() == [1, 2, 3] and out["tags"].row_splits.tolist() == [0, 3, 3]
    assert out["words"].values.tolist() == [b"a"] and out["words"].row_splits.tolist() == [0, 1, 1]
    single = parse_example(recs[0], SCHEMA)
    assert single["label"] == 1 and single["tags"].tolist() == [1, 2, 3]


def test_raw_bytes_feature_scales_to_float32():
    img = (np.arange(784) % 256).astype(np.uint8)
    rec = encode_example({"image_raw": img.tobytes(), "label": 3})
    out = parse_examples([rec] * 3, {"image_raw": RawBytesFeature([784], scale=1 / 255)})
    assert out["image_raw"].shape == (3, 784) and out["image_raw"].dtype == np.float32
    np.testing.assert_allclose(out["image_raw"][2], img.astype(np.float32) * np.float32(1 / 255), rtol=1e-6)
    u8 = parse_examples([rec], {"image_raw": RawBytesFeature([28, 28], dtype="uint8")})["image_raw"]
    assert u8.shape == (1, 28, 28) and u8.dtype == np.uint8 and (u8.ravel() == img).all()
    f = np.array([0.5, 2.0], dtype=np.float32)
    out = parse_examples(
        [encode_example({"x": f.tobytes()})], {"x": RawBytesFeature(2, raw_dtype="float32", scale=2.0)}
    )
    assert out["x"].tolist() == [[1.0, 4.0]]
    with pytest.raises(SchemaError, match="expected 784 raw bytes .* found 4 bytes"):
        parse_examples([encode_example({"image_raw": b"abcd"})], {"image_raw": RawBytesFeature(784)})


def test_schema_errors_name_record_feature_expected_and_found():
    ok = encode_example({"label": 1})
    with pytest.raises(SchemaError) as info:
        parse_examples([ok, encode_example({"other": 1})], {"label": FixedLenFeature([], "int64")}, name="f.tfrecord")
    msg = str(info.value)
    assert "f.tfrecord" in msg and "record 1" in msg and "'label'" in msg and "missing" in msg
    with pytest.raises(SchemaError, match=r"^<records>: record 0: .*'label': expected 1 int64 value, found 1 float"):
        parse_examples([encode_example({"label": 1.0})], {"label": FixedLenFeature([], "int64")})  # no name given
    with pytest.raises(SchemaError, match=r"expected 3 float values, found 2 float values"):
        parse_examples([encode_example({"x": [1.0, 2.0]})], {"x": FixedLenFeature([3], "float32")})
    with pytest.raises(SchemaError, match="expected a int64 list, found 1 bytes value"):
        parse_examples([encode_example({"x": b"s"})], {"x": VarLenFeature("int64")})
    with pytest.raises(SchemaError, match="default has 2 values, shape needs 3"):
        Schema({"x": FixedLenFeature([3], "float32", default=[1.0, 2.0])})


@pytest.mark.parametrize(
    "data, pattern",
    [
        (b"\x0a\x05\x0a\x03", "runs past the end"),
        (b"\xff" * 12, "overlong varint"),
        (example(entry(b"k", ld(3, varint(1 << 3 | 0) + b"\x80" * 10 + b"\x01"))), "overlong varint"),
        (example(entry(b"k", ld(3, ld(1, varint(5) + b"\x80" * 10 + b"\x01")))), "overlong varint"),
        (
            example(entry(b"k", ld(3, ld(1, varint(5) + b"\xff" * 9 + b"\x02")))),
            r"overlong varint at byte \d+ \(above 64 bits\)",
        ),
        (example(entry(b"k", ld(3, ld(1, varint(5) + b"\x80")))), "truncated varint"),
        (example(entry(b"k", ld(3, varint(1 << 3 | 5) + b"\0\0\0\0"))), "wrong wire type 5"),
        (varint(1 << 3 | 0) + varint(3), "wrong wire type 0"),
        (example(entry(b"\xff\xfe", int64_unpacked(1))), "not valid UTF-8"),
        (example(entry(b"k", ld(2, ld(1, b"abc")))), "not a multiple of 4"),
        (b"\x13", "unsupported wire type 3"),
        (b"\x00", "invalid field number 0"),
    ],
)
def test_garbage_protobuf_is_a_named_error_with_an_offset(data, pattern):
    with pytest.raises(ExampleDecodeError, match=pattern) as info:
        decode_example(data)
    assert "byte" in str(info.value)
    with pytest.raises(ExampleDecodeError, match=pattern):
        parse_examples([data], {"k": VarLenFeature("int64")})


def test_sequence_examples_without_a_name_are_called_records_in_errors():
    from sparkgrad.data.example import FixedLenSequenceFeature, parse_sequence_examples

    bad = encode_sequence_example({}, {"x": [[1.0], [2.0]]})
    with pytest.raises(SchemaError, match=r"^<records>: record 0: "):
        parse_sequence_examples([bad], None, {"x": FixedLenSequenceFeature([2], "float32")})


def test_sequence_example_round_trip():
    data = encode_sequence_example(
        {"length": 2, "name": b"s"},
        {"tokens": [[1, 2], [3]], "scores": [[0.5], [0.25, 0.75]], "words": ("bytes", [[b"a"], []])},
    )
    context, lists = decode_sequence_example(data)
    assert context["length"].tolist() == [2] and context["name"] == [b"s"]
    assert [t.tolist() for t in lists["tokens"]] == [[1, 2], [3]]
    assert [t.tolist() for t in lists["scores"]] == [[0.5], [0.25, 0.75]]
    assert lists["words"] == [[b"a"], []]
    with pytest.raises(ExampleDecodeError):
        decode_sequence_example(ld(2, ld(1, ld(1, b"k") + ld(2, ld(1, b"\x1a\x05")))))


def test_feature_without_a_list_counts_as_missing_like_tensorflow():
    data = example(entry(b"a", b""))
    out = parse_examples([data], {"a": FixedLenFeature([], "int64", default=5), "v": VarLenFeature("int64")})
    assert out["a"].tolist() == [5] and out["v"].row_splits.tolist() == [0, 0]
    with pytest.raises(SchemaError, match="'a': required .* but missing"):
        parse_examples([data], {"a": FixedLenFeature([], "int64")})
    out = parse_examples([example(entry(b"v", b""))], {"v": VarLenFeature("int64")})
    assert out["v"].values.tolist() == [] and out["v"].row_splits.tolist() == [0, 0]
