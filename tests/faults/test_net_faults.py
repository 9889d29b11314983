"""Faults between two hosts: network namespaces A and B joined by one veth pair (a private /24 per run).

Host A (10.214.<k>.1) runs the driver (a RendezvousServer) and the ps; host B
(10.214.<k>.2) runs the worker, which reaches both over the veth link only
(net_node.py: sparkgrad's cluster pieces as plain processes). Faults: the
link taken down mid-training (`ip link set ... down`), and a link delayed
200 ms (`tc netem`; where the kernel has no netem, a user-space relay in A
delays the ps traffic 200 ms each way instead, and the record says so).
Skipped, saying why, where namespaces cannot be made (not root, no `ip`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from standalone import alive

pytestmark = pytest.mark.timeout(150)

HERE = Path(__file__).resolve().parent
PS_PORT, RELAY_PORT = 40001, 40002


def _run(cmd: list[str], timeout: float = 15.0) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


class TwoHosts:
    """Namespaces A and B and the veth pair between them; delete() removes them."""

    def __init__(self) -> None:
        tag = os.getpid() % 100000
        self.k = 1 + os.getpid() % 250
        self.a, self.b = f"sgf{tag}a", f"sgf{tag}b"
        self.if_a, self.if_b = f"sgf{tag}a0", f"sgf{tag}b0"
        self.host_a, self.host_b = f"10.214.{self.k}.1", f"10.214.{self.k}.2"
        self.made: list[str] = []

    def ip(self, *args: str) -> None:
        r = _run(["ip", *args])
        if r.returncode != 0:
            raise RuntimeError(f"`ip {' '.join(args)}` failed: {r.stderr.strip()}")

    def create(self) -> None:
        for ns in (self.a, self.b):
            self.ip("netns", "add", ns)
            self.made.append(ns)
            self.ip("-n", ns, "link", "set", "lo", "up")
        self.ip("-n", self.a, "link", "add", self.if_a, "type", "veth", "peer", "name", self.if_b)
        self.ip("-n", self.a, "link", "set", self.if_b, "netns", self.b)
        self.ip("-n", self.a, "addr", "add", f"{self.host_a}/24", "dev", self.if_a)
        self.ip("-n", self.b, "addr", "add", f"{self.host_b}/24", "dev", self.if_b)
        self.ip("-n", self.a, "link", "set", self.if_a, "up")
        self.ip("-n", self.b, "link", "set", self.if_b, "up")

    def delete(self) -> list[str]:
        problems = []
        for ns in reversed(self.made):
            r = _run(["ip", "netns", "del", ns])
            if r.returncode != 0:
                problems.append(f"{ns}: {r.stderr.strip()}")
        self.made.clear()
        return problems


@pytest.fixture
def hosts():
    if not sys.platform.startswith("linux") or shutil.which("ip") is None:
        pytest.skip("needs Linux and `ip` (iproute2: .ci/install-system-deps installs it)")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CAP_NET_ADMIN)")
    net = TwoHosts()
    try:
        try:
            net.create()
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"network namespaces unavailable here: {exc}")
        yield net
    finally:
        problems = net.delete()
        assert not problems, f"could not delete the namespaces: {problems}"


class Procs:
    """The processes of one test, each in a namespace; kill_all() in teardown."""

    def __init__(self, tmp: Path, env: dict) -> None:
        self.tmp, self.env, self.procs = tmp, env, {}

    def start(self, name: str, ns: str, *args: str, script: str = "net_node.py") -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "wb")
        p = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, str(HERE / script), *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        self.procs[name] = p
        return p

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def wait(self, name: str, timeout: float) -> int | None:
        try:
            return self.procs[name].wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill_all(self) -> list[str]:
        left = []
        for name, p in self.procs.items():
            if p.poll() is None:
                left.append(name)
                p.kill()
                p.wait(10)
        return left


def _wait_file(path: Path, timeout: float, procs: Procs) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        dead = [n for n, p in procs.procs.items() if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            logs = {n: procs.log(n) for n in procs.procs}
            raise AssertionError(f"no {path.name} within {timeout} s (ended: {dead}):\n{logs}")
        time.sleep(0.05)


def _start_cluster(net: TwoHosts, tmp: Path, **env_extra: str) -> Procs:
    env = dict(
        os.environ,
        SG_SECRET=os.urandom(32).hex(),
        SG_PORT_FILE=str(tmp / "driver_port"),
        SG_PS_PORT=str(PS_PORT),
        PYTHONPATH=str(HERE.parents[1] / "python"),
        OMP_NUM_THREADS="1",
        **env_extra,
    )
    procs = Procs(tmp, env)
    procs.start("driver", net.a, "driver", net.host_a, str(tmp / "driver.json"))
    _wait_file(tmp / "driver_port", 30, procs)
    procs.start("ps", net.a, "ps", net.host_a, net.host_a, str(tmp / "ps.json"))
    procs.start("worker", net.b, "worker", net.host_b, net.host_a, str(tmp / "worker.json"))
    return procs


def _no_listeners(net: TwoHosts) -> list[str]:
    """Listening TCP sockets left in either namespace."""
    left = []
    for ns in (net.a, net.b):
        r = _run(["ip", "netns", "exec", ns, "cat", "/proc/net/tcp"])
        for line in r.stdout.splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A":
                left.append(f"{ns} listens on port {int(cols[1].rsplit(':', 1)[1], 16)}")
    return left


def test_link_down_between_worker_and_ps(hosts, tmp_path, fault):
    fault.describe(
        "the worker host's link taken down (ip link set down) mid-training; worker ps timeout 5 s, heartbeat 3 s",
        "worker: SparkgradTimeout naming the ps host:port; driver: worker lost (no heartbeat) naming its host",
    )
    procs = _start_cluster(hosts, tmp_path, SG_TIMEOUT="5", SG_HEARTBEAT="3")
    try:
        _wait_file(tmp_path / "worker.json.training", 60, procs)
        fault.start()
        hosts.ip("-n", hosts.b, "link", "set", hosts.if_b, "down")
        codes = {name: procs.wait(name, 40) for name in ("worker", "driver", "ps")}
        seconds = fault.stop()
        assert None not in codes.values(), f"still running 40 s after the link went down: {codes}"
        worker = json.loads((tmp_path / "worker.json").read_text())
        drv = json.loads((tmp_path / "driver.json").read_text())
        ps = json.loads((tmp_path / "ps.json").read_text())
        assert codes["worker"] == 3 and worker["error"] == "SparkgradTimeout", worker
        assert f"{hosts.host_a}:{PS_PORT}" in worker["message"], worker
        lost = [e for e in drv["events"] if e["type"] == "lost"]
        assert [e["executor_id"] for e in lost] == [1], drv["events"]
        assert "no heartbeat" in lost[0]["reason"] and hosts.host_b in lost[0]["reason"], lost
        assert codes["ps"] == 0 and ps["reason"] in ("stopped", "stop"), ps
        fault.observed(
            f"worker: {worker['error']}: {worker['message'][:110]}; driver: worker lost, {lost[0]['reason'][:60]}; "
            f"ps {ps['reason']}; every process ended {seconds:.1f} s after the link went down"
        )
        left = [f"{n} still running" for n, c in codes.items() if c is None] + _no_listeners(hosts)
    finally:
        left_running = procs.kill_all()
    fault.leftovers(left + left_running)


def _has_netem(net: TwoHosts) -> bool:
    """Delays both ends' egress by 200 ms (each way, as the relay does), if the kernel has netem."""
    for ns, dev in ((net.a, net.if_a), (net.b, net.if_b)):
        r = _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "netem", "delay", "200ms"])
        if r.returncode != 0:
            if ns == net.b:
                raise RuntimeError(f"netem on {net.if_a} but not on {dev}: {r.stderr.strip()}")
            return False
    return True


def test_delayed_link_200ms(hosts, tmp_path, fault):
    steps = 15
    netem = shutil.which("tc") is not None and _has_netem(hosts)
    how = (
        "tc netem delay 200ms on both ends of the veth"
        if netem
        else "200 ms each way by a relay (this kernel has no netem)"
    )
    fault.describe(f"a link delayed 200 ms ({how}); {steps} push_pull steps", "training finishes, every step served")
    extra = {"SG_STEPS": str(steps), "SG_TIMEOUT": "10", "SG_HEARTBEAT": "5"}
    relay_env = {}
    if not netem:
        relay_env = {"SG_PS_ADDRESS": f"{hosts.host_a}:{RELAY_PORT}"}
    procs = Procs(tmp_path, dict(os.environ, PYTHONPATH=str(HERE.parents[1] / "python")))
    try:
        if not netem:
            procs.start(
                "relay",
                hosts.a,
                hosts.host_a,
                str(RELAY_PORT),
                hosts.host_a,
                str(PS_PORT),
                "0.2",
                "90",
                script="delay_relay.py",
            )
        fault.start()
        cluster = _start_cluster(hosts, tmp_path, **extra, **relay_env)
        procs.procs.update(cluster.procs)
        procs.env = cluster.env
        codes = {name: procs.wait(name, 60) for name in ("worker", "ps", "driver")}
        seconds = fault.stop()  # start of the processes to the end of all three
        logs = {n: procs.log(n) for n in ("worker", "ps", "driver")}
        assert codes == {"worker": 0, "ps": 0, "driver": 0}, (codes, logs)
        worker = json.loads((tmp_path / "worker.json").read_text())
        ps = json.loads((tmp_path / "ps.json").read_text())
        assert worker["steps"] == steps and ps["step"] == steps and ps["reason"] == "done", (worker, ps)
        # the delay was real: each push_pull is at least one 400 ms round trip
        assert worker["seconds"] >= steps * 0.4, worker
        fault.observed(f"finished: {steps} steps in {worker['seconds']:.1f} s (worker), all done in {seconds:.1f} s")
        if "relay" in procs.procs:
            procs.procs["relay"].kill()
            procs.procs["relay"].wait(10)
        left = _no_listeners(hosts)
    finally:
        left_running = [n for n in procs.kill_all() if n != "relay"]
    fault.leftovers(left + left_running)


def test_leftover_check_sees_a_live_process(tmp_path):
    """The leftover checks above can fail: a live process is seen as alive, an ended one is not."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert alive(p.pid)
    finally:
        p.kill()
        p.wait(10)
    assert not alive(p.pid)
