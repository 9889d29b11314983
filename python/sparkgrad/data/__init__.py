"""Datasets and converters: IDX (MNIST) files, TFRecords, Spark DataFrames."""
