"""TensorBoard for a cluster started with tensorboard=True, run on the driver.

The chief writes event files to log_dir (a path the driver can read: local
for the local launcher, a shared mount such as /dbfs on Databricks);
TensorBoard serves them from the driver, where a notebook can reach it. It
binds a port the OS picks (``--port 0``) and the URL is read from its own
start-up line, so no port is guessed. The cluster does not wait for it:
``cluster.tensorboard_url()`` does.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

from sparkgrad.errors import ClusterError

_URL = re.compile(r"TensorBoard \S+ at (http://\S+?)/? ")


def installed() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def command(log_dir: str, host: str) -> list[str]:
    return [sys.executable, "-m", "tensorboard.main", "--logdir", log_dir, "--host", host, "--port", "0"]


class TensorBoard:
    """A TensorBoard process serving ``log_dir`` on ``host``; close() ends it.

    Starting it does not wait: TensorBoard imports TensorFlow when that is
    installed, which alone took 17 s on a loaded 2-core machine, and the
    cluster's nodes need not wait for that. ``wait()`` blocks until the URL
    is known, up to ``timeout`` seconds after the start; ``on_ready`` (if
    given) is called once from a thread of its own, with the URL or with the
    error that says why there is none.
    """

    def __init__(
        self,
        log_dir: str,
        host: str,
        timeout: float = 120.0,
        on_ready: Callable[[str | None, ClusterError | None], None] | None = None,
    ) -> None:
        self.log_dir = log_dir
        self.url = ""
        self._deadline = time.monotonic() + timeout
        self._timeout = timeout
        self._closed = False
        self._lines: deque[str] = deque(maxlen=20)
        self._ready = threading.Event()
        self._proc = subprocess.Popen(
            command(log_dir, host),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, name="sparkgrad-tensorboard", daemon=True)
        self._reader.start()
        self._announcer = None
        if on_ready is not None:
            self._announcer = threading.Thread(
                target=self._announce, args=(on_ready,), name="sparkgrad-tensorboard-ready", daemon=True
            )
            self._announcer.start()

    def wait(self) -> str:
        """The URL, once TensorBoard has printed it; ClusterError if it did not within the timeout."""
        if self._announcer is not None and self._announcer is not threading.current_thread():
            # on_ready has been called by the time this returns, so its report precedes the answer
            self._announcer.join(max(0.0, self._deadline - time.monotonic()) + 10.0)
        ready = self._ready.wait(max(0.0, self._deadline - time.monotonic()))
        if ready and self.url:
            return self.url
        tail = "\n".join(self._lines)
        if self._closed:
            raise ClusterError("TensorBoard was stopped before it reported its URL")
        if not ready:
            raise ClusterError(f"TensorBoard did not report its URL within {self._timeout:g} s; its output:\n{tail}")
        try:  # its output ended: it is exiting, if it has not yet been reaped
            code = self._proc.wait(5.0)
        except subprocess.TimeoutExpired:
            raise ClusterError(
                f"TensorBoard closed its output without reporting its URL; its output:\n{tail}"
            ) from None
        raise ClusterError(f"TensorBoard exited with code {code} before it reported its URL; its output:\n{tail}")

    def _announce(self, on_ready: Callable[[str | None, ClusterError | None], None]) -> None:
        try:
            url = self.wait()
        except ClusterError as exc:
            self.close(join=False)
            on_ready(None, exc)
            return
        on_ready(url, None)

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:  # drained until exit, so TensorBoard never blocks on a full pipe
            self._lines.append(line.rstrip())
            match = _URL.search(line)
            if match and not self.url:
                self.url = match.group(1)
                self._ready.set()
        self._ready.set()

    def close(self, join: bool = True) -> None:
        self._closed = True
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5.0)
        if join:
            self._reader.join(5.0)
            if self._announcer is not None and self._announcer is not threading.current_thread():
                self._announcer.join(5.0)
