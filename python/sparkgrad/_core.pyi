"""Type stub for sparkgrad._core, the C extension."""

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

def build_info() -> dict[str, str | int | None]: ...  # "inflate": "isal" | "zlib", "isal": version or None
def status_codes() -> dict[str, int]: ...
def _raise_status(code: int, message: str) -> None: ...

# ---- cluster transport (csrc/net, csrc/py/py_net*.c) ----

FRAME_MAX_DEFAULT: int
FRAME_HEADER_SIZE: int
SECURITY_DEFAULT: str  # the security= mode of every server and client unless one is named

def _frame_encode(type: int, flags: int, payload: bytes) -> bytes: ...
def _frame_decode(data: bytes, max_payload: int = ..., chunk: int = 0) -> tuple[list[tuple[int, int, bytes]], int]: ...

class Listener:
    def __init__(self, host: str = "0.0.0.0", port: int = 0) -> None: ...
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def fileno(self) -> int: ...
    def close(self) -> None: ...
    def __enter__(self) -> Listener: ...
    def __exit__(self, *exc: object) -> bool: ...

class RendezvousServer:
    heartbeat_timeout: float
    def __init__(
        self,
        secret: bytes,
        num_nodes: int,
        host: str = "0.0.0.0",
        port: int = 0,
        auth_timeout: float = 10.0,
        security: str | None = None,
    ) -> None: ...
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def num_nodes(self) -> int: ...
    def wait(self, timeout: float) -> list[dict]: ...
    def next_event(self, timeout: float) -> dict | None: ...
    def send(self, executor_id: int, message: dict) -> None: ...
    def broadcast(self, message: dict) -> int: ...
    def stats(self) -> dict: ...
    def close(self) -> None: ...
    def __enter__(self) -> RendezvousServer: ...
    def __exit__(self, *exc: object) -> bool: ...

class ControlClient:
    @staticmethod
    def register(
        host: str,
        port: int,
        secret: bytes,
        node: dict,
        timeout: float,
        heartbeat_interval: float = 1.0,
        driver_timeout: float = 30.0,
        security: str | None = None,
    ) -> ControlClient: ...
    @property
    def spec(self) -> list[dict]: ...
    def log(self, line: str, timeout: float = 30.0, stream: str | None = None) -> None: ...
    def metric(self, name: str, value: float, step: int, timeout: float = 30.0) -> None: ...
    def done(self, result: str, timeout: float = 30.0) -> None: ...
    def error(self, message: str, traceback: str, host: str = "", timeout: float = 30.0) -> None: ...
    def recv(self, timeout: float) -> dict | None: ...
    def exit_when_orphaned(self, after: float, status: int, message: str) -> None: ...
    def interrupt(self) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> ControlClient: ...
    def __exit__(self, *exc: object) -> bool: ...

# ---- records (csrc/record, csrc/py/py_record*.c) ----

def crc32c(data: bytes, start: int = 0) -> int:
    """The CRC32C (Castagnoli) of ``data``, as TFRecord framing uses it (SSE4.2 instruction where the CPU has it).

    Args:
        data: Any bytes-like object.
        start: A CRC to continue from: ``crc32c(b, crc32c(a)) == crc32c(a + b)``; 0 starts afresh.

    Returns:
        The unsigned 32-bit checksum.
    """

def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C of ``data``, as stored after each record's length and payload.

    The CRC rotated right by 15 bits plus ``0xa282ead8`` (mod 2**32).
    """

def crc32c_hardware() -> bool:
    """Whether `crc32c` uses the SSE4.2 instruction on this CPU (else a slicing-by-8 table)."""

class TFRecordReader(Iterator[bytes]):
    offset: int
    name: str
    def __init__(
        self,
        path: str | None = None,
        compression: str | None = None,
        verify_crc: bool = True,
        data: bytes | None = None,
        name: str | None = None,
    ) -> None: ...
    def __next__(self) -> bytes: ...

class TFRecordWriter:
    """Writes a TFRecord file, byte-compatible with TensorFlow's ``tf.io.TFRecordWriter``; a context manager.

    ```python
    with TFRecordWriter("train.tfrecord.gz", "GZIP") as writer:
        writer.write(encode_example({"label": 3}))
    ```

    Each record is framed as TensorFlow frames it (length, masked CRC32C of the length, payload,
    masked CRC32C of the payload). One writer must not be used from two threads at once.

    Args:
        path: The file to write (created or truncated); ``file://`` and ``dbfs:/`` forms are mapped to
            local paths.
        compression: None, ``"ZLIB"`` or ``"GZIP"`` (the whole stream, as TensorFlow writes it).

    Raises:
        SparkgradIOError: The file cannot be created.
        InvalidArgumentError: An unknown compression.
    """

    path: str
    """The path being written."""
    def __init__(self, path: str, compression: str | None = None) -> None: ...
    def write(self, record: bytes) -> None:
        """Appends one record (any bytes-like object).

        Raises:
            StateError: The writer is closed, or used from two threads at once.
            SparkgradIOError: The write failed.
        """
    def flush(self) -> None:
        """Hands the buffered records to the OS; the file then ends at a record boundary."""
    def close(self) -> None:
        """Finishes the stream (the compression trailer) and closes the file; closing again does nothing."""
    def __enter__(self) -> TFRecordWriter: ...
    def __exit__(self, *exc: object) -> None: ...

def encode_example(items: Sequence[tuple[str, int, Any]]) -> bytes: ...
def decode_example(data: bytes) -> dict[str, np.ndarray | list[bytes] | None]: ...
def encode_sequence_example(
    context: Sequence[tuple[str, int, Any]], lists: Sequence[tuple[str, int, Any]]
) -> bytes: ...
def decode_sequence_example(data: bytes) -> tuple[dict[str, Any], dict[str, list[Any]]]: ...

class Schema:
    def __init__(self, specs: Sequence[tuple]) -> None: ...

def parse_examples(schema: Schema, records: Sequence[bytes], name: str | None = None) -> dict[str, Any]: ...
def parse_sequence_examples(
    context: Schema | None,
    lists: Schema | None,
    allow_missing: Sequence[bool],
    records: Sequence[bytes],
    name: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]: ...

class Dataset(Iterator[dict[str, Any]]):
    def __init__(
        self,
        paths: Sequence[str],
        schema: Schema,
        batch_size: int,
        shuffle_buffer: int = 0,
        seed: int = 0,
        epochs: int = 1,
        shard_index: int = 0,
        num_shards: int = 1,
        drop_remainder: bool = False,
        compression: str | None = None,
        prefetch: int = 2,
        verify_crc: bool = True,
        timeout: float = 600.0,
        parse_threads: int = 1,
    ) -> None: ...
    def __next__(self) -> dict[str, Any]: ...
    def close(self) -> None: ...

# ---- table (csrc/py/py_table.c) ----

class TablePool:
    """Chunk buffers reused by the TableReaders given it (thread-safe), at most ``max_bytes`` held."""

    bytes: int
    def __init__(self, max_bytes: int) -> None: ...

class TableReader:
    """Arrow record batches in (through the C data interface, no copy), shuffled batches out."""

    pending: int
    def __init__(
        self,
        plans: Sequence[tuple[str, int, bool, int, float, float] | tuple[str, int, bool, int, float, float, bool]],
        batch_size: int,
        shuffle_buffer: int = 0,
        seed: int = 0,
        pool: TablePool | None = None,
    ) -> None: ...
    def push(self, batch: Any, file: str, row_group: int, first_row: int, capsule: bool = True) -> int:
        """Converts one record batch, taken through ``__arrow_c_array__`` (``capsule``, pyarrow >= 14) or
        ``_export_to_c`` (older pyarrow); returns the rows kept."""
    def next(self, final: bool = False) -> tuple[int, list[tuple[str, np.ndarray, np.ndarray | None]]] | None:
        """The next batch ``(rows, [("f" | "i", values, lengths) | ("s", offsets, bytes)])`` or None."""
    def widths(self) -> list[tuple[str, int, bool]]:
        """Each column's settled output: (kind "f" / "i" / "s" / "", width, has lengths)."""

# ---- nn (csrc/py/py_nn.c, csrc/py/py_nn_optim.c) ----

LOSS_NAMES: tuple[str, ...]
"""The loss table's names (csrc/nn/nn_loss.c), in kind order."""
METRIC_NAMES: tuple[str, ...]
"""The metric table's names (csrc/nn/nn_metric.c), in kind order."""

def metric_results(metrics: Sequence[tuple[int, float, int, bool, bool]], state: np.ndarray) -> list[float]:
    """The metrics' values from a (summed) float64 state array."""

class Model:
    """A graph of layers on oneDNN: input shapes (h, w, c), layer descriptions (dicts with "kind", an index of
    LAYER_KINDS, "inputs", "units", "kernel_size", "strides", "padding", "activation", "rate", "initializer",
    "target_shape", "shares", "epsilon", "momentum", "center", "scale", "normalize") in topological order, output
    tensors."""

    def __init__(
        self, inputs: list[tuple[int, int, int]], layers: list[dict], outputs: list[int] | None = None
    ) -> None: ...
    @property
    def params(self) -> np.ndarray: ...
    @property
    def grads(self) -> np.ndarray: ...
    @property
    def state(self) -> np.ndarray:
        """The non-trainable state buffer (BatchNormalization's moving statistics), a float32 view."""
    @property
    def classes(self) -> int: ...
    @property
    def outputs(self) -> list[tuple[int, int, str]]: ...
    @property
    def precision(self) -> str: ...
    def set_precision(self, precision: str) -> str: ...
    def bf16_layers(self, batch: int) -> int: ...
    def param_table(self) -> list[tuple[int, int, int, int, tuple[int, ...], str]]: ...
    def state_table(self) -> list[tuple[int, int, int, int, tuple[int, ...], str]]: ...
    def layer_shapes(self) -> list[tuple[tuple[int, int, int], tuple[int, int, int], tuple[int, int, int, int]]]: ...
    def touched_rows(self) -> list[tuple[int, int, int, np.ndarray]]: ...
    def init_params(self, seed: int) -> None: ...
    def get_rng(self) -> tuple[int, int]: ...
    def set_rng(self, seed: int, counter: int) -> None: ...
    def shuffle(self, n: int) -> np.ndarray: ...
    @property
    def head(self) -> str:
        """'softmax', 'sigmoid' (a last Dense layer's activation, applied by the loss) or 'linear'."""
    @property
    def metric_state_size(self) -> int:
        """Doubles in the metrics' state array."""
    def set_loss(
        self, kind: int, *, from_logits: bool = False, label_smoothing: float = 0.0, delta: float = 1.0
    ) -> None:
        """kind indexes LOSS_NAMES; checked against the head and the outputs (ModelError)."""
    def set_metrics(self, metrics: Sequence[tuple[int, float, int, bool, bool]]) -> None:
        """(kind, threshold, num_thresholds, pr_curve, from_logits) each; kind indexes METRIC_NAMES."""
    def train_steps(
        self,
        opt: Optimizer | None,
        x: np.ndarray,
        labels: np.ndarray | None,
        targets: np.ndarray | None,
        order: np.ndarray | None,
        start: int,
        batch: int,
        nsteps: int,
        *,
        hook: object | None = None,
        step: int = 0,
        scale: float = ...,
        mean: np.ndarray | None = None,
        std: np.ndarray | None = None,
        weights: np.ndarray | None = None,
        metrics: np.ndarray | None = None,
        preps: Sequence[Prep | None] | None = None,
    ) -> tuple[float, int, int, int]:
        """x float32, uint8, int32 or int64 [n, row]; labels int32 or int64 (a sparse loss) or targets float32 [n, K];
        weights float32 [n]; metrics: the float64 state array the metrics add to; hook: a capsule named
        "sparkgrad._core.NnGradHook" (csrc/nn/nn_hook.h); scale/mean/std: x_float =
        (x * scale - mean) / std in the gather (scale omitted, mean and std None: none); preps: each
        input's preprocessing chain (or None), whose input then takes its raw column (float32, int32,
        int64, or a string column: .offsets and .data). Returns (loss_sum, seen, steps, step after); a
        non-finite loss raises NonFiniteLossError with step, steps, seen and loss_sum of the good steps
        before it."""
    def evaluate(
        self,
        x: np.ndarray,
        labels: np.ndarray | None,
        targets: np.ndarray | None,
        batch: int,
        *,
        scale: float = ...,
        mean: np.ndarray | None = None,
        std: np.ndarray | None = None,
        weights: np.ndarray | None = None,
        metrics: np.ndarray | None = None,
        preps: Sequence[Prep | None] | None = None,
    ) -> tuple[float, int, int]:
        """Returns (loss_sum, seen, steps); the metrics add to ``metrics``."""
    def predict(
        self,
        x: np.ndarray,
        batch: int,
        *,
        scale: float = ...,
        mean: np.ndarray | None = None,
        std: np.ndarray | None = None,
        preps: Sequence[Prep | None] | None = None,
    ) -> np.ndarray: ...

class Prep:
    """A model input's preprocessing chain (csrc/nn/nn_prep.h), built from the description
    sparkgrad.nn.preprocessing.chain_desc gives; run in C in the batch gather."""

    in_row: int
    out_row: int
    def __init__(self, desc: dict) -> None: ...
    def map(self, x: object) -> np.ndarray:
        """The chain on a raw column [n, in_row]: float32 [n, out_row]."""

def utf8_column(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A str / bytes / object array as (offsets int64 [x.size + 1], data uint8), UTF-8."""

def fingerprint64(b: bytes) -> int:
    """FarmHash Fingerprint64 (tf.strings.to_hash_bucket_fast's hash)."""

def siphash(k0: int, k1: int, b: bytes) -> int:
    """SipHash-2-4 keyed with (k0, k1) (tf.strings.to_hash_bucket_strong's hash)."""

class Optimizer:
    """A C optimizer (sgd, adam, adamw, rmsprop, adadelta, adagrad) over n float32 parameters."""

    def __init__(
        self,
        kind: str,
        n: int,
        *,
        tensor_sizes: Sequence[int] | None = None,
        boundaries: Sequence[int] | None = None,
        values: Sequence[float] | None = None,
        **config: float | int | bool | str,
    ) -> None: ...
    def step(
        self, params: np.ndarray, grads: np.ndarray, rows: Sequence[tuple[int, int, int, np.ndarray]] | None = None
    ) -> None: ...
    def state(self) -> np.ndarray: ...
    def set_state(self, step: int, state: np.ndarray) -> None: ...
    @property
    def lr(self) -> float: ...
    @property
    def base_lr(self) -> float: ...
    @base_lr.setter
    def base_lr(self, value: float) -> None: ...
    @property
    def steps(self) -> int: ...
    @property
    def n(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def sparse_rows(self) -> bool: ...

def bf16_supported() -> bool: ...
def set_num_threads(n: int) -> None: ...
def get_num_threads() -> int: ...

# ---- parameter server (csrc/net/ps*.c, csrc/py/py_net_ps.c) ----

def ps_shard_range(
    total: int, num_ps: int, index: int, tables: Sequence[Sequence[int]] | None = None
) -> tuple[int, int]: ...

class PsServer:
    def __init__(
        self,
        listener: Listener,
        secret: bytes,
        offset: int,
        count: int,
        total: int,
        num_workers: int,
        mode: str = "async",
        lr: float = 0.01,
        params: np.ndarray | None = None,
        step: int = 0,
        optimizer: str | Any | dict[str, Any] | None = None,
        auth_timeout: float = 10.0,
        security: str | None = None,
        tables: Sequence[Sequence[int]] | None = None,
    ) -> None: ...
    @property
    def step(self) -> int: ...
    @property
    def shard(self) -> tuple[int, int, int]: ...
    @property
    def integrity_failures(self) -> int:
        """Worker connections closed because a frame failed its integrity or sequence check."""
    def serve(self, timeout: float | None = None) -> str: ...
    def stop(self) -> None: ...
    def get_state(self) -> tuple[np.ndarray, int, tuple[int, np.ndarray] | None]: ...
    def set_state(
        self, params: np.ndarray, step: int, optimizer_state: tuple[int, np.ndarray] | None = None
    ) -> None: ...

class PsClient:
    def __init__(
        self,
        addresses: list[tuple[str, int]],
        secret: bytes,
        total: int,
        worker_id: int,
        timeout: float = 60.0,
        compression: str | None = None,
        security: str | None = None,
        tables: Sequence[Sequence[int]] | None = None,
    ) -> None: ...
    @property
    def bytes(self) -> tuple[int, int]:
        """(sent, received): bytes on every shard connection so far (frame headers and payloads)."""
    def pull(self, params: np.ndarray) -> int: ...
    def pull_rows(self, params: np.ndarray, table: int, ids: np.ndarray) -> None: ...
    def wait_others(self, params: np.ndarray, timeout: float) -> int: ...
    def push(self, grads: np.ndarray) -> int: ...
    def push_pull(self, grads: np.ndarray, params: np.ndarray) -> int: ...
    def init(self, params: np.ndarray) -> bool: ...
    def get_state(self) -> tuple[np.ndarray, int, list[tuple[int, np.ndarray] | None]]: ...
    def set_state(
        self, params: np.ndarray, step: int, optimizer_state: list[tuple[int, np.ndarray] | None] | None = None
    ) -> None: ...
    def put_state(self, state: np.ndarray) -> int: ...
    def mean_state(self, state: np.ndarray) -> int: ...
    def done(self) -> None: ...
    def grad_hook(self, sparse: bool = True) -> object:
        """A "sparkgrad._core.NnGradHook" capsule for Model.train_steps(hook=): push_pull per step
        (with tables and sparse: the touched rows out, the rows a forward reads in)."""
    def close(self) -> None: ...

# ---- ring collectives (csrc/net/coll*.c, csrc/py/py_net_coll.c) ----

class Communicator:
    def __init__(
        self,
        listener: Listener,
        secret: bytes,
        rank: int,
        addresses: list[tuple[str, int]],
        timeout: float = 60.0,
        security: str | None = None,
        shared_memory: bool = True,
    ) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    def allreduce(
        self, array: np.ndarray, op: str = "sum", compression: str | None = None, timeout: float | None = None
    ) -> np.ndarray: ...
    def broadcast(self, array: np.ndarray, root: int = 0, timeout: float | None = None) -> np.ndarray: ...
    def allgather(self, array: np.ndarray, timeout: float | None = None) -> np.ndarray: ...
    def allgather_bytes(self, data: bytes, timeout: float | None = None) -> list[bytes]: ...
    def broadcast_bytes(self, data: bytes | None = None, root: int = 0, timeout: float | None = None) -> bytes: ...
    def barrier(self, timeout: float | None = None) -> None: ...
    def grad_hook(
        self,
        op: str = "average",
        compression: str | None = None,
        backward_passes_per_step: int = 1,
        bucket_bytes: int = 0,
        sparse_tables: bool = True,
    ) -> Any: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self) -> None: ...
    def __enter__(self) -> Communicator: ...
    def __exit__(self, *exc: object) -> bool: ...

def _grad_hook_ready(hook: Any, grads: np.ndarray, offset: int, count: int) -> None: ...
def _grad_hook_step(hook: Any, params: np.ndarray, grads: np.ndarray, global_step: int = 0) -> tuple[int, int]: ...
def _grad_hook_step_rows(
    hook: Any, params: np.ndarray, grads: np.ndarray, tables: list, global_step: int = 0
) -> tuple[int, int, list[np.ndarray]]: ...

# ---- feed for InputMode.SPARK (csrc/net/feed*.c, csrc/py/py_net_feed.c) ----

class FeedServer:
    def __init__(
        self,
        listener: Listener,
        secret: bytes,
        capacity_bytes: int = 256 << 20,
        expected_feeders: int = 0,
        max_frame: int = 64 << 20,
        auth_timeout: float = 10.0,
        security: str | None = None,
    ) -> None: ...
    def next_batch(
        self, n: int, timeout: float, input: str = "train", with_source: bool = False, partial: bool = False
    ) -> dict[str, np.ndarray] | tuple[dict[str, np.ndarray], np.ndarray]: ...
    def send_results(self, source: int, columns: dict[str, np.ndarray], timeout: float = 60.0) -> None: ...
    def finish(self, input: str | None = None) -> None: ...
    def drained(self, input: str = "train") -> bool: ...
    def stats(self) -> dict: ...
    def close(self) -> None: ...

class FeedClient:
    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes,
        timeout: float = 60.0,
        input: str = "train",
        security: str | None = None,
    ) -> None: ...
    def send(self, columns: dict[str, np.ndarray]) -> None: ...
    def end(self) -> None: ...
    def recv_results(self, timeout: float) -> dict[str, np.ndarray] | None: ...
    def close(self) -> None: ...

def pack_binary(values: Sequence[bytes | bytearray | memoryview], width: int = -1) -> np.ndarray: ...
def feed_send(
    host: str,
    port: int,
    secret: bytes,
    columns: dict[str, np.ndarray],
    timeout: float = 60.0,
    input: str = "train",
    security: str | None = None,
) -> None: ...

class RestClient:
    def __init__(
        self,
        host: str,
        *,
        timeout: float = 60.0,
        budget: float = 300.0,
        backoff: float = 1.0,
        max_response: int = 256 << 20,
        allow_http_loopback: bool = False,
        user_agent: str | None = None,
    ) -> None: ...
    @property
    def host(self) -> str: ...
    @property
    def timeout(self) -> float: ...
    @property
    def budget(self) -> float: ...
    def call(
        self,
        method: str,
        path: str,
        body: bytes | bytearray | memoryview | None = None,
        *,
        content_type: str | None = None,
        authorization: str | None = None,
        idempotent: bool = False,
    ) -> tuple[int, bytes, bytes, list[tuple[int | None, str, float]], float]: ...
