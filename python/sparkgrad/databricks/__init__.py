"""sparkgrad on Databricks: the REST client and its configuration.

    from sparkgrad.databricks import Client
    client = Client()                       # DATABRICKS_HOST/TOKEN, ~/.databrickscfg, or the notebook
    client.workspace_import("/Users/me/train", source, overwrite=True)

Names load on first use, so ``import sparkgrad`` stays light.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Client": "sparkgrad.databricks.client",
    "notebook_job": "sparkgrad.databricks.client",
    "Config": "sparkgrad.databricks.config",
    "resolve_config": "sparkgrad.databricks.config",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
