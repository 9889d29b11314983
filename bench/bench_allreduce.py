"""Ring allreduce over loopback: bus bandwidth beside the TCP ceiling, and latency.

Bus bandwidth of a float32 allreduce of B bytes on n ranks is
2(n-1)/n * B / time (the bytes each rank must send and receive), for
64 KB .. 64 MB on 2, 3 and 4 rank processes (_core.Communicator, one
process per rank, 127.0.0.1). Beside it, in the same run, the loopback TCP
ceiling: a plain socket copy of the same buffer sizes from one process to
another (sendall / recv_into). Then the latency of the 436 KB allreduce (the
MLP's gradient) on 2 ranks: median and spread of many runs.

    python bench/bench_allreduce.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import pathlib
import socket
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "tests"))

from coll_ranks import Ranks  # noqa: E402 - the rank processes live beside the tests

RESULTS = ROOT / "results" / "allreduce.json"
SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
LATENCY_BYTES = 436_000


def label(nbytes: int) -> str:
    return f"{nbytes >> 20}MB" if nbytes >= 1 << 20 else f"{nbytes >> 10}KB"


def iterations(nbytes: int, volume: int) -> int:
    return max(3, min(2000, volume // nbytes))


def _tcp_sink(port: int, plan: list) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        for nbytes, reps in plan:
            buf = bytearray(nbytes)
            view = memoryview(buf)
            for _ in range(reps):
                got = 0
                while got < nbytes:
                    n = s.recv_into(view[got:], nbytes - got)
                    if n == 0:
                        return
                    got += n
            s.sendall(b"k")


def tcp_ceiling(plan: list) -> dict[int, float]:
    """Bytes per second of a one-way socket copy to another process, per size."""
    ctx = mp.get_context("spawn")
    with socket.create_server(("127.0.0.1", 0)) as srv:
        srv.settimeout(60)
        sink = ctx.Process(target=_tcp_sink, args=(srv.getsockname()[1], plan), daemon=True)
        sink.start()
        try:
            conn, _ = srv.accept()
            out = {}
            with conn:
                conn.settimeout(60)
                for nbytes, reps in plan:
                    buf = memoryview(bytearray(nbytes))
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        conn.sendall(buf)
                    if conn.recv(1) != b"k":
                        raise RuntimeError("the TCP sink went away")
                    out[nbytes] = nbytes * reps / (time.perf_counter() - t0)
            return out
        finally:
            sink.join(10)
            if sink.is_alive():
                sink.kill()
                sink.join(5)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    volume = (64 << 20) if args.quick else (512 << 20)
    sizes = SIZES if not args.quick else [64 << 10, 1 << 20, 4 << 20, 64 << 20]
    plan = [(b, iterations(b, volume)) for b in sizes]
    rows = []
    ceiling = tcp_ceiling(plan)
    for b in sizes:
        rows.append(
            {
                "system": "loopback_tcp",
                "metric": f"copy_{label(b)}",
                "value": round(ceiling[b] / 1e9, 3),
                "unit": "GB/s",
            }
        )
    for n in (2, 3, 4):
        with Ranks(n, "bench_allreduce", (plan,), timeout=120.0) as ranks:
            per_rank = ranks.values(timeout=600)
        for b in sizes:
            t = max(r[b] for r in per_rank)
            bus = 2 * (n - 1) / n * b / t
            rows.append(
                {
                    "system": "sparkgrad",
                    "metric": f"allreduce_busbw_{n}ranks_{label(b)}",
                    "value": round(bus / 1e9, 3),
                    "unit": "GB/s",
                }
            )
            rows.append(
                {
                    "system": "sparkgrad",
                    "metric": f"allreduce_busbw_vs_tcp_{n}ranks_{label(b)}",
                    "value": round(100 * bus / ceiling[b], 1),
                    "unit": "%",
                }
            )
    runs = 200 if args.quick else 2000
    with Ranks(2, "bench_latency", (LATENCY_BYTES, runs), timeout=120.0) as ranks:
        times = ranks.values(timeout=600)[0]
    us = sorted(t * 1e6 for t in times)
    q = statistics.quantiles(us, n=20)
    for name, value in (("median", statistics.median(us)), ("p5", q[0]), ("p95", q[-1]), ("min", us[0])):
        rows.append(
            {
                "system": "sparkgrad",
                "metric": f"allreduce_436KB_2ranks_latency_{name}",
                "value": round(value, 1),
                "unit": "us",
            }
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"{'system':<13} {'metric':<44} {'value':>10} unit")
    for r in rows:
        print(f"{r['system']:<13} {r['metric']:<44} {r['value']:>10} {r['unit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
