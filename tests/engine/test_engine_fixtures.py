"""The test helpers themselves: a threaded test server that cannot start says so instead of letting the tests that
use it fail later with a confusing connection error."""

from __future__ import annotations

import socket

import pytest

from helpers import engine as engine_fixtures
from helpers.tiny_models import tiny_engine


def test_threaded_server_that_cannot_bind_raises(monkeypatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(engine_fixtures, "free_port", lambda: taken.getsockname()[1])
        with pytest.raises(RuntimeError, match="failed to start: OSError"):
            engine_fixtures.ThreadedServer(tiny_engine())


def test_threaded_server_serves_health() -> None:
    import requests

    server = engine_fixtures.ThreadedServer(tiny_engine())
    try:
        assert requests.get(server.url + "/health", timeout=10).status_code == 200
    finally:
        server.close()
