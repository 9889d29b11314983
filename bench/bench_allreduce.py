"""Ring allreduce over loopback: bus bandwidth beside the TCP ceiling, and latency.

Bus bandwidth of a float32 allreduce of B bytes on n ranks is
2(n-1)/n * B / time (the bytes each rank must send and receive), for
64 KB .. 64 MB on 2, 3 and 4 rank processes (_core.Communicator, one
process per rank, 127.0.0.1). Beside it, in the same run, the loopback TCP
ceiling: a plain socket copy of the same buffer sizes from one process to
another (sendall / recv_into). Then the latency of the 436 KB allreduce (the
MLP's gradient) on 2 ranks: median and spread of many runs. Every figure is
the median of --rounds rounds (min and max beside it); each round measures
the ceiling and then the ring, and a ratio to the ceiling is taken within its
round. Each round also measures the ring's traffic without the ring: n
processes, each sending the same buffers to the next and receiving from the
previous at once over plain sockets ("ring_copy", GB/s per stream). An
n-rank ring needs n such streams at the same time; on a machine with fewer
cores than streams they share the CPUs, so this, not the one-way copy, is
what an n-rank ring can reach here, and the busbw is reported against both.

Embedding tables (the gradient hook's rows path, csrc/net/coll_rows.c): 2
rank processes fit ids -> Embedding(1M, 16) -> Dense(1) with SGD through
DistributedOptimizer, 512 uniform ids per rank and step, with the table
reduced as rows (sparse_tables=True: the union of the touched rows) and
densely (sparse_tables=False), each rank with cores / 2 OpenMP threads;
reported per step: the bytes a rank sent (Communicator.stats()) and the
step time, medians of the rounds.
--embedding-only runs this part alone (results/allreduce_embedding.json).

Where the machine allows it (Linux, root, `ip` and `tc`), also on simulated
hosts: one network namespace per rank, each joined to a hub namespace by a
veth pair rate-limited with `tc tbf` to --link-gbit (1 Gbit/s) in both
directions, so the ring's traffic crosses real links through a router; the
bus bandwidth is reported against the link rate. The namespaces (names
carry the pid) are deleted in a finally. --no-netns skips this part.

--security (none, auth, encrypt; default: _core.SECURITY_DEFAULT) is the
communicators' mode (csrc/net/coll.h "Security"); the loopback TCP ceiling
is always a plain copy. The default mode writes results/allreduce.json,
any other results/allreduce_<mode>.json.

    python bench/bench_allreduce.py [--quick] [--rounds 5] [--netns-rounds 3] [--no-netns] [--link-gbit 1]
                                    [--security auth] [--embedding-only]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import textwrap
import threading
import time

import benchlib

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "tests"))

from coll_ranks import Ranks  # noqa: E402 - the rank processes live beside the tests
from sparkgrad import _core  # noqa: E402

SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
LATENCY_BYTES = 436_000


def label(nbytes: int) -> str:
    return f"{nbytes >> 20}MB" if nbytes >= 1 << 20 else f"{nbytes >> 10}KB"


def iterations(nbytes: int, volume: int) -> int:
    return max(3, min(2000, volume // nbytes))


def _recv_reps(sock: socket.socket, view: memoryview, reps: int) -> bool:
    """Receives len(view) bytes `reps` times into view; False if the peer closed first."""
    for _ in range(reps):
        got = 0
        while got < len(view):
            k = sock.recv_into(view[got:], len(view) - got)
            if k == 0:
                return False
            got += k
    return True


def _tcp_sink(port: int, plan: list) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        for nbytes, reps in plan:
            if not _recv_reps(s, memoryview(bytearray(nbytes)), reps):
                return
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


def _ring_copy_rank(rank: int, n: int, plan: list, ports, barrier, results) -> None:
    """One process of the ring copy: sends to rank+1 while a thread receives from rank-1, each
    size `reps` times, timed from a barrier to the last byte both ways."""
    lis = socket.create_server(("127.0.0.1", 0))
    lis.settimeout(60)
    ports[rank] = lis.getsockname()[1]
    barrier.wait(60)
    right = socket.create_connection(("127.0.0.1", ports[(rank + 1) % n]), timeout=60)
    left, _ = lis.accept()
    left.settimeout(60)
    lis.close()
    out = {}
    with left, right:
        for nbytes, reps in plan:
            send, recv = memoryview(bytearray(nbytes)), memoryview(bytearray(nbytes))
            got = []
            th = threading.Thread(target=lambda v=recv, r=reps, g=got: g.append(_recv_reps(left, v, r)))
            barrier.wait(60)
            t0 = time.perf_counter()
            th.start()
            for _ in range(reps):
                right.sendall(send)
            th.join(120)
            if got != [True]:  # the thread's OSError, if any, went to stderr
                why = "timed out" if th.is_alive() else f"failed: rank {(rank - 1) % n} closed or the socket failed"
                raise RuntimeError(f"ring copy rank {rank}: receiving {nbytes} bytes {why}")
            out[nbytes] = time.perf_counter() - t0
    results.put((rank, out))


def tcp_ring_copy(n: int, plan: list) -> dict[int, float]:
    """Bytes per second of each stream when n processes each send to the next and receive from the
    previous at once (the traffic of an n-rank ring with no reduction): the socket copy's ceiling
    for n concurrent streams on this machine's cores. Per size, the slowest process's time counts."""
    ctx = mp.get_context("spawn")
    ports, barrier, results = ctx.Array("i", n), ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_ring_copy_rank, args=(r, n, plan, ports, barrier, results), daemon=True)
             for r in range(n)]  # fmt: skip
    for proc in procs:
        proc.start()
    try:
        times = {}
        for _ in range(n):
            try:
                rank, out = results.get(timeout=300)
            except Exception as e:  # queue.Empty: a rank died or hung
                dead = [r for r, proc in enumerate(procs) if proc.exitcode not in (None, 0)]
                raise RuntimeError(f"ring copy of {n} processes: no result within 300 s (ranks exited: {dead})") from e
            for nbytes, t in out.items():
                times[nbytes] = max(times.get(nbytes, 0.0), t)
        return {nbytes: nbytes * reps / times[nbytes] for nbytes, reps in plan}
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


NETNS_RANK = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    from sparkgrad import _core

    rank, n, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    plan = json.loads(os.environ["SG_PLAN"])
    addresses = [(host, port) for host in json.loads(os.environ["SG_HOSTS"])]
    lis = _core.Listener(addresses[rank][0], port)
    secret, security = bytes.fromhex(os.environ["SG_SECRET"]), os.environ["SG_SECURITY"]
    with _core.Communicator(lis, secret, rank, addresses, timeout=60, security=security) as comm:
        res = {}
        for nbytes, iters in plan:
            a = np.ones(nbytes // 4, np.float32)
            comm.allreduce(a)
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                comm.allreduce(a)
            res[nbytes] = (time.perf_counter() - t0) / iters
        comm.barrier()
    print(json.dumps(res))
    """
)


def netns_busbw(n: int, plan: list, link_gbit: float, security: str, hosts: list | None = None) -> dict[int, float]:
    """Bus bandwidth (bytes/s) per size on n ranks, one per simulated host (benchlib.linked_hosts,
    built here unless hosts, [(namespace, address)], are given)."""
    if hosts is None:
        with benchlib.linked_hosts(n, link_gbit) as made:
            return netns_busbw(n, plan, link_gbit, security, made)
    env = dict(
        os.environ,
        SG_PLAN=json.dumps(plan),
        SG_SECRET=os.urandom(32).hex(),
        SG_SECURITY=security,
        SG_HOSTS=json.dumps([addr for _, addr in hosts[:n]]),
        PYTHONPATH=os.pathsep.join([str(ROOT.parent / "python"), os.environ.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
    )
    procs: list[subprocess.Popen] = []
    try:
        for k in range(n):
            cmd = ["ip", "netns", "exec", hosts[k][0], sys.executable, "-c", NETNS_RANK, str(k), str(n), "29411"]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        results = []
        for k, p in enumerate(procs):
            out, errs = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"netns rank {k} failed: {errs.strip()[-2000:]}")
            results.append({int(b): t for b, t in json.loads(out).items()})
        return {b: 2 * (n - 1) / n * b / max(r[b] for r in results) for b, _ in plan}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


EMBEDDING = (1_000_000, 16, 512)  # rows, dim, ids per rank and step


def embedding_rows(rounds: int, quick: bool, security: str) -> list[dict]:
    """The Embedding part: bytes per step and step time, the table as rows against dense (each rank process
    with cores / 2 OpenMP threads)."""
    rows_, dim, batch = EMBEDDING
    steps = 10 if quick else 30
    got: dict[str, dict[str, list]] = {}
    # each rank process gets its share of the cores (as bench_overlap.py): OpenMP teams of all the cores
    # in both processes spin against each other and time that, not the reduction
    threads = str(max(1, (os.cpu_count() or 2) // 2))
    saved = {var: os.environ.get(var) for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    os.environ.update(dict.fromkeys(saved, threads))
    try:
        return _embedding_rounds(rounds, steps, security, got)
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def _embedding_rounds(rounds: int, steps: int, security: str, got: dict) -> list[dict]:
    rows_, dim, batch = EMBEDDING
    for k in range(rounds):
        for path, sparse in (("rows", True), ("dense", False)):
            args = (rows_, dim, batch, steps, sparse)
            with Ranks(2, "bench_embedding", args, timeout=120.0, security=security) as ranks:
                per_rank = ranks.values(timeout=600)
            want = (steps, 0) if sparse else (0, 0)
            assert all((r["as_rows"], r["dense"]) == want for r in per_rank), per_rank
            fig = got.setdefault(path, {"step_ms": [], "mb": [], "table_mb": []})
            fig["step_ms"].append(1e3 * max(r["step_s"] for r in per_rank))
            fig["mb"].append(max(r["bytes_per_step"] for r in per_rank) / 1e6)
            fig["table_mb"].append(max(r["table_bytes_per_step"] for r in per_rank) / 1e6)
        print(f"embedding round {k + 1}/{rounds}: rows {got['rows']['step_ms'][-1]:.1f} ms "
              f"{got['rows']['mb'][-1]:.3f} MB, dense {got['dense']['step_ms'][-1]:.1f} ms "
              f"{got['dense']['mb'][-1]:.3f} MB", flush=True)  # fmt: skip
    tag = f"embedding_1Mx{dim}_batch{batch}_2ranks"
    out = []
    for path in ("rows", "dense"):
        fig = got[path]
        out.append(benchlib.median_row("sparkgrad", f"{tag}_{path}_sent_per_step", fig["mb"], "MB", digits=4))
        out.append(benchlib.median_row("sparkgrad", f"{tag}_{path}_step", fig["step_ms"], "ms", digits=2))
    out.append(benchlib.median_row("sparkgrad", f"{tag}_rows_table_sent_per_step", got["rows"]["table_mb"], "MB",
                                   digits=4))  # fmt: skip
    ratio = [d / r for d, r in zip(got["dense"]["step_ms"], got["rows"]["step_ms"], strict=True)]
    out.append(benchlib.median_row("sparkgrad", f"{tag}_step_dense_over_rows", ratio, "x", digits=2))
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-netns", action="store_true", help="skip the rate-limited namespace part")
    ap.add_argument("--link-gbit", type=float, default=1.0, help="veth rate limit of the namespace part")
    ap.add_argument(
        "--security",
        choices=("none", "auth", "encrypt"),
        default=_core.SECURITY_DEFAULT,
        help="the communicators' security mode (default: %(default)s)",
    )
    ap.add_argument("--rounds", type=int, default=None, help="rounds of every loopback figure (default 5, --quick 3)")
    ap.add_argument(
        "--netns-rounds", type=int, default=None, help="rounds of the namespace part (default 3, --quick 1)"
    )
    ap.add_argument("--embedding-only", action="store_true", help="only the Embedding part (allreduce_embedding.json)")
    benchlib.add_update_flag(ap)
    args = ap.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else (3 if args.quick else 5)
    netns_rounds = args.netns_rounds if args.netns_rounds is not None else (1 if args.quick else 3)
    if rounds < 1 or netns_rounds < 1:
        ap.error("--rounds and --netns-rounds must be at least 1")
    meta = benchlib.metadata("allreduce", security=args.security, rounds=rounds, netns_rounds=netns_rounds)
    if args.embedding_only:
        rows = embedding_rows(rounds, args.quick, args.security)
        out = benchlib.results_file("allreduce_embedding.json", args.update)
        out.parent.mkdir(parents=True, exist_ok=True)
        benchlib.write_results(out, rows, meta)
        benchlib.print_rows(rows)
        return 0
    volume = (64 << 20) if args.quick else (256 << 20)
    sizes = SIZES if not args.quick else [64 << 10, 1 << 20, 4 << 20, 64 << 20]
    plan = [(b, iterations(b, volume)) for b in sizes]
    # Each round measures the TCP ceiling, then the ring on 2, 3 and 4 ranks, so that a change in the
    # machine's speed between rounds moves both sides of a ratio; each ratio is taken within its round.
    copy = {b: [] for b in sizes}
    ring_copy = {(n, b): [] for n in (2, 3, 4) for b in sizes}
    bus = {(n, b): [] for n in (2, 3, 4) for b in sizes}
    latency_medians, latency_all = [], []
    runs = max(50, (200 if args.quick else 2000) // rounds)
    for k in range(rounds):
        ceiling = tcp_ceiling(plan)
        for b in sizes:
            copy[b].append(ceiling[b] / 1e9)
        for n in (2, 3, 4):
            streams = tcp_ring_copy(n, plan)
            for b in sizes:
                ring_copy[n, b].append(streams[b] / 1e9)
            with Ranks(n, "bench_allreduce", (plan,), timeout=120.0, security=args.security) as ranks:
                per_rank = ranks.values(timeout=600)
            for b in sizes:
                bus[n, b].append(2 * (n - 1) / n * b / max(r[b] for r in per_rank) / 1e9)
        with Ranks(2, "bench_latency", (LATENCY_BYTES, runs), timeout=120.0, security=args.security) as ranks:
            us = [t * 1e6 for t in ranks.values(timeout=600)[0]]
        latency_medians.append(statistics.median(us))
        latency_all += us
        print(f"round {k + 1}/{rounds}: 2 ranks {label(sizes[-1])} {bus[2, sizes[-1]][-1]:.2f} GB/s, "
              f"copy {copy[sizes[-1]][-1]:.2f} GB/s, 436 KB {latency_medians[-1]:.0f} us", flush=True)  # fmt: skip
    rows = [benchlib.median_row("loopback_tcp", f"copy_{label(b)}", copy[b], "GB/s", digits=3) for b in sizes]
    for n in (2, 3, 4):
        for b in sizes:
            rows.append(benchlib.median_row("loopback_tcp", f"ring_copy_{n}procs_{label(b)}", ring_copy[n, b],
                                            "GB/s per stream", digits=3))  # fmt: skip
            rows.append(benchlib.median_row("loopback_tcp", f"ring_copy_vs_copy_{n}procs_{label(b)}",
                                            [100 * x / c for x, c in zip(ring_copy[n, b], copy[b], strict=True)],
                                            "% (n streams at once, each against one alone)"))  # fmt: skip
    for n in (2, 3, 4):
        for b in sizes:
            rows.append(benchlib.median_row("sparkgrad", f"allreduce_busbw_{n}ranks_{label(b)}", bus[n, b], "GB/s", 3))
            share = [100 * x / c for x, c in zip(bus[n, b], copy[b], strict=True)]  # within each round
            rows.append(benchlib.median_row("sparkgrad", f"allreduce_busbw_vs_tcp_{n}ranks_{label(b)}", share, "%"))
            share = [100 * x / c for x, c in zip(bus[n, b], ring_copy[n, b], strict=True)]
            rows.append(benchlib.median_row("sparkgrad", f"allreduce_busbw_vs_ring_copy_{n}ranks_{label(b)}", share,
                                            "% (of n plain streams at once)"))  # fmt: skip
    # the median row's spread is that of the rounds' medians; p5 and p95 pool every round's runs
    rows.append(benchlib.median_row("sparkgrad", "allreduce_436KB_2ranks_latency_median", latency_medians, "us"))
    q = statistics.quantiles(latency_all, n=20)
    for name, value in (("p5", q[0]), ("p95", q[-1]), ("min", min(latency_all))):
        rows.append(benchlib.row("sparkgrad", f"allreduce_436KB_2ranks_latency_{name}", round(value, 1), "us"))
    reason = "--no-netns" if args.no_netns else benchlib.netns_skip_reason()
    if reason:
        print(f"namespace part skipped: {reason}")
    else:
        link = args.link_gbit * 1e9 / 8
        nsizes = [1 << 20, 16 << 20] if args.quick else SIZES
        for n in (2, 3) if args.quick else (2, 3, 4):
            nplan = [(b, max(2, min(50, int(2 * link) // b))) for b in nsizes]  # about 2 s per size
            got = [netns_busbw(n, nplan, args.link_gbit, args.security) for _ in range(netns_rounds)]
            for b in nsizes:
                tag = f"{n}ranks_{label(b)}_{args.link_gbit:g}gbit"
                values = [g[b] for g in got]
                rows.append(
                    benchlib.median_row("sparkgrad", f"netns_allreduce_busbw_{tag}", [v / 1e6 for v in values], "MB/s")
                )
                rows.append(benchlib.median_row("sparkgrad", f"netns_allreduce_busbw_vs_link_{tag}",
                                                [100 * v / link for v in values], "%"))  # fmt: skip
    rows += embedding_rows(rounds, args.quick, args.security)
    name = "allreduce.json" if args.security == _core.SECURITY_DEFAULT else f"allreduce_{args.security}.json"
    out = benchlib.results_file(name, args.update)
    out.parent.mkdir(parents=True, exist_ok=True)
    benchlib.write_results(out, rows, meta)
    benchlib.print_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
