"""The exception hierarchy of sparkgrad, rooted at SparkgradError.

The C core reports failures as status codes with a message; the binding maps
each code to one class here (csrc/common/sg_status.h holds the table), so the
names below are part of the C contract.

    SparkgradError
    ├── OutOfMemoryError (also MemoryError)
    ├── InvalidArgumentError (also ValueError)
    │   └── DatabricksConfigError
    ├── SparkgradIOError (also OSError)
    │   └── InputNotFoundError (also FileNotFoundError)
    ├── NativeLibraryError (also ImportError)
    ├── SparkgradTimeout (also TimeoutError)
    ├── CancelledError
    ├── StateError
    ├── RecordError
    │   ├── CorruptRecordError
    │   │   └── TruncatedRecordError
    │   └── ExampleDecodeError
    ├── SchemaError (also ValueError)
    ├── ModelError
    │   ├── OneDNNError
    │   ├── CheckpointError
    │   └── NonFiniteLossError
    ├── ClusterError
    │   ├── RendezvousTimeout (also TimeoutError)
    │   ├── NodeFailure
    │   └── InsufficientSlotsError
    ├── ProtocolError
    │   ├── AuthError
    │   ├── FrameTooLargeError
    │   └── PeerClosedError
    ├── RestError
    └── NotebookError
        ├── NotebookTimeout (also SparkgradTimeout)
        └── NotebookNotFoundError (also SparkgradIOError)
"""

from __future__ import annotations


class SparkgradError(Exception):
    """Base of every error sparkgrad raises on purpose: ``except sparkgrad.SparkgradError`` catches them all.

    Args:
        message: What went wrong, where and why; ``str(exc)``.
        **details: Facts about the failure (``path``, ``offset``, ``feature``, ``node``, ``host``, ...),
            kept in ``details`` and set as attributes of the same names.

    Attributes:
        code (int | None): The C status code when the error came from the core, else None.
        message (str): The message.
        details (dict): The keyword details.
    """

    code: int | None = None

    def __init__(self, message: str = "", **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details = dict(details)
        for key, value in details.items():
            setattr(self, key, value)


class OutOfMemoryError(SparkgradError, MemoryError):
    """An allocation failed (rarely raised: MemoryError is used instead)."""


class InvalidArgumentError(SparkgradError, ValueError):
    """An argument is out of range or of the wrong kind."""


class DatabricksConfigError(InvalidArgumentError):
    """No usable Databricks host or credentials.

    The message lists every variable and file that was read (sparkgrad.databricks.config).
    """


class SparkgradIOError(SparkgradError, OSError):
    """A file or socket operation failed; the message names the path or peer."""


class NativeLibraryError(SparkgradError, ImportError):
    """sparkgrad's C extension or a library it needs could not be loaded.

    Carries ``path`` (the extension, or the egg), ``library`` (what the
    dynamic linker could not find, when it said) and ``layout`` (wheel, egg or
    source); the message says what to do.
    """


class SparkgradTimeout(SparkgradError, TimeoutError):
    """A bounded wait expired; the message says what was awaited."""


class CancelledError(SparkgradError):
    """The operation was cancelled (driver interrupt, shutdown)."""


class StateError(SparkgradError):
    """An object was used in a state that does not allow the call."""


class RecordError(SparkgradError):
    """A TFRecord file could not be read or written."""


class CorruptRecordError(RecordError):
    """A record failed its CRC32C check or its length is impossible."""


class TruncatedRecordError(CorruptRecordError):
    """A file ended inside a record header or payload."""


class ExampleDecodeError(RecordError):
    """A record's bytes are not a valid tf.train.Example / SequenceExample.

    Garbage protobuf, an overlong varint, a wrong wire type, a non-UTF-8 key.
    """


class SchemaError(SparkgradError, ValueError):
    """A tf.train.Example does not match the parsing schema."""


class ModelError(SparkgradError):
    """A model was declared or used inconsistently (shapes, layers)."""


class OneDNNError(ModelError):
    """A oneDNN call failed; the message names the call and its status."""


class CheckpointError(ModelError):
    """A checkpoint could not be written, read or matched to the model."""


class NonFiniteLossError(ModelError):
    """The training loss became NaN or infinite; the message names the step and the batch row.

    Nothing of that batch is applied and fit saves no checkpoint after it. From the C loop it carries
    how far the run got: ``step`` (the model's step after the last good batch), ``steps`` and ``seen``
    (the good batches and rows of the call) and ``loss_sum`` (their loss).
    """


class ClusterError(SparkgradError):
    """The cluster could not be formed or run."""


class RendezvousTimeout(ClusterError, TimeoutError):
    """Not every node registered in time; the message names the missing ones."""


class NodeFailure(ClusterError):
    """A node died or raised; carries role, index, host and traceback."""


class InsufficientSlotsError(ClusterError):
    """Spark has fewer task slots than the cluster needs."""


class ProtocolError(SparkgradError):
    """A peer sent bytes that break the wire protocol."""


class AuthError(ProtocolError):
    """A peer failed the HMAC challenge."""


class FrameTooLargeError(ProtocolError):
    """A frame announced a length above the hard maximum."""


class PeerClosedError(ProtocolError):
    """The peer closed the connection in the middle of a frame."""


class RestError(SparkgradError):
    """A Databricks REST call failed.

    ``str(exc)`` says it all in words; the parts are attributes. It never carries the token, the
    client secret or a request body.

    Attributes:
        status (int | None): HTTP status of the last answer, None when none came.
        error_code (str): The API's error code (``"RESOURCE_DOES_NOT_EXIST"``), ``""`` when the body had none.
        message (str): The server's message.
        method (str): The HTTP method of the call.
        path (str): The API path of the call.
        attempts (int): Attempts made, retries included.
        retries (list): ``(status or None, reason, wait_s)`` of each retried attempt.
    """

    def __init__(
        self,
        text: str = "",
        *,
        status: int | None = None,
        error_code: str = "",
        message: str | None = None,
        method: str = "",
        path: str = "",
        attempts: int = 0,
        retries: list | None = None,
    ) -> None:
        super().__init__(text, status=status, error_code=error_code, method=method, path=path, attempts=attempts)
        self.retries = list(retries or [])  # (status or None, reason, wait_s) of each retried attempt
        self.message = text if message is None else message
        self.details["message"] = self.message

    def with_text(self, text: str) -> RestError:
        """The same failure (status, code, message, call, attempts, retries) told in other words."""
        return RestError(
            text, status=self.status, error_code=self.error_code, message=self.message, method=self.method,
            path=self.path, attempts=self.attempts, retries=self.retries,
        )  # fmt: skip


class NotebookError(SparkgradError):
    """A notebook run by sparkgrad.databricks failed.

    Carries ``path`` (the notebook), ``cell`` (its 1-based number, None
    before any cell ran), ``first_line`` (of that cell) and
    ``remote_traceback`` (the cell's traceback text, "" if none).
    """


class NotebookTimeout(NotebookError, SparkgradTimeout):
    """A notebook run exceeded its timeout; names the notebook and the cell it was in."""


class NotebookNotFoundError(NotebookError, SparkgradIOError):
    """A notebook to run names no file; ``missing`` is the file looked for.

    For the notebook a run starts with, ``path`` is that file and ``cell``
    None; for ``%run`` or ``dbutils.notebook.run`` of a missing notebook,
    ``path`` and ``cell`` name the calling notebook and its cell.
    """


class InputNotFoundError(SparkgradIOError, FileNotFoundError):
    """A notebook's input location is missing or empty.

    Carries ``path`` (the location, as the notebook names it) and ``made_by``
    (the notebook or command that writes it, to run first).
    """


__all__ = [name for name, obj in globals().items() if isinstance(obj, type) and issubclass(obj, SparkgradError)]
