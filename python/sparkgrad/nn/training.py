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

Callbacks: objects with any of ``on_step_end(step, logs)``,
``on_epoch_end(epoch, logs)``, ``on_train_end(logs)``, or plain callables
called as ``fn(step, logs)`` at each log interval. Setting
``model.stop_training = True`` stops after the current interval.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from sparkgrad.errors import InvalidArgumentError, SparkgradTimeout


class _Totals:
    __slots__ = ("loss_sum", "correct", "seen", "steps")

    def __init__(self) -> None:
        self.loss_sum, self.correct, self.seen, self.steps = 0.0, 0, 0, 0

    def add(self, r: tuple[float, int, int, int]) -> None:
        self.loss_sum += r[0]
        self.correct += r[1]
        self.seen += r[2]
        self.steps += r[3]

    def logs(self) -> dict[str, float]:
        if self.seen == 0:
            return {}
        return {"loss": self.loss_sum / self.seen, "accuracy": self.correct / self.seen}


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


class Trainer:
    """Runs Sequential.fit; options are documented on ``__init__``."""

    def __init__(
        self,
        model,
        verbose: int = 1,
        log_every: int = 50,
        callbacks: Sequence[object] = (),
        checkpoint_dir: str | None = None,
        checkpoint_every: int | None = None,
        keep_last: int = 3,
        save_best_only: bool = False,
        monitor: str = "val_loss",
        sync_dir: str | None = None,
        sync_every_secs: float = 60.0,
        plot_path: str | None = None,
        tensorboard_dir: str | None = None,
        resume: bool = True,
        prefetch: int = 2,
        prefetch_timeout: float = 600.0,
        mlflow: bool | None = None,
    ) -> None:
        """checkpoint_dir: write ``ckpt-<step>.sgck`` there at each epoch end (and every
        ``checkpoint_every`` steps), keeping the last ``keep_last``; resume from the newest
        when ``resume``. save_best_only: also keep ``best.sgck`` for the best ``monitor``
        (``val_loss``/``loss`` lower is better, ``*accuracy`` higher). sync_dir: copy each
        finished checkpoint there, whole files, at most every ``sync_every_secs`` and at
        the end. plot_path: a PNG of the loss/accuracy curves (needs matplotlib).
        tensorboard_dir: scalars through sparkgrad.summary.EventWriter when available.
        prefetch: batches of an iterable dataset prepared ahead on a background thread
        (0: none), waiting at most ``prefetch_timeout`` seconds for each. mlflow: log params,
        metrics, checkpoints and the model to MLflow from the chief (None: when mlflow is
        imported and a run is active; see sparkgrad.nn.tracking)."""
        if log_every <= 0:
            raise InvalidArgumentError(f"log_every must be > 0, not {log_every}")
        if prefetch < 0 or not prefetch_timeout > 0:
            raise InvalidArgumentError(
                f"prefetch must be >= 0 and prefetch_timeout > 0 (got {prefetch}, {prefetch_timeout})"
            )
        self.prefetch = int(prefetch)
        self.prefetch_timeout = float(prefetch_timeout)
        from sparkgrad._threads import configure_threads, spark_task_cpus

        if spark_task_cpus() is not None:
            configure_threads()  # on an executor: OMP_NUM_THREADS, else spark.task.cpus
        self.model = model
        self.verbose = int(verbose)
        self.log_every = int(log_every)
        self.callbacks = list(callbacks)
        self.plot_path = plot_path
        self.checkpoints = None
        if checkpoint_dir is not None:
            from sparkgrad.nn.checkpoint import CheckpointManager

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
            self.bar.set_postfix(loss=f"{logs['loss']:.4f}", acc=f"{logs['accuracy']:.4f}", refresh=False)
        if self.writer is not None:
            for k in ("loss", "accuracy", "lr"):
                self.writer.scalar(f"train/{k}", logs[k], m.step)
        for cb in self.callbacks:
            if hasattr(cb, "on_step_end"):
                cb.on_step_end(m.step, logs)
            elif callable(cb):
                cb(m.step, logs)

    def _epoch_end(self, history, epoch: int, logs: dict[str, float], started: float) -> None:
        m = self.model
        history.add_epoch(epoch, logs)
        if self.verbose == 2 or (self.verbose == 1 and self.bar is None):
            parts = " ".join(f"{k} {v:.4f}" for k, v in logs.items())
            print(f"epoch {epoch + 1}: {parts} ({time.monotonic() - started:.1f} s)", flush=True)
        elif self.bar is not None:
            self.bar.write(f"epoch {epoch + 1}: " + " ".join(f"{k} {v:.4f}" for k, v in logs.items()))
        if self.writer is not None:
            for k, v in logs.items():
                self.writer.scalar(f"epoch/{k}", v, m.step)
        for cb in self.callbacks:
            if hasattr(cb, "on_epoch_end"):
                cb.on_epoch_end(epoch, logs)
        if self.checkpoints is not None:
            self.checkpoints.save(m, logs)

    # ---- the loop -----------------------------------------------------------

    def run(self, x, y, batch_size, epochs, validation_data, max_steps, shuffle, x_key, y_key, initial_epoch):
        from sparkgrad.nn.model import History, _batch_arrays

        m = self.model
        if batch_size <= 0 or epochs < 0:
            raise InvalidArgumentError(f"batch_size must be > 0 and epochs >= 0 (got {batch_size}, {epochs})")
        if max_steps is not None and max_steps < 0:
            raise InvalidArgumentError(f"max_steps must be >= 0, not {max_steps}")
        copt = m.optimizer.bind(m.num_params)
        resume_pos = 0
        restored = False
        if self.checkpoints is not None and self.resume:
            restored = self.checkpoints.latest() is not None
            resume_pos = self.checkpoints.restore_latest(m)
        if initial_epoch is not None:
            m.epoch = int(initial_epoch)
        elif not restored:
            m.epoch = 0  # as Keras: each call trains `epochs` epochs unless it resumes a checkpoint
        arrays = y is not None or isinstance(x, np.ndarray)
        if arrays:
            xa = m._x(x)
            labels, onehot = m._targets(y, xa.shape[0])
            n = xa.shape[0]
            if n == 0:
                raise InvalidArgumentError("fit: x has no rows")
            per_epoch = math.ceil(n / batch_size)
            total = max(0, epochs - m.epoch) * per_epoch - math.ceil(resume_pos / batch_size)
            if max_steps is not None:
                total = min(total, max(0, max_steps - m.step))
        elif isinstance(x, Iterable):
            total = max_steps - m.step if max_steps is not None else None
        else:
            raise InvalidArgumentError("fit: x must be an array (with y) or an iterable of dict batches")
        history = History()
        m.stop_training = False
        if self.tracker is not None:
            opts = dict(batch_size=batch_size, epochs=epochs, max_steps=max_steps, log_every=self.log_every)
            self.tracker.on_train_begin(opts)
        self._open_bar(total, 0)
        try:
            for epoch in range(m.epoch, epochs):
                if m.stop_training or (max_steps is not None and m.step >= max_steps):
                    break
                started = time.monotonic()
                totals = _Totals()
                if arrays:
                    if resume_pos:
                        order = self.checkpoints.resume_order(m, n, shuffle)
                    else:
                        m._epoch_rng = m._core.get_rng()
                        order = m._core.shuffle(n) if shuffle else None
                    pos, resume_pos = resume_pos, 0
                    while pos < n and not m.stop_training:
                        k = min(self.log_every, math.ceil((n - pos) / batch_size))
                        if self.checkpoint_every:
                            k = min(k, self.checkpoint_every - m.step % self.checkpoint_every)
                        if max_steps is not None:
                            k = min(k, max_steps - m.step)
                        if k <= 0:
                            break
                        r = m._core.train_steps(copt, xa, labels, onehot, order, pos, batch_size, k)
                        pos += r[2]
                        m.step += r[3]
                        m._epoch_pos = pos
                        interval = _Totals()
                        interval.add(r)
                        totals.add(r)
                        self._step_logs(history, interval)
                        if self.checkpoints and self.checkpoint_every and m.step % self.checkpoint_every == 0:
                            if pos < n:
                                self.checkpoints.save(m, None)
                    if pos < n:  # stopped early: an incomplete epoch is not counted
                        m._epoch_pos = pos
                        break
                else:
                    interval = _Totals()

                    def convert(batch):
                        xb, yb = _batch_arrays(batch, x_key, y_key)
                        xb = m._x(xb)
                        return (xb, *m._targets(yb, xb.shape[0]))

                    prefetcher = None
                    if self.prefetch:
                        prefetcher = _Prefetcher(iter(x), convert, self.prefetch, self.prefetch_timeout)
                    try:
                        for xb, lb, ob in prefetcher if prefetcher is not None else map(convert, x):
                            r = m._core.train_steps(copt, xb, lb, ob, None, 0, xb.shape[0], 1)
                            m.step += r[3]
                            interval.add(r)
                            totals.add(r)
                            if interval.steps >= self.log_every:
                                self._step_logs(history, interval)
                                interval = _Totals()
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
                if validation_data is not None:
                    vx, vy = validation_data
                    vl, va = m.evaluate(vx, vy, batch_size=batch_size)
                    logs["val_loss"], logs["val_accuracy"] = vl, va
                m.epoch = epoch + 1
                m._epoch_pos = 0
                self._epoch_end(history, epoch, logs, started)
        finally:
            if self.bar is not None:
                self.bar.close()
            if self.checkpoints is not None:
                self.checkpoints.finish()
            if self.writer is not None and hasattr(self.writer, "close"):
                self.writer.close()
        for cb in self.callbacks:
            if hasattr(cb, "on_train_end"):
                cb.on_train_end(history.history)
        if self.plot_path is not None:
            plot_history(history, self.plot_path)
        return history


def plot_history(history, path: str) -> None:
    """Writes a PNG of loss and accuracy per step (and per epoch, with validation)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise InvalidArgumentError(f"plot_path needs matplotlib (pip install matplotlib): {exc}") from exc
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    steps = [s["step"] for s in history.steps]
    for ax, key in zip(axes, ("loss", "accuracy"), strict=True):
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
