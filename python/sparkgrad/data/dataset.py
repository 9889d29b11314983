"""TFRecordDataset: the input pipeline every sparkgrad trainer reads from.

    ds = TFRecordDataset("/dbfs/mnist/train/part-*", schema, batch_size=100,
                         shuffle_buffer=10_000, seed=1, epochs=3,
                         shard_index=ctx.task_index, num_shards=ctx.num_workers)
    for batch in ds:            # dict name -> NumPy array (or Ragged)
        ...

Reading, CRC checks, decompression, shuffling, parsing and batching all run
in C on a background thread (``prefetch`` batches ahead) with the GIL
released; this class only expands the file list and wraps the results.
"""

from __future__ import annotations

import glob as _glob
import os
from collections.abc import Iterator, Mapping, Sequence

from sparkgrad import _core
from sparkgrad.data.example import Ragged, Schema, VarLenFeature, as_schema
from sparkgrad.errors import InvalidArgumentError, SparkgradIOError

_GLOB_CHARS = set("*?[")


def _local(path: str) -> str:
    if path.startswith("file://"):
        return path[len("file://") :]
    if path.startswith("dbfs:/"):
        return "/dbfs/" + path[len("dbfs:/") :].lstrip("/")
    return path


def expand_paths(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """The files named by ``paths``, as TFRecordDataset and the Spark readers list them.

    Globs are expanded (sorted), directories listed (sorted, skipping names that start with ``.`` or
    ``_``, such as Spark's ``_SUCCESS`` markers), ``file://`` and ``dbfs:/`` forms mapped to local paths
    (``dbfs:/x`` is ``/dbfs/x``). Other paths are kept as given, whether or not they exist.

    Args:
        paths: A path, or a sequence of paths, each a file, directory or glob.

    Returns:
        The file paths, in order.

    Raises:
        SparkgradIOError: A glob matches no file, or a directory holds no record file.
        InvalidArgumentError: ``paths`` is empty.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files: list[str] = []
    for p in paths:
        p = _local(os.fspath(p))
        if _GLOB_CHARS & set(p):
            found = sorted(f for f in _glob.glob(p) if os.path.isfile(f))
            if not found:
                raise SparkgradIOError(f"no files match {p!r}", path=p)
            files += found
        elif os.path.isdir(p):
            found = sorted(
                os.path.join(p, f)
                for f in os.listdir(p)
                if not f.startswith((".", "_")) and os.path.isfile(os.path.join(p, f))
            )
            if not found:
                raise SparkgradIOError(f"directory {p!r} holds no record files", path=p)
            files += found
        else:
            files.append(p)
    if not files:
        raise InvalidArgumentError("TFRecordDataset needs at least one file")
    return files


class TFRecordDataset:
    """Batches of parsed ``tf.train.Example`` records from TFRecord files.

    The input pipeline every sparkgrad trainer reads from.

    ```python
    ds = TFRecordDataset("/dbfs/mnist/train/part-*", schema, batch_size=100, shuffle_buffer=10_000, seed=1,
                         epochs=3, shard_index=ctx.task_index, num_shards=ctx.num_workers)
    for batch in ds:  # {name: array [batch, *shape]} (a Ragged for a VarLenFeature)
        ...
    ```

    Reading, CRC checks, decompression, shuffling, parsing and batching all run in C on a background
    thread with the GIL released. Iterating yields dicts ``{name: array [batch, *shape]}`` for
    FixedLen and RawBytes features and `Ragged` values for VarLen ones; each ``iter(ds)`` starts a
    fresh pass with the same settings, so `sparkgrad.nn.Sequential.fit` can take the dataset itself.

    Args:
        paths (str | os.PathLike | Sequence): A file, directory or glob, or a list of them (``dbfs:/``
            and ``file://`` forms too; see `expand_paths`).
        schema: A `Schema` or a dict ``{name: FixedLenFeature | VarLenFeature | RawBytesFeature}``.
        batch_size: Records per batch.
        shuffle_buffer: Records held for shuffling (0: file order). When > 0 the file order is
            shuffled each epoch too.
        seed: Shuffling seed (None: a random one).
        epochs: Passes over the data (None or -1: forever). Epochs are joined before batching, as in
            TensorFlow's ``repeat().shuffle().batch()``.
        shard_index: This worker's share, in ``[0, num_shards)``. With at least as many files as
            shards, shard ``i`` reads files ``i, i+n, ...``; otherwise every shard reads every file and
            keeps records ``i, i+n, ...``.
        num_shards: Number of shares (workers).
        drop_remainder: Drop a last batch smaller than ``batch_size``.
        compression: None, ``"ZLIB"`` or ``"GZIP"`` (the whole stream, as TensorFlow writes it).
        prefetch: Batches produced ahead by the background thread (0: none).
        verify_crc: Check each record's CRC32C.
        timeout: Seconds to wait for one batch before SparkgradTimeout.
        parse_threads: Threads that read, check and parse whole batches (any schema), delivered in the
            same order as with one: ``parse_threads - 1`` C threads plus the caller, which makes a
            batch itself whenever none is ready instead of waiting.

    Raises:
        InvalidArgumentError: ``shard_index`` outside ``[0, num_shards)``, or no files.
        SparkgradIOError: A glob or directory names no files.
        SchemaError: A bad schema; during iteration, a record that does not match it.
        CorruptRecordError: During iteration, a record that fails its CRC or framing check (with the
            file and offset).
    """

    def __init__(
        self,
        paths,
        schema: Schema | Mapping,
        batch_size: int,
        *,
        shuffle_buffer: int = 0,
        seed: int | None = None,
        epochs: int | None = 1,
        shard_index: int = 0,
        num_shards: int = 1,
        drop_remainder: bool = False,
        compression: str | None = None,
        prefetch: int = 2,
        verify_crc: bool = True,
        timeout: float = 600.0,
        parse_threads: int = 1,
    ):
        self.files = expand_paths(paths)
        self.schema = as_schema(schema)
        if not 0 <= shard_index < num_shards:
            raise InvalidArgumentError(f"shard_index {shard_index} must be in [0, num_shards={num_shards})")
        self.batch_size = int(batch_size)
        self.shuffle_buffer = int(shuffle_buffer)
        self.seed = int.from_bytes(os.urandom(8), "little") if seed is None else int(seed) & (2**64 - 1)
        self.epochs = -1 if epochs is None else int(epochs)
        self.shard_index, self.num_shards = int(shard_index), int(num_shards)
        self.drop_remainder = bool(drop_remainder)
        self.compression = compression
        self.prefetch = int(prefetch)
        self.verify_crc = bool(verify_crc)
        self.timeout = float(timeout)
        self.parse_threads = int(parse_threads)
        self._varlen = [n for n, s in self.schema.features.items() if isinstance(s, VarLenFeature)]
        self._open: list = []

    def _start(self):
        return _core.Dataset(
            self.files,
            self.schema._compiled,
            self.batch_size,
            shuffle_buffer=self.shuffle_buffer,
            seed=self.seed,
            epochs=self.epochs,
            shard_index=self.shard_index,
            num_shards=self.num_shards,
            drop_remainder=self.drop_remainder,
            compression=self.compression,
            prefetch=self.prefetch,
            verify_crc=self.verify_crc,
            timeout=self.timeout,
            parse_threads=self.parse_threads,
        )

    def __iter__(self) -> Iterator[dict]:
        core = self._start()
        try:
            for batch in core:
                for name in self._varlen:
                    batch[name] = Ragged(*batch[name])
                yield batch
        finally:
            core.close()

    @property
    def shard_files(self) -> list[str]:
        """The files this shard reads (all of them when sharding by record)."""
        if len(self.files) < self.num_shards:
            return list(self.files)
        return self.files[self.shard_index :: self.num_shards]

    def __repr__(self) -> str:
        return (
            f"TFRecordDataset({len(self.files)} files, batch_size={self.batch_size}, "
            f"shard {self.shard_index}/{self.num_shards}, epochs={self.epochs})"
        )
