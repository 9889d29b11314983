"""The fit loop of sparkgrad.nn.Sequential.

In-memory arrays: each epoch draws a permutation from the model's RNG, then
calls the C loop (``_core.Model.train_steps``, GIL released) for up to
``log_every`` steps at a time; between calls Python updates the progress bar
(tqdm, ``verbose=1``; one line per epoch with ``verbose=2``; silent with 0),
records step metrics, runs callbacks and writes checkpoints.
Iterables of dict batches: one C call per batch; a background thread
(``prefetch`` batches ahead, 0: none) pulls the next batches from the iterable
and converts them to the C layout while the C step runs with the GIL released,
the overlap TFRecordDataset's C reader gives. Like Keras' prefetching, it may
take up to ``prefetch`` batches beyond the last step from a one-shot iterator
when training stops at ``max_steps``.

Both paths go through one step function (``Trainer._steps``, which calls
``Sequential.run_steps``, the one caller of the C loop); the loop's state
(step, epoch, position in the epoch, the epoch's shuffle RNG) is the model's
TrainState (``model.state``), which checkpoints write and read whole.

Distribution: ``fit(ps=client)`` (a ParameterClient, e.g.
``TFNode.ps_client(ctx, model)``) hands every step to the parameter servers
inside the C loop (the ps applies the update; the model's step is the
global step); the chief (worker rank 0) initialises the servers from the
model (or from the checkpoint it resumed) and, at the end, waits for the
other workers and takes the final parameters; only the chief writes
checkpoints. A model compiled with a DistributedOptimizer reduces the
gradients across ranks in the C loop instead; rank 0 of its communicator
(hvd.rank(), which is sparkgrad.cluster.rank's) writes the checkpoints and
the other ranks never do.

At an epoch's end the callbacks run first, in order, then fit records the
epoch in History, reports it and checkpoints (``monitor``): what a callback
wrote into ``logs`` (MetricAverageCallback's averages) is what History and
``save_best_only`` see, as in Keras.

Callbacks (Keras' names): objects with any of ``set_model(model)``,
``on_train_begin(logs)``, ``on_epoch_begin(epoch, logs)``,
``on_step_end(step, logs)``, ``on_epoch_end(epoch, logs)``,
``on_train_end(logs)``, or plain callables called as ``fn(step, logs)`` at
each log interval. Setting ``model.stop_training = True`` stops after the
current interval.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np

from sparkgrad.cluster import rank as _rank
from sparkgrad.errors import InvalidArgumentError, NonFiniteLossError, SparkgradTimeout
from sparkgrad.nn import batches as _batches
from sparkgrad.nn.callbacks import TerminateOnNaN
from sparkgrad.nn.checkpoint import CheckpointManager, encode, restore_bytes
from sparkgrad.nn.distributed import DistributedOptimizer
from sparkgrad.nn.history import History


class _Totals:
    """Sums over steps: the weighted loss, rows, steps and the metrics' state (which add up)."""

    __slots__ = ("model", "loss_sum", "seen", "steps", "state")

    def __init__(self, model) -> None:
        self.model = model
        self.loss_sum, self.seen, self.steps = 0.0, 0, 0
        self.state = model.new_metric_state()

    def add(self, r: tuple[float, int, int], state: np.ndarray) -> None:
        self.loss_sum += r[0]
        self.seen += r[1]
        self.steps += r[2]
        self.state += state

    def sums(self) -> tuple[float, int, np.ndarray]:
        """``(loss_sum, seen, metric state)``: what adds up across ranks (see ``Sequential.epoch_sums``)."""
        return self.loss_sum, self.seen, self.state.copy()

    def logs(self) -> dict[str, float]:
        if self.seen == 0:  # NaN: the interval's first batch had a non-finite loss
            return {"loss": math.nan} if math.isnan(self.loss_sum) else {}
        return {"loss": self.loss_sum / self.seen, **self.model.metric_values(self.state, self.seen)}


_END = object()  # the producer's last item when the iterable is exhausted


class _Prefetcher:
    """Pulls batches from an iterator on a daemon thread, ``depth`` ahead, each
    converted by ``convert``; the consumer iterates over the converted batches.
    Exceptions from the iterator or the conversion are re-raised in the
    consumer, in order. ``close`` stops the thread (it is also called at the
    end of iteration)."""

    def __init__(self, it: Iterator, convert, depth: int, timeout: float) -> None:
        self._it, self._convert, self._timeout = it, convert, timeout
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="sparkgrad-fit-prefetch", daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        while not self._stop.is_set():
            try:
                item = (self._convert(next(self._it)), None)
            except StopIteration:
                item = (_END, None)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                item = (None, exc)
            self._q.put(item)  # unblocked by close(), which drains the queue
            if item[0] is _END or item[1] is not None:
                return

    def __iter__(self):
        try:
            while True:
                try:
                    value, exc = self._q.get(timeout=self._timeout)
                except queue.Empty:
                    raise SparkgradTimeout(
                        f"fit: waited {self._timeout:g} s for the next batch from the dataset iterator"
                    ) from None
                if exc is not None:
                    raise exc
                if value is _END:
                    return
                yield value
        finally:
            self.close()

    def close(self) -> None:
        """Stops the producer: after the drain below its pending put (at most one)
        finds room, and it sees the stop flag before pulling another batch. A
        producer still inside the user's next() exits when that returns."""
        self._stop.set()
        try:
            while True:
                self._q.get_nowait()
        except queue.Empty:
            pass
        self._thread.join(timeout=1.0)


@dataclass(frozen=True)
class FitOptions:
    """fit's ``**options`` (documented on `sparkgrad.nn.Model.fit`), checked by name.

    checkpoint_dir: write ``ckpt-<step>.sgck`` there at each epoch end (and every ``checkpoint_every``
    steps), keeping the last ``keep_last``; resume from the newest when ``resume``. save_best_only: also
    keep ``best.sgck`` for the best ``monitor``. sync_dir: copy each finished checkpoint there, whole files,
    at most every ``sync_every_secs`` and at the end. plot_path: a PNG of the loss/accuracy curves.
    tensorboard_dir: scalars through sparkgrad.summary.EventWriter. prefetch: batches of an iterable
    prepared ahead (0: none), waiting at most ``prefetch_timeout`` seconds for each. mlflow: log to MLflow
    from the chief (None: when mlflow is imported and a run is active; see sparkgrad.nn.tracking).
    """

    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    keep_last: int = 3
    save_best_only: bool = False
    monitor: str = "val_loss"
    sync_dir: str | None = None
    sync_every_secs: float = 60.0
    plot_path: str | None = None
    tensorboard_dir: str | None = None
    resume: bool = True
    prefetch: int = 2
    prefetch_timeout: float = 600.0
    mlflow: bool | None = None

    @classmethod
    def of(cls, options: dict) -> FitOptions:
        """The options of ``fit(**options)``.

        Raises:
            InvalidArgumentError: An unknown option, naming the ones fit takes.
        """
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise InvalidArgumentError(
                f"fit: unknown option{'s' if len(unknown) > 1 else ''} {unknown}; fit takes {known}"
            )
        return cls(**options)


class Trainer:
    """Runs Model.fit: the loop over epochs and log intervals, callbacks, checkpoints, distribution."""

    def __init__(
        self,
        model,
        verbose: int = 1,
        log_every: int = 50,
        callbacks: Sequence[object] = (),
        options: FitOptions = FitOptions(),
    ) -> None:
        o = options
        checkpoint_dir, checkpoint_every, keep_last = o.checkpoint_dir, o.checkpoint_every, o.keep_last
        save_best_only, monitor, sync_dir, sync_every_secs = o.save_best_only, o.monitor, o.sync_dir, o.sync_every_secs
        plot_path, tensorboard_dir, resume, mlflow = o.plot_path, o.tensorboard_dir, o.resume, o.mlflow
        prefetch, prefetch_timeout = o.prefetch, o.prefetch_timeout
        if log_every <= 0:
            raise InvalidArgumentError(f"log_every must be > 0, not {log_every}")
        if prefetch < 0 or not prefetch_timeout > 0:
            raise InvalidArgumentError(
                f"prefetch must be >= 0 and prefetch_timeout > 0 (got {prefetch}, {prefetch_timeout})"
            )
        self.prefetch = int(prefetch)
        self.prefetch_timeout = float(prefetch_timeout)
        from sparkgrad._threads import configure_task_threads

        configure_task_threads()  # on an executor: OMP_NUM_THREADS, else spark.task.cpus
        self.model = model
        self.verbose = int(verbose)
        self.log_every = int(log_every)
        self.callbacks = list(callbacks)
        self.plot_path = plot_path
        self.checkpoints = None
        if checkpoint_dir is not None:
            self.checkpoints = CheckpointManager(
                checkpoint_dir,
                keep_last=keep_last,
                save_best_only=save_best_only,
                monitor=monitor,
                sync_dir=sync_dir,
                sync_every_secs=sync_every_secs,
            )
        elif sync_dir is not None or save_best_only:
            raise InvalidArgumentError("sync_dir and save_best_only need checkpoint_dir")
        self.checkpoint_every = checkpoint_every
        self.resume = resume
        self.writer = None
        if tensorboard_dir is not None:
            try:
                from sparkgrad.summary import EventWriter  # type: ignore[import-not-found]
            except ImportError as exc:
                raise InvalidArgumentError(f"tensorboard_dir needs sparkgrad.summary.EventWriter: {exc}") from exc
            self.writer = EventWriter(tensorboard_dir)
        self.bar = None
        from sparkgrad.nn.tracking import mlflow_callback

        self.tracker = mlflow_callback(model, mlflow)
        if self.tracker is not None:
            self.callbacks.append(self.tracker)
            if self.checkpoints is not None:
                self.checkpoints.listeners.append(self.tracker.on_checkpoint)

    # ---- reporting ----------------------------------------------------------

    def _open_bar(self, total: int | None, initial: int) -> None:
        if self.verbose != 1:
            return
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, leave=True)

    def _step_logs(self, history, interval: _Totals) -> None:
        m = self.model
        logs = interval.logs()
        logs["lr"] = float(m.optimizer.learning_rate)
        history.steps.append({"step": m.step, **logs})
        if self.bar is not None:
            self.bar.update(interval.steps)
            shown = {k: f"{v:.4f}" for k, v in logs.items() if k != "lr"}
            self.bar.set_postfix(shown, refresh=False)
        if self.writer is not None:
            for k, v in logs.items():
                self.writer.scalar(f"train/{k}", v, m.step)
        for cb in self.callbacks:
            if hasattr(cb, "on_step_end"):
                cb.on_step_end(m.step, logs)
            elif callable(cb):
                cb(m.step, logs)

    def _epoch_end(self, history, epoch: int, logs: dict[str, float], started: float) -> None:
        m = self.model
        # as Keras: the callbacks first, in order (one may change logs, e.g. hvd's
        # MetricAverageCallback), then History, the report and the checkpoint's monitor
        self._callbacks("on_epoch_end", epoch, logs)
        history.add_epoch(epoch, logs)
        if self.verbose == 2 or (self.verbose == 1 and self.bar is None):
            parts = " ".join(f"{k} {v:.4f}" for k, v in logs.items())
            print(f"epoch {epoch + 1}: {parts} ({time.monotonic() - started:.1f} s)", flush=True)
        elif self.bar is not None:
            self.bar.write(f"epoch {epoch + 1}: " + " ".join(f"{k} {v:.4f}" for k, v in logs.items()))
        if self.writer is not None:
            for k, v in logs.items():
                self.writer.scalar(f"epoch/{k}", v, m.step)
        self._save(logs)

    def _callbacks(self, method: str, *args: object) -> None:
        for cb in self.callbacks:
            fn = getattr(cb, method, None)
            if fn is not None:
                fn(*args)

    # ---- the loop -----------------------------------------------------------

    def _steps(self, x, y, weights, order, pos, batch_size, k, state) -> tuple[float, int, int]:
        """The one step function of both paths: k steps in C from row pos; the metrics add to state.

        A non-finite loss raises NonFiniteLossError, unless a TerminateOnNaN callback (without
        raise_error) asks to stop: the good steps before it count, the interval's loss is NaN, and the
        callback stops training at the interval's end."""
        try:
            return self.model.run_steps(
                x, y, order, pos, batch_size, k, hook=self.dist.hook, weights=weights, metrics=state
            )
        except NonFiniteLossError as e:
            stop = any(isinstance(cb, TerminateOnNaN) and not cb.raise_error for cb in self.callbacks)
            if not stop or getattr(e, "step", None) is None:
                raise
            print(f"fit: {e}", flush=True)
            return float("nan"), int(e.seen), int(e.steps)

    def _validate(self, validation_data, batch_size: int) -> _Totals:
        """The loss and metric sums of ``validation_data`` ((x, y) or (x, y, sample_weight)), as evaluate."""
        if not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3):
            raise InvalidArgumentError("fit: validation_data must be (x, y) or (x, y, sample_weight)")
        vw = validation_data[2] if len(validation_data) == 3 else None
        state = self.model.new_metric_state()
        r = self.model._evaluate_arrays(validation_data[0], validation_data[1], batch_size, state, vw)
        totals = _Totals(self.model)
        totals.add(r, state)
        return totals

    def _epoch_order(self, n: int, shuffle: bool, resuming: bool):
        """This epoch's row order. A new epoch records the RNG it starts from
        (state.epoch_rng); a resumed one redraws its permutation from there and
        leaves the RNG where the checkpoint left it."""
        m = self.model
        if not resuming:
            m.state.epoch_rng = m.rng
            return m.permutation(n) if shuffle else None
        if m.state.epoch_rng is None:
            m.state.epoch_rng = m.rng
        if not shuffle:
            return None
        now = m.rng
        m.rng = m.state.epoch_rng
        order = m.permutation(n)
        m.rng = now
        return order

    def _save(self, logs) -> None:
        if self.checkpoints is not None and self.dist.chief:
            self.dist.before_checkpoint()
            self.checkpoints.save(self.model, logs)

    def run(
        self,
        x,
        y,
        batch_size,
        epochs,
        validation_data,
        max_steps,
        shuffle,
        x_key,
        y_key,
        initial_epoch,
        ps=None,
        sample_weight=None,
        class_weight=None,
    ):
        m = self.model
        if batch_size <= 0 or epochs < 0:
            raise InvalidArgumentError(f"batch_size must be > 0 and epochs >= 0 (got {batch_size}, {epochs})")
        if max_steps is not None and max_steps < 0:
            raise InvalidArgumentError(f"max_steps must be >= 0, not {max_steps}")
        self.dist = _Distribution(m, ps, checkpoints=self.checkpoints is not None)
        restored = None
        if self.checkpoints is not None and self.resume:
            restored = self.checkpoints.restore_latest(m)
        restored = self.dist.share_resume(restored)
        if restored is not None and self.verbose:
            print(f"resumed from {restored} at step {m.step}", flush=True)
        resume_pos = m.state.epoch_pos if restored is not None else 0
        if initial_epoch is not None:
            m.epoch = int(initial_epoch)
        elif restored is None:
            m.epoch = 0  # as Keras: each call trains `epochs` epochs unless it resumes a checkpoint
        arrays = y is not None or isinstance(x, (np.ndarray, Mapping))
        if arrays:
            xa, ya, weights = m.engine_arrays(x, y, sample_weight, class_weight)
            n = (xa[0] if isinstance(xa, list) else xa).shape[0]
            if n == 0:
                raise InvalidArgumentError("fit: x has no rows")
        elif not isinstance(x, Iterable):
            raise InvalidArgumentError("fit: x must be an array (with y) or an iterable of dict batches")
        elif sample_weight is not None:
            raise InvalidArgumentError(
                "fit: sample_weight= goes with array inputs; dataset batches carry theirs as a 'sample_weight' "
                "key or a third tuple element"
            )
        history = History()
        m.stop_training = False
        self.dist.begin(restored is not None)
        if arrays:
            per_epoch = math.ceil(n / batch_size)
            total = max(0, epochs - m.epoch) * per_epoch - math.ceil(resume_pos / batch_size)
            if max_steps is not None:
                total = min(total, max(0, max_steps - m.step))
        else:
            total = max_steps - m.step if max_steps is not None else None
        if self.tracker is not None:
            opts = dict(batch_size=batch_size, epochs=epochs, max_steps=max_steps, log_every=self.log_every)
            self.tracker.start(opts)
        self._callbacks("set_model", m)
        self._callbacks("on_train_begin", {})
        self._open_bar(total, 0)
        finished = False
        try:
            for epoch in range(m.epoch, epochs):
                if m.stop_training or (max_steps is not None and m.step >= max_steps):
                    break
                started = time.monotonic()
                self._callbacks("on_epoch_begin", epoch, {})
                totals = _Totals(m)
                if arrays:
                    order = self._epoch_order(n, shuffle, resume_pos > 0)
                    pos, resume_pos = resume_pos, 0
                    while pos < n and not m.stop_training:
                        k = min(self.log_every, math.ceil((n - pos) / batch_size))
                        if self.checkpoint_every:
                            k = min(k, self.checkpoint_every - m.step % self.checkpoint_every)
                        if max_steps is not None:
                            k = min(k, max_steps - m.step)
                        if k <= 0:
                            break
                        state = m.new_metric_state()
                        r = self._steps(xa, ya, weights, order, pos, batch_size, k, state)
                        pos += r[1]
                        m.state.epoch_pos = pos
                        interval = _Totals(m)
                        interval.add(r, state)
                        totals.add(r, state)
                        self._step_logs(history, interval)
                        if self.checkpoint_every and m.step % self.checkpoint_every == 0 and pos < n:
                            self._save(None)
                    if pos < n:  # stopped early: an incomplete epoch is not counted
                        break
                else:
                    interval = _Totals(m)

                    def convert(batch):
                        xb, yb, wb = _batches.batch_parts(batch, x_key, y_key)
                        return m.engine_arrays(xb, yb, wb, class_weight)

                    prefetcher = None
                    if self.prefetch:
                        prefetcher = _Prefetcher(iter(x), convert, self.prefetch, self.prefetch_timeout)
                    try:
                        for xb, yb, wb in prefetcher if prefetcher is not None else map(convert, x):
                            state = m.new_metric_state()
                            rows = (xb[0] if isinstance(xb, list) else xb).shape[0]  # one input may be a StringColumn
                            r = self._steps(xb, yb, wb, None, 0, max(rows, 1), 1, state)
                            interval.add(r, state)
                            totals.add(r, state)
                            if interval.steps >= self.log_every or math.isnan(r[0]):
                                self._step_logs(history, interval)
                                interval = _Totals(m)
                            if self.checkpoint_every and m.step % self.checkpoint_every == 0:
                                self._save(None)
                            if m.stop_training or (max_steps is not None and m.step >= max_steps):
                                break
                    finally:
                        if prefetcher is not None:
                            prefetcher.close()
                    if interval.steps:
                        self._step_logs(history, interval)
                    if totals.seen == 0:
                        break  # a one-shot iterator is exhausted
                logs = totals.logs()
                sums = {"": totals.sums()}
                self.dist.average_buffers()  # what validation, callbacks and checkpoints read
                if validation_data is not None:
                    val = self._validate(validation_data, batch_size)
                    logs.update({f"val_{k}": v for k, v in val.logs().items()})
                    sums["val_"] = val.sums()
                m.epoch_sums = sums
                m.epoch = epoch + 1
                m.state.epoch_pos = 0
                self._epoch_end(history, epoch, logs, started)
                self.dist.own_buffers()
            finished = True
        finally:
            if self.bar is not None:
                self.bar.close()
            try:
                if self.dist.end(finished):
                    self._save(None)  # the final parameters, after every worker's updates
            finally:
                if self.checkpoints is not None:
                    self.checkpoints.finish()
                if self.writer is not None and hasattr(self.writer, "close"):
                    self.writer.close()
        self._callbacks("on_train_end", history.history)
        if self.plot_path is not None:
            plot_history(history, self.plot_path)
        return history


class _Distribution:
    """Where fit's gradients go: nowhere (local training), to parameter servers
    (``ps``: a ParameterClient) or to an allreduce (a DistributedOptimizer).
    ``hook``: the capsule for the C loop; ``chief``: whether this process
    writes checkpoints."""

    def __init__(self, model, ps, checkpoints: bool = False) -> None:
        self.model, self.ps, self.hook = model, ps, None
        self.checkpoints = checkpoints  # fit writes checkpoints (on the chief)
        self.servers_done = False  # the ps client said done: the servers' state is no longer there to read
        self.sparse_rows = False  # the hook moves Embedding rows: the local tables are stale elsewhere
        self._own = None  # the ps chief's own non-trainable state while it holds the workers' mean
        distributed = isinstance(model.optimizer, DistributedOptimizer)
        if ps is not None and distributed:
            raise InvalidArgumentError(
                "fit: ps= and a DistributedOptimizer both distribute the gradients; use one (ps: the parameter "
                "servers apply the update; DistributedOptimizer: allreduce, each rank applies it)"
            )
        if ps is not None:
            for name in ("worker_id", "grad_hook", "init", "set_state", "pull", "done", "wait_for_workers"):
                if not hasattr(ps, name):
                    raise InvalidArgumentError(
                        f"fit: ps= must be a parameter-server client (TFNode.ps_client(ctx, model)), "
                        f"not {type(ps).__name__}"
                    )
            if model.buffers.size and not (hasattr(ps, "put_state") and hasattr(ps, "mean_state")):
                raise InvalidArgumentError(
                    f"fit: the model has non-trainable state (BatchNormalization's moving statistics) that the ps "
                    f"averages across workers; {type(ps).__name__} has no put_state/mean_state"
                )
            if int(getattr(ps, "total", model.num_params)) != model.num_params:
                raise InvalidArgumentError(
                    f"fit: the ps client is for {ps.total} parameters, the model has {model.num_params}"
                )
            self.chief = ps.worker_id == 0
        elif distributed:
            # rank 0 of the allreduce writes the checkpoints: the communicator's rank, which is
            # sparkgrad.cluster.rank's under sparkgrad.run, HorovodRunner and TFCluster(num_ps=0)
            rank = getattr(model.optimizer.resolve_communicator(), "rank", None)
            self.chief = _rank.is_chief() if rank is None else rank == 0  # a wrapper without .rank: the process's
        else:
            self.chief = True

    def begin(self, restored: bool) -> None:
        m = self.model
        if self.ps is not None:
            if self.chief:
                if restored or m.step > 0:  # a resumed chief's state overrides what the servers hold
                    self.ps.set_state(m.params, m.step, self._servers_optimizer_state())
                else:
                    self.ps.init(m.params)
            m.step = self.ps.pull(m.params)  # waits until the chief initialised every shard
            self.hook = self.ps.grad_hook()
            self.sparse_rows = bool(getattr(self.ps, "sparse_rows", False))
        elif isinstance(m.optimizer, DistributedOptimizer):
            self.hook = m.optimizer.grad_hook()

    def share_resume(self, restored: str | None) -> str | None:
        """Allreduce: when any rank resumed a checkpoint, every rank takes rank 0's resumed state
        (parameters, optimizer state, step, epoch, position, RNG), so ranks whose checkpoint_dir
        was not rank 0's (or was None) resume in step with it. Returns the checkpoint resumed."""
        if self.ps is not None or not isinstance(self.model.optimizer, DistributedOptimizer):
            return restored
        comm = self.model.optimizer.resolve_communicator()
        if int(getattr(comm, "size", 1)) <= 1 or not hasattr(comm, "broadcast_bytes"):
            return restored
        flag = comm.allreduce(np.array([1.0 if restored is not None else 0.0], np.float32), op="max")
        if float(flag[0]) == 0.0:
            return restored
        if comm.rank == 0:
            name = (restored or "").encode()
            payload = len(name).to_bytes(4, "little") + name + encode(self.model)
            comm.broadcast_bytes(payload, root=0)
            return restored
        payload = comm.broadcast_bytes(None, root=0)
        n = int.from_bytes(payload[:4], "little")
        name = payload[4 : 4 + n].decode()
        restore_bytes(self.model, payload[4 + n :], f"rank 0's resumed state ({name or 'none'})")
        return name or None

    def _servers_optimizer_state(self):
        """The model's optimizer state (restored from the checkpoint) split into the ps shards' (None: none)."""
        split = getattr(self.ps, "shard_optimizer_state", None)
        opt = self.model.optimizer
        if split is None or opt is None:
            return None
        steps, state = opt.get_state()
        return split(steps, state)

    def refresh(self) -> None:
        """Under a ps that moves Embedding rows, a worker's tables are current only in the rows its
        forwards pulled: the whole buffer comes from the servers before anything reads it (validation,
        callbacks at an epoch's end, a checkpoint, the final model)."""
        if self.ps is not None and self.sparse_rows and not self.servers_done:
            self.ps.pull(self.model.params)

    def before_checkpoint(self) -> None:
        """Under a ps the optimizer runs on the servers: the chief's checkpoint takes their state
        (Adam's moments...) into the model's optimizer, so a resumed run continues it."""
        self.refresh()
        fetch = getattr(self.ps, "optimizer_state", None)
        opt = self.model.optimizer
        if fetch is None or opt is None or self.servers_done:
            return
        got = fetch()
        if got is None:
            return
        steps, state = got
        opt.bind(self.model.num_params)
        if opt.get_state()[1].size == state.size:  # the servers run the model's optimizer kind
            opt.set_state(steps, state)

    def average_buffers(self) -> None:
        """The model's non-trainable state (BatchNormalization's moving statistics, which each worker
        updates from its own batches) averaged across the workers, as Keras' MirroredStrategy reads its
        SyncOnRead variables: under allreduce every rank takes the average (a collective, at the same
        epoch end on every rank; the moving averages are linear, so averaging at every epoch's end gives
        at the end what one average of the ranks' own would); under a ps each worker puts its state on
        shard 0 and the chief reads the mean of the workers' latest, for what reads it until
        `own_buffers` (its own go on training, as each replica's do under MirroredStrategy: the
        workers do not step in time). Nothing without state or distribution. First, under a ps that
        moves Embedding rows, the whole parameter buffer comes from the servers (`refresh`)."""
        m = self.model
        self.refresh()
        buffers = m.buffers
        if buffers.size == 0:
            return
        if self.ps is not None:
            if not self.servers_done:
                self.ps.put_state(buffers)
                if self.chief:
                    self._own = buffers.copy()
                    self.ps.mean_state(buffers)
        elif isinstance(m.optimizer, DistributedOptimizer):
            comm = m.optimizer.resolve_communicator()
            if int(getattr(comm, "size", 1)) > 1:
                comm.allreduce(buffers, op="average")

    def own_buffers(self) -> None:
        """After the epoch's end read the ps mean (validation, callbacks, checkpoints), the chief trains on
        with its own statistics again."""
        own, self._own = self._own, None
        if own is not None:
            self.model.buffers[:] = own

    def end(self, finished: bool) -> bool:
        """Ends the distributed run; True when the chief then holds final
        parameters worth a last checkpoint (the ps' after every worker's updates)."""
        self.hook = None
        if self.ps is None or not finished:
            return False  # under allreduce every epoch's end averaged the buffers already
        m = self.model
        if m.buffers.size:
            self.ps.put_state(m.buffers)  # before done: shard 0 holds it when the chief's wait ends
        if self.chief:
            m.step = self.ps.wait_for_workers(m.params)
            if m.buffers.size:
                self.ps.mean_state(m.buffers)  # every worker's last state
            if self.checkpoints:
                self.before_checkpoint()  # for the last checkpoint: the servers may end once the chief said done
        else:
            self.refresh()  # the servers' parameters as they are now, not the rows this worker last read
        self.ps.done()
        self.servers_done = True
        return self.chief


def plot_history(history, path: str) -> None:
    """Writes a PNG of the loss and each metric per step (and per epoch, with validation)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise InvalidArgumentError(f"plot_path needs matplotlib (pip install matplotlib): {exc}") from exc
    keys = ["loss", *(k for k in (history.steps[0] if history.steps else {}) if k not in ("step", "loss", "lr"))]
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
    axes = axes[0]
    steps = [s["step"] for s in history.steps]
    for ax, key in zip(axes, keys, strict=True):
        ax.plot(steps, [s[key] for s in history.steps], label=f"train {key} (per interval)", alpha=0.6)
        if f"val_{key}" in history.history:
            ends = _epoch_end_steps(history)
            ax.plot(ends, history.history[f"val_{key}"], "o-", label=f"val {key}")
        ax.set_xlabel("step")
        ax.set_title(key)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _epoch_end_steps(history) -> list[int]:
    n = len(history.epoch)
    if not history.steps:
        return list(range(n))
    last = history.steps[-1]["step"]
    return [round(last * (i + 1) / n) for i in range(n)]
