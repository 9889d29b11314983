"""Byte compatibility with TensorFlow, both ways.

1. Fixtures written by TensorFlow (tests/fixtures/tf/make_fixtures.py, run
   with tensorflow-cpu) decode in sparkgrad to exactly the values TensorFlow
   decoded (tests/fixtures/tf/expected.json).
2. Files sparkgrad writes are read back by TensorFlow (tf.data +
   tf.io.parse_example) with identical values. This needs TensorFlow: in this
   interpreter, or another one named by SPARKGRAD_TF_PYTHON (e.g. a separate
   venv with tensorflow-cpu); otherwise it is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import numpy as np
import pytest
from sparkgrad.data import (
    FixedLenFeature,
    TFRecordDataset,
    VarLenFeature,
    decode_example,
    decode_sequence_example,
    encode_example,
    parse_examples,
    tfrecord_iterator,
    write_records,
)
from tf_fixtures import FIXTURES, plain, same, tf_python

EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
KIND = {"int64_list": "int64", "float_list": "float", "bytes_list": "bytes"}


def as_list(v):
    return v.tolist() if isinstance(v, np.ndarray) else list(v)


@pytest.mark.parametrize(
    "name, compression",
    [("examples.tfrecord", None), ("examples.tfrecord.gz", "GZIP"), ("examples.tfrecord.zz", "ZLIB")],
)
def test_tensorflow_fixtures_decode_to_tensorflows_values(name, compression, inflate):
    records = list(tfrecord_iterator(FIXTURES / name, compression))
    assert len(records) == EXPECTED["records"] == EXPECTED["read_back"][name]
    for i, (record, want) in enumerate(zip(records, EXPECTED["decoded"], strict=True)):
        got = decode_example(record)
        assert sorted(got) == sorted(want), i
        for key, w in want.items():
            values = got[key]
            if w["kind"] == "bytes_list":
                assert isinstance(values, list)
            else:
                assert values.dtype == (np.int64 if w["kind"] == "int64_list" else np.float32)
            assert same(as_list(values), plain(w["values"])), (i, key)


def _schema():
    out = {}
    for key, s in EXPECTED["schema"].items():
        dtype = s["dtype"]
        if s["type"] == "fixed":
            out[key] = FixedLenFeature(s["shape"], dtype, default=s.get("default"))
        else:
            out[key] = VarLenFeature(dtype)
    return out


def test_parse_examples_matches_tf_parse_example():
    records = list(tfrecord_iterator(FIXTURES / "examples.tfrecord"))
    got = parse_examples(records, _schema())
    decoded_ints_3 = plain(EXPECTED["decoded"][3]["ints"]["values"])
    for key, want in EXPECTED["parse_example"].items():
        if "row_splits" in want:
            values, splits = as_list(got[key].values), got[key].row_splits.tolist()
            if key == "ints":
                # Record 3 holds one Int64List written half packed, half not.
                # Protobuf (and tf.train.Example.FromString) merge both parts;
                # TF's fast parse_example keeps only the packed run. sparkgrad
                # follows protobuf: the values FromString gives.
                assert decoded_ints_3 == [1, 2, -3]
                assert values[splits[3] : splits[4]] == decoded_ints_3
                assert plain(want["values"])[want["row_splits"][3] :] == [1, 2]
                values, splits = values[: splits[3]], splits[:4]
                want = {"values": want["values"][: want["row_splits"][3]], "row_splits": want["row_splits"][:4]}
            assert same(values, plain(want["values"])), key
            assert splits == want["row_splits"], key
        else:
            assert list(got[key].shape) == want["shape"], key
            assert same(as_list(got[key]), plain(want["values"])), key


def test_sequence_example_fixture():
    (record,) = list(tfrecord_iterator(FIXTURES / "sequence.tfrecord"))
    context, lists = decode_sequence_example(record)
    want = EXPECTED["sequence"]
    assert context["length"].tolist() == [want["context"]["length"]]
    assert context["title"] == [plain(want["context"]["title"])]
    for key, steps in want["feature_lists"].items():
        assert [s.tolist() for s in lists[key]] == steps


# ---- TensorFlow reads what sparkgrad writes ----


TF_READER = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf
    out = {}
    for path, comp in json.loads(sys.argv[1]):
        schema = {"label": tf.io.FixedLenFeature([], tf.int64), "image": tf.io.FixedLenFeature([4], tf.float32),
                  "name": tf.io.FixedLenFeature([], tf.string), "tags": tf.io.VarLenFeature(tf.int64),
                  "raw": tf.io.FixedLenFeature([], tf.string)}
        ds = tf.data.TFRecordDataset(path, compression_type=comp).batch(100)
        ds = ds.map(lambda b: tf.io.parse_example(b, schema))
        rows = []
        for b in ds:
            tags = tf.RaggedTensor.from_sparse(b["tags"]).to_list()
            for i in range(len(b["label"])):
                rows.append([int(b["label"][i]), [float(x) for x in b["image"][i].numpy()],
                             b["name"][i].numpy().decode("latin-1"), tags[i], list(b["raw"][i].numpy())])
        out[path] = rows
    print(json.dumps(out))
    """
)


def test_tensorflow_reads_sparkgrad_files(tmp_path):
    python = tf_python()
    rng = np.random.default_rng(5)
    rows = []
    for i in range(37):
        image = rng.standard_normal(4).astype(np.float32)
        tags = rng.integers(-(2**40), 2**40, size=i % 4)
        raw = rng.integers(0, 256, size=5).astype(np.uint8).tobytes()
        rows.append((i - 18, image, bytes([65 + i % 26, 200]), tags, raw))
    records = [
        encode_example(
            {"label": r[0], "image": r[1], "name": r[2], "tags": np.asarray(r[3], dtype=np.int64), "raw": r[4]}
        )
        for r in rows
    ]
    files = []
    for name, comp in [("p.tfrecord", None), ("g.tfrecord.gz", "GZIP"), ("z.tfrecord.zz", "ZLIB")]:
        write_records(tmp_path / name, records, compression=comp)
        files.append([str(tmp_path / name), comp or ""])
    proc = subprocess.run(
        [python, "-c", TF_READER, json.dumps(files)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for path, _ in files:
        assert len(got[path]) == len(rows)
        for (label, image, name, tags, raw), (want_label, want_image, want_name, want_tags, want_raw) in zip(
            got[path], rows, strict=True
        ):
            assert label == want_label
            assert np.array_equal(np.float32(image), want_image)
            assert name.encode("latin-1") == want_name
            assert tags == want_tags.tolist()
            assert bytes(raw) == want_raw
    # and sparkgrad's own pipeline agrees on the same files
    batch = next(iter(TFRecordDataset(files[1][0], {"label": FixedLenFeature([], "int64")}, 100, compression="GZIP")))
    assert batch["label"].tolist() == [r[0] for r in rows]
