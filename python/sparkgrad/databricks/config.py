"""Where the Databricks client's host and credentials come from, and OAuth M2M.

Resolution, attribute by attribute, first found wins (as the Databricks CLI
and SDK do): arguments; DATABRICKS_HOST / DATABRICKS_TOKEN /
DATABRICKS_CLIENT_ID / DATABRICKS_CLIENT_SECRET; the profile of
``~/.databrickscfg`` (DATABRICKS_CONFIG_FILE moves it) named by the argument or
DATABRICKS_CONFIG_PROFILE, else ``[DEFAULT]``; inside a Databricks notebook,
the notebook context's API URL and token. A personal access token wins over an
OAuth client when both are present.

OAuth machine-to-machine: POST ``{host}/oidc/v1/token`` with the client id and
secret as HTTP Basic credentials, ``grant_type=client_credentials&scope=all-apis``;
the access token is kept until 60 s before ``expires_in`` runs out.

Not here: U2M (browser) OAuth, Azure CLI / MSI auth, account-level hosts.
"""

from __future__ import annotations

import base64
import configparser
import dataclasses
import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from sparkgrad.errors import DatabricksConfigError

DEFAULT_CONFIG_FILE = "~/.databrickscfg"
__all__ = ["Config", "DatabricksConfigError", "OAuthM2M", "StaticToken", "normalize_host", "resolve_config"]
TOKEN_REFRESH_MARGIN_S = 60.0
logger = logging.getLogger("sparkgrad.databricks")


@dataclasses.dataclass(frozen=True)
class Config:
    """A resolved workspace: its host and either a personal access token or an OAuth client.

    `resolve_config` builds it. The token and the client secret are left out of ``repr``.
    """

    host: str
    """``https://...``, without a trailing ``/``."""
    token: str | None = dataclasses.field(default=None, repr=False)
    """A personal access token, or None with an OAuth client."""
    client_id: str | None = None
    """The OAuth machine-to-machine client id (service principal), or None with a token."""
    client_secret: str | None = dataclasses.field(default=None, repr=False)
    """The OAuth client's secret, or None with a token."""
    source: str = ""
    """Where each value came from, e.g. ``"host from DATABRICKS_HOST; token from ~/.databrickscfg [DEFAULT]"``."""

    @property
    def auth_type(self) -> str:
        """``"pat"`` (a token) or ``"oauth-m2m"`` (a client id and secret)."""
        return "pat" if self.token else "oauth-m2m"


def normalize_host(host: str) -> str:
    """``host`` stripped of blanks and trailing ``/``, with ``https://`` added when it has no scheme."""
    host = host.strip().rstrip("/")
    if "://" not in host:
        host = "https://" + host
    return host


def _notebook_context() -> tuple[str, str] | None:
    """(api url, api token) of the notebook this runs in, or None outside one."""
    try:
        from IPython import get_ipython  # type: ignore[import-not-found]
    except ImportError:
        return None
    shell = get_ipython()
    dbutils = shell.user_ns.get("dbutils") if shell is not None else None
    if dbutils is None:
        return None
    try:
        ctx = dbutils.notebook.entry_point.getDbutils().notebook().getContext()
        return ctx.apiUrl().get(), ctx.apiToken().get()
    except Exception:  # not a Databricks dbutils (the local runner's has no entry_point)
        return None


def resolve_config(
    host: str | None = None,
    token: str | None = None,
    *,
    client_id: str | None = None,
    client_secret: str | None = None,
    profile: str | None = None,
    config_file: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    notebook_context: Callable[[], tuple[str, str] | None] | None = _notebook_context,
) -> Config:
    """The workspace to talk to, resolved as the Databricks CLI and SDK resolve it.

    Attribute by attribute, the first found wins: the arguments; the environment variables
    ``DATABRICKS_HOST``, ``DATABRICKS_TOKEN``, ``DATABRICKS_CLIENT_ID``, ``DATABRICKS_CLIENT_SECRET``;
    the profile of ``~/.databrickscfg`` (``DATABRICKS_CONFIG_FILE`` moves it) named by ``profile`` or
    ``DATABRICKS_CONFIG_PROFILE``, else ``[DEFAULT]``; inside a Databricks notebook, the notebook
    context's API URL and token. A personal access token wins over an OAuth client when both are found.

    Args:
        host: The workspace URL (``https://`` is added when missing).
        token: A personal access token.
        client_id: An OAuth machine-to-machine client id (with ``client_secret``).
        client_secret: The OAuth client's secret.
        profile: A profile of the config file.
        config_file: The config file (default ``~/.databrickscfg``).
        env: The environment to read (default ``os.environ``).
        notebook_context: Returns the notebook's ``(api url, token)`` or None; None skips the lookup.

    Raises:
        DatabricksConfigError: The host or the credentials are missing (the message lists every
            variable and file it read), the named profile does not exist, or the file is not valid.
    """
    env = os.environ if env is None else env
    values: dict[str, str] = {}
    origin: dict[str, str] = {}
    read: list[str] = []

    def offer(key: str, value: str | None, where: str) -> None:
        if value and key not in values:
            values[key] = value
            origin[key] = where

    for key, value in (("host", host), ("token", token), ("client_id", client_id), ("client_secret", client_secret)):
        offer(key, value, "arguments")
    for key in ("host", "token", "client_id", "client_secret"):
        var = "DATABRICKS_" + key.upper()
        read.append(var)
        offer(key, env.get(var), var)
    profile_name = profile or env.get("DATABRICKS_CONFIG_PROFILE") or None
    path = os.path.expanduser(str(config_file or env.get("DATABRICKS_CONFIG_FILE") or DEFAULT_CONFIG_FILE))
    # [DEFAULT] is a profile like any other: its keys must not leak into the others
    parser = configparser.ConfigParser(interpolation=None, default_section="\0")
    section = profile_name or "DEFAULT"
    try:
        found = bool(parser.read(path))
    except configparser.Error as exc:
        raise DatabricksConfigError(f"{path} is not a valid config file: {exc}") from None
    read.append(f"{path} [{section}]" + ("" if found else " (no such file)"))
    if found:
        if profile_name and not parser.has_section(profile_name):
            raise DatabricksConfigError(
                f"profile [{profile_name}] is not in {path} (it has {', '.join(parser.sections()) or 'no profiles'})"
            )
        items = parser[section] if parser.has_section(section) else {}
        for key in ("host", "token", "client_id", "client_secret"):
            offer(key, items.get(key), f"{path} [{section}]")
    elif profile_name:
        raise DatabricksConfigError(f"profile [{profile_name}] was asked for but {path} does not exist")
    if notebook_context is not None and ("host" not in values or not _has_credentials(values)):
        read.append("the notebook context")
        ctx = notebook_context()
        if ctx is not None:
            offer("host", ctx[0], "the notebook context")
            offer("token", ctx[1], "the notebook context")
    missing = [] if "host" in values else ["host (DATABRICKS_HOST)"]
    if not _has_credentials(values):
        missing.append("token (DATABRICKS_TOKEN) or OAuth client (DATABRICKS_CLIENT_ID + DATABRICKS_CLIENT_SECRET)")
    if missing:
        raise DatabricksConfigError(f"no Databricks {' and no '.join(missing)}; read: {', '.join(read)}")
    token_value = values.get("token")
    where = {k: origin[k] for k in ("host", "token", "client_id", "client_secret") if k in origin}
    return Config(
        host=normalize_host(values["host"]),
        token=token_value,
        client_id=None if token_value else values["client_id"],
        client_secret=None if token_value else values["client_secret"],
        source="; ".join(f"{k} from {v}" for k, v in where.items()),
    )


def _has_credentials(values: Mapping[str, str]) -> bool:
    return "token" in values or ("client_id" in values and "client_secret" in values)


class OAuthM2M:
    """Authorization values for an OAuth service principal, fetched from
    ``/oidc/v1/token`` through ``transport`` (a _core.RestClient) and cached
    until TOKEN_REFRESH_MARGIN_S before expiry. Thread-safe."""

    def __init__(
        self, transport: Any, client_id: str, client_secret: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._transport = transport
        self._basic = "Basic " + base64.b64encode(f"{client_id}:{client_secret}".encode()).decode()
        self._clock = clock
        self._lock = threading.Lock()
        self._value: str | None = None
        self._expires = 0.0

    def authorization(self) -> str:
        with self._lock:
            if self._value is None or self._clock() >= self._expires - TOKEN_REFRESH_MARGIN_S:
                self._fetch()
            assert self._value is not None
            return self._value

    def _fetch(self) -> None:
        body = urllib.parse.urlencode({"grant_type": "client_credentials", "scope": "all-apis"}).encode()
        started = self._clock()
        status, data, _headers, retries, elapsed = self._transport.call(
            "POST",
            "/oidc/v1/token",
            body,
            content_type="application/x-www-form-urlencoded",
            authorization=self._basic,
            idempotent=True,
        )
        try:
            reply = json.loads(data)
            token, kind, lifetime = reply["access_token"], reply.get("token_type", "Bearer"), float(reply["expires_in"])
        except (ValueError, KeyError, TypeError):
            raise DatabricksConfigError(
                "/oidc/v1/token answered without access_token and expires_in (is the host a workspace URL?)"
            ) from None
        self._value = f"{kind} {token}"
        self._expires = started + lifetime
        logger.debug(
            "POST /oidc/v1/token -> %d (%d attempt%s, %.3f s): an access token for %g s",
            status,
            len(retries) + 1,
            "s" if retries else "",
            elapsed,
            lifetime,
        )


class StaticToken:
    """The Authorization value of a personal access token."""

    def __init__(self, token: str) -> None:
        self._value = "Bearer " + token

    def authorization(self) -> str:
        return self._value
