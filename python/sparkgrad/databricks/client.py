"""sparkgrad.databricks.Client: the Databricks REST endpoints sparkgrad deploys with.

The transport is C (``sparkgrad._core.RestClient``, csrc/rest/): HTTPS with
TLS verification always on, retries of 429 (and of 503 / dropped connections
for idempotent calls) honouring Retry-After within one time budget, and
``RestError`` with status, error_code, message, method and path on failure.
This module is the thin endpoint layer: JSON in and out, which calls are
idempotent, DBFS streaming in 1 MB blocks, waits for runs, clusters and
libraries.

Logging (logger ``sparkgrad.databricks``, DEBUG): method, path, status,
attempts, time and body sizes; never a header, a token or a body.

Plain http:// is refused, except to a loopback address when
``allow_http_loopback=True`` or SPARKGRAD_REST_ALLOW_HTTP_LOOPBACK=1 (test
servers such as tests/databricks_standin.py).

The listings that page (``directories_list``, ``jobs_list``, ``runs_list``)
follow every page. Not here: Unity Catalog metadata, secrets, Repos, SQL.
Deploying in one command builds on this (sparkgrad.databricks.deploy).
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, TypeVar

from sparkgrad._version import __version__
from sparkgrad.databricks.config import Config, OAuthM2M, StaticToken, resolve_config
from sparkgrad.errors import InvalidArgumentError, RestError, SparkgradTimeout

logger = logging.getLogger("sparkgrad.databricks")

DBFS_BLOCK = 1 << 20  # bytes per add-block (the API's limit, before base64)
WORKSPACE_IMPORT_MAX = 10 << 20  # bytes of one workspace import (the API's limit)
TERMINAL_RUN_STATES = frozenset({"TERMINATED", "SKIPPED", "INTERNAL_ERROR"})
_SAFE_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE"})
NOT_FOUND_CODES = frozenset({"RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"})  # DBFS, Workspace; Files API

T = TypeVar("T")

Source = bytes | bytearray | memoryview | IO[bytes] | os.PathLike | str


def notebook_job(
    name: str,
    notebook_path: str,
    *,
    base_parameters: Mapping[str, str] | None = None,
    existing_cluster_id: str | None = None,
    new_cluster: Mapping[str, Any] | None = None,
    job_cluster_key: str | None = None,
    job_clusters: Sequence[Mapping[str, Any]] | None = None,
    libraries: Sequence[Mapping[str, str]] | None = None,
    quartz_cron_expression: str | None = None,
    timezone_id: str = "UTC",
    pause_status: str = "UNPAUSED",
    email_notifications: Mapping[str, Any] | None = None,
    max_retries: int = 0,
    timeout_seconds: int = 0,
    task_key: str = "main",
) -> dict[str, Any]:
    """The Jobs API settings of a one-task notebook job, for `Client.jobs_create` and `Client.jobs_reset`.

    ```python
    settings = notebook_job("nightly-train", "/Users/me/train", existing_cluster_id="0101-abc",
                            base_parameters={"epochs": "5"}, quartz_cron_expression="0 0 2 * * ?")
    job_id = client.jobs_create(settings)
    ```

    Args:
        name: The job's name.
        notebook_path: The workspace path of the notebook.
        base_parameters: Widget values of every run (converted to strings).
        existing_cluster_id: Run on this all-purpose cluster.
        new_cluster: Run on a new task cluster of this spec.
        job_cluster_key: Run on this one of ``job_clusters``.
        job_clusters: Shared job-cluster specs (each with a ``job_cluster_key``).
        libraries: Libraries of the task (``{"whl": ...}``, ``{"pypi": {...}}``).
        quartz_cron_expression: A schedule, e.g. ``"0 0 2 * * ?"``; None: no schedule.
        timezone_id: The schedule's time zone.
        pause_status: ``"UNPAUSED"`` or ``"PAUSED"``.
        email_notifications: As the Jobs API takes them.
        max_retries: Retries of a failed run.
        timeout_seconds: Limit of a run (0: none).
        task_key: The task's key.

    Returns:
        The settings dict (one concurrent run at most).

    Raises:
        InvalidArgumentError: Not exactly one of ``existing_cluster_id``, ``new_cluster`` and
            ``job_cluster_key``, or a ``job_cluster_key`` that is not among ``job_clusters``.
    """
    if sum(x is not None for x in (existing_cluster_id, new_cluster, job_cluster_key)) != 1:
        raise InvalidArgumentError("give exactly one of existing_cluster_id, new_cluster or job_cluster_key")
    if job_cluster_key is not None and not any(c.get("job_cluster_key") == job_cluster_key for c in job_clusters or ()):
        raise InvalidArgumentError(f"job_cluster_key {job_cluster_key!r} is not among job_clusters")
    params = {str(k): str(v) for k, v in (base_parameters or {}).items()}
    task: dict[str, Any] = {
        "task_key": task_key,
        "notebook_task": {"notebook_path": notebook_path, "base_parameters": params, "source": "WORKSPACE"},
        "max_retries": max_retries,
        "timeout_seconds": timeout_seconds,
    }
    if existing_cluster_id is not None:
        task["existing_cluster_id"] = existing_cluster_id
    elif new_cluster is not None:
        task["new_cluster"] = dict(new_cluster)
    else:
        task["job_cluster_key"] = job_cluster_key
    if libraries:
        task["libraries"] = [dict(lib) for lib in libraries]
    settings: dict[str, Any] = {"name": name, "tasks": [task], "max_concurrent_runs": 1}
    settings["timeout_seconds"] = timeout_seconds
    if job_clusters:
        settings["job_clusters"] = [dict(c) for c in job_clusters]
    if quartz_cron_expression:
        settings["schedule"] = {
            "quartz_cron_expression": quartz_cron_expression,
            "timezone_id": timezone_id,
            "pause_status": pause_status,
        }
    if email_notifications:
        settings["email_notifications"] = dict(email_notifications)
    return settings


class Client:
    """A client of one Databricks workspace's REST API: DBFS, Files (Volumes), Workspace, Clusters, Libraries, Jobs.

    The transport is sparkgrad's C core (libcurl): HTTPS with TLS verification always on, retries of
    429 (and of 503 and dropped connections for idempotent calls) honouring Retry-After within one
    time budget, and `RestError` with status, error code, message, method and path on failure. The
    listings that page (``directories_list``, ``jobs_list``, ``runs_list``) follow every page. Logging
    (logger ``sparkgrad.databricks``, DEBUG) shows method, path, status, attempts, time and body sizes;
    never a header, a token or a body.

    ```python
    client = Client()  # DATABRICKS_HOST/TOKEN, ~/.databrickscfg, or the notebook
    client.workspace_import("/Users/me/train", open("train.py").read(), overwrite=True)
    run = client.wait_run(client.jobs_run_now(job_id))
    ```

    Args:
        host: The workspace URL; with the credentials below, else found by `resolve_config`
            (environment, ``~/.databrickscfg``, notebook context).
        token: A personal access token.
        client_id: An OAuth machine-to-machine client id (service principal).
        client_secret: Its secret. The OAuth access token is fetched from ``{host}/oidc/v1/token`` and
            renewed 60 s before it expires.
        profile: A profile of the config file.
        config_file: The config file (default ``~/.databrickscfg``).
        config: A resolved `Config`, instead of all of the above.
        timeout: Seconds per request.
        budget: Seconds all the retries of one call may take.
        backoff: Retry delay unit in seconds: the n-th retry waits ``backoff * min(n, 10)`` plus up to half
            a unit of jitter, unless the server sent Retry-After.
        poll: First interval of the waits (run, cluster, libraries), in seconds; it grows to 10x.
        jobs_api: Jobs API version, ``"2.1"`` or ``"2.2"``.
        allow_http_loopback: Allow plain ``http://`` to a loopback address (test servers); default
            the environment variable ``SPARKGRAD_REST_ALLOW_HTTP_LOOPBACK=1``. Plain http is refused
            otherwise.

    Raises:
        DatabricksConfigError: No host or no credentials.
        InvalidArgumentError: An unknown ``jobs_api``, or an ``http://`` host without the loopback opt-in.
    """

    def __init__(
        self,
        host: str | None = None,
        token: str | None = None,
        *,
        client_id: str | None = None,
        client_secret: str | None = None,
        profile: str | None = None,
        config_file: str | os.PathLike | None = None,
        config: Config | None = None,
        timeout: float = 60.0,
        budget: float = 300.0,
        backoff: float = 1.0,
        poll: float = 1.0,
        jobs_api: str = "2.1",
        allow_http_loopback: bool | None = None,
    ) -> None:
        from sparkgrad import _core

        if jobs_api not in ("2.1", "2.2"):
            raise InvalidArgumentError(f"jobs_api must be '2.1' or '2.2', got {jobs_api!r}")
        self.config = config or resolve_config(
            host, token, client_id=client_id, client_secret=client_secret, profile=profile, config_file=config_file
        )
        if allow_http_loopback is None:
            allow_http_loopback = os.environ.get("SPARKGRAD_REST_ALLOW_HTTP_LOOPBACK") == "1"
        self._transport = _core.RestClient(
            self.config.host,
            timeout=timeout,
            budget=budget,
            backoff=backoff,
            allow_http_loopback=allow_http_loopback,
            user_agent=f"sparkgrad/{__version__}",
        )
        if self.config.token:
            self._auth: StaticToken | OAuthM2M = StaticToken(self.config.token)
        else:
            assert self.config.client_id and self.config.client_secret
            self._auth = OAuthM2M(self._transport, self.config.client_id, self.config.client_secret)
        self.poll = poll
        self.jobs_api = jobs_api

    def __repr__(self) -> str:
        return f"Client(host={self.config.host!r}, auth={self.config.auth_type})"

    # ---- transport ---------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        query: Mapping[str, Any] | None = None,
        content_type: str | None = None,
        idempotent: bool | None = None,
    ) -> tuple[int, bytes, dict[str, str]]:
        """One HTTP call to the workspace, retried as the transport retries.

        Args:
            method: ``"GET"``, ``"POST"``, ...
            path: The API path, e.g. ``"/api/2.0/clusters/list"``.
            body: The request body.
            query: Query parameters (None values are left out; booleans as ``true``/``false``).
            content_type: The body's content type.
            idempotent: Whether a failed attempt may be repeated; default True for GET, HEAD, PUT and
                DELETE only.

        Returns:
            ``(status, body, headers)``, header names in lower case.

        Raises:
            RestError: The call failed (after any retries).
        """
        if query:
            path = f"{path}?{urllib.parse.urlencode({k: _query_value(v) for k, v in query.items() if v is not None})}"
        if idempotent is None:
            idempotent = method in _SAFE_METHODS
        try:
            status, data, raw_headers, retries, elapsed = self._transport.call(
                method,
                path,
                body,
                content_type=content_type,
                authorization=self._auth.authorization(),
                idempotent=idempotent,
            )
        except RestError as exc:
            _log_retries(method, path, exc.retries)
            logger.debug("%s %s failed after %d attempt(s): %s", method, path, exc.attempts, exc)
            raise
        _log_retries(method, path, retries)
        logger.debug(
            "%s %s -> %d (%d attempt%s, %.3f s, %d bytes sent, %d received)",
            method,
            path,
            status,
            len(retries) + 1,
            "s" if retries else "",
            elapsed,
            len(body or b""),
            len(data),
        )
        return status, data, _parse_headers(raw_headers)

    def api(
        self,
        method: str,
        path: str,
        payload: Mapping[str, Any] | None = None,
        *,
        query: Mapping[str, Any] | None = None,
        idempotent: bool | None = None,
    ) -> dict[str, Any]:
        """A JSON call: ``payload`` as the body, the parsed answer as the result (``{}`` when empty).

        Raises:
            RestError: The call failed, or the answer is not JSON.
        """
        body = json.dumps(payload).encode() if payload is not None else None
        _status, data, _headers = self.request(
            method,
            path,
            body,
            query=query,
            content_type="application/json" if body is not None else None,
            idempotent=idempotent,
        )
        if not data.strip():
            return {}
        try:
            return json.loads(data)
        except ValueError:
            raise RestError(
                f"{method} {path}: the answer is not JSON", status=_status, method=method, path=path
            ) from None

    # ---- DBFS ----------------------------------------------------------------------

    def dbfs_put(self, path: str, source: Source, *, overwrite: bool = True) -> int:
        """Uploads to ``dbfs:path``; an interrupted upload never leaves a half file there.

        Up to 1 MB goes in one put; more is streamed in 1 MB blocks to a temporary name and moved onto
        ``path`` at the end. DBFS's move does not replace a file, so with ``overwrite`` the old file is
        deleted just before the move. Once the temporary file is complete it is never deleted: if the
        move fails, the RestError names where the upload is (`dbfs_move` it onto ``path``), so the old
        and the new version are never both lost. Only a stream cut before its close is removed.

        Args:
            path: The DBFS path (``dbfs:/x`` or ``/x``).
            source: Bytes, a binary file object or a local file path.
            overwrite: Replace an existing file.

        Returns:
            The number of bytes written.

        Raises:
            RestError: A call failed, or the file exists and ``overwrite`` is False.
        """
        path = _dbfs_path(path)
        with _open_source(source) as f:
            first = f.read(DBFS_BLOCK + 1)
            if len(first) <= DBFS_BLOCK:
                self.api("POST", "/api/2.0/dbfs/put", {"path": path, "contents": _b64(first), "overwrite": overwrite})
                return len(first)
            if not overwrite and found(lambda: self.dbfs_get_status(path)) is not None:
                raise RestError(
                    f"dbfs:{path} exists and overwrite=False",
                    status=None,
                    error_code="RESOURCE_ALREADY_EXISTS",
                    method="POST",
                    path="/api/2.0/dbfs/create",
                )
            tmp = f"{path}.sparkgrad-upload-{uuid.uuid4().hex[:12]}"
            handle = self.api("POST", "/api/2.0/dbfs/create", {"path": tmp, "overwrite": False})["handle"]
            total = 0
            try:
                pending = first
                while pending:
                    more = f.read(DBFS_BLOCK)
                    pending += more
                    while len(pending) >= DBFS_BLOCK or (pending and not more):
                        piece, pending = pending[:DBFS_BLOCK], pending[DBFS_BLOCK:]
                        # not idempotent: a repeated add-block appends twice
                        self.api("POST", "/api/2.0/dbfs/add-block", {"handle": handle, "data": _b64(piece)})
                        total += len(piece)
                # not idempotent either: a repeated close of a closed handle fails
                self.api("POST", "/api/2.0/dbfs/close", {"handle": handle})
            except BaseException:
                self._dbfs_delete_quiet(tmp)
                raise
            if overwrite:
                self._dbfs_delete_quiet(path)
            try:
                self.api("POST", "/api/2.0/dbfs/move", {"source_path": tmp, "destination_path": path})
            except RestError as exc:
                before = "was deleted before the move" if overwrite else "was not touched"
                raise exc.with_text(
                    f"{exc}; the upload of {total} bytes is complete at dbfs:{tmp} and stays there "
                    f"(dbfs:{path} {before}): move it onto dbfs:{path} with Client.dbfs_move"
                ) from exc
            return total

    def dbfs_read(self, path: str) -> bytes:
        """The whole of ``dbfs:path``, read 1 MB at a time."""
        path = _dbfs_path(path)
        out = bytearray()
        while True:
            query = {"path": path, "offset": len(out), "length": DBFS_BLOCK}
            reply = self.api("GET", "/api/2.0/dbfs/read", query=query)
            chunk = base64.b64decode(reply.get("data", ""))
            out += chunk
            if not chunk or reply.get("bytes_read", 0) < DBFS_BLOCK:
                return bytes(out)

    def dbfs_get_status(self, path: str) -> dict[str, Any]:
        """DBFS's file info of ``path``: ``path``, ``is_dir``, ``file_size``, ``modification_time``.

        Raises:
            RestError: ``RESOURCE_DOES_NOT_EXIST`` when there is none.
        """
        return self.api("GET", "/api/2.0/dbfs/get-status", query={"path": _dbfs_path(path)})

    def dbfs_list(self, path: str) -> list[dict[str, Any]]:
        """The file infos of a DBFS directory's entries."""
        return self.api("GET", "/api/2.0/dbfs/list", query={"path": _dbfs_path(path)}).get("files", [])

    def dbfs_mkdirs(self, path: str) -> None:
        """Creates a DBFS directory and its parents (no error if it exists)."""
        self.api("POST", "/api/2.0/dbfs/mkdirs", {"path": _dbfs_path(path)}, idempotent=True)

    def dbfs_delete(self, path: str, *, recursive: bool = False) -> None:
        """Deletes a DBFS file, or a directory (non-empty ones need ``recursive``)."""
        self.api("POST", "/api/2.0/dbfs/delete", {"path": _dbfs_path(path), "recursive": recursive}, idempotent=True)

    def dbfs_move(self, source_path: str, destination_path: str) -> None:
        """Moves a DBFS file or directory; the destination must not exist."""
        self.api(
            "POST",
            "/api/2.0/dbfs/move",
            {"source_path": _dbfs_path(source_path), "destination_path": _dbfs_path(destination_path)},
        )

    def _dbfs_delete_quiet(self, path: str) -> None:
        try:
            found(lambda: self.dbfs_delete(path))
        except RestError as exc:
            logger.debug("could not remove dbfs:%s: %s", path, exc)

    # ---- Files API (Unity Catalog volumes) -----------------------------------------

    def files_put(self, path: str, source: Source, *, overwrite: bool = True) -> int:
        """Uploads to a Unity Catalog volume, ``/Volumes/<catalog>/<schema>/<volume>/...``, in one PUT.

        The service commits a PUT only once its body is complete, so no half file is ever visible
        under ``path``. Without ``overwrite`` a cut upload is not retried (a repeat after a success it
        did not hear of would meet its own file).

        Args:
            path: The volume path.
            source: Bytes, a binary file object or a local file path (read whole into memory).
            overwrite: Replace an existing file.

        Returns:
            The number of bytes written.
        """
        # Design: one PUT of the whole file, no temporary name and no move (the
        # Files API has no move). The service commits a PUT only once its body
        # is complete: a body cut mid-way creates nothing, or leaves the old
        # content when overwriting, so no half file is ever visible under path.
        # A cut PUT with overwrite is retried within the budget; without, it is
        # not (a repeat after a success it did not hear of would meet its own file).
        with _open_source(source) as f:
            data = f.read()
        self.request(
            "PUT",
            _files_path("files", path),
            data,
            query={"overwrite": overwrite},
            content_type="application/octet-stream",
            idempotent=overwrite,  # without overwrite, a repeat after success meets its own file
        )
        return len(data)

    def files_get(self, path: str) -> bytes:
        """The content of a volume file."""
        return self.request("GET", _files_path("files", path))[1]

    def files_head(self, path: str) -> dict[str, str]:
        """The file's headers (content-length, content-type, last-modified)."""
        return self.request("HEAD", _files_path("files", path))[2]

    def files_delete(self, path: str) -> None:
        """Deletes a volume file."""
        self.request("DELETE", _files_path("files", path))

    def directories_create(self, path: str) -> None:
        """Creates a volume directory and its parents."""
        self.request("PUT", _files_path("directories", path))

    def directories_list(self, path: str) -> list[dict[str, Any]]:
        """The entries of a volume directory (every page)."""
        return self._pages(_files_path("directories", path), "contents", {})

    def directories_delete(self, path: str) -> None:
        """Deletes an empty volume directory."""
        self.request("DELETE", _files_path("directories", path))

    # ---- Workspace -----------------------------------------------------------------

    def workspace_import(
        self,
        path: str,
        content: bytes | str,
        *,
        format: str = "SOURCE",
        language: str | None = "PYTHON",
        overwrite: bool = True,
    ) -> None:
        """Imports a notebook or file into the workspace, in one request, applied whole or not at all.

        Args:
            path: The workspace path, e.g. ``/Users/me/train``.
            content: The content (str is encoded as UTF-8), at most 10 MB.
            format: ``"SOURCE"``, ``"JUPYTER"``, ``"AUTO"``, ... as the Workspace API takes them.
            language: The notebook language, for ``"SOURCE"`` only.
            overwrite: Replace an existing object.

        Raises:
            InvalidArgumentError: The content is over 10 MB.
            RestError: The call failed.
        """
        data = content.encode() if isinstance(content, str) else bytes(content)
        if len(data) > WORKSPACE_IMPORT_MAX:
            raise InvalidArgumentError(f"{path}: {len(data)} bytes is over the workspace import limit of 10 MB")
        payload: dict[str, Any] = {"path": path, "format": format, "content": _b64(data), "overwrite": overwrite}
        if format == "SOURCE" and language:
            payload["language"] = language
        self.api("POST", "/api/2.0/workspace/import", payload, idempotent=overwrite)

    def workspace_export(self, path: str, *, format: str = "SOURCE") -> bytes:
        """The content of a workspace object in ``format`` (``"SOURCE"``, ``"JUPYTER"``, ``"HTML"``, ...)."""
        reply = self.api("GET", "/api/2.0/workspace/export", query={"path": path, "format": format})
        return base64.b64decode(reply.get("content", ""))

    def workspace_mkdirs(self, path: str) -> None:
        """Creates a workspace folder and its parents (no error if it exists)."""
        self.api("POST", "/api/2.0/workspace/mkdirs", {"path": path}, idempotent=True)

    def workspace_get_status(self, path: str) -> dict[str, Any]:
        """The object info of a workspace path (``object_type``, ``path``, ``language``, ...)."""
        return self.api("GET", "/api/2.0/workspace/get-status", query={"path": path})

    def workspace_list(self, path: str) -> list[dict[str, Any]]:
        """The object infos of a workspace folder's entries."""
        return self.api("GET", "/api/2.0/workspace/list", query={"path": path}).get("objects", [])

    def workspace_delete(self, path: str, *, recursive: bool = False) -> None:
        """Deletes a workspace object, or a folder (non-empty ones need ``recursive``)."""
        self.api("POST", "/api/2.0/workspace/delete", {"path": path, "recursive": recursive}, idempotent=True)

    # ---- Clusters and libraries ----------------------------------------------------

    def clusters_get(self, cluster_id: str) -> dict[str, Any]:
        """The cluster's info (``state``, ``state_message``, spec, ...)."""
        return self.api("GET", "/api/2.1/clusters/get", query={"cluster_id": cluster_id})

    def clusters_start(self, cluster_id: str) -> None:
        """Starts a terminated cluster (returns at once; see `wait_cluster_running`)."""
        self.api("POST", "/api/2.1/clusters/start", {"cluster_id": cluster_id}, idempotent=True)

    def wait_cluster_running(
        self,
        cluster_id: str,
        *,
        timeout: float = 1200.0,
        start: bool = True,
        info: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Waits until the cluster is RUNNING, starting it if it is TERMINATED.

        Args:
            cluster_id: The cluster.
            timeout: Seconds to wait.
            start: Start a TERMINATED cluster; False fails on one instead.
            info: Its `clusters_get` answer the caller already has (the first poll uses it).

        Returns:
            The cluster's info once RUNNING.

        Raises:
            RestError: The cluster is in ERROR or UNKNOWN, or TERMINATED (or TERMINATING) without ``start``.
            SparkgradTimeout: It was not RUNNING within ``timeout``.
        """
        for n in self._polls(timeout, f"cluster {cluster_id} to be RUNNING"):
            info = dict(info) if n == 0 and info is not None else self.clusters_get(cluster_id)
            state = info.get("state")
            if state == "RUNNING":
                return info
            if state == "TERMINATED" and start:
                self.clusters_start(cluster_id)
            elif state in ("TERMINATED", "ERROR", "UNKNOWN") or (state == "TERMINATING" and not start):
                raise RestError(
                    f"cluster {cluster_id} is {state}: {info.get('state_message', '')}",
                    error_code=str(state),
                    message=info.get("state_message", ""),
                    method="GET",
                    path="/api/2.1/clusters/get",
                )
        raise AssertionError("unreachable")

    def libraries_install(self, cluster_id: str, libraries: Sequence[Mapping[str, Any]]) -> None:
        """Asks the cluster to install libraries; returns at once (see `wait_libraries`).

        ``libraries``: ``{"whl": "/Volumes/.../x.whl"}``, ``{"egg": ...}``, ``{"pypi": {"package": ...}}``.
        """
        self.api(
            "POST",
            "/api/2.0/libraries/install",
            {"cluster_id": cluster_id, "libraries": [dict(lib) for lib in libraries]},
            idempotent=True,
        )

    def libraries_cluster_status(self, cluster_id: str) -> list[dict[str, Any]]:
        """The status of every library on the cluster (``library``, ``status``, ``messages``)."""
        reply = self.api("GET", "/api/2.0/libraries/cluster-status", query={"cluster_id": cluster_id})
        return reply.get("library_statuses", [])

    def wait_libraries(
        self, cluster_id: str, libraries: Sequence[Mapping[str, Any]], *, timeout: float = 900.0
    ) -> list[dict[str, Any]]:
        """Waits until every one of ``libraries`` is INSTALLED on the cluster.

        Returns:
            Their statuses.

        Raises:
            RestError: One FAILED; the message carries the cluster's messages.
            SparkgradTimeout: Not all were installed within ``timeout`` seconds.
        """
        wanted = [dict(lib) for lib in libraries]
        for _ in self._polls(timeout, f"libraries on cluster {cluster_id}"):
            statuses = [s for s in self.libraries_cluster_status(cluster_id) if s.get("library") in wanted]
            for s in statuses:
                if s.get("status") == "FAILED":
                    msg = "; ".join(s.get("messages", [])) or "no message"
                    raise RestError(
                        f"library {s['library']} failed to install on {cluster_id}: {msg}",
                        error_code="FAILED",
                        message=msg,
                        method="GET",
                        path="/api/2.0/libraries/cluster-status",
                    )
            if len(statuses) == len(wanted) and all(s.get("status") == "INSTALLED" for s in statuses):
                return statuses
        raise AssertionError("unreachable")

    # ---- Jobs ----------------------------------------------------------------------

    def _jobs(self, tail: str) -> str:
        return f"/api/{self.jobs_api}/jobs/{tail}"

    def jobs_create(self, settings: Mapping[str, Any]) -> int:
        """Creates a job from its settings (`notebook_job` builds them); returns its ``job_id``."""
        return int(self.api("POST", self._jobs("create"), settings)["job_id"])

    def jobs_reset(self, job_id: int, settings: Mapping[str, Any]) -> None:
        """Replaces a job's settings."""
        self.api("POST", self._jobs("reset"), {"job_id": job_id, "new_settings": settings}, idempotent=True)

    def jobs_get(self, job_id: int) -> dict[str, Any]:
        """The job's info and settings."""
        return self.api("GET", self._jobs("get"), query={"job_id": job_id})

    def jobs_list(self, *, name: str | None = None) -> list[dict[str, Any]]:
        """Every job (with this name, if given), following the pages."""
        return self._pages(self._jobs("list"), "jobs", {"name": name, "limit": 100})

    def jobs_run_now(
        self, job_id: int, *, notebook_params: Mapping[str, str] | None = None, idempotency_token: str | None = None
    ) -> int:
        """Triggers a run of a job; returns its ``run_id``.

        Args:
            job_id: The job.
            notebook_params: Widget values of this run (converted to strings).
            idempotency_token: Makes the call safe to retry: the service starts one run per token.
        """
        payload: dict[str, Any] = {"job_id": job_id}
        if notebook_params:
            payload["notebook_params"] = {str(k): str(v) for k, v in notebook_params.items()}
        if idempotency_token:
            payload["idempotency_token"] = idempotency_token
        return int(self.api("POST", self._jobs("run-now"), payload, idempotent=bool(idempotency_token))["run_id"])

    def runs_submit(self, spec: Mapping[str, Any], *, idempotency_token: str | None = None) -> int:
        """Submits a one-time run without a job (``spec``: ``run_name``, ``tasks``, ...); returns its ``run_id``."""
        payload = dict(spec)
        if idempotency_token:
            payload["idempotency_token"] = idempotency_token
        return int(self.api("POST", self._jobs("runs/submit"), payload, idempotent=bool(idempotency_token))["run_id"])

    def runs_get(self, run_id: int) -> dict[str, Any]:
        """The run's info: ``state`` (``life_cycle_state``, ``result_state``, ``state_message``), ``tasks``, ..."""
        return self.api("GET", self._jobs("runs/get"), query={"run_id": run_id})

    def runs_get_output(self, run_id: int, *, task_key: str | None = None) -> dict[str, Any]:
        """The output of a run's task: ``notebook_output.result`` is what ``dbutils.notebook.exit`` returned.

        Args:
            run_id: A task run, or a job run whose task run is looked up.
            task_key: Picks the task of a job run that has several.

        Raises:
            InvalidArgumentError: The job run has several tasks and ``task_key`` picks none of them.
        """
        run = self.runs_get(run_id)
        tasks = run.get("tasks") or []
        if tasks:
            chosen = [t for t in tasks if task_key is None or t.get("task_key") == task_key]
            if len(chosen) != 1:
                keys = [t.get("task_key") for t in tasks]
                raise InvalidArgumentError(f"run {run_id} has tasks {keys}: give task_key to pick one")
            run_id = chosen[0]["run_id"]
        return self.api("GET", self._jobs("runs/get-output"), query={"run_id": run_id})

    def runs_cancel(self, run_id: int) -> None:
        """Asks for a run to be cancelled (returns at once)."""
        self.api("POST", self._jobs("runs/cancel"), {"run_id": run_id}, idempotent=True)

    def runs_list(self, *, job_id: int | None = None, active_only: bool = False) -> list[dict[str, Any]]:
        """Every run (of one job, if given; only active ones with ``active_only``), following the pages."""
        return self._pages(self._jobs("runs/list"), "runs", {"job_id": job_id, "active_only": active_only, "limit": 25})

    def wait_run(self, run_id: int, *, timeout: float = 3600.0) -> dict[str, Any]:
        """Waits for a run to end (TERMINATED, SKIPPED or INTERNAL_ERROR) and returns its info.

        The caller reads ``state.result_state`` (SUCCESS, FAILED, CANCELED, TIMEDOUT).

        Raises:
            SparkgradTimeout: The run did not end within ``timeout`` seconds.
        """
        for _ in self._polls(timeout, f"run {run_id} to end"):
            run = self.runs_get(run_id)
            if run.get("state", {}).get("life_cycle_state") in TERMINAL_RUN_STATES:
                return run
        raise AssertionError("unreachable")

    def _pages(self, path: str, key: str, query: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The items under key of every page of a GET listing: next_page_token
        goes back as page_token until there is none (or has_more is false)."""
        out: list[dict[str, Any]] = []
        token = None
        while True:
            reply = self.api("GET", path, query={**query, "page_token": token})
            out += reply.get(key, [])
            token = reply.get("next_page_token")
            if not token or not reply.get("has_more", True):
                return out

    def _polls(self, timeout: float, what: str):
        """Yields until timeout s have passed, waiting poll * min(n, 10) s
        between yields; then raises SparkgradTimeout naming what."""
        deadline = time.monotonic() + timeout
        n = 0
        while True:
            yield n
            n += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise SparkgradTimeout(f"gave up waiting for {what} after {timeout:g} s")
            time.sleep(min(left, self.poll * min(n, 10)))


def found(call: Callable[[], T]) -> T | None:
    """call's answer, or None when the service says the thing is not there:
    RESOURCE_DOES_NOT_EXIST / NOT_FOUND, or a 404 to a HEAD (which has no body
    to say more). Any other 404, such as ENDPOINT_NOT_FOUND or a proxy's page
    for a wrong workspace URL, is an error, not an absence."""
    try:
        return call()
    except RestError as exc:
        if exc.error_code in NOT_FOUND_CODES or (exc.status == 404 and exc.method == "HEAD" and not exc.error_code):
            return None
        raise


def _log_retries(method: str, path: str, retries: list[tuple[int | None, str, float]]) -> None:
    for n, (_status, reason, wait) in enumerate(retries, 1):
        logger.debug("%s %s: attempt %d: %s; retrying in %.2f s", method, path, n, reason, wait)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _query_value(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _parse_headers(raw: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in raw.decode("latin-1").split("\r\n"):
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip().lower()] = value.strip()
    return out


def _dbfs_path(path: str) -> str:
    path = path.removeprefix("dbfs:")
    if not path.startswith("/"):
        raise InvalidArgumentError(f"DBFS path {path!r} must be absolute (dbfs:/... or /...)")
    return path


def _files_path(kind: str, path: str) -> str:
    if not path.startswith("/Volumes/"):
        raise InvalidArgumentError(f"Files API path {path!r} must start with /Volumes/<catalog>/<schema>/<volume>/")
    return f"/api/2.0/fs/{kind}{urllib.parse.quote(path)}"


class _open_source:
    """A binary reader over bytes, a file object (left open) or a local path."""

    def __init__(self, source: Source) -> None:
        self._close = False
        if isinstance(source, bytes | bytearray | memoryview):
            self._f: IO[bytes] = io.BytesIO(bytes(source))
        elif isinstance(source, str | os.PathLike):
            self._f = open(source, "rb")  # noqa: SIM115 - closed in __exit__
            self._close = True
        else:
            self._f = source

    def __enter__(self) -> IO[bytes]:
        return self._f

    def __exit__(self, *exc: object) -> None:
        if self._close:
            self._f.close()
