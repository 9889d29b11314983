"""``sparkgrad.spark.Model``: a trained sparkgrad.nn model as a Spark ML Transformer.

The class docstring says how ``transform`` and ``evaluate`` work; the feature conversion is
sparkgrad/spark/columns.py's and cluster/arrow_feed.py's, the shipping of the weights
sparkgrad/spark/shipping.py's, persistence sparkgrad/spark/persist.py's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyspark import keyword_only
from pyspark.ml import Model as _SparkModel
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasFeaturesCol,
    HasInputCols,
    HasLabelCol,
    HasOutputCol,
    HasPredictionCol,
    HasProbabilityCol,
)
from pyspark.ml.util import MLReadable, MLWritable

from sparkgrad.errors import InvalidArgumentError
from sparkgrad.spark import columns as C
from sparkgrad.spark import persist

SCORE_BATCH = 1024
_TASK_ERROR = re.compile(r"sparkgrad\.errors\.(\w+): (.+)")


def task_error(exc: BaseException) -> BaseException:
    """The sparkgrad error a Spark task raised, from the job's failure text (else ``exc`` itself)."""
    from sparkgrad import errors

    found = _TASK_ERROR.findall(str(exc))
    if not found:
        return exc
    name, message = found[-1]
    cls = getattr(errors, name, None)
    if not isinstance(cls, type) or not issubclass(cls, errors.SparkgradError):
        return exc
    return cls(message.strip())


class _ModelParams(HasFeaturesCol, HasInputCols, HasLabelCol, HasOutputCol, HasPredictionCol, HasProbabilityCol):
    input_mapping = Param(
        Params._dummy(),
        "input_mapping",
        "{column: 'x' | 'y'}: the feature column(s) and the label column, as TensorFlowOnSpark's input_mapping",
        typeConverter=TypeConverters.identity,
    )
    loss = Param(
        Params._dummy(),
        "loss",
        "sparse_categorical_crossentropy or categorical_crossentropy",
        typeConverter=TypeConverters.toString,
    )
    batch_size = Param(Params._dummy(), "batch_size", "rows per batch", typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(
            featuresCol="features",
            labelCol="label",
            outputCol="",
            predictionCol="prediction",
            probabilityCol="probability",
            input_mapping=None,
            loss=C.SPARSE_LOSS,
            batch_size=64,
        )

    def _feature_columns(self, what: str) -> tuple[str, ...]:
        cols = self.getOrDefault(self.inputCols) if self.isDefined(self.inputCols) else None
        mapping = self.getOrDefault(self.input_mapping)
        if cols and mapping:
            raise InvalidArgumentError(f"{what}: set inputCols or input_mapping, not both")
        return C.feature_columns(self.getOrDefault(self.featuresCol), cols, mapping, what)

    def _label_column(self) -> str | None:
        return C.mapped_label(self.getOrDefault(self.input_mapping), self.getOrDefault(self.labelCol))


def _out_dim(model: Any) -> int:
    return int(model.output_classes)


def _ends_in_softmax(model: Any) -> bool:
    return getattr(model.layers[-1], "activation", None) == "softmax"


def _check_vector_output(fields: list, probability: str) -> None:
    """pyspark < 3.5 cannot return a Spark ML vector column from mapInArrow: say so before the job."""
    import pyspark
    from pyspark.ml.linalg import VectorUDT

    major, minor = (int(v) for v in pyspark.__version__.split(".")[:2])
    if (major, minor) >= (3, 5):
        return
    vectors = [f.name for f in fields if isinstance(f.dataType, VectorUDT)]
    if vectors or probability:
        what = f"the vector column(s) {', '.join(map(repr, vectors))}" if vectors else "probabilityCol (a vector)"
        raise InvalidArgumentError(
            f"Model.transform on pyspark {pyspark.__version__}: mapInArrow returns no Spark ML vector columns before "
            f"pyspark 3.5, and the output would hold {what}: drop vector columns before transform (keep the "
            "features as an array, e.g. vector_to_array) and set probabilityCol='' (outputCol gives the outputs "
            "as an array), or use pyspark >= 3.5"
        )


def _select(batch: Any, names: tuple[str, ...]) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_arrays([batch.column(batch.schema.get_field_index(c)) for c in names], names=list(names))


@dataclass(frozen=True)
class _Scorer:
    """Model.transform's mapInArrow function: the input batch plus the output columns."""

    shipped: Any
    spec: C.FeatureSpec
    prediction: str
    probability: str
    output: str
    softmax: bool
    batch_size: int

    def __call__(self, batches: Any) -> Any:
        import pyarrow as pa
        from pyspark import TaskContext

        from sparkgrad.cluster.arrow_feed import batch_to_columns

        model = self.shipped.load()
        part = TaskContext.get().partitionId()
        row = 0
        for batch in batches:
            x = self.spec.x(batch_to_columns(_select(batch, self.spec.features), part, row), part, row)
            row += batch.num_rows
            out = model.predict(x, self.batch_size) if batch.num_rows else np.zeros((0, _out_dim(model)), np.float32)
            arrays, names = list(batch.columns), list(batch.schema.names)
            if self.prediction:
                arrays.append(pa.array(out.argmax(axis=1).astype(np.float64) if len(out) else np.zeros(0)))
                names.append(self.prediction)
            if self.probability:
                arrays.append(C.vector_array(out if self.softmax else C.softmax(out)))
                names.append(self.probability)
            if self.output:
                arrays.append(C.list_array(out))
                names.append(self.output)
            yield pa.RecordBatch.from_arrays(arrays, names=names)


@dataclass(frozen=True)
class _Evaluator:
    """Model.evaluate's mapInArrow function: one row (loss_sum, correct, seen) per partition."""

    shipped: Any
    spec: C.FeatureSpec
    loss: str
    batch_size: int

    def __call__(self, batches: Any) -> Any:
        import pyarrow as pa
        from pyspark import TaskContext

        from sparkgrad.cluster.arrow_feed import batch_to_columns

        model = self.shipped.load()
        if model.loss != self.loss:
            model.compile(optimizer="sgd", loss=self.loss, metrics=["accuracy"])
        part = TaskContext.get().partitionId()
        row = 0
        loss_sum, correct, seen = 0.0, 0, 0
        for batch in batches:
            if not batch.num_rows:
                continue
            cols = batch_to_columns(_select(batch, self.spec.columns), part, row)
            xy = self.spec(cols, part, row)
            row += batch.num_rows
            r = model._evaluate_arrays(xy["x"], xy["y"], self.batch_size)
            loss_sum, correct, seen = loss_sum + float(r[0]), correct + int(r[1]), seen + int(r[2])
        yield pa.RecordBatch.from_pydict(
            {"loss_sum": [loss_sum], "correct": [correct], "seen": [seen]},
            schema=pa.schema([("loss_sum", pa.float64()), ("correct", pa.int64()), ("seen", pa.int64())]),
        )


class Model(_SparkModel, _ModelParams, persist.Persisted, MLWritable, MLReadable):
    """A trained sparkgrad.nn model as a Spark ML Transformer: scores DataFrames in parallel, in Spark's tasks.

    ``transform(df)`` scores with ``mapInArrow``: each task takes its Arrow record batches, makes the
    model's input from the feature columns (vectors, arrays, binary, numbers; no Python object per
    row), runs the C engine's predict and appends the output columns to the batch, which goes back
    to Spark as Arrow. The weights travel once per job (`ShippedModel`: a broadcast on classic Spark,
    the closure or a shared file over Spark Connect) and each Python worker builds the model once.
    Nothing is collected to the driver. The output columns (an empty name skips one):

    - ``predictionCol`` (double): the argmax class, as Spark ML classifiers write it;
    - ``probabilityCol`` (Spark ML vector): the class probabilities (the model's softmax output, or
      the softmax of its logits); vector outputs need pyspark >= 3.5;
    - ``outputCol`` (array<float>): the model's raw output (default ``""``: off).

    Build one from a trained model with ``Model.from_nn(model, featuresCol=...)``; `Estimator` fit
    returns one. ``save(path)`` writes the params and the saved-model bytes; it loads with
    ``Model.load(path)`` and inside ``PipelineModel.load``.

    Every argument is a Spark ML Param, keyword-only.

    Args:
        featuresCol: The feature column (a Spark ML vector, an array of numbers, binary or a number).
        inputCols: Several feature columns, flattened and concatenated in order (instead of featuresCol).
        input_mapping: ``{column: "x" | "y"}``: the feature columns and the label column, as
            TensorFlowOnSpark's input_mapping.
        labelCol: The label column, for `evaluate`.
        outputCol: Column of the raw outputs (array<float>); ``""`` skips it.
        predictionCol: Column of the predicted class (double); ``""`` skips it.
        probabilityCol: Column of the class probabilities (vector); ``""`` skips it.
        loss: The loss `evaluate` computes: ``"sparse_categorical_crossentropy"`` or
            ``"categorical_crossentropy"``.
        batch_size: Scoring works in batches of 16 times this many rows.

    Attributes:
        validation_metrics (dict[str, float]): From `Estimator` fit with validation: ``val_loss``,
            ``val_accuracy`` and ``val_rows``.
        history (list[dict]): From `Estimator` fit: each worker's last training metrics, by rank.
    """

    @keyword_only
    def __init__(
        self,
        *,
        featuresCol: str = "features",
        inputCols: list[str] | None = None,
        input_mapping: dict[str, str] | None = None,
        labelCol: str = "label",
        outputCol: str = "",
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        loss: str = C.SPARSE_LOSS,
        batch_size: int = 64,
    ) -> None:
        super().__init__()
        kwargs = dict(self._input_kwargs)
        self._set(**{k: v for k, v in kwargs.items() if v is not None})
        self._model_bytes: bytes | None = None
        self._nn: Any = None
        self._shipped: tuple[Any, Any] | None = None
        self.validation_metrics: dict[str, float] = {}
        self.history: list[dict] = []

    # ---- building ------------------------------------------------------------

    @classmethod
    def from_nn(cls, model: Any, **params: Any) -> Model:
        """Wraps a trained sparkgrad.nn model, or its saved-model bytes, as a Model.

        Args:
            model: A `sparkgrad.nn.Sequential` or the bytes of `sparkgrad.nn.model_to_bytes`.
            **params: The Model's params (``featuresCol=``, ``predictionCol=``, ...).
        """
        from sparkgrad.nn.saved import model_from_bytes, model_to_bytes

        out = cls(**params)
        out._model_bytes = bytes(model) if isinstance(model, (bytes, bytearray)) else model_to_bytes(model)
        out._nn = (
            model_from_bytes(out._model_bytes, "Model.from_nn") if isinstance(model, (bytes, bytearray)) else model
        )
        return out

    @property
    def nn_model(self) -> Any:
        """The sparkgrad.nn model (built on the driver on first use).

        Raises:
            InvalidArgumentError: This Model holds no trained model (built without `from_nn` or fit).
        """
        if self._nn is None:
            from sparkgrad.nn.saved import model_from_bytes

            if self._model_bytes is None:
                raise InvalidArgumentError("this Model holds no trained model: use Model.from_nn or Estimator.fit")
            self._nn = model_from_bytes(self._model_bytes, f"Model {self.uid}")
        return self._nn

    @property
    def model_bytes(self) -> bytes:
        """The saved-model bytes of the trained model (what travels to the tasks and what ``save`` writes)."""
        if self._model_bytes is None:
            raise InvalidArgumentError("this Model holds no trained model: use Model.from_nn or Estimator.fit")
        return self._model_bytes

    def copy(self, extra: Any = None) -> Model:
        """A copy with the same trained model and params (``extra`` overrides params), as Spark ML's copy."""
        that = super().copy(extra)
        that._shipped = None
        return that

    def _ship(self, session: Any) -> Any:
        """One ShippedModel per session, reused by every transform and evaluate of this Model."""
        if self._shipped is None or self._shipped[0] is not session:
            from sparkgrad.spark.shipping import ShippedModel

            self._shipped = (session, ShippedModel(session, self.model_bytes))
        return self._shipped[1]

    def _spec(self, what: str, with_label: bool) -> C.FeatureSpec:
        m = self.nn_model
        width = int(np.prod(m.input_shape))
        label = self._label_column() if with_label else None
        if with_label and not label:
            raise InvalidArgumentError(f"{what}: set labelCol (or map a column to 'y' in input_mapping)")
        return C.FeatureSpec(
            self._feature_columns(what),
            width,
            tuple(m.input_shape),
            label,
            self.getOrDefault(self.loss),
            _out_dim(m),
        )

    # ---- scoring ---------------------------------------------------------------

    def _transform(self, dataset: Any) -> Any:
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql import types as T

        spec = self._spec("Model.transform", with_label=False)
        C.check_schema(dataset.schema, spec.features, spec.width, spec.input_shape)
        names = {
            "predictionCol": self.getOrDefault(self.predictionCol),
            "probabilityCol": self.getOrDefault(self.probabilityCol),
            "outputCol": self.getOrDefault(self.outputCol),
        }
        fields = list(dataset.schema.fields)
        _check_vector_output(fields, names["probabilityCol"])
        types = {
            "predictionCol": T.DoubleType(),
            "probabilityCol": VectorUDT(),
            "outputCol": T.ArrayType(T.FloatType()),
        }
        for param, name in names.items():
            if not name:
                continue
            if name in dataset.columns:
                raise InvalidArgumentError(
                    f"Model.transform: {param} {name!r} is already a column of the DataFrame (rename it or set "
                    f"{param} to another name, or '' to skip it)",
                    column=name,
                )
            fields.append(T.StructField(name, types[param], True))
        scorer = _Scorer(
            self._ship(dataset.sparkSession),
            spec,
            names["predictionCol"],
            names["probabilityCol"],
            names["outputCol"],
            _ends_in_softmax(self.nn_model),
            max(1, int(self.getOrDefault(self.batch_size))) * 16,
        )
        return dataset.mapInArrow(scorer, T.StructType(fields))

    def evaluate(self, dataset: Any) -> dict[str, float]:
        """Loss and accuracy over ``dataset``, computed in Spark's tasks.

        Spark sums the per-partition totals, so one row reaches the driver.

        Args:
            dataset: A DataFrame with the feature columns and ``labelCol``.

        Returns:
            ``{"loss": mean loss, "accuracy": fraction correct, "rows": rows evaluated}``.

        Raises:
            InvalidArgumentError: A missing or unusable column, a bad row (the message names the column,
                partition and row), or no rows.
        """
        from pyspark.sql import functions as F

        spec = self._spec("Model.evaluate", with_label=True)
        C.check_schema(dataset.schema, spec.features, spec.width, spec.input_shape, spec.label, spec.loss, spec.classes)
        ev = _Evaluator(
            self._ship(dataset.sparkSession),
            spec,
            self.getOrDefault(self.loss),
            max(1, int(self.getOrDefault(self.batch_size))) * 16,
        )
        sums = (
            dataset.select(*spec.columns)
            .mapInArrow(ev, "loss_sum double, correct long, seen long")
            .agg(F.sum("loss_sum").alias("l"), F.sum("correct").alias("c"), F.sum("seen").alias("n"))
        )
        try:
            totals = sums.first()
        except Exception as exc:  # noqa: BLE001 - a task's sparkgrad error, raised as itself
            found = task_error(exc)
            if found is exc:
                raise
            raise found from None
        seen = int(totals.n or 0)
        if seen == 0:
            raise InvalidArgumentError("Model.evaluate: the DataFrame has no rows")
        return {"loss": float(totals.l) / seen, "accuracy": int(totals.c) / seen, "rows": seen}

    # ---- persistence -----------------------------------------------------------

    def _save_to(self, spark: Any, path: str, overwrite: bool) -> None:
        extra = {"validation_metrics": self.validation_metrics, "history": self.history}
        persist.write_stage(spark, path, persist.metadata_json(self, spark, extra=extra), self.model_bytes, overwrite)

    @classmethod
    def _load_from(cls, spark: Any, path: str) -> Model:
        meta = persist.read_metadata(spark, path, f"{cls.__module__}.{cls.__name__}")
        out = cls()
        persist.set_params(out, meta)
        out._model_bytes = persist.read_model_bytes(spark, path)
        out.validation_metrics = dict(meta.get("validation_metrics") or {})
        out.history = list(meta.get("history") or [])
        return out
