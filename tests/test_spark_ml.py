"""sparkgrad.spark.Estimator / Model on real local Spark: Pipelines, both training modes, persistence, bad input,
binary classifiers and regressions.

The classifier data is Debian's Fashion-MNIST written once to Parquet (pixels
as array<float> in [0, 1], the raw bytes as binary, the label as long) and
read by Spark; the binary and regression data is drawn by Spark itself
(``randn``), so no test builds a DataFrame from Python rows.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from spark_ml_data import mlp, write_parquet
from sparkgrad.data.idx import FASHION_MNIST_DIR, fashion_mnist
from sparkgrad.errors import InsufficientSlotsError, InvalidArgumentError
from sparkgrad.nn import Adam, Dense, Sequential, metrics

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

# mapInArrow returns Spark ML vector columns (Model.transform's probabilityCol, a vector input) from pyspark 3.5 on
vector_output = pytest.mark.skipif(
    tuple(int(v) for v in pytest.importorskip("pyspark").__version__.split(".")[:2]) < (3, 5),
    reason="pyspark < 3.5: mapInArrow cannot return vector columns",
)

TRAIN_ROWS = 10_000
TEST_ROWS = 2_000


@pytest.fixture(scope="module")
def fashion(spark, tmp_path_factory):
    """(train DataFrame of 10k rows, test DataFrame of 2k rows): id, pixels array<float>, raw binary, label long."""
    if not os.path.exists(os.path.join(FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz")):
        pytest.skip(f"Fashion-MNIST not installed in {FASHION_MNIST_DIR}")
    root = tmp_path_factory.mktemp("fashion")
    x, y = fashion_mnist("train")
    xt, yt = fashion_mnist("test")
    write_parquet(str(root / "train"), x[:TRAIN_ROWS], y[:TRAIN_ROWS], 4)
    write_parquet(str(root / "test"), xt[:TEST_ROWS], yt[:TEST_ROWS], 2)
    return spark.read.parquet(str(root / "train")), spark.read.parquet(str(root / "test"))


def _vectors(df):
    from pyspark.ml.functions import array_to_vector

    return df.withColumn("vec", array_to_vector("pixels"))


def _by_id(df, *cols):
    rows = df.select("id", *cols).orderBy("id").collect()
    return [tuple(r[c] for c in cols) for r in rows]


@vector_output
def test_pipeline_of_assembler_scaler_and_estimator_fits_saves_loads_and_predicts_the_same(fashion, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import StandardScaler, VectorAssembler
    from sparkgrad.spark import Estimator, Model

    train, test = (_vectors(d) for d in fashion)
    estimator = Estimator(
        model=mlp(),
        optimizer=Adam(0.002),
        featuresCol="scaled",
        labelCol="label",
        batch_size=64,
        epochs=1,
        num_workers=2,
        mode="allreduce",
        validation=0.1,
        seed=7,
        model_dir=str(tmp_path / "model_dir"),
        checkpoint_every=50,
    )
    pipeline = Pipeline(
        stages=[
            # a vector of many zeros leaves VectorAssembler sparse: fed densified
            VectorAssembler(inputCols=["vec"], outputCol="assembled"),
            StandardScaler(inputCol="assembled", outputCol="scaled"),
            estimator,
        ]
    )
    fitted = pipeline.fit(train)
    stage = fitted.stages[-1]
    assert isinstance(stage, Model)
    assert [h["rank"] for h in stage.history] == [0, 1]
    assert stage.history[0]["steps"] == stage.history[1]["steps"] > 0  # allreduce: the workers stepped together
    assert 0.6 < stage.validation_metrics["val_accuracy"] <= 1 and stage.validation_metrics["val_rows"] > 500
    scored = fitted.transform(test)
    assert {"prediction", "probability"} <= set(scored.columns)
    before = _by_id(scored, "prediction", "probability")
    accuracy = np.mean([p == label for (p, _), (label,) in zip(before, _by_id(test, "label"), strict=True)])
    assert accuracy > 0.75, accuracy
    evaluated = stage.evaluate(fitted.stages[1].transform(fitted.stages[0].transform(test)))
    assert evaluated["rows"] == TEST_ROWS and abs(evaluated["accuracy"] - accuracy) < 1e-9

    assert os.path.exists(tmp_path / "model_dir" / "model.sgmodel")
    assert any(n.startswith("ckpt-") for n in os.listdir(tmp_path / "model_dir" / "checkpoints"))

    fitted.write().overwrite().save(str(tmp_path / "pipeline_model"))
    loaded = PipelineModel.load(str(tmp_path / "pipeline_model"))
    assert isinstance(loaded.stages[-1], Model) and loaded.stages[-1].validation_metrics == stage.validation_metrics
    after = _by_id(loaded.transform(test), "prediction", "probability")
    assert [p for p, _ in after] == [p for p, _ in before]
    np.testing.assert_array_equal([v.toArray() for _, v in after], [v.toArray() for _, v in before])

    pipeline.save(str(tmp_path / "pipeline"))  # the unfitted Pipeline, its Estimator's model as a saved model
    again = Pipeline.load(str(tmp_path / "pipeline")).getStages()[-1]
    assert (
        isinstance(again, Estimator) and again.getOrDefault("epochs") == 1 and again.getOrDefault("mode") == "allreduce"
    )
    np.testing.assert_array_equal(again.getOrDefault("model").params, mlp().params)
    assert again.getOrDefault("optimizer").config == Adam(0.002).config


def test_ps_mode_trains_from_a_binary_column_through_input_mapping(fashion, tmp_path):
    from sparkgrad.spark import Estimator, Model

    train = fashion[0].filter("id < 3000")
    estimator = Estimator(
        model=lambda: mlp(seed=5, scale=1 / 255),  # the uint8 pixels scaled in C
        optimizer="adam",
        input_mapping={"raw": "x", "label": "y"},
        batch_size=50,
        epochs=2,
        num_workers=2,
        num_ps=1,
        mode="ps",
    )
    model = estimator.fit(train)
    assert sum(h["rows"] for h in model.history) == 2 * 3000
    scored = model.evaluate(fashion[1])
    assert scored["rows"] == TEST_ROWS and scored["accuracy"] > 0.6, scored
    model.save(str(tmp_path / "m"))
    loaded = Model.load(str(tmp_path / "m"))
    assert loaded.getOrDefault("input_mapping") == {"raw": "x", "label": "y"}
    assert loaded.model_bytes == model.model_bytes
    with pytest.raises(InvalidArgumentError, match="the model param is a function, which cannot be saved"):
        estimator.save(str(tmp_path / "e"))


@vector_output
def test_model_scores_array_vector_and_binary_columns_as_the_model_predicts(fashion):
    from sparkgrad.spark import Model

    test = _vectors(fashion[1])
    nn = mlp(seed=11)
    nn.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x, y = fashion_mnist("test")
    x = x[:TEST_ROWS].reshape(-1, 784)
    expected = nn.predict((x / 255).astype(np.float32))
    raw_nn = mlp(seed=11, scale=1 / 255)
    for col, model in (("pixels", nn), ("vec", nn), ("raw", raw_nn)):
        m = Model.from_nn(model, featuresCol=col, outputCol="out")
        rows = _by_id(m.transform(test), "prediction", "probability", "out")
        np.testing.assert_allclose([r[2] for r in rows], expected, rtol=1e-5, atol=1e-6, err_msg=col)
        np.testing.assert_allclose([r[1].toArray() for r in rows], expected, rtol=1e-5, atol=1e-6)
        assert [r[0] for r in rows] == expected.argmax(axis=1).astype(float).tolist()
    loss, accuracy = nn.evaluate((x / 255).astype(np.float32), y[:TEST_ROWS])
    got = Model.from_nn(nn, featuresCol="pixels").evaluate(test)
    assert got["rows"] == TEST_ROWS and abs(got["accuracy"] - accuracy) < 1e-9 and abs(got["loss"] - loss) < 1e-4


def _bad_fit(train, **params):
    from sparkgrad.spark import Estimator

    return Estimator(model=mlp(), **{"featuresCol": "pixels", "num_workers": 2, **params}).fit(train)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"featuresCol": "pixel"},
            r"^feature column 'pixel' is not in the DataFrame \(its columns: 'id', 'pixels', 'raw', 'label', 'vec', "
            r"'name', 'short'\)$",
        ),
        (
            {"featuresCol": "name"},
            r"^feature column 'name' holds strings but the model \(Input '\w+'\) takes numbers \(dtype='float32'\): "
            r"map the strings with a StringLookup or Hashing layer on an Input\(dtype='string'\)",
        ),
        (
            {"featuresCol": "short"},
            r"^feature column 'short' holds vectors of 783 values \(its schema says\); the model takes 784 values "
            r"per row \(input_shape \(784,\)\)$",
        ),
        (
            {"labelCol": "name"},
            r"^label column 'name' has type string: sparse_categorical_crossentropy takes class indices, integers "
            r"\(or integral doubles, as StringIndexer writes\) in \[0, 10\); index string labels first "
            r"\(StringIndexer\)$",
        ),
        (
            {"input_mapping": {"pixels": "x", "lbl": "y"}},
            r"^label column 'lbl' is not in the DataFrame",
        ),
        ({"mode": "allreduce", "num_ps": 1}, r"^Estimator: mode 'allreduce' has no parameter servers \(num_ps=1\)"),
        ({"validation": 1.5}, r"^validation must be a fraction in \(0, 1\) or a column name, not 1.5$"),
        (
            {"validation": "name"},
            r"^validation column 'name' has type string: a boolean column marking the validation rows is needed$",
        ),
    ],
    ids=[
        "missing_column",
        "string_features",
        "vector_size",
        "string_label",
        "mapped_label",
        "mode",
        "validation",
        "validation_column",
    ],
)
def test_bad_input_that_the_schema_shows_fails_fit_before_training(fashion, params, message):
    from pyspark.ml.feature import VectorAssembler
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    train = _vectors(fashion[0].limit(100)).withColumn("name", F.lit("x"))
    # VectorAssembler records the size of its output in the column's ML attributes
    short = array_to_vector(F.slice("pixels", 1, 783))
    train = VectorAssembler(inputCols=["s"], outputCol="short").transform(train.withColumn("s", short)).drop("s")
    started = time.monotonic()
    with pytest.raises(InvalidArgumentError, match=message):
        _bad_fit(train, **params)
    assert time.monotonic() - started < 15  # no cluster was started


def test_a_model_dir_that_cannot_be_written_fails_fit_before_training(fashion, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(InvalidArgumentError, match=r"model_dir '.*a_file/sub' cannot be written \(.*\): fit needs it"):
        _bad_fit(fashion[0].limit(10), model_dir=str(blocker / "sub"))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"num_workers": 5}, r"^Estimator with 5 workers needs 5 task slots \(one per node, .* Spark has 4 "),
        (
            {"num_workers": 4, "num_ps": 1, "mode": "ps"},
            r"^Estimator with 4 workers and 1 parameter servers needs 5 task slots .* Spark has 4 ",
        ),
    ],
    ids=["allreduce", "ps"],
)
def test_more_nodes_than_task_slots_fails_before_any_job(fashion, params, message):
    with pytest.raises(InsufficientSlotsError, match=message):
        _bad_fit(fashion[0].limit(10), **params)


def test_as_many_workers_as_slots_train_one_task_each(fashion):
    model = _bad_fit(fashion[0].filter("id < 512"), num_workers=4, batch_size=32)  # local[4]: 4 slots, no more
    assert [h["rank"] for h in model.history] == [0, 1, 2, 3] and {h["rows"] for h in model.history} == {128}


def test_a_label_out_of_range_fails_fit_naming_worker_and_value_and_stops_the_cluster(fashion):
    from pyspark.sql import functions as F

    train = fashion[0].filter("id < 400").withColumn("label", F.when(F.col("id") == 123, 10).otherwise(F.col("label")))
    started = time.monotonic()
    with pytest.raises(
        InvalidArgumentError,
        match=r"^worker \d, epoch 0, rows from \d+ of its shard: row \d+: label column 'label' holds 10; "
        r"sparse_categorical_crossentropy takes integer class indices in \[0, 10\) \(the model has 10 outputs\)$",
    ):
        _bad_fit(train, epochs=1, batch_size=50)  # equal shards of whole batches: no row left out
    assert time.monotonic() - started < 90


@vector_output
def test_nulls_and_wrong_widths_in_feature_columns_are_refused_naming_column_partition_and_row(fashion):
    from pyspark.sql import functions as F
    from sparkgrad.spark import Model

    test = fashion[1].filter("id < 300").coalesce(1)
    nulls = test.withColumn("pixels", F.when(F.col("id") == 42, F.lit(None)).otherwise(F.col("pixels")))
    model = Model.from_nn(mlp(), featuresCol="pixels")
    null_message = (
        r"^partition 0: column 'pixels' has Arrow type list<element: float>: 1 of its values are null "
        r"\(the first in row 42\); only numbers"
    )
    with pytest.raises(InvalidArgumentError, match=null_message):  # evaluate raises the task's error as itself
        model.evaluate(nulls)
    short = test.withColumn("pixels", F.when(F.col("id") == 7, F.slice("pixels", 1, 700)).otherwise(F.col("pixels")))
    with pytest.raises(
        Exception,
        match=r"InvalidArgumentError: partition 0: column 'pixels' has Arrow type "
        r"list<element: float>: lists differ in length \(row 0: 784, row 7: 700\)",
    ):
        model.transform(short).collect()  # a lazy transform fails in Spark's action, with the task's error inside


def test_cluster_input_mapping_feeds_the_mapped_columns_sorted_or_names_a_missing_one(fashion):
    from sparkgrad.cluster.driver import _select_mapped

    assert _select_mapped("train", fashion[1], {"raw": "x", "label": "y"}, None).columns == ["label", "raw"]
    with pytest.raises(
        InvalidArgumentError,
        match=r"^cluster.inference: input_mapping names column\(s\) 'image' that the DataFrame does not have "
        r"\(it has 'id', 'pixels', 'raw', 'label'\)$",
    ):
        _select_mapped("inference", fashion[1], {"image": "x"}, None)


# ---- binary classifiers and regressions -------------------------------------------------------------------


def _table(spark, n, seed, partitions=2):
    """n rows drawn by Spark: id, x array<double> of 4, label double (0/1, by x[0] + x[1]), target double
    (a linear function of x), targets array<double> of 2."""
    xs = ", ".join(f"randn({seed + i})" for i in range(4))
    return (
        spark.range(n, numPartitions=partitions)
        .selectExpr("id", f"array({xs}) AS x")
        .selectExpr(
            "*",
            "CAST(x[0] + x[1] > 0 AS DOUBLE) AS label",
            "2 * x[0] - x[1] + 0.5 * x[2] + 0.5 AS target",
            "array(x[0] - x[3], x[1] + x[2]) AS targets",
        )
    )


@pytest.fixture(scope="module")
def tabular(spark):
    """(train DataFrame of 2000 rows, held-out DataFrame of 1000 rows), cached: see `_table`."""
    return _table(spark, 2000, 1).cache(), _table(spark, 1000, 11).cache()


def _arrays(df, *cols):
    """The columns of df, ordered by id, as float64 arrays."""
    rows = df.select("id", *cols).orderBy("id").collect()
    return [np.array([np.asarray(r[c], np.float64) for r in rows]) for c in cols]


def _binary_nn(seed=1):
    nn = Sequential([Dense(16, activation="relu", input_shape=(4,)), Dense(1, activation="sigmoid")], seed=seed)
    nn.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy", metrics.AUC(name="auc")])
    return nn


def _regression_nn(outputs=1, seed=2):
    return Sequential([Dense(16, activation="relu", input_shape=(4,)), Dense(outputs)], seed=seed)


@vector_output
def test_binary_classifier_estimator_reaches_a_good_auc_and_writes_spark_ml_binary_columns(tabular):
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T
    from sparkgrad.spark import Estimator

    train, test = tabular
    estimator = Estimator(
        model=_binary_nn(),  # compiled with binary_crossentropy, accuracy and AUC: the Estimator's loss and metrics
        optimizer=Adam(0.01),
        featuresCol="x",
        labelCol="label",  # a double column of 0.0 / 1.0
        batch_size=32,
        epochs=3,
        num_workers=2,
        validation=0.1,
        seed=3,
    )
    fitted = estimator.fit(train)
    assert set(fitted.validation_metrics) == {"val_loss", "val_accuracy", "val_auc", "val_rows"}
    assert fitted.validation_metrics["val_auc"] > 0.95, fitted.validation_metrics
    assert {"loss", "accuracy", "auc"} <= set(fitted.history[0]["logs"])

    held_out = fitted.evaluate(test)
    assert set(held_out) == {"loss", "accuracy", "auc", "rows"} and held_out["rows"] == 1000
    assert held_out["auc"] > 0.98 and held_out["accuracy"] > 0.9, held_out

    scored = fitted.transform(test)
    types = {f.name: f.dataType for f in scored.schema.fields}
    assert isinstance(types["rawPrediction"], VectorUDT) and isinstance(types["probability"], VectorUDT)
    assert types["prediction"] == T.DoubleType()
    x, raw, prob, pred = _arrays(scored, "x", "rawPrediction", "probability", "prediction")
    p = fitted.nn_model.predict(x.astype(np.float32))[:, 0].astype(np.float64)
    np.testing.assert_allclose(prob, np.stack([1 - p, p], axis=1), rtol=0, atol=1e-7)  # [1 - p, p], as Spark ML
    clipped = np.clip(p, 1e-7, 1 - 1e-7)
    np.testing.assert_allclose(raw, np.stack([-1, 1], axis=0) * np.log(clipped / (1 - clipped))[:, None], atol=1e-6)
    assert pred.tolist() == (p > 0.5).astype(float).tolist()
    # Spark ML's own evaluator reads the rawPrediction column; its exact AUC is close to the thresholded one
    spark_auc = BinaryClassificationEvaluator(labelCol="label").evaluate(scored)
    assert abs(spark_auc - held_out["auc"]) < 0.01, (spark_auc, held_out["auc"])

    stricter = fitted.copy({fitted.threshold: 0.9}).transform(test)
    (pred_09,) = _arrays(stricter, "prediction")
    assert pred_09.tolist() == (p > 0.9).astype(float).tolist()


def test_auc_over_several_partitions_is_the_auc_of_all_rows_at_once(tabular):
    from sparkgrad.spark import Model

    train, test = tabular
    nn = _binary_nn(seed=4)
    x, y = _arrays(train, "x", "label")
    nn.fit(x.astype(np.float32), y, batch_size=64, epochs=2, verbose=0)
    xt, yt = _arrays(test, "x", "label")
    want = nn.evaluate(xt.astype(np.float32), yt, return_dict=True)
    got = Model.from_nn(nn, featuresCol="x").evaluate(test.repartition(3))
    assert got["rows"] == 1000
    assert got["auc"] == pytest.approx(want["auc"], abs=1e-9) and got["accuracy"] == pytest.approx(want["accuracy"])
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)


def test_regression_estimator_predicts_a_double_matching_nn_predict_with_a_small_mse(tabular):
    from pyspark.sql import types as T
    from sparkgrad.spark import Estimator

    train, test = tabular
    nn = _regression_nn()
    nn.compile(optimizer="adam", loss="mse", metrics=["mae"])
    fitted = Estimator(
        model=nn,
        optimizer=Adam(0.02),
        loss="mse",
        featuresCol="x",
        labelCol="target",
        batch_size=32,
        epochs=4,
        num_workers=2,
    ).fit(train)
    held_out = fitted.evaluate(test)
    assert set(held_out) == {"loss", "mae", "rows"}
    assert held_out["loss"] < 0.05 and held_out["mae"] < 0.2, held_out  # the targets' variance is 5.25

    scored = fitted.transform(test)
    assert {"probability", "rawPrediction"}.isdisjoint(scored.columns)  # a regression has neither
    assert scored.schema["prediction"].dataType == T.DoubleType()
    x, pred = _arrays(scored, "x", "prediction")
    np.testing.assert_allclose(pred, fitted.nn_model.predict(x.astype(np.float32))[:, 0], rtol=1e-6)


def test_a_functional_residual_regression_trains_and_scores_as_a_sequential_does(tabular):
    from sparkgrad.errors import InvalidArgumentError
    from sparkgrad.nn import Add, Input
    from sparkgrad.nn import Model as NnModel
    from sparkgrad.spark import Estimator, Model

    train, test = tabular
    inp = Input(shape=(4,))
    h = Dense(16, activation="relu")(inp)
    h = Add()([h, Dense(16, activation="relu")(h)])
    nn = NnModel(inp, Dense(1)(h), seed=2)
    nn.compile(optimizer="adam", loss="mse", metrics=["mae"])
    fitted = Estimator(
        model=nn, optimizer=Adam(0.02), featuresCol="x", labelCol="target", batch_size=32, epochs=4, num_workers=2
    ).fit(train)
    held_out = fitted.evaluate(test)
    assert held_out["loss"] < 0.05, held_out
    x, pred = _arrays(fitted.transform(test), "x", "prediction")
    np.testing.assert_allclose(pred, fitted.nn_model.predict(x.astype(np.float32))[:, 0], rtol=1e-6)
    assert isinstance(fitted.nn_model, NnModel) and not fitted.nn_model.is_chain
    # two inputs do not map to one features column: refused before any job, naming them (inputCols or
    # input_mapping map columns to them: test_spark_ml_tabular.py); two outputs do not map to one label
    a, b = Input(shape=(2,), name="a"), Input(shape=(2,), name="b")
    two = NnModel([a, b], Dense(1)(Add()([a, b])))
    with pytest.raises(InvalidArgumentError, match=r"^Estimator: the model has inputs \['a', 'b'\]: set inputCols"):
        Estimator(model=two, loss="mse", featuresCol="x", labelCol="target", num_workers=2).fit(train)
    forked = NnModel(a, [Dense(1)(a), Dense(1)(a)])
    with pytest.raises(
        InvalidArgumentError, match=r"^Model.from_nn: the model has outputs \['dense(_\d+)?', 'dense_\d+'\]"
    ):
        Model.from_nn(forked, featuresCol="x")


def test_a_multi_output_regression_predicts_an_array_of_doubles_and_evaluates_its_metrics(tabular):
    from pyspark.sql import types as T
    from sparkgrad.spark import Model

    test = tabular[1]
    nn = _regression_nn(outputs=2)
    nn.compile(optimizer="sgd", loss="mae", metrics=["mse"])
    model = Model.from_nn(nn, featuresCol="x", labelCol="targets")
    scored = model.transform(test)
    assert scored.schema["prediction"].dataType == T.ArrayType(T.DoubleType())
    x, y, pred = _arrays(scored, "x", "targets", "prediction")
    np.testing.assert_allclose(pred, nn.predict(x.astype(np.float32)), rtol=1e-6)
    want = nn.evaluate(x.astype(np.float32), y, return_dict=True)
    got = model.evaluate(test)
    assert set(got) == {"loss", "mse", "rows"}
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5) and got["mse"] == pytest.approx(want["mse"], rel=1e-5)


def test_a_binary_label_outside_0_1_fails_fit_naming_the_worker_column_and_value(tabular):
    from pyspark.sql import functions as F
    from sparkgrad.spark import Estimator

    train = tabular[0].filter("id < 400").withColumn("label", F.when(F.col("id") == 123, 2.0).otherwise(F.col("label")))
    with pytest.raises(
        InvalidArgumentError,
        match=r"^worker \d, epoch 0, rows from \d+ of its shard: row \d+: label column 'label' holds 2.0; "
        r"binary_crossentropy takes values in \[0, 1\]$",
    ):
        Estimator(model=_binary_nn(), featuresCol="x", labelCol="label", num_workers=2, batch_size=50).fit(train)


@pytest.mark.parametrize(
    ("model", "params", "message"),
    [
        (
            "binary",
            {"labelCol": "name"},
            r"^label column 'name' has type string: binary_crossentropy takes numbers \(or booleans\) in \[0, 1\], "
            r"one per row \(the model has one output\)$",
        ),
        (
            "regression",
            {"labelCol": "name", "loss": "huber"},
            r"^label column 'name' has type string: huber takes numbers, one per row \(the model has one output\)$",
        ),
        (
            "regression2",
            {"labelCol": "target", "loss": "mae"},
            r"^label column 'target' has type double: mean_absolute_error takes arrays or vectors of 2 numbers, "
            r"one per row \(the model has 2 outputs\)$",
        ),
        ("regression", {"labelCol": "target", "loss": "msle"}, r"^Estimator: loss must be one of .*not 'msle'$"),
        (
            "binary",
            {"loss": "sparse_categorical_crossentropy"},
            r"^Estimator: loss 'sparse_categorical_crossentropy' does not fit the model: ",
        ),
    ],
    ids=["binary_string_label", "regression_string_label", "regression_width", "unknown_loss", "loss_vs_head"],
)
def test_labels_and_losses_that_do_not_fit_the_model_fail_fit_before_any_job(tabular, model, params, message):
    from pyspark.sql import functions as F
    from sparkgrad.spark import Estimator

    nn = {"binary": _binary_nn, "regression": _regression_nn, "regression2": lambda: _regression_nn(outputs=2)}[model]
    train = tabular[0].withColumn("name", F.lit("x"))
    started = time.monotonic()
    with pytest.raises(InvalidArgumentError, match=message):
        Estimator(model=nn(), **{"featuresCol": "x", "num_workers": 2, **params}).fit(train)
    assert time.monotonic() - started < 15  # no cluster was started
