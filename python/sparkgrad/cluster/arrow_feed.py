"""InputMode.SPARK from a DataFrame: Arrow record batches into the C feed, with no Python row objects.

cluster.train(df) / cluster.inference(df) run ``df.mapInArrow(ArrowFeeder)``
(on Spark Connect, where there are no RDDs, and on classic Spark alike).
Each task turns its pyarrow RecordBatches into dicts of NumPy columns and
sends them through the same FeedTarget as the RDD path (feed.py), so a
worker cannot tell the two apart. The columns are what the row path makes:

- integer, floating and boolean columns: the Arrow buffer as a NumPy array
  (no copy; booleans, bit-packed in Arrow, are unpacked); float64 becomes
  float32, as on the row path (the engine is float32);
- fixed-size lists and lists of one length per row, of numbers (nesting
  allowed): the child array's values as [rows, width, ...];
- binary (and fixed-size binary) values of one length per row, such as raw
  image pixels: uint8[rows, length], read from the offsets and data buffers;
- Spark ML vectors (``VectorUDT``, which reaches Arrow as its SQL struct
  ``type int8, size int32, indices list<int32>, values list<double>``):
  float32[rows, size]. Dense rows (type 1) are the values buffer as it is;
  sparse rows (type 0, as VectorAssembler writes rows with many zeros) are
  densified by one NumPy scatter of the batch's indices and values. Every
  row of a column must have the same size.

- strings (``string`` / ``large_string``), only where the caller asks for
  them (``batch_to_columns(..., strings=True)``; a ``prepare`` step of
  cluster.train): a `sparkgrad.nn.StringColumn` over Arrow's own offsets and
  UTF-8 bytes (no copy), as the model's StringLookup and Hashing read it.

Anything else (strings elsewhere, ragged lists, binary values of different lengths,
nulls, other structs, maps, dates) is refused with an InvalidArgumentError
naming the column, its Arrow type and, for a null or an odd row, the row
(and, in a feeding task, the partition): convert it first. It does not do
the transport (feed.py) or choose partitions (the DataFrame's own).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkgrad.cluster.feed import FeedTarget, ordered_columns
from sparkgrad.errors import InvalidArgumentError

COUNT_SCHEMA = "rows long"  # the train feeding stage's output: rows sent by each task
DEFAULT_RESULT_SCHEMA = "result double"  # cluster.inference(df): one numeric result per row

# Spark SQL type names (DDL) of the numbers an inference result may be, and their Arrow type names.
_RESULT_TYPES = {
    "boolean": "bool",
    "tinyint": "int8",
    "byte": "int8",
    "smallint": "int16",
    "short": "int16",
    "int": "int32",
    "integer": "int32",
    "bigint": "int64",
    "long": "int64",
    "float": "float32",
    "real": "float32",
    "double": "float64",
}


VECTOR_FIELDS = ("type", "size", "indices", "values")  # pyspark.ml.linalg.VectorUDT.sqlType(), in order
DENSE, SPARSE = 1, 0  # VectorUDT's "type" values


def _refuse(name: str, arr: Any, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"column {name!r} has Arrow type {arr.type}: {why}; only numbers, bools, lists of numbers of one length "
        "per row, binary values of one length per row and Spark ML vectors of one size can be fed "
        "(convert it first)",
        column=name,
    )


def is_vector_type(kind: Any) -> bool:
    """True for the Arrow struct a Spark ML VectorUDT column arrives as."""
    import pyarrow as pa

    return pa.types.is_struct(kind) and tuple(f.name for f in kind) == VECTOR_FIELDS  # iterating: pyarrow 8 too


def _first_null(arr: Any) -> int:
    return int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])


def _vectors(name: str, arr: Any, first_row: int) -> np.ndarray:
    """A VectorUDT column (dense and/or sparse rows of one size) -> float64[rows, size]."""
    if arr.null_count:
        row = first_row + _first_null(arr)
        raise _refuse(name, arr, f"{arr.null_count} of its vectors are null (the first in row {row})")
    kinds, sizes, indices, values = arr.flatten()  # flatten() honours the array's offset (a sliced batch)
    rows = len(arr)
    kind = kinds.to_numpy(zero_copy_only=False)
    offsets = values.offsets.to_numpy()
    lengths = np.diff(offsets)
    flat = values.flatten().to_numpy(zero_copy_only=False)
    dense = kind == DENSE
    if dense.all():
        width = _equal_lengths(name, arr, offsets, "dense vectors", first_row)
        return flat.reshape(rows, width)
    size = sizes.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    width_of_row = np.where(dense, lengths, size)
    if (width_of_row != width_of_row[0]).any():
        row = int(np.flatnonzero(width_of_row != width_of_row[0])[0])
        raise _refuse(
            name,
            arr,
            f"vectors differ in size (row {first_row}: {width_of_row[0]}, row {first_row + row}: {width_of_row[row]})",
        )
    width = int(width_of_row[0])
    row_of = np.repeat(np.arange(rows), lengths)
    col = np.empty(len(flat), np.int64)
    in_dense = dense[row_of]
    col[in_dense] = np.arange(len(flat))[in_dense] - (offsets[row_of[in_dense]] - offsets[0])
    sparse_index = indices.flatten().to_numpy(zero_copy_only=False)  # dense rows have no indices
    if len(sparse_index) != int((~in_dense).sum()) or (len(sparse_index) and sparse_index.min() < 0):
        raise _refuse(name, arr, "a sparse vector's indices and values do not match")
    col[~in_dense] = sparse_index
    if len(col) and col.max() >= width:
        raise _refuse(name, arr, f"a sparse vector has an index {int(col.max())} beyond its size {width}")
    out = np.zeros((rows, width), np.float64)
    out[row_of, col] = flat
    return out


def _equal_lengths(name: str, arr: Any, offsets: np.ndarray, what: str, first_row: int = 0) -> int:
    """The one length of every row (offsets int32/int64[rows + 1]); refuses rows of different lengths."""
    lengths = np.diff(offsets)
    if len(lengths) and (lengths != lengths[0]).any():
        row = int(np.flatnonzero(lengths != lengths[0])[0])
        raise _refuse(
            name,
            arr,
            f"{what} differ in length (row {first_row}: {lengths[0]}, row {first_row + row}: {lengths[row]})",
        )
    return int(lengths[0]) if len(lengths) else 0


def _buffer(buf: Any, dtype: Any, start: int, stop: int) -> np.ndarray:
    """Elements [start, stop) of an Arrow buffer viewed as ``dtype`` (no copy); Arrow may omit an empty buffer."""
    if stop <= start or buf is None:
        return np.empty(0, dtype)
    return np.frombuffer(buf, dtype=dtype, count=stop)[start:]


def _binary(name: str, arr: Any, first_row: int = 0) -> np.ndarray:
    """binary / large_binary / fixed_size_binary values of one length -> uint8[rows, length] (no copy)."""
    import pyarrow as pa

    rows = len(arr)
    buffers = arr.buffers()
    if pa.types.is_fixed_size_binary(arr.type):
        width = arr.type.byte_width
        data = _buffer(buffers[1], np.uint8, arr.offset * width, (arr.offset + rows) * width)
        return data.reshape(rows, width)
    offset_type = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    offsets = _buffer(buffers[1], offset_type, arr.offset, arr.offset + rows + 1)
    width = _equal_lengths(name, arr, offsets, "binary values", first_row)
    if rows == 0 or width == 0:
        return np.empty((rows, width), np.uint8)
    data = _buffer(buffers[2], np.uint8, int(offsets[0]), int(offsets[-1]))
    return data.reshape(rows, width)


def _strings(name: str, arr: Any, first_row: int) -> Any:
    """A string / large_string array -> a StringColumn over its Arrow buffers (offsets index the data buffer)."""
    import pyarrow as pa

    from sparkgrad.nn.preprocessing import StringColumn

    if arr.null_count:
        row = first_row + _first_null(arr)
        raise _refuse(name, arr, f"{arr.null_count} of its strings are null (the first in row {row})")
    rows, buffers = len(arr), arr.buffers()
    offset_type = np.int64 if pa.types.is_large_string(arr.type) else np.int32
    offsets = _buffer(buffers[1], offset_type, arr.offset, arr.offset + rows + 1)
    if offsets.size == 0:  # an empty array may have no offsets buffer
        offsets = np.zeros(1, offset_type)
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.empty(0, np.uint8)
    return StringColumn(offsets, data, 1)


def _values(name: str, arr: Any, first_row: int | None = 0) -> np.ndarray:
    """A non-null Arrow array of numbers or lists of numbers -> ndarray[rows, ...].

    ``first_row``: the row number of arr[0] in errors (None: arr holds the
    values inside a column's lists, which are not rows).
    """
    import pyarrow as pa

    kind = arr.type
    if is_vector_type(kind):
        return _vectors(name, arr, first_row or 0)
    if arr.null_count:
        where = "" if first_row is None else f" (the first in row {first_row + _first_null(arr)})"
        raise _refuse(name, arr, f"{arr.null_count} of its values are null{where}")
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return arr.to_numpy(zero_copy_only=True)
    if pa.types.is_boolean(kind):
        return arr.to_numpy(zero_copy_only=False)  # bit-packed in Arrow: unpacked to one byte per value
    if pa.types.is_fixed_size_list(kind):
        # the child values of this (maybe sliced) array: flatten() ignores a slice's offset on pyarrow < 9
        size = kind.list_size
        child = _values(name, arr.values.slice(arr.offset * size, len(arr) * size), None)
        return child.reshape(len(arr), size, *child.shape[1:])
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        offsets = arr.offsets.to_numpy()
        width = _equal_lengths(name, arr, offsets, "lists", first_row or 0)
        child = _values(name, arr.flatten(), None)
        return child.reshape(len(arr), width, *child.shape[1:])
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return _binary(name, arr, first_row or 0)
    raise _refuse(name, arr, "not a number, a list of numbers or a binary value")


def batch_to_columns(
    batch: Any, partition: int | None = None, first_row: int = 0, strings: bool = False
) -> dict[str, Any]:
    """A pyarrow RecordBatch -> {column name: ndarray[rows, ...]}, as the row path (feed.rows_to_columns) makes.

    ``strings``: string columns become `sparkgrad.nn.StringColumn` s (else they are refused). Errors
    number rows from ``first_row`` and, with ``partition``, name it.
    """
    import pyarrow as pa

    columns: dict[str, Any] = {}
    for name, arr in zip(batch.schema.names, batch.columns, strict=True):
        try:
            if strings and (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
                columns[name] = _strings(name, arr, first_row)
                continue
            col = _values(name, arr, first_row)
        except InvalidArgumentError as exc:
            if partition is None:
                raise
            raise InvalidArgumentError(f"partition {partition}: {exc}", column=name, partition=partition) from None
        if col.dtype == np.float64:
            col = col.astype(np.float32)  # the training engine is float32
        columns[name] = col
    return columns


@dataclass(frozen=True)
class ResultField:
    name: str
    arrow_type: str  # a pyarrow type name: "float64", "int64", ...


def result_fields(schema: str) -> tuple[ResultField, ...]:
    """Parses an inference result schema in Spark's DDL ("id long, score double"); numbers only.

    Parsed here rather than by Spark: the feeding tasks need the Arrow types
    to cast the worker's results to, and a Connect client has no JVM to parse
    DDL with.
    """
    fields = []
    for part in schema.split(","):
        words = part.split()
        if len(words) != 2 or words[1].lower() not in _RESULT_TYPES:
            raise InvalidArgumentError(
                f"inference schema {schema!r}: {part.strip()!r} is not 'name type' with a numeric type "
                f"({', '.join(sorted(_RESULT_TYPES))})",
                schema=schema,
            )
        fields.append(ResultField(words[0].strip("`"), _RESULT_TYPES[words[1].lower()]))
    return tuple(fields)


def _result_batch(cols: dict[str, np.ndarray], fields: tuple[ResultField, ...]) -> Any:
    """A worker's result frame -> a RecordBatch of ``fields``.

    Columns named by batch_results' dict keys are matched to the schema's
    fields by name; unnamed ones ("0", "1", ... from a list or array) by
    position. Each must be one value per row, castable without loss.
    """
    import pyarrow as pa

    names = ordered_columns(cols)
    wanted = [f.name for f in fields]
    if all(n.isdigit() for n in names):
        if len(names) != len(fields):
            raise InvalidArgumentError(
                f"inference: the worker returned {len(names)} result column(s) for a schema of {len(fields)} "
                f"({', '.join(wanted)})"
            )
        pairs = list(zip(names, fields, strict=True))
    else:
        if sorted(names) != sorted(wanted):
            raise InvalidArgumentError(
                f"inference: the worker returned the result columns {', '.join(sorted(names))} for a schema of "
                f"{', '.join(wanted)}: batch_results' dict keys must be the schema's names"
            )
        pairs = [(f.name, f) for f in fields]
    arrays = []
    for name, f in pairs:
        col = np.asarray(cols[name])
        if col.ndim != 1:
            raise InvalidArgumentError(
                f"inference: result column {name!r} has shape {col.shape}: one value per row is needed for "
                f"{f.name} {f.arrow_type} (return one column per value)",
                column=name,
            )
        try:
            arrays.append(pa.array(col).cast(getattr(pa, f.arrow_type)()))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidArgumentError(
                f"inference: result column {name!r} ({col.dtype}) does not fit {f.name} {f.arrow_type}: {exc}",
                column=name,
            ) from None
    return pa.RecordBatch.from_arrays(arrays, names=wanted)


@dataclass(frozen=True)
class ArrowFeeder:
    """DataFrame.mapInArrow function: sends the task's record batches to targets[partition % len(targets)].

    Yields one batch of COUNT_SCHEMA (the rows sent) when training, or the
    worker's results as batches of ``result_fields`` for inference.
    """

    target: FeedTarget
    result_fields: tuple[ResultField, ...] = ()
    # prepare(columns, partition, first_row) -> columns: runs in the task on each frame before it is sent
    # (checks and conversions of a caller such as sparkgrad.spark.Estimator); picklable. String columns
    # reach it as StringColumns, which it must make numbers (the feed carries numbers only)
    prepare: Any = None

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        index = TaskContext.get().partitionId()
        out = self.target.feed(index, self._columns(batches, index))
        if not self.target.want_results:
            yield pa.RecordBatch.from_pydict({"rows": pa.array([sum(out)], pa.int64())})
            return
        for cols in out:
            yield _result_batch(cols, self.result_fields)

    def _columns(self, batches: Iterator[Any], partition: int) -> Iterator[dict[str, np.ndarray]]:
        step = self.target.batch_rows
        row = 0
        for batch in batches:
            for start in range(0, batch.num_rows, step):  # slices are views: frames stay bounded, nothing is copied
                part = batch.slice(start, step)
                cols = batch_to_columns(part, partition, row, strings=self.prepare is not None)
                if self.prepare is not None:
                    cols = self.prepare(cols, partition, row)
                row += part.num_rows
                yield cols
