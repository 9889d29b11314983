"""Loads sparkgrad._core after making sure its oneDNN is reachable.

The extension needs libdnnl.so.3 from the onednn-cpu-gomp wheel, which pip puts
under the environment's prefix (<prefix>/lib). The extension's RUNPATH covers a
normal site-packages install; for in-tree builds, --user installs and
Databricks' library paths the library is preloaded from the location the
installed distribution records, so the dynamic linker resolves the extension's
dependency by soname.
"""

from __future__ import annotations

import ctypes
import importlib.metadata as metadata
import os


def _onednn_path() -> str | None:
    try:
        files = metadata.distribution("onednn-cpu-gomp").files or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "libdnnl.so.3":
            path = os.path.realpath(f.locate())
            if os.path.exists(path):
                return path
    return None


def preload_onednn() -> None:
    """Make libdnnl.so.3 resolvable for sparkgrad._core (idempotent)."""
    path = _onednn_path()
    if path is not None:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
