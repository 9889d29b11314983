"""Build configuration shared by setup.py, the Makefile and CI.

    python .ci/buildcfg.py requirements EXTRA...   pip requirement lines read
                                                   from pyproject.toml ("build"
                                                   means [build-system].requires,
                                                   "runtime" the dependencies)
    python .ci/buildcfg.py cflags | libs           compiler / linker flags for
                                                   oneDNN, libcurl, cJSON, zlib,
                                                   ISA-L

oneDNN comes from PyPI (onednn-cpu-gomp / onednn-devel-cpu-gomp 2023.2.0,
oneDNN 3.2 on the GNU OpenMP runtime); its wheels put headers and libdnnl.so.3
under the installing environment's prefix, found here through the installed
distributions' file lists.

The runtime dependencies are listed here once (pyproject.toml declares them
dynamic): a build from source also declares ONEDNN_REQUIREMENT, while a wheel
built for release (``make wheel``, SPARKGRAD_BUNDLED_LIBS=1) carries oneDNN in
``sparkgrad.libs`` after ``auditwheel repair`` and must not pull in a second
copy of it.
"""

from __future__ import annotations

import importlib.metadata as metadata
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
ONEDNN_RUNTIME = "onednn-cpu-gomp"
ONEDNN_DEVEL = "onednn-devel-cpu-gomp"
ONEDNN_REQUIREMENT = f"{ONEDNN_RUNTIME}==2023.2.0"
RUNTIME_DEPENDENCIES = ["numpy>=1.21", "tqdm>=4.60"]
# libcurl is not linked: csrc/rest opens it with dlopen when it is first used.
# libfarmhash (Debian's libfarmhash-dev, a C++ library that needs only libc) gives Hashing FarmHash's
# Fingerprint64, as TensorFlow's to_hash_bucket_fast; a release wheel carries libfarmhash.so.0.
SYSTEM_LIBS = ["cjson", "crypto", "farmhash", "z", "m", "pthread", "dl"]
# ISA-L's igzip (Debian's libisal-dev) inflates GZIP / ZLIB records when its
# header is there at build time (HAVE_ISAL); zlib does otherwise. A release
# wheel carries libisal.so.2 (auditwheel vendors it). SPARKGRAD_NO_ISAL=1
# builds without it even where it is installed.
ISAL_HEADER = "isa-l/igzip_lib.h"
INCLUDE_DIRS = ["/usr/include", "/usr/local/include", "/usr/include/x86_64-linux-gnu"]


def have_isal() -> bool:
    import os

    if os.environ.get("SPARKGRAD_NO_ISAL", "") not in ("", "0"):
        return False
    return any((pathlib.Path(d) / ISAL_HEADER).is_file() for d in INCLUDE_DIRS)


def system_libs() -> list[str]:
    return (["isal"] if have_isal() else []) + SYSTEM_LIBS


def define_macros() -> list[tuple[str, str]]:
    return [("HAVE_ISAL", "1")] if have_isal() else []


def _pyproject() -> dict:
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def requirements(extras: list[str]) -> list[str]:
    project = _pyproject()
    optional = project["project"].get("optional-dependencies", {})
    out: list[str] = []
    for extra in extras:
        if extra == "build":
            out += project["build-system"]["requires"]
        elif extra == "runtime":
            out += install_requires(bundled=False)
        elif extra in optional:
            out += optional[extra]
        else:
            raise SystemExit(f"buildcfg: unknown extra {extra!r} (pyproject.toml has {sorted(optional)})")
    return out


def install_requires(bundled: bool) -> list[str]:
    """What the built package declares: oneDNN too unless the wheel carries it (``bundled``)."""
    return RUNTIME_DEPENDENCIES + ([] if bundled else [ONEDNN_REQUIREMENT])


def _locate(dist: str, suffix: str) -> pathlib.Path:
    try:
        files = metadata.distribution(dist).files or []
    except metadata.PackageNotFoundError:
        raise SystemExit(f"buildcfg: {dist} is not installed; install it with pip install {dist}==2023.2.0") from None
    for f in files:
        if str(f).endswith(suffix) and (f.name == suffix or str(f).endswith("/" + suffix)):
            return pathlib.Path(f.locate()).resolve()
    raise SystemExit(f"buildcfg: {dist} has no file ending in {suffix}")


def onednn_include_dir() -> str:
    header = _locate(ONEDNN_DEVEL, "include/oneapi/dnnl/dnnl.h")
    return str(header.parent.parent.parent)


def onednn_library_dir() -> str:
    return str(_locate(ONEDNN_RUNTIME, "libdnnl.so.3").parent)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "requirements":
        print("\n".join(requirements(rest)))
    elif cmd == "cflags":
        print(" ".join([f"-I{onednn_include_dir()}"] + [f"-D{k}={v}" for k, v in define_macros()]))
    elif cmd == "libs":
        libdir = onednn_library_dir()
        print(" ".join([f"-L{libdir}", f"-Wl,-rpath,{libdir}", "-ldnnl"] + [f"-l{lib}" for lib in system_libs()]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
