"""sparkgrad on Spark ML and DataFrames: an Estimator and Model for Pipelines, DataFrame and TFRecord
scoring (sparkgrad.spark.tfrecords), and shipping a trained model to Spark tasks (sparkgrad.spark.shipping).

Importing this package does not import pyspark: ``Estimator`` (sparkgrad.spark.estimator) and ``Model``
(sparkgrad.spark.model) load on first use, and each function imports pyspark when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkgrad.spark.shipping import ShippedModel
from sparkgrad.spark.tfrecords import evaluate_tfrecords, predict_tfrecords

if TYPE_CHECKING:
    from sparkgrad.spark.estimator import Estimator
    from sparkgrad.spark.model import Model

_LAZY = {"Estimator": "sparkgrad.spark.estimator", "Model": "sparkgrad.spark.model"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Estimator", "Model", "ShippedModel", "evaluate_tfrecords", "predict_tfrecords"]
