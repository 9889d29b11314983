"""Rendezvous server (driver) and control client (node) over loopback.

Every wait is bounded; a hang fails through pytest-timeout.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import net_raw
import pytest
from sparkgrad import _core, errors
from tamper_relay import HANDSHAKE_C2S, HANDSHAKE_S2C, HEADER, SEQ, TamperRelay

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def secret() -> bytes:
    return os.urandom(32)


def register_all(port: int, secret: bytes, ids: list[int], timeout: float = 10.0, **kw):
    """Registers each executor id from its own thread; returns (clients, errors) by id."""
    clients: dict[int, _core.ControlClient] = {}
    failures: dict[int, BaseException] = {}

    def run(eid: int) -> None:
        try:
            clients[eid] = _core.ControlClient.register("127.0.0.1", port, secret, net_raw.node(eid), timeout, **kw)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            failures[eid] = exc

    threads = [threading.Thread(target=run, args=(eid,)) for eid in ids]
    for t in threads:
        t.start()
    return threads, clients, failures


def join(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a registering thread did not finish"


def test_rendezvous_forms_cluster_and_streams_events(secret):
    with _core.RendezvousServer(secret, 5, "127.0.0.1", 0) as srv:
        assert srv.port > 0 and srv.num_nodes == 5
        threads, clients, failures = register_all(srv.port, secret, [3, 1, 4, 0, 2])
        spec = srv.wait(10.0)
        join(threads)
        assert not failures
        assert [n["executor_id"] for n in spec] == [0, 1, 2, 3, 4]
        assert spec[3] == net_raw.node(3)
        assert all(c.spec == spec for c in clients.values())

        clients[1].log("epoch 1")
        clients[2].metric("loss", 0.25, 7)
        clients[3].error("ValueError: boom", "Traceback ...", "hostX")
        clients[4].done('{"accuracy": 0.9}')
        events = [srv.next_event(5.0) for _ in range(4)]
        by_type = {e["type"]: e for e in events}
        assert by_type["log"] == {"type": "log", "executor_id": 1, "role": "worker", "index": 1, "line": "epoch 1"}
        assert by_type["metric"]["name"] == "loss" and by_type["metric"]["value"] == 0.25
        assert by_type["metric"]["step"] == 7
        assert by_type["error"]["host"] == "hostX" and by_type["error"]["traceback"] == "Traceback ..."
        assert by_type["done"]["result"] == '{"accuracy": 0.9}'

        srv.send(0, {"type": "stop", "reason": "test"})
        assert clients[0].recv(5.0) == {"type": "stop", "reason": "test"}
        assert clients[1].recv(0.05) is None
        assert srv.broadcast({"type": "ping"}) == 5
        assert all(c.recv(5.0) == {"type": "ping"} for c in clients.values())

        # done/error nodes leave quietly; the others are lost when they go.
        for eid in (3, 4):
            clients[eid].close()
        clients[0].close()
        lost = srv.next_event(5.0)
        assert lost["type"] == "lost" and lost["executor_id"] == 0 and "closed" in lost["reason"]
        assert srv.next_event(0.2) is None
        for c in clients.values():
            c.close()


def test_wait_timeout_names_missing_executor_ids(secret):
    with _core.RendezvousServer(secret, 4, "127.0.0.1", 0) as srv:
        threads, clients, failures = register_all(srv.port, secret, [0, 2], timeout=1.0)
        with pytest.raises(errors.RendezvousTimeout) as info:
            srv.wait(0.5)
        msg = str(info.value)
        assert "2 of 4 nodes registered" in msg
        assert "(executor ids [0, 2])" in msg and "missing executor ids [1, 3]" in msg
        join(threads)
        assert not clients and set(failures) == {0, 2}
        assert all(isinstance(e, errors.RendezvousTimeout) for e in failures.values())
        assert any("of 4 nodes had registered" in str(e) for e in failures.values())


def test_reregistration_replaces_the_earlier_entry(secret):
    # A raw peer speaks plain frames after the handshake: security="none" at both ends.
    with _core.RendezvousServer(secret, 2, "127.0.0.1", 0, security="none") as srv:
        old = net_raw.connect(srv.port)
        net_raw.client_auth(old, secret)
        net_raw.send_json(old, {"type": "register", "node": net_raw.node(0, port=1111)})
        assert net_raw.recv_json(old) == {"type": "registered", "registered": 1, "num_nodes": 2}
        # The retried task registers executor 0 again, from elsewhere.
        threads, clients, failures = register_all(srv.port, secret, [0], security="none")
        deadline = time.monotonic() + 5
        while srv.stats()["registrations"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.stats()["registered"] == 1
        assert old.recv(1) == b""  # the replaced connection is closed
        old.close()
        threads2, clients2, failures2 = register_all(srv.port, secret, [1], security="none")
        spec = srv.wait(10.0)
        join(threads + threads2)
        assert not failures and not failures2
        assert spec[0]["port"] == 0 and len(spec) == 2
        assert srv.next_event(0.2) is None  # replacing is not a loss
        for c in (*clients.values(), *clients2.values()):
            c.close()


def test_unauthenticated_junk_client_is_rejected_without_disturbing_others(secret):
    with _core.RendezvousServer(secret, 2, "127.0.0.1", 0) as srv:
        junk = net_raw.connect(srv.port)
        threads, clients, failures = register_all(srv.port, secret, [0, 1])
        junk.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        spec = srv.wait(10.0)
        join(threads)
        assert not failures and len(spec) == 2
        # Server sent its challenge, then closed on the junk.
        data = b""
        while chunk := junk.recv(4096):
            data += chunk
        assert data[:4] == net_raw.frame(net_raw.AUTH_CHALLENGE, b"x" * 32)[:4]
        junk.close()
        stats = srv.stats()
        assert stats["auth_failures"] == 1 and "bad frame magic" in stats["last_rejection"]
        for c in clients.values():
            c.close()


def test_wrong_secret_is_auth_error_on_client_and_noted_on_server(secret):
    with _core.RendezvousServer(secret, 1, "127.0.0.1", 0) as srv:
        with pytest.raises(
            errors.AuthError, match=f"127.0.0.1:{srv.port} closed the connection during authentication: it refused our"
        ):
            _core.ControlClient.register("127.0.0.1", srv.port, os.urandom(32), net_raw.node(0), 5.0)
        stats = srv.stats()
        assert stats["auth_failures"] == 1 and "failed the HMAC challenge" in stats["last_rejection"]
        assert stats["registered"] == 0


def test_client_rejects_a_server_that_does_not_hold_the_secret(secret):
    with socket.create_server(("127.0.0.1", 0)) as fake:
        port = fake.getsockname()[1]

        def impostor() -> None:
            conn, _ = fake.accept()
            with conn:
                conn.sendall(net_raw.frame(net_raw.AUTH_CHALLENGE, os.urandom(32)))
                net_raw.recv_frame(conn)
                conn.sendall(net_raw.frame(net_raw.AUTH_OK, os.urandom(32)))
                conn.recv(1)

        t = threading.Thread(target=impostor)
        t.start()
        with pytest.raises(errors.AuthError, match="failed to prove it holds the cluster secret"):
            _core.ControlClient.register("127.0.0.1", port, secret, net_raw.node(0), 5.0, security="none")
        t.join(10)


def test_oversized_frame_is_rejected_from_its_header():
    # 12 header bytes announcing 2 GiB: refused at once, nothing allocated or awaited.
    header = net_raw.frame(net_raw.JSON, length=2**31)
    with pytest.raises(errors.FrameTooLargeError, match="2147483648 payload bytes, above the maximum of 67108864"):
        _core._frame_decode(header)
    with pytest.raises(errors.FrameTooLargeError):
        _core._frame_decode(net_raw.frame(net_raw.JSON, b"x" * 101), 100)


def test_oversized_frame_from_an_authenticated_node_is_dropped(secret):
    with _core.RendezvousServer(secret, 1, "127.0.0.1", 0, security="none") as srv:
        sock = net_raw.connect(srv.port)
        net_raw.client_auth(sock, secret)
        sock.sendall(net_raw.frame(net_raw.JSON, length=100 << 20))
        assert sock.recv(1) == b""
        sock.close()
        assert srv.stats()["protocol_errors"] == 1
        assert "above the maximum" in srv.stats()["last_rejection"]
        threads, clients, failures = register_all(srv.port, secret, [0], security="none")
        assert len(srv.wait(10.0)) == 1
        join(threads)
        clients[0].close()


def test_garbage_frames_are_protocol_errors():
    good = net_raw.frame(net_raw.JSON, b'{"type":"x"}')
    with pytest.raises(errors.ProtocolError, match="bad frame magic"):
        _core._frame_decode(b"\x00" * 12 + good)
    with pytest.raises(errors.ProtocolError, match="unsupported frame version 9"):
        _core._frame_decode(good[:4] + b"\x09" + good[5:])
    with pytest.raises(errors.ProtocolError, match="unknown frame type 200"):
        _core._frame_decode(good[:5] + b"\xc8" + good[6:])


def test_frame_parser_resumes_across_any_split():
    frames = [(net_raw.JSON, 0, b'{"type":"a"}'), (net_raw.HEARTBEAT, 0, b""), (net_raw.JSON, 3, b"x" * 1000)]
    data = b"".join(net_raw.frame(t, p, f) for t, f, p in frames) + net_raw.frame(net_raw.JSON, b"tail")[:7]
    for chunk in (1, 5, 12, 13, 4096):
        decoded, pending = _core._frame_decode(data, 2000, chunk)
        assert decoded == frames and pending == 7
    assert _core._frame_encode(net_raw.JSON, 3, b"x" * 1000) == net_raw.frame(net_raw.JSON, b"x" * 1000, 3)


def test_garbage_from_the_driver_is_a_protocol_error_on_the_node(secret):
    with socket.create_server(("127.0.0.1", 0)) as fake:
        port = fake.getsockname()[1]

        def garbage_driver() -> None:
            conn, _ = fake.accept()
            with conn:
                net_raw.server_auth(conn, secret)
                net_raw.recv_frame(conn)  # the registration
                conn.sendall(b"\xde\xad\xbe\xef" * 8)
                conn.recv(1)

        t = threading.Thread(target=garbage_driver)
        t.start()
        with pytest.raises(errors.ProtocolError, match=f"from driver 127.0.0.1:{port}: bad frame magic"):
            _core.ControlClient.register("127.0.0.1", port, secret, net_raw.node(0), 5.0, security="none")
        t.join(10)


def test_port_already_in_use_is_a_clear_error(secret):
    with _core.Listener("127.0.0.1", 0) as held:
        assert held.port > 0 and held.host == "127.0.0.1" and held.fileno() >= 0
        with pytest.raises(errors.SparkgradIOError, match=f"127.0.0.1:{held.port}: address already in use"):
            _core.Listener("127.0.0.1", held.port)
        with pytest.raises(errors.SparkgradIOError, match="already in use"):
            _core.RendezvousServer(secret, 1, "127.0.0.1", held.port)
    assert held.closed
    with pytest.raises(errors.StateError):
        held.fileno()


def test_listener_accepts_connections_from_construction():
    with _core.Listener("127.0.0.1", 0) as lis:
        with socket.create_connection(("127.0.0.1", lis.port), timeout=5):
            pass


def test_connect_refused_names_host_and_port(secret):
    with _core.Listener("127.0.0.1", 0) as lis:
        port = lis.port
    with pytest.raises(errors.SparkgradIOError, match=f"rendezvous: cannot connect to 127.0.0.1:{port}"):
        _core.ControlClient.register("127.0.0.1", port, secret, net_raw.node(0), 2.0)


def test_bad_arguments_are_rejected(secret):
    with pytest.raises(errors.InvalidArgumentError, match="secret must be 16"):
        _core.RendezvousServer(b"short", 1)
    with pytest.raises(errors.InvalidArgumentError, match="num_nodes"):
        _core.RendezvousServer(secret, 0)
    with _core.RendezvousServer(secret, 2, "127.0.0.1", 0) as srv:
        with pytest.raises(errors.InvalidArgumentError, match="timeout"):
            srv.wait(-1)
        with pytest.raises(errors.ClusterError, match="executor 1 is not connected \\(never registered\\)"):
            srv.send(1, {"type": "stop"})
        with pytest.raises(TypeError):
            srv.send(0, ["not", "a", "dict"])
        with pytest.raises(errors.ClusterError, match="executor_id 7 .* outside 0..1"):
            _core.ControlClient.register("127.0.0.1", srv.port, secret, net_raw.node(7), 5.0)
        srv.close()
        with pytest.raises(errors.StateError, match="closed"):
            srv.wait(1.0)
    with pytest.raises(TypeError, match="ControlClient.register"):
        _core.ControlClient()


def test_driver_stop_before_the_spec_cancels_registration(secret):
    with _core.RendezvousServer(secret, 2, "127.0.0.1", 0) as srv:
        threads, clients, failures = register_all(srv.port, secret, [0])
        deadline = time.monotonic() + 5
        while srv.stats()["registered"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.broadcast({"type": "stop"}) == 1
        join(threads)
        assert isinstance(failures[0], errors.CancelledError)


NODE_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from sparkgrad import _core
    port, secret = int(sys.argv[1]), bytes.fromhex(sys.argv[2])
    node = {"host": "127.0.0.1", "port": 0, "role": "ps", "index": 0, "executor_id": 0, "pid": os.getpid()}
    c = _core.ControlClient.register("127.0.0.1", port, secret, node, 10.0, heartbeat_interval=0.2)
    print("registered", flush=True)
    if sys.argv[3] == "exit":
        os._exit(3)
    time.sleep(60)
    """
)


ORPHAN_SCRIPT = textwrap.dedent(
    """
    import ctypes, sys
    from net_raw import node
    from sparkgrad import _core
    secret = bytes.fromhex(sys.argv[1])
    closed = _core.ControlClient.register("127.0.0.1", int(sys.argv[2]), secret, node(0), 10.0)
    closed.exit_when_orphaned(0.01, 78, "the closed client's guard ended the process")
    closed.close()
    del closed  # freeing the client joins its guard thread: this one can end nothing any more
    kept = _core.ControlClient.register("127.0.0.1", int(sys.argv[3]), secret, node(0), 10.0)
    kept.exit_when_orphaned(0.2, 77, "orphaned: ending the process")
    print("armed", flush=True)
    ctypes.PyDLL(None).pause()  # holds the GIL: no Python thread of this process runs again
    """
)


def test_the_orphan_guard_ends_a_process_whose_python_is_stuck_once_its_driver_is_gone(secret):
    """The guard needs no GIL; a client closed before its driver went (the first server stops first) never
    ends the process."""
    with (
        _core.RendezvousServer(secret, 1, "127.0.0.1", 0) as first,
        _core.RendezvousServer(secret, 1, "127.0.0.1", 0) as second,
    ):
        proc = subprocess.Popen(
            [sys.executable, "-c", ORPHAN_SCRIPT, secret.hex(), str(first.port), str(second.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        try:
            assert proc.stdout.readline().strip() == b"armed", proc.stderr.read()
            first.close()  # its client closed before: that guard had returned
            second.close()
            code = proc.wait(30)
        finally:
            proc.kill()
        assert code == 77, proc.stderr.read()
        assert proc.stderr.read().decode().strip() == "orphaned: ending the process"


def test_the_orphan_guard_takes_its_arguments_once_and_checks_them(secret):
    with _core.RendezvousServer(secret, 1, "127.0.0.1", 0) as srv:
        client = _core.ControlClient.register("127.0.0.1", srv.port, secret, net_raw.node(0), 10.0)
        with pytest.raises(errors.InvalidArgumentError, match=r"after must be in \(0, 86400\] seconds, got 0"):
            client.exit_when_orphaned(0, 1, "x")
        with pytest.raises(errors.InvalidArgumentError, match=r"exit status must be in \[0, 255\], got 256"):
            client.exit_when_orphaned(1.0, 256, "x")
        client.exit_when_orphaned(86400, 1, "x")
        with pytest.raises(errors.StateError, match="already has its orphan guard"):
            client.exit_when_orphaned(86400, 1, "x")
        client.close()


@pytest.mark.parametrize("how", ["sigkill", "exit", "sigstop"])
def test_a_node_that_dies_or_stalls_is_lost_within_heartbeat_timeout(secret, how):
    with _core.RendezvousServer(secret, 1, "127.0.0.1", 0) as srv:
        srv.heartbeat_timeout = 1.0
        proc = subprocess.Popen(
            [sys.executable, "-c", NODE_SCRIPT, str(srv.port), secret.hex(), how],
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        try:
            assert proc.stdout.readline().strip() == b"registered"
            assert srv.wait(5.0)[0]["pid"] == proc.pid
            t0 = time.monotonic()
            if how == "sigkill":
                proc.send_signal(signal.SIGKILL)
            elif how == "sigstop":
                proc.send_signal(signal.SIGSTOP)
            event = srv.next_event(10.0)
            elapsed = time.monotonic() - t0
        finally:
            proc.kill()
            proc.wait(10)
        assert event is not None and event["type"] == "lost"
        assert event["executor_id"] == 0 and event["role"] == "ps" and event["host"] == "127.0.0.1"
        if how == "sigstop":  # silent but connected: lost once the heartbeat timeout passed, not before
            assert "no heartbeat" in event["reason"] and 1.0 * 0.9 <= elapsed < 1.0 + 5
        else:  # the closed connection itself, not the heartbeat timeout, made it lost
            assert "closed the connection" in event["reason"] or "reset" in event["reason"]


def test_node_notices_a_driver_that_went_silent(secret):
    with socket.create_server(("127.0.0.1", 0)) as fake:
        port = fake.getsockname()[1]
        release = threading.Event()

        def silent_driver() -> None:
            conn, _ = fake.accept()
            with conn:
                net_raw.server_auth(conn, secret)
                net_raw.recv_frame(conn)  # the registration
                net_raw.send_json(conn, {"type": "registered", "registered": 1, "num_nodes": 1})
                net_raw.send_json(conn, {"type": "spec", "spec": [net_raw.node(0)]})
                release.wait(20)  # then nothing: no heartbeat, no FIN (a host that vanished)

        t = threading.Thread(target=silent_driver)
        t.start()
        try:
            c = _core.ControlClient.register(
                "127.0.0.1", port, secret, net_raw.node(0), 5.0, driver_timeout=2.0, security="none"
            )
            assert c.spec == [net_raw.node(0)]
            t0 = time.monotonic()
            with pytest.raises(errors.SparkgradTimeout, match=f"no message or heartbeat from driver 127.0.0.1:{port}"):
                c.recv(30.0)
            # at least driver_timeout (2 s) of silence, and well before recv's own 30 s
            assert 2.0 * 0.9 <= time.monotonic() - t0 < 2.0 + 15
            c.close()
        finally:
            release.set()
            t.join(10)


def test_driver_heartbeats_keep_an_idle_node_connected(secret):
    with _core.RendezvousServer(secret, 1, "127.0.0.1", 0) as srv:
        c = _core.ControlClient.register("127.0.0.1", srv.port, secret, net_raw.node(0), 5.0, driver_timeout=2.0)
        # waiting longer than driver_timeout with nothing to receive: only the driver's heartbeats keep it from
        # raising "no message or heartbeat" (see test_node_notices_a_driver_that_went_silent)
        assert c.recv(3.0) is None
        c.log("alive")
        assert srv.next_event(2.0)["line"] == "alive"
        c.close()


def test_interrupt_wakes_a_waiting_recv_and_keeps_queued_messages(secret):
    with _core.RendezvousServer(secret, 1, "127.0.0.1", 0) as srv:
        c = _core.ControlClient.register("127.0.0.1", srv.port, secret, net_raw.node(0), 5.0)
        got: list = []
        t = threading.Thread(target=lambda: got.append(c.recv(30.0)))
        t.start()
        t.join(0.2)  # time to start waiting; nothing is sent, so it cannot return on its own
        assert t.is_alive() and not got
        c.interrupt()
        t.join(10)
        assert not t.is_alive() and got == [None]  # woken, long before its 30 s timeout
        c.interrupt()  # before a recv: the next one returns at once, then it is spent
        srv.send(0, {"type": "ping"})
        assert c.recv(5.0) is None
        assert c.recv(5.0) == {"type": "ping"}
        c.close()


def test_closing_the_server_wakes_a_waiting_next_event(secret):
    srv = _core.RendezvousServer(secret, 1, "127.0.0.1", 0)
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            srv.next_event(30.0)
        except errors.SparkgradError as exc:
            raised.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    t.join(0.2)  # time to start waiting; no node registers, so it cannot return on its own
    assert t.is_alive() and not raised
    srv.close()
    t.join(10)
    assert not t.is_alive() and raised  # woken, long before its 30 s timeout


def test_comm_port_is_kept_in_the_spec_when_given_and_a_log_line_carries_its_stream(secret):
    with _core.RendezvousServer(secret, 3, "127.0.0.1", 0) as srv:
        nodes = [dict(net_raw.node(0), comm_port=4242), net_raw.node(1), dict(net_raw.node(2), comm_port=0)]
        clients: dict[int, _core.ControlClient] = {}

        def run(i: int) -> None:  # register() returns with the spec: each from its own thread
            clients[i] = _core.ControlClient.register("127.0.0.1", srv.port, secret, nodes[i], 10.0)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        spec = srv.wait(10.0)
        join(threads)
        assert spec[0] == nodes[0] and spec[1] == nodes[1]  # absent stays absent
        assert "comm_port" not in spec[2]  # 0 means none
        clients[0].log("to stderr", stream="stderr")
        clients[1].log("to stdout")
        events = {e["executor_id"]: e for e in (srv.next_event(5.0), srv.next_event(5.0))}
        assert events[0]["stream"] == "stderr" and events[0]["line"] == "to stderr"
        assert "stream" not in events[1]
        for c in clients.values():
            c.close()


def test_a_comm_port_out_of_range_is_rejected_naming_it(secret):
    with _core.RendezvousServer(secret, 1, "127.0.0.1", 0) as srv:
        with pytest.raises(errors.SparkgradError, match="comm_port"):
            _core.ControlClient.register("127.0.0.1", srv.port, secret, dict(net_raw.node(0), comm_port=70000), 5.0)


def test_registration_carries_sparks_executor_id_and_host_and_refuses_overlong_ones(secret):
    spark_node = {**net_raw.node(0), "spark_executor": "7", "spark_host": "10.1.2.3"}
    with _core.RendezvousServer(secret, 2, "127.0.0.1", 0) as srv:
        long_node = {**net_raw.node(1), "spark_executor": "x" * 256}
        with pytest.raises(errors.SparkgradError, match='"spark_executor" is longer than 255 bytes'):
            _core.ControlClient.register("127.0.0.1", srv.port, secret, long_node, 5.0)
        threads, clients, failures = register_all(srv.port, secret, [1])
        first = _core.ControlClient.register("127.0.0.1", srv.port, secret, spark_node, 10.0)
        spec = srv.wait(10.0)
        join(threads)
        assert not failures
        assert spec[0] == spark_node  # kept as given, beside the node's own host
        assert spec[1] == net_raw.node(1)  # optional: a node off Spark sends none
        first.close()
        clients[1].close()


# ---- security: protected frames after the handshake (session.h) ----


@pytest.mark.parametrize("mode", ["none", "auth", "encrypt"])
def test_the_control_channel_round_trips_in_each_security_mode(secret, mode):
    with _core.RendezvousServer(secret, 2, "127.0.0.1", 0, security=mode) as srv:
        threads, clients, failures = register_all(srv.port, secret, [0, 1], security=mode)
        spec = srv.wait(10.0)
        join(threads)
        assert not failures and [n["executor_id"] for n in spec] == [0, 1]
        clients[1].metric("loss", 0.5, 3)
        clients[0].log("x" * 100_000)  # a large frame, sealed in the server's queue or sent in blocks
        got = {}
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            ev = srv.next_event(1.0)
            if ev is not None:
                got[ev["type"]] = ev
        assert got["metric"]["value"] == 0.5 and len(got["log"]["line"]) == 100_000
        srv.send(1, {"type": "hello", "n": 7})
        assert clients[1].recv(5.0) == {"type": "hello", "n": 7}
        assert srv.stats()["integrity_failures"] == 0
        for c in clients.values():
            c.close()


def test_a_node_with_another_security_mode_is_refused_naming_both(secret):
    with _core.RendezvousServer(secret, 1, "127.0.0.1", 0, security="auth") as srv:
        t0 = time.monotonic()
        with pytest.raises(
            errors.AuthError, match=f"server 127.0.0.1:{srv.port} uses security='auth' and this node security='encrypt'"
        ):
            _core.ControlClient.register("127.0.0.1", srv.port, secret, net_raw.node(0), 5.0, security="encrypt")
        assert time.monotonic() - t0 < 5.0
        with pytest.raises(ValueError, match="not 'aead'"):
            _core.RendezvousServer(secret, 1, "127.0.0.1", 0, security="aead")
        threads, clients, failures = register_all(srv.port, secret, [0], security="auth")
        assert len(srv.wait(10.0)) == 1
        join(threads)
        clients[0].close()


def test_altered_control_frames_are_named_and_the_rendezvous_keeps_serving(secret):
    with _core.RendezvousServer(secret, 2, "127.0.0.1", 0) as srv:
        # driver -> node: payload byte 2 of the first protected frame (the "registered" reply)
        with TamperRelay("127.0.0.1", srv.port, "s2c", flip_at=HANDSHAKE_S2C + HEADER + SEQ + 2) as relay:
            t0 = time.monotonic()
            match = f"driver 127.0.0.1:{relay.port}: json frame 0 failed its integrity check"
            with pytest.raises(errors.AuthError, match=match):
                _core.ControlClient.register("127.0.0.1", relay.port, secret, net_raw.node(0), 10.0)
            assert time.monotonic() - t0 < 5.0 and relay.flipped == 1
        # node -> driver: payload byte 2 of the registration; the driver names it in its reject
        with TamperRelay("127.0.0.1", srv.port, "c2s", flip_at=HANDSHAKE_C2S + HEADER + SEQ + 2) as relay:
            t0 = time.monotonic()
            with pytest.raises(
                errors.ClusterError, match="rejected executor 1: .*json frame 0 failed its integrity check"
            ):
                _core.ControlClient.register("127.0.0.1", relay.port, secret, net_raw.node(1), 10.0)
            assert time.monotonic() - t0 < 5.0
        stats = srv.stats()
        assert stats["integrity_failures"] == 1 and "json frame 0 failed its integrity check" in stats["last_rejection"]
        threads, clients, failures = register_all(srv.port, secret, [0, 1])  # fresh nodes get in
        spec = srv.wait(10.0)
        join(threads)
        assert not failures and [n["executor_id"] for n in spec] == [0, 1]
        for c in clients.values():
            c.close()
