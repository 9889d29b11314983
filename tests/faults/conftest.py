"""The fault suite (`make test-faults`): real faults against real processes.

Not collected by `make test` (tests/conftest.py ignores this directory unless
SPARKGRAD_FAULT_SUITE=1). Each test fills a `fault` record (what was done, what
was expected, what was seen, how long it took, what was left behind); at the
end of the session every record, with the test's pass/fail outcome, goes to
tests/faults/results.json (SPARKGRAD_FAULT_RESULTS overrides the path), which
tests/faults/render_table.py renders as the fault table of docs/guide/faults.md.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # cluster_nodes, cluster_checks

RESULTS: list[dict] = []


class FaultRecord:
    """One row of the fault table; the test sets fault/expected/observed and brackets the fault with start()/stop()."""

    def __init__(self, nodeid: str) -> None:
        self.row = {
            "test": nodeid.split("::")[-1],
            "fault": "",
            "expected": "",
            "observed": "",
            "seconds": None,
            "leftovers": None,
        }
        self._t0: float | None = None

    def describe(self, fault: str, expected: str) -> None:
        self.row.update(fault=fault, expected=expected)

    def start(self) -> None:
        self._t0 = time.monotonic()

    def stop(self) -> float:
        assert self._t0 is not None, "stop() before start()"
        self.row["seconds"] = round(time.monotonic() - self._t0, 2)
        return self.row["seconds"]

    def observed(self, text: str) -> None:
        self.row["observed"] = text[:300]

    def leftovers(self, items: list) -> None:
        """Records what was left (processes, threads, ports) and fails the test if anything was."""
        self.row["leftovers"] = "none" if not items else "; ".join(map(str, items))[:300]
        assert not items, f"left behind: {items}"


@pytest.fixture
def fault(request):
    rec = FaultRecord(request.node.nodeid)
    request.node._fault_record = rec
    threads_before = {t.ident for t in threading.enumerate()}
    yield rec
    # no thread of sparkgrad's may outlive a test in this process
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        extra = [
            t.name for t in threading.enumerate() if t.ident not in threads_before and t.name.startswith("sparkgrad")
        ]
        if not extra:
            break
        time.sleep(0.1)
    if extra and rec.row["leftovers"] in (None, "none"):
        rec.row["leftovers"] = f"threads: {extra}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    rec = getattr(item, "_fault_record", None)
    if rec is None:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        rec.row["outcome"] = "skipped" if report.skipped else ("passed" if report.passed else "failed")
        if report.failed:
            rec.row["error"] = _error_line(report)
            if not rec.row["observed"]:
                rec.row["observed"] = rec.row["error"]
            if rec.row["seconds"] is None and rec._t0 is not None:  # failed between start() and stop()
                rec.row["seconds"] = round(time.monotonic() - rec._t0, 2)
        if report.skipped:
            rec.row["error"] = str(report.longrepr)[-300:]
        if rec not in [r for r in RESULTS]:
            RESULTS.append(rec)
    if report.when == "teardown" and report.failed:
        rec.row["outcome"] = "failed"
        rec.row["error"] = "teardown: " + _error_line(report)


def _error_line(report) -> str:
    """The exception line of a failed report ("E   ..." lines), else its last line."""
    text = str(report.longrepr)
    lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    return (lines[0] if lines else text.strip().splitlines()[-1])[:400]


def pytest_sessionfinish(session, exitstatus):
    if not RESULTS:
        return
    path = Path(os.environ.get("SPARKGRAD_FAULT_RESULTS", HERE / "results.json"))
    rows = []
    for rec in RESULTS:
        row = dict(rec.row)
        if row["leftovers"] is None:
            row["leftovers"] = "not checked"
        rows.append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    try:
        import pyspark

        meta["pyspark"] = pyspark.__version__
    except ImportError:
        pass
    path.write_text(json.dumps({"meta": meta, "faults": rows}, indent=1) + "\n")


@pytest.fixture(scope="session")
def standalone(tmp_path_factory):
    """A master and three one-core workers, each a JVM of its own; ended with certainty at the end."""
    pytest.importorskip("pyspark")
    from standalone import StandaloneCluster

    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"), workers=3, cores=1)
    try:
        cluster.start()
        yield cluster
    finally:
        left = cluster.stop()
        assert not left, f"the standalone cluster left processes behind: {left}"
