"""sparkgrad on Spark ML and DataFrames: an Estimator and Model for Pipelines, DataFrame and TFRecord
scoring, and shipping a trained model to Spark tasks (sparkgrad.spark.shipping).

``Estimator`` (sparkgrad.spark.estimator) and ``Model`` (sparkgrad.spark.model) load on first use:
they need pyspark, which ``import sparkgrad`` never does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkgrad.spark.shipping import ShippedModel

if TYPE_CHECKING:
    from sparkgrad.spark.estimator import Estimator
    from sparkgrad.spark.model import Model

_LAZY = {"Estimator": "sparkgrad.spark.estimator", "Model": "sparkgrad.spark.model"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Estimator", "Model", "ShippedModel"]
