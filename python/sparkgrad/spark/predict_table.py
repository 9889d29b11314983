"""``Model.predict_table``: a Parquet table's predictions written as Parquet, read and written by the tasks.

The driver lists the table's files, reads their footers (every column checked there, before any job) and cuts
their row groups into as many contiguous runs as the files allow, up to Spark's default parallelism. One
Spark task per run reads its row groups with pyarrow (the feature columns and the kept ones only), scores
them as ``transform`` does (`model._Scorer`: cluster/arrow_feed.py's conversion, then the C engine) and
writes one Parquet part file: the output columns with ``transform``'s names and types (a vector as Spark
stores a VectorUDT, with Spark's schema in the footer so that ``spark.read.parquet`` gives vectors back),
then the kept columns as they were. No row passes through the JVM: the job's rows are the runs' numbers.
The driver writes ``_SUCCESS`` when every task is done.

The files come from ``sparkgrad.data.table_files``: a path's, a Delta snapshot's, a plain scan's own, or
a cache entry of any other DataFrame. Not here: object-store paths other than the local, ``/dbfs`` and
``/Volumes`` file systems.
"""

from __future__ import annotations

import itertools
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkgrad.errors import InvalidArgumentError, SchemaError, SparkgradIOError

SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"  # where Spark keeps its schema in a footer


@dataclass(frozen=True)
class _Unit:
    path: str
    row_group: int
    rows: int


def source_files(source: Any, columns: list[str], cache_dir: Any) -> list[str]:
    """The Parquet files of ``source``: a list of paths expanded; else `sparkgrad.data.table_files`'s (a
    DataFrame's own files or its cache entry of ``columns``; a path's or a Delta table's files, whose columns
    `plan_units` checks per file)."""
    from sparkgrad.data.dataset import expand_paths
    from sparkgrad.data.source import table_files

    if isinstance(source, (list, tuple)):  # several Parquet paths, directories or globs
        return expand_paths(list(source))
    is_frame = hasattr(source, "inputFiles") and hasattr(source, "schema")
    return list(table_files(source, columns=columns if is_frame else None, cache_dir=cache_dir).files)


def _footer(path: str) -> Any:
    import pyarrow.parquet as pq

    if not os.path.exists(path):
        raise SparkgradIOError(f"cannot open Parquet file {path!r}: it does not exist", path=path)
    try:
        return pq.ParquetFile(path)
    except Exception as e:  # ArrowInvalid, OSError: not Parquet or a damaged footer
        raise SchemaError(f"file {path!r} is not a readable Parquet file: {e}", path=path) from e


def _spark_type(field: Any, path: str) -> Any:
    """The Spark type a Parquet column of ``field`` is read as (a VectorUDT's struct: a vector)."""
    try:
        return _as_spark(field.type)
    except Exception as e:  # pyspark's TypeError / PySparkTypeError for a type Spark has no match for
        raise SchemaError(
            f"column {field.name!r} of file {path!r} has Arrow type {field.type}, which Spark cannot read",
            column=field.name,
            path=path,
        ) from e


def _as_spark(kind: Any) -> Any:
    """Spark's type of an Arrow type as Parquet stores it (Parquet has one list and one binary kind)."""
    import pyarrow as pa
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import from_arrow_type

    from sparkgrad.cluster.arrow_feed import is_vector_type

    if is_vector_type(kind):
        return VectorUDT()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return T.ArrayType(_as_spark(kind.value_type))
    if pa.types.is_large_string(kind):
        return T.StringType()
    if pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return T.BinaryType()
    return from_arrow_type(kind)


def plan_units(files: list[str], columns: Sequence[str], what: str) -> tuple[list[_Unit], Any]:
    """Every row group of ``files``, and the first file's Arrow schema; each file must hold ``columns``."""
    from sparkgrad.data.table import close_parquet

    units, schema = [], None
    for path in files:
        pf = _footer(path)
        try:
            names = pf.schema_arrow.names
            for c in columns:
                if c not in names:
                    raise SchemaError(
                        f"{what}: column {c!r} is not in file {path!r}; its columns: {', '.join(names)}",
                        column=c,
                        path=path,
                    )
            schema = schema if schema is not None else pf.schema_arrow
            meta = pf.metadata
            units += [_Unit(path, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)]
        finally:
            close_parquet(pf)
    return units, schema


def split_units(units: list[_Unit], tasks: int) -> list[list[_Unit]]:
    """``units`` cut into at most ``tasks`` contiguous runs of about equal rows (none empty)."""
    tasks = max(1, min(tasks, len(units)))
    total = sum(u.rows for u in units)
    runs: list[list[_Unit]] = [[] for _ in range(tasks)]
    seen = 0
    for i, u in enumerate(units):
        # the run whose share of the rows this unit's middle falls in, but never fewer units left than runs
        k = min(tasks - 1, int((seen + u.rows / 2) * tasks / total) if total else i * tasks // len(units))
        k = max(k, tasks - (len(units) - i))
        runs[k].append(u)
        seen += u.rows
    return [r for r in runs if r]


def prepare_output(output_path: str, mode: str, files: list[str], what: str) -> str:
    """The absolute output directory, emptied under ``mode="overwrite"``; refuses before any job what cannot be
    written."""
    if mode not in ("overwrite", "error"):
        raise InvalidArgumentError(f"{what}: mode must be 'overwrite' or 'error', not {mode!r}")
    out = os.path.abspath(output_path[len("file:") :] if output_path.startswith("file:") else output_path)
    if output_path.startswith("dbfs:/"):
        out = "/dbfs/" + output_path[len("dbfs:/") :].lstrip("/")
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        raise SparkgradIOError(f"{what}: the directory {parent!r} that would hold {out!r} does not exist", path=parent)
    inside = [f for f in files if os.path.abspath(f) == out or os.path.abspath(f).startswith(out + os.sep)]
    if inside:
        raise InvalidArgumentError(f"{what}: output_path {out!r} holds the table's own file {inside[0]!r}")
    if os.path.lexists(out):
        if mode == "error":
            raise SparkgradIOError(f"{what}: {out!r} already exists (mode='error'; use mode='overwrite')", path=out)
        if os.path.isdir(out) and not os.path.islink(out):
            shutil.rmtree(out)
        else:
            os.remove(out)
    os.mkdir(out)
    return out


@dataclass(frozen=True)
class TableScorer:
    """predict_table's mapInArrow function: each input row is a run number; its run's rows scored to one file."""

    scorer: Any  # model._Scorer
    columns: Any  # model._Columns
    names: tuple[str, ...]  # of the output columns, in order
    runs: tuple  # of tuples of _Unit
    keep: tuple  # (name, pyarrow type) of each column kept
    output: str
    job: str  # a name shared by this job's part files
    spark_schema: str | None  # Spark's schema JSON, for the footer

    def __call__(self, batches: Any) -> Any:
        import pyarrow as pa

        for batch in batches:
            for run in batch.column(0).to_pylist():
                rows = self._write(int(run))
                yield pa.RecordBatch.from_arrays(
                    [pa.array([run], pa.int32()), pa.array([rows], pa.int64())], ["run", "rows"]
                )

    def _tables(self, model: Any, run: int) -> Any:
        """The output tables of a run's row groups, batch by batch."""
        import pyarrow as pa

        from sparkgrad.data.table import _READ_ROWS, close_parquet

        features = list(self.scorer.spec.features)
        kept = [name for name, _ in self.keep]
        for unit in self.runs[run]:
            pf = _footer(unit.path)
            try:
                first = 0
                read = list(dict.fromkeys(features + kept))
                # the reader's largest record batch: each is scored as one predict call's worth of rows
                batches = pf.iter_batches(batch_size=_READ_ROWS[1], row_groups=[unit.row_group], columns=read)
                for batch in batches:
                    x = pa.RecordBatch.from_arrays([batch.column(c) for c in features], names=features)
                    try:
                        out = self.scorer.outputs(model, x, None, first)
                    except InvalidArgumentError as exc:
                        raise InvalidArgumentError(
                            f"file {unit.path!r}, row group {unit.row_group}: {exc}", path=unit.path
                        ) from None
                    first += batch.num_rows
                    arrays = self.columns.arrays(out, vectors=True) + [batch.column(c) for c in kept]
                    yield pa.Table.from_arrays(arrays, names=list(self.names) + kept)
            finally:
                close_parquet(pf)

    def _write(self, run: int) -> int:
        import pyarrow as pa
        import pyarrow.parquet as pq

        model = self.scorer.shipped.load()
        final = os.path.join(self.output, f"part-{run:05d}-{self.job}.parquet")
        temp = os.path.join(self.output, f".part-{run:05d}-{self.job}-{uuid.uuid4().hex}.tmp")
        writer, rows = None, 0
        try:
            tables = self._tables(model, run)
            empty = np.zeros((0, model.output_classes), np.float32)
            first = next(tables, None)
            if first is None:  # a run of empty row groups: a file of the schema and no rows
                arrays = self.columns.arrays(empty, vectors=True) + [pa.array([], t) for _, t in self.keep]
                first = pa.Table.from_arrays(arrays, names=list(self.names) + [n for n, _ in self.keep])
            schema = first.schema
            if self.spark_schema is not None:
                schema = schema.with_metadata({SPARK_SCHEMA_KEY: self.spark_schema.encode()})
            writer = pq.ParquetWriter(temp, schema)
            for table in itertools.chain([first], tables):
                writer.write_table(table.replace_schema_metadata(schema.metadata))
                rows += table.num_rows
            writer.close()
            writer = None
            os.replace(temp, final)
        finally:
            if writer is not None:
                writer.close()
            if os.path.exists(temp):
                os.remove(temp)
        return rows
