"""One sparkgrad server in a process of its own, for tests/test_net_lifecycle.py.

argv: kind (ps | feed | rendezvous), secret (hex), nofile (descriptors left
free under a lowered RLIMIT_NOFILE; 0: unchanged), auth_timeout (seconds).
Prints {"port": p} once listening, then answers stdin lines: "rows" (feed:
rows received so far, taken within 10 s) and "quit".
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading

import numpy as np
from sparkgrad import _core


def main() -> None:
    kind, secret, nofile, auth_timeout = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    keep = []
    if kind == "rendezvous":
        srv = _core.RendezvousServer(secret, 1, "127.0.0.1", 0, auth_timeout=auth_timeout)
        port = srv.port
    else:
        lis = _core.Listener("127.0.0.1", 0)
        port = lis.port
        keep.append(lis)
        if kind == "ps":
            srv = _core.PsServer(
                lis, secret, 0, 4, 4, 1, lr=0.5, params=np.zeros(4, np.float32), auth_timeout=auth_timeout
            )
            threading.Thread(target=srv.serve, kwargs={"timeout": 120.0}, daemon=True).start()
        else:
            srv = _core.FeedServer(lis, secret, auth_timeout=auth_timeout)
    if nofile:
        soft = len(os.listdir("/proc/self/fd")) - 1 + nofile  # listdir's own descriptor is closed again
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    print(json.dumps({"port": port}), flush=True)
    rows = 0
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "rows":
            batch = srv.next_batch(1000, 10.0, partial=True)
            rows += len(batch.get("y", ()))
            print(rows, flush=True)
        elif cmd == "quit":
            break
    if kind == "ps":
        srv.stop()
    else:
        srv.close()


if __name__ == "__main__":
    main()
