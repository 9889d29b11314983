"""sparkgrad: distributed neural-network training on Apache Spark and Databricks.

The C core (``sparkgrad._core``) reads TFRecords, trains networks on oneDNN and
runs the cluster transport; this package is its Python face, shaped like
TensorFlowOnSpark (``TFCluster``, ``TFNode``, ``ctx``, ``DataFeed``).
"""

from sparkgrad._native import preload_onednn as _preload_onednn

_preload_onednn()  # first: anything below may load sparkgrad._core, which links libdnnl.so.3

from sparkgrad import TFCluster, TFNode, local  # noqa: E402
from sparkgrad._version import __version__  # noqa: E402
from sparkgrad.cluster.roles import InputMode  # noqa: E402
from sparkgrad.errors import (  # noqa: E402
    AuthError,
    ClusterError,
    CorruptRecordError,
    InsufficientSlotsError,
    NodeFailure,
    ProtocolError,
    RecordError,
    RendezvousTimeout,
    RestError,
    SchemaError,
    SparkgradError,
    TruncatedRecordError,
)


def build_info() -> dict:
    """Versions of sparkgrad and of the libraries its C core runs on."""
    from sparkgrad import _core

    return _core.build_info()


__all__ = [
    "__version__",
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
    "ProtocolError",
    "AuthError",
    "RestError",
]
