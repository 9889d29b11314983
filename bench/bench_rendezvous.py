"""Rendezvous micro-benchmark: how long N simulated nodes take to form a cluster.

Each simulated node is a sparkgrad ControlClient (connect, HMAC handshake,
register, wait for the spec, heartbeat thread) started from its own Python
thread in this process; the driver side is one RendezvousServer on loopback.
The figure is the wall time from releasing all nodes at once until
RendezvousServer.wait() returns the complete spec (median of the repeats).
Target from issue 5: 256 nodes in under 200 ms.

    python bench/bench_rendezvous.py [--quick] [--nodes 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import threading
import time

import benchlib
from sparkgrad import _core


def one_rendezvous(num_nodes: int, timeout: float = 30.0) -> float:
    secret = os.urandom(32)
    with _core.RendezvousServer(secret, num_nodes, "127.0.0.1", 0) as srv:
        go = threading.Event()
        clients: list[_core.ControlClient] = []
        failures: list[BaseException] = []
        lock = threading.Lock()

        def node(eid: int) -> None:
            info = {
                "host": "127.0.0.1",
                "port": 20000 + eid,
                "role": "worker",
                "index": eid,
                "executor_id": eid,
                "pid": os.getpid(),
            }
            go.wait(timeout)
            try:
                c = _core.ControlClient.register("127.0.0.1", srv.port, secret, info, timeout)
            except BaseException as exc:  # noqa: BLE001 - reported below
                with lock:
                    failures.append(exc)
                return
            with lock:
                clients.append(c)

        threads = [threading.Thread(target=node, args=(i,)) for i in range(num_nodes)]
        for t in threads:
            t.start()
        t0 = time.perf_counter()
        go.set()
        spec = srv.wait(timeout)
        elapsed = time.perf_counter() - t0
        for t in threads:
            t.join(timeout)
        for c in clients:
            c.close()
        if failures or len(spec) != num_nodes:
            raise SystemExit(f"bench_rendezvous: {len(failures)} node(s) failed: {failures[:3]}")
        return elapsed


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    benchlib.add_update_flag(ap)
    args = ap.parse_args(argv)
    meta = benchlib.metadata("rendezvous")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 8 * args.nodes + 64  # client socket + wake pipe, server socket, per node
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    repeats = 2 if args.quick else args.repeats
    one_rendezvous(8)  # warm-up: imports, first thread creation
    times = [one_rendezvous(args.nodes) for _ in range(repeats)]
    median_ms = statistics.median(times) * 1000
    rows = [
        {
            "system": "sparkgrad",
            "metric": f"rendezvous_{args.nodes}_nodes_median",
            "value": round(median_ms, 2),
            "unit": "ms",
        },
        {
            "system": "sparkgrad",
            "metric": f"rendezvous_{args.nodes}_nodes_max",
            "value": round(max(times) * 1000, 2),
            "unit": "ms",
        },
        {"system": "target (issue 5)", "metric": "rendezvous_256_nodes", "value": 200.0, "unit": "ms"},
    ]
    results = benchlib.results_file("rendezvous.json", args.update)
    benchlib.write_results(results, rows, meta)
    print(f"{'system':<18} {'metric':<34} {'value':>10} unit")
    for r in rows:
        print(f"{r['system']:<18} {r['metric']:<34} {r['value']:>10} {r['unit']}")
    print(f"repeats: {[round(t * 1000, 1) for t in times]} ms; wrote {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
