"""Scoring tables: Model.transform ships the feature columns alone, and Model.predict_table writes a Parquet
table's predictions from the files, as transform would give them.

Tables are Parquet files written by pyarrow (several files, several row groups each) and read by real local
Spark; the models are small and seeded, so each test takes a few seconds.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from sparkgrad.errors import InvalidArgumentError, SchemaError, SparkgradIOError

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

pytestmark = [pytest.mark.spark, pytest.mark.timeout(120)]

ROWS, WIDTH = 3_000, 6


def _mlp():
    from sparkgrad.nn import Dense, Sequential

    model = Sequential([Dense(8, activation="relu", input_shape=(WIDTH,)), Dense(3, activation="softmax")], seed=5)
    model.compile(loss="sparse_categorical_crossentropy")
    return model


def _strings_model():
    from sparkgrad.nn import CategoryEncoding, Concatenate, Dense, Input, Model, StringLookup

    city = Input(shape=(1,), dtype="string", name="city")
    amount = Input(shape=(1,), name="amount")
    hot = CategoryEncoding(num_tokens=4, output_mode="one_hot")(StringLookup(vocabulary=["a", "b", "c"])(city))
    model = Model([city, amount], Dense(1, activation="sigmoid")(Concatenate()([hot, amount])), seed=2)
    model.compile(loss="binary_crossentropy")
    return model


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """A directory of 3 Parquet files of 1,000 rows, each in 4 row groups: id, x array<float>[6], city, amount."""
    root = tmp_path_factory.mktemp("scoring") / "table"
    root.mkdir()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    cities = np.array(["a", "b", "c", "zz"])[rng.integers(0, 4, ROWS)]
    offsets = pa.array(np.arange(ROWS + 1, dtype=np.int32) * WIDTH)
    whole = pa.table(
        {
            "id": pa.array(np.arange(ROWS, dtype=np.int64)),
            "x": pa.ListArray.from_arrays(offsets, pa.array(x.reshape(-1))),
            "city": pa.array(cities),
            "amount": pa.array(rng.normal(size=ROWS)),
        }
    )
    for i in range(3):
        pq.write_table(whole.slice(i * 1000, 1000), str(root / f"part-{i}.parquet"), row_group_size=250)
    return str(root)


def _rows(df, *cols):
    return sorted(tuple(r[c] for c in ("id", *cols)) for r in df.select("id", *cols).collect())


def _assert_same_scores(got, want):
    """Rows of (id, prediction, probability vector, out array) equal, the floats to float32 rounding: the
    engine's matrix products may round the last bit differently for batches of other sizes, and
    predict_table's batches (its record batches) are not transform's (Spark's Arrow batches)."""
    assert [r[:2] for r in got] == [r[:2] for r in want]
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g[2:], w[2:], strict=True):
            np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-6, atol=1e-7)


def _jobs(spark, group):
    return list(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def test_transform_runs_the_model_once_per_row_on_the_feature_columns_alone(spark, table):
    from sparkgrad.spark import Model

    df = spark.read.parquet(table)
    out = Model.from_nn(_mlp(), featuresCol="x", outputCol="out").transform(df)
    assert out.columns == ["id", "x", "city", "amount", "prediction", "probability", "out"]
    plan = out._jdf.queryExecution().executedPlan().toString()
    evals = [ln for ln in plan.splitlines() if "ArrowEvalPython" in ln]
    # one Python evaluation, of one UDF, whose only input is the feature column: three output columns read
    # one struct, and id, city and amount stay on the JVM side
    assert len(evals) == 1, plan
    assert evals[0].count("score(") == 1 and "score(x#" in evals[0], plan
    rows = out.select("id", "prediction", "out").collect()
    assert len(rows) == ROWS and sorted(r["id"] for r in rows) == list(range(ROWS))
    by_id = {r["id"]: r for r in rows}
    x = {r["id"]: np.asarray(r["x"], np.float32) for r in df.select("id", "x").collect()}
    ids = sorted(x)
    expect = _mlp().predict(np.stack([x[i] for i in ids]))
    np.testing.assert_allclose([by_id[i]["out"] for i in ids], expect, rtol=1e-6)
    np.testing.assert_array_equal([by_id[i]["prediction"] for i in ids], expect.argmax(1).astype(np.float64))


def test_predict_table_writes_what_transform_gives_for_every_row_of_a_multi_file_table(spark, table, tmp_path):
    from sparkgrad.spark import Model

    model = Model.from_nn(_mlp(), featuresCol="x", outputCol="out")
    df = spark.read.parquet(table)
    out = str(tmp_path / "scores")
    assert model.predict_table(table, out, keep=["id"], tasks=4) == ROWS
    names = sorted(os.listdir(out))
    assert names[0] == "_SUCCESS" and len([n for n in names if n.startswith("part-")]) == 4  # 12 row groups, 4 tasks
    scored = spark.read.parquet(out)
    assert scored.schema == model.transform(df).select("prediction", "probability", "out", "id").schema
    cols = ("prediction", "probability", "out")
    _assert_same_scores(_rows(scored, *cols), _rows(model.transform(df), *cols))
    # a DataFrame that is a plain scan reads the same files; mode="overwrite" replaces the first output
    assert model.predict_table(df, out, keep=["id", "city"]) == ROWS
    again = spark.read.parquet(out)
    assert again.columns == ["prediction", "probability", "out", "id", "city"]
    assert _rows(again, "prediction", "city") == _rows(model.transform(df), "prediction", "city")
    # any other DataFrame is scored from its cache entry (sparkgrad.data.table_files)
    filtered = df.filter("id % 3 = 0")
    assert model.predict_table(filtered, out, keep=["id"], cache_dir=str(tmp_path / "cache")) == filtered.count()
    assert _rows(spark.read.parquet(out), "prediction") == _rows(model.transform(filtered), "prediction")


def test_predict_table_scores_a_model_of_string_and_number_inputs_as_transform_does(spark, table, tmp_path):
    from sparkgrad.spark import Model

    model = Model.from_nn(_strings_model(), inputCols=["city", "amount"])
    out = str(tmp_path / "scores")
    model.predict_table(table, out, keep=["id"], tasks=2)
    cols = ("prediction", "probability", "rawPrediction")
    got, want = _rows(spark.read.parquet(out), *cols), _rows(model.transform(spark.read.parquet(table)), *cols)
    assert got == want and {r[1] for r in got} == {0.0, 1.0}


def test_predict_table_refuses_bad_sources_and_outputs_before_any_job(spark, table, tmp_path):
    from sparkgrad.spark import Model

    model = Model.from_nn(_mlp(), featuresCol="x")
    group = "predict-table-refusals"
    spark.sparkContext.setJobGroup(group, "refusals")
    try:
        with pytest.raises(SparkgradIOError, match=r"the directory '.*/nowhere' that would hold .* does not exist"):
            model.predict_table(table, str(tmp_path / "nowhere" / "scores"))
        (tmp_path / "taken").mkdir()
        with pytest.raises(SparkgradIOError, match=r"taken' already exists \(mode='error'"):
            model.predict_table(table, str(tmp_path / "taken"), mode="error")
        with pytest.raises(SchemaError, match=r"column 'nope' is not in file '.*part-0.parquet'; its columns: id, x, "):
            model.predict_table(table, str(tmp_path / "a"), keep=["nope"])
        with pytest.raises(SchemaError, match=r"column 'pixels' is not in file"):
            Model.from_nn(_mlp(), featuresCol="pixels").predict_table(table, str(tmp_path / "b"))
        with pytest.raises(InvalidArgumentError, match=r"input 'x'.*string|takes|strings"):
            Model.from_nn(_mlp(), featuresCol="city").predict_table(table, str(tmp_path / "c"))
        with pytest.raises(InvalidArgumentError, match=r"holds the table's own file"):
            model.predict_table(table, os.path.dirname(table))
        with pytest.raises(InvalidArgumentError, match=r"predictionCol 'prediction' is also a keep column"):
            model.predict_table(table, str(tmp_path / "e"), keep=["prediction"])
        assert _jobs(spark, group) == []
        assert not any((tmp_path / n).exists() for n in "abce") and os.listdir(tmp_path / "taken") == []
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)


def test_predict_table_names_the_file_and_row_group_of_a_bad_row(spark, tmp_path):
    from sparkgrad.spark import Model

    root = tmp_path / "ragged"
    root.mkdir()
    lists = pa.array([[0.5] * WIDTH] * 9 + [[0.5] * (WIDTH - 1)], pa.list_(pa.float32()))
    pq.write_table(pa.table({"x": lists}), str(root / "p.parquet"), row_group_size=5)
    with pytest.raises(InvalidArgumentError, match=r"file '.*p.parquet', row group 1: column 'x'.* row 4"):
        Model.from_nn(_mlp(), featuresCol="x").predict_table(str(root), str(tmp_path / "out"))


@pytest.mark.parametrize("value", [pa.float32(), pa.float64(), pa.int64(), pa.bool_()])
def test_a_list_column_back_from_pandas_is_the_arrow_array_it_came_from(value):
    from sparkgrad.spark.model import _to_arrow

    kind = pa.list_(pa.field("element", value))  # as Spark names a list's values
    rng = np.random.default_rng(3)
    rows = [rng.integers(0, 5, int(k)).astype(value.to_pandas_dtype()).tolist() for k in rng.integers(0, 4, 50)]
    whole = pa.array(rows, kind)
    with_nulls = pa.array(rows[:10] + [None] + rows[10:], kind)
    for arr in (whole, whole.slice(7, 30), with_nulls, pa.array([], kind)):
        back = _to_arrow(arr.to_pandas(), kind)
        assert back.to_pylist() == arr.to_pylist() and str(back.type) == str(kind)
    if value != pa.bool_():  # the rows were views of the values: taken without a copy
        series = whole.to_pandas()
        assert _to_arrow(series, kind).values.buffers()[1].address == series.iloc[0].base.ctypes.data


def test_transform_returns_outputs_wider_than_the_split_as_one_array(spark, table):
    from sparkgrad.nn import Dense, Sequential
    from sparkgrad.spark import Model
    from sparkgrad.spark.model import _SPLIT_WIDTH

    net = Sequential([Dense(_SPLIT_WIDTH + 4, input_shape=(WIDTH,))], seed=1)
    net.compile(loss="mse")
    df = spark.read.parquet(table).limit(50)
    rows = Model.from_nn(net, featuresCol="x", outputCol="out").transform(df).select("x", "prediction", "out").collect()
    want = net.predict(np.array([r["x"] for r in rows], np.float32))
    np.testing.assert_allclose([r["out"] for r in rows], want, rtol=1e-6)  # array<float>, one array field
    np.testing.assert_allclose([r["prediction"] for r in rows], want, rtol=1e-6)  # array<double>, the same


def test_a_scoring_task_runs_the_c_core_on_its_share_of_the_cores(spark, table):
    """Spark runs an executor's cores' worth of tasks at once, each promised spark.task.cpus cores: a task
    that loads a shipped model (transform, predict_table, evaluate) sets the C core's threads to that share,
    whatever the Python worker was left with."""
    from sparkgrad.spark.shipping import ShippedModel

    shipped = ShippedModel(spark, _mlp())
    env = os.environ.get("OMP_NUM_THREADS")
    want = int(env.split(",")[0]) if env else int(spark.conf.get("spark.task.cpus", "1"))

    def threads(batches):
        import pandas as pd
        from sparkgrad import _core

        for _ in batches:
            _core.set_num_threads(want + 2)  # what an earlier call in this worker might have left
            shipped.load()
            yield pd.DataFrame({"threads": [_core.get_num_threads()]})

    got = spark.read.parquet(table).select("id").mapInPandas(threads, "threads int").collect()
    assert got and {r["threads"] for r in got} == {want}, got
