"""sparkgrad: distributed neural-network training on Apache Spark and Databricks.

The C core (``sparkgrad._core``) reads TFRecords, trains networks on oneDNN and
runs the cluster transport; this package is its Python face, shaped like
TensorFlowOnSpark (``TFCluster``, ``TFNode``, ``ctx``, ``DataFeed``).
"""

from typing import TYPE_CHECKING

from sparkgrad._native import load_core as _load_core

_load_core()  # first: anything below may use sparkgrad._core; a failure names the library and the fix

from sparkgrad import TFCluster, TFNode, local  # noqa: E402
from sparkgrad._version import __version__  # noqa: E402
from sparkgrad.cluster.roles import InputMode  # noqa: E402
from sparkgrad.errors import (  # noqa: E402
    AuthError,
    ClusterError,
    CorruptRecordError,
    InsufficientSlotsError,
    NativeLibraryError,
    NodeFailure,
    ProtocolError,
    RecordError,
    RendezvousTimeout,
    RestError,
    SchemaError,
    SparkgradError,
    TruncatedRecordError,
)

if TYPE_CHECKING:  # loaded on first use by __getattr__ below; named here for type checkers and the API reference
    from sparkgrad.nn.distributed import DistributedOptimizer
    from sparkgrad.runner import HorovodRunner, run


def build_info() -> dict:
    """Versions of sparkgrad and of the libraries its C core runs on, and where those were loaded from.

    ``layout`` is how this copy carries its native code ("wheel": vendored in
    sparkgrad.libs; "egg": extracted from the egg; "source": a local build
    linking the onednn-cpu-gomp wheel); ``libraries`` maps each native
    library the process has mapped (oneDNN, OpenMP, cJSON, libcrypto,
    libcurl once used) to its path.
    """
    from sparkgrad import _core, _native

    info = _core.build_info()
    info["layout"] = _native.layout()
    info["libraries"] = _native.mapped_libraries()
    return info


_LAZY = {"run": "run", "HorovodRunner": "HorovodRunner"}  # sparkgrad.runner: loaded on first use


def __getattr__(name: str):
    if name in _LAZY:
        from sparkgrad import runner

        return getattr(runner, _LAZY[name])
    if name == "DistributedOptimizer":
        from sparkgrad.nn.distributed import DistributedOptimizer

        return DistributedOptimizer
    if name == "hvd":
        import importlib

        return importlib.import_module("sparkgrad.hvd")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "__version__",
    "run",
    "HorovodRunner",
    "DistributedOptimizer",
    "build_info",
    "TFCluster",
    "TFNode",
    "InputMode",
    "local",
    "SparkgradError",
    "RecordError",
    "CorruptRecordError",
    "TruncatedRecordError",
    "SchemaError",
    "ClusterError",
    "RendezvousTimeout",
    "NodeFailure",
    "InsufficientSlotsError",
    "NativeLibraryError",
    "ProtocolError",
    "AuthError",
    "RestError",
]
