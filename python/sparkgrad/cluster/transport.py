"""The C transport of the cluster layer (csrc/net, bound in sparkgrad._core).

Listener, RendezvousServer and ControlClient are implemented in C (see
docs/design/net.md); this module only finds them, so that an extension built
without the transport fails with one clear message instead of an
AttributeError deep inside a Spark task.
"""

from __future__ import annotations

from types import ModuleType

from sparkgrad.errors import ClusterError


def net() -> ModuleType:
    """sparkgrad._core, checked to carry the cluster transport."""
    from sparkgrad import _core

    missing = [name for name in ("Listener", "RendezvousServer", "ControlClient") if not hasattr(_core, name)]
    if missing:
        raise ClusterError(
            f"sparkgrad._core was built without the cluster transport (missing {', '.join(missing)}); "
            "rebuild sparkgrad from a tree that has csrc/net"
        )
    return _core
