"""Small async HTTP helpers shared by the backends: URL checks, health probes, GETs of /metrics and JSON.

Every call opens a short-lived :class:`aiohttp.ClientSession`: backends poll a handful of URLs between
measurement windows, never in the hot path, so connection reuse does not matter and nothing leaks between
event loops.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from spectune.core.errors import UserError

from spectune.core.json_types import JsonValue

#: Paths probed, in order, to decide that an OpenAI-compatible server is up.
HEALTH_PATHS = ("/health", "/v1/models")


def normalize_base_url(url: str, what: str = "endpoint") -> str:
    """Check an http(s) URL and return it as ``scheme://host[:port][/prefix]`` without a trailing ``/`` or ``/v1``.

    Raises:
        UserError: the URL has no http/https scheme, no host, or a bad port.
    """
    raw = (url or "").strip()
    parts = urlsplit(raw)
    try:
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok or parts.query:
        raise UserError(f"malformed {what} URL {url!r}: use http://HOST:PORT (for example http://127.0.0.1:8000)")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{parts.scheme}://{parts.netloc}{path}"


def auth_headers(api_key_env: str | None) -> dict[str, str]:
    """``Authorization: Bearer ...`` from the named environment variable, or no headers when it is unset."""
    key = os.environ.get(api_key_env) if api_key_env else None
    return {"Authorization": f"Bearer {key}"} if key else {}


@dataclass
class Reply:
    """One HTTP answer: ``status`` (0 when no answer came), ``text``, and ``error`` (why no answer came)."""

    status: int
    text: str = ""
    error: str | None = None

    def json(self) -> JsonValue:
        """The body parsed as JSON, or None if it is not JSON."""
        try:
            return json.loads(self.text)
        except ValueError:
            return None


async def get(url: str, timeout_s: float = 5.0, headers: dict[str, str] | None = None) -> Reply:
    """GET ``url``; never raises for network errors (they come back as ``Reply(0, error=...)``)."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(url, headers=headers or {}) as resp:
                return Reply(resp.status, await resp.text(errors="replace"))
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
        return Reply(0, error=f"{type(err).__name__}: {err}".rstrip(": "))


async def probe(
    base_url: str, paths: tuple[str, ...] = HEALTH_PATHS, timeout_s: float = 3.0, headers: dict[str, str] | None = None
) -> Reply:
    """Try each health path in order; return the first 200 reply, else the last reply seen.

    A connection error on the first path ends the probe at once (the other paths would fail the same way).
    """
    last = Reply(0, error="no health path")
    for path in paths:
        last = await get(base_url + path, timeout_s, headers)
        if last.status == 200 or last.status == 0:
            return last
    return last


async def check_reachable(base_url: str, headers: dict[str, str] | None = None, timeout_s: float = 5.0) -> None:
    """Make sure a running server answers ``GET /health`` (or ``GET /v1/models``) with 200.

    Raises:
        UserError: no answer (naming the URL and the error), or 401/403 (naming the API-key variable to set),
            or another status.
    """
    reply = await probe(base_url, timeout_s=timeout_s, headers=headers)
    if reply.status == 200:
        return
    if reply.status == 0:
        raise UserError(f"cannot reach {base_url} ({reply.error}): start the server or fix the endpoint URL")
    if reply.status in (401, 403):
        raise UserError(f"{base_url} refused the request (HTTP {reply.status}): set the API key (--api-key-env)")
    raise UserError(f"{base_url} is not healthy: GET /health and /v1/models answered HTTP {reply.status}")
