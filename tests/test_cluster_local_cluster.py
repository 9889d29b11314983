"""A cluster whose nodes run in separate executor JVMs (Spark's local-cluster master)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import sparkgrad

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(240)]

HERE = pathlib.Path(__file__).resolve().parent


def test_nodes_run_in_separate_executor_processes(tmp_path):
    pyspark = pytest.importorskip("pyspark")
    spark_home = os.path.dirname(pyspark.__file__)
    if not os.path.exists(os.path.join(spark_home, "bin", "spark-class")):
        pytest.skip(f"local-cluster needs SPARK_HOME with bin/spark-class; {spark_home} has none")
    env = dict(os.environ)
    env.update(
        SPARK_HOME=spark_home,
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        # absolute paths: executors run in their own work directories
        PYTHONPATH=os.pathsep.join([str(HERE), os.path.dirname(os.path.dirname(os.path.abspath(sparkgrad.__file__)))]),
    )
    proc = subprocess.run(
        [sys.executable, str(HERE / "cluster_local_cluster_job.py"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    if proc.returncode != 0 and "local-cluster" in proc.stderr and "Exception in thread" in proc.stderr:
        pytest.skip(f"Spark's local-cluster master could not start here:\n{proc.stderr[-2000:]}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["spec"].keys() == {"ps", "worker"}
    assert result["results"] == {"0": "ps stopped", "1": {"task_index": 0}}
    jvms = {c["grandparent_pid"] for c in result["ctx"]}
    assert len(jvms) == 2, f"both nodes ran under one executor JVM: {result['ctx']}"
    assert result["driver"] not in {c["pid"] for c in result["ctx"]}
    # each node names its executor as Spark does ("Lost executor 1 on 127.0.0.1"): the JVM's --executor-id
    executors = result["spark"]
    assert sorted(e for e, _ in executors.values()) == ["0", "1"], executors
    assert {h for _, h in executors.values()} == {"127.0.0.1"}
