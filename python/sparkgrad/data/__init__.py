"""Datasets and converters: IDX (MNIST) files, TFRecords, Parquet and Delta tables, Examples, Spark DataFrames."""

from sparkgrad.data.dataset import TFRecordDataset, expand_paths
from sparkgrad.data.example import (
    FixedLenFeature,
    FixedLenSequenceFeature,
    Ragged,
    RaggedSequence,
    RawBytesFeature,
    Schema,
    VarLenFeature,
    decode_example,
    decode_sequence_example,
    encode_example,
    encode_sequence_example,
    parse_example,
    parse_examples,
    parse_sequence_examples,
)
from sparkgrad.data.source import TableFiles, clear_cache, table_files
from sparkgrad.data.spark import load_tfrecords, save_as_tfrecords, spark_schema
from sparkgrad.data.table import Column, ParquetDataset
from sparkgrad.data.tfrecord import (
    TFRecordWriter,
    crc32c,
    masked_crc32c,
    read_records,
    tfrecord_iterator,
    write_records,
)

__all__ = [  # in the order the API reference lists them
    "TFRecordDataset",
    "expand_paths",
    "ParquetDataset",
    "Column",
    "table_files",
    "TableFiles",
    "clear_cache",
    "Schema",
    "FixedLenFeature",
    "VarLenFeature",
    "RawBytesFeature",
    "Ragged",
    "parse_examples",
    "parse_example",
    "encode_example",
    "decode_example",
    "FixedLenSequenceFeature",
    "RaggedSequence",
    "parse_sequence_examples",
    "encode_sequence_example",
    "decode_sequence_example",
    "tfrecord_iterator",
    "read_records",
    "write_records",
    "TFRecordWriter",
    "crc32c",
    "masked_crc32c",
    "save_as_tfrecords",
    "load_tfrecords",
    "spark_schema",
]
