"""Loads sparkgrad._core and the native libraries it needs, or says exactly why not.

sparkgrad arrives in one of three layouts, told apart by what lies beside
the package:

- **wheel** (``make wheel``, repaired by auditwheel): oneDNN, GNU OpenMP,
  cJSON, libcrypto and ISA-L sit in ``site-packages/sparkgrad.libs`` under mangled
  sonames, and the extension's RPATH finds them. Nothing is preloaded, so the
  process maps exactly one OpenMP runtime: the one oneDNN and the extension
  share.
- **egg** (``make egg``, for Databricks runtimes that attach eggs): the
  package is imported from a zip archive, from which no shared library can be
  loaded. The extension and ``sparkgrad.libs`` are extracted once into a cache
  directory named by their CRC-32s (so a changed egg gets a fresh copy and
  concurrent Python workers share one), keeping the wheel's relative layout
  so the same RPATH applies, and the extension is loaded from there.
- **source** (in-tree builds, ``pip install .``): the extension links
  ``libdnnl.so.3`` of the onednn-cpu-gomp wheel, which pip puts under the
  environment's prefix. The extension's RUNPATH covers a plain site-packages
  install; otherwise the library is preloaded from where the distribution's
  RECORD puts it, read from the first sys.path directory that has it (what
  importlib.metadata would find, without it: on a Spark executor sys.path
  starts with pyspark.zip and py4j's zip, and importlib.metadata lists every
  member of those archives, which cost 0.1-0.2 s of every node's start).

Any failure to load becomes one NativeLibraryError naming the extension file,
the library that could not be loaded and what to do about it.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import os
import re
import sys
import tempfile
import zipimport
from types import ModuleType

DISTRIBUTION = "onednn_cpu_gomp"  # the wheel's dist-info prefix (name normalised as pip writes it)
LIBRARY = "libdnnl.so.3"
ONEDNN_REQUIREMENT = "onednn-cpu-gomp==2023.2.0"
MODULE = "sparkgrad._core"
LIBS_DIR = "sparkgrad.libs"  # where auditwheel repair puts the vendored libraries

WHEEL, EGG, SOURCE = "wheel", "egg", "source"

# What provides a library that a layout does not carry, and how to get it.
_SYSTEM_PACKAGES = {
    "libstdc++.so.6": "libstdc++6",
    "libgcc_s.so.1": "libgcc-s1",
    "libz.so.1": "zlib1g",
    "libgomp.so.1": "libgomp1",
    "libcjson.so.1": "libcjson1",
    "libcrypto.so.3": "libssl3",
    "libisal.so.2": "libisal2",
}


def _package_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))


def _egg_archive() -> str | None:
    """The zip archive sparkgrad is imported from, if it is one."""
    loader = globals().get("__loader__")
    if isinstance(loader, zipimport.zipimporter):
        return loader.archive
    return None


def layout() -> str:
    """WHEEL, EGG or SOURCE: how this copy of sparkgrad carries its native code."""
    if _egg_archive() is not None:
        return EGG
    if os.path.isdir(os.path.join(_package_dir(), os.pardir, LIBS_DIR)):
        return WHEEL
    return SOURCE


# -- source builds: oneDNN from the onednn-cpu-gomp wheel --------------------------------


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
    """Make libdnnl.so.3 resolvable for a source build of sparkgrad._core (idempotent)."""
    path = _onednn_path()
    if path is not None:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


# -- eggs: extract the extension and its libraries once ----------------------------------


def _private_dir(path: str) -> str:
    """``path`` created 0700 if missing, refused unless it is a directory of ours that others cannot write."""
    import stat

    from sparkgrad.errors import NativeLibraryError

    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise NativeLibraryError(
            f"{path}: refusing to load native code from a directory that is not this user's own or that others "
            "can write; set SPARKGRAD_EXTRACT_DIR to a private directory",
            path=path,
        )
    return path


def _cache_root() -> str:
    """SPARKGRAD_EXTRACT_DIR, else PYTHON_EGG_CACHE, else the user's cache directory (else a private temp dir)."""
    for var in ("SPARKGRAD_EXTRACT_DIR", "PYTHON_EGG_CACHE"):
        if os.environ.get(var):
            return os.environ[var]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = os.path.join(base, "sparkgrad", "native")
    try:
        os.makedirs(root, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    return _private_dir(os.path.join(tempfile.gettempdir(), f"sparkgrad-native-{os.getuid()}"))


STALE_STAGING_SECONDS = 3600.0  # an .extract-* directory this old was left by a process that died mid-way


def _complete(target: str, members: list) -> bool:
    """Whether ``target`` holds every member at its size (a cleaner may have removed files since)."""
    for info in members:
        try:
            if os.path.getsize(os.path.join(target, info.filename)) != info.file_size:
                return False
        except OSError:
            return False
    return True


def _sweep_stale(root: str) -> None:
    import shutil
    import time

    now = time.time()
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith((".extract-", ".stale-")):
            try:
                if now - os.path.getmtime(path) > STALE_STAGING_SECONDS or name.startswith(".stale-"):
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:
                pass


def _extract_members(egg, members: list, root: str, target: str) -> None:
    """Extracts ``members`` into ``target`` under an exclusive lock: staged, then renamed into place.

    The lock (root/.lock) makes concurrent Python workers of one executor wait
    for one extraction instead of each writing a 60 MB copy; the staging
    directory is removed on any failure, and a ``target`` found incomplete is
    moved aside and extracted again.
    """
    import fcntl
    import shutil

    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held until the file closes (or the process dies)
        if _complete(target, members):
            return
        _sweep_stale(root)
        if os.path.exists(target):
            os.rename(target, os.path.join(root, f".stale-{os.getpid()}-{os.path.basename(target)}"))
        staging = tempfile.mkdtemp(prefix=".extract-", dir=root)
        try:
            for info in members:
                egg.extract(info, staging)
            os.chmod(staging, 0o755)  # mkdtemp's 0700 would shut out other users of a shared PYTHON_EGG_CACHE
            os.rename(staging, target)
        finally:
            if os.path.exists(staging):
                shutil.rmtree(staging, ignore_errors=True)


def _extract_egg(archive: str) -> str:
    """Extracts the extension for this interpreter and sparkgrad.libs; returns the extension's path."""
    import zipfile  # only eggs need it
    import zlib

    from sparkgrad.errors import NativeLibraryError

    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    root = _cache_root()
    try:
        with zipfile.ZipFile(archive) as egg:
            infos = egg.infolist()
            exts = [i for i in infos if re.fullmatch(r"sparkgrad/_core\.[^/]*so", i.filename)]
            ext = next((i for i in exts if any(i.filename.endswith("/_core" + s) for s in suffixes)), None)
            if ext is None:
                found = ", ".join(os.path.basename(i.filename) for i in exts) or "no extension at all"
                raise NativeLibraryError(
                    f"{archive}: this egg holds {found}, none of which Python "
                    f"{sys.version_info.major}.{sys.version_info.minor} can load (it looks for _core{suffixes[0]}); "
                    f"attach the egg built for this Python (sparkgrad-<version>-py{sys.version_info.major}."
                    f"{sys.version_info.minor}-linux-x86_64.egg) or install the wheel",
                    path=archive,
                    library=f"_core{suffixes[0]}",
                )
            members = [ext] + [i for i in infos if i.filename.startswith(LIBS_DIR + "/") and not i.is_dir()]
            key = hashlib.sha256(repr([(i.filename, i.CRC, i.file_size) for i in members]).encode()).hexdigest()
            target = os.path.join(root, f"{os.path.basename(archive)}-{key[:16]}")
            if not _complete(target, members):
                _extract_members(egg, members, root, target)
    except (OSError, zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise NativeLibraryError(
            f"{archive}: cannot extract the native extension into {root}: {type(exc).__name__}: {exc}; "
            "set SPARKGRAD_EXTRACT_DIR to a writable directory on a file system that allows executables"
            f"{'' if os.path.exists(archive) else ' (the egg itself is gone)'}",
            path=archive,
        ) from None
    return os.path.join(target, ext.filename)


def _load_extension(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[MODULE]
        raise
    return module


# -- loading, and saying why it failed ----------------------------------------------------


def _extension_file(where: str) -> str:
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    for suffix in suffixes:
        path = os.path.join(where, "_core" + suffix)
        if os.path.exists(path):
            return path
    return os.path.join(where, "_core" + suffixes[0])


def _glibc() -> str:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or "unknown"
    except (ValueError, OSError):
        return "unknown"


def _missing_library(text: str) -> str | None:
    """The library a dynamic linker message says it could not open, if it says one."""
    found = re.match(r"([^\s:]+\.so[.\d]*): cannot open shared object file", text)
    return found.group(1) if found else None


def _explain(text: str, kind: str, path: str) -> str:
    """What went wrong loading ``path`` (the linker's message ``text``) and what to do, for layout ``kind``."""
    where = os.path.dirname(path)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not os.path.exists(path):
        names = os.listdir(where) if os.path.isdir(where) else []
        built = sorted(n for n in names if n.startswith("_core.") and n.endswith(".so"))
        return (
            f"{path} does not exist: this sparkgrad was not built for Python {py}"
            f"{f' (it has {built})' if built else ''}; install the wheel for cp{py.replace('.', '')} "
            "(pip install sparkgrad) or build it for this interpreter (make build)"
        )
    version = re.search(r"version `([^']+)' not found \(required by ([^)]+)\)", text)
    if version is not None and version.group(1).startswith("GLIBC_"):
        return (
            f"{path}: {version.group(2)} needs {version.group(1)}, which this system lacks "
            f"(glibc {_glibc()}): sparkgrad's wheels need glibc 2.34 or newer (Ubuntu 22.04, Debian 12, "
            "Databricks Runtime 13.3 LTS and later)"
        )
    if version is not None:
        owner = text.split(":", 1)[0]
        return (
            f"{path} could not be loaded: {version.group(2)} needs {version.group(1)}, which {owner} lacks "
            f"({text}); install a newer {os.path.basename(owner)} or reinstall sparkgrad"
        )
    if "failed to map segment" in text:
        return (
            f"{path} could not be loaded: {text}; its directory is on a file system that forbids executable "
            "mappings (noexec): set SPARKGRAD_EXTRACT_DIR (eggs) or install sparkgrad on another file system"
        )
    lib = _missing_library(text)
    if lib is None:
        return f"{path} could not be loaded: {text}"
    if kind == SOURCE and lib == LIBRARY:
        fix = f"pip install {ONEDNN_REQUIREMENT} (the oneDNN runtime this build links)"
    elif lib in _SYSTEM_PACKAGES:
        fix = f"install the system package that provides it (Debian/Ubuntu: apt-get install {_SYSTEM_PACKAGES[lib]})"
        if kind != SOURCE:
            fix += " or reinstall sparkgrad (pip install --force-reinstall sparkgrad)"
    elif kind != SOURCE:
        fix = f"the copy in {os.path.join(where, os.pardir, LIBS_DIR)} is missing or damaged: reinstall sparkgrad"
    else:
        fix = "install the library or rebuild sparkgrad (make build)"
    return f"{path} could not be loaded: {lib} was not found ({text}); {fix}"


def load_core() -> ModuleType:
    """Loads sparkgrad._core for this layout (idempotent); raises NativeLibraryError if it cannot."""
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    from sparkgrad.errors import NativeLibraryError

    kind = layout()
    path = _extract_egg(_egg_archive() or "") if kind == EGG else _extension_file(_package_dir())
    try:
        if kind == EGG:
            return _load_extension(path)
        if kind == SOURCE:
            preload_onednn()  # an OSError here is the same dynamic linker message, about libdnnl's own needs
        return importlib.import_module(MODULE)
    except (ImportError, OSError) as exc:
        text = str(exc)
        raise NativeLibraryError(
            _explain(text, kind, path), path=path, library=_missing_library(text), layout=kind
        ) from None


def mapped_libraries() -> dict[str, str]:
    """The native libraries this process has mapped that sparkgrad uses: {file name: path}."""
    wanted = ("libdnnl", "libgomp", "libiomp", "libomp", "libcjson", "libcrypto", "libisal", "libcurl")
    found: dict[str, str] = {}
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
        path = fields[5] if len(fields) == 6 else ""
        name = os.path.basename(path)
        for stem in wanted:
            if name.startswith(stem) and ".so" in name:
                found.setdefault(name, path)
    return found
