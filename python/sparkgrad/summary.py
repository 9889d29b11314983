"""TensorBoard event files: scalars and histograms, on sparkgrad's TFRecord writer.

```python
with EventWriter("/dbfs/logs/run1") as w:
    w.scalar("loss", 0.25, step=10)
    w.histogram("weights", array, step=10)
```

Files are named as TensorFlow names them
(``events.out.tfevents.<secs>.<host>.<pid>.<n>``); the first record is an
Event with ``wall_time`` and ``file_version = "brain.Event:2"``. Records are
framed and CRC'd by the C writer and only whole records are ever handed to
the OS, so a reader never sees half an event.

Event protos (tensorboard/compat/proto/event.proto, summary.proto) are small
and encoded here: Event{wall_time=1 double, step=2 int64, file_version=3,
summary=5}; Summary{repeated Value value=1}; Value{tag=1, simple_value=2
float, histo=5 HistogramProto}; HistogramProto{min=1, max=2, num=3, sum=4,
sum_squares=5 (doubles), bucket_limit=6, bucket=7 (packed doubles)}.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import threading
import time

import numpy as np

from sparkgrad.data.tfrecord import TFRecordWriter
from sparkgrad.errors import InvalidArgumentError, StateError

__all__ = ["EventWriter"]

_counter = itertools.count()


def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _double(number: int, value: float) -> bytes:
    return _varint(number << 3 | 1) + struct.pack("<d", value)


def _event(wall_time: float, step: int | None = None, file_version: str | None = None, summary: bytes | None = None):
    out = _double(1, wall_time)
    if step is not None:
        out += _varint(2 << 3 | 0) + _varint(int(step))
    if file_version is not None:
        out += _field(3, file_version.encode())
    if summary is not None:
        out += _field(5, summary)
    return out


def _scalar_value(tag: str, value: float) -> bytes:
    return _field(1, _field(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", float(value)))


def _histogram_buckets(values: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    counts, edges = np.histogram(values, bins=bins)
    return edges[1:], counts


def _histogram_value(tag: str, values, bins: int) -> bytes:
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        raise InvalidArgumentError(f"histogram {tag!r}: no values")
    if not np.all(np.isfinite(v)):
        raise InvalidArgumentError(f"histogram {tag!r}: values must be finite")
    limits, counts = _histogram_buckets(v, bins)
    histo = (
        _double(1, float(v.min()))
        + _double(2, float(v.max()))
        + _double(3, float(v.size))
        + _double(4, float(v.sum()))
        + _double(5, float(np.dot(v, v)))
        + _field(6, limits.astype("<f8").tobytes())
        + _field(7, counts.astype("<f8").tobytes())
    )
    return _field(1, _field(1, tag.encode()) + _field(5, histo))


class EventWriter:
    """Writes one TensorBoard event file in ``logdir``, without TensorFlow.

    A context manager, safe to share between threads.

    The file is named as TensorFlow names it (``events.out.tfevents.<secs>.<host>.<pid>.<n>``) and
    starts with the ``brain.Event:2`` version event; only whole records ever reach the OS, so
    TensorBoard never reads half an event. ``fit(..., tensorboard_dir=...)`` writes its metrics with one.

    Args:
        logdir: The directory (created if needed); ``dbfs:/x`` is written as ``/dbfs/x``.
        filename_suffix: Appended to the file name.
        flush_secs: Buffered events are flushed at the next write once this many seconds passed since
            the last flush (and always on `flush` and `close`).

    Attributes:
        logdir (str): The directory.
        path (str): The event file.
    """

    def __init__(self, logdir: str | os.PathLike, filename_suffix: str = "", flush_secs: float = 10.0):
        logdir = os.fspath(logdir)
        if logdir.startswith("dbfs:/"):
            logdir = "/dbfs/" + logdir[len("dbfs:/") :].lstrip("/")
        os.makedirs(logdir, exist_ok=True)
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
            f"{os.getpid()}.{next(_counter)}{filename_suffix}"
        )
        self.logdir = logdir
        self.path = os.path.join(logdir, name)
        self.flush_secs = float(flush_secs)
        self._lock = threading.Lock()
        self._writer = TFRecordWriter(self.path)
        self._last_flush = time.monotonic()
        self._write(_event(time.time(), file_version="brain.Event:2"))
        self.flush()

    def _write(self, record: bytes) -> None:
        with self._lock:
            if self._writer is None:
                raise StateError(f"EventWriter for {self.path} is closed")
            self._writer.write(record)
            if time.monotonic() - self._last_flush >= self.flush_secs:
                self._writer.flush()
                self._last_flush = time.monotonic()

    def scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        """Writes one scalar point (TensorBoard's Scalars dashboard).

        Args:
            tag: The series' name, e.g. ``"train/loss"``.
            value: The value (stored as float32).
            step: The x coordinate (an int64 step).
            wall_time: Seconds since the epoch (default now).

        Raises:
            StateError: The writer is closed.
        """
        summary = _scalar_value(tag, value)
        self._write(_event(time.time() if wall_time is None else wall_time, int(step), summary=summary))

    def scalars(self, values: dict[str, float], step: int, wall_time: float | None = None) -> None:
        """Writes several scalars (``{tag: value}``) at one step, in one event."""
        summary = b"".join(_scalar_value(t, v) for t, v in values.items())
        self._write(_event(time.time() if wall_time is None else wall_time, int(step), summary=summary))

    def histogram(self, tag: str, values, step: int, bins: int = 30, wall_time: float | None = None) -> None:
        """Writes a histogram of ``values`` (TensorBoard's Histograms and Distributions dashboards).

        Args:
            tag: The series' name.
            values (ArrayLike): Any array-like of finite numbers (flattened).
            step: The x coordinate.
            bins: Number of equal-width buckets.
            wall_time: Seconds since the epoch (default now).

        Raises:
            InvalidArgumentError: No values, or a value that is not finite.
            StateError: The writer is closed.
        """
        summary = _histogram_value(tag, values, bins)
        self._write(_event(time.time() if wall_time is None else wall_time, int(step), summary=summary))

    def flush(self) -> None:
        """Hands every buffered event to the OS."""
        with self._lock:
            if self._writer is not None:
                self._writer.flush()
                self._last_flush = time.monotonic()

    def close(self) -> None:
        """Flushes and closes the file; later writes raise StateError, closing again does nothing."""
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
