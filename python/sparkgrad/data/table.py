"""ParquetDataset: batches for ``model.fit`` read from Parquet files at file-reader speed.

    ds = ParquetDataset("/data/train/", {"pixels": Column("image", width=784), "city": "city"},
                        batch_size=128, label="label", shuffle_buffer=10_000, seed=1,
                        shard_index=ctx.task_index, num_shards=ctx.num_workers)
    model.fit(ds, epochs=5)

pyarrow reads the row groups (only the columns asked for) and hands each
record batch to C through Arrow's C data interface, without a copy (as
PyCapsules from pyarrow 14 on, through ``_export_to_c`` before); C
validates it, converts the columns (numbers, lists, binary, strings, Spark
ML vectors, fields of structs) applying each column's null policy, and
shuffles and gathers rows into batches with the GIL released
(csrc/table/). This module lists the files, reads their footers, and plans
each epoch: row-group order, the shard's rows, the dropped remainder.

Not here: which files hold a DataFrame's or a Delta table's rows, and the
Parquet cache (source.py); Spark tasks and the Estimator.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sparkgrad import _core
from sparkgrad.data.dataset import expand_paths
from sparkgrad.errors import CorruptRecordError, InvalidArgumentError, SchemaError, SparkgradIOError

_NULLS = {"error": 0, "fill": 1, "skip": 2}
# Rows per record batch pyarrow reads (a row group may be larger): about _READ_BYTES of decoded rows, within
# _READ_ROWS. Decoding into a batch that stays in cache is about twice as fast for wide rows (784 floats: a
# row group of 15,000 rows read whole is 47 MB of fresh pages and growing buffers: 5,000 rows take 45% of its
# CPU time), and narrow rows keep big batches (a tabular row of 13 numbers and 26 short strings: 65,536).
# A dataset reads _READ_ROWS[0] rows at first, then sizes each row group's batches by the bytes per row of
# the batches before.
_READ_BYTES = 16 << 20
_READ_ROWS = (1024, 65536)


def read_rows_after(batch: Any) -> int:
    """Rows to ask pyarrow for in the next record batch, given the last one read (see _READ_BYTES)."""
    if not batch.num_rows:
        return _READ_ROWS[0]
    rows = int(_READ_BYTES * batch.num_rows / max(batch.nbytes, 1))
    return min(max(rows, _READ_ROWS[0]), _READ_ROWS[1])


# Converted chunks' buffers a dataset keeps for its next epochs: a shuffle buffer holds chunks until their
# last row is drawn, and fresh memory each epoch costs page faults (the kernel zeroes every page).
_POOL_BYTES = 256 << 20


@dataclass(frozen=True)
class Column:
    """How one model input (or the label) is read from a table column.

    Args:
        name: The column, dotted through structs (``"address.city"``).
        width: Values per row: needed for variable-length lists (shorter rows are padded with ``pad``);
            otherwise taken from the data (1 for numbers, the size of fixed-size lists, fixed-size binary
            and Spark ML vectors, the byte length of binary values, which must then all be equal).
        pad: The value after a short list's end.
        truncate: Cut lists longer than ``width`` (else such a row is an error naming it).
        lengths: The batch key under which a variable-length list's lengths (int32 ``[batch]``) come, or
            None to leave them out.
        nulls: ``"error"`` (a null fails, naming the column, file, row group and row), ``"fill"`` (a null
            value or list element becomes ``fill``; a null list all ``fill`` with length 0; a null string
            ``""``) or ``"skip"`` (a row with a null here is dropped from every column).
        fill: The value of a null under ``nulls="fill"``.
        dtype: ``"float32"``, or ``"int64"`` for an integer column (or lists of integers) read as exact ids,
            as an Embedding, IntegerLookup or Hashing input takes them (float32 is exact only below 2^24).
            Default: float32, except an integer label column, which comes as int64.
    """

    name: str
    width: int | None = None
    pad: float = 0.0
    truncate: bool = False
    lengths: str | None = None
    nulls: str = "error"
    fill: float = 0.0
    dtype: str | None = None

    def __post_init__(self) -> None:
        if self.dtype not in (None, "float32", "int64"):
            raise InvalidArgumentError(
                f"column {self.name!r}: dtype must be 'float32' or 'int64', not {self.dtype!r}", column=self.name
            )
        if self.nulls not in _NULLS:
            raise InvalidArgumentError(
                f"column {self.name!r}: nulls must be one of {sorted(_NULLS)}, not {self.nulls!r}", column=self.name
            )
        if self.width is not None and self.width < 1:
            raise InvalidArgumentError(f"column {self.name!r}: width must be >= 1, not {self.width}", column=self.name)


@dataclass(frozen=True)
class _RowGroup:
    file: int  # index in ParquetDataset.files
    index: int  # row group within the file
    rows: int


def _pyarrow() -> tuple[Any, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa, pq


def _capsules(pa: Any) -> bool:
    """Whether record batches go to C as PyCapsules (``__arrow_c_array__``, pyarrow >= 14); older pyarrow
    (8 on DBR 13.3) exports them with ``_export_to_c`` into structs C gives it, sharing the same buffers."""
    return hasattr(pa.RecordBatch, "__arrow_c_array__")


def open_parquet(path: str, row_group: int | None = None) -> Any:
    """A pyarrow ParquetFile; a missing file is a SparkgradIOError, anything not Parquet a CorruptRecordError."""
    _, pq = _pyarrow()
    where = f"file {path!r}" + ("" if row_group is None else f", row group {row_group}")
    try:
        return pq.ParquetFile(path)
    except FileNotFoundError as e:
        raise SparkgradIOError(f"cannot open Parquet {where}: it does not exist", path=path) from e
    except OSError as e:
        if not os.path.exists(path):
            raise SparkgradIOError(f"cannot open Parquet {where}: it does not exist", path=path) from e
        raise CorruptRecordError(f"{where} is not a readable Parquet file: {e}", path=path) from e
    except Exception as e:  # pyarrow.ArrowInvalid and kin: a damaged footer
        raise CorruptRecordError(f"{where} is not a readable Parquet file: {e}", path=path) from e


def close_parquet(pf: Any) -> None:
    """Closes a ParquetFile's file. pyarrow 8 has no ParquetFile.close: its file closes with the last
    reference to the ParquetFile, which the caller drops."""
    close = getattr(pf, "close", None)
    if close is not None:
        close()


def _as_column(spec: str | Column, nulls: object) -> Column:
    col = Column(spec) if isinstance(spec, str) else spec
    if not isinstance(col, Column):
        raise InvalidArgumentError(f"a column is a name or a Column, not {type(spec).__name__}")
    if nulls is None:
        return col
    if isinstance(nulls, str):
        return replace(col, nulls=nulls)
    return replace(col, nulls="fill", fill=float(nulls))


def _field(schema: Any, dotted: str) -> Any | None:
    """The pyarrow field a dotted name reaches through structs (longest names first, as C does), or None."""
    import pyarrow as pa

    fields, rest, field = list(schema), dotted, None
    while rest:
        for n in range(len(rest), 0, -1):
            if n < len(rest) and rest[n] != ".":
                continue
            hit = next((f for f in fields if f.name == rest[:n]), None)
            if hit is not None:
                field, rest = hit, rest[n + 1 :]
                break
        else:
            return None
        if rest:
            if not pa.types.is_struct(field.type):
                return None
            fields = list(field.type)
    return field


def _top_name(schema: Any, dotted: str) -> str:
    for n in range(len(dotted), 0, -1):
        if (n == len(dotted) or dotted[n] == ".") and dotted[:n] in schema.names:
            return dotted[:n]
    return dotted


def _column_names(schema: Any, prefix: str = "") -> list[str]:
    import pyarrow as pa

    out = []
    for f in schema:
        name = prefix + f.name
        out += _column_names(f.type, name + ".") if pa.types.is_struct(f.type) else [name]
    return out


class ParquetDataset:
    """Batches of table rows from Parquet files, for ``model.fit(ds)``.

    Iterating yields dicts ``{input name: float32 array [batch, width] (``[batch]`` for a column of numbers;
    int64 for a `Column` of ``dtype="int64"``) or StringColumn, label: array [batch]}`` (an integer label
    column comes as int64), plus the lengths of
    variable-length lists under the keys their `Column` names. A model with several inputs takes such a dict
    as it is (fit's ``y_key`` names the label; it defaults to ``"label"``).

    Epochs and shards: the row groups of all files make one row sequence per epoch, in file order, or
    shuffled with ``(seed, epoch)`` when ``shuffle_buffer > 0``. It is cut into ``num_shards`` equal
    shards (whole batches of ``batch_size`` with ``drop_remainder``); the rows left over (fewer than
    ``num_shards * batch_size``) are dropped for that epoch, and which rows those are moves along the
    sequence each epoch, so no row is always the one dropped. Shard ``shard_index`` reads slice
    ``(shard_index + epoch) % num_shards``. Across the ``num_shards`` readers of one epoch every row comes
    exactly once, except the dropped ones. Within a shard, rows pass a shuffle buffer of ``shuffle_buffer``
    rows (seeded; 0 keeps the order). Each ``iter(ds)`` runs the next ``epochs`` epochs, so
    ``model.fit(ds, epochs=n)`` sees n different epochs; `epoch` reads one given epoch. Between epochs the
    dataset keeps up to 256 MiB of converted-row buffers for reuse.

    Args:
        paths: A file, directory or glob, or a list of them (see `expand_paths`).
        columns: ``{input name: column name or Column}``.
        batch_size: Rows per batch.
        label: The label column (a name or `Column`); its batch key is its name.
        shuffle_buffer: Rows held for shuffling (0: file order, row groups unshuffled).
        seed: Seed of the row-group order and the shuffle buffer.
        epochs: Epochs per iteration.
        shard_index: This reader's shard, in ``[0, num_shards)``.
        num_shards: Readers (workers) sharing each epoch.
        nulls: ``{input name or column name: "error" | "skip" | fill value}``, overriding the Columns'.
        drop_remainder: Shards of whole batches (default: when ``num_shards > 1``); else a shard's last
            batch may be short, and with one shard no row is dropped.

    Raises:
        SparkgradIOError: A file is missing or unreadable (named).
        CorruptRecordError: A file is not Parquet, or a row group fails to decode (file and row group named).
        SchemaError: A column is missing (the file's columns listed) or of a type that cannot be fed; during
            iteration, a null under ``nulls="error"`` or a row that does not fit its width (column, file, row
            group and row named).
        InvalidArgumentError: Bad arguments.
    """

    def __init__(
        self,
        paths: str | os.PathLike | Sequence[str | os.PathLike],
        columns: Mapping[str, str | Column],
        batch_size: int,
        label: str | Column | None = None,
        *,
        shuffle_buffer: int = 0,
        seed: int = 0,
        epochs: int = 1,
        shard_index: int = 0,
        num_shards: int = 1,
        nulls: Mapping[str, object] | None = None,
        drop_remainder: bool | None = None,
    ):
        if not columns and label is None:
            raise InvalidArgumentError("ParquetDataset needs at least one column")
        if batch_size < 1 or shuffle_buffer < 0 or epochs < 1:
            raise InvalidArgumentError(
                f"batch_size ({batch_size}) and epochs ({epochs}) must be >= 1, shuffle_buffer ({shuffle_buffer}) >= 0"
            )
        if not 0 <= shard_index < num_shards:
            raise InvalidArgumentError(f"shard_index {shard_index} must be in [0, num_shards={num_shards})")
        nulls = dict(nulls or {})
        self.columns: dict[str, Column] = {}
        for key, spec in columns.items():
            name = spec if isinstance(spec, str) else getattr(spec, "name", None)
            self.columns[key] = _as_column(spec, nulls.pop(key, nulls.pop(name, None)))
        self.label_key: str | None = None
        if label is not None:
            name = label if isinstance(label, str) else label.name
            self.label_key = name
            if name in self.columns:
                raise InvalidArgumentError(f"the label {name!r} is also an input's key")
            self.columns[name] = _as_column(label, nulls.pop(name, None))
        if nulls:
            raise InvalidArgumentError(f"nulls names {sorted(nulls)}, which are not inputs or columns")
        clash = sorted({c.lengths for c in self.columns.values() if c.lengths is not None} & set(self.columns))
        if clash:
            raise InvalidArgumentError(f"lengths keys {clash} are also inputs' keys")
        self.batch_size, self.shuffle_buffer = int(batch_size), int(shuffle_buffer)
        self.seed, self.epochs = int(seed) & (2**64 - 1), int(epochs)
        self.shard_index, self.num_shards = int(shard_index), int(num_shards)
        self.drop_remainder = num_shards > 1 if drop_remainder is None else bool(drop_remainder)
        self.files = expand_paths(paths)
        self._groups: list[_RowGroup] = []
        self._scalar: dict[str, bool] = {}  # key -> a column of plain numbers (batched as [batch])
        self._integer: dict[str, bool] = {}
        self._top: list[str] = []
        for i, path in enumerate(self.files):
            meta, schema = self._footer(path)
            self._check_schema(path, schema)
            self._groups += [_RowGroup(i, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)]
        self.total_rows = sum(g.rows for g in self._groups)
        self._widths: list[int] = [c.width or 0 for c in self.columns.values()]
        self._next_epoch = 0
        self._read_rows = _READ_ROWS[0]  # rows per record batch pyarrow reads: see _READ_BYTES
        self._pool: Any = None  # a _core.TablePool, made by the first epoch read

    # ---- files ------------------------------------------------------------

    def _footer(self, path: str) -> tuple[Any, Any]:
        pf = open_parquet(path)
        try:
            return pf.metadata, pf.schema_arrow
        finally:
            close_parquet(pf)

    def _check_schema(self, path: str, schema: Any) -> None:
        import pyarrow as pa

        for key, col in self.columns.items():
            field = _field(schema, col.name)
            if field is None:
                raise SchemaError(
                    f"column {col.name!r} (for {key!r}) is not in file {path!r}; its columns: "
                    + ", ".join(_column_names(schema)),
                    column=col.name,
                    path=path,
                )
            kind = field.type
            self._scalar[key] = pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
            self._integer[key] = pa.types.is_integer(kind)
            top = _top_name(schema, col.name)
            if top not in self._top:
                self._top.append(top)

    # ---- epochs -----------------------------------------------------------

    def shard_rows(self) -> int:
        """Rows each shard reads per epoch (before rows skipped for nulls)."""
        per = self.total_rows // self.num_shards
        return per // self.batch_size * self.batch_size if self.drop_remainder else per

    def _segments(self, epoch: int) -> list[tuple[_RowGroup, int, int]]:
        """This shard's rows of an epoch: (row group, first row, end row) in reading order."""
        order = list(self._groups)
        if self.shuffle_buffer > 0:
            perm = np.random.default_rng([self.seed, epoch]).permutation(len(order))
            order = [order[i] for i in perm]
        total, per = self.total_rows, self.shard_rows()
        if total == 0 or per == 0:
            return []
        dropped = total - per * self.num_shards
        slot = (self.shard_index + epoch) % self.num_shards
        begin = ((epoch + 1) * dropped + slot * per) % total  # the dropped rows end where the sequence begins
        ranges = [(begin, min(begin + per, total))]
        if begin + per > total:
            ranges.append((0, begin + per - total))
        starts = np.cumsum([0] + [g.rows for g in order])
        segments = []
        for lo, hi in ranges:
            for k, g in enumerate(order):
                a, b = max(lo, int(starts[k])), min(hi, int(starts[k + 1]))
                if a < b:
                    segments.append((g, a - int(starts[k]), b - int(starts[k])))
        return segments

    def _ints(self, key: str, col: Column) -> bool:
        """Whether a column is read as int64 ids."""
        if col.dtype is not None:
            return col.dtype == "int64"
        return key == self.label_key and self._integer[key]

    def _plans(self) -> list[tuple]:
        return [
            (c.name, w, c.truncate, _NULLS[c.nulls], c.fill, c.pad, self._ints(k, c))
            for (k, c), w in zip(self.columns.items(), self._widths, strict=True)
        ]

    def _batch(self, rows: int, cols: list[tuple]) -> dict:
        from sparkgrad.nn.preprocessing import StringColumn

        out: dict[str, Any] = {}
        for (key, col), (kind, a, b) in zip(self.columns.items(), cols, strict=True):
            if kind == "s":
                out[key] = StringColumn(a, b, 1)
                continue
            if self._scalar[key]:
                a = a.reshape(rows)
            out[key] = a
            if col.lengths is not None and b is not None:
                out[col.lengths] = b
        return out

    def epoch(self, epoch: int) -> Iterator[dict]:
        """The batches of one epoch (0-based) of this shard."""
        if epoch < 0:
            raise InvalidArgumentError(f"epoch must be >= 0, not {epoch}")
        capsule = _capsules(_pyarrow()[0])
        seed = (self.seed * 0x9E3779B97F4A7C15 + epoch * 0x100000001B3 + self.shard_index) & (2**64 - 1)
        if self._pool is None:
            self._pool = _core.TablePool(_POOL_BYTES)
        reader = _core.TableReader(
            self._plans(), self.batch_size, shuffle_buffer=self.shuffle_buffer, seed=seed, pool=self._pool
        )
        files: dict[str, Any] = {}  # path -> its open ParquetFile, for this epoch
        try:
            for group, lo, hi in self._segments(epoch):
                path = self.files[group.file]
                if path not in files:
                    files[path] = open_parquet(path, group.index)
                for first, batch in self._read(files[path], path, group.index, lo, hi):
                    reader.push(batch, path, group.index, first, capsule)
                    while (b := reader.next()) is not None:
                        yield self._batch(*b)
        finally:
            for pf in files.values():
                close_parquet(pf)
            files.clear()
        while (b := reader.next(final=True)) is not None:
            if b[0] < self.batch_size and self.drop_remainder:
                break
            yield self._batch(*b)
        self._widths = [w for _, w, _ in reader.widths()]

    def _read(self, pf: Any, path: str, group: int, lo: int, hi: int) -> Iterator[tuple[int, Any]]:
        """Record batches of rows [lo, hi) of a row group, with their first row's number in it."""
        pos = 0
        batches = pf.iter_batches(batch_size=self._read_rows, row_groups=[group], columns=self._top)
        while pos < hi:
            try:
                batch = next(batches, None)
            except OSError as e:
                if not os.path.exists(path):
                    raise SparkgradIOError(f"file {path!r} vanished while reading row group {group}", path=path) from e
                raise CorruptRecordError(f"file {path!r}, row group {group}: {e}", path=path) from e
            except Exception as e:  # ArrowInvalid: a damaged page
                raise CorruptRecordError(f"file {path!r}, row group {group}: {e}", path=path) from e
            if batch is None:
                raise CorruptRecordError(
                    f"file {path!r}, row group {group}: {pos} rows read, the footer promised {hi}", path=path
                )
            a, b = max(lo, pos), min(hi, pos + batch.num_rows)
            if a < b:
                yield a, batch.slice(a - pos, b - a)
            pos += batch.num_rows
            if batch.num_rows:
                self._read_rows = read_rows_after(batch)

    def __iter__(self) -> Iterator[dict]:
        first, self._next_epoch = self._next_epoch, self._next_epoch + self.epochs
        for e in range(first, first + self.epochs):
            yield from self.epoch(e)

    def __repr__(self) -> str:
        return (
            f"ParquetDataset({len(self.files)} files, {self.total_rows} rows, batch_size={self.batch_size}, "
            f"shard {self.shard_index}/{self.num_shards})"
        )
