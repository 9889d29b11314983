"""Faults against sparkgrad's servers on 127.0.0.1: the port in use, a wrong secret, and a flood of
connections during training (5,000 connect-and-close attempts and 500 slow unauthenticated connections,
against the ps and against the rendezvous, while a local cluster trains)."""

from __future__ import annotations

import json
import os
import resource
import socket
import threading
import time

import fault_nodes
import numpy as np
import pytest
from cluster_checks import port_closed
from sparkgrad import TFCluster, _core
from sparkgrad.errors import AuthError, SparkgradIOError
from standalone import alive, listening_ports

pytestmark = pytest.mark.timeout(180)


def quiet(line: str) -> None:
    pass


def test_port_in_use(fault):
    fault.describe(
        "a node listener and a rendezvous asked to bind a port another socket holds",
        "SparkgradIOError naming host:port and 'address already in use', at once",
    )
    holder = socket.create_server(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    try:
        fault.start()
        with pytest.raises(SparkgradIOError) as lis_err:
            _core.Listener("127.0.0.1", port)
        with pytest.raises(SparkgradIOError) as rdv_err:
            _core.RendezvousServer(os.urandom(32), 2, "127.0.0.1", port)
        seconds = fault.stop()
    finally:
        holder.close()
    for exc in (lis_err.value, rdv_err.value):
        assert f"127.0.0.1:{port}" in str(exc) and "already in use" in str(exc), str(exc)
    assert seconds < 5
    fault.observed(f"{type(lis_err.value).__name__}: {str(lis_err.value)[:160]} (both)")
    fault.leftovers([p for p in listening_ports(os.getpid()) if p == port])


def test_wrong_secret(fault):
    fault.describe(
        "a ps client and a node registering with the wrong secret",
        "AuthError naming the server's host:port; the servers keep serving the right secret",
    )
    secret, wrong = os.urandom(32), os.urandom(32)
    total = 256
    ports_before = listening_ports(os.getpid())
    lis = _core.Listener("127.0.0.1", 0)
    ps = _core.PsServer(lis, secret, 0, total, total, 1, mode="async", lr=0.1, params=np.zeros(total, np.float32))
    served: list[str] = []
    t = threading.Thread(target=lambda: served.append(ps.serve(timeout=60.0)), name="faults-ps")
    t.start()
    rdv = _core.RendezvousServer(secret, 1, "127.0.0.1", 0)
    try:
        fault.start()
        with pytest.raises(AuthError) as ps_err:
            _core.PsClient([("127.0.0.1", lis.port)], wrong, total, 0, 10.0)
        node = {"host": "127.0.0.1", "port": 1, "role": "worker", "index": 0, "executor_id": 0, "pid": os.getpid()}
        with pytest.raises(AuthError) as rdv_err:
            _core.ControlClient.register("127.0.0.1", rdv.port, wrong, node, 10.0)
        seconds = fault.stop()
        assert f"127.0.0.1:{lis.port}" in str(ps_err.value), str(ps_err.value)
        assert f"127.0.0.1:{rdv.port}" in str(rdv_err.value), str(rdv_err.value)
        assert seconds < 10
        # the right secret still works on both
        cli = _core.PsClient([("127.0.0.1", lis.port)], secret, total, 0, 10.0)
        params = np.empty(total, np.float32)
        cli.push_pull(np.ones(total, np.float32), params)
        cli.done()
        cli.close()
        with _core.ControlClient.register("127.0.0.1", rdv.port, secret, node, 10.0) as ctl:
            assert [n["executor_id"] for n in ctl.spec] == [0]
            ctl.done("null")
        t.join(30)
        assert served == ["done"], served
        np.testing.assert_allclose(params, -0.1)
    finally:
        ps.stop()
        t.join(30)
        rdv.close()
        lis.close()
    fault.observed(f"AuthError: {str(ps_err.value)[:120]} | {str(rdv_err.value)[:120]}; right secret then served")
    left = [f"thread {t.name}"] if t.is_alive() else []
    fault.leftovers(left + [f"port {p}" for p in listening_ports(os.getpid()) - ports_before])


def _flood(host: str, port: int, closes: int, slow: int, held: list, stats: dict, key: str) -> None:
    """`closes` connect-and-close attempts, then `slow` connections that send one byte and stay open."""
    refused = 0
    for _ in range(closes):
        s = socket.socket()
        s.settimeout(5)
        try:
            s.connect((host, port))
        except OSError:
            refused += 1
        finally:
            s.close()
    for _ in range(slow):
        s = socket.socket()
        s.settimeout(5)
        try:
            s.connect((host, port))
            s.send(b"\x00")
            held.append(s)
        except OSError:
            refused += 1
            s.close()
    stats[key] = refused


def test_connection_flood_during_training(tmp_path, fault):
    closes, slow = 5000, 500
    fault.describe(
        f"{closes:,} connect-and-close + {slow} slow unauthenticated connections each against the ps and the "
        "rendezvous while 1 ps + 2 workers train (local processes, RLIMIT_NOFILE 1024)",
        "training finishes; every node returns; the flood costs nothing but time",
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2 * slow + 200:
        pytest.skip(f"this test holds {2 * slow} sockets; RLIMIT_NOFILE hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2 * slow + 200), hard))
    done_file = tmp_path / "flood-done"
    args = {"dir": str(tmp_path), "until_file": str(done_file), "nofile": 1024, "seconds": 90}
    held: list[socket.socket] = []
    stats: dict[str, int] = {}
    nodes: dict[str, dict] = {}
    cluster = TFCluster.run(None, fault_nodes.train_until_stopped, args, 3, 1, output=quiet, reservation_timeout=60)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("training-*.json"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in tmp_path.glob("started-*.json"):
            info = json.loads(p.read_text())
            nodes[info["name"]] = info
        ps_port = nodes["ps:0"]["port"]
        rdv = (cluster._server.host, cluster._server.port)
        fault.start()
        floods = [
            threading.Thread(target=_flood, args=("127.0.0.1", ps_port, closes, slow, held, stats, "ps")),
            threading.Thread(target=_flood, args=(*rdv, closes, slow, held, stats, "rendezvous")),
        ]
        for f in floods:
            f.start()
        for f in floods:
            f.join(120)
        done_file.write_text("")
        try:
            cluster.shutdown(timeout=60)
        except Exception as exc:
            fault.stop()
            fault.observed(f"{type(exc).__name__} after {fault.row['seconds']:.1f} s: {str(exc).splitlines()[0]}")
            for s in held:
                s.close()
            fault.row["leftovers"] = "; ".join(_left(nodes)) or "none"
            raise
        seconds = fault.stop()
    finally:
        for s in held:
            s.close()
        done_file.write_text("")
        if not all(launcher.finished() for launcher in cluster._launchers):
            cluster._abort("test teardown")
        cluster._close()
    assert not any(f.is_alive() for f in floods)
    results = cluster.results
    assert set(results) == {0, 1, 2} and all(results[i]["steps"] > 20 for i in (1, 2)), results
    fault.observed(
        f"finished in {seconds:.1f} s; steps {[results[i]['steps'] for i in (1, 2)]}; flood connects refused: {stats}"
    )
    fault.leftovers(_left(nodes))


def _left(nodes: dict[str, dict]) -> list[str]:
    deadline = time.monotonic() + 10
    while any(alive(info["pid"]) for info in nodes.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [f"node {n} alive" for n, info in nodes.items() if alive(info["pid"])]
    return left + [f"port {info['port']} of {n} open" for n, info in nodes.items() if not port_closed(info["port"], 10)]


def test_flood_helper_can_fill_a_listener():
    """The flood reaches a server: every slow connection is accepted by a plain listener."""
    srv = socket.create_server(("127.0.0.1", 0), backlog=128)
    held: list[socket.socket] = []
    stats: dict[str, int] = {}
    accepted = []
    srv.settimeout(0.2)

    def accept() -> None:
        end = time.monotonic() + 30
        while len(accepted) < 60 and time.monotonic() < end:
            try:
                accepted.append(srv.accept()[0])
            except TimeoutError:
                pass

    t = threading.Thread(target=accept)
    t.start()
    try:
        _flood("127.0.0.1", srv.getsockname()[1], 50, 10, held, stats, "x")
        t.join(30)
        assert stats == {"x": 0} and len(held) == 10 and len(accepted) == 60
    finally:
        for s in held + accepted:
            s.close()
        srv.close()
