"""Serve an aiohttp application on a free local port for the length of a test."""

from __future__ import annotations

import contextlib
from typing import AsyncIterator

from aiohttp import web


def runner_url(runner: web.AppRunner) -> str:
    """``http://127.0.0.1:PORT`` of a started runner's first site (aiohttp's public ``AppRunner.addresses``)."""
    host, port = runner.addresses[0][:2]
    return f"http://{host}:{port}"


@contextlib.asynccontextmanager
async def serve_app(app: web.Application, shutdown_timeout: float = 1.0) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 at a free port; yields its base URL, cleans up on exit."""
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield runner_url(runner)
    finally:
        await runner.cleanup()
