"""STAND-IN for sparkgrad.data.source (another branch writes the real one): a DataFrame -> Parquet files.

A plain ``spark.read.parquet`` scan is read from ``inputFiles()``; anything else is written once as Parquet
under the cache directory, keyed by the plan's semantic hash. Minimal on purpose.
"""

from __future__ import annotations

import glob
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkgrad.errors import InvalidArgumentError


@dataclass(frozen=True)
class TableFiles:
    files: tuple[str, ...]  # paths every executor can open with pyarrow
    origin: str  # "parquet", "delta" or "cache"
    description: str  # for messages
    version: int | None = None


def _default_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "sparkgrad-table-cache")


def _local(path: str) -> str:
    return path[len("file:") :] if path.startswith("file:") else path


def _plain_scan(df: Any) -> bool:
    try:
        plan = df._jdf.queryExecution().optimizedPlan().toString().strip().splitlines()
    except Exception:  # noqa: BLE001 - Spark Connect: no JVM plan here; the cache path
        return False
    return len(plan) == 1 and plan[0].startswith("Relation ") and "parquet" in plan[0]


def table_files(source: Any, *, columns: Sequence[str] | None = None, cache_dir: str | None = None) -> TableFiles:
    if isinstance(source, (str, os.PathLike)):
        return TableFiles((os.fspath(source),), "parquet", os.fspath(source))
    if _plain_scan(source):
        files = tuple(_local(f) for f in source.inputFiles())
        return TableFiles(files, "parquet", f"the Parquet scan of {len(files)} files")
    out = os.path.join(cache_dir or _default_dir(), f"df-{source.semanticHash() & 0xFFFFFFFF:08x}")
    if not os.path.exists(os.path.join(out, "_SUCCESS")):
        df = source.select(*columns) if columns else source
        try:
            df.write.mode("overwrite").parquet(out)
        except Exception as exc:  # noqa: BLE001 - Spark's write failure, in words
            raise InvalidArgumentError(f"cannot write the table cache {out!r}: {str(exc).splitlines()[0]}") from None
    files = tuple(sorted(glob.glob(os.path.join(out, "*.parquet"))))
    return TableFiles(files, "cache", f"the DataFrame cached as Parquet in {out}")


def clear_cache(cache_dir: str | None = None, source: Any = None) -> int:
    import shutil

    root = cache_dir or _default_dir()
    dirs = glob.glob(os.path.join(root, "df-*"))
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    return len(dirs)
