"""vLLM backend: launch argv, counter-delta acceptance from real-format /metrics fixtures, fallbacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends import make_backend
from backends.base import BackendOptions
from backends.prometheus import snapshot_from_text
from backends.vllm import vllm_argv
from loadgen.errors import UserError
from loadgen.record import RequestRecord

FIXTURES = Path(__file__).parent / "fixtures"


def snap(name: str):
    return snapshot_from_text((FIXTURES / name).read_text(), "vllm:")


def test_argv_without_speculation():
    argv = vllm_argv("meta-llama/Llama-3.1-8B-Instruct", 0, "127.0.0.1", 8000, draft="head")
    assert argv == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--host", "127.0.0.1", "--port", "8000",
                    "--max-num-seqs", "256"]


def test_argv_with_three_steps():
    argv = vllm_argv("M", 3, "127.0.0.1", 8001, draft="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", method="eagle3",
                     max_num_seqs=512, extra=["--gpu-memory-utilization", "0.85"], executable="/bin/vllm")
    assert argv[:10] == ["/bin/vllm", "serve", "M", "--host", "127.0.0.1", "--port", "8001", "--max-num-seqs", "512",
                         "--speculative-config"]
    assert argv[10] == ('{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", '
                        '"num_speculative_tokens": 3}')
    assert json.loads(argv[10]) == {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                    "num_speculative_tokens": 3}
    assert argv[11:] == ["--gpu-memory-utilization", "0.85"]


def test_backend_argv_uses_options():
    backend = make_backend("vllm", BackendOptions(model="M", draft="h", algorithm="EAGLE", max_concurrency=300,
                                                  server_args=["--enforce-eager"]))
    argv = backend.build_argv(2, "127.0.0.1", 9)
    assert argv[argv.index("--max-num-seqs") + 1] == "300"
    assert json.loads(argv[argv.index("--speculative-config") + 1])["method"] == "eagle"
    assert argv[-1] == "--enforce-eager"
    with pytest.raises(UserError, match="draft"):
        make_backend("vllm", BackendOptions(model="M")).build_argv(1, "h", 1)


def _backend(steps: int):
    backend = make_backend("vllm", BackendOptions(model="M", draft="h"))
    backend.steps = steps
    return backend


def test_acceptance_from_counter_deltas():
    acc = _backend(3).acceptance(snap("vllm_metrics_before.txt"), snap("vllm_metrics_after.txt"), [])
    assert acc.acceptance_length == pytest.approx(2.8)  # 1 + (420 - 240) / (250 - 150)
    assert acc.acceptance_rate == pytest.approx(0.6)  # 180 / (750 - 450)
    assert acc.per_position == pytest.approx([0.8, 0.6, 0.4])
    assert acc.source == "vllm:/metrics counters" and acc.warning is None


def test_acceptance_after_restart_warns():
    acc = _backend(3).acceptance(snap("vllm_metrics_after.txt"), snap("vllm_metrics_restarted.txt"), [])
    assert acc.acceptance_length == pytest.approx(2.5) and "reset" in acc.warning


def test_acceptance_without_metrics_falls_back_to_proxy():
    rec = RequestRecord("r", "p", None, 0.0, chunk_times=[0.1, 0.2, 0.3], chunk_tokens=[1, 4, 4], end_time=0.3,
                        completion_tokens=9)
    acc = _backend(3).acceptance(None, None, [rec])
    assert acc.acceptance_length == pytest.approx(3.0) and acc.source == "proxy:tokens-per-chunk"
    assert "no /metrics page" in acc.warning


def test_steps_zero_is_one_by_construction():
    acc = _backend(0).acceptance(None, None, [])
    assert (acc.acceptance_length, acc.source) == (1.0, "config:num_steps=0")


def test_missing_executable_names_the_package(monkeypatch):
    monkeypatch.setattr("backends.vllm.find_vllm", lambda: None)
    with pytest.raises(UserError, match="vllm not found: pip install vllm"):
        make_backend("vllm", BackendOptions(model="M")).check_executable()


async def test_running_servers_without_metrics_are_flagged():
    from aiohttp import web

    pages = {"/metrics": None}

    async def health(request):
        return web.Response(status=200)

    async def metrics(request):
        if pages["/metrics"] is None:
            raise web.HTTPNotFound()
        return web.Response(text=pages["/metrics"])

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    try:
        backend = make_backend("vllm", BackendOptions(endpoints={0: url, 3: url}))
        no_page = f"{url} exposes no /metrics: acceptance falls back to tokens per chunk"
        assert await backend.preflight([0, 3]) == [no_page]  # K = 0 needs no counters: warned once
        pages["/metrics"] = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
        assert "no vllm:spec_decode counters" in (await backend.preflight([3]))[0]
        pages["/metrics"] = (FIXTURES / "vllm_metrics_before.txt").read_text()
        assert await backend.preflight([0, 3]) == []
        assert (await backend.start(3)).base_url == url
        before = await backend.snapshot()
        pages["/metrics"] = (FIXTURES / "vllm_metrics_after.txt").read_text()
        acc = backend.acceptance(before, await backend.snapshot(), [])
        assert acc.acceptance_length == pytest.approx(2.8)
        await backend.stop()  # not ours: nothing launched, nothing stopped
        described = {"backend": "vllm", "endpoints": {"0": url, "3": url}, "api_key_env": "OPENAI_API_KEY"}
        assert backend.describe() == described
    finally:
        await runner.cleanup()


def test_schedule_is_merged_into_the_speculative_config(tmp_path):
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps({"num_speculative_tokens": 6, "num_speculative_tokens_per_batch_size":
                                [[1, 8, 6], [9, 32, 4], [33, 128, 3]]}))
    backend = make_backend("vllm", BackendOptions(model="M", draft="h", algorithm="eagle3",
                                                  adaptive_config=str(path)))
    argv = backend.build_argv(4, "127.0.0.1", 9)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": "h", "num_speculative_tokens": 6,
                    "num_speculative_tokens_per_batch_size": [[1, 8, 6], [9, 32, 4], [33, 128, 3]]}
    assert "--speculative-config" not in backend.build_argv(0, "127.0.0.1", 9)
    bare = tmp_path / "bare.json"
    bare.write_text("[[1, 4, 2], [5, 16, 1]]")
    argv = make_backend("vllm", BackendOptions(model="M", draft="h", adaptive_config=str(bare))).build_argv(1, "h", 9)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens"] == 2 and spec["num_speculative_tokens_per_batch_size"] == [[1, 4, 2],
                                                                                                    [5, 16, 1]]


def test_adaptive_config_must_be_a_vllm_schedule(tmp_path):
    path = tmp_path / "sglang.json"
    path.write_text('{"1": {"candidate_steps": [1, 3]}}')
    with pytest.raises(UserError, match="SGLang adaptive config"):
        make_backend("vllm", BackendOptions(model="M", draft="h", adaptive_config=str(path)))
