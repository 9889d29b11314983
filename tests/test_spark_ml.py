"""sparkgrad.spark.Estimator / Model on real local Spark: Pipelines, both training modes, persistence, bad input.

The data is Debian's Fashion-MNIST written once to Parquet (pixels as
array<float> in [0, 1], the raw bytes as binary, the label as long) and read
by Spark, so no test builds a DataFrame from Python rows.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from spark_ml_data import mlp, write_parquet
from sparkgrad.data.idx import FASHION_MNIST_DIR, fashion_mnist
from sparkgrad.errors import InsufficientSlotsError, InvalidArgumentError
from sparkgrad.nn import Adam

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

pytestmark = [
    pytest.mark.spark,
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not os.path.exists(os.path.join(FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz")),
        reason=f"Fashion-MNIST not installed in {FASHION_MNIST_DIR}",
    ),
]

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
            r"^feature column 'name' has type string: features must be Spark ML vectors, arrays of numbers, binary "
            r"values of one length per row \(e.g. raw pixels\) or numbers$",
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


def test_allreduce_with_too_few_slots_for_its_feeding_tasks_fails_before_training(fashion):
    with pytest.raises(InsufficientSlotsError, match=r"with 3 workers needs 6 task slots .* Spark has 4"):
        _bad_fit(fashion[0].limit(10), num_workers=3)


def test_a_label_out_of_range_fails_fit_during_feeding_naming_partition_and_row_and_stops_the_cluster(fashion):
    from pyspark.sql import functions as F

    train = fashion[0].filter("id < 400").withColumn("label", F.when(F.col("id") == 123, 10).otherwise(F.col("label")))
    started = time.monotonic()
    with pytest.raises(
        InvalidArgumentError,
        match=r"^partition \d+, row \d+: label column 'label' holds 10; sparse_categorical_crossentropy takes "
        r"integer class indices in \[0, 10\) \(the model has 10 outputs\)$",
    ):
        _bad_fit(train, epochs=1)
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
