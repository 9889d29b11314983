"""What frame protection costs: ps push_pull and ring allreduce with security "none", "auth" and "encrypt".

For a 436 KB buffer (the walkthrough MLP's gradient, 109,000 float32) and a
16 MB one, in the same run:
- ps: push_pull round trips per second of one PsClient against one PsServer
  serving from a thread of this process over loopback (async, SGD), and the
  parameter bandwidth it amounts to (gradients out + parameters back);
- allreduce: bus bandwidth (2(n-1)/n x bytes / time) of 2 rank processes
  (_core.Communicator, tests/coll_ranks.py) over loopback;
- the same allreduce between 2 simulated hosts (network namespaces joined
  through a router namespace by veth pairs rate-limited with `tc tbf` to
  --link-gbit, 10 Gbit/s by default, as bench_allreduce.py builds them),
  where the machine allows it (root, iproute2; else a row says why).
Loopback is the worst case for protection: a byte there costs a memory copy,
about what authenticating it costs, so the loopback cost is an upper bound;
on a link of a cluster's speed the hashing overlaps the transfer.
The three modes run interleaved, --runs times each (3; --quick: 1), so a
change in the machine's load falls on all of them alike; each figure is the
median with its spread. The cost of a mode is its throughput's shortfall
against "none" in percent. The issue's target for the default mode: at most
10% at 16 MB and 20% at 436 KB.

    python bench/bench_security.py [--quick] [--runs N]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import benchlib

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "tests"))

from bench_allreduce import netns_busbw, netns_skip_reason  # noqa: E402
from bench_ps import measure  # noqa: E402
from coll_ranks import Ranks  # noqa: E402 - the rank processes live beside the tests
from sparkgrad import _core  # noqa: E402

RESULTS = ROOT / "results" / "security.json"
MODES = ("none", "auth", "encrypt")
SIZES = {"436KB": 109_000, "16MB": 4 << 20}  # float32 values


def ps_rate(total: int, mode: str, seconds: float) -> float:
    """push_pull round trips per second of one client against one ps shard (bench_ps.py's measure)."""
    return measure(total, 1, seconds, mode)[0]


def allreduce_busbw(plan: list, mode: str) -> dict[int, float]:
    """Bus bandwidth (bytes/s) of 2 ranks per buffer size in plan [(bytes, iterations)]."""
    with Ranks(2, "bench_allreduce", (plan,), timeout=120.0, security=mode) as ranks:
        per_rank = ranks.values(timeout=600)
    return {b: 2 * (2 - 1) / 2 * b / max(r[b] for r in per_rank) for b, _ in plan}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one run of each, shorter timings (about a minute)")
    ap.add_argument("--runs", type=int, default=None, help="runs of each mode (default 3; --quick: 1)")
    ap.add_argument("--link-gbit", type=float, default=10.0, help="rate limit of the simulated hosts' links")
    ap.add_argument("--no-netns", action="store_true", help="skip the simulated hosts")
    args = ap.parse_args(argv)
    runs = args.runs or (1 if args.quick else 3)
    meta = benchlib.metadata("security")
    meta["notes"] = [
        f"default mode: {_core.SECURITY_DEFAULT}",
        "AES-256-GCM through OpenSSL's libcrypto; auth = GMAC tag over header, seq and payload",
    ]
    seconds = 0.5 if args.quick else 2.0
    volume = (64 << 20) if args.quick else (256 << 20)
    plan = [(4 * n, max(5, min(500, volume // (4 * n)))) for n in SIZES.values()]
    ps: dict[tuple[str, str], list[float]] = {}
    ring: dict[tuple[str, str], list[float]] = {}
    linked: dict[tuple[str, str], list[float]] = {}
    no_netns = "--no-netns" if args.no_netns else netns_skip_reason()
    link = f"{args.link_gbit:g} Gbit/s links"
    nplan = [(b, max(3, min(100, int(args.link_gbit * 1e9 / 8) // b))) for b, _ in plan]  # about 1 s per size
    for _ in range(runs):
        for mode in MODES:  # interleaved: load changes fall on every mode alike
            for name, total in SIZES.items():
                ps.setdefault((name, mode), []).append(ps_rate(total, mode, seconds))
            bus = allreduce_busbw(plan, mode)
            for name, (nbytes, _) in zip(SIZES, plan, strict=True):
                ring.setdefault((name, mode), []).append(bus[nbytes] / 1e9)
            if not no_netns:
                bus = netns_busbw(2, nplan, args.link_gbit, mode)
                for name, (nbytes, _) in zip(SIZES, nplan, strict=True):
                    linked.setdefault((name, mode), []).append(bus[nbytes] / 1e9)
    rows = []
    for name in SIZES:
        for mode in MODES:
            system = f"sparkgrad security={mode}"
            rows.append(benchlib.median_row(system, f"ps push_pull/s, {name}", ps[(name, mode)], "1/s"))
            rows.append(benchlib.median_row(system, f"allreduce bus bandwidth, 2 ranks, {name}", ring[(name, mode)],
                                            "GB/s", 3))  # fmt: skip
            metric = f"allreduce bus bandwidth, 2 hosts, {link}, {name}"
            if no_netns:
                rows.append(benchlib.not_measured(system, metric, no_netns, "GB/s"))
            else:
                rows.append(benchlib.median_row(system, metric, linked[(name, mode)], "GB/s", 3))
        for mode in MODES[1:]:
            for what, table in (("ps push_pull", ps), ("allreduce", ring), (f"allreduce over {link}", linked)):
                if (name, "none") not in table:
                    continue
                base = benchlib.summarise(table[(name, "none")])["median"]
                got = benchlib.summarise(table[(name, mode)])["median"]
                rows.append(
                    {
                        "system": f"sparkgrad security={mode}",
                        "metric": f"{what} cost against none, {name}",
                        "value": round(100 * (1 - got / base), 1),
                        "unit": "%",
                    }
                )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    benchlib.write_results(RESULTS, rows, meta)
    benchlib.print_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
