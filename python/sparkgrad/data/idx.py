"""Reading IDX files (the MNIST / Fashion-MNIST format), plain or gzipped.

IDX: big-endian magic 0x0000 | dtype byte | ndim byte, then ndim big-endian
uint32 dimensions, then the data in C order. Only the unsigned-byte dtype
(0x08) occurs in MNIST; the others are accepted too.
"""

from __future__ import annotations

import gzip
import os
import struct

import numpy as np

from sparkgrad.errors import RecordError

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"

_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Reads a whole IDX file (``.gz`` or not) into a NumPy array."""
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as exc:
        raise RecordError(f"{path}: cannot read IDX file: {exc}", path=path) from exc
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise RecordError(f"{path}: not an IDX file (bad magic at byte 0)", path=path, offset=0)
    dtype_code, ndim = data[2], data[3]
    if dtype_code not in _DTYPES:
        raise RecordError(f"{path}: unknown IDX dtype 0x{dtype_code:02x} at byte 2", path=path, offset=2)
    header = 4 + 4 * ndim
    if len(data) < header:
        raise RecordError(f"{path}: truncated IDX header ({len(data)} < {header} bytes)", path=path, offset=len(data))
    shape = struct.unpack(f">{ndim}I", data[4:header])
    dtype = np.dtype(_DTYPES[dtype_code])
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise RecordError(
            f"{path}: IDX payload is {len(data) - header} bytes, shape {shape} needs {expected - header}",
            path=path,
            offset=header,
        )
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def fashion_mnist(split: str = "train", root: str = FASHION_MNIST_DIR) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8[N, 28, 28], labels uint8[N]) of Debian's Fashion-MNIST."""
    prefix = {"train": "train", "test": "t10k"}.get(split)
    if prefix is None:
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    images = read_idx(os.path.join(root, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz"))
    if images.shape[0] != labels.shape[0]:
        raise RecordError(f"{root}: {images.shape[0]} images but {labels.shape[0]} labels for split {split!r}")
    return images, labels
