"""sparkgrad on Spark ML and DataFrames: an Estimator and Model for Pipelines, DataFrame and TFRecord
scoring, and shipping a trained model to Spark tasks (sparkgrad.spark.shipping)."""

from sparkgrad.spark.shipping import ShippedModel

__all__ = ["ShippedModel"]
