"""``sparkgrad.spark.Model``: a trained sparkgrad.nn model as a Spark ML Transformer.

The class docstring says how ``transform`` and ``evaluate`` work and which columns each kind of model
(classifier, binary classifier, regression) gets; the feature conversion is sparkgrad/spark/columns.py's
and cluster/arrow_feed.py's, the shipping of the weights sparkgrad/spark/shipping.py's, persistence
sparkgrad/spark/persist.py's.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Sequence
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
    HasRawPredictionCol,
    HasThreshold,
)
from pyspark.ml.util import MLReadable, MLWritable

from sparkgrad.errors import InvalidArgumentError, SchemaError, SparkgradIOError
from sparkgrad.nn import losses as _losses
from sparkgrad.nn import metrics as _metrics
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


class _ModelParams(
    HasFeaturesCol,
    HasInputCols,
    HasLabelCol,
    HasOutputCol,
    HasPredictionCol,
    HasProbabilityCol,
    HasRawPredictionCol,
    HasThreshold,
):
    input_mapping = Param(
        Params._dummy(),
        "input_mapping",
        "{column: input name | 'x' | 'y'}: the columns of the model's inputs and the label column",
        typeConverter=TypeConverters.identity,
    )
    loss = Param(
        Params._dummy(),
        "loss",
        "a loss name of sparkgrad.nn.losses (None: the model's compiled loss, else by its head)",
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
            rawPredictionCol="rawPrediction",
            threshold=0.5,
            input_mapping=None,
            loss=None,
            batch_size=64,
        )

    def _inputs(self, model: Any, what: str) -> tuple[C.InputColumns, ...]:
        """Which columns feed which of ``model``'s inputs (`C.input_columns`)."""
        cols = self.getOrDefault(self.inputCols) if self.isDefined(self.inputCols) else None
        mapping = self.getOrDefault(self.input_mapping)
        if cols and mapping:
            raise InvalidArgumentError(f"{what}: set inputCols or input_mapping, not both")
        return C.input_columns(model, self.getOrDefault(self.featuresCol), cols, mapping, what)

    def _feature_spec(self, model: Any, loss: Any, what: str, with_label: bool) -> C.FeatureSpec:
        """The `C.FeatureSpec` of ``model`` under ``loss`` and this stage's params (its label when asked)."""
        label = self._label_column() if with_label else None
        if with_label and not label:
            raise InvalidArgumentError(f"{what}: set labelCol (or map a column to 'y' in input_mapping)")
        return C.FeatureSpec(self._inputs(model, what), label, loss.fn, _out_dim(model))

    def _label_column(self) -> str | None:
        return C.mapped_label(self.getOrDefault(self.input_mapping), self.getOrDefault(self.labelCol))

    def _loss_of(self, model: Any, what: str) -> Any:
        """The `sparkgrad.nn.losses.Loss` of ``model`` under this stage's ``loss`` param (`C.resolve_loss`)."""
        return C.resolve_loss(self.getOrDefault(self.loss), model, what)


def _out_dim(model: Any) -> int:
    return int(model.output_classes)


@dataclass(frozen=True)
class _Columns:
    """The columns transform appends (an empty name: not written) and what the model's outputs are."""

    task: C.Task
    probabilities: bool  # the outputs are probabilities (a softmax or sigmoid head), not logits
    prediction: str = ""
    probability: str = ""
    raw_prediction: str = ""
    output: str = ""
    threshold: float = 0.5

    def fields(self, outputs: int) -> list[tuple[str, str, Any]]:
        """``(param, name, Spark type)`` of each column written, in the order `values` gives them."""
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql import types as T

        number = T.DoubleType() if outputs == 1 or self.task is C.Task.CLASSES else T.ArrayType(T.DoubleType())
        types = [
            ("predictionCol", self.prediction, number),
            ("probabilityCol", self.probability, VectorUDT()),
            ("rawPredictionCol", self.raw_prediction, VectorUDT()),
            ("outputCol", self.output, T.ArrayType(T.FloatType())),
        ]
        return [(param, name, t) for param, name, t in types if name]

    def values(self, out: np.ndarray) -> list[np.ndarray]:
        """Each column's values from the model's outputs ``out`` (float32 ``[rows, outputs]``), in the order of
        `fields`: float64 ``[rows]`` for a double, float64 ``[rows, k]`` for an array<double> or a vector, float32
        ``[rows, outputs]`` for ``outputCol``."""
        cols = []
        if self.task is C.Task.CLASSES:
            if self.prediction:
                cols.append(out.argmax(axis=1).astype(np.float64))
            if self.probability:
                cols.append(np.asarray(out if self.probabilities else C.softmax(out), np.float64))
        elif self.task is C.Task.BINARY:
            p, z = C.binary_scores(out, self.probabilities)
            one = p.shape[1] == 1  # as Spark ML's binary classifiers: [1 - p, p] and [-z, z]
            if self.prediction:
                cols.append(_doubles((p > self.threshold).astype(np.float64)))
            if self.probability:
                cols.append(np.asarray(np.hstack([1.0 - p, p]) if one else p, np.float64))
            if self.raw_prediction:
                cols.append(np.asarray(np.hstack([-z, z]) if one else z, np.float64))
        elif self.prediction:
            cols.append(_doubles(out.astype(np.float64)))
        if self.output:
            cols.append(np.asarray(out, np.float32))
        return cols

    def arrays(self, out: np.ndarray, vectors: bool) -> list[Any]:
        """The columns' Arrow arrays from the model's outputs, in the order of `fields`.

        ``vectors``: a vector column as VectorUDT's struct (as Spark holds it), else as its list<double> of
        values (which `array_to_vector` makes a vector on the JVM side).
        """
        import pyarrow as pa

        params = [param for param, name in self._names() if name]
        arrays = []
        for param, v in zip(params, self.values(out), strict=True):
            if v.ndim == 1:
                arrays.append(pa.array(v))
            elif vectors and param in _VECTORS:
                arrays.append(C.vector_array(v))
            else:
                arrays.append(C.list_array(v, v.dtype))
        return arrays

    def _names(self) -> list[tuple[str, str]]:
        return [
            ("predictionCol", self.prediction),
            ("probabilityCol", self.probability),
            ("rawPredictionCol", self.raw_prediction),
            ("outputCol", self.output),
        ]


_VECTORS = ("probabilityCol", "rawPredictionCol")  # the params whose columns are Spark ML vectors
_SPLIT_WIDTH = 256  # transform's pandas UDF returns outputs up to this wide as that many numbers


def _doubles(values: np.ndarray) -> np.ndarray:
    """float64 ``[rows, k]`` -> ``[rows]`` for k == 1 (a double column), else as it is (array<double>)."""
    return values[:, 0] if values.shape[1] == 1 else values


def _select(batch: Any, names: tuple[str, ...]) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_arrays([batch.column(batch.schema.get_field_index(c)) for c in names], names=list(names))


@dataclass(frozen=True)
class _Scorer:
    """The model's outputs for record batches of the feature columns: what transform and predict_table share."""

    shipped: Any
    spec: C.FeatureSpec
    batch_size: int

    def outputs(self, model: Any, batch: Any, part: int, row: int) -> np.ndarray:
        """float32 ``[rows, outputs]`` of ``batch``, whose rows errors number from ``row`` of partition ``part``."""
        from sparkgrad.cluster.arrow_feed import batch_to_columns

        if not batch.num_rows:
            return np.zeros((0, _out_dim(model)), np.float32)
        cols = batch_to_columns(batch, part, row, strings=True)
        return model.predict(self.spec.x(cols, part, row), self.batch_size)


def _arrow_type(kind: Any) -> Any:
    """The Arrow type in which Spark hands a column of Spark type ``kind`` to Python (a list's values are
    named ``element``, as Spark's JVM names them, so that errors name the type the feed saw before)."""
    import pyarrow as pa
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_type

    if isinstance(kind, T.ArrayType):
        return pa.list_(pa.field("element", _arrow_type(kind.elementType), nullable=kind.containsNull))
    return to_arrow_type(kind)


def _to_arrow(series: Any, kind: Any) -> Any:
    """A pandas UDF's input Series back as the Arrow array of type ``kind`` it was made from.

    A list column arrives as one NumPy array per row, each a view into one buffer of the values (pyarrow's
    ``to_pandas``): where every row is such a view, in order and without gaps or nulls, the buffer is taken
    as it is (about 1.5 us a row, against 7 for pyarrow's conversion of each array). Anything else goes
    through ``pa.Array.from_pandas``.
    """
    import pyarrow as pa

    if pa.types.is_list(kind) and not pa.types.is_nested(kind.value_type) and len(series):
        rows = series.to_numpy()
        base = getattr(rows[0], "base", None)
        dtype = np.dtype(kind.value_type.to_pandas_dtype())
        if isinstance(base, np.ndarray) and base.dtype == dtype and base.flags.c_contiguous:
            step = (dtype.itemsize,)
            if all(isinstance(r, np.ndarray) and r.base is base and r.strides == step for r in rows):
                lengths = np.fromiter((len(r) for r in rows), np.int64, len(rows))
                starts = np.fromiter((r.__array_interface__["data"][0] for r in rows), np.int64, len(rows))
                offsets = np.zeros(len(rows) + 1, np.int64)
                np.cumsum(lengths, out=offsets[1:])
                flat = base.reshape(-1)
                # an empty row's view points anywhere: the rows with values must lie end to end in the buffer
                full = lengths > 0
                at = (starts[full] - flat.__array_interface__["data"][0]) // dtype.itemsize - offsets[:-1][full]
                first = int(at[0]) if len(at) else 0
                if (at == first).all() and 0 <= first and first + offsets[-1] <= len(flat) and offsets[-1] < 2**31:
                    values = flat[first : first + offsets[-1]]
                    flat_list = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))
                    # a cast renames the values' field (pyarrow's == ignores the name; the errors print it)
                    return flat_list if str(flat_list.type) == str(kind) else flat_list.cast(kind)
    return pa.Array.from_pandas(series, type=kind)


@dataclass(frozen=True)
class _TransformUdf:
    """Model.transform's iterator pandas UDF: the feature columns in, one struct of the output columns out.

    Spark hands the feature columns alone to Python and keeps the other columns of each row on the JVM
    side; the Series go back to Arrow (their Spark types' Arrow types) so that every column kind takes the
    path, and gets the errors, of cluster/arrow_feed.py. Vector outputs come back as their values
    (array<double>), which ``array_to_vector`` makes vectors on the JVM side.
    """

    scorer: _Scorer
    columns: _Columns
    types: tuple  # the pyarrow type of each feature column, in the order of spec.features
    widths: tuple  # per output column: 0 for a number, k to return its k values as k numbers, -1 as one array

    def __call__(self, batches: Any) -> Any:
        import pandas as pd
        import pyarrow as pa
        from pyspark import TaskContext

        model = self.scorer.shipped.load()
        part = TaskContext.get().partitionId()
        names = list(self.scorer.spec.features)
        row = 0
        for series in batches:
            series = (series,) if isinstance(series, pd.Series) else series
            arrays = [_to_arrow(s, t) for s, t in zip(series, self.types, strict=True)]
            out = self.scorer.outputs(model, pa.RecordBatch.from_arrays(arrays, names=names), part, row)
            row += len(out)
            values = self.columns.values(out)
            frame = {}
            for i, (v, k) in enumerate(zip(values, self.widths, strict=True)):
                if k < 0:
                    frame[f"c{i}"] = pd.Series(list(v))  # pyspark turns each row into a list: slow, but any width
                elif k == 0:
                    frame[f"c{i}"] = v
                else:
                    frame.update({f"c{i}_{j}": v[:, j] for j in range(k)})
            yield pd.DataFrame(frame)

    def udf(self, returns: Any, connect: bool = False) -> Any:
        """This function as a pandas UDF of the feature columns returning the struct ``returns``; with
        ``connect``, a Spark Connect UDF (for a Connect DataFrame, whatever pyspark's "connect mode")."""
        import typing

        import pandas as pd

        def score(batches: Any) -> Any:
            return self(batches)

        # pyspark tells the UDF kind from the annotations; pyspark 3.4 knows typing.Tuple, not tuple[...]
        takes = pd.Series if len(self.types) == 1 else typing.Tuple[(pd.Series, ...)]  # noqa: UP006
        score.__annotations__ = {"batches": typing.Iterator[takes], "return": typing.Iterator[pd.DataFrame]}
        if connect:
            # what pandas_udf makes in connect mode; it tells the modes apart by that process-wide flag alone
            from pyspark.rdd import PythonEvalType
            from pyspark.sql.connect.udf import _create_udf

            return _create_udf(score, returns, PythonEvalType.SQL_SCALAR_PANDAS_ITER_UDF)
        from pyspark.sql.functions import pandas_udf

        return pandas_udf(score, returns)


def sql_functions(dataset: Any) -> tuple[Any, Any, Any]:
    """``(functions, array_to_vector, vector_to_array)`` for columns of ``dataset``: pyspark's Spark Connect
    modules for a Connect DataFrame, the classic ones otherwise. Told apart by the DataFrame's class, not by
    pyspark's process-wide "connect mode" flag, which a Connect session made with
    ``pyspark.sql.connect.session.SparkSession.builder`` (or one beside a classic session) does not set."""
    from sparkgrad.cluster.spark import is_connect_session

    if is_connect_session(dataset):  # the class's module tells a Connect DataFrame too
        from pyspark.ml.connect.functions import array_to_vector, vector_to_array
        from pyspark.sql.connect import functions
    else:
        from pyspark.ml.functions import array_to_vector, vector_to_array
        from pyspark.sql import functions
    return functions, array_to_vector, vector_to_array


@dataclass(frozen=True)
class _Evaluator:
    """Model.evaluate's mapInArrow function: one row (loss_sum, seen, metric state) per partition."""

    shipped: Any
    spec: C.FeatureSpec
    loss: dict  # sparkgrad.nn.losses.serialize's form: the loss with its arguments
    metrics: tuple  # of sparkgrad.nn.metrics.serialize's forms
    batch_size: int

    def __call__(self, batches: Any) -> Any:
        from pyspark import TaskContext

        from sparkgrad.cluster.arrow_feed import batch_to_columns

        model = self.shipped.load()
        model.compile(optimizer="sgd", loss=self.loss, metrics=list(self.metrics))
        part = TaskContext.get().partitionId()
        row = 0
        loss_sum, seen, state = 0.0, 0, model.new_metric_state()
        for batch in batches:
            if not batch.num_rows:
                continue
            cols = batch_to_columns(_select(batch, self.spec.columns), part, row, strings=True)
            x, y = self.spec.x(cols, part, row), self.spec.y(cols, part, row)
            row += batch.num_rows
            r = model._evaluate_arrays(x, y, self.batch_size, state)
            loss_sum, seen = loss_sum + float(r[0]), seen + int(r[1])
        yield _metrics.evaluation_batch(loss_sum, seen, state)


class Model(_SparkModel, _ModelParams, persist.Persisted, MLWritable, MLReadable):
    """A trained sparkgrad.nn model as a Spark ML Transformer: scores DataFrames in parallel, in Spark's tasks.

    ``transform(df)`` scores with an iterator pandas UDF of the feature columns alone: Spark hands
    those columns to Python and keeps every other column of the row on the JVM side. Each batch goes
    back to Arrow and takes the feed's conversion (vectors, arrays, binary, numbers, and strings as Arrow's
    offsets and bytes for a string Input; a vector column's values come as an array, by
    ``vector_to_array``), then the C engine's predict; the UDF returns one struct of the output columns,
    evaluated once per row, which Spark unpacks into the columns (a vector from its values, by
    ``array_to_vector``). The weights travel once per job (`ShippedModel`: a broadcast on classic Spark,
    the closure or a shared file over Spark Connect) and each Python worker builds the model once.
    `predict_table` scores a Parquet table's files without the JVM.
    Nothing is collected to the driver. The output columns follow the loss (``loss``; by default the
    model's compiled loss, else ``binary_crossentropy`` for a sigmoid head and a classifier's
    otherwise), as Spark ML's own models write them; an empty name skips one:

    - a classifier (``sparse_categorical_crossentropy``, ``categorical_crossentropy``):
      ``predictionCol`` (double) the argmax class; ``probabilityCol`` (Spark ML vector) the class
      probabilities (the model's softmax output, or the softmax of its logits);
    - a binary classifier (``binary_crossentropy``, one output), as ``LogisticRegressionModel``:
      ``rawPredictionCol`` (vector) ``[-z, z]`` of the logit z; ``probabilityCol`` (vector)
      ``[1 - p, p]``; ``predictionCol`` (double) 1.0 where ``p > threshold`` (default 0.5), else 0.0.
      For a sigmoid head z is ``log(p / (1 - p))`` of the float32 probability clipped to
      ``[1e-7, 1 - 1e-7]``, so ``|z| <= 16.1``; a linear last layer trained with
      ``BinaryCrossentropy(from_logits=True)`` gives z itself. With k outputs (multi-label) the vectors
      hold the k probabilities and logits and ``predictionCol`` is an array<double> of k 0/1 values;
    - a regression (``mse``, ``mae``, ``huber``, ``poisson``): ``predictionCol`` the value, a double
      for one output (as Spark ML regressors), an array<double> for k outputs (``prediction[0]`` in
      SQL); no probability or raw prediction;
    - any model: ``outputCol`` (array<float>) the model's output as ``predict`` gives it (default
      ``""``: off).

    Build one from a trained model with ``Model.from_nn(model, featuresCol=...)``; `Estimator` fit
    returns one. ``save(path)`` writes the params and the saved-model bytes; it loads with
    ``Model.load(path)`` and inside ``PipelineModel.load``.

    Every argument is a Spark ML Param, keyword-only.

    Args:
        featuresCol: The feature column of a model of one input (a Spark ML vector, an array of numbers,
            binary, a number, or a string for a string Input).
        inputCols: Several feature columns: concatenated in order into a model of one input; for a model
            of several named inputs, each column feeds the ``Input`` of its name.
        input_mapping: ``{column: input name | "x" | "y"}``: the feature columns, the input each feeds
            and the label column, as TensorFlowOnSpark's input_mapping.
        labelCol: The label column, for `evaluate`.
        outputCol: Column of the model's outputs (array<float>); ``""`` skips it.
        predictionCol: Column of the predicted class or value (see above); ``""`` skips it.
        probabilityCol: Column of the probabilities (vector) of a classifier; ``""`` skips it.
        rawPredictionCol: Column of a binary classifier's logits ``[-z, z]`` (vector); ``""`` skips it.
        threshold: A binary classifier predicts 1.0 where the probability is above it (Spark ML's name).
        loss: A loss name of `sparkgrad.nn.losses` (``"binary_crossentropy"``, ``"mse"``, ...): the loss
            `evaluate` computes, which also decides the columns above. None (default): the loss the model
            was compiled with, else ``"binary_crossentropy"`` for a sigmoid head and
            ``"sparse_categorical_crossentropy"`` otherwise.
        batch_size: Scoring works in batches of 16 times this many rows.

    Attributes:
        validation_metrics (dict[str, float]): From `Estimator` fit with validation: ``val_loss``,
            ``val_<metric>`` for each compiled metric (``val_accuracy``, ``val_auc``, ...) and ``val_rows``.
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
        rawPredictionCol: str = "rawPrediction",
        threshold: float = 0.5,
        loss: str | None = None,
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
            model: A `sparkgrad.nn` model of one output (a `Sequential` or a functional `Model`, of one input
                or several named ones) or the bytes of `sparkgrad.nn.model_to_bytes`.
            **params: The Model's params (``featuresCol=``, ``inputCols=``, ``input_mapping=``, ...).

        Raises:
            InvalidArgumentError: A model of several outputs.
        """
        from sparkgrad.nn.saved import model_from_bytes, model_to_bytes
        from sparkgrad.spark.estimator import check_one_output

        out = cls(**params)
        out._model_bytes = bytes(model) if isinstance(model, (bytes, bytearray)) else model_to_bytes(model)
        out._nn = check_one_output(
            model_from_bytes(out._model_bytes, "Model.from_nn") if isinstance(model, (bytes, bytearray)) else model,
            "Model.from_nn",
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

    def _spec(self, what: str, loss: Any, with_label: bool) -> C.FeatureSpec:
        return self._feature_spec(self.nn_model, loss, what, with_label)

    def column_mapping(self) -> dict[str, str]:
        """``{column: input name}``: which DataFrame column feeds which of the model's inputs (as this
        Model's params say), e.g. for `sparkgrad.mlflow.log_model`."""
        return C.column_mapping(self._inputs(self.nn_model, "Model.column_mapping"))

    def _columns(self, loss: Any) -> _Columns:
        """The columns transform writes for the model under ``loss``, from the params."""
        task, probabilities = C.output_kind(self.nn_model, loss)
        threshold = float(self.getOrDefault(self.threshold))
        if not 0.0 <= threshold <= 1.0:
            raise InvalidArgumentError(f"Model.transform: threshold must be in [0, 1], not {threshold}")
        classifier = task is not C.Task.REGRESSION
        return _Columns(
            task,
            probabilities,
            prediction=self.getOrDefault(self.predictionCol),
            probability=self.getOrDefault(self.probabilityCol) if classifier else "",
            raw_prediction=self.getOrDefault(self.rawPredictionCol) if task is C.Task.BINARY else "",
            output=self.getOrDefault(self.outputCol),
            threshold=threshold,
        )

    # ---- scoring ---------------------------------------------------------------

    def _transform(self, dataset: Any) -> Any:
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql import types as T

        from sparkgrad.cluster.spark import is_connect_session

        F, array_to_vector, vector_to_array = sql_functions(dataset)
        loss = self._loss_of(self.nn_model, "Model.transform")
        spec = self._spec("Model.transform", loss, with_label=False)
        C.check_schema(dataset.schema, spec)
        columns = self._columns(loss)
        added = columns.fields(spec.classes)
        for param, name, _ in added:
            if name in dataset.columns:
                raise InvalidArgumentError(
                    f"Model.transform: {param} {name!r} is already a column of the DataFrame (rename it or set "
                    f"{param} to another name, or '' to skip it)",
                    column=name,
                )
        inputs, types = [], []
        for name in spec.features:
            kind = dataset.schema[name].dataType
            if isinstance(kind, VectorUDT):  # its values go to Python (a null stays null, for the feed's error)
                inputs.append(F.when(F.col(name).isNull(), F.lit(None)).otherwise(vector_to_array(F.col(name))))
                kind = T.ArrayType(T.DoubleType())
            else:
                inputs.append(F.col(name))
            types.append(_arrow_type(kind))
        # Each output's values: a number, k numbers (NumPy columns, no Python object per row) up to
        # _SPLIT_WIDTH, or one array beyond (pyspark makes a list of each row's values)
        widths = []
        for v in columns.values(np.zeros((0, spec.classes), np.float32)):
            widths.append(0 if v.ndim == 1 else v.shape[1] if v.shape[1] <= _SPLIT_WIDTH else -1)
        fields = []
        for i, ((_, _, t), k) in enumerate(zip(added, widths, strict=True)):
            number = T.FloatType() if t == T.ArrayType(T.FloatType()) else T.DoubleType()
            if k == 0:
                fields.append(T.StructField(f"c{i}", number))
            elif k > 0:
                fields += [T.StructField(f"c{i}_{j}", number) for j in range(k)]
            else:
                fields.append(T.StructField(f"c{i}", T.ArrayType(number)))
        scorer = _Scorer(self._ship(dataset.sparkSession), spec, max(1, int(self.getOrDefault(self.batch_size))) * 16)
        udf = _TransformUdf(scorer, columns, tuple(types), tuple(widths)).udf(
            T.StructType(fields), connect=is_connect_session(dataset)
        )
        scores = "__sparkgrad_scores"
        while scores in dataset.columns:
            scores += "_"
        # the struct is one column, so the UDF runs once per row whatever the output columns read from it
        scored = dataset.withColumn(scores, udf(*inputs))
        outputs = {}
        for i, ((_, name, t), k) in enumerate(zip(added, widths, strict=True)):
            field = F.col(scores).getField
            value = field(f"c{i}")
            if k > 0:  # as nullable as the array it was (array() is never null)
                value = F.when(F.col(scores).isNotNull(), F.array(*[field(f"c{i}_{j}") for j in range(k)]))
            outputs[name] = array_to_vector(value) if isinstance(t, VectorUDT) else value
        return scored.withColumns(outputs).drop(scores)

    def evaluate(self, dataset: Any) -> dict[str, float]:
        """The loss and metrics over ``dataset``, computed in Spark's tasks.

        Each task returns its loss sum, its row count and its metrics' state (sums and counts, a few KB
        for an AUC); the driver adds them, so the metrics are those of the whole DataFrame (an AUC of
        the pooled counts, not an average of the tasks').

        Args:
            dataset: A DataFrame with the feature columns and ``labelCol``.

        Returns:
            ``{"loss": mean loss, <metric>: value..., "rows": rows evaluated}``: the metrics the model
            was compiled with when its loss is this Model's ``loss`` (e.g. ``accuracy`` and ``auc`` of a
            binary classifier, ``mae`` of a regression), else ``accuracy`` for a cross-entropy and none
            for a regression.

        Raises:
            InvalidArgumentError: A missing or unusable column, a bad row (the message names the column,
                partition and row), or no rows.
        """
        nn = self.nn_model
        loss = self._loss_of(nn, "Model.evaluate")
        spec = self._spec("Model.evaluate", loss, with_label=True)
        C.check_schema(dataset.schema, spec)
        metrics = _metrics.resolve(nn.metrics if nn.loss == loss.fn else None, loss, int(nn.output_classes))
        ev = _Evaluator(
            self._ship(dataset.sparkSession),
            spec,
            _losses.serialize(loss),
            tuple(_metrics.serialize(m) for m in metrics),
            max(1, int(self.getOrDefault(self.batch_size))) * 16,
        )
        try:
            rows = dataset.select(*spec.columns).mapInArrow(ev, _metrics.EVALUATION_SCHEMA).collect()
        except Exception as exc:  # noqa: BLE001 - a task's sparkgrad error, raised as itself
            found = task_error(exc)
            if found is exc:
                raise
            raise found from None
        loss_sum, seen, values = _metrics.sum_evaluations(rows, metrics)
        if seen == 0:
            raise InvalidArgumentError("Model.evaluate: the DataFrame has no rows")
        return {"loss": loss_sum / seen, **values, "rows": seen}

    def predict_table(
        self,
        source: Any,
        output_path: str,
        *,
        keep: Sequence[str] = (),
        mode: str = "overwrite",
        batch_size: int | None = None,
        tasks: int | None = None,
        spark: Any = None,
        cache_dir: str | None = None,
    ) -> int:
        """Scores a Parquet table and writes the predictions as Parquet, read and written by Spark's tasks.

        The driver lists the table's files and reads their footers; each task reads its row groups with
        pyarrow (the feature columns and ``keep`` only), scores them as `transform` does and writes one part
        file: the columns `transform` adds, with its names and types (vectors as Spark stores a VectorUDT,
        so ``spark.read.parquet(output_path)`` gives vectors), then the ``keep`` columns. No row passes
        through the JVM. ``_SUCCESS`` is written last.

        Args:
            source: A Parquet file, directory or glob (a list of them; ``dbfs:/`` as ``/dbfs/``), a Delta
                table's directory or ``deltalake.DeltaTable``, or a DataFrame: a plain ``spark.read.parquet``
                scan is read from its files, any other DataFrame from a Parquet cache entry written once
                (`sparkgrad.data.table_files`).
            output_path: The directory to write (local, ``/dbfs/...``, ``dbfs:/...`` or ``/Volumes/...``).
            keep: Columns of the table copied beside the predictions (e.g. an id to join on).
            mode: ``"overwrite"`` (replace what is at ``output_path``) or ``"error"`` (refuse if it exists).
            batch_size: Rows per predict call (default: 16 times this Model's ``batch_size``).
            tasks: Tasks to run (default: Spark's default parallelism), at most one per row group.
            spark: The SparkSession (default: the DataFrame's, else the active one).
            cache_dir: Where a DataFrame that is not a plain scan is cached (see `sparkgrad.data.table_files`).

        Returns:
            The rows written.

        Raises:
            SchemaError: A feature or ``keep`` column missing from a file (named, with its columns), a file
                that is not Parquet, or a column of a type the model's input cannot take.
            SparkgradIOError: A missing file, the output's parent directory missing, or ``output_path``
                existing under ``mode="error"``.
            InvalidArgumentError: Bad arguments (an output column named like a ``keep`` column, output inside
                the table), a Delta table `table_files` refuses, or a bad row (file, row group and row named).
        """
        from pyspark.sql import SparkSession
        from pyspark.sql import types as T

        from sparkgrad.spark import predict_table as P

        what = "Model.predict_table"
        spark = spark or getattr(source, "sparkSession", None) or SparkSession.getActiveSession()
        if spark is None:
            raise InvalidArgumentError(f"{what}: no active SparkSession (pass spark=)")
        loss = self._loss_of(self.nn_model, what)
        spec = self._spec(what, loss, with_label=False)
        columns = self._columns(loss)
        added = columns.fields(spec.classes)
        keep = tuple(keep)
        for param, name, _ in added:
            if name in keep:
                raise InvalidArgumentError(f"{what}: {param} {name!r} is also a keep column", column=name)
        files = P.source_files(source, list(spec.features) + list(keep), cache_dir)
        if not files:
            raise SparkgradIOError(f"{what}: {source!r} names no files", path=str(source))
        units, schema = P.plan_units(files, list(spec.features) + list(keep), what)
        path = files[0]
        C.check_schema(
            T.StructType([T.StructField(c, P._spark_type(schema.field(c), path)) for c in spec.features]), spec
        )
        kept = tuple((c, schema.field(c).type) for c in keep)
        try:
            spark_schema = T.StructType(
                [T.StructField(name, t, True) for _, name, t in added]
                + [T.StructField(c, P._spark_type(schema.field(c), path), True) for c in keep]
            ).json()
        except SchemaError:
            spark_schema = None  # a kept column Spark has no type for: the files hold no Spark schema
        if tasks is None:
            tasks = int(spark.sparkContext.defaultParallelism) if hasattr(spark, "_jsc") else len(units)
        runs = P.split_units(units, max(1, int(tasks)))
        out = P.prepare_output(str(output_path), mode, files, what)
        scorer = P.TableScorer(
            _Scorer(self._ship(spark), spec, int(batch_size or max(1, int(self.getOrDefault(self.batch_size))) * 16)),
            columns,
            tuple(name for _, name, _ in added),
            tuple(tuple(r) for r in runs),
            kept,
            out,
            uuid.uuid4().hex[:12],
            spark_schema,
        )
        try:
            done = spark.range(0, len(runs), 1, len(runs)).mapInArrow(scorer, "run int, rows long").collect()
        except Exception as exc:  # noqa: BLE001 - a task's sparkgrad error, raised as itself
            found = task_error(exc)
            if found is exc:
                raise
            raise found from None
        with open(os.path.join(out, "_SUCCESS"), "w"):
            pass
        return sum(int(r["rows"]) for r in done)

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
