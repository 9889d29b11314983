"""What every bench script shares: the results file, its metadata, and the median of repeated runs.

A results file (bench/results/<name>.json) is

    {"metadata": {...}, "rows": [{"system", "metric", "value", "unit", ...}, ...]}

Rows keep the one format bench/report.py renders: a figure, or ``value``
None with a ``reason`` (not measured, and why); a median of repeated runs
carries ``min``, ``max`` and ``runs``. The metadata says what the figures
were measured with: versions (sparkgrad and every library a bench compares
against), the CPU's model and the flags that decide the fast paths (AVX-512,
bf16, AMX), the thread settings, and the load average at the start and the
end of the run, since other work on the machine takes cores from every system.
Files written before the metadata existed are a bare list of rows; readers
take both (read_results).

Standard library only: the TensorFlowOnSpark driver imports it too.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The committed figures, which README.md and docs/guide/performance.md render: a bench writes there only
# when asked (--update, which `make bench` passes); any other run writes SCRATCH, so that trying a bench
# never changes a committed file (and never breaks the tests that compare them with the pages).
RESULTS = ROOT / "bench" / "results"
SCRATCH = ROOT / "build" / "bench-results"
# The distributions whose versions every results file records (None: not installed here).
PACKAGES = ("numpy", "torch", "tensorflow", "tensorflow-cpu", "tf-keras", "keras", "pyspark", "tensorflowonspark",
            "tfrecord", "setuptools")  # fmt: skip
# /proc/cpuinfo flags that decide which kernels run: vector width, bf16 dot products, AMX tiles.
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "TF_NUM_INTRAOP_THREADS",
)


def sparkgrad_version() -> str:
    """The source tree's version (python/sparkgrad/_version.py), read without importing the extension."""
    text = (ROOT / "python" / "sparkgrad" / "_version.py").read_text()
    found = re.search(r"__version__\s*=\s*[\"']([^\"']+)[\"']", text)
    return found.group(1) if found else "unknown"


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True, timeout=30)  # fmt: skip
    return out.stdout.strip() + ("+changes" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def versions(packages: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version(), "sparkgrad": sparkgrad_version()}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def cpu_info(cpuinfo: str | None = None) -> dict:
    """The CPU's model, which of CPU_FLAGS it has, and whether it does bf16 natively (AVX512_BF16 or AMX)."""
    if cpuinfo is None:
        try:
            cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")), None)
    flags_line = next((ln.split(":", 1)[1] for ln in cpuinfo.splitlines() if ln.startswith("flags")), "")
    flags = set(flags_line.split())
    have = [f for f in CPU_FLAGS if f in flags]
    return {
        "model": model or platform.processor() or None,
        "flags": have,
        "bf16": "avx512_bf16" in flags or "amx_bf16" in flags,
        "amx": "amx_tile" in flags,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def metadata(bench: str, argv: list[str] | None = None, packages: Iterable[str] = PACKAGES, **extra) -> dict:
    """Taken at a bench's start; write_results adds the end."""
    return {
        "bench": bench,
        "argv": list(sys.argv[1:] if argv is None else argv),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "versions": versions(packages),
        "cpu": cpu_info(),
        "threads": {v: os.environ.get(v) for v in THREAD_VARS},
        "load_average_start": load_average(),
        **extra,
    }


def add_update_flag(parser) -> None:
    """--update: the argument every bench takes to write the committed results (see RESULTS)."""
    parser.add_argument(
        "--update",
        action="store_true",
        help=f"write bench/results/ (the committed figures the docs render); default: {SCRATCH.relative_to(ROOT)}/",
    )


def results_file(name: str, update: bool) -> pathlib.Path:
    """Where a bench writes its results file ``name`` (e.g. "train.json"): RESULTS with --update, else SCRATCH."""
    return (RESULTS if update else SCRATCH) / name


def write_results(path: str | os.PathLike, rows: list[dict], meta: dict) -> dict:
    """Writes {"metadata", "rows"} with the end's time and load average; returns the metadata."""
    meta = dict(meta)
    meta["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    meta["load_average_end"] = load_average()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metadata": meta, "rows": rows}, indent=1) + "\n")
    return meta


def read_results(path: str | os.PathLike) -> tuple[dict | None, list[dict]]:
    """(metadata or None for a file that predates it, rows)."""
    data = json.loads(pathlib.Path(path).read_text())
    if isinstance(data, list):
        return None, data
    if isinstance(data, dict) and isinstance(data.get("rows"), list):
        return data.get("metadata"), data["rows"]
    raise ValueError(f"{path}: expected a list of rows or {{'metadata', 'rows'}}")


def kept_rows(path: str | os.PathLike, keep: Callable[[dict], bool]) -> tuple[list[dict], dict]:
    """The rows ``keep`` selects of an earlier results file at ``path``, and its metadata ({} for none, or
    no file): what a bench that measures only some of its rows again carries over (see `run_of`)."""
    if not pathlib.Path(path).exists():
        return [], {}
    meta, rows = read_results(path)
    return [r for r in rows if keep(r)], meta or {}


def run_of(meta: dict) -> str:
    """Which run a results file's metadata describes, for a note on rows kept from it."""
    return f"the run of {meta.get('started', '?')} (commit {meta.get('commit', '?')})"


def python_with(candidates: Iterable[str], modules: Iterable[str], timeout: float = 300.0) -> tuple[str | None, str]:
    """The first interpreter of ``candidates`` that imports every module; (path, "") or (None, why not)."""
    modules = list(modules)
    tried = []
    for python in dict.fromkeys(p for p in candidates if p):
        if not os.path.exists(python):
            tried.append(f"{python}: absent")
            continue
        try:
            r = subprocess.run(
                [python, "-c", "import " + ", ".join(modules)], capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            tried.append(f"{python}: importing {', '.join(modules)} took over {timeout:g} s")
            continue
        if r.returncode == 0:
            return python, ""
        tried.append(f"{python}: {(r.stderr.strip().splitlines() or ['import failed'])[-1]}")
    return None, f"no interpreter with {', '.join(modules)} (" + "; ".join(tried) + ")"


# ---- rows ------------------------------------------------------------------------------------


def run_worker(script: str, python: str, args: list[str], env: dict, timeout: float) -> tuple[dict | None, str]:
    """Runs ``python script --worker *args`` under ``env``; (the JSON result its last stdout line holds, or
    None and why: a timeout, an exit status with the last line of stderr, or the ``unsupported`` it reported)."""
    try:
        out = subprocess.run([python, script, "--worker", *args], env=env, capture_output=True, text=True,
                             timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        print(f"  {' '.join(args)}: timed out after {timeout:.0f} s", file=sys.stderr)
        return None, f"timed out after {timeout:.0f} s"
    if out.returncode != 0:
        print(f"  {' '.join(args)} failed:\n{out.stderr[-2000:]}", file=sys.stderr)
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"exit status {out.returncode}: {last[-200:]}"
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if "unsupported" in res:
        return None, res["unsupported"]
    return res, ""


def print_rows(rows: list[dict]) -> None:
    """The rows as a table on stdout (system, metric, value, unit, and why a row was not measured)."""
    ws = max([len("system")] + [len(str(r["system"])) for r in rows])
    wm = max([len("metric")] + [len(str(r["metric"])) for r in rows])
    print(f"{'system':<{ws}} {'metric':<{wm}} {'value':>10} unit")
    for r in rows:
        print(f"{r['system']:<{ws}} {r['metric']:<{wm}} {r['value']!s:>10} {r['unit']} {r.get('reason', '')}".rstrip())


# The systems of bench_feed.py's Spark floors, which report.py sets against the other systems.
FLOOR_FEED = "Spark's floor (mapInArrow counting the fed columns' rows)"
FLOOR_SCORE = "Spark's floor (mapInArrow counting the features' rows)"


def row(system: str, metric: str, value, unit: str, **extra) -> dict:
    return {"system": system, "metric": metric, "value": value, "unit": unit, **extra}


def not_measured(system: str, metric: str, reason: str, unit: str = "") -> dict:
    """A row for a figure that could not be measured: value None and why."""
    return {"system": system, "metric": metric, "value": None, "unit": unit, "reason": reason}


def summarise(values: Iterable[float]) -> dict:
    """Median, min, max, number of runs and the spread ((max - min) / median) of repeated measurements."""
    got = sorted(float(v) for v in values)
    if not got:
        raise ValueError("summarise: no measurements")
    median = statistics.median(got)
    spread = (got[-1] - got[0]) / median if median else 0.0
    return {"median": median, "min": got[0], "max": got[-1], "runs": len(got), "spread": spread}


def median_row(system: str, metric: str, values: Iterable[float], unit: str, digits: int = 1, **extra) -> dict:
    """A row whose value is the median of ``values``, with min, max and runs beside it."""
    s = summarise(values)

    def rnd(x: float):
        return round(x) if digits == 0 else round(x, digits)

    return row(system, metric, rnd(s["median"]), unit, min=rnd(s["min"]), max=rnd(s["max"]), runs=s["runs"], **extra)


def repeat(measure: Callable[[], float], runs: int) -> dict:
    """Calls ``measure`` ``runs`` times and summarises what it returned."""
    if runs < 1:
        raise ValueError(f"repeat: runs must be at least 1, got {runs}")
    return summarise(measure() for _ in range(runs))


def summarise_runs(runs: list[dict]) -> dict:
    """The median of every numeric key over a list of per-run dicts (keys of the first run),
    with ``<key>_min`` and ``<key>_max`` beside each."""
    out: dict = {}
    for key, first in runs[0].items():
        if isinstance(first, bool) or not isinstance(first, (int, float)):
            continue
        values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
        if values:
            s = summarise(values)
            out[key], out[f"{key}_min"], out[f"{key}_max"] = s["median"], s["min"], s["max"]
    out["runs"] = len(runs)
    return out


def _sh(*cmd: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=15, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {r.stderr.strip()}")


def netns_skip_reason() -> str | None:
    """Why simulated hosts (linked_hosts) cannot be built here, or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux-only"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "`ip` and `tc` (iproute2) are needed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    return None


@contextlib.contextmanager
def linked_hosts(n: int, link_gbit: float):
    """n simulated hosts: network namespaces, each joined to a router namespace by a veth pair
    rate-limited with `tc tbf` to link_gbit in both directions. Yields [(namespace, address)];
    host k is 10.214.<k+1>.2. Everything is deleted on exit."""
    tag = f"{os.getpid() % 100000}"
    hub = f"sgb{tag}h"
    made: list[str] = []
    try:
        hosts = []
        for ns in [hub] + [f"sgb{tag}r{k}" for k in range(n)]:
            _sh("ip", "netns", "add", ns)
            made.append(ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        rate = f"{link_gbit}gbit"
        for k in range(n):
            ns, hub_if, node_if = f"sgb{tag}r{k}", f"sgb{tag}h{k}", f"sgb{tag}n{k}"
            _sh("ip", "-n", hub, "link", "add", hub_if, "type", "veth", "peer", "name", node_if)
            _sh("ip", "-n", hub, "link", "set", node_if, "netns", ns)
            _sh("ip", "-n", hub, "addr", "add", f"10.214.{k + 1}.1/24", "dev", hub_if)
            _sh("ip", "-n", ns, "addr", "add", f"10.214.{k + 1}.2/24", "dev", node_if)
            _sh("ip", "-n", hub, "link", "set", hub_if, "up")
            _sh("ip", "-n", ns, "link", "set", node_if, "up")
            _sh("ip", "-n", ns, "route", "add", "default", "via", f"10.214.{k + 1}.1")
            for where, dev in ((hub, hub_if), (ns, node_if)):  # both directions of the link
                tbf = ("root", "tbf", "rate", rate, "burst", "1mb", "latency", "100ms")
                _sh("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, *tbf)
            hosts.append((ns, f"10.214.{k + 1}.2"))
        _sh("ip", "netns", "exec", hub, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        yield hosts
    finally:
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=15, check=False)
