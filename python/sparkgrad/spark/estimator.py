"""``sparkgrad.spark.Estimator``: distributed training from a DataFrame as a Spark ML Estimator.

The class docstring says what ``fit(df)`` does, step by step; the nodes run sparkgrad/spark/training.py,
each reading its own shard of the table's Parquet files (sparkgrad.data.ParquetDataset, the files from
sparkgrad.data.source), and the schema checks are sparkgrad/spark/columns.py's.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from typing import Any

from pyspark import keyword_only
from pyspark.ml import Estimator as _SparkEstimator
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasSeed
from pyspark.ml.util import MLReadable, MLWritable

from sparkgrad.errors import ClusterError, InsufficientSlotsError, InvalidArgumentError, ModelError, NodeFailure
from sparkgrad.nn import losses as _losses
from sparkgrad.nn import metrics as _metrics
from sparkgrad.spark import columns as C
from sparkgrad.spark import persist
from sparkgrad.spark.model import Model, _ModelParams, task_error

logger = logging.getLogger(__name__)

MODES = ("allreduce", "ps")
RESERVATION_TIMEOUT = 120.0
SHUFFLE_BATCHES = 10  # the default shuffle buffer, in batches
# Errors of the table a node's read raises: fit raises them as themselves (the NodeFailure as their cause)
_DATA_ERRORS = ("InvalidArgumentError", "SchemaError", "SparkgradIOError", "InputNotFoundError", "CorruptRecordError")


def _is_nn_model(value: Any) -> bool:
    return hasattr(value, "layers") and hasattr(value, "params") and hasattr(value, "input_shape")


def check_one_output(nn: Any, who: str) -> Any:
    """``nn`` when it has one output (any graph before it: Sequential or functional, of one input or several
    named ones), which is what a label column maps to.

    Raises:
        InvalidArgumentError: Several outputs, naming them.
    """
    outs = list(getattr(nn, "output_names", ["y"]))
    if len(outs) > 1:
        raise InvalidArgumentError(
            f"{who}: the model has outputs {outs}; Spark ML here maps one label column to one output (train "
            "several outputs with model.fit)"
        )
    return nn


def _compiled_metrics(nn: Any, loss: Any, model_bytes: bytes) -> tuple[dict, ...]:
    """The metrics the nodes compile with (serialized): the model's own when its loss is ``loss``, else
    the default of ``loss``. Compiles a copy of the model on the driver, so a loss or metric that does
    not fit the model fails here, before any job.

    Raises:
        InvalidArgumentError: The loss or a metric does not fit the model's output.
    """
    from sparkgrad.nn.saved import model_from_bytes

    probe = model_from_bytes(model_bytes, "Estimator model")
    wanted = nn.metrics if nn.loss == loss.fn else None
    try:
        probe.compile(optimizer="sgd", loss=loss, metrics=wanted)
    except (ModelError, ValueError) as exc:
        raise InvalidArgumentError(f"Estimator: loss {loss.fn!r} does not fit the model: {exc}") from None
    return tuple(_metrics.serialize(m) for m in probe.metrics)


def _node_error(exc: NodeFailure) -> BaseException:
    """The table error a node raised (a null under "error", a file gone or corrupt, a row its input does not
    take), as its own type; any other failure stays the NodeFailure."""
    err = task_error(exc)
    return err if type(err).__name__ in _DATA_ERRORS else exc


def _check_writable(model_dir: str) -> str:
    path = model_dir[len("file:") :] if model_dir.startswith("file:") else model_dir
    if "://" in path or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:/", path):
        raise InvalidArgumentError(
            f"model_dir {model_dir!r}: a local or mounted path is needed (e.g. /dbfs/..., /Volumes/...), "
            "which the driver and every executor can write"
        )
    path = path.replace("//", "/") if path.startswith("//") else path
    probe = os.path.join(path, f".sparkgrad-write-test-{uuid.uuid4().hex[:8]}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"ok")
        os.unlink(probe)
    except OSError as exc:
        raise InvalidArgumentError(
            f"model_dir {model_dir!r} cannot be written ({exc.strerror or exc}): fit needs it for checkpoints "
            "and the trained model; nothing was trained"
        ) from None
    return path


class Estimator(_SparkEstimator, _ModelParams, HasSeed, persist.Persisted, MLWritable, MLReadable):
    """Trains a sparkgrad.nn model on a DataFrame across a cluster, as a Spark ML Estimator.

    ```python
    est = Estimator(model=build_model, optimizer=Adam(1e-3), featuresCol="scaled", labelCol="label",
                    batch_size=64, epochs=2, num_workers=2, mode="allreduce")
    fitted = Pipeline(stages=[VectorAssembler(...), StandardScaler(...), est]).fit(df)
    ```

    It trains classifiers, binary classifiers and regressions, as Spark ML's own estimators do; the
    ``loss`` decides which, the label column it takes and the fitted `Model`'s output columns:

    | loss | last layer | label column |
    |---|---|---|
    | ``sparse_categorical_crossentropy`` | ``Dense(k, activation="softmax")`` | class indices in [0, k) |
    | ``categorical_crossentropy`` | ``Dense(k, activation="softmax")`` | one-hot vectors or arrays of k |
    | ``binary_crossentropy`` | ``Dense(1, activation="sigmoid")`` | numbers or booleans in [0, 1] |
    | ``mse``, ``mae``, ``huber``, ``poisson`` | ``Dense(1)`` / ``Dense(k)`` | numbers / vectors or arrays of k |

    ``fit(df)``:

    1. before any job: builds the model (``model`` called once on the driver if it is a function),
       checks that the loss fits it, maps the feature columns to its inputs, checks the schema
       (feature and label columns exist and have types that can be fed to their inputs, a vector size
       the schema tells matches the input, the label's type and width suit the loss), ``nulls``, that
       ``model_dir`` can be written and that Spark has a task slot for every node;
    2. splits off the validation rows (``validation``);
    3. finds the training rows' Parquet files (`sparkgrad.data.source.table_files`): a DataFrame that
       is a plain scan of Parquet files is read from its files; any other (a filtered, joined or
       transformed DataFrame, a Pipeline stage's output, the training side of a validation split) is
       first written once as Parquet, its feature and label columns only, to ``cache_dir``. The
       driver reads the files' footers: a column missing from them, a file that cannot be read or
       fewer rows than ``num_workers * batch_size`` fails here;
    4. starts a `TFCluster` in ``InputMode.TENSORFLOW`` of ``num_workers`` workers (plus ``num_ps``
       parameter servers in mode ``"ps"``), one barrier task per node and nothing else: each worker
       reads its own equal shard of the files (`sparkgrad.data.ParquetDataset`: row groups shuffled
       each epoch, then a shuffle buffer of ``shuffle_buffer`` rows seeded by ``seed``; the few rows
       beyond whole batches of equal shards are left out of an epoch, different ones each epoch) and
       trains ``epochs`` epochs. Each batch becomes the model's x and y there, checked as
       `Model.transform` checks its rows. A null under the ``"error"`` policy fails fit with a
       SchemaError naming the column, the file, the row group and the row; a row of the wrong width, a
       fractional id or a label out of range for the loss with an InvalidArgumentError naming the
       worker, the epoch, the column and the value (the node's NodeFailure, with its traceback, is the
       error's ``__cause__``); the cluster is stopped first, never a hang;
    5. returns a `Model` with the chief's trained weights, each worker's last training loss and
       metrics in ``history`` and, with validation, the validation loss and metrics (`Model.evaluate`
       in the tasks: ``val_loss``, ``val_<metric>``, ``val_rows``) in ``validation_metrics``. The
       metrics are those the model was compiled with when its loss is the Estimator's, else
       ``accuracy`` for a cross-entropy and none for a regression. With ``model_dir``, the chief
       writes checkpoints there (every ``checkpoint_every`` steps and at the end) and the driver
       writes the trained model as ``model_dir/model.sgmodel``.

    ``batch_size`` is per worker; in mode ``"allreduce"`` each step averages the workers' gradients
    (the learning rate is the optimizer's, not scaled). The shards are equal, so the workers take the
    same steps; where a column's policy is ``"skip"`` (shards may then differ by the skipped rows) the
    workers agree before each step and end each epoch together at the shortest shard. ``num_workers``
    workers need ``num_workers`` task slots (plus ``num_ps`` in mode ``"ps"``), as TorchDistributor's
    processes do; fit checks the slots first.

    Saved with ``save(path)``, loaded with ``Estimator.load(path)`` and inside Pipeline persistence:
    the model param is saved as a saved model (`sparkgrad.nn.save_model`); a function cannot be saved
    (set a model instance to save).

    Every argument is a Spark ML Param (``getOrDefault``, ``setParams``, ``copy``), keyword-only.

    Args:
        model: A sparkgrad.nn model, or a function returning one (called once on the driver).
        optimizer: A sparkgrad.nn optimizer instance or name.
        loss: Any loss name of `sparkgrad.nn.losses` (see the table above). None (default): the loss
            the model was compiled with (with its arguments, e.g. ``Huber(delta=2.0)``), else
            ``"binary_crossentropy"`` for a sigmoid head and ``"sparse_categorical_crossentropy"``
            otherwise.
        featuresCol: The feature column of a model of one input: a Spark ML vector, an array of numbers,
            binary (raw bytes of the input, e.g. uint8 pixels), a number, or a string for a string Input.
        inputCols: Several feature columns (instead of featuresCol): for a model of one input, flattened
            and concatenated in order; for a model of several named inputs, each column feeds the
            ``Input`` of its name (a string column a string Input's StringLookup or Hashing, a long
            column an int64 Input's Embedding, numbers, arrays and vectors a float32 Input).
        input_mapping: ``{column: input name | "x" | "y"}``, as TensorFlowOnSpark's input_mapping: the
            feature columns, the input each feeds ("x": the one input) and the label column (instead of
            featuresCol/inputCols and labelCol); several columns of one input are concatenated in order.
        labelCol: The label column.
        batch_size: Rows per step and per worker.
        epochs: Passes over the training rows (>= 1).
        num_workers: Training nodes (>= 1).
        num_ps: Parameter servers, mode ``"ps"`` only (at least 1 there).
        mode: ``"allreduce"`` (the workers average their gradients every step) or ``"ps"``
            (parameter servers apply the updates).
        validation: A fraction in (0, 1) of the rows (drawn with ``seed``), or the name of a boolean
            column marking the validation rows; None: no validation.
        model_dir: A local or mounted path (``/dbfs/...``, ``/Volumes/...``) the driver and every
            executor can write: checkpoints and the trained model go there.
        checkpoint_every: Steps between checkpoints (needs ``model_dir``); 0: only at the end.
        nulls: ``{column: "error" | "skip" | number}``: a null in the column fails fit naming it (``"error"``,
            every column's default), drops its row (``"skip"``) or reads as the number (a null string as
            ``""``).
        shuffle_buffer: Rows each worker draws its batches from at random (seeded by ``seed``); None: 10
            batches; 0: the files' order (row groups too).
        cache_dir: Where a DataFrame that is not a plain Parquet scan is written before training: a path
            the driver's Spark can write and every executor read (local disk on one machine, ``dbfs:/...``,
            ``/Volumes/...``); None: a directory under the system's temporary directory. A second fit of
            the same DataFrame reuses it; `sparkgrad.data.source.clear_cache` removes it.
        seed: Seed of the validation split and of the shuffling (None: 0).
        outputCol: The fitted `Model`'s raw-output column ("" skips it).
        predictionCol: The fitted `Model`'s prediction column.
        probabilityCol: The fitted `Model`'s probability column (classifiers).
        rawPredictionCol: The fitted `Model`'s raw-prediction column (binary classifiers).
        threshold: The fitted `Model`'s binary decision threshold on the probability.

    Raises:
        InvalidArgumentError: From fit: a bad param, schema or row, an unwritable ``model_dir``, or too few rows.
        SchemaError: From fit: a null under the ``"error"`` policy, or a column the files lack.
        SparkgradIOError: From fit: a file vanished or cannot be read.
        CorruptRecordError: From fit: a file is not Parquet or a row group does not decode.
        InsufficientSlotsError: From fit: fewer task slots than ``num_workers + num_ps``.
        NodeFailure: From fit: a node failed otherwise; its traceback is attached.
    """

    model = Param(
        Params._dummy(), "model", "a sparkgrad.nn model, or a function returning one", TypeConverters.identity
    )
    optimizer = Param(
        Params._dummy(), "optimizer", "a sparkgrad.nn.optimizers instance or name", TypeConverters.identity
    )
    epochs = Param(Params._dummy(), "epochs", "passes over the training rows", TypeConverters.toInt)
    num_workers = Param(Params._dummy(), "num_workers", "training nodes", TypeConverters.toInt)
    num_ps = Param(Params._dummy(), "num_ps", "parameter servers (mode 'ps')", TypeConverters.toInt)
    mode = Param(Params._dummy(), "mode", "'allreduce' or 'ps'", TypeConverters.toString)
    validation = Param(
        Params._dummy(),
        "validation",
        "a fraction of the rows, or the name of a boolean column marking them",
        TypeConverters.identity,
    )
    model_dir = Param(Params._dummy(), "model_dir", "checkpoints and the trained model", TypeConverters.identity)
    checkpoint_every = Param(Params._dummy(), "checkpoint_every", "steps between checkpoints", TypeConverters.toInt)
    nulls = Param(
        Params._dummy(), "nulls", "{column: 'error' | 'skip' | fill value} (default 'error')", TypeConverters.identity
    )
    shuffle_buffer = Param(
        Params._dummy(), "shuffle_buffer", "rows each worker shuffles in (None: 10 batches)", TypeConverters.identity
    )
    cache_dir = Param(
        Params._dummy(), "cache_dir", "where a DataFrame that is not a Parquet scan is written", TypeConverters.identity
    )

    @keyword_only
    def __init__(
        self,
        *,
        model: Any = None,
        optimizer: Any = "adam",
        loss: str | None = None,
        featuresCol: str = "features",
        inputCols: list[str] | None = None,
        input_mapping: dict[str, str] | None = None,
        labelCol: str = "label",
        batch_size: int = 64,
        epochs: int = 1,
        num_workers: int = 2,
        num_ps: int = 0,
        mode: str = "allreduce",
        validation: Any = None,
        model_dir: str | None = None,
        checkpoint_every: int = 0,
        nulls: dict[str, Any] | None = None,
        shuffle_buffer: int | None = None,
        cache_dir: str | None = None,
        seed: int | None = None,
        outputCol: str = "",
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        rawPredictionCol: str = "rawPrediction",
        threshold: float = 0.5,
    ) -> None:
        super().__init__()
        self._setDefault(
            model=None,
            optimizer="adam",
            epochs=1,
            num_workers=2,
            num_ps=0,
            mode="allreduce",
            validation=None,
            model_dir=None,
            checkpoint_every=0,
            nulls=None,
            shuffle_buffer=None,
            cache_dir=None,
            seed=0,
        )
        self._set(**{k: v for k, v in self._input_kwargs.items() if v is not None})

    def setParams(self, **kwargs: Any) -> Estimator:
        """Sets any of the constructor's params by keyword; returns this Estimator."""
        return self._set(**kwargs)

    # ---- fit -------------------------------------------------------------------

    def _resolved_model(self) -> Any:
        value = self.getOrDefault(self.model)
        if value is None:
            raise InvalidArgumentError("Estimator: set model= (a sparkgrad.nn model or a function returning one)")
        if not _is_nn_model(value):
            if not callable(value):
                raise InvalidArgumentError(
                    f"Estimator: model must be a sparkgrad.nn model or a function returning one, not "
                    f"{type(value).__name__}"
                )
            value = value()
            if not _is_nn_model(value):
                raise InvalidArgumentError(
                    f"Estimator: the model function returned {type(value).__name__}, not a sparkgrad.nn model"
                )
        return check_one_output(value, "Estimator")

    def _settings(self) -> tuple[str, int, int]:
        mode = self.getOrDefault(self.mode)
        if mode not in MODES:
            raise InvalidArgumentError(f"Estimator: mode must be one of {MODES}, not {mode!r}")
        workers = int(self.getOrDefault(self.num_workers))
        ps = int(self.getOrDefault(self.num_ps))
        if workers < 1:
            raise InvalidArgumentError(f"Estimator: num_workers must be >= 1, not {workers}")
        if mode == "allreduce" and ps:
            raise InvalidArgumentError(
                f"Estimator: mode 'allreduce' has no parameter servers (num_ps={ps}); use mode='ps'"
            )
        if mode == "ps":
            ps = max(ps, 1)
        return mode, workers, ps

    def _split(self, df: Any) -> tuple[Any, Any]:
        from pyspark.sql import types as T

        from sparkgrad.spark.model import sql_functions

        F = sql_functions(df)[0]
        v = self.getOrDefault(self.validation)
        if v is None or v == 0:
            return df, None
        if isinstance(v, str):
            if v not in df.columns:
                raise InvalidArgumentError(
                    f"validation column {v!r} is not in the DataFrame "
                    f"(its columns: {', '.join(map(repr, df.columns))})",
                    column=v,
                )
            if not isinstance(df.schema[v].dataType, T.BooleanType):
                raise InvalidArgumentError(
                    f"validation column {v!r} has type {df.schema[v].dataType.simpleString()}: a boolean column "
                    "marking the validation rows is needed",
                    column=v,
                )
            flag = F.coalesce(F.col(v), F.lit(False))
            return df.filter(~flag), df.filter(flag)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < float(v) < 1:
            raise InvalidArgumentError(f"validation must be a fraction in (0, 1) or a column name, not {v!r}")
        train, val = df.randomSplit([1 - float(v), float(v)], seed=int(self.getOrDefault(self.seed)))
        return train, val

    def _nulls(self, spec: C.FeatureSpec) -> tuple[tuple[str, object], ...]:
        """The ``nulls`` param checked against the columns fit reads: ``(column, policy)`` pairs."""
        value = self.getOrDefault(self.nulls)
        if value is None:
            return ()
        if not isinstance(value, dict):
            raise InvalidArgumentError(
                f"Estimator: nulls must be a dict {{column: 'error' | 'skip' | fill value}}, not {value!r}"
            )
        out = []
        for column, policy in value.items():
            if column not in spec.columns:
                raise InvalidArgumentError(
                    f"Estimator: nulls names column {column!r}, which fit does not read (its feature and label "
                    f"columns: {', '.join(map(repr, spec.columns))})",
                    column=column,
                )
            if isinstance(policy, bool) or not (policy in ("error", "skip") or isinstance(policy, (int, float))):
                raise InvalidArgumentError(
                    f"Estimator: nulls[{column!r}] must be 'error', 'skip' or a number to fill with, not {policy!r}",
                    column=column,
                )
            if policy != "error":
                out.append((str(column), policy if isinstance(policy, str) else float(policy)))
        return tuple(out)

    def _check_slots(self, session: Any, workers: int, ps: int) -> None:
        from sparkgrad.cluster.spark import spark_session

        needed = workers + ps
        count = spark_session(session).slot_count()
        if count.slots is not None and count.slots < needed:
            nodes = f"{workers} workers" + (f" and {ps} parameter servers" if ps else "")
            raise InsufficientSlotsError(
                f"Estimator with {nodes} needs {needed} task slots (one per node, all at once in a barrier stage: "
                f"each worker reads its own shard of the table) but Spark has {count.slots} ({count.source}): "
                "lower num_workers or add executors",
                needed=needed,
                available=count.slots,
            )

    def _fit(self, dataset: Any) -> Model:
        from sparkgrad import TFCluster
        from sparkgrad.cluster.roles import InputMode
        from sparkgrad.data.source import table_files
        from sparkgrad.nn.saved import model_to_bytes, save_model
        from sparkgrad.spark.training import TableRead, TrainArgs, node_main, optimizer_spec

        started = time.perf_counter()
        nn = self._resolved_model()
        mode, workers, ps = self._settings()
        loss = self._loss_of(nn, "Estimator")
        model_bytes = model_to_bytes(nn)
        metrics = _compiled_metrics(nn, loss, model_bytes)
        spec = self._feature_spec(nn, loss, "Estimator", with_label=True)
        C.check_schema(dataset.schema, spec)
        widths = C.list_widths(dataset.schema, spec)
        model_dir = self.getOrDefault(self.model_dir)
        local_dir = _check_writable(model_dir) if model_dir else None
        every = int(self.getOrDefault(self.checkpoint_every))
        if every and not local_dir:
            raise InvalidArgumentError("Estimator: checkpoint_every needs model_dir (where the checkpoints go)")
        batch = int(self.getOrDefault(self.batch_size))
        epochs = int(self.getOrDefault(self.epochs))
        if batch < 1 or epochs < 1:
            raise InvalidArgumentError(f"Estimator: batch_size and epochs must be >= 1 (got {batch}, {epochs})")
        shuffle = self.getOrDefault(self.shuffle_buffer)
        shuffle = SHUFFLE_BATCHES * batch if shuffle is None else int(shuffle)
        if shuffle < 0:
            raise InvalidArgumentError(f"Estimator: shuffle_buffer must be >= 0 (0: the files' order), not {shuffle}")
        nulls = self._nulls(spec)
        opt = optimizer_spec(self.getOrDefault(self.optimizer))
        seed = int(self.getOrDefault(self.seed))

        session = dataset.sparkSession
        checked = time.perf_counter()
        self._check_slots(session, workers, ps)
        train_df, val_df = self._split(dataset)
        files = table_files(train_df, columns=spec.columns, cache_dir=self.getOrDefault(self.cache_dir))
        listed = time.perf_counter()
        table = TableRead(files.files, nulls, widths, shuffle, seed, workers)
        # the files' footers read here: a column missing from them, an unreadable file or too few rows
        # fails before the cluster starts
        probe = table.dataset(spec, batch, 0)
        if probe.shard_rows() == 0:
            raise InvalidArgumentError(
                f"Estimator: {files.description} has {probe.total_rows} rows; {workers} workers of batch_size "
                f"{batch} need at least {workers * batch} (each reads whole batches of an equal shard)"
            )
        logger.info("Estimator.fit reads %s: %d rows, %d files", files.description, probe.total_rows, len(files.files))
        footers = time.perf_counter()
        args = TrainArgs(
            model_bytes,
            opt,
            _losses.serialize(loss),
            metrics,
            batch,
            epochs,
            mode,
            os.path.join(local_dir, "checkpoints") if local_dir else None,
            every,
            spec,
            table,
        )
        try:
            cluster = TFCluster.run(
                session,
                node_main,
                args,
                num_executors=workers + ps,
                num_ps=ps,
                input_mode=InputMode.TENSORFLOW,
                reservation_timeout=RESERVATION_TIMEOUT,
                keep_results=True,
                output=logger.info,
            )
            cluster.shutdown()
        except NodeFailure as exc:
            err = _node_error(exc)
            if err is exc:
                raise
            raise err from exc
        trained = time.perf_counter()
        import pickle

        results = [pickle.loads(v) for v in cluster.node_results().values() if v is not None]
        results = [r for r in results if isinstance(r, dict)]  # ps nodes return None
        chief = next((r for r in results if isinstance(r, dict) and "model" in r), None)
        if chief is None:
            raise ClusterError("Estimator.fit: the chief worker returned no trained model")
        fitted = Model.from_nn(chief["model"])
        self._copyValues(fitted)
        fitted.history = [
            {k: v for k, v in r.items() if k != "model"} for r in sorted(results, key=lambda r: r.get("rank", 0))
        ]
        if val_df is not None:
            ev = fitted.evaluate(val_df)
            fitted.validation_metrics = {("val_rows" if k == "rows" else f"val_{k}"): v for k, v in ev.items()}
        if local_dir:
            save_model(fitted.nn_model, os.path.join(local_dir, "model.sgmodel"))
        logger.debug(
            "Estimator.fit seconds: %.3f model and schema checks, %.3f slots and table_files, %.3f footers, "
            "%.3f the cluster (formation, training, shutdown), %.3f the fitted Model",
            checked - started,
            listed - checked,
            footers - listed,
            trained - footers,
            time.perf_counter() - trained,
        )
        return fitted

    # ---- persistence -----------------------------------------------------------

    def _save_to(self, spark: Any, path: str, overwrite: bool) -> None:
        from sparkgrad.nn.optimizers import Optimizer
        from sparkgrad.nn.saved import model_to_bytes

        value = self.getOrDefault(self.model)
        if value is not None and not _is_nn_model(value):
            raise InvalidArgumentError(
                "Estimator.save: the model param is a function, which cannot be saved; set model= to a "
                "sparkgrad.nn model (e.g. model=build_model()) to save the Estimator"
            )
        extra: dict = {}
        opt = self.getOrDefault(self.optimizer)
        if isinstance(opt, Optimizer):
            from sparkgrad.spark.training import optimizer_spec

            kind, config = optimizer_spec(opt)
            extra["optimizer"] = {"kind": kind, "config": config}
        meta = persist.metadata_json(self, spark, skip=("model",), extra=extra)
        persist.write_stage(spark, path, meta, None if value is None else model_to_bytes(value), overwrite)

    @classmethod
    def _load_from(cls, spark: Any, path: str) -> Estimator:
        from sparkgrad.nn.saved import model_from_bytes
        from sparkgrad.spark.training import build_optimizer

        meta = persist.read_metadata(spark, path, f"{cls.__module__}.{cls.__name__}")
        out = cls()
        persist.set_params(out, meta)
        if meta.get("optimizer"):
            out._set(optimizer=build_optimizer((meta["optimizer"]["kind"], meta["optimizer"]["config"])))
        try:
            data = persist.read_model_bytes(spark, path)
        except Exception:  # noqa: BLE001 - no model part: the Estimator was saved without a model
            data = b""
        if data:
            out._set(model=model_from_bytes(data, f"{path}/model"))
        return out
