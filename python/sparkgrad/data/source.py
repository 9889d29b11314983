"""Where a table's rows come from: the Parquet files every worker reads, for a DataFrame, a path or a Delta table.

    tf = table_files(df, columns=["pixels", "label"])      # TableFiles(files, origin, description, version)
    ds = ParquetDataset(tf.files, {"pixels": "pixels"}, 128, label="label", ...)

Three origins, in the order they are tried:

- **A plain Parquet scan** (``origin="parquet"``): a DataFrame whose plan is
  nothing but a scan of unpartitioned Parquet files, at most with columns
  pruned (a projection of plain column references: no renaming, no computed
  column, no filter, join, aggregation, sample or limit), is read from its
  own files, ``DataFrame.inputFiles()``. On classic Spark the optimized
  logical plan is read through py4j: ``Project`` of ``AttributeReference``s
  (or nothing) over a ``LogicalRelation`` whose relation is a
  ``HadoopFsRelation`` of ``ParquetFileFormat`` with an empty partition
  schema. On Spark Connect the client's own plan (the relation protobuf the
  client sends) is read: a ``project`` of ``unresolved_attribute``s naming
  top-level columns (or nothing) over a ``read.data_source`` of format
  ``parquet`` without a user-given schema. Either way the DataFrame's columns
  must all be in the files (a partition column is not) and every file must be
  at a path the workers open (a local path, ``file:``, ``dbfs:/``, ``/Volumes``).
  A path (a Parquet file, directory or glob) is read the same way.
- **A Delta table** (``origin="delta"``): a directory with a ``_delta_log/``,
  or a ``deltalake.DeltaTable``: the files of its snapshot, listed by the
  ``deltalake`` package. A snapshot with deletion vectors, or a table with
  column mapping, is refused: its files do not hold its rows as they are.
- **The cache** (``origin="cache"``): any other DataFrame is written once as
  Parquet (only the columns asked for) under a cache directory, into a
  hidden temporary directory renamed into place, a marker file inside, so a
  writer that dies leaves nothing that looks whole. The entry's name is a
  key of the plan (``DataFrame.semanticHash()`` and the schema) and of the
  state of its inputs (each of ``inputFiles()`` with its size and
  modification time: ``os.stat`` for local and mounted paths, Hadoop's
  ``FileStatus`` for other URIs on classic Spark; over Connect, other URIs
  count by name alone), so a second fit of the same DataFrame reuses it and a
  changed input file makes a new one. `clear_cache` removes entries.

What this module does not do: read rows (ParquetDataset), or run tasks.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from sparkgrad.data.dataset import expand_paths
from sparkgrad.errors import (
    CorruptRecordError,
    InvalidArgumentError,
    NativeLibraryError,
    SchemaError,
    SparkgradIOError,
)

CACHE_DIR_ENV = "SPARKGRAD_CACHE_DIR"
_MARKER = "_sparkgrad_entry.json"  # written into an entry before it is renamed into place
_TMP_PREFIX = ".tmp-"
_ENTRY = re.compile(r"^([0-9a-f]{16})-[0-9a-f]{16}$")  # <plan key>-<state key>
_UNFINISHED = re.compile(r"^\.tmp-([0-9a-f]{16})-[0-9a-f]{16}-[0-9a-f]{8}$")  # .tmp-<entry>-<writer>
_PLAIN_IDENTIFIER = re.compile(r"^[^.`]+$|^`[^`]+`$")  # one top-level column, maybe back-quoted


@dataclass(frozen=True)
class TableFiles:
    """The Parquet files a table's rows are read from, and where they came from.

    Attributes:
        files: Paths every worker opens with pyarrow (local or mounted; ``dbfs:/x`` is ``/dbfs/x``), sorted.
        origin: ``"parquet"`` (a plain scan or a path, read from its own files), ``"delta"`` (a Delta
            snapshot's files) or ``"cache"`` (a DataFrame written to the cache).
        description: What was read, for messages and logs.
        version: The Delta table's version when ``origin == "delta"``, else None.
    """

    files: tuple[str, ...]
    origin: str
    description: str
    version: int | None = None


def table_files(
    source: Any, *, columns: Sequence[str] | None = None, cache_dir: str | os.PathLike | None = None
) -> TableFiles:
    """The Parquet files that hold ``source``'s rows: its own files where it has them, else a cache entry.

    Args:
        source: A pyspark DataFrame (classic or Spark Connect), a path (a Parquet file, directory or glob,
            or a Delta table's directory, known by its ``_delta_log/``), or a ``deltalake.DeltaTable``.
        columns: The columns training reads (dotted through structs), checked to exist; a DataFrame that
            goes to the cache is written with only their top-level columns. None: every column.
        cache_dir: Where DataFrames are cached: a local path, ``dbfs:/...`` or ``/Volumes/...``, seen at
            the same place by this process, Spark's executors and the workers. Default: the environment
            variable ``SPARKGRAD_CACHE_DIR``, else ``sparkgrad-cache`` in the temporary directory when
            Spark's master is local (on a cluster, then, one of the former is required).

    Returns:
        The files, their origin, a description, and the Delta version.

    Raises:
        SchemaError: A column is missing (the table's columns listed).
        SparkgradIOError: A path does not exist, a table has no files, or the cache directory cannot be
            written (named).
        CorruptRecordError: A file of a Parquet path is not Parquet.
        InvalidArgumentError: A Delta snapshot with deletion vectors or column mapping (named, with what to
            do), files at a URI the workers cannot open, or a source of another kind.
    """
    columns = None if columns is None else [str(c) for c in columns]
    if isinstance(source, (str, os.PathLike)):
        path = _local_path(os.fspath(source), encoded=False)
        if path is None:
            raise InvalidArgumentError(
                f"{os.fspath(source)!r} is not a path the workers can open: read it with Spark and pass the DataFrame"
            )
        path = os.path.abspath(path)  # workers run elsewhere than this process's working directory
        if os.path.isdir(os.path.join(path, "_delta_log")):
            return _delta_files(_open_delta(path), columns)
        return _parquet_path_files(path, columns)
    if type(source).__module__.startswith("deltalake") and hasattr(source, "file_uris"):
        return _delta_files(source, columns)
    if type(source).__module__.startswith("pyspark.sql") and type(source).__name__ == "DataFrame":
        return _dataframe_files(source, columns, cache_dir)
    raise InvalidArgumentError(
        f"a table source is a DataFrame, a path or a deltalake.DeltaTable, not {type(source).__name__}"
    )


def clear_cache(cache_dir: str | os.PathLike | None = None, source: Any = None) -> int:
    """Removes cache entries: every entry under ``cache_dir``, or only those of one DataFrame.

    Unfinished writes (a writer that died) go too. Other files in the directory are left alone.

    Args:
        cache_dir: The cache directory (as `table_files` takes it; default the same).
        source: A DataFrame whose entries (for any columns and any state of its input files) are removed;
            None removes every entry. Paths and Delta tables are never cached: 0.

    Returns:
        The entries (and unfinished writes) removed.
    """
    df = source if source is not None and type(source).__module__.startswith("pyspark.sql") else None
    if source is not None and df is None:
        return 0
    root = _cache_root(cache_dir, df, check=False)
    if not os.path.isdir(root.local):
        return 0
    prefix = None if df is None else _plan_key(df)
    removed = 0
    for name in sorted(os.listdir(root.local)):
        m = _ENTRY.match(name) or _UNFINISHED.match(name)
        if m is None or (prefix is not None and m.group(1) != prefix):
            continue
        shutil.rmtree(os.path.join(root.local, name), ignore_errors=True)
        removed += 1
    return removed


# ---- paths ------------------------------------------------------------------


def _local_path(uri: str, *, encoded: bool) -> str | None:
    """The local (or mounted) path of a file URI or path, or None where workers cannot open it as a file.

    ``encoded``: the URI comes from Spark (``inputFiles()``), which percent-encodes it.
    """
    scheme = urlparse(uri).scheme if "://" in uri or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/", uri) else ""
    if scheme == "":
        return uri
    if scheme == "file":
        path = urlparse(uri).path
        return unquote(path) if encoded else path
    if scheme == "dbfs":
        path = urlparse(uri).path
        return "/dbfs/" + (unquote(path) if encoded else path).lstrip("/")
    return None


def _file_schema(path: str) -> Any:
    from sparkgrad.data.table import close_parquet, open_parquet

    pf = open_parquet(path)
    try:
        return pf.schema_arrow
    finally:
        close_parquet(pf)


def _check_columns(path: str, columns: list[str] | None, what: str, schema: Any = None) -> None:
    """Checks that a file (its Arrow schema, read when not given) holds every column asked for."""
    from sparkgrad.data.table import _column_names, _field

    schema = _file_schema(path) if schema is None else schema
    for name in columns or []:
        if _field(schema, name) is None:
            raise SchemaError(
                f"column {name!r} is not in {what} (file {path!r}); its columns: " + ", ".join(_column_names(schema)),
                column=name,
                path=path,
            )


def _parquet_path_files(path: str, columns: list[str] | None) -> TableFiles:
    if not (set("*?[") & set(path)):
        if not os.path.exists(path):
            raise SparkgradIOError(f"Parquet source {path!r} does not exist", path=path)
        if os.path.isdir(path):
            names = [n for n in os.listdir(path) if not n.startswith((".", "_"))]
            if not any(os.path.isfile(os.path.join(path, n)) for n in names):
                parts = sorted(n for n in names if "=" in n and os.path.isdir(os.path.join(path, n)))
                why = (
                    f"it is partitioned ({parts[0]}, ...), and partition values are not in the files: read it with "
                    "spark.read.parquet and pass the DataFrame"
                    if parts
                    else "an empty table"
                )
                raise SparkgradIOError(f"Parquet source {path!r} holds no data files: {why}", path=path)
    files = expand_paths(path)
    for f in files:
        _check_parquet_magic(f)
    _check_columns(files[0], columns, f"Parquet source {path!r}")
    return TableFiles(tuple(files), "parquet", f"Parquet files {path} ({len(files)} files)")


def _check_parquet_magic(path: str) -> None:
    """Every Parquet file ends in the four bytes ``PAR1`` (the format's footer magic)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4))
            tail = f.read(4)
    except FileNotFoundError as e:
        raise SparkgradIOError(f"Parquet file {path!r} does not exist", path=path) from e
    except OSError as e:
        raise SparkgradIOError(f"cannot read Parquet file {path!r}: {e.strerror}", path=path) from e
    if size < 12 or tail != b"PAR1":
        raise CorruptRecordError(f"file {path!r} is not Parquet (no PAR1 footer)", path=path)


# ---- Delta ------------------------------------------------------------------


def _open_delta(path: str) -> Any:
    try:
        from deltalake import DeltaTable
    except ImportError as e:
        raise NativeLibraryError(
            f"{path!r} is a Delta table, and reading one needs the deltalake package: pip install 'sparkgrad[delta]'",
            library="deltalake",
        ) from e
    try:
        return DeltaTable(path)
    except Exception as e:  # deltalake's TableNotFoundError, DeltaError: a log it cannot read
        raise SparkgradIOError(f"Delta table {path!r} cannot be opened: {e}", path=path) from e


def _delta_files(dt: Any, columns: list[str] | None) -> TableFiles:
    version = dt.version()
    uri = (_local_path(dt.table_uri, encoded=True) or dt.table_uri).rstrip("/")  # a local table by its path
    name = f"Delta table {uri} at version {version}"
    reader_features = dt.protocol().reader_features or []
    if "deletionVectors" in reader_features:
        import pyarrow as pa

        try:
            marked = pa.RecordBatchReader.from_stream(dt.deletion_vectors()).read_all().num_rows
        except Exception as e:  # the deletion vectors cannot even be read: the snapshot is no more usable
            raise InvalidArgumentError(f"{name}: its deletion vectors cannot be read ({e})", table=uri) from e
        if marked:
            raise InvalidArgumentError(
                f"{name} has deletion vectors on {marked} of its files: rows deleted from them are still in "
                "the Parquet files, which sparkgrad reads as they are. Purge them first (on Databricks: "
                f"REORG TABLE delta.`{uri}` APPLY (PURGE)), or write the table without deletion vectors "
                "(delta.enableDeletionVectors = false), or read it with Spark and pass the DataFrame "
                "(spark.read.format('delta').load(...)), which then goes through the cache",
                table=uri,
                version=version,
            )
    mode = dt.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise InvalidArgumentError(
            f"{name} uses column mapping (mode {mode}): its files name columns by physical ids, not by the "
            "table's names; read it with Spark and pass the DataFrame, which then goes through the cache",
            table=uri,
        )
    files = []
    for file_uri in dt.file_uris():
        path = _local_path(file_uri, encoded=True)
        if path is None:
            raise InvalidArgumentError(
                f"{name}: its files are at {file_uri!r}, which workers cannot open as a file: mount the storage "
                "(/dbfs, /Volumes) or read the table with Spark and pass the DataFrame",
                table=uri,
            )
        files.append(path)
    if not files:
        raise SparkgradIOError(f"{name} holds no data files (an empty table)", path=uri)
    files.sort()
    partitions = set(dt.metadata().partition_columns)
    for col in columns or []:
        if col.split(".")[0] in partitions:
            raise SchemaError(
                f"column {col!r} of {name} is a partition column, whose values are not in the files: "
                "read the table with Spark and pass the DataFrame",
                column=col,
                table=uri,
            )
    _check_columns(files[0], columns, name)
    return TableFiles(tuple(files), "delta", f"{name} ({len(files)} files)", version)


# ---- DataFrames -------------------------------------------------------------


def _is_connect(df: Any) -> bool:
    return type(df).__module__.startswith("pyspark.sql.connect")


def _dataframe_files(df: Any, columns: list[str] | None, cache_dir: str | os.PathLike | None) -> TableFiles:
    top = _top_columns(df, columns)
    reason = _connect_scan_refusal(df) if _is_connect(df) else _classic_scan_refusal(df)
    if reason is None:
        files = [_local_path(u, encoded=True) for u in df.inputFiles()]
        if not files:
            raise SparkgradIOError("the DataFrame scans no files (an empty table)")
        if all(f is not None for f in files):
            files = sorted(files)
            gone = [f for f in files if not os.path.isfile(f)]
            if gone:
                raise SparkgradIOError(
                    f"file {gone[0]!r} of the DataFrame's Parquet scan ({len(gone)} of {len(files)} files) is gone "
                    "since Spark listed it: read the table again",
                    path=gone[0],
                )
            schema = _file_schema(files[0])
            if set(df.columns) <= set(schema.names):
                _check_columns(files[0], columns, "the DataFrame's Parquet files", schema)
                where = os.path.commonpath(files) if len(files) > 1 else files[0]
                return TableFiles(tuple(files), "parquet", f"Parquet scan of {where} ({len(files)} files)")
            reason = "its columns are not all in its files (partition columns)"
        else:
            reason = "its files are not at paths the workers open"
    return _cached(df, top, cache_dir, reason)


def _top_columns(df: Any, columns: list[str] | None) -> list[str]:
    """The top-level columns that hold ``columns`` (dotted through structs), in order; all when None."""
    schema = df.schema
    if columns is None:
        return list(schema.names)
    out: list[str] = []
    for dotted in columns:
        fields, rest, top = list(schema.fields), dotted, None
        while rest:
            for n in range(len(rest), 0, -1):  # longest names first, as the reader resolves them
                if n < len(rest) and rest[n] != ".":
                    continue
                hit = next((f for f in fields if f.name == rest[:n]), None)
                if hit is not None:
                    top, rest = top or hit.name, rest[n + 1 :]
                    fields = list(getattr(hit.dataType, "fields", None) or [])
                    break
            else:
                raise SchemaError(
                    f"column {dotted!r} is not in the DataFrame; its columns: " + ", ".join(_spark_names(schema)),
                    column=dotted,
                )
        if top not in out:
            out.append(top)
    return out


def _spark_names(schema: Any, prefix: str = "") -> list[str]:
    out = []
    for f in schema.fields:
        sub = getattr(f.dataType, "fields", None)
        out += _spark_names(f.dataType, prefix + f.name + ".") if sub is not None else [prefix + f.name]
    return out


def _classic_scan_refusal(df: Any) -> str | None:
    """Why a classic DataFrame is not a plain Parquet scan, or None when it is (see the module docstring)."""
    try:
        node = df._jdf.queryExecution().optimizedPlan()
        kind = node.getClass().getSimpleName()
        if kind == "Project":
            items = node.projectList()
            if any(items.apply(i).getClass().getSimpleName() != "AttributeReference" for i in range(items.size())):
                return "its projection computes or renames columns"
            node = node.child()
            kind = node.getClass().getSimpleName()
        if kind != "LogicalRelation":
            return f"its plan has a {kind}"
        relation = node.relation()
        if relation.getClass().getSimpleName() != "HadoopFsRelation":
            return f"it reads a {relation.getClass().getSimpleName()}"
        file_format = relation.fileFormat().getClass().getSimpleName()
        if file_format != "ParquetFileFormat":
            return f"it reads {file_format}"
        if not relation.partitionSchema().isEmpty():
            return "its files are partitioned"
    except Exception as e:  # py4j: a plan this code does not know
        return f"its plan could not be read ({type(e).__name__})"
    return None


def _connect_scan_refusal(df: Any) -> str | None:
    """Why a Spark Connect DataFrame is not a plain Parquet scan, or None when it is (see the module docstring)."""
    try:
        rel = df._plan.to_proto(df.sparkSession.client).root
    except Exception as e:  # a client whose plan API differs
        return f"its plan could not be read ({type(e).__name__})"
    if rel.WhichOneof("rel_type") == "project":
        names = []
        for expr in rel.project.expressions:
            if expr.WhichOneof("expr_type") != "unresolved_attribute":
                return "its projection computes or renames columns"
            ident = expr.unresolved_attribute.unparsed_identifier
            if expr.unresolved_attribute.is_metadata_column:
                return "its projection reads a metadata column"
            if not _PLAIN_IDENTIFIER.match(ident):
                return "its projection reaches into a struct"
            names.append(ident.strip("`"))
        if names != list(df.columns):
            return "its projection renames columns"
        rel = rel.project.input
    kind = rel.WhichOneof("rel_type")
    if kind != "read" or rel.read.WhichOneof("read_type") != "data_source":
        return f"its plan has a {kind}"
    source = rel.read.data_source
    file_format = source.format or _conf(df, "spark.sql.sources.default")  # spark.read.load() names none
    if file_format.lower() != "parquet":
        return f"it reads {file_format or 'a source the server does not tell'}"
    if source.schema:
        return "it reads with a schema of its own"
    return None


def _plan_outline(df: Any) -> str:
    """The plan's operators, outermost first, for descriptions: ``Filter(LogicalRelation)``."""

    def classic(node: Any, depth: int) -> str:
        kids = node.children()
        inner = [classic(kids.apply(i), depth + 1) for i in range(kids.size())] if depth < 6 else ["..."]
        return node.getClass().getSimpleName() + (f"({', '.join(inner)})" if inner else "")

    def connect(rel: Any, depth: int) -> str:
        kind = rel.WhichOneof("rel_type")
        sub = getattr(rel, kind)
        inner = [
            connect(getattr(sub, f.name), depth + 1)
            for f in sub.DESCRIPTOR.fields
            if f.message_type is not None and f.message_type.name == "Relation" and sub.HasField(f.name)
        ]
        return kind + (f"({', '.join(inner)})" if inner and depth < 6 else "")

    try:
        if _is_connect(df):
            text = connect(df._plan.to_proto(df.sparkSession.client).root, 0)
        else:
            text = classic(df._jdf.queryExecution().optimizedPlan(), 0)
    except Exception:  # a description only
        return "plan not shown"
    return text if len(text) <= 160 else text[:157] + "..."


# ---- the cache --------------------------------------------------------------


@dataclass(frozen=True)
class _CacheRoot:
    given: str  # as the caller named it
    local: str  # where this process and the workers open it
    spark: str  # where Spark writes it


def _cache_root(cache_dir: str | os.PathLike | None, df: Any, *, check: bool) -> _CacheRoot:
    """The cache directory; with ``check``, made and probed with a file, or a SparkgradIOError naming it."""
    given = os.fspath(cache_dir) if cache_dir is not None else os.environ.get(CACHE_DIR_ENV) or _default_cache(df)
    local = _local_path(given, encoded=False)
    if local is None:
        raise InvalidArgumentError(
            f"cache directory {given!r}: the workers read the cache as files, so it must be a local path, "
            "dbfs:/... or /Volumes/...",
            path=given,
        )
    local = os.path.abspath(local)
    if given.startswith("dbfs:") or local.startswith("/Volumes/"):
        spark = given
    else:
        spark = "file://" + local
    if check:
        try:
            os.makedirs(local, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=_TMP_PREFIX + "probe-", dir=local)
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise SparkgradIOError(
                f"cache directory {given!r} cannot be written ({e.strerror or e}): pass cache_dir= a writable "
                f"directory or set {CACHE_DIR_ENV}",
                path=given,
            ) from e
    return _CacheRoot(given, local, spark)


def _conf(df: Any, key: str) -> str:
    """A Spark configuration value (its default included), or "" where it has none or the server will not tell."""
    try:
        return df.sparkSession.conf.get(key) or ""  # (given a default, get returns it in place of Spark's own)
    except Exception:  # no value, or a Connect server that hides the key
        return ""


def _default_cache(df: Any) -> str:
    master = "" if df is None else _conf(df, "spark.master")
    if df is None or master.startswith("local"):
        return os.path.join(tempfile.gettempdir(), "sparkgrad-cache")
    raise InvalidArgumentError(
        f"this DataFrame must be cached as Parquet, and Spark's master ({master or 'not told'}) is not local, "
        "so the cache must be a directory every machine sees: pass cache_dir= (dbfs:/..., /Volumes/...) "
        f"or set {CACHE_DIR_ENV}"
    )


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _plan_key(df: Any) -> str:
    return _digest(df.semanticHash(), df.schema.json())


def _input_state(df: Any) -> list[tuple[str, int | None, int | None]]:
    """Each input file of the plan with its size and modification time (None where they cannot be read)."""
    out = []
    hadoop = None
    for uri in sorted(df.inputFiles()):
        path = _local_path(uri, encoded=True)
        if path is not None:
            try:
                st = os.stat(path)
                out.append((uri, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append((uri, None, None))
            continue
        if not _is_connect(df):
            hadoop = hadoop or df.sparkSession._jsc.hadoopConfiguration()
            try:
                p = df.sparkSession._jvm.org.apache.hadoop.fs.Path(uri)
                st = p.getFileSystem(hadoop).getFileStatus(p)
                out.append((uri, st.getLen(), st.getModificationTime()))
                continue
            except Exception:  # py4j: the file vanished or the filesystem refuses; its name still counts
                pass
        out.append((uri, None, None))
    return out


def _entry_files(entry: str) -> list[str]:
    return sorted(
        os.path.join(entry, n) for n in os.listdir(entry) if n.endswith(".parquet") and not n.startswith((".", "_"))
    )


def _cached(df: Any, top: list[str], cache_dir: str | os.PathLike | None, reason: str) -> TableFiles:
    root = _cache_root(cache_dir, df, check=True)
    plan_key = _plan_key(df)
    inputs = _input_state(df)
    name = f"{plan_key}-{_digest(inputs, top)}"
    entry = os.path.join(root.local, name)
    outline = _plan_outline(df)
    if not os.path.isfile(os.path.join(entry, _MARKER)):
        _write_entry(df, top, root, name, {"plan": outline, "columns": top, "inputs": inputs})
    files = _entry_files(entry)
    if not files:
        raise SparkgradIOError(f"cache entry {entry!r} holds no Parquet files", path=entry)
    return TableFiles(tuple(files), "cache", f"cache {entry} of a DataFrame ({outline}; not a plain scan: {reason})")


def _write_entry(df: Any, top: list[str], root: _CacheRoot, name: str, facts: dict) -> None:
    """Writes the entry ``name`` through a hidden temporary directory, renamed into place with its marker inside."""
    entry = os.path.join(root.local, name)
    tmp = f"{_TMP_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
    try:
        df.select(*[df["`" + c.replace("`", "``") + "`"] for c in top]).write.parquet(f"{root.spark}/{tmp}")
    except Exception as e:  # a Py4JJavaError or a Connect error: Spark says why
        shutil.rmtree(os.path.join(root.local, tmp), ignore_errors=True)
        raise SparkgradIOError(
            f"writing the DataFrame into cache directory {root.given!r} failed: {e}", path=entry
        ) from e
    tmp_local = os.path.join(root.local, tmp)
    with open(os.path.join(tmp_local, _MARKER), "w") as f:
        json.dump(dict(facts, written=time.time()), f)
    if os.path.isdir(entry) and not os.path.isfile(os.path.join(entry, _MARKER)):
        shutil.rmtree(entry, ignore_errors=True)  # a directory that never became whole
    try:
        os.rename(tmp_local, entry)
    except OSError as e:
        shutil.rmtree(tmp_local, ignore_errors=True)
        if not os.path.isfile(os.path.join(entry, _MARKER)):  # not another writer that got there first
            raise SparkgradIOError(f"cache entry {entry!r} could not be put in place: {e}", path=entry) from e
