"""security= of TFCluster.run / sparkgrad.run / HorovodRunner: every connection of a cluster in one mode.

The frame-level checks (tampering, replay, mismatched modes) are in the
component tests (test_net_*.py and tests/c/test_net_sframe.c); here: the
mode reaches every node and connection, "none" is an opt-out that warns, a
bad mode fails before anything starts, and "encrypt" keeps payloads off the
wire in clear where "auth" does not.
"""

from __future__ import annotations

import logging
import os
import threading

import numpy as np
import pytest
import runner_fns
import sparkgrad
from sparkgrad import TFCluster, _core
from sparkgrad.cluster import security
from sparkgrad.errors import InvalidArgumentError
from tamper_relay import TamperRelay

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("mode", ["auth", "encrypt"])
def test_every_rank_runs_in_the_mode_asked_for_and_its_ring_reduces(mode):
    values = sparkgrad.run(runner_fns.security_probe, num_proc=2, local=True, security=mode)
    assert [v["security"] for v in values] == [mode, mode]
    for v in values:
        np.testing.assert_array_equal(v["sum"], np.full(1000, 3.0, np.float32))


def test_the_default_is_the_core_default_unless_the_environment_names_one(monkeypatch):
    monkeypatch.delenv(security.ENV, raising=False)
    assert security.default() == _core.SECURITY_DEFAULT == "auth"
    monkeypatch.setenv(security.ENV, "encrypt")
    assert security.resolve(None) == "encrypt"
    values = sparkgrad.run(runner_fns.security_probe, num_proc=2, local=True)
    assert [v["security"] for v in values] == ["encrypt", "encrypt"]


def test_none_is_an_explicit_opt_out_that_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="sparkgrad.security"):
        values = sparkgrad.run(runner_fns.security_probe, num_proc=2, local=True, security="none")
    assert [v["security"] for v in values] == ["none", "none"]
    warned = [r.getMessage() for r in caplog.records if r.name == "sparkgrad.security"]
    assert len(warned) == 1 and "security='none'" in warned[0] and "trust" in warned[0]


def test_a_bad_mode_fails_before_anything_starts(monkeypatch):
    with pytest.raises(InvalidArgumentError, match="security must be one of 'none', 'auth', 'encrypt', got 'tls'"):
        sparkgrad.run(runner_fns.security_probe, num_proc=2, local=True, security="tls")
    with pytest.raises(InvalidArgumentError, match="got 'AUTH'"):
        sparkgrad.HorovodRunner(np=-2, security="AUTH")
    monkeypatch.setenv(security.ENV, "plain")
    with pytest.raises(InvalidArgumentError, match=r"\$SPARKGRAD_SECURITY must be one of .* got 'plain'"):
        TFCluster.run(None, runner_fns.security_probe, None, 2, 0)
    with pytest.raises(ValueError, match="security must be 'none', 'auth' or 'encrypt', not 'tls'"):
        _core.RendezvousServer(os.urandom(32), 1, security="tls")


@pytest.mark.parametrize("mode", ["auth", "encrypt"])
def test_encrypt_keeps_fed_rows_off_the_wire_and_auth_does_not(mode):
    """A passive observer of the link between a feeder and its worker sees the rows in clear only with auth."""
    secret = os.urandom(32)
    marker = np.full(512, 0x1D2C3B4A59687706, np.int64)  # 4 KiB of a pattern no header or tag contains
    with _core.Listener("127.0.0.1", 0) as lis:
        server = _core.FeedServer(lis, secret, expected_feeders=1, security=mode)
        try:
            with TamperRelay("127.0.0.1", lis.port) as relay:

                def feed() -> None:
                    client = _core.FeedClient(relay.host, relay.port, secret, 10.0, "train", security=mode)
                    client.send({"x": marker})
                    client.end()
                    client.close()

                t = threading.Thread(target=feed)
                t.start()
                batch = server.next_batch(512, 10.0)
                t.join(10)
                assert not t.is_alive()
                np.testing.assert_array_equal(batch["x"], marker)
                seen = bytes(relay.seen["c2s"])
        finally:
            server.close()
    assert len(seen) > marker.nbytes
    assert (marker.tobytes()[:64] in seen) == (mode == "auth")
