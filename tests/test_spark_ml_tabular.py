"""sparkgrad.spark.Estimator / Model with several input columns mapped to a model's named inputs, on real local
Spark: a string column into a StringLookup, an integer id column into an Embedding, numbers and a Spark ML
vector beside them; persistence, the MLflow pyfunc, and the errors a mapping or a column can make.

The data is drawn with NumPy (a known rule decides the label), written once to a real Parquet file with
pyarrow and read by Spark; the vector column is made by Spark ML's own ``array_to_vector``.
"""

from __future__ import annotations

import numpy as np
import pytest
from spark_ml_tables_data import CITIES, SHOPS
from spark_ml_tables_data import model as _model
from sparkgrad.errors import InvalidArgumentError, SchemaError
from sparkgrad.nn import (
    Adam,
    CategoryEncoding,
    Dense,
    Input,
    Model,
    StringLookup,
)

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

pytestmark = [
    pytest.mark.spark,
    pytest.mark.timeout(300),
    # mapInArrow returns Spark ML vector columns (the probability column, a vector input) from pyspark 3.5 on
    pytest.mark.skipif(
        tuple(int(v) for v in pytest.importorskip("pyspark").__version__.split(".")[:2]) < (3, 5),
        reason="pyspark < 3.5: mapInArrow cannot return vector columns",
    ),
]

ROWS = 3000
COLUMNS = ["city", "shop", "visits", "spend", "hist"]


def _table(n: int, seed: int) -> pa.Table:
    """city string, shop long, visits int, spend double, hist array<double> of 3, label double; id long."""
    rng = np.random.default_rng(seed)
    city = np.array(CITIES + ["köln"])[rng.integers(0, 6, n)]
    shop = rng.integers(0, SHOPS, n)
    visits = rng.integers(0, 10, n).astype(np.int32)
    spend = rng.normal(0.0, 1.0, n)
    hist = rng.normal(0.0, 1.0, (n, 3))
    score = np.isin(city, ["oslo", "lima", "köln"]) * 2.0 + (shop % 3 == 0) * 1.5 + spend + hist[:, 0] - 1.2
    label = (score > 0).astype(np.float64)
    flat = pa.array(hist.reshape(-1))
    return pa.table(
        {
            "id": pa.array(np.arange(n, dtype=np.int64)),
            "city": pa.array(city),
            "shop": pa.array(shop.astype(np.int64)),
            "visits": pa.array(visits),
            "spend": pa.array(spend),
            "hist": pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * 3), flat),
            "label": pa.array(label),
        }
    )


@pytest.fixture(scope="module")
def shops(spark, tmp_path_factory):
    """(train, test) DataFrames read from Parquet, ``hist`` as a Spark ML vector."""
    import pyarrow.parquet as pq
    from pyspark.ml.functions import array_to_vector

    root = tmp_path_factory.mktemp("shops")
    frames = []
    for name, n, seed in (("train", ROWS, 0), ("test", 500, 1)):
        path = root / f"{name}.parquet"
        pq.write_table(_table(n, seed), str(path), row_group_size=700)
        frames.append(spark.read.parquet(str(path)).withColumn("hist", array_to_vector("hist")))
    return frames[0], frames[1].coalesce(2)


def _inputs(df, mapping=None):
    """The DataFrame's rows (by id) as the model's inputs, and the ids; ``mapping``: {column: input}."""
    mapping = mapping or {c: c for c in COLUMNS}
    pdf = df.select("id", *mapping).orderBy("id").toPandas()
    x = {}
    for column, name in mapping.items():
        v = pdf[column]
        if name == "hist":
            x[name] = np.stack([r.toArray() for r in v]).astype(np.float32)
        elif name == "city":
            x[name] = v.to_numpy(object)
        else:
            x[name] = v.to_numpy()
    return x, pdf["id"].to_numpy()


def _scored(df, column="probability"):
    rows = df.select("id", column).orderBy("id").collect()
    return np.array([r[column].toArray()[1] for r in rows])


def test_string_id_number_and_vector_columns_train_score_save_and_log_like_model_predict(shops, tmp_path, mlflow_store):
    import mlflow
    import mlflow.pyfunc
    import sparkgrad.mlflow as sgmlflow
    from sparkgrad.spark import Estimator
    from sparkgrad.spark import Model as SparkModel

    train, test = shops
    untrained = SparkModel.from_nn(_model(), inputCols=COLUMNS).evaluate(test)
    fitted = Estimator(
        model=_model(),
        optimizer=Adam(0.01),
        inputCols=COLUMNS,
        labelCol="label",
        batch_size=64,
        epochs=6,
        num_workers=2,
        mode="allreduce",
    ).fit(train)
    trained = fitted.evaluate(test)
    assert trained["loss"] < untrained["loss"] * 0.3 and trained["accuracy"] > 0.95, (untrained, trained)
    x, ids = _inputs(test)
    want = fitted.nn_model.predict(x)[:, 0]
    scored = fitted.transform(test)
    np.testing.assert_allclose(_scored(scored), want, rtol=1e-5, atol=1e-6)
    assert scored.select("id").orderBy("id").toPandas()["id"].tolist() == ids.tolist()

    fitted.write().overwrite().save(str(tmp_path / "stage"))
    loaded = SparkModel.load(str(tmp_path / "stage"))
    assert loaded.getInputCols() == COLUMNS
    np.testing.assert_array_equal(_scored(loaded.transform(test)), _scored(scored))

    with mlflow.start_run():
        info = sgmlflow.log_model(fitted, name="shops")  # the stage: its trained model and its column mapping
    pyfunc = mlflow.pyfunc.load_model(info.model_uri)
    assert [c.name for c in pyfunc.metadata.get_input_schema().inputs] == COLUMNS
    from pyspark.ml.functions import vector_to_array

    arrays = test.withColumn("hist", vector_to_array("hist"))
    np.testing.assert_allclose(pyfunc.predict(arrays.orderBy("id").toPandas())[:, 0], want, rtol=1e-6)
    udf = mlflow.pyfunc.spark_udf(test.sparkSession, info.model_uri, result_type="array<float>")
    rows = arrays.select("id", udf(*COLUMNS).alias("p")).orderBy("id").collect()  # scored in Spark's tasks
    np.testing.assert_allclose([r.p[0] for r in rows], want, rtol=1e-6)


def test_input_mapping_feeds_inputs_from_columns_of_other_names_in_fit_transform_and_the_saved_stage(shops, tmp_path):
    from pyspark.sql import functions as F
    from sparkgrad.spark import Estimator
    from sparkgrad.spark import Model as SparkModel

    renamed = {"city": "town", "shop": "store", "hist": "history"}
    train, test = (d.select("id", "label", *(F.col(c).alias(renamed.get(c, c)) for c in COLUMNS)) for d in shops)
    mapping = {"town": "city", "store": "shop", "visits": "visits", "spend": "spend", "history": "hist", "label": "y"}
    fitted = Estimator(
        model=_model(seed=1),
        optimizer=Adam(0.01),
        input_mapping=mapping,
        batch_size=64,
        epochs=1,
        num_workers=1,
        num_ps=1,
        mode="ps",
    ).fit(train)
    assert fitted.column_mapping() == {c: n for c, n in mapping.items() if n != "y"}
    x, _ = _inputs(test, {c: n for c, n in mapping.items() if n != "y"})
    np.testing.assert_allclose(_scored(fitted.transform(test)), fitted.nn_model.predict(x)[:, 0], rtol=1e-5, atol=1e-6)
    assert fitted.evaluate(test)["rows"] == 500  # the mapped label
    fitted.write().overwrite().save(str(tmp_path / "mapped"))
    assert SparkModel.load(str(tmp_path / "mapped")).getOrDefault("input_mapping") == mapping


@pytest.mark.parametrize(
    ("change", "params", "message"),
    [
        (
            {"visits": "city"},
            {},
            r"^feature column 'visits' holds strings but input 'visits' \(Input 'visits'\) takes numbers "
            r"\(dtype='float32'\): map the strings with a StringLookup or Hashing",
        ),
        (
            {"city": "spend"},
            {},
            r"^feature column 'city' has type double but input 'city' \(Input 'city'\) takes strings "
            r"\(dtype='string'\)",
        ),
        (
            {},
            {"inputCols": ["city", "shop", "visits", "spend", "hist", "age"]},
            r"^Model.transform: inputCols has 'age', which is not an input of the model \(its inputs: \['city', ",
        ),
        (
            {},
            {"input_mapping": {"city": "city", "shop": "shop", "spend": "spend", "hist": "hist", "v": "visits"}},
            r"^feature column 'v' is not in the DataFrame \(its columns: 'id', 'city', 'shop', 'visits', 'spend', "
            r"'hist', 'label'\)$",
        ),
        (
            {},
            {"inputCols": ["city", "shop", "spend", "hist"]},
            r"^Model.transform: input 'visits' of the model has no column: name a column as the input in inputCols",
        ),
        ({}, {"featuresCol": "hist"}, r"^Model.transform: the model has inputs \['city', 'shop', 'visits', 'spend'"),
    ],
    ids=["string_to_number", "number_to_string", "unknown_column", "missing_column", "input_without_column", "one"],
)
def test_a_column_that_does_not_fit_its_input_is_refused_before_any_job_naming_column_and_input(
    shops, change, params, message
):
    from pyspark.sql import functions as F
    from sparkgrad.spark import Model as SparkModel

    test = shops[1]
    for column, source in change.items():
        test = test.withColumn(column, F.col(source))
    model = SparkModel.from_nn(_model(), **(params or {"inputCols": COLUMNS}))
    with pytest.raises(InvalidArgumentError, match=message):
        model.transform(test)  # refused on the driver: transform is lazy, so no Spark job ran


def test_nulls_and_fractional_ids_name_the_column_partition_and_row(shops):
    from pyspark.sql import functions as F
    from sparkgrad.spark import Estimator
    from sparkgrad.spark import Model as SparkModel

    test = shops[1].coalesce(1)
    model = SparkModel.from_nn(_model(), inputCols=COLUMNS)
    nulls = test.withColumn("city", F.when(F.col("id") == 42, F.lit(None)).otherwise(F.col("city")))
    with pytest.raises(
        InvalidArgumentError,
        match=r"^partition 0: column 'city' has Arrow type string: 1 of its strings are null \(the first in row 42\)",
    ):
        model.evaluate(nulls)
    fractional = test.withColumn("shop", F.when(F.col("id") == 7, F.lit(2.5)).otherwise(F.col("shop")))
    with pytest.raises(
        Exception, match=r"partition 0, row 7: column 'shop' holds 2.5; input 'shop' \(Input 'shop'\) takes int64 ids"
    ):
        model.transform(fractional).collect()
    estimator = Estimator(model=_model(), inputCols=COLUMNS, labelCol="label", num_workers=1, num_ps=1, mode="ps")
    with pytest.raises(SchemaError, match=r"^file '[^']+', row group \d+, row \d+: column 'city' is null \(its null"):
        estimator.fit(nulls)  # the worker's read of the cached rows, raised once the cluster is stopped


def test_a_model_of_one_string_input_trains_from_featuresCol(shops):
    from pyspark.sql import functions as F
    from sparkgrad.spark import Estimator

    city = Input(shape=(1,), dtype="string", name="city")
    lookup = StringLookup(vocabulary=CITIES)
    out = Dense(1, activation="sigmoid")(CategoryEncoding(num_tokens=6, output_mode="one_hot")(lookup(city)))
    model = Model(city, out, seed=2)
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    train, test = (d.withColumn("north", F.col("city").isin("oslo", "köln").cast("double")) for d in shops)
    fitted = Estimator(
        model=model,
        optimizer=Adam(0.05),
        featuresCol="city",
        labelCol="north",
        batch_size=64,
        epochs=2,
        num_workers=1,
        num_ps=1,
        mode="ps",
    ).fit(train)
    assert fitted.evaluate(test)["accuracy"] == 1.0  # every row of every batch trained (köln: the OOV bucket)
