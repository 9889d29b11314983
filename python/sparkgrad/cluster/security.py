"""What protects the frames of a cluster's connections after the handshake: the ``security=`` argument.

Every connection of a cluster (rendezvous, parameter servers, data feed,
allreduce ring) starts with a mutual HMAC handshake on the cluster's secret.
What follows depends on the mode, which every node of a cluster shares:

- ``"auth"``: every frame carries a sequence number and a Poly1305 tag
  (ChaCha20-Poly1305 given the whole frame as associated data) over its
  header and payload, so an injected, altered, replayed, reordered or
  truncated frame is refused and named (peer, frame type, sequence number);
  payloads travel in clear.
- ``"encrypt"``: the same, with the payload encrypted too (AES-256-GCM).
- ``"none"``: frames travel unprotected after the handshake; an explicit
  opt-out for trusted networks, logged as a warning.

The default (``default()``: the C core's ``_core.SECURITY_DEFAULT``, "auth")
is the mode the security benchmark (bench/bench_security.py; the documentation's
"Security and the wire" page) showed to cost least; ``SPARKGRAD_SECURITY``
in the environment overrides it for a whole session.
"""

from __future__ import annotations

import logging
import os

from sparkgrad.errors import InvalidArgumentError

logger = logging.getLogger("sparkgrad.security")

MODES = ("none", "auth", "encrypt")
ENV = "SPARKGRAD_SECURITY"


def default() -> str:
    """The mode used when no ``security=`` is given: ``$SPARKGRAD_SECURITY``, else the C core's default."""
    from sparkgrad.cluster.transport import net

    return os.environ.get(ENV) or str(net().SECURITY_DEFAULT)


def resolve(security: str | None, what: str = "the cluster", warn: bool = True) -> str:
    """Checks ``security`` (None: the default) and returns the mode; ``"none"`` logs a warning naming ``what``."""
    mode = default() if security is None else security
    if not isinstance(mode, str) or mode not in MODES:
        source = f"${ENV}" if security is None else "security"
        raise InvalidArgumentError(f"{source} must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    if mode == "none" and warn:
        logger.warning(
            "security='none' for %s: after the handshake its frames travel without integrity protection, so "
            "anyone on the network path can alter or inject them; use it only on a network you trust",
            what,
        )
    return mode
