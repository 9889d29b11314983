"""The driver process SIGKILLed mid-training on the standalone cluster: every node ends on its own within its
timeout and nothing of the job is left (no node, no executor JVM of the job, no Python worker, no port)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_checks import port_closed
from standalone import alive, descendants

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

HERE = Path(__file__).resolve().parent


def _markers(d: Path, what: str, n: int, timeout: float, proc: subprocess.Popen, log: Path) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    found: dict[str, dict] = {}
    while time.monotonic() < deadline:
        for p in d.glob(f"{what}-*.json"):
            info = json.loads(p.read_text())
            found[info["name"]] = info
        if len(found) >= n:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"the driver exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"{len(found)} of {n} {what} markers within {timeout} s:\n{log.read_text()[-3000:]}")


def test_driver_killed_mid_training(standalone, tmp_path, fault):
    fault.describe(
        "driver process SIGKILLed while 1 ps + 2 workers train (standalone cluster)",
        "every node ends by itself within its timeout; no node, executor, Python worker or port left",
    )
    out = tmp_path / "nodes"
    out.mkdir()
    log = tmp_path / "driver.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parents[1] / "python"), str(HERE)]))
    with open(log, "wb") as f:
        driver = subprocess.Popen(
            [sys.executable, str(HERE / "driver_job.py"), standalone.url, str(out)],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    family: set[int] = set()
    try:
        nodes = _markers(out, "started", 3, 120, driver, log)
        _markers(out, "training", 2, 60, driver, log)
        family = set(descendants(driver.pid))  # its JVM (spark-submit), whatever else it started
        jvms = {n["jvm"] for n in nodes.values()}
        fault.start()
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(10)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(alive(n["pid"]) for n in nodes.values()):
            time.sleep(0.1)
        seconds = fault.stop()
        left = [f"node {name} (pid {n['pid']}) still alive after 60 s" for name, n in nodes.items() if alive(n["pid"])]
        fault.observed(f"every node ended {seconds:.1f} s after the driver's SIGKILL" if not left else "; ".join(left))
        assert not left
        # then the rest of the job: the driver's JVM, the job's executor JVMs, their Python processes, the ports
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rest = [f"driver-side {p}" for p in family if alive(p)]
            rest += [f"executor JVM {j}" for j in jvms if alive(j)]
            rest += [f"{pid}: {line}" for pid, line in standalone.leftovers()]
            rest += [f"port {n['port']} of {name}" for name, n in nodes.items() if not port_closed(n["port"])]
            if not rest:
                break
            time.sleep(0.5)
        fault.leftovers(rest)
    finally:
        for pid in [driver.pid, *family]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if driver.poll() is None:
            driver.wait(10)
