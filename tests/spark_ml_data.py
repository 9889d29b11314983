"""Fashion-MNIST as Parquet for the Spark ML tests (test_spark_ml.py, test_cluster_connect.py), and their model."""

from __future__ import annotations

import os

import numpy as np
from sparkgrad.nn import Dense, Sequential


def mlp(seed: int = 3, scale: float | None = None) -> Sequential:
    m = Sequential([Dense(64, activation="relu", input_shape=(784,)), Dense(10, activation="softmax")], seed=seed)
    if scale is not None:
        m.set_input_transform(scale=scale)
    return m


def write_parquet(path: str, images: np.ndarray, labels: np.ndarray, files: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(images)
    flat = images.reshape(n, 784)
    pixels = pa.ListArray.from_arrays(
        pa.array(np.arange(n + 1, dtype=np.int32) * 784), pa.array((flat / 255).astype(np.float32).reshape(-1))
    )
    raw = pa.array([bytes(r) for r in flat], pa.binary())
    table = pa.table(
        {"id": pa.array(np.arange(n, dtype=np.int64)), "pixels": pixels, "raw": raw, "label": labels.astype(np.int64)}
    )
    os.makedirs(path)
    step = -(-n // files)
    for i in range(files):
        pq.write_table(table.slice(i * step, step), os.path.join(path, f"part-{i}.parquet"))
