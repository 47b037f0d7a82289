"""The openai backend and make_backend: endpoint selection, preflight, health fallbacks, counters, validation."""

from __future__ import annotations

import json


import pytest
from aiohttp import web

from spectune.backends import BACKEND_NAMES, make_backend
from spectune.backends.options import BackendOptions
from spectune.backends.http import normalize_base_url
from spectune.backends.openai import EndpointSet
from spectune.backends.process import free_port
from spectune.core.errors import UserError
from spectune.loadgen.record import RequestRecord
from helpers.paths import FIXTURES as FIXTURES_DIR
from helpers.web import runner_url

FIXTURES = FIXTURES_DIR


class Server:
    """An in-process aiohttp server with configurable /health, /v1/models and /metrics answers."""

    def __init__(self, health: int | None = 200, models: int | None = 200) -> None:
        self.metrics_text: str | None = None
        self.auth: list[str | None] = []
        app = web.Application()
        if health is not None:
            app.router.add_get("/health", self._status(health))
        if models is not None:
            app.router.add_get("/v1/models", self._status(models))
        app.router.add_get("/metrics", self._metrics)
        self.runner = web.AppRunner(app)

    def _status(self, code: int):
        async def handler(request: web.Request) -> web.Response:
            self.auth.append(request.headers.get("Authorization"))
            return web.Response(status=code, text="{}")
        return handler

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics_text is None:
            raise web.HTTPNotFound()
        return web.Response(text=self.metrics_text)

    async def __aenter__(self) -> str:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        return runner_url(self.runner)

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()


def test_endpoint_selection():
    eps = EndpointSet({0: "http://a:1/v1/", 3: "http://b:2", -1: "https://c"})
    assert (eps.url_for(0), eps.url_for(3), eps.url_for(7)) == ("http://a:1", "http://b:2", "https://c")
    with pytest.raises(UserError, match=r"no endpoint for num_steps 5 \(have 0=http://a:1\)"):
        EndpointSet({0: "http://a:1"}).url_for(5)


@pytest.mark.parametrize("url", ["localhost:8000", "ftp://h:1", "http://:80", "http://h:99999", ""])
def test_malformed_urls_are_named(url):
    with pytest.raises(UserError, match="malformed endpoint URL"):
        normalize_base_url(url)
    with pytest.raises(UserError, match="malformed"):
        make_backend("openai", BackendOptions(endpoints={0: url}))


def test_make_backend_names_and_validation():
    with pytest.raises(UserError, match="unknown backend 'tgi': use one of openai, launch, sglang, vllm, llamacpp, local"):
        make_backend("tgi", BackendOptions())
    with pytest.raises(UserError, match="--endpoint"):
        make_backend("openai", BackendOptions())
    from spectune.backends.local.backend import LocalBackend

    assert type(make_backend("local", BackendOptions())) is LocalBackend
    assert BACKEND_NAMES == ("openai", "launch", "sglang", "vllm", "llamacpp", "local")


async def test_preflight_names_an_unreachable_endpoint():
    async with Server() as url:
        dead = f"http://127.0.0.1:{free_port()}"
        backend = make_backend("openai", BackendOptions(endpoints={0: url, 3: dead}))
        await backend.preflight([0])
        with pytest.raises(UserError, match=f"cannot reach {dead}"):
            await backend.preflight([0, 3])
        with pytest.raises(UserError, match="no endpoint for num_steps 1"):
            await backend.preflight([1])


async def test_models_fallback_and_unhealthy_answers():
    async with Server(health=None) as url:  # no /health route (404): /v1/models decides
        endpoint = await make_backend("openai", BackendOptions(endpoints={-1: url})).start(2)
        assert endpoint.base_url == url
        assert endpoint.model is None
    async with Server(health=503, models=404) as url:
        with pytest.raises(UserError, match="HTTP 404"):
            await make_backend("openai", BackendOptions(endpoints={-1: url})).start(2)
    async with Server(health=401, models=401) as url:
        with pytest.raises(UserError, match="API key"):
            await make_backend("openai", BackendOptions(endpoints={-1: url})).start(2)


async def test_api_key_sent_but_never_described(monkeypatch):
    monkeypatch.setenv("SPECTUNE_TEST_KEY", "sk-secret")
    server = Server()
    async with server as url:
        backend = make_backend("openai", BackendOptions(endpoints={-1: url}, api_key_env="SPECTUNE_TEST_KEY"))
        await backend.start(1)
    assert server.auth[0] == "Bearer sk-secret"
    assert "sk-secret" not in json.dumps(backend.describe())


async def test_counters_used_when_the_server_has_them_else_proxy():
    server = Server()
    rec = RequestRecord("r", "p", None, 0.0, chunk_times=[0.1, 0.2], chunk_tokens=[1, 2], end_time=0.2,
                        completion_tokens=3)
    async with server as url:
        backend = make_backend("openai", BackendOptions(endpoints={-1: url}))
        await backend.start(3)
        assert backend.acceptance(await backend.snapshot(), await backend.snapshot(), [rec]).source == \
            "proxy:tokens-per-chunk"  # no /metrics page: mean tokens per chunk = 3 / 2
        server.metrics_text = (FIXTURES / "vllm_metrics_before.txt").read_text()
        before = await backend.snapshot()
        server.metrics_text = (FIXTURES / "vllm_metrics_after.txt").read_text()
        after = await backend.snapshot()
    acc = backend.acceptance(before, after, [rec])
    assert acc.acceptance_length == pytest.approx(2.8)
    assert acc.source == "vllm:/metrics counters"
