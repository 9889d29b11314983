"""Loads sparkgrad._core after making sure its oneDNN is reachable.

The extension needs libdnnl.so.3 from the onednn-cpu-gomp wheel, which pip puts
under the environment's prefix (<prefix>/lib). The extension's RUNPATH covers a
normal site-packages install; for in-tree builds, --user installs and
Databricks' library paths the library is preloaded from the location the
installed distribution records, so the dynamic linker resolves the extension's
dependency by soname.

The distribution is looked up by reading its ``RECORD`` in the first sys.path
directory that has it, which is what importlib.metadata would find, without
importlib.metadata: on a Spark executor sys.path starts with pyspark.zip and
py4j's zip, and importlib.metadata lists every member of those archives, which
cost 0.1-0.2 s of every node's start.
"""

from __future__ import annotations

import ctypes
import os
import sys

DISTRIBUTION = "onednn_cpu_gomp"  # the wheel's dist-info prefix (name normalised as pip writes it)
LIBRARY = "libdnnl.so.3"


def _recorded_library(site_dir: str, info_dir: str) -> str | None:
    """The library's path as the distribution's RECORD lists it (relative to site_dir), if present."""
    try:
        with open(os.path.join(site_dir, info_dir, "RECORD"), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        path = line.split(",", 1)[0]
        if os.path.basename(path) == LIBRARY:
            full = os.path.realpath(os.path.join(site_dir, path))
            if os.path.exists(full):
                return full
    return None


def _is_distribution(info_dir: str) -> bool:
    """Whether a "<name>-<version>.dist-info" directory belongs to DISTRIBUTION (name normalised as PEP 503)."""
    if not info_dir.endswith(".dist-info"):
        return False
    name = info_dir[: -len(".dist-info")].rpartition("-")[0]
    return name.lower().replace("-", "_").replace(".", "_") == DISTRIBUTION


def _onednn_path() -> str | None:
    for entry in sys.path:
        site_dir = entry or os.getcwd()
        try:
            names = os.listdir(site_dir)  # zip archives and missing entries raise: they hold no wheel's files
        except OSError:
            continue
        for name in names:
            if _is_distribution(name):
                found = _recorded_library(site_dir, name)
                if found is not None:
                    return found
    return None


def preload_onednn() -> None:
    """Make libdnnl.so.3 resolvable for sparkgrad._core (idempotent)."""
    path = _onednn_path()
    if path is not None:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
