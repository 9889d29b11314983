"""Recovery from a lost node (max_restarts) on a real local Spark: TFCluster with a ps, and sparkgrad.run.

A training node kills its own Python process (os._exit, no report) at the end
of its second epoch, once the chief's checkpoint of that epoch exists; a
marker file in tmp_path makes it die on the first attempt only (or on every
attempt). The restarted nodes resume from that checkpoint.
"""

from __future__ import annotations

import io
import json
import pathlib
import re
import time

import pytest
import recovery_fns
import sparkgrad
from cluster_checks import Lines
from sparkgrad import TFCluster
from sparkgrad.errors import InvalidArgumentError, NodeFailure

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]

HERE = pathlib.Path(__file__).resolve().parent
EPOCHS = 5
STEPS_PER_EPOCH = 16  # 512 rows, 2 training nodes, batches of 16: 16 synchronous steps an epoch
RESUMED = re.compile(r"resumed from .*ckpt-(\d{10})\.sgck at step (\d+)")


@pytest.fixture(scope="module")
def sc(spark_context):
    spark_context.addPyFile(str(HERE / "recovery_fns.py"))
    return spark_context


def _ps_args(tmp_path, target=1, every_time=False):
    return {
        "ckpt": str(tmp_path / "ckpt"),
        "marker": str(tmp_path / "marker"),
        "target": target,
        "epochs": EPOCHS,
        "every_time": every_time,
    }


def _ps_cluster(sc, args, out, max_restarts):
    return TFCluster.run(
        sc, recovery_fns.ps_fit, args, 3, 1, output=out, reservation_timeout=60, stop_grace=2,
        max_restarts=max_restarts,
    )  # fmt: skip


def _restart_lines(lines):
    return [line for line in lines if line.startswith("sparkgrad: restart ")]


def test_ps_cluster_restarts_a_lost_worker_and_resumes_from_the_chiefs_checkpoint(sc, tmp_path):
    # the same training without a failure, for reference (shuffle=False: the resumed run must equal it)
    ref_out = Lines()
    ref = _ps_cluster(sc, {**_ps_args(tmp_path / "ref", target=-1), "shuffle": False}, ref_out, 0)
    ref.shutdown(timeout=90)
    assert ref.restarts == 0 and not _restart_lines(ref_out.lines)

    out = Lines()
    args = {**_ps_args(tmp_path), "shuffle": False}
    cluster = _ps_cluster(sc, args, out, 1)
    cluster.shutdown(timeout=120)
    died = json.loads((tmp_path / "marker").read_text())
    assert died["step"] == 2 * STEPS_PER_EPOCH and died["step"] in died["checkpoints"]

    restarts = _restart_lines(out.lines)
    assert len(restarts) == 1 and cluster.restarts == 1, out.lines
    # the cause: worker:1's loss (or the chief's ps step that broke on it), named with Spark's executor
    assert restarts[0].startswith("sparkgrad: restart 1 of 1: starting every node again after: worker:")
    assert "Spark executor driver on 127.0.0.1" in restarts[0]
    assert cluster.restart_causes == [restarts[0].split(" after: ", 1)[1]]

    # the restarted chief resumed at the checkpoint the node died after: no step lost
    resumed = [RESUMED.search(line) for line in out.lines if line.startswith("worker:0 ")]
    resumed = [m for m in resumed if m]
    assert len(resumed) == 1 and int(resumed[0].group(1)) == int(resumed[0].group(2)) == died["step"]
    chief, other = cluster.results[1], cluster.results[2]
    assert chief["attempt"] == other["attempt"] == 1
    assert chief["start_step"] == other["start_step"] == died["step"]
    assert chief["step"] == EPOCHS * STEPS_PER_EPOCH
    assert chief["accuracy"] > 0.9
    # parameters, Adam's moments on the ps, step and position all came back: the very same model
    assert chief["params_crc"] == ref.results[1]["params_crc"]


def test_ps_cluster_restarts_after_a_worker_goes_silent(sc, tmp_path):
    out = Lines()
    args = {**_ps_args(tmp_path), "how": "stop"}  # SIGSTOP: alive, but no heartbeat
    cluster = TFCluster.run(
        sc, recovery_fns.ps_fit, args, 3, 1, output=out, reservation_timeout=60, stop_grace=2,
        heartbeat_timeout=2, max_restarts=1,
    )  # fmt: skip
    cluster.shutdown(timeout=120)
    died = json.loads((tmp_path / "marker").read_text())
    restarts = _restart_lines(out.lines)
    assert len(restarts) == 1 and "Spark executor driver on 127.0.0.1" in restarts[0], out.lines
    chief = cluster.results[1]
    assert chief["attempt"] == 1 and chief["start_step"] == died["step"] and chief["accuracy"] > 0.9


def test_ps_cluster_without_restarts_raises_naming_sparks_executor_and_host(sc, tmp_path):
    out = Lines()
    cluster = _ps_cluster(sc, _ps_args(tmp_path), out, 0)
    started = time.monotonic()
    with pytest.raises(NodeFailure) as info:
        cluster.shutdown(timeout=90)
    assert time.monotonic() - started < 30
    exc = info.value
    assert (exc.spark_executor, exc.spark_host) == ("driver", "127.0.0.1")  # a local master's executor
    assert "; Spark executor driver on 127.0.0.1)" in str(exc)
    assert not _restart_lines(out.lines) and cluster.restarts == 0


def test_ps_cluster_raises_after_its_restarts_when_a_node_fails_every_time(sc, tmp_path):
    out = Lines()
    cluster = _ps_cluster(sc, _ps_args(tmp_path, every_time=True), out, 1)
    with pytest.raises(NodeFailure) as info:
        cluster.shutdown(timeout=120)
    assert len(_restart_lines(out.lines)) == 1 and cluster.restarts == 1
    assert "worker:" in str(info.value) and info.value.spark_executor == "driver"


def test_allreduce_run_restarts_a_lost_rank_and_resumes_from_rank_0s_checkpoint(sc, spark, tmp_path):
    out, err = io.StringIO(), io.StringIO()
    ckpt, marker = str(tmp_path / "ckpt"), str(tmp_path / "marker")
    values = sparkgrad.run(
        recovery_fns.allreduce_fit, args=(ckpt, marker, 1, EPOCHS), num_proc=2, stdout=out, stderr=err,
        spark=spark, max_restarts=1,
    )  # fmt: skip
    died = json.loads(pathlib.Path(marker).read_text())
    restarts = [line for line in err.getvalue().splitlines() if line.startswith("sparkgrad: restart ")]
    assert len(restarts) == 1, err.getvalue()
    # the cause: rank 1's loss, or rank 0's allreduce that broke on it first
    assert restarts[0].startswith("sparkgrad: restart 1 of 1: starting every node again after: rank ")
    assert "rank 1 " in restarts[0] and "Spark executor driver on 127.0.0.1" in restarts[0]
    assert [v["attempt"] for v in values] == [1, 1]
    assert [v["start_step"] for v in values] == [died["step"], died["step"]] == [2 * STEPS_PER_EPOCH] * 2
    assert [v["step"] for v in values] == [EPOCHS * STEPS_PER_EPOCH] * 2
    assert values[0]["params_crc"] == values[1]["params_crc"]  # the ranks still agree after the resume
    assert values[0]["accuracy"] > 0.9
    for r in (0, 1):  # rank 1 has no checkpoint_dir: it took rank 0's resumed state
        assert f"rank {r}: resumed from {ckpt}/ckpt-{died['step']:010d}.sgck at step {died['step']}" in out.getvalue()


def test_allreduce_run_without_restarts_raises_naming_the_rank_and_sparks_executor(sc, spark, tmp_path):
    with pytest.raises(NodeFailure) as info:
        sparkgrad.run(
            recovery_fns.allreduce_fit, args=(str(tmp_path / "ckpt"), str(tmp_path / "marker"), 1, EPOCHS),
            num_proc=2, stdout=io.StringIO(), stderr=io.StringIO(), spark=spark,
        )  # fmt: skip
    exc = info.value
    # rank 1's loss, or rank 0's allreduce that broke on it first: either names its rank and Spark's executor
    assert re.match(r"rank ([01]) \(executor \1; Spark executor driver on 127\.0\.0\.1\) on 127\.0\.0\.1 ", str(exc))
    assert exc.rank in (0, 1) and "rank 1 " in str(exc) and exc.spark_executor == "driver"


def test_local_run_raises_after_one_restart_when_a_rank_fails_every_time(tmp_path):
    err = io.StringIO()
    with pytest.raises(NodeFailure) as info:
        sparkgrad.run(
            recovery_fns.allreduce_fit, args=(str(tmp_path / "ckpt"), str(tmp_path / "marker"), 1, EPOCHS, True),
            num_proc=2, stdout=io.StringIO(), stderr=err, local=True, max_restarts=1,
        )  # fmt: skip
    restarts = [line for line in err.getvalue().splitlines() if line.startswith("sparkgrad: restart ")]
    assert len(restarts) == 1 and restarts[0].startswith("sparkgrad: restart 1 of 1: ")
    assert "rank 1 " in str(info.value) and "Spark" not in str(info.value)  # local processes: no Spark executor


def test_max_restarts_is_checked():
    with pytest.raises(InvalidArgumentError, match="max_restarts must be an int >= 0"):
        TFCluster.run(None, recovery_fns.ps_fit, None, 2, 0, max_restarts=-1)
    with pytest.raises(InvalidArgumentError, match="InputMode.TENSORFLOW"):
        TFCluster.run(None, recovery_fns.ps_fit, None, 2, 0, input_mode=TFCluster.InputMode.SPARK, max_restarts=1)
