"""Feeding batches of named columns to a worker's bounded queue (InputMode.SPARK)."""

from __future__ import annotations

import os
import threading
import time

import net_raw
import numpy as np
import pytest
from sparkgrad import _core, errors
from tamper_relay import HANDSHAKE_C2S, HANDSHAKE_S2C, HEADER, SEQ, TamperRelay

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def feed():
    """A FeedServer on loopback; yields (server, port, secret)."""
    secret = os.urandom(32)
    lis = _core.Listener("127.0.0.1", 0)
    servers = []

    def make(**kw):
        srv = _core.FeedServer(lis, secret, **kw)
        servers.append(srv)
        return srv, lis.port, secret

    yield make
    for s in servers:
        s.close()
    lis.close()


def batch(start: int, rows: int) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + rows, dtype=np.int64)
    return {"x": np.stack([ids.astype(np.float32)] * 4, axis=1), "y": ids}


def feeder(port: int, secret: bytes, start: int, sizes: list[int], input: str = "train", **kw) -> None:
    c = _core.FeedClient("127.0.0.1", port, secret, 10.0, input, **kw)
    for n in sizes:
        c.send(batch(start, n))
        start += n
    c.end()
    c.close()


def test_rows_from_several_feeders_arrive_once_and_in_feeder_order(feed):
    srv, port, secret = feed(expected_feeders=2)
    threads = [
        threading.Thread(target=feeder, args=(port, secret, 0, [5, 1, 9])),
        threading.Thread(target=feeder, args=(port, secret, 1000, [3, 3])),
    ]
    for t in threads:
        t.start()
    got = []
    while True:
        b = srv.next_batch(7, 10.0)
        assert set(b) == {"x", "y"} and b["x"].shape == (len(b["y"]), 4) and b["x"].dtype == np.float32
        assert np.array_equal(b["x"][:, 2], b["y"].astype(np.float32))
        got.extend(b["y"].tolist())
        if len(b["y"]) < 7:
            break
    for t in threads:
        t.join(10)
    assert sorted(got) == list(range(15)) + list(range(1000, 1006))
    assert [v for v in got if v < 1000] == list(range(15))  # each feeder's order is kept
    assert srv.drained()
    empty = srv.next_batch(7, 1.0)
    assert empty["y"].shape == (0,) and empty["x"].shape == (0, 4)
    stats = srv.stats()
    assert stats["feeders"] == 2 and stats["ended"] == 2 and stats["rows_in"] == stats["rows_out"] == 21


def test_next_batch_timeout_says_what_it_waited_for(feed):
    srv, port, secret = feed()
    feeder(port, secret, 0, [3])
    t0 = time.monotonic()
    with pytest.raises(errors.SparkgradTimeout, match="10 rows of input 'train': 3 queued, 1 feeder.*1 sent END"):
        srv.next_batch(10, 0.3)
    assert time.monotonic() - t0 >= 0.3 * 0.9  # it waited its timeout before failing
    assert not srv.drained()
    assert srv.next_batch(3, 1.0)["y"].tolist() == [0, 1, 2]  # the rows it waited beside stay queued


def test_partial_next_batch_returns_what_is_queued_without_waiting_for_a_full_batch(feed):
    srv, port, secret = feed()
    with pytest.raises(errors.SparkgradTimeout, match="1 rows of input 'train': 0 queued"):
        srv.next_batch(100, 0.2, partial=True)  # nothing queued: waits for one row, bounded
    feeder(port, secret, 0, [7])
    t0 = time.monotonic()
    cols, sources = srv.next_batch(100, 20.0, with_source=True, partial=True)
    assert time.monotonic() - t0 < 10.0  # did not wait out its 20 s for 100 rows or the end of the input
    assert cols["y"].tolist() == list(range(7)) and len(sources) == 7
    feeder(port, secret, 7, [5])
    assert srv.next_batch(3, 20.0, partial=True)["y"].tolist() == [7, 8, 9]  # at most n
    assert srv.next_batch(3, 20.0, partial=True)["y"].tolist() == [10, 11]
    assert not srv.drained()


def test_finish_releases_a_waiting_consumer_with_a_short_batch(feed):
    srv, port, secret = feed()
    out: list = []
    feeder(port, secret, 0, [10])
    # 10 rows queued do not make a batch of 100: a consumer waits for more (here until its timeout)
    with pytest.raises(errors.SparkgradTimeout, match="100 rows of input 'train': 10 queued"):
        srv.next_batch(100, 0.2)
    t = threading.Thread(target=lambda: out.append(srv.next_batch(100, 20.0)))
    t.start()
    t.join(0.2)  # time to start waiting; it cannot return on its own (20 s timeout, 10 rows of 100)
    assert t.is_alive() and not out
    srv.finish()
    t.join(10)
    assert not t.is_alive(), "finish() did not release the consumer (it waits up to 20 s)"
    assert out[0]["y"].tolist() == list(range(10))
    assert srv.drained()


def test_named_inputs_are_independent(feed):
    srv, port, secret = feed()
    feeder(port, secret, 0, [4], input="train")
    feeder(port, secret, 500, [2], input="validation")
    srv.finish("validation")
    assert srv.next_batch(10, 1.0, input="validation")["y"].tolist() == [500, 501]
    assert srv.drained("validation") and not srv.drained("train")
    assert srv.next_batch(4, 1.0)["y"].tolist() == [0, 1, 2, 3]


def test_full_queue_pushes_back_on_the_feeder(feed):
    srv, port, secret = feed(capacity_bytes=64 << 10)
    big = {"x": np.zeros((1 << 18,), dtype=np.float32)}  # 1 MiB per batch
    c = _core.FeedClient("127.0.0.1", port, secret, 0.5)
    with pytest.raises(errors.SparkgradTimeout, match="feed queue stayed full"):
        for _ in range(64):
            c.send(big)
    queued = srv.stats()["queued_bytes"]
    assert (1 << 20) <= queued < (1 << 20) + 4096  # one batch admitted past the cap, no more
    c.close()


def test_a_slow_consumer_receives_everything_with_bounded_memory(feed):
    srv, port, secret = feed(capacity_bytes=256 << 10)
    rows, per = 40, 1 << 15  # 40 batches of 128 KiB
    peak = 0

    def send() -> None:
        c = _core.FeedClient("127.0.0.1", port, secret, 20.0)
        for i in range(rows):
            c.send({"v": np.full((1, per), i, dtype=np.float32)})
        c.end()

    t = threading.Thread(target=send)
    t.start()
    seen = []
    for _ in range(rows):
        b = srv.next_batch(1, 10.0)
        seen.append(int(b["v"][0, 0]))
        peak = max(peak, srv.stats()["queued_bytes"])
    t.join(10)
    assert seen == list(range(rows))
    assert peak <= (256 << 10) + (128 << 10) + 4096


def test_schema_change_is_refused_with_the_column_named(feed):
    srv, port, secret = feed()
    c = _core.FeedClient("127.0.0.1", port, secret, 5.0)
    c.send(batch(0, 2))
    c.send({"x": np.zeros((2, 5), dtype=np.float32), "y": np.zeros(2, dtype=np.int64)})
    with pytest.raises(errors.SchemaError, match="column 0 is 'x'"):
        c.end()
    assert srv.stats()["rejected"] == 1
    assert srv.next_batch(2, 1.0)["y"].tolist() == [0, 1]


def test_every_dtype_and_shape_round_trips(feed):
    srv, port, secret = feed(expected_feeders=1)
    rng = np.random.default_rng(0)
    cols = {
        "f32": rng.standard_normal((3, 2, 2)).astype(np.float32),
        "f64": rng.standard_normal(3),
        "i32": np.arange(3, dtype=np.int32),
        "i64": np.array([-(2**40), 0, 2**40]),
        "u8": np.arange(3 * 784, dtype=np.uint8).reshape(3, 28, 28),
        "i8": np.array([-1, 0, 1], dtype=np.int8),
        "i16": np.array([-300, 0, 300], dtype=np.int16),
        "u16": np.array([0, 1, 65535], dtype=np.uint16),
        "b": np.array([True, False, True]),
        "strided": np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2],
    }
    _core.feed_send("127.0.0.1", port, secret, cols, 5.0)
    got = srv.next_batch(3, 1.0)
    for name, arr in cols.items():
        assert got[name].dtype == arr.dtype and np.array_equal(got[name], arr), name


def test_bad_columns_are_rejected_on_the_feeder(feed):
    srv, port, secret = feed()
    c = _core.FeedClient("127.0.0.1", port, secret, 5.0)
    with pytest.raises(errors.InvalidArgumentError, match="dtype"):
        c.send({"z": np.zeros(3, dtype=np.complex64)})
    with pytest.raises(errors.InvalidArgumentError, match="has 2 rows but 'a' has 3"):
        c.send({"a": np.zeros(3), "b": np.zeros(2)})
    with pytest.raises(TypeError):
        c.send({})


def test_wrong_secret_and_garbage_are_rejected(feed):
    srv, port, secret = feed(security="none")  # the raw peer speaks plain frames after the handshake
    with pytest.raises(errors.AuthError):
        _core.FeedClient("127.0.0.1", port, os.urandom(32), 5.0, security="none")
    sock = net_raw.connect(port)
    net_raw.client_auth(sock, secret)
    sock.sendall(net_raw.frame(30, b"\x05train" + b"\xff" * 20, flags=1))
    ftype, payload = net_raw.recv_frame(sock)
    assert ftype == 30 and b"feed batch" in payload
    sock.close()
    deadline = time.monotonic() + 5
    while srv.stats()["rejected"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.stats()["rejected"] == 2
    feeder(port, secret, 0, [2], security="none")  # the server still works
    assert srv.next_batch(2, 2.0)["y"].tolist() == [0, 1]


def test_close_stops_a_waiting_consumer(feed):
    srv, port, secret = feed()
    out: list = []

    def wait() -> None:
        try:
            srv.next_batch(5, 20.0)
        except BaseException as exc:  # noqa: BLE001
            out.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    t.join(0.2)  # time to start waiting; nothing is fed, so it cannot return on its own
    assert t.is_alive() and not out
    srv.close()
    t.join(10)
    assert not t.is_alive() and isinstance(out[0], errors.CancelledError)
    # The port stays bound (the Listener belongs to the caller) but nobody answers.
    with pytest.raises(errors.SparkgradTimeout, match="auth challenge"):
        _core.FeedClient("127.0.0.1", port, secret, 0.3)


def test_results_flow_back_to_each_feeder_in_its_row_order(feed):
    srv, port, secret = feed(expected_feeders=2)
    received: dict[int, list[int]] = {}

    def inference_feeder(start: int, sizes: list[int]) -> None:
        c = _core.FeedClient("127.0.0.1", port, secret, 10.0)
        sent = 0
        for n in sizes:
            c.send(batch(start + sent, n))
            sent += n
        c.end()
        out: list[int] = []
        while len(out) < sent:
            r = c.recv_results(10.0)
            assert r is not None, "results did not come back"
            out.extend(r["y2"].tolist())
        received[start] = out
        c.close()

    threads = [
        threading.Thread(target=inference_feeder, args=(0, [4, 3])),
        threading.Thread(target=inference_feeder, args=(100, [6])),
    ]
    for t in threads:
        t.start()
    while not srv.drained():
        b, sources = srv.next_batch(5, 10.0, with_source=True)
        assert sources.dtype == np.uint32 and len(sources) == len(b["y"])
        for src in dict.fromkeys(sources.tolist()):  # each feeder's rows, in order
            rows = sources == src
            srv.send_results(src, {"y2": b["y"][rows] * 2})
    for t in threads:
        t.join(10)
    assert received == {0: [2 * i for i in range(7)], 100: [2 * i for i in range(100, 106)]}


def test_results_sent_before_the_end_is_acknowledged_are_kept(feed):
    srv, port, secret = feed()
    c = _core.FeedClient("127.0.0.1", port, secret, 5.0)
    c.send(batch(0, 3))
    b, src = srv.next_batch(3, 5.0, with_source=True)
    srv.send_results(int(src[0]), {"p": b["x"][:, 0]})
    c.end()
    assert c.recv_results(5.0)["p"].tolist() == [0.0, 1.0, 2.0]
    assert c.recv_results(0.1) is None
    with pytest.raises(errors.InvalidArgumentError, match="no feeder connection with source id 9"):
        srv.send_results(9, {"p": np.zeros(1)})
    c.close()
    deadline = time.monotonic() + 5
    with pytest.raises(errors.PeerClosedError, match="sending results to feeder 1"):
        while time.monotonic() < deadline:  # the first writes may still land in kernel buffers
            srv.send_results(int(src[0]), {"p": np.zeros(1 << 16)})
            time.sleep(0.01)


# ---- security: protected frames after the handshake (session.h) ----


@pytest.mark.parametrize("mode", ["none", "auth", "encrypt"])
def test_batches_and_results_round_trip_in_each_security_mode(feed, mode):
    srv, port, secret = feed(security=mode)
    c = _core.FeedClient("127.0.0.1", port, secret, 5.0, security=mode)
    big = np.arange(200_000, dtype=np.float64)  # several of encrypt's 64 KiB blocks
    c.send({"x": big, "y": np.arange(200_000, dtype=np.int64)})
    c.send(batch(0, 3) | {"x": np.arange(3, dtype=np.float64)})
    b, src = srv.next_batch(200_003, 5.0, with_source=True)
    assert np.array_equal(b["x"][:200_000], big) and b["y"][-3:].tolist() == [0, 1, 2]
    srv.send_results(int(src[0]), {"p": b["y"][-3:] * 3})
    c.end()
    assert c.recv_results(5.0)["p"].tolist() == [0, 3, 6]
    c.close()
    _core.feed_send("127.0.0.1", port, secret, {"x": np.ones(2), "y": np.arange(2)}, 5.0, security=mode)
    assert srv.next_batch(2, 5.0)["y"].tolist() == [0, 1]


def test_a_feeder_with_another_security_mode_is_refused_naming_both(feed):
    srv, port, secret = feed(security="encrypt")
    t0 = time.monotonic()
    with pytest.raises(errors.AuthError, match="uses security='encrypt' and this node security='auth'"):
        _core.FeedClient("127.0.0.1", port, secret, 5.0, security="auth")
    with pytest.raises(errors.AuthError, match="security='encrypt'.*security='none'"):
        _core.feed_send("127.0.0.1", port, secret, batch(0, 1), 5.0, security="none")
    assert time.monotonic() - t0 < 5.0
    with pytest.raises(ValueError, match="'none', 'auth' or 'encrypt', not 'tls'"):
        _core.FeedClient("127.0.0.1", port, secret, 5.0, security="tls")
    feeder(port, secret, 0, [2], security="encrypt")
    assert srv.next_batch(2, 5.0)["y"].tolist() == [0, 1]


@pytest.mark.parametrize("mode", ["auth", "encrypt"])
def test_a_batch_altered_on_the_way_is_named_to_the_feeder_and_the_server_keeps_serving(feed, mode):
    srv, port, secret = feed(security=mode)
    # payload byte 40 of the first protected frame (the batch): inside its metadata or data
    with TamperRelay("127.0.0.1", port, "c2s", flip_at=HANDSHAKE_C2S + HEADER + SEQ + 40) as relay:
        c = _core.FeedClient("127.0.0.1", relay.port, secret, 5.0, security=mode)
        t0 = time.monotonic()
        with pytest.raises(errors.AuthError, match=r"refused the feed: .*feed frame 0 failed its integrity check"):
            c.send(batch(0, 50))
            c.end()
        assert time.monotonic() - t0 < 5.0 and relay.flipped == 1
        c.close()
    stats = srv.stats()
    assert stats["rejected"] == 1 and "feed frame 0 failed its integrity check" in stats["last_error"]
    feeder(port, secret, 100, [3], security=mode)  # a fresh feeder is served; nothing of the altered batch
    srv.finish()
    assert srv.next_batch(100, 5.0)["y"].tolist() == [100, 101, 102]


def test_an_acknowledgement_altered_on_the_way_is_named_by_the_feeder(feed):
    srv, port, secret = feed(security="auth")
    # the ACK (empty payload) is the first protected worker -> feeder frame: flip its tag's first byte
    with TamperRelay("127.0.0.1", port, "s2c", flip_at=HANDSHAKE_S2C + HEADER + SEQ) as relay:
        c = _core.FeedClient("127.0.0.1", relay.port, secret, 5.0, security="auth")
        c.send(batch(0, 2))
        with pytest.raises(errors.AuthError, match=f"127.0.0.1:{relay.port}: feed frame 0 failed its integrity check"):
            c.end()
        c.close()
    assert srv.next_batch(2, 5.0)["y"].tolist() == [0, 1]  # the worker got the batch; it keeps serving
    feeder(port, secret, 5, [1], security="auth")
    assert srv.next_batch(1, 5.0)["y"].tolist() == [5]
