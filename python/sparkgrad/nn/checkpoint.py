"""Checkpoints of sparkgrad.nn models: one binary file per checkpoint, written
atomically (temporary file, fsync, rename, directory fsync), the last N kept,
an optional best-only copy on a monitored metric, and ``sync_dir`` mirroring
to a second location (e.g. /dbfs/...) one whole file at a time.

File format (``.sgck``), all integers little-endian:

    offset  size  field
         0     8  magic  b"SGCKPT\\0\\1"
         8     4  u32 format version (1; 2 when the model has non-trainable state, B > 0)
        12     4  u32 header length in bytes (128)
        16     8  u64 number of parameters P
        24     8  u64 optimizer state length S (float32 values)
        32     8  i64 optimizer steps taken
        40     8  i64 model step (optimizer steps taken by fit)
        48     8  i64 completed epochs
        56     8  i64 rows of the current epoch already trained (0 at an epoch end)
        64     8  u64 RNG seed            72  8  u64 RNG counter (now)
        80     8  u64 RNG seed            88  8  u64 RNG counter (at the start of the epoch,
                                                  to redraw its permutation on resume)
        96     4  u32 CRC-32 of the architecture string (input shape + layer specs)
       100     8  optimizer kind, ASCII, NUL padded ("sgd", "adam", ...; "" if none)
       108     8  f64 monitored metric value (NaN if none)
       116     8  u64 non-trainable state length B (float32 values; 0 in version 1)
       124     4  u32 length J of the preprocessing state (version 3; zero before)
       128   4*P  parameters, float32 (the model's flat buffer)
     128+4P  4*S  optimizer state, float32 (its slot arrays)
  128+4P+4S  4*B  non-trainable state, float32 (model.buffers: BatchNormalization's moving statistics)
          .    J  the preprocessing layers' vocabularies and statistics, UTF-8 JSON
                  (Model.preprocessing_state), version 3: a model with preprocessing layers
        end     4  u32 CRC-32 (zlib) of every preceding byte

The header and the optimizer state are the model's TrainState
(sparkgrad.nn.state), written and read whole: ``encode`` takes
``model.train_state()``, ``load`` gives ``model.restore_train_state()`` the
decoded one.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct
import time
import zlib

import numpy as np

from sparkgrad.errors import CheckpointError, InvalidArgumentError, ModelError
from sparkgrad.nn.state import TrainState

MAGIC = b"SGCKPT\x00\x01"
# 2: a model with non-trainable state; 3: with preprocessing layers; others are written as 1, which every
# release reads
VERSION = 3
VERSIONS = (1, 2, 3)
HEADER = struct.Struct("<8sIIQQqqqqQQQQI8sdQI")
MAX_PREP_STATE = 1 << 30
assert HEADER.size == 128
CKPT_RE = re.compile(r"^ckpt-(\d{10})\.sgck$")
BEST = "best.sgck"


def _chain_fields(spec: dict) -> tuple:
    """A layer description in the positional order checkpoints of chains have always been keyed by:
    (kind, units, kh, kw, stride, same, activation, rate, initializer)."""
    kh, kw = spec.get("kernel_size", (0, 0))
    return (
        int(spec["kind"]),
        int(spec.get("units", 0)),
        int(kh),
        int(kw),
        int(spec.get("strides", 0)),
        int(spec.get("padding") == "same"),
        int(spec.get("activation", 0)),
        float(spec.get("rate", 0.0)),
        int(spec.get("initializer", 0)),
    )


def architecture_crc(model) -> int:
    """A CRC32 of the architecture: a chain's as checkpoints have always keyed it (so theirs still
    load); a graph's over its inputs, its layers with the tensors each reads, and its outputs."""
    if getattr(model, "is_chain", True):
        text = repr((tuple(model.input_shape), [_chain_fields(layer.spec()) for layer in model.layers]))
    else:
        specs = [sorted(layer.spec().items()) for layer in model.layers]
        parts = ([tuple(t.shape[1:]) for t in model.inputs], specs, model._reads, model._shares, model.output_names)
        chains = getattr(model, "_chains", None)
        if chains and any(chains):  # the preprocessing layers' configuration (their state travels in the file)
            parts += (
                [
                    None if c is None else [(type(x).__name__, sorted(x.get_config().items())) for x in c]
                    for c in chains
                ],
            )
        text = repr(parts)
    return zlib.crc32(text.encode())


def encode(model, metric: float = float("nan")) -> bytes:
    """The checkpoint bytes of the model's parameters and training state (``metric``: the monitored value)."""
    st = model.train_state()
    seed, counter = st.rng
    eseed, ecounter = st.epoch_rng if st.epoch_rng is not None else st.rng
    slots = np.ascontiguousarray(st.optimizer_slots, np.float32)
    buffers = np.ascontiguousarray(model.buffers, np.float32)
    chains = getattr(model, "_chains", None)
    prep = json.dumps(model.preprocessing_state()).encode() if chains and any(chains) else b""
    header = HEADER.pack(
        MAGIC,
        3 if prep else 2 if buffers.size else 1,
        HEADER.size,
        model.num_params,
        slots.size,
        st.optimizer_steps,
        st.step,
        st.epoch,
        st.epoch_pos,
        seed,
        counter,
        eseed,
        ecounter,
        architecture_crc(model),
        st.optimizer_kind.encode(),
        float(metric),
        buffers.size,
        len(prep),
    )
    body = header + model.params.tobytes() + slots.tobytes() + buffers.tobytes() + prep
    return body + struct.pack("<I", zlib.crc32(body))


def decode(data: bytes, path: str) -> dict:
    """Parses and verifies checkpoint bytes; errors name the file and offset."""
    if len(data) < HEADER.size + 4:
        raise CheckpointError(
            f"{path}: truncated checkpoint ({len(data)} bytes, header needs {HEADER.size + 4})", path=path
        )
    fields = HEADER.unpack_from(data, 0)
    magic, version, hlen, nparams, nstate = fields[:5]
    nbuffers, nprep = fields[16], fields[17]
    if magic != MAGIC:
        raise CheckpointError(f"{path}: not a sparkgrad checkpoint (bad magic at byte 0)", path=path, offset=0)
    if version not in VERSIONS:
        raise CheckpointError(
            f"{path}: checkpoint format version {version} at byte 8; this sparkgrad reads versions "
            f"{', '.join(map(str, VERSIONS))}",
            path=path,
            offset=8,
        )
    if hlen != HEADER.size:
        raise CheckpointError(
            f"{path}: checkpoint header of {hlen} bytes at byte 12; version {version} has {HEADER.size}",
            path=path,
            offset=12,
        )
    if version == 1 and nbuffers:
        raise CheckpointError(
            f"{path}: a version 1 checkpoint with {nbuffers} state values at byte 116 (that field is reserved "
            "there): the file is corrupted",
            path=path,
            offset=116,
        )
    if version < 3 and nprep:
        raise CheckpointError(
            f"{path}: a version {version} checkpoint with {nprep} bytes of preprocessing state at byte 124 (that "
            "field is reserved there): the file is corrupted",
            path=path,
            offset=124,
        )
    if nprep > MAX_PREP_STATE:
        raise CheckpointError(
            f"{path}: preprocessing state of {nprep} bytes at byte 124 is too large", path=path, offset=124
        )
    need = HEADER.size + 4 * (nparams + nstate + nbuffers) + nprep + 4
    if len(data) != need:
        raise CheckpointError(
            f"{path}: checkpoint is {len(data)} bytes, its header announces {need}", path=path, offset=16
        )
    (crc,) = struct.unpack_from("<I", data, need - 4)
    if zlib.crc32(data[: need - 4]) != crc:
        raise CheckpointError(
            f"{path}: CRC mismatch (stored at byte {need - 4}): the file is corrupted", path=path, offset=need - 4
        )
    params = np.frombuffer(data, np.float32, nparams, HEADER.size)
    state = np.frombuffer(data, np.float32, nstate, HEADER.size + 4 * nparams)
    buffers = np.frombuffer(data, np.float32, nbuffers, HEADER.size + 4 * (nparams + nstate))
    at = HEADER.size + 4 * (nparams + nstate + nbuffers)
    try:
        prep = json.loads(bytes(data[at : at + nprep])) if nprep else None
    except ValueError as e:
        raise CheckpointError(
            f"{path}: preprocessing state at byte {at} is not JSON ({e})", path=path, offset=at
        ) from None
    kind = fields[14].rstrip(b"\0").decode()
    train_state = TrainState(
        step=fields[6],
        epoch=fields[7],
        epoch_pos=fields[8],
        rng=(fields[9], fields[10]),
        epoch_rng=(fields[11], fields[12]),
        optimizer_kind=kind,
        optimizer_steps=fields[5],
        optimizer_slots=state.copy(),
    )
    return dict(
        train_state=train_state,
        params=params,
        state=state,
        buffers=buffers,
        opt_steps=fields[5],
        step=fields[6],
        epoch=fields[7],
        epoch_pos=fields[8],
        rng=(fields[9], fields[10]),
        epoch_rng=(fields[11], fields[12]),
        arch_crc=fields[13],
        kind=kind,
        metric=fields[15],
        preprocessing=prep,
    )


def write_atomic(path: str, data: bytes) -> None:
    """Writes path as a whole: temporary file in the same directory, fsync, rename, directory fsync."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise CheckpointError(f"{path}: cannot write checkpoint: {exc}", path=path) from exc
    try:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass  # some filesystems (FUSE mounts) refuse directory fsync


def save(model, path) -> None:
    write_atomic(os.fspath(path), encode(model))


def load(model, path) -> dict:
    """Restores parameters, optimizer state, step, epoch and RNG state from path."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read checkpoint: {exc}", path=path) from exc
    return restore_bytes(model, data, path)


def restore_bytes(model, data: bytes, path: str) -> dict:
    """Restores the checkpoint bytes ``data`` (named ``path`` in errors) into the model, as load() does."""
    ck = decode(data, path)
    if (
        ck["arch_crc"] != architecture_crc(model)
        or ck["params"].size != model.num_params
        or ck["buffers"].size != model.buffers.size
    ):
        raise CheckpointError(
            f"{path}: checkpoint is for a different architecture ({ck['params'].size} parameters and "
            f"{ck['buffers'].size} state values, architecture CRC {ck['arch_crc']:08x}; this model has "
            f"{model.num_params} and {model.buffers.size}, {architecture_crc(model):08x})",
            path=path,
        )
    try:
        model.restore_train_state(ck["train_state"])
    except ModelError as exc:
        raise CheckpointError(f"{path}: {exc}", path=path) from exc
    chains = getattr(model, "_chains", None)
    if (ck["preprocessing"] is not None) != bool(chains and any(chains)):
        raise CheckpointError(
            f"{path}: checkpoint {'holds' if ck['preprocessing'] is not None else 'lacks'} preprocessing state; "
            f"this model {'has no' if ck['preprocessing'] is not None else 'has'} preprocessing layers",
            path=path,
        )
    if ck["preprocessing"] is not None:
        try:
            model.set_preprocessing_state(ck["preprocessing"], path)
        except ModelError as exc:
            raise CheckpointError(str(exc), path=path) from exc
    model.params[:] = ck["params"]
    model.buffers[:] = ck["buffers"]
    return ck


def _better(monitor: str, new: float, best: float | None) -> bool:
    """Whether ``new`` beats ``best`` for ``monitor``, judged as the callbacks judge it (losses and errors
    lower, accuracies, AUC, precision and recall higher; a name that says neither: lower)."""
    from sparkgrad.nn.callbacks import _monitor_sign

    if best is None or math.isnan(best):
        return True
    try:
        sign = _monitor_sign("save_best_only", monitor, "auto")
    except InvalidArgumentError:
        sign = 1.0
    return sign * new < sign * best


class CheckpointManager:
    """Checkpoints of one training run in ``directory`` (see Trainer for the options)."""

    def __init__(
        self, directory, keep_last=3, save_best_only=False, monitor="val_loss", sync_dir=None, sync_every_secs=60.0
    ):
        if keep_last < 1:
            raise CheckpointError(f"keep_last must be >= 1, not {keep_last}")
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.keep_last = int(keep_last)
        self.save_best_only = bool(save_best_only)
        self.monitor = monitor
        self.sync_dir = os.fspath(sync_dir) if sync_dir is not None else None
        if self.sync_dir:
            os.makedirs(self.sync_dir, exist_ok=True)
        self.sync_every_secs = float(sync_every_secs)
        self._last_sync = time.monotonic()
        self.best: float | None = None
        self.listeners: list = []  # each called with the path of every checkpoint file written
        best_path = os.path.join(self.directory, BEST)
        if os.path.exists(best_path):
            with open(best_path, "rb") as f:
                self.best = decode(f.read(), best_path)["metric"]

    def checkpoints(self, directory: str | None = None) -> list[str]:
        """Regular checkpoint paths in a directory, oldest first."""
        directory = directory or self.directory
        names = sorted(n for n in os.listdir(directory) if CKPT_RE.match(n))
        return [os.path.join(directory, n) for n in names]

    def save(self, model, logs: dict | None) -> str:
        metric = float("nan")
        if logs is not None and self.monitor in logs:
            metric = float(logs[self.monitor])
        data = encode(model, metric)
        path = os.path.join(self.directory, f"ckpt-{model.step:010d}.sgck")
        write_atomic(path, data)
        for old in self.checkpoints()[: -self.keep_last]:
            os.unlink(old)
        written = [path]
        if self.save_best_only and not math.isnan(metric) and _better(self.monitor, metric, self.best):
            self.best = metric
            written.append(os.path.join(self.directory, BEST))
            write_atomic(written[-1], data)
        for listener in self.listeners:
            for p in written:
                listener(p)
        if self.sync_dir and time.monotonic() - self._last_sync >= self.sync_every_secs:
            self.sync()
        return path

    def sync(self) -> list[str]:
        """Copies finished checkpoints missing or changed in sync_dir, whole files
        (temporary name then rename), and drops ones pruned locally."""
        if not self.sync_dir:
            return []
        copied = []
        local = self.checkpoints()
        best = os.path.join(self.directory, BEST)
        for src in local + ([best] if os.path.exists(best) else []):
            dst = os.path.join(self.sync_dir, os.path.basename(src))
            st = os.stat(src)
            if os.path.exists(dst):
                dt = os.stat(dst)
                if dt.st_size == st.st_size and dt.st_mtime >= st.st_mtime:
                    continue
            tmp = dst + f".tmp-{os.getpid()}"
            try:
                shutil.copyfile(src, tmp)
                os.replace(tmp, dst)
            except OSError as exc:
                raise CheckpointError(f"sync of {src} to {self.sync_dir} failed: {exc}", path=src) from exc
            copied.append(dst)
        keep = {os.path.basename(p) for p in local}
        for remote in self.checkpoints(self.sync_dir):
            if os.path.basename(remote) not in keep:
                os.unlink(remote)
        self._last_sync = time.monotonic()
        return copied

    def finish(self) -> None:
        self.sync()

    def latest(self) -> str | None:
        """The newest checkpoint in the directory or, if newer, in sync_dir."""
        cands = self.checkpoints() + (self.checkpoints(self.sync_dir) if self.sync_dir else [])
        if not cands:
            return None
        return max(cands, key=lambda p: int(CKPT_RE.match(os.path.basename(p)).group(1)))

    def restore_latest(self, model) -> str | None:
        """Loads the newest checkpoint if any; returns its path (None: none)."""
        path = self.latest()
        if path is not None:
            load(model, path)
        return path
