"""The transport across network namespaces: nodes on different addresses.

Three namespaces made by this test (names carry its pid) on a private test
subnet that exists only inside them: the driver's namespace is the hub, one
veth pair to each node namespace (10.213.1.0/24 and 10.213.2.0/24) and it
forwards between them, so the nodes reach each other by a route, not over
loopback. The driver runs a RendezvousServer; node 0 (ps) registers from
10.213.1.2 and serves its shard with Adam; node 1 (worker) registers from
10.213.2.2, takes the ps address from the spec and trains against it. The
spec must carry each node's own address, and the ps result must equal Adam
applied locally. Skipped with a message where namespaces cannot be made
(no `ip`, not root, no CAP_NET_ADMIN); everything is torn down in a finally.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from sparkgrad.nn import optimizers

pytestmark = pytest.mark.timeout(120)

TOTAL = 64
STEPS = 6
LR = 0.05

NODE_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    from sparkgrad import _core

    role, my_host, driver_host, out = sys.argv[1:5]
    secret = bytes.fromhex(os.environ["SG_NETNS_SECRET"])
    total, steps, lr = int(os.environ["SG_TOTAL"]), int(os.environ["SG_STEPS"]), float(os.environ["SG_LR"])
    port_file = os.environ["SG_DRIVER_PORT_FILE"]

    if role == "driver":
        with _core.RendezvousServer(secret, 2, "0.0.0.0", 0) as srv:
            with open(port_file + ".tmp", "w") as f:
                f.write(str(srv.port))
            os.rename(port_file + ".tmp", port_file)  # bound and listening from here on
            spec = srv.wait(30.0)
            events = []
            while sum(e["type"] in ("done", "error", "lost") for e in events) < 2:
                e = srv.next_event(30.0)
                if e is None:
                    raise SystemExit("driver: no event from the nodes within 30 s; got %r" % events)
                events.append(e)
            json.dump({"spec": spec, "events": events}, open(out, "w"))
        sys.exit(0)

    eid = 0 if role == "ps" else 1
    port = int(open(port_file).read())
    lis = _core.Listener(my_host, 0)
    node = {"host": my_host, "port": lis.port, "role": role, "index": 0, "executor_id": eid, "pid": os.getpid()}
    with _core.ControlClient.register(driver_host, port, secret, node, 30.0) as ctl:
        spec = ctl.spec
        init = np.linspace(-1, 1, total, dtype=np.float32)
        if role == "ps":
            srv = _core.PsServer(lis, secret, 0, total, total, 1, mode="async", params=init,
                                 optimizer={"kind": "adam", "lr": lr})
            reason = srv.serve(timeout=30.0)
            params, step, (opt_step, slots) = srv.get_state()
            ctl.done(json.dumps({"reason": reason, "step": step, "opt_step": opt_step}))
            np.save(out, params)
        else:
            ps = [(n["host"], n["port"]) for n in spec if n["role"] == "ps"]
            cli = _core.PsClient(ps, secret, total, 0, 30.0)
            params = np.empty(total, np.float32)
            for t in range(steps):
                g = np.random.default_rng(t).standard_normal(total).astype(np.float32)
                cli.push_pull(g, params)
            cli.done()
            cli.close()
            ctl.done(json.dumps({"ps": ps}))
            np.save(out, params)
    lis.close()
    """
)


def _run(cmd: list[str], timeout: float = 15.0) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


class Netns:
    """The namespaces and veth pairs of one test run; delete() removes them all."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.drv, self.n1, self.n2 = f"sgt{tag}d", f"sgt{tag}a", f"sgt{tag}b"
        self.made: list[str] = []
        self.links = [(f"sg{tag}d1", f"sg{tag}a0"), (f"sg{tag}d2", f"sg{tag}b0")]

    def ip(self, *args: str) -> None:
        r = _run(["ip", *args])
        if r.returncode != 0:
            raise RuntimeError(f"`ip {' '.join(args)}` failed: {r.stderr.strip()}")

    def create(self) -> None:
        for ns in (self.drv, self.n1, self.n2):
            self.ip("netns", "add", ns)
            self.made.append(ns)
            self.ip("-n", ns, "link", "set", "lo", "up")
        for k, (node_ns, (hub_if, node_if)) in enumerate(zip((self.n1, self.n2), self.links, strict=True), 1):
            # created inside the hub namespace, so nothing ever appears in the host's namespace
            self.ip("-n", self.drv, "link", "add", hub_if, "type", "veth", "peer", "name", node_if)
            self.ip("-n", self.drv, "link", "set", node_if, "netns", node_ns)
            self.ip("-n", self.drv, "addr", "add", f"10.213.{k}.1/24", "dev", hub_if)
            self.ip("-n", node_ns, "addr", "add", f"10.213.{k}.2/24", "dev", node_if)
            self.ip("-n", self.drv, "link", "set", hub_if, "up")
            self.ip("-n", node_ns, "link", "set", node_if, "up")
            self.ip("-n", node_ns, "route", "add", "default", "via", f"10.213.{k}.1")
        r = _run(["ip", "netns", "exec", self.drv, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
        if r.returncode != 0:
            raise RuntimeError(f"cannot enable forwarding in {self.drv}: {r.stderr.strip()}")

    def delete(self) -> list[str]:
        problems = []
        for ns in reversed(self.made):
            r = _run(["ip", "netns", "del", ns])
            if r.returncode != 0:
                problems.append(f"{ns}: {r.stderr.strip()}")
        self.made.clear()
        return problems


def _skip_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux-only"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed: run .ci/install-system-deps"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_NET_ADMIN); not root here"
    return None


def test_cluster_across_network_namespaces(tmp_path: Path):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    net = Netns()
    procs: list[subprocess.Popen] = []
    try:
        try:
            net.create()
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"network namespaces unavailable on this machine: {exc}")
        script = tmp_path / "node.py"
        script.write_text(NODE_SCRIPT)
        port_file = tmp_path / "driver_port"
        env = dict(
            os.environ,
            SG_NETNS_SECRET=os.urandom(32).hex(),
            SG_TOTAL=str(TOTAL),
            SG_STEPS=str(STEPS),
            SG_LR=str(LR),
            SG_DRIVER_PORT_FILE=str(port_file),
            PYTHONPATH=os.pathsep.join(
                [str(Path(__file__).resolve().parents[1] / "python"), os.environ.get("PYTHONPATH", "")]
            ),
            OMP_NUM_THREADS="1",
        )

        def start(ns: str, *args: str) -> subprocess.Popen:
            p = subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, str(script), *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            procs.append(p)
            return p

        drv_out, ps_out, w_out = tmp_path / "driver.json", tmp_path / "ps.npy", tmp_path / "worker.npy"
        driver = start(net.drv, "driver", "", "", str(drv_out))
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if driver.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the driver did not start listening within 30 s:\n{driver.communicate(timeout=10)[0]}")
            time.sleep(0.05)
        ps = start(net.n1, "ps", "10.213.1.2", "10.213.1.1", str(ps_out))
        worker = start(net.n2, "worker", "10.213.2.2", "10.213.2.1", str(w_out))
        outputs = {}
        for name, p in (("worker", worker), ("ps", ps), ("driver", driver)):
            try:
                outputs[name] = p.communicate(timeout=60)[0]
            except subprocess.TimeoutExpired:
                p.kill()
                outputs[name] = p.communicate(timeout=10)[0]
                pytest.fail(f"{name} did not finish within 60 s:\n{outputs}")
            assert p.returncode == 0, f"{name} exited with {p.returncode}:\n{outputs[name]}"

        result = json.loads(drv_out.read_text())
        spec = result["spec"]
        assert [(n["executor_id"], n["role"], n["host"]) for n in spec] == [
            (0, "ps", "10.213.1.2"),
            (1, "worker", "10.213.2.2"),
        ], spec
        done = {e["executor_id"]: json.loads(e["result"]) for e in result["events"] if e["type"] == "done"}
        assert done[0] == {"reason": "done", "step": STEPS, "opt_step": STEPS}, result["events"]
        assert done[1] == {"ps": [["10.213.1.2", spec[0]["port"]]]}, result["events"]

        want = np.linspace(-1, 1, TOTAL, dtype=np.float32)
        adam = optimizers.Adam(LR, epsilon=1e-8)
        for t in range(STEPS):
            adam.apply(want, np.random.default_rng(t).standard_normal(TOTAL).astype(np.float32))
        np.testing.assert_allclose(np.load(w_out), want, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(np.load(ps_out), np.load(w_out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        problems = net.delete()
        assert not problems, f"could not delete the test namespaces: {problems}"
