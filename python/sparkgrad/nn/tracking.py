"""MLflow tracking of Sequential.fit: the ``mlflow`` fit option.

``mlflow=None`` (the default) logs when the process already imported mlflow
and has an active run (``mlflow.start_run()`` in a notebook cell, Databricks'
notebook runs); nothing here imports mlflow otherwise. ``mlflow=True`` imports
it, and starts a run when none is active (ending it when fit ends; a run that
was active before fit is left active). ``mlflow=False`` never logs.

Only the chief logs (``sparkgrad.cluster.rank.is_chief()``): on every other
training process, parameter server or evaluator the option does nothing and
mlflow is not imported.

What is logged, all through ``MlflowClient`` on the run's id:

- params: the model (name, layer count, parameter count, input shape, loss),
  the optimizer (``optimizer`` kind and ``optimizer.<key>`` for its
  configuration, learning rate included), ``batch_size``, ``epochs``,
  ``max_steps``, ``log_every`` and the cluster shape (``cluster.size``,
  ``cluster.rank``, ``cluster.role`` from sparkgrad.cluster.rank and
  ``cluster.num_ps`` on a node with a TF_CONFIG, i.e. a TFCluster node);
  MLflow params cannot change within a run, so a second fit in the same run
  keeps the first values (with a warning for each that differs);
- ``model/summary.txt``: ``model.summary()``;
- metrics ``loss``, each compiled metric (``accuracy``, ``auc``...) and
  ``lr`` at each log interval, and ``epoch``, ``epoch_loss``,
  ``epoch_<metric>``, ``val_loss``, ``val_<metric>`` at each epoch end, all with ``step=model.step`` (queued
  on MLflow's logging thread where it has one, MLflow >= 2.8; fit waits for
  them before it returns);
- each checkpoint file as the CheckpointManager writes it, under ``checkpoints/``;
- the final model (``model.save``) as ``model/<model name>.sgck`` (characters
  other than letters, digits, ``.``, ``_`` and ``-`` as ``_``).

For a driver that trains through TFCluster with its own loop (no fit on the
nodes), ``log_cluster_metrics(cluster.metrics)`` logs what the nodes streamed
with ``ctx.metric`` to the driver's run, and ``mlflow_configured()`` says
whether there is a tracking store to log to, without importing mlflow.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable

from sparkgrad.errors import InvalidArgumentError

INSTALL_HINT = "pip install mlflow-skinny (or mlflow)"
_BATCH = 1000  # MLflow's limit of metrics in one log_batch request


def mlflow_callback(model, option: bool | None) -> MlflowCallback | None:
    """The callback that fit runs for ``mlflow=option``, or None when nothing is to be logged here."""
    if option is not None and not isinstance(option, bool):
        raise InvalidArgumentError(f"mlflow must be True, False or None, not {option!r}")
    if option is False:
        return None
    from sparkgrad.cluster import rank

    if not rank.is_chief():
        return None
    if option is None:
        mlflow = sys.modules.get("mlflow")
        active_run = getattr(mlflow, "active_run", None)
        if active_run is None or active_run() is None:
            return None
    else:
        try:
            import mlflow
            from mlflow.tracking import MlflowClient  # noqa: F401 - skinny and full both have it
        except ImportError as exc:
            raise InvalidArgumentError(
                f"fit(mlflow=True) needs MLflow, which cannot be imported ({exc}): {INSTALL_HINT}"
            ) from exc
    return MlflowCallback(mlflow, model)


def mlflow_configured() -> bool:
    """mlflow is installed and has somewhere to log: on Databricks (always), or where
    MLFLOW_TRACKING_URI is set or the process already set a tracking URI. Imports nothing."""
    if importlib.util.find_spec("mlflow") is None:
        return False
    if "DATABRICKS_RUNTIME_VERSION" in os.environ or os.environ.get("MLFLOW_TRACKING_URI"):
        return True
    utils = sys.modules.get("mlflow.tracking._tracking_service.utils")
    is_set = getattr(utils, "is_tracking_uri_set", None)  # mlflow.set_tracking_uri was called
    return bool(is_set is not None and is_set())


def log_cluster_metrics(metrics: Iterable, run_id: str | None = None) -> int:
    """Logs a driver's ``Cluster.metrics`` (each with role, index, name, value, step) to
    an MLflow run (default: the active one) as ``<role><index>/<name>`` at its step,
    e.g. ``worker0/loss``, in batches of 1000; returns how many it logged. Imports mlflow."""
    import mlflow
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    if run_id is None:
        active = mlflow.active_run()
        if active is None:
            raise InvalidArgumentError("log_cluster_metrics: no active MLflow run (mlflow.start_run() first)")
        run_id = active.info.run_id
    now = int(time.time() * 1000)
    batch = [Metric(f"{m.role}{m.index}/{m.name}", float(m.value), now, int(m.step)) for m in metrics]
    client = MlflowClient()
    for i in range(0, len(batch), _BATCH):
        client.log_batch(run_id, metrics=batch[i : i + _BATCH])
    return len(batch)


def _cluster_params() -> dict[str, object]:
    from sparkgrad.cluster import rank

    r = rank.current()
    params: dict[str, object] = {"cluster.size": r.size, "cluster.rank": r.rank, "cluster.role": r.role}
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    except ValueError:
        cluster = {}
    if isinstance(cluster, dict) and cluster:
        params["cluster.num_ps"] = len(cluster.get("ps", ()))
    return params


def _param_value(v: object) -> str:
    return str(list(v) if isinstance(v, tuple) else v)[:6000]  # MLflow's limit on a param value


class MlflowCallback:
    """A fit callback logging one training run to MLflow (see the module docstring)."""

    def __init__(self, mlflow, model) -> None:
        from mlflow.tracking import MlflowClient

        self._mlflow = mlflow
        self._client = MlflowClient()
        self.model = model
        self.run_id: str | None = None
        self._owned = False  # started by this callback, ended by it
        # MLflow >= 2.8 queues metric batches on a thread of its own: the training loop does not
        # wait for the tracking server at each log interval; fit waits for them all at its end.
        self._async = "synchronous" in inspect.signature(self._client.log_batch).parameters
        self._pending: list = []  # RunOperations of the queued batches

    # ---- the Trainer's calls --------------------------------------------------

    def start(self, params: dict[str, object]) -> None:
        """Starts (or joins) the run and logs the parameters and the model summary (fit calls it
        before the callbacks' on_train_begin, with fit's own settings)."""
        active = self._mlflow.active_run()
        if active is None:
            active = self._mlflow.start_run()
            self._owned = True
        self.run_id = active.info.run_id
        m = self.model
        values: dict[str, object] = {
            "model.name": m.name,
            "model.layers": len(m.layers),
            "model.params": m.num_params,
            "model.input_shape": m.input_shape,
            "model.loss": m.loss,
        }
        if m.optimizer is not None:
            values["optimizer"] = m.optimizer.kind
            values.update({f"optimizer.{k}": v for k, v in m.optimizer.config.items()})
        values.update(params)
        values.update(_cluster_params())
        self._log_params(values)
        self._client.log_text(self.run_id, m.summary(print_fn=None), "model/summary.txt")

    def on_step_end(self, step: int, logs: dict[str, float]) -> None:
        self._log_metrics(dict(logs), step)

    def on_epoch_end(self, epoch: int, logs: dict[str, float]) -> None:
        named = {"epoch": epoch + 1}
        named.update({k if k.startswith("val_") else f"epoch_{k}": v for k, v in logs.items()})
        self._log_metrics(named, self.model.step)

    def on_checkpoint(self, path: str) -> None:
        """The CheckpointManager wrote ``path``: logged under ``checkpoints/``."""
        self._client.log_artifact(self.run_id, path, "checkpoints")

    def on_train_end(self, logs) -> None:
        """Logs the final model, waits for the queued metrics and ends the run if this callback started it."""
        self._flush()
        with tempfile.TemporaryDirectory(prefix="sparkgrad-mlflow-") as tmp:
            path = os.path.join(tmp, re.sub(r"[^A-Za-z0-9._-]", "_", self.model.name) + ".sgck")
            self.model.save(path)
            self._client.log_artifact(self.run_id, path, "model")
        self._end("FINISHED")

    def on_train_failed(self) -> None:
        """fit raised: a run this callback started ends as FAILED (idempotent)."""
        try:
            self._flush()
        finally:
            self._end("FAILED")

    # ---- helpers --------------------------------------------------------------

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for operations in pending:
            operations.wait()

    def _end(self, status: str) -> None:
        if self._owned:
            self._owned = False
            active = self._mlflow.active_run()
            if active is not None and active.info.run_id == self.run_id:
                self._mlflow.end_run(status)
            else:
                self._client.set_terminated(self.run_id, status)

    def _log_params(self, values: dict[str, object]) -> None:
        from mlflow.entities import Param

        logged = self._client.get_run(self.run_id).data.params
        new = []
        for k, v in values.items():
            text = _param_value(v)
            if k not in logged:
                new.append(Param(k, text))
            elif logged[k] != text:
                warnings.warn(
                    f"MLflow run {self.run_id} already has param {k}={logged[k]!r}; "
                    f"this fit's {text!r} is not logged (params cannot change within a run)",
                    stacklevel=4,
                )
        for i in range(0, len(new), 100):  # MLflow's limit of params in one log_batch request
            self._client.log_batch(self.run_id, params=new[i : i + 100])

    def _log_metrics(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, int(step)) for k, v in values.items()]
        for i in range(0, len(batch), _BATCH):
            if not self._async:
                self._client.log_batch(self.run_id, metrics=batch[i : i + _BATCH])
                continue
            self._pending.append(self._client.log_batch(self.run_id, metrics=batch[i : i + _BATCH], synchronous=False))
            if len(self._pending) > 256:  # bounded: the oldest are done by now, or the queue is stuck
                self._flush()
