"""Getting a trained model to Spark tasks once per job, and keeping it loaded per Python worker.

Scoring a DataFrame (``sparkgrad.spark.Model.transform``), predicting over
TFRecords and the MLflow flavor's ``spark_udf`` all run a function in every
task that needs the same model. ``ShippedModel`` is that model in transit:

- on classic Spark, the saved-model bytes (sparkgrad.nn.saved) travel as one
  broadcast variable: each executor fetches them once, however many tasks run;
- over Spark Connect (no broadcasts), the bytes ride in the function's closure
  up to ``inline_limit`` bytes; above it they are written once to
  ``shared_dir`` (a path every executor reads: a Volume, /dbfs, a shared
  mount) and each worker reads the file.

``load()`` runs in the task: it returns the model from a per-process cache
keyed by the bytes' SHA-256, so a Python worker reused across tasks (Spark's
default) builds it once. What this module does not do: convert columns or
score (the callers do).
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections import OrderedDict
from typing import Any

from sparkgrad.errors import InvalidArgumentError, ModelError

DEFAULT_INLINE_LIMIT = 64 << 20  # closure bytes over Spark Connect; above it, shared_dir
CACHE_SIZE = 4  # models kept per Python worker (a Pipeline may hold several)

_cache: OrderedDict[str, Any] = OrderedDict()
_cache_lock = threading.Lock()


def _session_kind(session: Any) -> str:
    from sparkgrad.cluster.spark import is_connect_session

    if is_connect_session(session):
        return "connect"
    if hasattr(session, "sparkContext") or hasattr(session, "parallelize"):
        return "classic"
    raise InvalidArgumentError(f"expected a SparkSession or SparkContext, got {type(session).__name__}")


class ShippedModel:
    """A trained model on its way to the tasks of one job; pickle it into a Spark closure and call `load` in the task.

    On classic Spark the saved-model bytes travel as one broadcast variable (each executor fetches them
    once, however many tasks run). Over Spark Connect, which has no broadcasts, they ride in the
    function's closure up to ``inline_limit`` bytes; above it they are written once to ``shared_dir``
    and each worker reads the file.

    ```python
    shipped = ShippedModel(spark, model)
    def score(batches):
        m = shipped.load()  # built once per Python worker
        ...
    ```

    Args:
        session: A SparkSession (classic or Connect) or a SparkContext.
        model: A `sparkgrad.nn.Sequential` or its saved-model bytes.
        inline_limit: Largest model, in bytes, carried in a Spark Connect closure (default 64 MiB).
        shared_dir: A directory every executor can read (a Volume, ``/dbfs``, a shared mount), for
            larger models over Spark Connect.

    Raises:
        InvalidArgumentError: ``session`` is not a Spark session, or a Spark Connect model is over
            ``inline_limit`` and no ``shared_dir`` was given.
    """

    def __init__(
        self,
        session: Any,
        model: Any,
        *,
        inline_limit: int = DEFAULT_INLINE_LIMIT,
        shared_dir: str | None = None,
    ) -> None:
        from sparkgrad.nn.saved import model_to_bytes

        data = model if isinstance(model, (bytes, bytearray)) else model_to_bytes(model)
        self.digest = hashlib.sha256(data).hexdigest()
        """SHA-256 of the saved-model bytes (hex): the key of the per-worker cache."""
        self.size = len(data)
        """Size of the saved-model bytes."""
        self._inline: bytes | None = None
        self._broadcast: Any = None
        self._path: str | None = None
        kind = _session_kind(session)
        if kind == "classic":
            sc = session.sparkContext if hasattr(session, "sparkContext") else session
            self._broadcast = sc.broadcast(bytes(data))
        elif len(data) <= inline_limit:
            self._inline = bytes(data)
        elif shared_dir is None:
            raise InvalidArgumentError(
                f"the model is {len(data)} bytes, over the {inline_limit}-byte limit for a Spark Connect "
                "closure: pass shared_dir= (a directory every executor can read, e.g. a Volume)"
            )
        else:
            from sparkgrad.nn.checkpoint import write_atomic

            os.makedirs(shared_dir, exist_ok=True)
            self._path = os.path.join(shared_dir, f"model-{self.digest[:16]}-{uuid.uuid4().hex[:8]}.sgmodel")
            write_atomic(self._path, bytes(data))

    def _bytes(self) -> bytes:
        if self._broadcast is not None:
            return self._broadcast.value
        if self._inline is not None:
            return self._inline
        try:
            with open(self._path, "rb") as f:  # type: ignore[arg-type]
                return f.read()
        except OSError as e:
            raise ModelError(f"{self._path}: cannot read the shipped model on this executor: {e}") from None

    def load(self) -> Any:
        """The model, in a task: built once per Python worker and cached.

        Spark reuses Python workers across tasks; the model stays in a small per-process cache keyed by
        `digest`. Each call also gives the C core the task's share of the cores (`configure_task_threads`)
        for the calls this thread makes next.

        Raises:
            ModelError: The bytes read back differ from those sent, or the shared file cannot be read.
        """
        from sparkgrad._threads import configure_task_threads

        configure_task_threads()
        with _cache_lock:
            model = _cache.get(self.digest)
            if model is not None:
                _cache.move_to_end(self.digest)
                return model
        from sparkgrad.nn.saved import model_from_bytes

        data = self._bytes()
        if hashlib.sha256(data).hexdigest() != self.digest:
            raise ModelError(f"shipped model {self.digest[:16]}: the bytes read back differ from those sent")
        model = model_from_bytes(data, self._path or f"shipped model {self.digest[:16]}")
        with _cache_lock:
            _cache[self.digest] = model
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
        return model

    def release(self) -> None:
        """Drops the broadcast or the shared file once the job that used it is done (on the driver)."""
        if self._broadcast is not None:
            self._broadcast.destroy()
            self._broadcast = None
        if self._path is not None:
            try:
                os.unlink(self._path)
            except OSError:
                pass


def cached_models() -> int:
    """How many models this process holds (tests and diagnostics)."""
    with _cache_lock:
        return len(_cache)
