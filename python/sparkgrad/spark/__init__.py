"""sparkgrad on Spark ML and DataFrames: an Estimator and Model for Pipelines, DataFrame and TFRecord
scoring (sparkgrad.spark.tfrecords), and shipping a trained model to Spark tasks (sparkgrad.spark.shipping).

Importing this package does not import pyspark: each function imports it when called.
"""

from sparkgrad.spark.shipping import ShippedModel
from sparkgrad.spark.tfrecords import evaluate_tfrecords, predict_tfrecords

__all__ = ["ShippedModel", "evaluate_tfrecords", "predict_tfrecords"]
