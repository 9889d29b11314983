"""sparkgrad.torch.Distributor: torch.distributed jobs on sparkgrad's launcher, on local processes and local Spark."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch_fns
from sparkgrad.cluster.collective import CommSetup
from sparkgrad.errors import ClusterError, InvalidArgumentError, NodeFailure
from sparkgrad.torch import Distributor
from sparkgrad.torch.distributor import rank_environment

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(180)

HERE = pathlib.Path(__file__).resolve().parent


def _check(values, n, scale):
    total = scale * n * (n + 1) / 2
    assert values["rank"] == 0 and values["size"] == n and values["sum"] == [total] * 3
    env = values["env"]
    assert env["RANK"] == "0" and env["WORLD_SIZE"] == str(n) and env["LOCAL_RANK"] == "0"
    assert env["LOCAL_WORLD_SIZE"] == str(n) and env["NODE_RANK"] == "0" and env["MASTER_ADDR"] == "127.0.0.1"
    assert int(env["MASTER_PORT"]) > 0


def test_a_function_runs_on_local_processes_and_rank_zeros_value_returns(capsys):
    values = Distributor(num_processes=2, local_mode=True, use_gpu=False).run(torch_fns.allreduce_rank, 2.0)
    _check(values, 2, 2.0)
    assert values["cuda"] is None  # use_gpu=False leaves CUDA_VISIBLE_DEVICES alone
    out = capsys.readouterr().out
    assert "rank 0: rank 0 of 2 reduced [6.0, 6.0, 6.0]" in out and "rank 1: rank 1 of 2 reduced" in out


def test_a_script_runs_with_torchruns_environment_and_its_output_streams(tmp_path, capsys):
    script = str(HERE / "torch_script.py")
    got = Distributor(num_processes=2, local_mode=True, use_gpu=False).run(script, "--out", str(tmp_path))
    assert got is None
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["sum"] == 3.0 for r in ranks)
    assert [r["local_rank"] for r in ranks] == ["0", "1"]
    assert all(r["argv"] == ["--out", str(tmp_path)] for r in ranks)
    captured = capsys.readouterr()
    assert "rank 1: script rank 1 done" in captured.out
    assert "rank 0: script rank 0 on stderr" in captured.err


def test_a_script_that_exits_non_zero_fails_the_run_naming_the_rank_and_status(tmp_path):
    script = str(HERE / "torch_script.py")
    with pytest.raises(NodeFailure) as info:
        Distributor(num_processes=2, local_mode=True, use_gpu=False).run(
            script, "--out", str(tmp_path), "--exit-code", "3"
        )
    assert info.value.rank == 1
    assert "torch_script.py exited with status 3" in str(info.value)


def test_a_rank_that_raises_fails_the_run_while_rank_zero_waits_in_a_collective():
    with pytest.raises(NodeFailure) as info:
        Distributor(num_processes=2, local_mode=True, use_gpu=False).run(torch_fns.fail_on_rank_one)
    assert info.value.rank == 1 and "rank one broke on purpose" in str(info.value)


def test_hvd_cannot_form_its_communicator_on_the_port_torchs_store_serves():
    with pytest.raises(NodeFailure) as info:
        Distributor(num_processes=2, local_mode=True, use_gpu=False).run(torch_fns.hvd_inside)
    assert "comm port serves torch.distributed's store" in str(info.value)


def test_bad_arguments_are_refused_before_any_rank_starts(tmp_path):
    with pytest.raises(InvalidArgumentError, match="num_processes"):
        Distributor(num_processes=0)
    d = Distributor(num_processes=2, local_mode=True, use_gpu=False)
    with pytest.raises(InvalidArgumentError, match="no script at"):
        d.run(str(tmp_path / "missing.py"))
    with pytest.raises(InvalidArgumentError, match="positional arguments only"):
        d.run(str(HERE / "torch_script.py"), out="x")
    with pytest.raises(InvalidArgumentError, match="function or a script path"):
        d.run(42)


def test_use_gpu_on_the_driver_needs_as_many_gpus_as_processes(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # one GPU named, whatever the machine has
    with pytest.raises(ClusterError, match=r"2 processes need as many GPUs on the driver, it has 1"):
        Distributor(num_processes=2, local_mode=True, use_gpu=True).run(torch_fns.allreduce_rank, 1.0)


def test_local_mode_false_needs_spark():
    # a fresh interpreter: this one may hold the session of another test
    code = (
        "from sparkgrad.torch import Distributor\n"
        "from sparkgrad.errors import ClusterError\n"
        "try:\n"
        "    Distributor(2, local_mode=False, use_gpu=False).run(print)\n"
        "except ClusterError as e:\n"
        "    print('refused:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "refused: Distributor(local_mode=False) runs its ranks as Spark tasks" in out.stdout, out.stderr


def test_rank_environment_names_rank_zeros_held_port_and_the_topology():
    setup = CommSetup(
        rank=3, size=4, local_rank=1, local_size=2, cross_rank=1, cross_size=2,
        addresses=(("10.0.0.1", 4100), ("10.0.0.1", 4101), ("10.0.0.2", 4102), ("10.0.0.2", 4103)),
        listener=None, secret=b"",
    )  # fmt: skip
    env = rank_environment(setup, ["2", "3"])
    assert env == {
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "4100", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "NODE_RANK": "1", "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0", "CUDA_VISIBLE_DEVICES": "2,3",
    }  # fmt: skip
    assert "CUDA_VISIBLE_DEVICES" not in rank_environment(setup, None)


@pytest.fixture
def spark_with_fns(spark):
    """The shared session, its executors able to import torch_fns (the functions the ranks run)."""
    spark.sparkContext.addPyFile(str(HERE / "torch_fns.py"))
    return spark


@pytest.mark.spark
def test_on_spark_the_ranks_are_barrier_tasks(spark_with_fns):
    spark = spark_with_fns
    values = Distributor(num_processes=2, local_mode=False, use_gpu=False, spark=spark).run(
        torch_fns.allreduce_rank, 1.0
    )
    _check(values, 2, 1.0)


@pytest.mark.spark
def test_on_spark_a_group_left_initialized_is_released_for_the_next_run_in_the_reused_worker(spark_with_fns):
    d = Distributor(num_processes=2, local_mode=False, use_gpu=False, spark=spark_with_fns)
    first = d.run(torch_fns.process_state, "spark-one")  # returns with its default process group still formed
    second = d.run(torch_fns.process_state, "spark-two")
    assert not second["group_was_initialized"]
    if second["pid"] == first["pid"]:  # Spark reused rank 0's Python worker (its default): the run's mark stays
        assert second["global_mark"] == "spark-one"


@pytest.mark.spark
def test_on_spark_use_gpu_needs_the_tasks_gpu_resources(spark_with_fns):
    spark = spark_with_fns
    with pytest.raises(NodeFailure) as info:
        Distributor(num_processes=2, local_mode=False, use_gpu=True, spark=spark).run(torch_fns.allreduce_rank, 1.0)
    assert "Spark task has no 'gpu' resources; set spark.task.resource.gpu.amount" in str(info.value)


@pytest.mark.spark
@pytest.mark.slow
def test_on_spark_each_rank_sees_the_gpus_spark_gave_its_task():
    pyspark = pytest.importorskip("pyspark")
    spark_home = os.path.dirname(pyspark.__file__)
    if not os.path.exists(os.path.join(spark_home, "bin", "spark-class")):
        pytest.skip(f"local-cluster needs SPARK_HOME with bin/spark-class; {spark_home} has none")
    import sparkgrad

    python_dir = os.path.dirname(os.path.dirname(os.path.abspath(sparkgrad.__file__)))
    env = dict(
        os.environ, SPARK_HOME=spark_home, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join([str(HERE), python_dir]),
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(HERE / "torch_gpu_job.py")], env=env, capture_output=True, text=True, timeout=170
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    every = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["rank"] for r in every] == [0, 1]
    assert all(len(r["task_gpus"]) == 1 and r["cuda"] == r["task_gpus"][0] for r in every)
    assert every[0]["cuda"] != every[1]["cuda"]  # each worker announced its own


def test_a_second_run_forks_fresh_ranks_from_the_drivers_forkserver(monkeypatch):
    d = Distributor(num_processes=2, local_mode=True, use_gpu=False)
    monkeypatch.setenv("SG_TEST_DRIVER_ENV", "first")
    first = d.run(torch_fns.process_state, "one")
    monkeypatch.setenv("SG_TEST_DRIVER_ENV", "second")
    second = d.run(torch_fns.process_state, "two")
    # both runs' ranks are children of one server that outlives a run, not of this driver
    assert first["ppid"] == second["ppid"] != os.getpid() and first["pid"] != second["pid"]
    # a new process each run: nothing the first run's rank did is seen, and the driver's environment is of now
    assert second["marks"] == [] and second["global_mark"] is None and not second["group_was_initialized"]
    assert (first["driver_env"], second["driver_env"]) == ("first", "second")
    # the server imported torch, and torch._dynamo that a rank's first optimizer would import
    assert first["preloaded"] == second["preloaded"] == ["torch", "torch._dynamo"]


@pytest.mark.timeout(90)
def test_a_ddp_model_that_outlives_destroy_process_group_in_its_frame_ends_every_run():
    d = Distributor(num_processes=2, local_mode=True, use_gpu=False)
    losses = [d.run(torch_fns.ddp_destroyed_before_its_model, 3) for _ in range(4)]
    assert all(isinstance(loss, float) for loss in losses)
    assert d.run(torch_fns.allreduce_rank, 1.0)["size"] == 2  # the next job forms with the wrapper gone


def test_a_forked_rank_that_exits_without_a_word_is_named():
    with pytest.raises(NodeFailure) as info:
        Distributor(num_processes=2, local_mode=True, use_gpu=False).run(torch_fns.exit_hard_on_rank_one)
    assert info.value.rank == 1 and str(info.value).startswith("rank 1 (executor 1) on 127.0.0.1 was lost")


def test_a_script_that_starts_ranks_without_the_main_guard_is_told_so(tmp_path):
    script = tmp_path / "no_guard.py"
    script.write_text("import sparkgrad\n\ndef f():\n    return 1\n\nsparkgrad.run(f, num_proc=1, local=True)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "ClusterError: a node failed before the cluster formed" in done.stderr
    assert 'put the code that starts them under `if __name__ == "__main__":`' in (done.stderr)
    assert f"{script} started nodes while a node was importing it" in done.stderr
