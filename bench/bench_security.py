"""What frame protection costs: ps push_pull and ring allreduce with security "none", "auth" and "encrypt".

For a 436 KB buffer (the walkthrough MLP's gradient, 109,000 float32) and a
16 MB one, in the same run:
- ps: push_pull round trips per second of one PsClient against one PsServer
  serving from a thread of this process over loopback (async, SGD), and the
  parameter bandwidth it amounts to (gradients out + parameters back);
- allreduce: bus bandwidth (2(n-1)/n x bytes / time) of 2 rank processes
  (_core.Communicator, tests/coll_ranks.py) over loopback;
- the same push_pull and allreduce between 2 simulated hosts (network
  namespaces joined through a router namespace by veth pairs rate-limited
  with `tc tbf` to each rate of --link-gbit, 10 and 5 Gbit/s by default:
  benchlib.linked_hosts), the ps shard on one host and its worker on the
  other, where the machine allows it (root, iproute2; else a row says why),
  with the allreduce's share of the link rate beside it.
Loopback is the worst case for protection: a byte there costs a memory copy,
about what authenticating it costs, so the loopback cost is an upper bound;
on a link of a cluster's speed the hashing overlaps the transfer, as long as
the hosts have CPU to spare. The simulated hosts do not always have it: both,
with their kernels' network path and the router between them, share this
machine's CPUs, so where "none" falls short of the link rate the CPUs are
the limit and every cycle the tag takes comes off the throughput.
The three modes run interleaved, --runs times each (3; --quick: 1), so a
change in the machine's load falls on all of them alike; each figure is the
median with its spread. The cost of a mode is its throughput's shortfall
against "none" in percent. The issue's target for the default mode: at most
10% at 16 MB and 20% at 436 KB.

    python bench/bench_security.py [--quick] [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import benchlib

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "tests"))

from bench_allreduce import netns_busbw  # noqa: E402
from bench_ps import measure  # noqa: E402
from coll_ranks import Ranks  # noqa: E402 - the rank processes live beside the tests
from sparkgrad import _core  # noqa: E402

MODES = ("none", "auth", "encrypt")
SIZES = {"436KB": 109_000, "16MB": 4 << 20}  # float32 values


def ps_rate(total: int, mode: str, seconds: float) -> float:
    """push_pull round trips per second of one client against one ps shard (bench_ps.py's measure)."""
    return measure(total, 1, seconds, mode)[0]


# One end of a push_pull pair on a simulated host: "server" serves one worker, "client" times
# push_pull for SG_SECONDS after a warm-up and prints its round trips per second.
PS_HOST = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    from sparkgrad import _core

    role, host, port, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    secret, security = bytes.fromhex(os.environ["SG_SECRET"]), os.environ["SG_SECURITY"]
    if role == "server":
        lis = _core.Listener(host, port)
        srv = _core.PsServer(lis, secret, 0, total, total, 1, lr=0.01, params=np.zeros(total, np.float32),
                             security=security)
        print("ready", flush=True)
        srv.serve(timeout=120)
        lis.close()
        print(json.dumps({}))
    else:
        client = _core.PsClient([(host, port)], secret, total, 0, 30.0, security=security)
        grads, params = np.full(total, 1e-3, np.float32), np.empty(total, np.float32)
        for _ in range(5):
            client.push_pull(grads, params)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < float(os.environ["SG_SECONDS"]):
            client.push_pull(grads, params)
            n += 1
        rate = n / (time.perf_counter() - t0)
        client.done()
        print(json.dumps({"rate": rate}))
    """
)


def linked_ps_rate(hosts: list, total: int, mode: str, seconds: float) -> float:
    """push_pull/s of a worker on hosts[1] against a ps shard on hosts[0]."""
    env = dict(os.environ, SG_SECRET=os.urandom(32).hex(), SG_SECURITY=mode, SG_SECONDS=str(seconds),
               PYTHONPATH=os.pathsep.join([str(ROOT.parent / "python"), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")  # fmt: skip
    (server_ns, server_host), (client_ns, _) = hosts[0], hosts[1]
    port = "29412"

    def start(ns: str, role: str) -> subprocess.Popen:
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-c", PS_HOST, role, server_host, port, str(total)]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    procs = [start(server_ns, "server")]
    try:
        ready = procs[0].stdout.readline()  # the listener is bound before "ready" is printed
        if ready.strip() != "ready":
            raise RuntimeError(f"ps host did not start: {procs[0].communicate(timeout=30)[1].strip()[-2000:]}")
        procs.append(start(client_ns, "client"))
        outs = []
        for role, p in zip(("ps", "worker"), procs, strict=True):
            out, errs = p.communicate(timeout=seconds + 120)
            if p.returncode != 0:
                raise RuntimeError(f"{role} host failed: {errs.strip()[-2000:]}")
            outs.append(out)
        return float(json.loads(outs[1].strip().splitlines()[-1])["rate"])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def allreduce_busbw(plan: list, mode: str) -> dict[int, float]:
    """Bus bandwidth (bytes/s) of 2 ranks per buffer size in plan [(bytes, iterations)]."""
    with Ranks(2, "bench_allreduce", (plan,), timeout=120.0, security=mode) as ranks:
        per_rank = ranks.values(timeout=600)
    return {b: 2 * (2 - 1) / 2 * b / max(r[b] for r in per_rank) for b, _ in plan}


def linked_runs(rate: float, runs: int, seconds: float) -> dict[str, dict]:
    """The ps and allreduce between 2 simulated hosts on links of `rate` Gbit/s, the modes
    interleaved run by run: {"ps", "ring", "link"} each {(size name, mode): [per run]}, "link"
    the allreduce's bus bandwidth in percent of the link rate (with 2 ranks each sends the
    buffer's size over its link per allreduce, so 100% is the link's limit)."""
    out: dict[str, dict] = {"ps": {}, "ring": {}, "link": {}}
    nplan = [(4 * n, max(3, min(100, int(rate * 1e9 / 8) // (4 * n)))) for n in SIZES.values()]  # ~1 s a size
    with benchlib.linked_hosts(2, rate) as hosts:
        for _ in range(runs):
            for mode in MODES:
                for (name, total), step in zip(SIZES.items(), nplan, strict=True):
                    out["ps"].setdefault((name, mode), []).append(linked_ps_rate(hosts, total, mode, seconds))
                    bus = netns_busbw(2, [step], rate, mode, hosts)[step[0]]
                    out["ring"].setdefault((name, mode), []).append(bus / 1e9)
                    out["link"].setdefault((name, mode), []).append(100 * bus / (rate * 1e9 / 8))
    return out


def cost_row(mode: str, what: str, name: str, table: dict) -> dict:
    """The shortfall of mode's median throughput against "none" in percent."""
    base = benchlib.summarise(table[(name, "none")])["median"]
    got = benchlib.summarise(table[(name, mode)])["median"]
    return {"system": f"sparkgrad security={mode}", "metric": f"{what} cost against none, {name}",
            "value": round(100 * (1 - got / base), 1), "unit": "%"}  # fmt: skip


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one run of each, shorter timings (about a minute)")
    ap.add_argument("--runs", type=int, default=None, help="runs of each mode (default 3; --quick: 1)")
    ap.add_argument("--link-gbit", default="10,5", help="rate limits of the simulated hosts' links, comma-separated")
    ap.add_argument("--no-netns", action="store_true", help="skip the simulated hosts")
    benchlib.add_update_flag(ap)
    args = ap.parse_args(argv)
    runs = args.runs or (1 if args.quick else 3)
    try:
        rates = [float(r) for r in args.link_gbit.split(",")]
    except ValueError:
        ap.error(f"--link-gbit {args.link_gbit!r}: expected Gbit/s rates separated by commas, such as 10,5")
    meta = benchlib.metadata("security")
    meta["notes"] = [
        f"default mode: {_core.SECURITY_DEFAULT}",
        "OpenSSL's libcrypto: auth = ChaCha20-Poly1305 tag over header, seq and payload (sent in clear); "
        "encrypt = AES-256-GCM",
        "% of the link rate: the 2 simulated hosts' allreduce bus bandwidth over the link's rate in bytes/s; "
        "both hosts, their kernels' network path and the router share this machine's CPUs",
    ]
    seconds = 0.5 if args.quick else 2.0
    volume = (64 << 20) if args.quick else (256 << 20)
    plan = [(4 * n, max(5, min(500, volume // (4 * n)))) for n in SIZES.values()]
    ps: dict[tuple[str, str], list[float]] = {}
    ring: dict[tuple[str, str], list[float]] = {}
    for _ in range(runs):
        for mode in MODES:  # interleaved: load changes fall on every mode alike
            for name, total in SIZES.items():
                ps.setdefault((name, mode), []).append(ps_rate(total, mode, seconds))
            bus = allreduce_busbw(plan, mode)
            for name, (nbytes, _) in zip(SIZES, plan, strict=True):
                ring.setdefault((name, mode), []).append(bus[nbytes] / 1e9)
    no_netns = "--no-netns" if args.no_netns else benchlib.netns_skip_reason()
    linked = {} if no_netns else {rate: linked_runs(rate, runs, seconds) for rate in rates}
    rows = []
    for name in SIZES:
        for mode in MODES:
            system = f"sparkgrad security={mode}"
            rows.append(benchlib.median_row(system, f"ps push_pull/s, {name}", ps[(name, mode)], "1/s"))
            rows.append(benchlib.median_row(system, f"allreduce bus bandwidth, 2 ranks, {name}", ring[(name, mode)],
                                            "GB/s", 3))  # fmt: skip
            for rate in rates:
                link = f"{rate:g} Gbit/s links"
                for metric, key, unit, digits in (
                    (f"ps push_pull/s, 2 hosts, {link}, {name}", "ps", "1/s", 1),
                    (f"allreduce bus bandwidth, 2 hosts, {link}, {name}", "ring", "GB/s", 3),
                    (f"allreduce, 2 hosts, {link}, % of the link rate, {name}", "link", "%", 0),
                ):
                    if no_netns:
                        rows.append(benchlib.not_measured(system, metric, no_netns, unit))
                    else:
                        rows.append(benchlib.median_row(system, metric, linked[rate][key][(name, mode)], unit, digits))
        for mode in MODES[1:]:
            rows.append(cost_row(mode, "ps push_pull", name, ps))
            rows.append(cost_row(mode, "allreduce", name, ring))
            for rate, got in linked.items():
                rows.append(cost_row(mode, f"ps push_pull over {rate:g} Gbit/s links", name, got["ps"]))
                rows.append(cost_row(mode, f"allreduce over {rate:g} Gbit/s links", name, got["ring"]))
    results = benchlib.results_file("security.json", args.update)
    benchlib.write_results(results, rows, meta)
    benchlib.print_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
