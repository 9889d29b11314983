"""Saving sparkgrad.spark's Estimator and Model with Spark ML's MLWritable / MLReadable.

A saved stage is a directory that Spark ML's own Pipeline reader knows:

    <path>/metadata/part-*   one JSON line, DefaultParamsWriter's layout (class, uid, sparkVersion,
                             paramMap, defaultParamMap, plus extra fields)
    <path>/model/*.parquet   the saved-model bytes (sparkgrad.nn.saved) as rows (chunk int, data binary)

Both parts are written and read through the session's DataFrame API, never
the driver's local filesystem or a SparkContext, so the same code works on
classic Spark and over Spark Connect, and on any filesystem Spark writes to.
Params whose values are not JSON (the model object, an optimizer instance)
are left out of ``paramMap`` and saved by the stage itself.
"""

from __future__ import annotations

import json
import time
from typing import Any

from sparkgrad.errors import ModelError

CHUNK = 4 << 20  # bytes of saved model per row


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def metadata_json(instance: Any, spark: Any, skip: tuple[str, ...] = (), extra: dict | None = None) -> str:
    params = {p.name: v for p, v in instance._paramMap.items() if p.name not in skip and _jsonable(v)}
    defaults = {p.name: v for p, v in instance._defaultParamMap.items() if p.name not in skip and _jsonable(v)}
    meta = {
        "class": f"{type(instance).__module__}.{type(instance).__name__}",
        "timestamp": int(round(time.time() * 1000)),
        "sparkVersion": spark.version,
        "uid": instance.uid,
        "paramMap": params,
        "defaultParamMap": defaults,
    }
    meta.update(extra or {})
    return json.dumps(meta, separators=(",", ":"))


def _join(path: str, part: str) -> str:
    return path.rstrip("/") + "/" + part


def write_stage(spark: Any, path: str, metadata: str, model_bytes: bytes | None, overwrite: bool) -> None:
    mode = "overwrite" if overwrite else "error"  # "errorifexists" is not a mode name Connect knows
    spark.createDataFrame([(metadata,)], "value string").coalesce(1).write.mode(mode).text(_join(path, "metadata"))
    if model_bytes is not None:
        rows = [(i, model_bytes[off : off + CHUNK]) for i, off in enumerate(range(0, len(model_bytes), CHUNK))]
        df = spark.createDataFrame(rows, "chunk int, data binary").coalesce(1)
        df.write.mode(mode).parquet(_join(path, "model"))


def read_metadata(spark: Any, path: str, expected_class: str) -> dict:
    try:
        line = spark.read.text(_join(path, "metadata")).first()
    except Exception as exc:  # noqa: BLE001 - Spark's own error type differs between classic and Connect
        raise ModelError(f"{path}: cannot read the saved stage's metadata: {str(exc).splitlines()[0]}") from None
    if line is None:
        raise ModelError(f"{path}/metadata is empty")
    meta = json.loads(line[0])
    if meta.get("class") != expected_class:
        raise ModelError(f"{path}: saved by {meta.get('class')}, not {expected_class}")
    return meta


def read_model_bytes(spark: Any, path: str) -> bytes:
    rows = spark.read.parquet(_join(path, "model")).orderBy("chunk").collect()
    return b"".join(bytes(r.data) for r in rows)


def set_params(instance: Any, meta: dict) -> None:
    """paramMap and defaultParamMap back onto ``instance`` (as DefaultParamsReader.getAndSetParams)."""
    instance._resetUid(meta["uid"])
    for name, value in meta.get("defaultParamMap", {}).items():
        if instance.hasParam(name):
            instance._setDefault(**{name: value})
    for name, value in meta.get("paramMap", {}).items():
        if instance.hasParam(name):
            instance._set(**{name: value})


def writer_class():
    """An MLWriter whose save() does its own overwrite (no JVM FileSystemOverwrite: works over Connect)."""
    from pyspark.ml.util import MLWriter

    class StageWriter(MLWriter):
        def __init__(self, instance: Any) -> None:
            super().__init__()
            self.instance = instance

        def save(self, path: str) -> None:
            self.saveImpl(path)

        def saveImpl(self, path: str) -> None:
            self.instance._save_to(self.sparkSession, path, self.shouldOverwrite)

    return StageWriter


def reader_class():
    from pyspark.ml.util import MLReader

    class StageReader(MLReader):
        def __init__(self, cls: type) -> None:
            super().__init__()
            self.cls = cls

        def load(self, path: str) -> Any:
            return self.cls._load_from(self.sparkSession, path)

    return StageReader


class Persisted:
    """write() and read() for a stage that saves itself with ``_save_to`` and loads with ``_load_from``;
    listed before MLWritable/MLReadable among the stage's bases."""

    def write(self) -> Any:
        return writer_class()(self)

    @classmethod
    def read(cls) -> Any:
        return reader_class()(cls)
