"""sparkgrad convert mnist on Debian's Fashion-MNIST files."""

from __future__ import annotations

import gzip
import os
import struct

import numpy as np
import pytest
from sparkgrad.cli import main as cli_main
from sparkgrad.data import TFRecordDataset, decode_example, tfrecord_iterator
from sparkgrad.data.convert import convert_mnist, mnist_schema
from sparkgrad.data.idx import FASHION_MNIST_DIR, read_idx
from sparkgrad.errors import RecordError

TEST_IMAGES = os.path.join(FASHION_MNIST_DIR, "t10k-images-idx3-ubyte.gz")
TEST_LABELS = os.path.join(FASHION_MNIST_DIR, "t10k-labels-idx1-ubyte.gz")
needs_data = pytest.mark.skipif(not os.path.exists(TEST_IMAGES), reason="dataset-fashion-mnist not installed")


@needs_data
def test_cli_convert_image_raw_layout_matches_the_idx_files(tmp_path, capsys):
    rc = cli_main(["convert", "mnist", "--images", TEST_IMAGES, "--labels", TEST_LABELS, "--out", str(tmp_path)])
    assert rc == 0
    assert "wrote 1 file(s)" in capsys.readouterr().out
    path = tmp_path / "test.tfrecords"
    images, labels = read_idx(TEST_IMAGES), read_idx(TEST_LABELS)
    first = decode_example(next(iter(tfrecord_iterator(path))))
    assert first["height"].tolist() == [28] and first["width"].tolist() == [28] and first["depth"].tolist() == [1]
    assert first["label"].tolist() == [labels[0]]
    assert first["image_raw"] == [images[0].tobytes()]
    got_x, got_y = [], []
    for batch in TFRecordDataset(path, mnist_schema(), 1000):
        got_x.append(batch["image_raw"])
        got_y.append(batch["label"])
    x, y = np.concatenate(got_x), np.concatenate(got_y)
    assert x.shape == (10000, 784) and y.tolist() == labels.tolist()
    np.testing.assert_allclose(x, images.reshape(-1, 784) / np.float32(255), rtol=1e-6)


@needs_data
def test_int64_layout_sharded_and_gzipped(tmp_path, inflate):
    paths = convert_mnist(TEST_IMAGES, TEST_LABELS, str(tmp_path), layout="int64", shards=3, gzip=True)
    assert [os.path.basename(p) for p in paths] == [f"test-{i:05d}-of-00003.tfrecords.gz" for i in range(3)]
    gzip.decompress(open(paths[0], "rb").read())  # a real gzip file
    labels = read_idx(TEST_LABELS)
    y = np.concatenate([b["label"] for b in TFRecordDataset(paths, mnist_schema("int64"), 512, compression="GZIP")])
    assert y.tolist() == labels.tolist()
    first = decode_example(next(iter(tfrecord_iterator(paths[0], "GZIP"))))
    assert sorted(first) == ["image", "label"] and first["image"].shape == (784,)


def test_bad_idx_is_a_record_error(tmp_path):
    (tmp_path / "i").write_bytes(b"\x00\x00\x08\x03" + struct.pack(">3I", 2, 2, 2) + b"\0" * 8)
    (tmp_path / "l").write_bytes(b"\x00\x00\x08\x01" + struct.pack(">I", 3) + b"\0" * 3)
    with pytest.raises(RecordError, match="3 labels for 2 images|labels for 2 images"):
        convert_mnist(str(tmp_path / "i"), str(tmp_path / "l"), str(tmp_path / "out"))
    assert (
        cli_main(
            [
                "convert",
                "mnist",
                "--images",
                str(tmp_path / "i"),
                "--labels",
                str(tmp_path / "l"),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 1
    )


@needs_data
def test_limit_converts_only_the_first_examples(tmp_path):
    (path,) = convert_mnist(TEST_IMAGES, TEST_LABELS, str(tmp_path), limit=7)
    labels = read_idx(TEST_LABELS)[:7]
    (batch,) = TFRecordDataset([path], mnist_schema(), 100)
    assert batch["label"].tolist() == labels.tolist()
