"""One process of the network-namespace faults: the driver (a RendezvousServer), the ps or the worker.

    net_node.py driver <bind host> <out.json>
    net_node.py ps <my host> <driver host> <out.json>
    net_node.py worker <my host> <driver host> <out.json>

Environment: SG_SECRET (hex), SG_PORT_FILE (the driver writes its port there),
SG_STEPS (worker steps; 0: until stopped or an error), SG_TIMEOUT (the
worker's ps timeout, s), SG_HEARTBEAT (the driver's heartbeat_timeout, s),
SG_PS_PORT (the ps's port, 0: any), SG_PS_ADDRESS (host:port the worker uses for the ps instead of the spec's,
e.g. a delaying relay). Each writes out.json: what it ended with, an error as
{"error": class name, "message": ...}. The driver stops the others when a node
is lost or fails, as sparkgrad's driver does. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np
from sparkgrad import _core

TOTAL = 1024


def _write(out: str, obj: dict) -> None:
    with open(out + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(out + ".tmp", out)


def driver(host: str, out: str, secret: bytes) -> None:
    port_file = os.environ["SG_PORT_FILE"]
    with _core.RendezvousServer(secret, 2, host, 0) as srv:
        srv.heartbeat_timeout = float(os.environ.get("SG_HEARTBEAT", "3"))
        with open(port_file + ".tmp", "w") as f:
            f.write(str(srv.port))
        os.rename(port_file + ".tmp", port_file)
        spec = srv.wait(30.0)
        events, started, ended = [], time.monotonic(), set()
        while len(ended) < 2 and time.monotonic() - started < 90:
            e = srv.next_event(1.0)
            if e is None:
                continue
            events.append(dict(e, t=round(time.monotonic() - started, 3)))
            if e["type"] in ("done", "error", "lost"):
                ended.add(e["executor_id"])
                if e["type"] != "done":
                    srv.broadcast({"type": "stop", "reason": f"executor {e['executor_id']} {e['type']}"})
        _write(out, {"spec": spec, "events": events, "ended": sorted(ended)})


def node(role: str, my_host: str, driver_host: str, out: str, secret: bytes) -> None:
    port = int(open(os.environ["SG_PORT_FILE"]).read())
    lis = _core.Listener(my_host, int(os.environ.get("SG_PS_PORT", "0")) if role == "ps" else 0)
    eid = 0 if role == "ps" else 1
    info = {"host": my_host, "port": lis.port, "role": role, "index": 0, "executor_id": eid, "pid": os.getpid()}
    t0 = time.monotonic()
    result: dict = {"pid": os.getpid(), "port": lis.port}
    with _core.ControlClient.register(driver_host, port, secret, info, 30.0, driver_timeout=10.0) as ctl:
        try:
            if role == "ps":
                srv = _core.PsServer(
                    lis, secret, 0, TOTAL, TOTAL, 1, mode="async", lr=0.01, params=np.zeros(TOTAL, np.float32)
                )

                def watch() -> None:  # the driver's stop ends serve()
                    end = time.monotonic() + 90
                    while time.monotonic() < end:
                        try:
                            m = ctl.recv(0.5)
                        except Exception:  # noqa: BLE001 - the driver is gone: stop serving
                            break
                        if m is not None and m.get("type") == "stop":
                            break
                    srv.stop()

                threading.Thread(target=watch, daemon=True).start()
                result["reason"] = srv.serve(timeout=60.0)
                result["step"] = srv.step
            else:
                ps = [(n["host"], n["port"]) for n in ctl.spec if n["role"] == "ps"]
                if os.environ.get("SG_PS_ADDRESS"):
                    h, p = os.environ["SG_PS_ADDRESS"].rsplit(":", 1)
                    ps = [(h, int(p))]
                cli = _core.PsClient(ps, secret, TOTAL, 0, float(os.environ.get("SG_TIMEOUT", "5")))
                params = np.empty(TOTAL, np.float32)
                g = np.full(TOTAL, 0.001, np.float32)
                steps = int(os.environ.get("SG_STEPS", "0"))
                n = 0
                while (steps == 0 or n < steps) and time.monotonic() - t0 < 60:
                    cli.push_pull(g, params)
                    n += 1
                    if n == 5:
                        _write(out + ".training", {"pid": os.getpid()})
                cli.done()
                cli.close()
                result["steps"] = n
            result["seconds"] = round(time.monotonic() - t0, 3)
            _write(out, result)
            ctl.done(json.dumps(result))
        except Exception as exc:  # noqa: BLE001 - reported, then the process exits non-zero
            result.update(error=type(exc).__name__, message=str(exc), at=round(time.monotonic() - t0, 3))
            _write(out, result)
            try:
                ctl.error(f"{type(exc).__name__}: {exc}", "", my_host, 2.0)
            except Exception:  # noqa: BLE001 - the driver may be unreachable: that is the fault
                pass
            lis.close()
            sys.exit(3)
    lis.close()


if __name__ == "__main__":
    secret = bytes.fromhex(os.environ["SG_SECRET"])
    if sys.argv[1] == "driver":
        driver(sys.argv[2], sys.argv[3], secret)
    else:
        node(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], secret)
