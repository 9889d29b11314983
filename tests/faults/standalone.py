"""A real standalone Spark cluster on 127.0.0.1: a master and N workers, each its own JVM.

The jars and bin/spark-class come from the pyspark pip package (SPARK_HOME is
set to the package's directory). Every port is chosen free by binding port 0;
every log and work directory lives under the directory the caller gives. stop()
ends every process the cluster started (the JVMs, the executors they launched
and the Python daemons and workers under those) and says which, if any,
survived SIGKILL; leftovers() finds any process whose working directory is
inside the cluster's work directories (executors and their Python children run
there), so nothing can escape the check by being re-parented to init.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid (children first found by one /proc scan)."""
    children: dict[int, list[int]] = {}
    for p in all_pids():
        pp = _ppid(p)
        if pp is not None:
            children.setdefault(pp, []).append(p)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def listening_ports(pid: int) -> set[int]:
    """TCP ports in LISTEN state held by pid's sockets (from /proc/net/tcp{,6} and its fds)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return set()
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


class StandaloneCluster:
    """A master and `workers` workers of `cores` cores each, all on 127.0.0.1."""

    def __init__(self, root: Path, workers: int = 3, cores: int = 1, memory: str = "1g") -> None:
        import pyspark

        self.spark_home = os.path.dirname(pyspark.__file__)
        self.root = Path(root)
        self.workers, self.cores, self.memory = workers, cores, memory
        self.master_port = free_port()
        self.url = f"spark://127.0.0.1:{self.master_port}"
        self.procs: list[subprocess.Popen] = []
        self.worker_procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self.work_dirs: list[Path] = []

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=self.spark_home,
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_DAEMON_MEMORY="256m",
            SPARK_LOG_DIR=str(self.root / "logs"),
            SPARK_CONF_DIR=str(self.root / "conf"),
            PYSPARK_PYTHON=sys.executable,
        )
        env.pop("SPARK_WORKER_INSTANCES", None)
        return env

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        log = self.root / "logs" / f"{name}.log"
        self.logs.append(log)
        with open(log, "wb") as out:
            p = subprocess.Popen(
                [os.path.join(self.spark_home, "bin", "spark-class"), *args],
                env=self._env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.root,
            )
        self.procs.append(p)
        return p

    def _wait_log(self, log: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if log.exists() and text in log.read_text(errors="replace"):
                return
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{log.stem} exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}"
                )
            time.sleep(0.2)
        raise RuntimeError(f"{log.stem}: no {text!r} in its log within {timeout:.0f} s:\n{log.read_text()[-3000:]}")

    def start(self, timeout: float = 90.0) -> None:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        (self.root / "conf").mkdir(parents=True, exist_ok=True)
        # only WARN and above from the daemons, and to the console (the log files above)
        log4j = "rootLogger.level = info\nrootLogger.appenderRef.stdout.ref = console\n"
        log4j += "appender.console.type = Console\nappender.console.name = console\n"
        log4j += "appender.console.layout.type = PatternLayout\nappender.console.layout.pattern = %d %p %c: %m%n\n"
        (self.root / "conf" / "log4j2.properties").write_text(log4j)
        master = self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.master_port),
            "--webui-port",
            str(free_port()),
        )
        self._wait_log(self.root / "logs" / "master.log", "I have been elected leader", master, timeout)
        for i in range(self.workers):
            work = self.root / f"work-{i}"
            work.mkdir()
            self.work_dirs.append(work)
            p = self._spawn(
                f"worker-{i}",
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
                "--webui-port",
                str(free_port()),
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(work),
                self.url,
            )
            self.worker_procs.append(p)
        for i, p in enumerate(self.worker_procs):
            self._wait_log(self.root / "logs" / f"worker-{i}.log", "Successfully registered with master", p, timeout)

    def executor_jvms(self) -> list[int]:
        """Live executor JVMs (CoarseGrainedExecutorBackend) launched by the workers."""
        out = []
        for w in self.worker_procs:
            for pid in descendants(w.pid):
                if alive(pid) and "CoarseGrainedExecutorBackend" in cmdline(pid):
                    out.append(pid)
        return out

    def python_under_executors(self) -> list[tuple[int, str]]:
        """Python processes under the executor JVMs other than pyspark's daemon (workers, strays)."""
        out = []
        for jvm in self.executor_jvms():
            for pid in descendants(jvm):
                line = cmdline(pid)
                if alive(pid) and "pyspark.daemon" not in line and "CoarseGrainedExecutorBackend" not in line:
                    out.append((pid, line[:200]))
        return out

    def leftovers(self) -> list[tuple[int, str]]:
        """Any live process, other than the master and workers, running in the cluster's directories."""
        own = {p.pid for p in self.procs}
        roots = [str(self.root)]
        found = []
        for pid in all_pids():
            if pid in own or pid == os.getpid():
                continue
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            if any(cwd == r or cwd.startswith(r + "/") for r in roots) and alive(pid):
                found.append((pid, cmdline(pid)[:200]))
        return found

    def stop(self, timeout: float = 30.0) -> list[str]:
        """Ends everything; returns descriptions of processes still alive after SIGKILL (should be none)."""
        victims = set()
        for p in self.procs:
            victims.add(p.pid)
            victims.update(descendants(p.pid))
        victims.update(pid for pid, _ in self.leftovers())
        for p in self.procs:  # a clean stop first: workers kill their executors
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout / 2
        while time.monotonic() < deadline and any(alive(v) for v in victims):
            time.sleep(0.2)
        for v in victims:
            if alive(v):
                try:
                    os.kill(v, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout / 2)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(v) for v in victims):
            time.sleep(0.1)
        left = [f"{v}: {cmdline(v)[:200]}" for v in victims if alive(v)]
        left += [f"{pid}: {line}" for pid, line in self.leftovers()]
        return left
