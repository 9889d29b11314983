"""Datasets and converters: IDX (MNIST) files, TFRecords, tf.train.Example, Spark DataFrames."""

from sparkgrad.data.tfrecord import (
    TFRecordWriter,
    crc32c,
    masked_crc32c,
    read_records,
    tfrecord_iterator,
    write_records,
)

__all__ = [
    "TFRecordWriter",
    "crc32c",
    "masked_crc32c",
    "read_records",
    "tfrecord_iterator",
    "write_records",
]
