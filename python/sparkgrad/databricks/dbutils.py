"""A local ``dbutils`` for running Databricks notebooks off Databricks.

    widgets   text, dropdown, combobox, multiselect, get, getArgument, getAll, remove, removeAll
    fs        cp, mv, ls, mkdirs, rm, put, head
    notebook  run, exit
    secrets   get, getBytes (from environment variables)

``dbfs:/x``, ``/dbfs/x`` and bare ``/x`` all name ``<dbfs_root>/x`` (a bare
absolute path is a DBFS path to dbutils.fs, as on Databricks); ``file:/x`` is
the local ``/x``. Job parameters override widget defaults; every value is a
string. ``secrets.get(scope, key)`` reads ``SPARKGRAD_SECRET_<SCOPE>_<KEY>``
(upper case, other characters than letters and digits as ``_``).

Deliberately not here: ``dbutils.fs.mount``, ``dbutils.jobs.taskValues``,
``dbutils.library``, the notebook context (host, token). Python code opening
``/dbfs/...`` directly is not redirected: notebooks copy with dbutils.fs
(write locally, then copy), which is also what works best on Databricks.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sparkgrad.errors import InputNotFoundError, InvalidArgumentError, SparkgradIOError

HEAD_DEFAULT_BYTES = 65536


class NotebookExit(BaseException):  # noqa: N818 - a control-flow signal, not an error
    """Raised by dbutils.notebook.exit(value); the runner ends the run with ``value`` as its result.

    Derives from BaseException so that a notebook's ``except Exception`` does not swallow it.
    """

    def __init__(self, value: str) -> None:
        super().__init__(value)
        self.value = value


def _check_str(what: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{what} must be a string (Databricks passes every value as one), not {value!r}")
    return value


class Widgets:
    """dbutils.widgets: defaults declared by the notebook, overridden by the run's parameters."""

    def __init__(self, params: Mapping[str, str]) -> None:
        self._params = {_check_str("a parameter name", k): _check_str(f"parameter {k!r}", v) for k, v in params.items()}
        self._defaults: dict[str, str] = {}  # widget name -> its declared default

    def _define(
        self, name: str, default: str, choices: Sequence[str] | None, label: str | None, multi: bool = False
    ) -> None:
        _check_str("a widget name", name)
        _check_str(f"widget {name!r}'s defaultValue", default)
        options = None
        if choices is not None:
            options = tuple(_check_str(f"a choice of widget {name!r}", c) for c in choices)
            for value in [default] + ([self._params[name]] if name in self._params else []):
                for item in value.split(",") if multi else [value]:
                    if item not in options:
                        raise InvalidArgumentError(f"widget {name!r}: {item!r} is not one of its choices {options}")
        self._defaults[name] = default

    def text(self, name: str, defaultValue: str, label: str | None = None) -> None:  # noqa: N803 - Databricks' name
        self._define(name, defaultValue, None, label)

    def dropdown(self, name: str, defaultValue: str, choices: Sequence[str], label: str | None = None) -> None:  # noqa: N803
        self._define(name, defaultValue, choices, label)

    def combobox(self, name: str, defaultValue: str, choices: Sequence[str], label: str | None = None) -> None:  # noqa: N803
        self._define(name, defaultValue, None, label)  # a combobox also takes values outside its choices

    def multiselect(self, name: str, defaultValue: str, choices: Sequence[str], label: str | None = None) -> None:  # noqa: N803
        self._define(name, defaultValue, choices, label, multi=True)

    def get(self, name: str) -> str:
        """The run's parameter ``name`` if given, else the widget's default."""
        if name in self._params:
            return self._params[name]
        if name in self._defaults:
            return self._defaults[name]
        raise InvalidArgumentError(f"no widget named {name!r} is defined (and no parameter of that name was passed)")

    def getArgument(self, name: str, defaultValue: str | None = None) -> str | None:  # noqa: N802, N803
        """As get(), but ``defaultValue`` instead of an error for an unknown name (the deprecated form)."""
        if name in self._params or name in self._defaults:
            return self.get(name)
        return defaultValue

    def getAll(self) -> dict[str, str]:  # noqa: N802 - Databricks' name
        return {**self._defaults, **self._params}

    def remove(self, name: str) -> None:
        if self._defaults.pop(name, None) is None:
            raise InvalidArgumentError(f"no widget named {name!r} to remove")

    def removeAll(self) -> None:  # noqa: N802 - Databricks' name
        self._defaults.clear()


@dataclass(frozen=True)
class FileInfo:
    """An entry of dbutils.fs.ls: ``path`` in the form it was listed under; directories end with "/"."""

    path: str
    name: str
    size: int
    modificationTime: int  # noqa: N815 - Databricks' field name; milliseconds since the epoch


_ABS_DBFS = re.compile(r"^(dbfs:)?/+")


def _file_uri_path(path: str) -> str:
    """``file:/x`` (or ``file:///x``) -> ``/x``."""
    return os.path.normpath("/" + path[len("file:") :].lstrip("/"))


class FileSystem:
    """dbutils.fs over a local folder that stands for DBFS."""

    def __init__(self, dbfs_root: str) -> None:
        self.root = os.path.abspath(dbfs_root)

    def local_path(self, path: str) -> str:
        """The local file a dbutils.fs path names (see the module docstring for the mapping)."""
        _check_str("a path", path)
        if path.startswith("file:"):
            return _file_uri_path(path)
        if path == "/dbfs" or path.startswith("/dbfs/"):
            rel = path[len("/dbfs") :]
        elif path.startswith("dbfs:/") or path.startswith("/"):
            rel = _ABS_DBFS.sub("/", path)
        else:
            raise InvalidArgumentError(f"{path!r}: dbutils.fs paths are absolute (dbfs:/..., /dbfs/..., file:/...)")
        local = os.path.normpath(os.path.join(self.root, rel.lstrip("/")))
        if local != self.root and not local.startswith(self.root + os.sep):
            raise InvalidArgumentError(f"{path!r} leaves the DBFS root {self.root}")
        return local

    def _existing(self, path: str) -> str:
        local = self.local_path(path)
        if not os.path.lexists(local):
            raise SparkgradIOError(f"{path}: no such file or directory (local {local})", path=path)
        return local

    def cp(self, from_: str, to: str, recurse: bool = False) -> bool:
        src, dst = self._existing(from_), self.local_path(to)
        if os.path.isdir(src):
            if not recurse:
                raise SparkgradIOError(f"{from_} is a directory: pass recurse=True to copy it", path=from_)
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            if os.path.isdir(dst):
                dst = os.path.join(dst, os.path.basename(src))
            os.makedirs(os.path.dirname(dst), exist_ok=True)  # dst is absolute
            shutil.copyfile(src, dst)
        return True

    def mv(self, from_: str, to: str, recurse: bool = False) -> bool:
        src, dst = self._existing(from_), self.local_path(to)
        if os.path.isdir(src) and not recurse:
            raise SparkgradIOError(f"{from_} is a directory: pass recurse=True to move it", path=from_)
        os.makedirs(os.path.dirname(dst), exist_ok=True)  # dst is absolute
        shutil.move(src, dst)
        return True

    def ls(self, path: str) -> list[FileInfo]:
        local = self._existing(path)
        prefix = path.rstrip("/")
        if not os.path.isdir(local):
            st = os.stat(local)
            return [FileInfo(path, os.path.basename(local), st.st_size, int(st.st_mtime * 1000))]
        out = []
        for name in sorted(os.listdir(local)):
            full = os.path.join(local, name)
            st = os.stat(full)
            is_dir = os.path.isdir(full)
            shown = name + "/" if is_dir else name
            out.append(FileInfo(f"{prefix}/{shown}", shown, 0 if is_dir else st.st_size, int(st.st_mtime * 1000)))
        return out

    def mkdirs(self, path: str) -> bool:
        os.makedirs(self.local_path(path), exist_ok=True)
        return True

    def rm(self, path: str, recurse: bool = False) -> bool:
        """False if nothing was there (as on Databricks); a directory needs recurse=True."""
        local = self.local_path(path)
        if not os.path.lexists(local):
            return False
        if os.path.isdir(local) and not os.path.islink(local):
            if not recurse:
                raise SparkgradIOError(f"{path} is a directory: pass recurse=True to delete it", path=path)
            shutil.rmtree(local)
        else:
            os.unlink(local)
        return True

    def put(self, file: str, contents: str, overwrite: bool = False) -> bool:
        local = self.local_path(file)
        if os.path.exists(local) and not overwrite:
            raise SparkgradIOError(f"{file} exists: pass overwrite=True to replace it", path=file)
        os.makedirs(os.path.dirname(local), exist_ok=True)
        with open(local, "w", encoding="utf-8") as f:
            f.write(_check_str("contents", contents))
        return True

    def head(self, file: str, maxBytes: int = HEAD_DEFAULT_BYTES) -> str:  # noqa: N803 - Databricks' name
        with open(self._existing(file), "rb") as f:
            return f.read(int(maxBytes)).decode("utf-8", errors="replace")


class NotebookWorkflow:
    """dbutils.notebook: ``run`` starts a child notebook in the same runner; ``exit`` ends this one."""

    def __init__(self, run_child: Callable[[str, float, Mapping[str, str]], str | None]) -> None:
        self._run_child = run_child

    def run(self, path: str, timeout_seconds: float, arguments: Mapping[str, str] | None = None) -> str | None:
        """Runs the notebook at ``path`` (relative to this one's folder) with ``arguments`` as its widget
        values; returns its dbutils.notebook.exit value (None if it did not call exit).
        ``timeout_seconds`` 0 means no limit of its own (the parent's still applies)."""
        return self._run_child(_check_str("the notebook path", path), float(timeout_seconds), dict(arguments or {}))

    def exit(self, value: str) -> None:
        raise NotebookExit(_check_str("dbutils.notebook.exit's value (use json.dumps for structures)", value))


def secret_variable(scope: str, key: str) -> str:
    """The environment variable from which the local runner's ``dbutils.secrets.get(scope, key)`` reads.

    ``SPARKGRAD_SECRET_<SCOPE>_<KEY>``, upper case, every character other than a letter or a digit
    written as ``_``: ``secret_variable("ml-prod", "api.token")`` is ``"SPARKGRAD_SECRET_ML_PROD_API_TOKEN"``.
    """
    return "SPARKGRAD_SECRET_" + re.sub(r"[^A-Za-z0-9]", "_", f"{scope}_{key}").upper()


class Secrets:
    """dbutils.secrets from environment variables (see secret_variable)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ

    def get(self, scope: str, key: str) -> str:
        name = secret_variable(scope, key)
        if name not in self._environ:
            raise InvalidArgumentError(f"secret {key!r} of scope {scope!r} is not set: export {name}=... to provide it")
        return self._environ[name]

    def getBytes(self, scope: str, key: str) -> bytes:  # noqa: N802 - Databricks' name
        return self.get(scope, key).encode("utf-8")


@dataclass(frozen=True)
class DBUtils:
    """The ``dbutils`` object a notebook sees."""

    widgets: Widgets
    fs: FileSystem
    notebook: NotebookWorkflow
    secrets: Secrets


def _is_missing(exc: BaseException) -> bool:
    """Whether a dbutils.fs failure says the path does not exist (here: SparkgradIOError, a FileNotFoundError;
    on Databricks: an ExecutionError whose text carries java.io.FileNotFoundException)."""
    text = str(exc)
    return (
        isinstance(exc, FileNotFoundError)
        or (isinstance(exc, SparkgradIOError) and "no such file or directory" in text)
        or "FileNotFoundException" in text
    )


def require_input(dbutils: object, path: str, made_by: str) -> list:
    """The entries of ``path`` (``dbutils.fs.ls``), which a notebook reads as its input.

    A notebook calls it before it reads a location that another step writes, so that a run in the
    wrong order says what to run first instead of failing deep inside a copy.

    Args:
        dbutils: the notebook's ``dbutils`` (Databricks' or the local runner's).
        path: the input location, as the notebook names it (``dbfs:/...``, ``/Volumes/...``, ``file:/...``).
        made_by: what writes it, e.g. ``"notebooks/10_prep (its output_data)"``.

    Returns:
        The listing of ``path``.

    Raises:
        InputNotFoundError: ``path`` does not exist or is an empty folder; the message names ``made_by``.
    """
    try:
        entries = dbutils.fs.ls(path)  # type: ignore[attr-defined]
    except Exception as exc:
        if not _is_missing(exc):
            raise
        raise InputNotFoundError(
            f"{path} does not exist: it is written by {made_by}; run that first", path=path, made_by=made_by
        ) from None
    if not entries:
        raise InputNotFoundError(
            f"{path} is empty: it is written by {made_by}; run that first", path=path, made_by=made_by
        )
    return entries


def fuse_path(dbutils: object, path: str) -> str:
    """The file path every node of the cluster (driver and executors) opens for a dbutils.fs path.

    On Databricks: ``dbfs:/x`` and ``/x`` are ``/dbfs/x`` (the FUSE view on every node), ``/dbfs/...``
    and ``/Volumes/...`` stay as they are, and ``file:/x`` is ``/x`` (the local disk of one machine).
    Under the local runner (``dbutils`` is the runner's), the same mapping as its dbutils.fs: the
    local DBFS folder stands for ``/dbfs``. Read through the path freely; write locally and copy
    whole files to it.

    Args:
        dbutils: The notebook's ``dbutils`` (Databricks' or the local runner's).
        path: A path as dbutils.fs takes it.

    Raises:
        InvalidArgumentError: ``path`` is not a string or not absolute.
    """
    fs = getattr(dbutils, "fs", None)
    if isinstance(fs, FileSystem):
        return fs.local_path(path)
    _check_str("a path", path)
    if path.startswith("file:"):
        return _file_uri_path(path)
    if path.startswith("dbfs:"):
        return "/dbfs/" + path[len("dbfs:") :].lstrip("/")
    if path.startswith(("/dbfs/", "/Volumes/")) or path == "/dbfs":
        return path
    if path.startswith("/"):
        return "/dbfs" + path
    raise InvalidArgumentError(f"{path!r}: expected an absolute path (dbfs:/..., /dbfs/..., /Volumes/..., file:/...)")
