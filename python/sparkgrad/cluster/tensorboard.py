"""TensorBoard for a cluster started with tensorboard=True, run on the driver.

The chief writes event files to log_dir (a path the driver can read: local
for the local launcher, a shared mount such as /dbfs on Databricks);
TensorBoard serves them from the driver, where a notebook can reach it. It
binds a port the OS picks (``--port 0``) and the URL is read from its own
start-up line, so no port is guessed.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import threading
from collections import deque

from sparkgrad.errors import ClusterError

_URL = re.compile(r"TensorBoard \S+ at (http://\S+?)/? ")


def installed() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


class TensorBoard:
    """A TensorBoard process serving ``log_dir`` on ``host``; close() ends it."""

    # TensorBoard imports TensorFlow when it is installed: on a loaded 2-core machine that
    # alone took 17 s, and the URL came after more than 60 s.
    def __init__(self, log_dir: str, host: str, timeout: float = 120.0) -> None:
        self.log_dir = log_dir
        self.url = ""
        self._lines: deque[str] = deque(maxlen=20)
        self._ready = threading.Event()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", log_dir, "--host", host, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, name="sparkgrad-tensorboard", daemon=True)
        self._reader.start()
        if not self._ready.wait(timeout) or not self.url:
            self.close()
            tail = "\n".join(self._lines)
            raise ClusterError(f"TensorBoard did not report its URL within {timeout:g} s; its output:\n{tail}")

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:  # drained until exit, so TensorBoard never blocks on a full pipe
            self._lines.append(line.rstrip())
            match = _URL.search(line)
            if match and not self.url:
                self.url = match.group(1)
                self._ready.set()
        self._ready.set()

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5.0)
        self._reader.join(5.0)
