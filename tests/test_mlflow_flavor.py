"""sparkgrad.mlflow: the model flavor and its pyfunc, against a local file-store tracking URI of each test's own.

Logged, loaded back (as a sparkgrad.nn model and as an MLflow pyfunc) and scored through
``mlflow.pyfunc.spark_udf`` on the real local Spark, every prediction compared with the model's own
predict. The py310-spark34 matrix leg runs these under an MLflow 2 client (``artifact_path``), the main
leg under MLflow 3 (``name``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import sparkgrad.mlflow as sgmlflow
from sparkgrad.errors import InvalidArgumentError, ModelError
from sparkgrad.nn import Conv2D, Dense, Flatten, Sequential
from sparkgrad.nn.saved import load_model as load_sgmodel

mlflow = pytest.importorskip("mlflow", reason="mlflow-skinny not installed (the test extra has it)")
pd = pytest.importorskip("pandas")
import mlflow.pyfunc  # noqa: E402, F811  (the pyfunc submodule, for MLflow 2 too)
from mlflow.models import Model  # noqa: E402

pytestmark = pytest.mark.timeout(180)

FEATURES, CLASSES = 16, 4


def _mlp():
    m = Sequential(
        [Dense(12, activation="relu", input_shape=(FEATURES,)), Dense(CLASSES, activation="softmax")], seed=4
    )
    m.compile(loss="sparse_categorical_crossentropy")
    m.set_input_transform(0.5, mean=np.linspace(-1, 1, FEATURES), std=np.full(FEATURES, 2.0))
    return m


def _cnn():
    layers = [
        Conv2D(3, (3, 3), activation="relu", input_shape=(6, 6, 1)),
        Flatten(),
        Dense(CLASSES, activation="softmax"),
    ]
    return Sequential(layers, seed=2)


def _binary():
    m = Sequential([Dense(12, activation="relu", input_shape=(FEATURES,)), Dense(1, activation="sigmoid")], seed=5)
    m.compile(loss="binary_crossentropy", metrics=["accuracy", "auc"])
    return m


def _regression(outputs=1):
    m = Sequential([Dense(12, activation="relu", input_shape=(FEATURES,)), Dense(outputs)], seed=6)
    m.compile(loss="mse", metrics=["mae"])
    return m


def _x(n, width=FEATURES, seed=0):
    return np.random.default_rng(seed).normal(size=(n, width)).astype(np.float32)


def _log(model, **kw):
    with mlflow.start_run():
        return sgmlflow.log_model(model, name="model", **kw)


def test_log_model_then_load_model_gives_the_same_model(mlflow_store):
    model, x = _mlp(), _x(40)
    info = _log(model, input_example=x[:2])
    loaded = sgmlflow.load_model(info.model_uri)
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))
    np.testing.assert_array_equal(loaded.params, model.params)
    assert loaded.loss == model.loss
    assert loaded.evaluate(x, np.arange(40) % CLASSES) == model.evaluate(x, np.arange(40) % CLASSES)


def test_a_functional_model_logs_loads_and_predicts_through_pyfunc(mlflow_store):
    from sparkgrad.nn import Add, Input
    from sparkgrad.nn import Model as NnModel

    inp = Input(shape=(FEATURES,))
    h = Dense(8, activation="relu")(inp)
    model = NnModel(inp, Dense(CLASSES, activation="softmax")(Add()([h, Dense(8, activation="relu")(h)])), seed=4)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    x = _x(20)
    info = _log(model)
    np.testing.assert_array_equal(sgmlflow.load_model(info.model_uri).predict(x), model.predict(x))
    np.testing.assert_allclose(mlflow.pyfunc.load_model(info.model_uri).predict(x), model.predict(x), rtol=1e-6)
    a, b = Input(shape=(2,), name="a"), Input(shape=(2,), name="b")
    with pytest.raises(
        InvalidArgumentError, match=r"^sparkgrad.mlflow saves models of one output; this one has outputs \['dense"
    ):
        _log(NnModel([a, b], [Dense(1)(a), Dense(1)(b)]))


def test_a_model_of_several_inputs_takes_a_dataframe_column_per_input_named_or_mapped(mlflow_store):
    from sparkgrad.nn import CategoryEncoding, Concatenate, Hashing, Input
    from sparkgrad.nn import Model as NnModel

    word, ids, value = Input((1,), dtype="string", name="word"), Input((1,), dtype="int64", name="ids"), Input((2,))
    hashed = CategoryEncoding(num_tokens=8, output_mode="one_hot")(Hashing(num_bins=8)(word))
    model = NnModel([word, ids, value], Dense(1)(Concatenate()([hashed, ids, value])), seed=1)
    model.compile(loss="mse")
    frame = pd.DataFrame(
        {"w": ["a", "bb", "köln"], "i": np.array([1, 5, 7]), "v": [np.array([0.5, 1.0]), [2.0, -1.0], [0.0, 3.0]]}
    )
    x = {"word": frame["w"].to_numpy(object), "ids": frame["i"].to_numpy(), value.name: np.stack(frame["v"])}
    mapping = {"w": "word", "i": "ids", "v": value.name}
    with mlflow.start_run():
        info = sgmlflow.log_model(model, name="mapped", input_mapping=mapping)
    pyfunc = mlflow.pyfunc.load_model(info.model_uri)
    from mlflow.types.schema import Array, DataType

    assert [(c.name, c.type) for c in pyfunc.metadata.get_input_schema().inputs] == [
        ("w", DataType.string),
        ("i", DataType.long),
        ("v", Array(DataType.double)),
    ]
    np.testing.assert_allclose(pyfunc.predict(frame), model.predict(x), rtol=1e-6)
    with pytest.raises(InvalidArgumentError, match=r"input_mapping .* must map columns to the model's inputs.*'ids'"):
        _log(model, input_mapping={"w": "word", "v": value.name})


def test_saved_model_carries_the_inferred_tensor_signature_and_the_sgmodel_file(mlflow_store, tmp_path):
    model = _cnn()
    path = tmp_path / "saved"
    sgmlflow.save_model(model, path)
    meta = Model.load(str(path / "MLmodel"))
    spec = meta.signature.inputs.inputs[0]
    assert (spec.type, spec.shape) == (np.dtype(np.float32), (-1, 6, 6, 1))
    out = meta.signature.outputs.inputs[0]
    assert (out.type, out.shape) == (np.dtype(np.float32), (-1, CLASSES))
    assert meta.flavors["python_function"]["loader_module"] == "sparkgrad.mlflow"
    assert meta.flavors["sparkgrad"]["model_file"] == "data/model.sgmodel"
    x = _x(5, 36).reshape(5, 6, 6, 1)
    np.testing.assert_array_equal(load_sgmodel(path / "data" / "model.sgmodel").predict(x), model.predict(x))
    assert "sparkgrad==" in (path / "requirements.txt").read_text()


def test_pyfunc_predicts_an_ndarray_and_a_dataframe_of_one_array_column(mlflow_store):
    model, x = _mlp(), _x(30)
    pyfunc = mlflow.pyfunc.load_model(_log(model).model_uri)
    want = model.predict(x)
    np.testing.assert_array_equal(pyfunc.predict(x), want)
    np.testing.assert_array_equal(np.asarray(pyfunc.predict(pd.DataFrame({"features": list(x)}))), want)
    lists = pd.DataFrame({"features": [row.tolist() for row in x]})
    np.testing.assert_allclose(np.asarray(pyfunc.predict(lists)), want, rtol=1e-6)


def test_pyfunc_reshapes_flat_rows_to_a_conv_models_input_shape(mlflow_store):
    model, x = _cnn(), _x(12, 36)
    pyfunc = mlflow.pyfunc.load_model(_log(model).model_uri)
    got = pyfunc.predict(pd.DataFrame({"pixels": list(x)}))
    np.testing.assert_array_equal(np.asarray(got), model.predict(x.reshape(12, 6, 6, 1)))


def test_pyfunc_prediction_output_is_the_argmax(mlflow_store):
    model, x = _mlp(), _x(25)
    pyfunc = mlflow.pyfunc.load_model(_log(model, pyfunc_output="prediction").model_uri)
    got = pyfunc.predict(x)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, model.predict(x).argmax(1).astype(np.float64))


@pytest.mark.spark
def test_spark_udf_scores_like_model_predict_and_model_transform(mlflow_store, spark):
    from pyspark.sql import functions as F

    model, x = _mlp(), _x(60)
    with mlflow.start_run():
        probs = sgmlflow.log_model(model, name="probs")
        preds = sgmlflow.log_model(model, name="preds", pyfunc_output="prediction")
    rows = [(i, x[i].tolist()) for i in range(len(x))]
    df = spark.createDataFrame(rows, "id long, features array<float>").coalesce(2)  # 2 Python workers import mlflow
    prob_udf = mlflow.pyfunc.spark_udf(spark, probs.model_uri, result_type="array<float>")
    pred_udf = mlflow.pyfunc.spark_udf(spark, preds.model_uri, result_type="double")
    out = df.select("id", prob_udf(F.col("features")).alias("p"), pred_udf(F.col("features")).alias("c"))
    got = sorted(out.collect(), key=lambda r: r.id)
    want = model.predict(x)
    np.testing.assert_allclose(np.array([r.p for r in got]), want, rtol=1e-6)
    assert [r.c for r in got] == want.argmax(1).astype(float).tolist()
    import pyspark

    if tuple(int(v) for v in pyspark.__version__.split(".")[:2]) < (3, 5):
        return  # Model.transform's vector column needs mapInArrow of pyspark >= 3.5 (test_spark_ml.py)
    from sparkgrad.spark import Model as SparkModel  # and as sparkgrad.spark.Model.transform scores

    scored = sorted(SparkModel.from_nn(model, featuresCol="features").transform(df).collect(), key=lambda r: r.id)
    np.testing.assert_array_equal(np.array([r.probability.toArray() for r in scored], np.float32), [r.p for r in got])
    assert [r.prediction for r in scored] == [r.c for r in got]


def test_a_binary_models_pyfunc_gives_its_probability_or_a_0_1_prediction(mlflow_store, tmp_path):
    model, x = _binary(), _x(60)
    sgmlflow.save_model(model, tmp_path / "probs")
    sgmlflow.save_model(model, tmp_path / "preds", pyfunc_output="prediction")
    out = Model.load(str(tmp_path / "probs" / "MLmodel")).signature.outputs.inputs[0]
    assert (out.type, out.shape) == (np.dtype(np.float32), (-1, 1))  # the model's output width
    assert Model.load(str(tmp_path / "preds" / "MLmodel")).signature.outputs.input_types() == [
        mlflow.types.DataType.double
    ]
    p = model.predict(x)
    assert ((p > 0) & (p < 1)).all() and 0 < (p > 0.5).sum() < len(x)  # sigmoid probabilities, both classes
    np.testing.assert_array_equal(mlflow.pyfunc.load_model(str(tmp_path / "probs")).predict(x), p)
    got = mlflow.pyfunc.load_model(str(tmp_path / "preds")).predict(x)
    assert got.dtype == np.float64 and got.tolist() == (p[:, 0] > 0.5).astype(float).tolist()


def test_a_regressions_pyfunc_gives_its_values(mlflow_store, tmp_path):
    x = _x(30)
    for outputs in (1, 3):
        model = _regression(outputs)
        sgmlflow.save_model(model, tmp_path / f"values{outputs}")
        sgmlflow.save_model(model, tmp_path / f"preds{outputs}", pyfunc_output="prediction")
        want = model.predict(x)
        np.testing.assert_array_equal(mlflow.pyfunc.load_model(str(tmp_path / f"values{outputs}")).predict(x), want)
        got = mlflow.pyfunc.load_model(str(tmp_path / f"preds{outputs}")).predict(x)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, want[:, 0] if outputs == 1 else want)
        out = Model.load(str(tmp_path / f"preds{outputs}" / "MLmodel")).signature.outputs
        if outputs == 1:
            assert out.input_types() == [mlflow.types.DataType.double]
        else:
            assert (out.inputs[0].type, out.inputs[0].shape) == (np.dtype(np.float64), (-1, 3))


@pytest.mark.spark
def test_spark_udf_scores_binary_and_regression_models_like_their_predict(mlflow_store, spark):
    from pyspark.sql import functions as F

    binary, regression, x = _binary(), _regression(), _x(50)
    with mlflow.start_run():
        probs = sgmlflow.log_model(binary, name="probs")
        classes = sgmlflow.log_model(binary, name="classes", pyfunc_output="prediction")
        values = sgmlflow.log_model(regression, name="values", pyfunc_output="prediction")
    rows = [(i, x[i].tolist()) for i in range(len(x))]
    df = spark.createDataFrame(rows, "id long, features array<float>").coalesce(2)
    udfs = {
        "p": mlflow.pyfunc.spark_udf(spark, probs.model_uri, result_type="array<float>"),
        "c": mlflow.pyfunc.spark_udf(spark, classes.model_uri, result_type="double"),
        "v": mlflow.pyfunc.spark_udf(spark, values.model_uri, result_type="double"),
    }
    out = df.select("id", *(udf(F.col("features")).alias(name) for name, udf in udfs.items()))
    got = sorted(out.collect(), key=lambda r: r.id)
    p = binary.predict(x)
    np.testing.assert_allclose(np.array([r.p for r in got]), p, rtol=1e-6)
    assert [r.c for r in got] == (p[:, 0] > 0.5).astype(float).tolist()
    np.testing.assert_allclose([r.v for r in got], regression.predict(x)[:, 0], rtol=1e-6)


def test_log_model_takes_artifact_path_or_name(mlflow_store):
    model = _mlp()
    with mlflow.start_run():
        info = sgmlflow.log_model(model, "old_style")
        with pytest.raises(InvalidArgumentError, match="differ"):
            sgmlflow.log_model(model, "a", name="b")
    np.testing.assert_array_equal(sgmlflow.load_model(info.model_uri).params, model.params)


def test_bad_models_and_paths_are_refused(mlflow_store, tmp_path):
    with pytest.raises(InvalidArgumentError, match="Sequential"):
        sgmlflow.save_model(object(), tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(InvalidArgumentError, match="not empty"):
        sgmlflow.save_model(_mlp(), tmp_path / "full")
    with pytest.raises(InvalidArgumentError, match="pyfunc_output"):
        sgmlflow.save_model(_mlp(), tmp_path / "y", pyfunc_output="logits")
    with pytest.raises(ModelError, match="no MLmodel"):
        sgmlflow.load_model(str(tmp_path / "full"))
    other = tmp_path / "other"
    other.mkdir()
    Model(flavors={"sklearn": {}}).save(os.path.join(other, "MLmodel"))
    with pytest.raises(ModelError, match="no 'sparkgrad' flavor"):
        sgmlflow.load_model(str(other))
