"""A local stand-in for a Databricks workspace's REST API, for tests.

A real HTTP server (http.server.ThreadingHTTPServer on 127.0.0.1, port 0)
speaking plain HTTP: loopback only, so the client is built with
``allow_http_loopback=True`` (it refuses http:// otherwise); with
``tls=(cert, key)`` it serves HTTPS instead (the TLS verification tests). It checks what
the documented API checks, as far as sparkgrad uses it:

- ``Authorization: Bearer <token>`` on every /api/ call (401 without, 403 for
  an unknown or expired token); OAuth M2M at POST /oidc/v1/token (HTTP Basic
  client id + secret, grant_type=client_credentials) issuing expiring tokens,
  its discovery document at /oidc/.well-known/oauth-authorization-server and
  the host metadata at /.well-known/databricks-config;
- paths and methods (404 ENDPOINT_NOT_FOUND otherwise), required fields
  (400 INVALID_PARAMETER_VALUE), malformed JSON (400 MALFORMED_REQUEST);
- limits: DBFS put / add-block 1 MB after base64 decoding
  (MAX_BLOCK_SIZE_EXCEEDED), workspace import 10 MB (MAX_NOTEBOOK_SIZE_EXCEEDED);
- error bodies ``{"error_code", "message"}`` with the API's statuses
  (RESOURCE_DOES_NOT_EXIST 404, RESOURCE_ALREADY_EXISTS 400, ...; the Files
  API's NOT_FOUND 404 / ALREADY_EXISTS 409).

State: DBFS files and directories (streams invisible until close), Files API
volumes, workspace notebooks/files/directories, clusters (TERMINATED ->
PENDING -> RUNNING), libraries (PENDING -> INSTALLING -> INSTALLED, or FAILED
when the file is missing), jobs and runs. A run moves PENDING -> RUNNING ->
TERMINATED one step per runs/get (``run_steps`` gets per state); on its last
step the notebook's source is executed with a small ``dbutils`` (widgets from
base_parameters / notebook_params, ``notebook.exit``): its exit value becomes
``notebook_output.result``, an exception makes the run FAILED (its
traceback is ``error_trace``), a missing notebook FAILED with "Notebook not
found: <path>". A run-now while the job already has ``max_concurrent_runs``
active runs is SKIPPED at once (queueing is not modelled). ``state()`` is a
deep copy of all of it, to compare before and after calls that should change
nothing.

Faults: ``inject(pattern, status=429, retry_after="1")``, ``status=503``,
``delay=2.0`` (answer late), ``drop=True`` (read the request, close without
answering), ``drop_after=n`` (read n bytes of the body, then close: an upload
cut mid-way), each for ``times`` matching requests. A request whose body
ends before its Content-Length (the client went away) changes nothing, as
on the service: a Files API PUT or a workspace import is applied whole or
not at all. ``end_runs(outcome)`` makes the next runs end TIMEDOUT,
CANCELED or SKIPPED, with the states the Jobs API reports for them.

Pages: jobs/list, runs/list (``limit``) and Files API directory listings
(``page_size``, at most 1000, or ``directory_page`` for tests) answer with
``next_page_token``.

Not modelled: permissions,
Repos, Unity Catalog metadata, the 2.0 Jobs API.
"""

from __future__ import annotations

import base64
import binascii
import copy
import dataclasses
import http.server
import itertools
import json
import re
import socket
import ssl
import threading
import time
import traceback
import urllib.parse
import uuid
from typing import Any

MB = 1 << 20
BODY_MAX = 32 * MB


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _bad(message: str) -> ApiError:
    return ApiError(400, "INVALID_PARAMETER_VALUE", message)


def _missing(path: str) -> ApiError:
    return ApiError(404, "RESOURCE_DOES_NOT_EXIST", f"Path ({path}) doesn't exist.")


def _field(body: dict, name: str, kind: type | tuple[type, ...] = str) -> Any:
    if name not in body or body[name] is None:
        raise _bad(f"Missing required field: {name}")
    if not isinstance(body[name], kind) or (kind is int and isinstance(body[name], bool)):
        raise _bad(f"Invalid value for field {name}")
    return body[name]


def _b64(body: dict, name: str, limit: int, code: str) -> bytes:
    text = _field(body, name)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(f"{name} is not valid base64") from None
    if len(data) > limit:
        raise ApiError(400, code, f"File size imported is ({len(data)} bytes), exceeded max size ({limit} bytes)")
    return data


def _abs(path: Any, what: str = "path") -> str:
    if not isinstance(path, str) or not path.startswith("/"):
        raise _bad(f"{what} must be absolute: {path!r}")
    return "/" + "/".join(p for p in path.split("/") if p) if path != "/" else "/"


def _parents(path: str) -> list[str]:
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]


@dataclasses.dataclass
class Fault:
    pattern: re.Pattern
    method: str | None
    status: int | None
    retry_after: str | None
    delay: float
    drop: bool
    drop_after: int | None  # bytes of the body read before the connection is closed
    times: int


# How the Jobs API reports a run that did not get to run its notebook to the
# end: (life_cycle_state, result_state or None, state_message) by outcome.
RUN_ENDS = {
    "TIMEDOUT": ("TERMINATED", "TIMEDOUT", "Run timed out: it ran longer than its timeout_seconds."),
    "CANCELED": ("TERMINATED", "CANCELED", "Run cancelled."),
    "SKIPPED": (
        "SKIPPED",
        None,
        "Skipping this run because the limit of {limit} maximum concurrent runs has been reached.",
    ),
}


@dataclasses.dataclass
class Run:
    run_id: int
    job_id: int | None
    run_name: str
    tasks: list[dict]  # each {"task_key", "run_id", "notebook_task", ...}
    params: dict[str, str]
    steps: int = 0
    life: str = "PENDING"
    result: str | None = None
    message: str = ""
    output: str | None = None
    error: str | None = None
    error_trace: str | None = None
    user_cancelled_or_timedout: bool = False
    end: str | None = None  # a RUN_ENDS outcome it is to end with (Standin.end_runs)
    start_time: int = dataclasses.field(default_factory=lambda: int(time.time() * 1000))


class Standin:
    """The stand-in workspace. Use as a context manager or start()/stop()."""

    def __init__(
        self,
        *,
        token: str = "dapi-standin-0123456789abcdef",
        client_id: str = "sp-standin",
        client_secret: str = "dose-standin-secret-value",
        oauth_lifetime: int = 3600,
        run_steps: int = 1,
        cluster_steps: int = 1,
        tls: tuple[str, str] | None = None,
        spark_version: str = "14.3.x-scala2.12",
        directory_page: int = 1000,
    ) -> None:
        self.token, self.client_id, self.client_secret = token, client_id, client_secret
        self.oauth_lifetime = oauth_lifetime
        self.run_steps, self.cluster_steps = run_steps, cluster_steps
        self.directory_page = directory_page  # entries per Files API directory page at most (the API's: 1000)
        self.lock = threading.RLock()
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, faults included
        self.peers: list[int] = []  # the client port of every request (one per connection)
        self.oauth_tokens: dict[str, float] = {}  # token -> expiry (time.time())
        self.faults: list[Fault] = []
        self.run_ends: list[str] = []  # outcomes (RUN_ENDS) of the next runs to start
        self.dbfs: dict[str, bytes] = {}
        self.dbfs_dirs: set[str] = {"/"}
        self.handles: dict[int, tuple[str, bytearray]] = {}
        self.volume_files: dict[str, bytes] = {}
        self.volume_dirs: set[str] = set()
        self.workspace: dict[str, dict] = {"/": {"object_type": "DIRECTORY"}, "/Users": {"object_type": "DIRECTORY"}}
        self.clusters: dict[str, dict] = {
            "0101-standin": {
                "state": "TERMINATED",
                "steps": 0,
                "cluster_name": "standin",
                "spark_version": spark_version,
                "libraries": [],
            }
        }
        self.jobs: dict[int, dict] = {}
        self.runs: dict[int, Run] = {}
        self.idempotency: dict[str, int] = {}
        self._ids = itertools.count(1000)
        self.tls = tls  # (certificate file, key file): serve https instead of http
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle -----------------------------------------------------------------

    def start(self) -> Standin:
        standin = self

        class Handler(_Handler):
            pass

        Handler.standin = standin
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if self.tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*self.tls)
            self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join(timeout=10)
            self._server = None

    def __enter__(self) -> Standin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

    def inject(
        self,
        pattern: str,
        *,
        status: int | None = None,
        retry_after: str | None = None,
        delay: float = 0.0,
        drop: bool = False,
        drop_after: int | None = None,
        times: int = 1,
        method: str | None = None,
    ) -> None:
        """The next `times` requests whose path matches `pattern` (re.search)
        get the fault instead of (or, for delay alone, before) their answer."""
        with self.lock:
            self.faults.append(Fault(re.compile(pattern), method, status, retry_after, delay, drop, drop_after, times))

    def end_runs(self, outcome: str, times: int = 1) -> None:
        """The next `times` runs to start end as outcome instead of running
        their notebook: TIMEDOUT (as when timeout_seconds runs out while it
        runs), CANCELED (as when someone cancels it while it runs) or SKIPPED
        (at once, as when the job already has max_concurrent_runs active runs)."""
        if outcome not in RUN_ENDS:
            raise ValueError(f"outcome must be one of {sorted(RUN_ENDS)}, got {outcome!r}")
        with self.lock:
            self.run_ends += [outcome] * times

    def count(self, method: str, path: str) -> int:
        with self.lock:
            return sum(1 for m, p in self.requests if m == method and p == path)

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.times > 0 and f.pattern.search(path) and f.method in (None, method):
                    f.times -= 1
                    return f
        return None

    def next_id(self) -> int:
        return next(self._ids)

    def state(self) -> dict:
        """A deep copy of everything the API can change (not the request log
        or the id counter): two are equal when the calls between changed nothing."""
        with self.lock:
            return copy.deepcopy(
                {
                    "dbfs": self.dbfs,
                    "dbfs_dirs": self.dbfs_dirs,
                    "volume_files": self.volume_files,
                    "volume_dirs": self.volume_dirs,
                    "workspace": self.workspace,
                    "clusters": self.clusters,
                    "jobs": self.jobs,
                    "runs": {k: dataclasses.asdict(r) for k, r in self.runs.items()},
                }
            )

    # ---- auth ----------------------------------------------------------------------

    def check_bearer(self, header: str | None) -> None:
        if not header or not header.startswith("Bearer "):
            raise ApiError(
                401, "UNAUTHENTICATED", "Credential was not sent or was of an unsupported type for this API."
            )
        value = header[len("Bearer ") :]
        with self.lock:
            expiry = self.oauth_tokens.get(value)
        if value != self.token and (expiry is None or expiry < time.time()):
            raise ApiError(403, "PERMISSION_DENIED", "Invalid access token.")

    def oauth_token(self, header: str | None, form: dict[str, list[str]]) -> dict:
        expected = "Basic " + base64.b64encode(f"{self.client_id}:{self.client_secret}".encode()).decode()
        if header != expected:
            raise ApiError(401, "invalid_client", "Client authentication failed")
        if form.get("grant_type") != ["client_credentials"]:
            raise ApiError(400, "unsupported_grant_type", "grant_type must be client_credentials")
        value = "dosp-" + uuid.uuid4().hex
        with self.lock:
            self.oauth_tokens[value] = time.time() + self.oauth_lifetime
        return {"access_token": value, "token_type": "Bearer", "expires_in": self.oauth_lifetime, "scope": "all-apis"}

    # ---- DBFS ----------------------------------------------------------------------

    def _dbfs_mkdirs(self, path: str) -> None:
        for p in [*_parents(path), path]:
            if p in self.dbfs:
                raise ApiError(400, "RESOURCE_ALREADY_EXISTS", f"A file or directory already exists at {p}.")
            self.dbfs_dirs.add(p)

    def _dbfs_write(self, path: str, data: bytes, overwrite: bool) -> None:
        if path in self.dbfs_dirs:
            raise ApiError(400, "RESOURCE_ALREADY_EXISTS", f"A directory already exists at {path}.")
        if path in self.dbfs and not overwrite:
            raise ApiError(400, "RESOURCE_ALREADY_EXISTS", f"A file or directory already exists at {path}.")
        for p in _parents(path):
            self._dbfs_mkdirs(p)
        self.dbfs[path] = data

    def _dbfs_info(self, path: str) -> dict:
        if path in self.dbfs_dirs:
            return {"path": path, "is_dir": True, "file_size": 0, "modification_time": 0}
        if path in self.dbfs:
            return {"path": path, "is_dir": False, "file_size": len(self.dbfs[path]), "modification_time": 0}
        raise _missing(path)

    def dbfs_call(self, op: str, q: dict, body: dict) -> dict:
        with self.lock:
            if op == "put":
                path = _abs(_field(body, "path"))
                self._dbfs_write(
                    path, _b64(body, "contents", MB, "MAX_BLOCK_SIZE_EXCEEDED"), bool(body.get("overwrite"))
                )
                return {}
            if op == "create":
                path = _abs(_field(body, "path"))
                if (path in self.dbfs or path in self.dbfs_dirs) and not body.get("overwrite"):
                    raise ApiError(400, "RESOURCE_ALREADY_EXISTS", f"A file or directory already exists at {path}.")
                handle = self.next_id()
                self.handles[handle] = (path, bytearray())
                return {"handle": handle}
            if op == "add-block":
                handle = _field(body, "handle", int)
                if handle not in self.handles:
                    raise _missing(f"handle {handle}")
                self.handles[handle][1].extend(_b64(body, "data", MB, "MAX_BLOCK_SIZE_EXCEEDED"))
                return {}
            if op == "close":
                handle = _field(body, "handle", int)
                if handle not in self.handles:
                    raise _missing(f"handle {handle}")
                path, data = self.handles.pop(handle)
                self._dbfs_write(path, bytes(data), True)
                return {}
            if op == "get-status":
                return self._dbfs_info(_abs(_field(q, "path")))
            if op == "list":
                path = _abs(_field(q, "path"))
                info = self._dbfs_info(path)
                if not info["is_dir"]:
                    return {"files": [info]}
                kids = {
                    p for p in [*self.dbfs, *self.dbfs_dirs] if p != path and p.rsplit("/", 1)[0] == path.rstrip("/")
                }
                return {"files": [self._dbfs_info(p) for p in sorted(kids)]}
            if op == "mkdirs":
                self._dbfs_mkdirs(_abs(_field(body, "path")))
                return {}
            if op == "delete":
                path = _abs(_field(body, "path"))
                under = [p for p in [*self.dbfs, *self.dbfs_dirs] if p.startswith(path.rstrip("/") + "/")]
                if under and not body.get("recursive"):
                    raise ApiError(400, "IO_ERROR", f"Directory {path} is not empty; use recursive.")
                for p in [*under, path]:
                    self.dbfs.pop(p, None)
                    self.dbfs_dirs.discard(p)
                return {}
            if op == "move":
                src, dst = _abs(_field(body, "source_path")), _abs(_field(body, "destination_path"))
                if src not in self.dbfs:
                    raise _missing(src)
                if dst in self.dbfs or dst in self.dbfs_dirs:
                    raise ApiError(400, "RESOURCE_ALREADY_EXISTS", f"A file or directory already exists at {dst}.")
                self._dbfs_write(dst, self.dbfs.pop(src), False)
                return {}
            if op == "read":
                path = _abs(_field(q, "path"))
                if path not in self.dbfs:
                    raise _missing(path)
                offset, length = int(q.get("offset", 0)), int(q.get("length", MB))
                if length > MB:
                    raise ApiError(400, "MAX_READ_SIZE_EXCEEDED", f"length {length} is over 1 MB")
                chunk = self.dbfs[path][offset : offset + length]
                return {"bytes_read": len(chunk), "data": base64.b64encode(chunk).decode()}
        raise KeyError(op)

    # ---- Files API -----------------------------------------------------------------

    def files_call(self, method: str, kind: str, path: str, q: dict, raw: bytes) -> tuple[int, bytes, dict]:
        path = urllib.parse.unquote(path)
        parts = path.strip("/").split("/")
        if parts[0] != "Volumes" or len(parts) < 4:
            raise ApiError(
                400, "INVALID_PARAMETER_VALUE", f"Path {path} is not under /Volumes/<catalog>/<schema>/<volume>"
            )
        path = _abs(path)
        with self.lock:
            if kind == "files":
                if method == "PUT":
                    if path in self.volume_files and q.get("overwrite") != "true":
                        raise ApiError(409, "ALREADY_EXISTS", f"The file {path} already exists.")
                    self.volume_dirs.update(p for p in _parents(path) if p.count("/") >= 4)
                    self.volume_files[path] = raw
                    return 204, b"", {}
                if path not in self.volume_files:
                    raise ApiError(404, "NOT_FOUND", f"The file {path} does not exist.")
                data = self.volume_files[path]
                if method == "DELETE":
                    del self.volume_files[path]
                    return 204, b"", {}
                headers = {"Content-Type": "application/octet-stream", "Last-Modified": "Tue, 01 Dec 2026 09:00:00 GMT"}
                return 200, data, headers  # HEAD: the handler sends the headers only
            if method == "PUT":
                self.volume_dirs.update(p for p in [*_parents(path), path] if p.count("/") >= 4)
                return 204, b"", {}
            if path not in self.volume_dirs:
                raise ApiError(404, "NOT_FOUND", f"The directory {path} does not exist.")
            kids = sorted(p for p in [*self.volume_files, *self.volume_dirs] if p.rsplit("/", 1)[0] == path)
            if method == "DELETE":
                if kids:
                    raise ApiError(409, "DIRECTORY_NOT_EMPTY", f"The directory {path} is not empty.")
                self.volume_dirs.discard(path)
                return 204, b"", {}
            if method == "HEAD":
                return 200, b"", {}
            size = min(int(q.get("page_size") or 1000), 1000, self.directory_page)  # over 1000: coerced to 1000
            if size < 1:
                raise _bad("page_size must be positive")
            start = int(q.get("page_token") or 0)
            page = kids[start : start + size]
            contents = [
                {
                    "path": p,
                    "name": p.rsplit("/", 1)[1],
                    "is_directory": p in self.volume_dirs,
                    **({"file_size": len(self.volume_files[p])} if p in self.volume_files else {}),
                }
                for p in page
            ]
            reply: dict[str, Any] = {"contents": contents}
            if start + size < len(kids):
                reply["next_page_token"] = str(start + size)
            return 200, json.dumps(reply).encode(), {"Content-Type": "application/json"}

    # ---- Workspace -----------------------------------------------------------------

    def workspace_call(self, op: str, q: dict, body: dict) -> dict:
        with self.lock:
            if op == "import":
                path = _abs(_field(body, "path"))
                fmt = body.get("format", "SOURCE")
                if fmt not in ("SOURCE", "HTML", "JUPYTER", "DBC", "R_MARKDOWN", "AUTO", "RAW"):
                    raise _bad(f"Invalid format: {fmt}")
                data = _b64(body, "content", 10 * MB, "MAX_NOTEBOOK_SIZE_EXCEEDED")
                parent = path.rsplit("/", 1)[0] or "/"
                if self.workspace.get(parent, {}).get("object_type") != "DIRECTORY":
                    raise ApiError(404, "RESOURCE_DOES_NOT_EXIST", f"The parent folder ({parent}) does not exist.")
                if path in self.workspace and not body.get("overwrite"):
                    raise ApiError(400, "RESOURCE_ALREADY_EXISTS", f"{path} already exists.")
                obj = self._workspace_object(fmt, body.get("language"), data)
                obj["object_id"] = self.next_id()
                self.workspace[path] = obj
                return {}
            if op == "mkdirs":
                path = _abs(_field(body, "path"))
                for p in [*_parents(path), path]:
                    if self.workspace.get(p, {"object_type": "DIRECTORY"})["object_type"] != "DIRECTORY":
                        raise ApiError(400, "RESOURCE_ALREADY_EXISTS", f"{p} exists and is not a directory.")
                    self.workspace.setdefault(p, {"object_type": "DIRECTORY", "object_id": self.next_id()})
                return {}
            if op == "delete":
                path = _abs(_field(body, "path"))
                if path not in self.workspace:
                    raise _missing(path)
                under = [p for p in self.workspace if p.startswith(path.rstrip("/") + "/")]
                if under and not body.get("recursive"):
                    raise ApiError(400, "DIRECTORY_NOT_EMPTY", f"Folder ({path}) is not empty.")
                for p in [*under, path]:
                    del self.workspace[p]
                return {}
            path = _abs(_field(q, "path"))
            if path not in self.workspace:
                raise _missing(path)
            obj = self.workspace[path]
            if op == "get-status":
                return self._workspace_info(path)
            if op == "list":
                return {
                    "objects": [
                        self._workspace_info(p)
                        for p in sorted(self.workspace)
                        if p != "/" and p.rsplit("/", 1)[0] == path.rstrip("/")
                    ]
                }
            if op == "export":
                fmt = q.get("format", "SOURCE")
                if obj["object_type"] == "DIRECTORY":
                    raise _bad(f"{path} is a directory")
                if fmt == "JUPYTER" and obj["object_type"] == "NOTEBOOK":
                    content = json.dumps(_to_ipynb(obj["source"])).encode()
                elif fmt in ("SOURCE", "AUTO"):
                    content = obj["source"].encode() if obj["object_type"] == "NOTEBOOK" else obj["data"]
                else:
                    raise _bad(f"export format {fmt} is not supported by the stand-in")
                return {"content": base64.b64encode(content).decode(), "file_type": "py"}
        raise KeyError(op)

    @staticmethod
    def _workspace_object(fmt: str, language: Any, data: bytes) -> dict:
        if fmt == "JUPYTER":
            try:
                cells = json.loads(data)["cells"]
                source = "# Databricks notebook source\n" + "\n\n# COMMAND ----------\n\n".join(
                    "".join(c.get("source", [])) for c in cells
                )
            except (ValueError, KeyError, TypeError):
                raise _bad("The notebook is not valid Jupyter (.ipynb) JSON.") from None
            return {"object_type": "NOTEBOOK", "language": "PYTHON", "source": source}
        text = data.decode("utf-8", "replace")
        if fmt == "SOURCE":
            if language not in ("PYTHON", "SCALA", "SQL", "R"):
                raise _bad("language is required for format SOURCE (PYTHON, SCALA, SQL or R)")
            return {"object_type": "NOTEBOOK", "language": language, "source": text}
        if fmt == "AUTO" and text.startswith("# Databricks notebook source"):
            return {"object_type": "NOTEBOOK", "language": "PYTHON", "source": text}
        return {"object_type": "FILE", "data": data}

    def _workspace_info(self, path: str) -> dict:
        obj = self.workspace[path]
        info = {"path": path, "object_type": obj["object_type"], "object_id": obj.get("object_id", 1)}
        if "language" in obj:
            info["language"] = obj["language"]
        return info

    # ---- clusters and libraries ----------------------------------------------------

    def _cluster(self, cluster_id: Any) -> dict:
        if cluster_id not in self.clusters:
            raise _bad(f"Cluster {cluster_id} does not exist")
        return self.clusters[cluster_id]

    def clusters_call(self, op: str, q: dict, body: dict) -> dict:
        with self.lock:
            if op == "get":
                cid = _field(q, "cluster_id")
                c = self._cluster(cid)
                if c["state"] == "PENDING":
                    c["steps"] += 1
                    if c["steps"] > self.cluster_steps:
                        c["state"] = "RUNNING"
                keys = ("cluster_name", "spark_version", "state")
                return {"cluster_id": cid, **{k: c[k] for k in keys}, "state_message": ""}
            cid = _field(body, "cluster_id")
            c = self._cluster(cid)
            if c["state"] != "TERMINATED":
                raise ApiError(400, "INVALID_STATE", f"Cluster {cid} is in unexpected state {c['state'].title()}.")
            c["state"], c["steps"] = "PENDING", 0
            return {}

    def libraries_call(self, op: str, q: dict, body: dict) -> dict:
        with self.lock:
            if op == "install":
                c = self._cluster(_field(body, "cluster_id"))
                for lib in _field(body, "libraries", list):
                    if (
                        not isinstance(lib, dict)
                        or len(lib) != 1
                        or next(iter(lib)) not in ("whl", "egg", "jar", "pypi", "requirements")
                    ):
                        raise _bad(f"Invalid library specification: {lib}")
                    if all(s["library"] != lib for s in c["libraries"]):
                        c["libraries"].append({"library": lib, "status": "PENDING", "steps": 0})
                return {}
            cid = _field(q, "cluster_id")
            c = self._cluster(cid)
            out = []
            for s in c["libraries"]:
                if s["status"] not in ("INSTALLED", "FAILED") and c["state"] == "RUNNING":
                    s["steps"] += 1
                    if s["steps"] > 1:
                        where = next(iter(s["library"].values()))
                        ok = (
                            not isinstance(where, str)
                            or where in self.volume_files
                            or where.removeprefix("/Workspace") in self.workspace
                            or where.removeprefix("dbfs:") in self.dbfs
                        )
                        s["status"] = "INSTALLED" if ok else "FAILED"
                        if not ok:
                            s["messages"] = [f"Library file not found: {where}"]
                    else:
                        s["status"] = "INSTALLING"
                out.append({k: v for k, v in s.items() if k != "steps"})
            return {"cluster_id": cid, "library_statuses": out}

    # ---- jobs and runs -------------------------------------------------------------

    @staticmethod
    def _check_tasks(settings: dict, job_clusters: list) -> list[dict]:
        tasks = _field(settings, "tasks", list)
        if not tasks:
            raise _bad("At least one task is required.")
        keys = {c.get("job_cluster_key") for c in job_clusters}
        for t in tasks:
            _field(t, "task_key")
            nb = _field(t, "notebook_task", dict)
            _abs(_field(nb, "notebook_path"), "notebook_path")
            if any(not isinstance(v, str) for v in nb.get("base_parameters", {}).values()):
                raise _bad("base_parameters values must be strings")
            where = [k for k in ("existing_cluster_id", "new_cluster", "job_cluster_key") if k in t]
            if len(where) != 1:
                raise _bad(
                    f"Task {t['task_key']} needs exactly one of existing_cluster_id, new_cluster, job_cluster_key"
                )
            if where == ["job_cluster_key"] and t["job_cluster_key"] not in keys:
                raise _bad(f"Job cluster {t['job_cluster_key']} is not defined in job_clusters")
            if where == ["new_cluster"]:
                _field(t["new_cluster"], "spark_version")
            for field, kind in (("max_retries", int), ("timeout_seconds", int)):
                if field in t and not isinstance(t[field], kind):
                    raise _bad(f"Invalid value for field {field}")
        return tasks

    def _check_settings(self, settings: dict) -> None:
        job_clusters = settings.get("job_clusters", [])
        self._check_tasks(settings, job_clusters)
        if "schedule" in settings:
            s = _field(settings, "schedule", dict)
            cron = _field(s, "quartz_cron_expression")
            if len(cron.split()) not in (6, 7):
                raise _bad(f"Invalid quartz_cron_expression: {cron}")
            _field(s, "timezone_id")
        if "email_notifications" in settings:
            for k, v in settings["email_notifications"].items():
                if not isinstance(v, list) and k != "no_alert_for_skipped_runs":
                    raise _bad(f"email_notifications.{k} must be a list")

    def _start_run(self, job: dict | None, name: str, tasks: list, params: dict, token: str | None) -> dict:
        """A new run of job (None: runs/submit). A job with max_concurrent_runs
        (default 1) active runs already gets a run that is SKIPPED at once."""
        if token:
            if len(token) > 64:
                raise _bad("idempotency_token must be at most 64 characters")
            if token in self.idempotency:
                return {"run_id": self.idempotency[token]}
        job_id = None if job is None else job["job_id"]
        run = Run(self.next_id(), job_id, name, [{**t, "run_id": self.next_id()} for t in tasks], params)
        limit = job["settings"].get("max_concurrent_runs", 1) if job is not None else None
        active = sum(1 for r in self.runs.values() if r.job_id == job_id and r.life in ("PENDING", "RUNNING"))
        skipped = limit is not None and active >= limit
        if not skipped and self.run_ends:
            run.end = self.run_ends.pop(0)
        if skipped or run.end == "SKIPPED":
            life, _result, message = RUN_ENDS["SKIPPED"]
            run.life, run.message = life, message.format(limit=limit if limit is not None else 1)
        self.runs[run.run_id] = run
        if token:
            self.idempotency[token] = run.run_id
        return {"run_id": run.run_id, "number_in_job": run.run_id}

    def _advance(self, run: Run) -> None:
        if run.life in ("TERMINATED", "INTERNAL_ERROR", "SKIPPED"):
            return
        run.steps += 1
        if run.steps <= self.run_steps:
            return
        run.steps = 0
        if run.life == "PENDING":
            run.life = "RUNNING"
            return
        if run.end is not None:  # stopped from outside before the notebook finished
            run.life, run.result, run.message = RUN_ENDS[run.end]
            run.user_cancelled_or_timedout = True
            return
        task = run.tasks[0]
        nb = task["notebook_task"]
        params = {**nb.get("base_parameters", {}), **run.params}
        obj = self.workspace.get(nb["notebook_path"])
        run.life = "TERMINATED"
        if obj is None or obj["object_type"] != "NOTEBOOK":
            run.result, run.message = "FAILED", f"Notebook not found: {nb['notebook_path']}"
            run.error = run.message
            return
        try:
            run.output = _execute(obj["source"], params)
            run.result, run.message = "SUCCESS", ""
        except Exception as exc:  # the notebook's own failure
            run.result, run.message, run.error = "FAILED", "Workload failed", f"{type(exc).__name__}: {exc}"
            tb = exc.__traceback__  # the notebook's frames only, as a notebook shows them
            while tb is not None and tb.tb_frame.f_code.co_filename != "<notebook>":
                tb = tb.tb_next
            run.error_trace = "".join(traceback.format_exception(type(exc), exc, tb))

    def _run_json(self, run: Run) -> dict:
        state = {
            "life_cycle_state": run.life,
            "state_message": run.message,
            "user_cancelled_or_timedout": run.user_cancelled_or_timedout,
        }
        if run.result:
            state["result_state"] = run.result
        tasks = [
            {"run_id": t["run_id"], "task_key": t["task_key"], "state": state, "notebook_task": t["notebook_task"]}
            for t in run.tasks
        ]
        out = {
            "run_id": run.run_id,
            "run_name": run.run_name,
            "state": state,
            "tasks": tasks,
            "start_time": run.start_time,
        }
        if run.job_id is not None:
            out["job_id"] = run.job_id
        return out

    def _task_run(self, run_id: int) -> tuple[Run, dict]:
        for run in self.runs.values():
            for t in run.tasks:
                if t["run_id"] == run_id:
                    return run, t
        if run_id in self.runs:
            raise _bad(
                "Retrieving the output of runs with multiple tasks is not supported. "
                "Please retrieve the output of each individual task run instead."
            )
        raise ApiError(400, "INVALID_PARAMETER_VALUE", f"Run {run_id} does not exist.")

    def jobs_call(self, op: str, q: dict, body: dict) -> dict:
        with self.lock:
            if op == "create":
                self._check_settings(body)
                job_id = self.next_id()
                self.jobs[job_id] = {"job_id": job_id, "settings": body, "created_time": int(time.time() * 1000)}
                return {"job_id": job_id}
            if op == "reset":
                job_id = _field(body, "job_id", int)
                settings = _field(body, "new_settings", dict)
                self._job(job_id)
                self._check_settings(settings)
                self.jobs[job_id]["settings"] = settings
                return {}
            if op == "get":
                return self._job(int(_field(q, "job_id")))
            if op == "list":
                jobs = [j for j in self.jobs.values() if "name" not in q or j["settings"].get("name") == q["name"]]
                return self._page(jobs, q, "jobs", 100)
            if op == "run-now":
                job = self._job(_field(body, "job_id", int))
                params = body.get("notebook_params", {})
                if not isinstance(params, dict) or any(not isinstance(v, str) for v in params.values()):
                    raise _bad("notebook_params must map names to strings")
                name = job["settings"].get("name", "Untitled")
                return self._start_run(job, name, job["settings"]["tasks"], params, body.get("idempotency_token"))
            if op == "runs/submit":
                tasks = self._check_tasks(body, body.get("job_clusters", []))
                return self._start_run(None, body.get("run_name", "Untitled"), tasks, {}, body.get("idempotency_token"))
            if op == "runs/get":
                run = self._run(int(_field(q, "run_id")))
                self._advance(run)
                return self._run_json(run)
            if op == "runs/get-output":
                run, task = self._task_run(int(_field(q, "run_id")))
                out: dict[str, Any] = {"metadata": {"run_id": task["run_id"], "state": self._run_json(run)["state"]}}
                if run.life == "TERMINATED" and run.result == "SUCCESS":
                    out["notebook_output"] = {"result": run.output or "", "truncated": False}
                if run.error:
                    out["error"] = run.error
                if run.error_trace:
                    out["error_trace"] = run.error_trace
                return out
            if op == "runs/cancel":
                run = self._run(_field(body, "run_id", int))
                if run.life in ("PENDING", "RUNNING"):
                    run.life, run.result, run.message = RUN_ENDS["CANCELED"]
                    run.user_cancelled_or_timedout = True
                return {}
            if op == "runs/list":
                runs = [
                    self._run_json(r) for r in self.runs.values() if "job_id" not in q or str(r.job_id) == q["job_id"]
                ]
                if q.get("active_only") == "true":
                    runs = [r for r in runs if r["state"]["life_cycle_state"] in ("PENDING", "RUNNING")]
                return self._page(sorted(runs, key=lambda r: -r["run_id"]), q, "runs", 25)
        raise KeyError(op)

    def _job(self, job_id: int) -> dict:
        if job_id not in self.jobs:
            raise ApiError(400, "INVALID_PARAMETER_VALUE", f"Job {job_id} does not exist.")
        return self.jobs[job_id]

    def _run(self, run_id: int) -> Run:
        if run_id not in self.runs:
            raise ApiError(400, "INVALID_PARAMETER_VALUE", f"Run {run_id} does not exist.")
        return self.runs[run_id]

    @staticmethod
    def _page(items: list, q: dict, key: str, max_limit: int) -> dict:
        limit = int(q.get("limit", 20))
        if not 1 <= limit <= max_limit:
            raise _bad(f"limit must be between 1 and {max_limit}")
        start = int(q.get("page_token") or 0)
        page = items[start : start + limit]
        more = start + limit < len(items)
        out = {key: page, "has_more": more}
        if more:
            out["next_page_token"] = str(start + limit)
        return out


class _NotebookExit(Exception):
    pass


def _execute(source: str, params: dict[str, str]) -> str:
    """Runs a Python notebook's source with a small dbutils; returns its exit value."""

    class Widgets:
        def text(self, name: str, default: str = "", label: str | None = None) -> None:
            params.setdefault(name, default)

        def get(self, name: str) -> str:
            if name not in params:
                raise KeyError(f"No input widget named {name} is defined")
            return params[name]

    class Notebook:
        def exit(self, value: Any) -> None:
            raise _NotebookExit(str(value))

    class DbUtils:
        widgets = Widgets()
        notebook = Notebook()

    try:
        exec(compile(source, "<notebook>", "exec"), {"dbutils": DbUtils(), "__name__": "__main__"})
    except _NotebookExit as done:
        return str(done)
    return ""


def _to_ipynb(source: str) -> dict:
    body = source.split("\n", 1)[1] if source.startswith("# Databricks notebook source") else source
    cells = [c.strip("\n") for c in body.split("# COMMAND ----------")]
    return {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {"language_info": {"name": "python"}},
        "cells": [
            {"cell_type": "code", "metadata": {}, "source": c, "outputs": [], "execution_count": None} for c in cells
        ],
    }


_ROUTES: dict[tuple[str, str], tuple[str, str]] = {}
for _op, _method in [
    ("put", "POST"), ("create", "POST"), ("add-block", "POST"), ("close", "POST"), ("get-status", "GET"),
    ("list", "GET"), ("mkdirs", "POST"), ("delete", "POST"), ("move", "POST"), ("read", "GET"),
]:  # fmt: skip
    _ROUTES[(_method, f"/api/2.0/dbfs/{_op}")] = ("dbfs", _op)
for _op, _method in [("import", "POST"), ("export", "GET"), ("mkdirs", "POST"), ("get-status", "GET"),
                     ("delete", "POST"), ("list", "GET")]:  # fmt: skip
    _ROUTES[(_method, f"/api/2.0/workspace/{_op}")] = ("workspace", _op)
for _ver in ("2.0", "2.1"):
    _ROUTES[("GET", f"/api/{_ver}/clusters/get")] = ("clusters", "get")
    _ROUTES[("POST", f"/api/{_ver}/clusters/start")] = ("clusters", "start")
_ROUTES[("POST", "/api/2.0/libraries/install")] = ("libraries", "install")
_ROUTES[("GET", "/api/2.0/libraries/cluster-status")] = ("libraries", "cluster-status")
for _ver in ("2.1", "2.2"):
    for _op, _method in [("create", "POST"), ("reset", "POST"), ("get", "GET"), ("list", "GET"), ("run-now", "POST"),
                         ("runs/submit", "POST"), ("runs/get", "GET"), ("runs/get-output", "GET"),
                         ("runs/cancel", "POST"), ("runs/list", "GET")]:  # fmt: skip
        _ROUTES[(_method, f"/api/{_ver}/jobs/{_op}")] = ("jobs", _op)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out as two writes: with Nagle on, each answer waited ~40 ms for the
    # client's delayed ACK (44 ms per request measured, 0.6 ms without).
    disable_nagle_algorithm = True
    standin: Standin

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):  # the client gave up first (timeouts, Ctrl-C)
            self.close_connection = True

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_HEAD(self) -> None:
        self._handle("HEAD")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def _reply(self, status: int, body: bytes, headers: dict | None = None) -> None:
        self.send_response(status)
        headers = {"Content-Type": "application/json", **(headers or {})}
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, e: ApiError, headers: dict | None = None) -> None:
        body = {"error_code": e.code, "message": e.message}
        if self.path.startswith("/oidc/"):
            body = {"error": e.code, "error_description": e.message}
        self._reply(e.status, json.dumps(body).encode(), headers)

    def _handle(self, method: str) -> None:
        s = self.standin
        url = urllib.parse.urlsplit(self.path)
        path = url.path
        with s.lock:
            s.requests.append((method, path))
            s.peers.append(self.client_address[1])
        length = int(self.headers.get("Content-Length") or 0)
        if length > BODY_MAX:
            self.close_connection = True
            return self._error(ApiError(413, "REQUEST_LIMIT_EXCEEDED", f"The request body is over {BODY_MAX} bytes."))
        fault = s.take_fault(method, path)
        try:
            if fault is not None and fault.drop_after is not None:  # an upload cut mid-way
                self.rfile.read(min(fault.drop_after, length))
                return self._drop()
            raw = self.rfile.read(length) if length else b""
            if len(raw) < length:  # the client went away mid-body: the service applies nothing
                self.close_connection = True
                return None
            if fault is not None:
                if fault.delay:
                    time.sleep(fault.delay)
                if fault.drop:
                    return self._drop()
                if fault.status:
                    headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
                    code = "TOO_MANY_REQUESTS" if fault.status == 429 else "TEMPORARILY_UNAVAILABLE"
                    return self._error(ApiError(fault.status, code, "Injected fault."), headers)
            status, body, headers = self._route(method, path, urllib.parse.parse_qs(url.query), raw)
            return self._reply(status, body, headers)
        except ApiError as e:
            return self._error(e)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeouts)
            self.close_connection = True
            return None

    def _drop(self) -> None:
        """Closes the connection without an answer."""
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def _route(self, method: str, path: str, qs: dict[str, list[str]], raw: bytes) -> tuple[int, bytes, dict]:
        s = self.standin
        base = f"{'https' if s.tls else 'http'}://{self.headers.get('Host')}"
        if method == "GET" and path == "/.well-known/databricks-config":  # host metadata (newer SDKs read it)
            return 200, json.dumps({"oidc_endpoint": f"{base}/oidc", "workspace_id": "1234567890"}).encode(), {}
        if method == "GET" and path == "/oidc/.well-known/oauth-authorization-server":
            meta = {"authorization_endpoint": f"{base}/oidc/v1/authorize", "token_endpoint": f"{base}/oidc/v1/token"}
            return 200, json.dumps(meta).encode(), {}
        if method == "POST" and path == "/oidc/v1/token":
            form = urllib.parse.parse_qs(raw.decode("latin-1"))
            return 200, json.dumps(s.oauth_token(self.headers.get("Authorization"), form)).encode(), {}
        if not path.startswith("/api/"):
            raise ApiError(404, "ENDPOINT_NOT_FOUND", f"No API found for '{method} {path}'")
        s.check_bearer(self.headers.get("Authorization"))
        q = {k: v[-1] for k, v in qs.items()}
        m = re.match(r"/api/2\.0/fs/(files|directories)(/.*)$", path)
        if m and method in ("GET", "PUT", "HEAD", "DELETE"):
            return s.files_call(method, m.group(1), m.group(2), q, raw)
        route = _ROUTES.get((method, path))
        if route is None:
            raise ApiError(404, "ENDPOINT_NOT_FOUND", f"No API found for '{method} {path}'")
        body: dict = {}
        if method == "POST":
            if "json" not in (self.headers.get("Content-Type") or "") and raw:
                raise ApiError(400, "MALFORMED_REQUEST", "Content-Type must be application/json")
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                raise ApiError(400, "MALFORMED_REQUEST", "Invalid JSON given in the body of the request") from None
            if not isinstance(body, dict):
                raise ApiError(400, "MALFORMED_REQUEST", "The body must be a JSON object")
        area, op = route
        reply = getattr(s, f"{area}_call")(op, q, body)
        return 200, json.dumps(reply).encode(), {}
