"""sparkgrad.spark.Estimator reading its training rows from Parquet files, one barrier task per worker.

A synthetic table with a known rule (tests/spark_ml_tables_data.py: a string column into a StringLookup,
an id column into an Embedding, numbers, a Spark ML vector; nulls skipped and filled) is written by
Spark and read back with ``spark.read.parquet``. The fit on ``local[2]`` runs in a process of its own
(tests/spark_ml_tables_job.py: the shared session has 4 slots); the rest use the shared session.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import sparkgrad
from spark_ml_tables_data import BAD_INPUTS, COLUMNS, model, write_table
from sparkgrad.errors import InvalidArgumentError, NodeFailure
from sparkgrad.nn import Adam

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

# mapInArrow returns Spark ML vector columns (Model.evaluate's vector input) from pyspark 3.5 on; fit reads
# the files and runs on every leg
evaluates = pytest.mark.skipif(
    tuple(int(v) for v in pytest.importorskip("pyspark").__version__.split(".")[:2]) < (3, 5),
    reason="pyspark < 3.5: mapInArrow cannot return vector columns",
)

HERE = pathlib.Path(__file__).resolve().parent


@evaluates
def test_two_workers_fit_a_parquet_table_with_strings_and_nulls_on_two_task_slots(tmp_path):
    env = dict(os.environ)
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join([str(HERE), os.path.dirname(os.path.dirname(os.path.abspath(sparkgrad.__file__)))]),
    )
    proc = subprocess.run(
        [sys.executable, str(HERE / "spark_ml_tables_job.py"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["slots"] == 2 and not out["cache"]  # a plain Parquet scan: read from its own files
    assert [h["rank"] for h in out["history"]] == [0, 1]
    assert out["history"][0]["steps"] == out["history"][1]["steps"] > 0  # allreduce: the workers stepped together
    # every epoch, each worker trains at most its shard less the rows whose city is null
    assert 0 < sum(h["rows"] for h in out["history"]) <= 6 * (3000 - out["skipped"])
    before, after = out["before"], out["after"]
    assert after["rows"] == 600
    assert after["loss"] < before["loss"] * 0.4 and after["accuracy"] > 0.9, (before, after)


@pytest.fixture(scope="module")
def shops(spark, tmp_path_factory):
    """(train with nulls, held-out without), written by Spark and read back."""
    root = tmp_path_factory.mktemp("tables")
    return (
        write_table(spark, str(root / "train"), 1200, seed=1, nulls=True),
        write_table(spark, str(root / "test"), 400, seed=2, nulls=False),
    )


def _estimator(**params):
    from sparkgrad.spark import Estimator

    base = dict(model=model(), optimizer=Adam(0.02), inputCols=COLUMNS, labelCol="label", batch_size=32, num_workers=2)
    return Estimator(**{**base, **params})


@evaluates
def test_a_filtered_dataframe_is_written_to_the_cache_once_and_fits(shops, tmp_path):
    train, test = shops
    fitted = _estimator(
        epochs=4, nulls={"city": "skip", "spend": 0.0}, cache_dir=str(tmp_path / "cache"), mode="ps", num_ps=1
    ).fit(train.filter("visits < 8"))
    (cached,) = os.listdir(tmp_path / "cache")
    files = [n for n in os.listdir(tmp_path / "cache" / cached) if n.endswith(".parquet")]
    assert files  # the filtered rows, as Parquet
    assert fitted.evaluate(test)["accuracy"] > 0.85


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_fails_fit_with_a_specific_error(shops, case):
    """A missing column, a column of a type no input takes (before any job) and a null under the "error"
    policy (a worker's read, naming the column, file and row group); test_spark_ml_tables_connect.py checks
    the same cases over Spark Connect."""
    make, params, error, message = BAD_INPUTS[case]
    with pytest.raises(error, match=message) as e:
        _estimator(epochs=1, **params).fit(make(shops[0]))
    if case == "null_under_error":
        assert isinstance(e.value.__cause__, NodeFailure) and "Traceback" in e.value.__cause__.remote_traceback


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"nulls": {"town": "skip"}}, r"^Estimator: nulls names column 'town', which fit does not read"),
        ({"nulls": {"city": "drop"}}, r"^Estimator: nulls\['city'\] must be 'error', 'skip' or a number"),
        ({"batch_size": 700}, r"has 1200 rows; 2 workers of batch_size 700 need at least 1400"),
        ({"shuffle_buffer": -1}, r"^Estimator: shuffle_buffer must be >= 0"),
    ],
    ids=["nulls_column", "nulls_policy", "too_few_rows", "shuffle_buffer"],
)
def test_bad_table_params_fail_fit_before_the_cluster_starts(shops, params, message):
    with pytest.raises(InvalidArgumentError, match=message):
        _estimator(**params).fit(shops[0])
