"""Parameter-server micro-benchmark: push_pull round trips over loopback.

One worker (a PsClient in this process) does push_pull on a flat float32
buffer against 1 or 2 PsServer shards serving from threads of this process
(GIL released in C on both sides), async mode, SGD. Reports round trips per
second and the effective parameter bandwidth (gradients out + parameters back).
The MLP of the issue's example (784-128-10 dense) has 101,770 parameters.
--security sets the frame protection of both ends ("none", "auth", "encrypt";
default _core.SECURITY_DEFAULT); each row names it, and a run in a mode other
than the default writes results/ps_<mode>.json instead of results/ps.json.

    python bench/bench_ps.py [--quick] [--security MODE]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import threading
import time

import benchlib
import numpy as np
from sparkgrad import _core


def results_path(security: str, update: bool) -> pathlib.Path:
    return benchlib.results_file("ps.json" if security == _core.SECURITY_DEFAULT else f"ps_{security}.json", update)


def measure(total: int, num_ps: int, seconds: float, security: str) -> tuple[float, float]:
    secret = os.urandom(32)
    listeners = [_core.Listener("127.0.0.1", 0) for _ in range(num_ps)]
    servers = []
    for i, lis in enumerate(listeners):
        off, cnt = _core.ps_shard_range(total, num_ps, i)
        servers.append(
            _core.PsServer(
                lis, secret, off, cnt, total, 1, lr=0.01, params=np.zeros(cnt, np.float32), security=security
            )
        )
    threads = [threading.Thread(target=s.serve, kwargs={"timeout": 120}) for s in servers]
    for t in threads:
        t.start()
    client = _core.PsClient([("127.0.0.1", lis.port) for lis in listeners], secret, total, 0, 30.0, security=security)
    grads = np.full(total, 1e-3, np.float32)
    params = np.empty(total, np.float32)
    for _ in range(5):
        client.push_pull(grads, params)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        client.push_pull(grads, params)
        n += 1
    elapsed = time.perf_counter() - t0
    client.done()
    for t in threads:
        t.join(30)
    for lis in listeners:
        lis.close()
    rate = n / elapsed
    return rate, rate * total * 4 * 2 / 1e6


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--security",
        choices=("none", "auth", "encrypt"),
        default=_core.SECURITY_DEFAULT,
        help="frame protection of the ps and its client (default: %(default)s)",
    )
    benchlib.add_update_flag(ap)
    args = ap.parse_args(argv)
    meta = benchlib.metadata("ps", security=args.security)
    seconds = 0.5 if args.quick else 2.0
    rows = []
    for total in (101_770, 1_000_000):
        for num_ps in (1, 2):
            rate, mbs = measure(total, num_ps, seconds, args.security)
            tag = f"{total}_params_{num_ps}ps"
            for metric, value, unit in (
                (f"push_pull_per_s_{tag}", rate, "1/s"),
                (f"push_pull_bandwidth_{tag}", mbs, "MB/s"),
            ):
                rows.append(
                    {
                        "system": "sparkgrad",
                        "metric": metric,
                        "value": round(value, 1),
                        "unit": unit,
                        "security": args.security,
                    }
                )
    benchlib.write_results(results_path(args.security, args.update), rows, meta)
    print(f"security={args.security}")
    benchlib.print_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
