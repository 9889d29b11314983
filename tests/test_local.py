"""The local launcher (sparkgrad.local.run / TFCluster.run(None, ...)): same node path, same failures."""

from __future__ import annotations

import _thread
import contextlib
import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import threading
import time

import cluster_nodes
import numpy as np
import pytest
import sparkgrad
from cluster_checks import alive
from sparkgrad import TFCluster
from sparkgrad.cluster import launch
from sparkgrad.errors import NodeFailure, RendezvousTimeout

pytestmark = pytest.mark.timeout(90)


def _quiet(line: str) -> None:
    pass


def _pids(cluster) -> list[int]:
    return [n.pid for n in cluster.nodes]


def _assert_all_gone(cluster) -> None:
    assert cluster.nodes, "the cluster never formed"
    assert not [pid for pid in _pids(cluster) if alive(pid)]


def test_local_run_gives_each_process_its_role_and_the_spec(tmp_path):
    lines: list[str] = []
    cluster = sparkgrad.local.run(cluster_nodes.write_ctx, {"dir": str(tmp_path)}, 4, 1, output=lines.append)
    cluster.shutdown(timeout=60)
    ctxs = [json.loads((tmp_path / f"ctx-{i}.json").read_text()) for i in range(4)]
    assert [(c["job_name"], c["task_index"]) for c in ctxs] == [("ps", 0), ("worker", 0), ("worker", 1), ("worker", 2)]
    assert len({c["pid"] for c in ctxs} | {os.getpid()}) == 5  # one process per node, none is the driver
    spec = cluster.cluster_spec
    assert all(c["cluster_spec"] == spec and c["tf_config"]["cluster"] == spec for c in ctxs)
    assert all(addr.startswith("127.0.0.1:") for addrs in spec.values() for addr in addrs)
    assert ctxs[0]["defaultFS"] == "file://" and ctxs[0]["working_dir"] == os.getcwd()
    assert cluster.results[0] == "ps stopped" and cluster.results[3] == {"task_index": 2}
    # one definition of rank: the workers' rank among the training nodes, none on the ps
    assert [c["rank"] for c in ctxs] == [[None, 3, "ps"], [0, 3, "worker"], [1, 3, "worker"], [2, 3, "worker"]]
    assert "worker:2 stdout line from worker:2" in lines
    _assert_all_gone(cluster)


def test_tfcluster_run_without_spark_is_the_local_launcher(tmp_path):
    cluster = TFCluster.run(
        None, cluster_nodes.write_ctx, {"dir": str(tmp_path)}, 2, 0, master_node="chief", output=_quiet,
        env={"SPARKGRAD_TEST_VAR": "from env="},
    )  # fmt: skip
    cluster.shutdown(timeout=60)
    assert cluster.cluster_spec.keys() == {"chief", "worker"}
    chief = json.loads((tmp_path / "ctx-0.json").read_text())
    assert chief["tf_config"]["task"] == {"type": "chief", "index": 0}
    # a node process has its environment in ctx.env and exports it: TF_CONFIG and env=
    assert chief["ctx_env"].keys() == {"TF_CONFIG", "SPARKGRAD_TEST_VAR"}
    assert json.loads(chief["ctx_env"]["TF_CONFIG"]) == chief["tf_config"]
    assert chief["ctx_env"]["SPARKGRAD_TEST_VAR"] == chief["test_var"] == "from env="
    assert "SPARKGRAD_TEST_VAR" not in os.environ and "TF_CONFIG" not in os.environ  # the driver's is its own


def test_local_exception_raises_node_failure(tmp_path):
    args = {"dir": str(tmp_path), "target": "worker:0"}
    cluster = sparkgrad.local.run(cluster_nodes.raise_on_target, args, 3, 1, output=_quiet)
    with pytest.raises(NodeFailure) as info:
        cluster.shutdown(timeout=60)
    assert (info.value.role, info.value.index, info.value.host) == ("worker", 0, "127.0.0.1")
    assert "ValueError: boom from worker:0" in info.value.remote_traceback
    _assert_all_gone(cluster)


@pytest.mark.parametrize("target", ["worker:1", "ps:0"])
def test_local_sigkill_raises_node_failure_and_ends_every_process(tmp_path, target):
    args = {"dir": str(tmp_path), "target": target}
    cluster = sparkgrad.local.run(cluster_nodes.kill_target, args, 3, 1, output=_quiet)
    started = time.monotonic()
    with pytest.raises(NodeFailure) as info:
        cluster.shutdown(timeout=60)
    assert time.monotonic() - started < 20
    assert f"{info.value.role}:{info.value.index}" == target
    assert len(list(tmp_path.glob("stopped-*.json"))) == 2
    _assert_all_gone(cluster)


def test_driver_interrupt_stops_every_node(tmp_path):
    args = {"dir": str(tmp_path), "target": "none"}
    cluster = sparkgrad.local.run(cluster_nodes.busy_until_interrupted, args, 2, 0, output=_quiet, stop_grace=1.0)
    timer = threading.Timer(0.5, _thread.interrupt_main)  # what a notebook's interrupt button does
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        cluster.shutdown(timeout=60)
    timer.join()
    _assert_all_gone(cluster)


def _driver_of_two_blocked_nodes(tmp_path, blocked: str, options: str) -> tuple[subprocess.Popen, pathlib.Path]:
    """A driver process running 2 local nodes of cluster_nodes.<blocked> with run()'s ``options``; it prints
    "formed" and waits until the test kills it. Its stderr goes to the file returned."""
    driver_code = (
        "import sys, cluster_nodes, sparkgrad\n"
        f"cluster = sparkgrad.local.run(cluster_nodes.{blocked}, {{'dir': sys.argv[1], 'target': ''}}, "
        f"2, 0, output=lambda line: None, {options})\n"
        "print('formed', flush=True)\n"
        "sys.stdin.read()\n"
    )
    stderr = tmp_path / "stderr.txt"
    with open(stderr, "w") as err:
        driver = subprocess.Popen(
            [sys.executable, "-c", driver_code, str(tmp_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
    return driver, stderr


def _started_pids(tmp_path, count: int) -> list[int]:
    """The pids of the nodes once ``count`` have marked themselves started (bounded by the test's timeout)."""
    while True:
        started = [json.loads(p.read_text())["pid"] for p in tmp_path.glob("started-*.json")]
        if len(started) >= count:
            return started
        time.sleep(0.05)


@pytest.mark.parametrize(
    "blocked, why",
    [
        ("blocked_in_native_wait", "blocked in native code"),  # the node's Python watcher, 2 stop_grace on
        ("blocked_holding_the_gil", "its Python did not end it"),  # no Python runs: the C guard, 3 stop_grace on
    ],
)
def test_a_node_blocked_in_native_code_ends_itself_when_its_driver_is_killed(tmp_path, blocked, why):
    """No launcher is left to end it: the node's watcher does, two stop_grace after losing the driver, or,
    where it cannot run for the GIL, the control client's C guard a stop_grace later."""
    driver, stderr = _driver_of_two_blocked_nodes(tmp_path, blocked, "stop_grace=1.0")
    try:
        assert driver.stdout.readline() == "formed\n", stderr.read_text()
        pidfds = [os.pidfd_open(pid) for pid in _started_pids(tmp_path, 2)]
    finally:
        driver.kill()
        driver.wait(30)
    try:
        for fd in pidfds:  # readable once the process has ended
            ready, _, _ = select.select([fd], [], [], 30)
            assert ready, f"a node outlived its killed driver by 30 s: {stderr.read_text()}"
    finally:
        for fd in pidfds:  # one left by a failed assertion is ended here, not left to outlive the test run
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
    text = stderr.read_text()
    assert "ending the process" in text and why in text


def test_the_forkserver_ends_with_its_killed_driver_while_its_nodes_still_run(tmp_path):
    """A forked node holds no copy of the driver's end of the server's alive pipe: the server sees its driver
    gone at once, not when the last node ends (here a minute later, its stop_grace being 30 s)."""
    driver, stderr = _driver_of_two_blocked_nodes(
        tmp_path, "blocked_in_native_wait", "stop_grace=30.0, preload=('json',)"
    )
    nodes: list[int] = []
    try:
        assert driver.stdout.readline() == "formed\n", stderr.read_text()
        nodes = _started_pids(tmp_path, 2)
        servers = {cluster_nodes._parent_of(pid) for pid in nodes}
        assert len(servers) == 1 and driver.pid not in servers, "the nodes were not forked from one forkserver"
        server = os.pidfd_open(servers.pop())
        driver.kill()
        driver.wait(30)
        try:
            ready, _, _ = select.select([server], [], [], 20)
            assert ready, "the forkserver outlived its killed driver by 20 s"
        finally:
            os.close(server)
        assert all(alive(pid) for pid in nodes)  # its nodes still in their 30 s grace: the server did not wait
    finally:
        driver.kill()
        for pid in nodes:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_local_reservation_timeout_names_missing_executor(tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "held_executors", lambda: frozenset({1}))
    started = time.monotonic()
    with pytest.raises(RendezvousTimeout, match=r"missing.*1"):
        sparkgrad.local.run(cluster_nodes.write_ctx, {"dir": str(tmp_path)}, 2, 0, output=_quiet, reservation_timeout=2)
    assert time.monotonic() - started >= 2 * 0.9  # it waited reservation_timeout for the held node


def _tensorboard_cluster(tmp_path) -> tuple:
    """A 1-node local cluster with tensorboard=True on tmp_path, and the list its messages go to."""
    lines: list[str] = []
    cluster = sparkgrad.local.run(
        cluster_nodes.write_ctx, {"dir": str(tmp_path)}, 1, 0, tensorboard=True, log_dir=str(tmp_path),
        output=lines.append,
    )  # fmt: skip
    return cluster, lines


def test_tensorboard_serves_the_log_dir_until_shutdown(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard)")
    import urllib.request

    cluster, lines = _tensorboard_cluster(tmp_path)  # lines: why TensorBoard did not start, if it did not
    url = cluster.tensorboard_url()
    assert url and url.startswith("http://127.0.0.1:"), "\n".join(str(line) for line in lines)
    with urllib.request.urlopen(url + "/data/logdir", timeout=30) as resp:
        assert str(tmp_path) in resp.read().decode()
    cluster.shutdown(timeout=60)
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=5)


def _fake_tensorboard(monkeypatch, script: str) -> None:
    """TensorBoard replaced by a small script, so its start can be staged without TensorFlow."""
    import sys

    from sparkgrad.cluster import tensorboard

    monkeypatch.setattr(tensorboard, "installed", lambda: True)
    monkeypatch.setattr(tensorboard, "command", lambda log_dir, host: [sys.executable, "-c", script])


def test_run_returns_while_tensorboard_starts_and_its_url_is_waited_for(tmp_path, monkeypatch):
    go = tmp_path / "go"
    _fake_tensorboard(
        monkeypatch,
        "import os, sys, time\n"
        f"for _ in range(300):\n    if os.path.exists({str(go)!r}): break\n    time.sleep(0.1)\n"
        "else:\n    sys.exit(9)\n"
        "print('TensorBoard 9.9 at http://127.0.0.1:4711/ (Press CTRL+C to quit)', flush=True)\n"
        "time.sleep(60)\n",
    )
    cluster, lines = _tensorboard_cluster(tmp_path)
    go.touch()  # only now can the fake TensorBoard report its URL: run() did not wait for it
    assert cluster.tensorboard_url() == "http://127.0.0.1:4711", lines
    cluster.shutdown(timeout=60)
    assert any("TensorBoard at http://127.0.0.1:4711" in str(line) for line in lines), lines


def test_a_tensorboard_that_exits_is_reported_with_its_code_and_output(tmp_path, monkeypatch):
    _fake_tensorboard(monkeypatch, "import sys\nprint('no such log dir', flush=True)\nsys.exit(3)\n")
    cluster, lines = _tensorboard_cluster(tmp_path)
    assert cluster.tensorboard_url() is None
    cluster.shutdown(timeout=60)
    text = "\n".join(str(line) for line in lines)
    assert "TensorBoard exited with code 3 before it reported its URL" in text and "no such log dir" in text, text


def test_sys_exit_zero_is_success_and_nonzero_a_failure(tmp_path):
    cluster = sparkgrad.local.run(cluster_nodes.exit_with, {"target": "worker:0", "code": 0}, 2, 0, output=_quiet)
    cluster.shutdown(timeout=60)
    assert cluster.results == {0: None, 1: "returned"}
    cluster = sparkgrad.local.run(cluster_nodes.exit_with, {"target": "worker:1", "code": 3}, 2, 0, output=_quiet)
    with pytest.raises(NodeFailure, match="exited with code 3") as info:
        cluster.shutdown(timeout=60)
    assert (info.value.role, info.value.index) == ("worker", 1)


def test_a_frozen_node_is_lost_after_heartbeat_timeout_and_killed(tmp_path):
    args = {"dir": str(tmp_path), "target": "worker:1"}
    cluster = sparkgrad.local.run(
        cluster_nodes.freeze_target, args, 3, 1, output=_quiet, heartbeat_timeout=2.0, stop_grace=1.0
    )
    started = time.monotonic()
    with pytest.raises(NodeFailure, match="lost") as info:
        cluster.shutdown(timeout=60)
    assert (info.value.role, info.value.index) == ("worker", 1)
    assert time.monotonic() - started < 15  # 2 s of silence, then stop, terminate (and kill if need be)
    _assert_all_gone(cluster)


def _env_of_two_threads(args, ctx):
    """map_fun of two nodes run as threads of one process: what each sees, read while both are in map_fun."""
    import sparkgrad.hvd as hvd

    args["both_in"].wait(30)  # an export by either node would now show in the other's view
    hvd.init(timeout=30)
    total = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum)
    args["seen"][ctx.executor_id] = {
        "env": dict(ctx.env),
        "process_tf_config": os.environ.get("TF_CONFIG"),
        "process_test_var": os.environ.get("SPARKGRAD_TEST_VAR"),
        "hvd": (hvd.rank(), hvd.size(), float(total[0])),
    }
    args["both_in"].wait(30)  # neither returns (and restores anything) before the other has looked


def test_nodes_in_threads_of_one_process_each_see_their_own_environment(monkeypatch):
    from sparkgrad.cluster.driver import Cluster, new_secret
    from sparkgrad.cluster.local import DriverThreadLauncher
    from sparkgrad.cluster.node import NodeConfig
    from sparkgrad.cluster.roles import InputMode, build_template
    from sparkgrad.cluster.transport import net

    monkeypatch.setenv("SPARKGRAD_TEST_VAR", "the driver's")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    template = build_template(2, 0, None, False)
    secret = new_secret()
    server = net().RendezvousServer(secret, 2, "127.0.0.1", 0)
    cfg = NodeConfig(
        driver_host="127.0.0.1", driver_port=server.port, secret=secret, template=template, register_timeout=30,
        env=(("SPARKGRAD_TEST_VAR", "the nodes'"),),
    )  # fmt: skip
    args = {"both_in": threading.Barrier(2), "seen": {}}
    launcher = DriverThreadLauncher(cfg, (0, 1), _env_of_two_threads, args, host="127.0.0.1")
    cluster = Cluster(
        template=template, server=server, launchers=[launcher], input_mode=InputMode.TENSORFLOW, stop_grace=1.0,
        output=_quiet, secret=secret,
    )  # fmt: skip
    cluster.start(30)
    cluster.shutdown(timeout=60)
    seen = args["seen"]
    assert sorted(seen) == [0, 1]
    for eid, view in seen.items():
        assert json.loads(view["env"]["TF_CONFIG"])["task"] == {"type": "worker", "index": eid}
        assert view["env"]["SPARKGRAD_TEST_VAR"] == "the nodes'"
        # neither thread exported its TF_CONFIG or env= into the process they share
        assert view["process_tf_config"] is None and view["process_test_var"] == "the driver's"
    # each thread formed its own communicator: ranks 0 and 1 of 2, and the sum of both
    assert sorted(v["hvd"] for v in seen.values()) == [(0, 2, 3.0), (1, 2, 3.0)]
    assert os.environ["SPARKGRAD_TEST_VAR"] == "the driver's" and "TF_CONFIG" not in os.environ


def test_thread_output_routing_forwards_only_the_node_thread_and_passes_the_rest_through(capsys):
    """What a ps thread of the driver (driver_ps_nodes) does to sys.stdout and sys.stderr."""
    import sys

    from sparkgrad.cluster.node import _route_thread_output

    sent: list[str] = []
    before = sys.stdout, sys.stderr
    other_done = threading.Event()

    def other_thread() -> None:
        print("from another thread")
        other_done.set()

    with _route_thread_output(sent.append):
        print("from the node thread")
        print("to stderr", file=sys.stderr)
        sys.stdout.writelines(["a", "b\n"])
        t = threading.Thread(target=other_thread)
        t.start()
        t.join(10)
        assert other_done.is_set()
        # everything but write goes to the real stream: encoding, fileno, isatty
        assert sys.stdout.encoding == before[0].encoding
        assert sys.stdout.isatty() == before[0].isatty()
        # a second node thread shares the router; its end leaves this thread's route in place
        second: list[str] = []

        def second_node() -> None:
            with _route_thread_output(second.append):
                print("node two")

        t = threading.Thread(target=second_node)
        t.start()
        t.join(10)
        print("still routed")
    assert (sys.stdout, sys.stderr) == before
    assert sent == ["from the node thread", "to stderr", "ab", "still routed"]
    assert second == ["node two"]
    assert capsys.readouterr().out == "from another thread\n"


def test_thread_output_routing_survives_a_missing_stream(monkeypatch):
    import sys

    from sparkgrad.cluster.node import _route_thread_output

    monkeypatch.setattr(sys, "stdout", None)  # pythonw, some services: print() then writes nowhere
    sent: list[str] = []
    done: list[int] = []
    with _route_thread_output(sent.append):
        t = threading.Thread(target=lambda: done.append(sys.stdout.write("lost")))
        t.start()
        t.join(10)
        print("kept")
    assert sys.stdout is None and done == [4] and sent == ["kept"]
