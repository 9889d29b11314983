"""Dataset converters, and the ``sparkgrad convert`` command.

    sparkgrad convert mnist --images IDX[.gz] --labels IDX[.gz] --out DIR
                            [--layout image_raw|int64] [--shards N] [--gzip] [--limit N]

Layouts:
  image_raw  TensorFlow's convert_to_records.py: ``height``, ``width``,
             ``depth`` (int64), ``label`` (int64), ``image_raw`` (bytes,
             rows*cols uint8)
  int64      TensorFlowOnSpark's mnist example: ``image`` (int64 x rows*cols),
             ``label`` (int64 x 1)
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable

import numpy as np

from sparkgrad.data.example import FixedLenFeature, RawBytesFeature, encode_example
from sparkgrad.data.idx import read_idx
from sparkgrad.data.tfrecord import TFRecordWriter
from sparkgrad.errors import InvalidArgumentError, RecordError

LAYOUTS = ("image_raw", "int64")


def mnist_schema(layout: str = "image_raw", pixels: int = 784, scale: float = 1 / 255) -> dict:
    """The parsing schema for files written by convert_mnist: images as
    float32[pixels] scaled by ``scale``, labels as int64."""
    if layout == "image_raw":
        return {"image_raw": RawBytesFeature([pixels], "float32", scale), "label": FixedLenFeature([], "int64")}
    if layout == "int64":
        return {"image": FixedLenFeature([pixels], "int64"), "label": FixedLenFeature([], "int64")}
    raise InvalidArgumentError(f"layout must be one of {LAYOUTS}, not {layout!r}")


def _split_name(images_path: str) -> str:
    base = os.path.basename(images_path)
    if base.startswith("t10k") or "test" in base:
        return "test"
    if "train" in base:
        return "train"
    return re.sub(r"[-.].*$", "", base) or "data"


def convert_mnist(
    images: str,
    labels: str,
    out: str,
    layout: str = "image_raw",
    shards: int = 1,
    gzip: bool = False,
    name: str | None = None,
    limit: int | None = None,
) -> list[str]:
    """Writes IDX images + labels as TFRecord files of tf.train.Examples;
    returns the paths written (``<out>/<name>.tfrecords`` or
    ``<out>/<name>-00000-of-0000N.tfrecords``, ``.gz`` appended with gzip).
    ``limit`` keeps the first ``limit`` examples only (small runs, tests)."""
    if layout not in LAYOUTS:
        raise InvalidArgumentError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    if shards < 1:
        raise InvalidArgumentError(f"shards must be >= 1, not {shards}")
    if limit is not None and limit < 1:
        raise InvalidArgumentError(f"limit must be >= 1 (or None for every example), not {limit}")
    imgs, labs = read_idx(images), read_idx(labels)
    if imgs.ndim != 3 or imgs.dtype != np.uint8:
        raise RecordError(f"{images}: expected uint8 images [N, rows, cols], found {imgs.dtype} {imgs.shape}")
    if labs.ndim != 1 or labs.shape[0] != imgs.shape[0]:
        raise RecordError(f"{labels}: {labs.shape} labels for {imgs.shape[0]} images in {images}")
    if limit is not None:
        imgs, labs = imgs[:limit], labs[:limit]
    n, rows, cols = imgs.shape
    os.makedirs(out, exist_ok=True)
    name = name or _split_name(images)
    suffix = ".tfrecords" + (".gz" if gzip else "")
    paths = [
        os.path.join(out, f"{name}{suffix}" if shards == 1 else f"{name}-{i:05d}-of-{shards:05d}{suffix}")
        for i in range(shards)
    ]
    flat = imgs.reshape(n, rows * cols)
    bounds = np.linspace(0, n, shards + 1).astype(int)
    for i, path in enumerate(paths):
        with TFRecordWriter(path, "GZIP" if gzip else None) as w:
            for k in range(bounds[i], bounds[i + 1]):
                w.write(_encode(layout, flat[k], int(labs[k]), rows, cols))
    return paths


def _encode(layout: str, pixels: np.ndarray, label: int, rows: int, cols: int) -> bytes:
    if layout == "image_raw":
        return encode_example(
            {"height": rows, "width": cols, "depth": 1, "label": label, "image_raw": pixels.tobytes()}
        )
    return encode_example({"image": pixels.astype(np.int64), "label": label})


def add_convert_command(sub: argparse._SubParsersAction) -> Callable[[argparse.Namespace], int]:
    """The ``sparkgrad convert`` subcommand (registered in cli.COMMANDS)."""
    p = sub.add_parser("convert", help="convert datasets to TFRecord files of tf.train.Examples")
    kinds = p.add_subparsers(dest="dataset", metavar="DATASET", required=True)
    m = kinds.add_parser("mnist", help="MNIST / Fashion-MNIST IDX files (plain or .gz)")
    m.add_argument("--images", required=True, help="IDX images file, e.g. train-images-idx3-ubyte.gz")
    m.add_argument("--labels", required=True, help="IDX labels file, e.g. train-labels-idx1-ubyte.gz")
    m.add_argument("--out", required=True, help="output directory")
    m.add_argument("--layout", choices=LAYOUTS, default="image_raw", help="image_raw (TF) or int64 (TFoS)")
    m.add_argument("--shards", type=int, default=1, help="number of output files")
    m.add_argument("--gzip", action="store_true", help="GZIP-compress the files")
    m.add_argument("--name", default=None, help="file name prefix (default: train/test from --images)")
    m.add_argument("--limit", type=int, default=None, help="convert the first N examples only")

    def run(args: argparse.Namespace) -> int:
        paths = convert_mnist(
            args.images, args.labels, args.out, args.layout, args.shards, args.gzip, args.name, args.limit
        )
        total = sum(os.path.getsize(x) for x in paths)
        for x in paths:
            print(x)
        print(f"wrote {len(paths)} file(s), {total} bytes, layout {args.layout}")
        return 0

    return run
