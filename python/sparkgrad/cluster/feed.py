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

Rows become columns: a Row or tuple of k fields gives columns named by the
Row's fields or "0".."k-1"; a bare value gives column "0". Nothing is pickled.

Not done here: results flowing back (DataFeed.batch_results, cluster.inference).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkgrad.cluster.transport import net
from sparkgrad.errors import InvalidArgumentError

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
        try:
            col = np.asarray([r[j] for r in rows])
        except (ValueError, IndexError) as exc:
            raise InvalidArgumentError(f"column {name!r}: rows differ in shape or length ({exc})") from None
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
class PartitionFeeder:
    """Spark mapPartitionsWithIndex function: sends partition p to targets[p % len(targets)]."""

    targets: tuple[tuple[str, int], ...]
    secret: bytes = field(repr=False)
    input: str = DEFAULT_INPUT
    timeout: float = 600.0
    batch_rows: int = BATCH_ROWS

    def __call__(self, index: int, rows: Iterable[Any]) -> Iterator[int]:
        host, port = self.targets[index % len(self.targets)]
        client = net().FeedClient(host, port, self.secret, self.timeout, self.input)
        sent = 0
        try:
            chunk: list[Any] = []
            for row in rows:
                chunk.append(row)
                if len(chunk) == self.batch_rows:
                    client.send(rows_to_columns(chunk))
                    sent += len(chunk)
                    chunk = []
            if chunk:
                client.send(rows_to_columns(chunk))
                sent += len(chunk)
            client.end()
        finally:
            client.close()
        yield sent


class DataFeed:
    """TensorFlowOnSpark's DataFeed over the node's C feed queue (ctx.mgr).

    next_batch(n) returns up to n rows: a list of row tuples (or bare values
    for one-column data), as TensorFlowOnSpark does, or with ``input_mapping``
    ({column: tensor name}) a dict of arrays by tensor name;
    next_batch_columns(n) returns the arrays by column name, without copying
    rows into tuples.
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

    def next_batch_columns(self, batch_size: int) -> dict[str, np.ndarray]:
        cols = self.mgr.next_batch(int(batch_size), self.timeout, self.qname_in)
        rows = len(next(iter(cols.values()))) if cols else 0
        if rows < batch_size and self.mgr.drained(self.qname_in):
            self.done_feeding = True
        return cols

    def next_batch(self, batch_size: int) -> Any:
        cols = self.next_batch_columns(batch_size)
        if self.input_mapping is not None:
            return {tensor: cols[col] for col, tensor in sorted(self.input_mapping.items()) if col in cols}
        if not cols:
            return []
        names = sorted(cols, key=lambda c: (not c.isdigit(), int(c) if c.isdigit() else 0, c))
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
