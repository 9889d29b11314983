"""predict_tfrecords / evaluate_tfrecords on real local Spark: TFRecord files scored in tasks, checked against
the same model's predict and evaluate in this process; and each bad input failing with the file named."""

from __future__ import annotations

import time

import numpy as np
import pytest
from sparkgrad.data import FixedLenFeature, VarLenFeature, encode_example, write_records
from sparkgrad.errors import SchemaError, SparkgradIOError
from sparkgrad.nn import Dense, Sequential
from sparkgrad.nn.saved import model_to_bytes

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
from sparkgrad.spark import evaluate_tfrecords, predict_tfrecords  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]

FEATURES, CLASSES, ROWS, FILES = 16, 4, 240, 3
SCHEMA = {
    "x": FixedLenFeature([FEATURES], "float32"),
    "label": FixedLenFeature([], "int64"),
    "id": FixedLenFeature([], "int64"),
    "tags": VarLenFeature("bytes"),
    "name": FixedLenFeature([], "bytes"),
}
FAILS_WITHIN = 60.0  # seconds: a bad input fails the job, never hangs it


def _record(x, label, i, over=None):
    feats = {
        "x": x,
        "label": np.array([label]),
        "id": np.array([i]),
        "tags": ("bytes", [b"t%d" % j for j in range(i % 3)]),
        "name": ("bytes", [b"row%d" % i]),
    }
    feats.update(over or {})
    return encode_example({k: v for k, v in feats.items() if v is not None})


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, ROWS)
    d = tmp_path_factory.mktemp("records")
    per = ROWS // FILES
    for f in range(FILES):
        write_records(d / f"part-{f:05d}", [_record(x[i], y[i], i) for i in range(f * per, (f + 1) * per)])
    return d, x, y


@pytest.fixture(scope="module")
def model():
    m = Sequential(
        [Dense(12, activation="relu", input_shape=(FEATURES,)), Dense(CLASSES, activation="softmax")], seed=5
    )
    m.compile(loss="sparse_categorical_crossentropy")
    return m


def _cause(excinfo) -> str:
    return str(excinfo.value)


def test_predict_tfrecords_matches_model_predict_with_pass_through_columns(spark, data, model):
    d, x, y = data
    df = predict_tfrecords(spark, str(d), model, SCHEMA, keep=["id", "label", "tags", "name"], batch_size=50)
    assert df.columns == ["prediction", "probability", "id", "label", "tags", "name"]
    assert df.rdd.getNumPartitions() == FILES  # one task per file by default
    rows = sorted(df.collect(), key=lambda r: r.id)
    assert [r.id for r in rows] == list(range(ROWS))
    want = model.predict(x)
    np.testing.assert_allclose(np.array([r.probability for r in rows]), want, rtol=1e-5, atol=1e-6)
    assert [r.prediction for r in rows] == [float(v) for v in want.argmax(1)]
    assert [r.label for r in rows] == y.tolist()
    assert [list(map(bytes, r.tags)) for r in rows] == [[b"t%d" % j for j in range(i % 3)] for i in range(ROWS)]
    assert [bytes(r.name) for r in rows] == [b"row%d" % i for i in range(ROWS)]


def test_predict_tfrecords_takes_saved_model_bytes_and_several_files_per_task(spark, data, model):
    d, x, _ = data
    df = predict_tfrecords(
        spark,
        str(d / "part-*"),
        model_to_bytes(model),
        SCHEMA,
        input_col="x",
        keep=["id"],
        probability=False,
        files_per_task=2,
    )
    assert df.columns == ["prediction", "id"]
    assert df.rdd.getNumPartitions() == 2
    got = {r.id: r.prediction for r in df.collect()}
    assert [got[i] for i in range(ROWS)] == [float(v) for v in model.predict(x).argmax(1)]


def test_evaluate_tfrecords_sums_in_tasks_equal_model_evaluate(spark, data, model):
    d, x, y = data
    stats = evaluate_tfrecords(spark, str(d), model, SCHEMA, batch_size=32)
    loss, acc = model.evaluate(x, y)
    assert stats["count"] == ROWS
    assert stats["loss"] == pytest.approx(loss, rel=1e-6)
    assert stats["accuracy"] == pytest.approx(acc)


def test_missing_file_is_refused_before_any_job(spark, data, model):
    d, _, _ = data
    with pytest.raises(SparkgradIOError, match="part-99999.*does not exist"):
        predict_tfrecords(spark, [str(d / "part-00000"), str(d / "part-99999")], model, SCHEMA)


def test_file_missing_on_the_executor_fails_the_job_naming_it(spark, data, model):
    d, _, _ = data
    df = predict_tfrecords(spark, [str(d / "part-00000"), str(d / "gone")], model, SCHEMA, check_paths=False)
    start = time.monotonic()
    with pytest.raises(Exception, match=r"cannot open '.*gone'") as e:
        df.collect()
    assert "SparkgradIOError" in _cause(e)
    assert time.monotonic() - start < FAILS_WITHIN


def test_corrupt_record_fails_naming_file_and_byte_offset(spark, data, model, tmp_path):
    d, x, y = data
    path = tmp_path / "corrupt"
    write_records(path, [_record(x[i], y[i], i) for i in range(20)])
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    start = time.monotonic()
    with pytest.raises(Exception, match=r"CorruptRecordError: '.*corrupt': corrupted record at byte \d+"):
        evaluate_tfrecords(spark, [str(d / "part-00000"), str(path)], model, SCHEMA)
    assert time.monotonic() - start < FAILS_WITHIN


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"x": np.zeros(FEATURES - 1, np.float32)}, r"feature 'x': expected 16 float values, found 15"),
        ({"x": None}, r"feature 'x': required .* but missing"),
    ],
    ids=["wrong_length", "missing"],
)
def test_bad_feature_fails_naming_feature_and_file(spark, data, model, tmp_path, bad, message):
    _, x, y = data
    path = tmp_path / "bad"
    write_records(path, [_record(x[i], y[i], i) for i in range(5)] + [_record(x[5], y[5], 5, bad)])
    start = time.monotonic()
    with pytest.raises(Exception, match=rf"SchemaError: '.*/bad': record 5 at byte \d+: {message}"):
        predict_tfrecords(spark, str(path), model, SCHEMA).collect()
    assert time.monotonic() - start < FAILS_WITHIN


def test_schema_that_cannot_feed_the_model_is_refused_on_the_driver(spark, data, model):
    d, _, _ = data
    with pytest.raises(SchemaError, match=r"feature 'x' has 8 values per record; .* needs 16"):
        predict_tfrecords(spark, str(d), model, {"x": FixedLenFeature([8], "float32")})
    with pytest.raises(SchemaError, match=r"'nope' is not a feature"):
        predict_tfrecords(spark, str(d), model, SCHEMA, input_col="nope")
    with pytest.raises(SchemaError, match=r"'ids' are not features"):
        predict_tfrecords(spark, str(d), model, SCHEMA, keep=["ids"])
