"""InputMode.SPARK: Spark partitions streamed to the training nodes, and DataFeed.

Feeding: cluster.train(rdd) runs a Spark job whose tasks turn their partition
into batches of NumPy columns and send them over an authenticated FeedClient
to one training node's FeedServer (partition p goes to training node
p mod num_training; the server listens on the node's registered socket).
When the job has finished, every row is queued on its worker (FeedClient.end
waits for the worker's acknowledgement), and the driver tells each worker
that the input ended, so next_batch returns short batches and then empty
ones instead of waiting: synchronous training never hangs on uneven
partitions.

A DataFrame takes another way into the same FeedTarget: cluster/arrow_feed.py
turns its Arrow record batches into columns without Python rows.

Rows become columns: a Row or tuple of k fields gives columns named by the
Row's fields or "0".."k-1"; a bare value gives column "0". Nothing is pickled.
A binary field (Spark BinaryType: bytes of equal length per row, such as raw
image pixels) becomes a uint8[rows, length] column packed in C
(_core.pack_binary): the fast way to feed images, with no Python object per
pixel. Numbers and arrays of numbers go through NumPy.

Inference (cluster.inference): the feeding task then waits for the worker's
results (DataFeed.batch_results sends them back on the feeder's connection,
per feeder in its row order) and yields them, so the result RDD keeps the
input order.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkgrad.cluster.transport import net
from sparkgrad.errors import InvalidArgumentError, SparkgradTimeout

DEFAULT_INPUT = "input"  # TensorFlowOnSpark's default qname
BATCH_ROWS = 1024  # rows per frame sent by a feeding task


def _field_names(row: Any) -> list[str]:
    fields = getattr(row, "__fields__", None)
    if fields:
        return [str(f) for f in fields]
    if isinstance(row, (tuple, list)):
        return [str(i) for i in range(len(row))]
    return ["0"]


def rows_to_columns(rows: list[Any]) -> dict[str, np.ndarray]:
    """One NumPy array per field of ``rows`` (all rows shaped like the first)."""
    names = _field_names(rows[0])
    if names == ["0"] and not isinstance(rows[0], (tuple, list)):
        rows = [(r,) for r in rows]
    columns: dict[str, np.ndarray] = {}
    for j, name in enumerate(names):
        if isinstance(rows[0][j], (bytes, bytearray, memoryview)):
            try:
                columns[name] = net().pack_binary([r[j] for r in rows])
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(f"column {name!r}: {exc}", column=name) from None
            continue
        try:
            with warnings.catch_warnings():
                # NumPy < 1.24 (1.21.5 on Databricks 13.3) turns ragged rows into an object array with a
                # VisibleDeprecationWarning where later NumPys raise ValueError: refuse both alike (below).
                warnings.simplefilter("ignore")
                col = np.asarray([r[j] for r in rows])
        except (ValueError, IndexError) as exc:
            raise InvalidArgumentError(f"column {name!r}: rows differ in shape or length ({exc})") from None
        if col.dtype == object and any(isinstance(r[j], (list, tuple, np.ndarray)) for r in rows[:1]):
            raise InvalidArgumentError(f"column {name!r}: rows differ in shape or length (NumPy made objects of them)")
        if col.dtype == np.float64:
            col = col.astype(np.float32)  # the training engine is float32
        if col.dtype.kind not in "biuf":
            raise InvalidArgumentError(
                f"column {name!r} has dtype {col.dtype}: only numbers and bools can be fed (convert it first)",
                column=name,
            )
        columns[name] = col
    return columns


@dataclass(frozen=True)
class FeedTarget:
    """Where and how one feeding task sends its partition (shared by the RDD and the Arrow feeders)."""

    targets: tuple[tuple[str, int], ...]
    secret: bytes = field(repr=False)
    input: str = DEFAULT_INPUT
    timeout: float = 600.0
    batch_rows: int = BATCH_ROWS
    want_results: bool = False  # inference: the worker's results instead of a row count
    security: str | None = None  # the cluster's frame protection (None: the default)

    def feed(self, index: int, batches: Iterable[dict[str, np.ndarray]]) -> Iterator[Any]:
        """Sends column ``batches`` to targets[index % len(targets)].

        Yields the number of rows sent, or with ``want_results`` the worker's
        result frames (dicts of columns) in the order the rows were sent.
        """
        host, port = self.targets[index % len(self.targets)]
        client = net().FeedClient(host, port, self.secret, self.timeout, self.input, security=self.security)
        try:
            sent = 0
            for columns in batches:
                client.send(columns)
                sent += len(next(iter(columns.values()))) if columns else 0
            client.end()
            if self.want_results:
                yield from _result_frames(client, sent, self.timeout, f"{host}:{port}")
            else:
                yield sent
        finally:
            client.close()


@dataclass(frozen=True)
class PartitionFeeder:
    """Spark mapPartitionsWithIndex function: sends partition p's rows to its target, as column batches."""

    target: FeedTarget

    def __call__(self, index: int, rows: Iterable[Any]) -> Iterator[Any]:
        out = self.target.feed(index, _row_batches(rows, self.target.batch_rows))
        if not self.target.want_results:
            yield from out
            return
        for cols in out:  # one value per row for one column, else a tuple
            names = ordered_columns(cols)
            if len(names) == 1:
                yield from cols[names[0]].tolist()
            else:
                yield from zip(*(cols[c].tolist() for c in names), strict=True)


def _row_batches(rows: Iterable[Any], batch_rows: int) -> Iterator[dict[str, np.ndarray]]:
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == batch_rows:
            yield rows_to_columns(chunk)
            chunk = []
    if chunk:
        yield rows_to_columns(chunk)


def _result_frames(client: Any, expected: int, timeout: float, peer: str) -> Iterator[dict[str, np.ndarray]]:
    """Yields result frames (columns) until ``expected`` rows arrived, in the feeder's order."""
    received = 0
    while received < expected:
        cols = client.recv_results(timeout)
        if cols is None:
            raise SparkgradTimeout(
                f"inference: the worker at {peer} returned {received} of {expected} results within {timeout:g} s "
                "(does map_fun call DataFeed.batch_results for every batch?)"
            )
        received += len(next(iter(cols.values()))) if cols else 0
        yield cols


def ordered_columns(cols: dict[str, np.ndarray]) -> list[str]:
    """Column names, numbered ones ("0", "1", ...) in numeric order first."""
    return sorted(cols, key=lambda c: (not c.isdigit(), int(c) if c.isdigit() else 0, c))


class DataFeed:
    """TensorFlowOnSpark's DataFeed: how ``map_fun`` reads the rows Spark feeds it (``InputMode.SPARK``).

    The rows ``cluster.train`` or ``cluster.inference`` send, from the node's C feed queue.

    ```python
    def map_fun(args, ctx):
        feed = TFNode.DataFeed(ctx.mgr)
        while not feed.should_stop():
            batch = feed.next_batch(100)  # [(x, y), ...] rows
            ...
    ```

    Args:
        mgr: The node's feed queue, ``ctx.mgr`` (training nodes under ``InputMode.SPARK`` have one).
        train_mode: True for `cluster.train`; False for `cluster.inference`, whose batches may be
            partial and whose results go back with `batch_results`.
        qname_in: The input's name (``cluster.train(..., qname=...)``; default ``"input"``, TensorFlowOnSpark's).
        qname_out: Accepted for TensorFlowOnSpark compatibility.
        input_mapping: ``{column: tensor name}``: `next_batch` returns a dict of arrays by tensor name
            (the columns ``cluster.train(df, input_mapping=...)`` fed).
        timeout: Seconds to wait for rows before SparkgradTimeout.

    Raises:
        InvalidArgumentError: ``mgr`` is None (not a training node of an ``InputMode.SPARK`` cluster).
    """

    def __init__(
        self,
        mgr: Any,
        train_mode: bool = True,
        qname_in: str = DEFAULT_INPUT,
        qname_out: str = "output",
        input_mapping: dict[str, str] | None = None,
        timeout: float = 600.0,
    ) -> None:
        if mgr is None:
            raise InvalidArgumentError("DataFeed needs ctx.mgr, which exists on training nodes under InputMode.SPARK")
        self.mgr = mgr
        self.train_mode = train_mode
        self.qname_in = qname_in
        self.qname_out = qname_out
        self.input_mapping = dict(input_mapping) if input_mapping else None
        self.timeout = timeout
        self.done_feeding = False
        self._sources: np.ndarray | None = None  # feeder id of each row of the last batch (inference)

    def next_batch_columns(self, batch_size: int) -> dict[str, np.ndarray]:
        """Up to ``batch_size`` rows as ``{column: array}``, without copying rows into tuples.

        Columns are named ``"0"``, ``"1"``, ... for RDD rows. Fewer rows at the end of the input, none
        once it ended.

        Raises:
            SparkgradTimeout: No rows came within the feed's ``timeout``.
        """
        if self.train_mode:
            cols = self.mgr.next_batch(int(batch_size), self.timeout, self.qname_in)
        else:  # inference: remember which feeder each row came from, for batch_results
            # a partition's last rows must not wait for a full batch: take what is queued
            cols, self._sources = self.mgr.next_batch(
                int(batch_size), self.timeout, self.qname_in, with_source=True, partial=True
            )
        rows = len(next(iter(cols.values()))) if cols else 0
        if rows < batch_size and self.mgr.drained(self.qname_in):
            self.done_feeding = True
        return cols

    def next_batch(self, batch_size: int) -> Any:
        """Up to ``batch_size`` rows, as TensorFlowOnSpark returns them.

        A list of row tuples (bare values for one-column data), or with ``input_mapping`` a dict of
        arrays by tensor name. Fewer rows at the end of the input; an empty list once it ended.

        Raises:
            SparkgradTimeout: No rows came within the feed's ``timeout``.
        """
        cols = self.next_batch_columns(batch_size)
        if self.input_mapping is not None:
            return {tensor: cols[col] for col, tensor in sorted(self.input_mapping.items()) if col in cols}
        if not cols:
            return []
        names = ordered_columns(cols)
        if len(names) == 1:
            return list(cols[names[0]])
        return list(zip(*(cols[n] for n in names), strict=True))

    def should_stop(self) -> bool:
        """True once the input ended and every row was taken (or terminate() was called)."""
        if not self.done_feeding and self.mgr.drained(self.qname_in):
            self.done_feeding = True
        return self.done_feeding

    def terminate(self) -> None:
        """Stops consuming: the input is marked ended and what is queued is dropped."""
        self.done_feeding = True
        self.mgr.finish(self.qname_in)
        while self.mgr.next_batch(BATCH_ROWS, self.timeout, self.qname_in):
            if self.mgr.drained(self.qname_in):
                break

    def batch_results(self, results: Any) -> None:
        """Sends one result per row of the last batch back to its feeder (cluster.inference).

        ``results``: a sequence or array with one entry per row, or a dict of
        such columns; numbers only (the result RDD yields them as Python values).
        """
        if self.train_mode or self._sources is None:
            raise InvalidArgumentError(
                "batch_results needs DataFeed(mgr, train_mode=False) and a batch from next_batch"
            )
        if isinstance(results, dict):
            cols = {str(k): np.asarray(v) for k, v in results.items()}
        else:
            cols = {"0": np.asarray(results)}
        for name, col in cols.items():
            if len(col) != len(self._sources):
                raise InvalidArgumentError(
                    f"batch_results: column {name!r} has {len(col)} rows for a batch of {len(self._sources)}"
                )
        for source in dict.fromkeys(self._sources.tolist()):
            mask = self._sources == source
            self.mgr.send_results(source, {k: np.ascontiguousarray(v[mask]) for k, v in cols.items()}, self.timeout)
