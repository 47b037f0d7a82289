"""vLLM backend: launch argv, counter-delta acceptance from real-format /metrics fixtures, fallbacks."""

from __future__ import annotations

import json

import pytest

from spectune.backends import make_backend
from spectune.backends.options import BackendOptions
from spectune.backends.prometheus import snapshot_from_text
from spectune.backends.vllm import VllmInstall, vllm_argv
from spectune.core.errors import UserError
from spectune.loadgen.record import RequestRecord
from helpers.paths import FIXTURES as FIXTURES_DIR
from helpers.web import runner_url

FIXTURES = FIXTURES_DIR


def snap(name: str):
    return snapshot_from_text((FIXTURES / name).read_text(), "vllm:")


def test_argv_without_speculation():
    argv = vllm_argv("meta-llama/Llama-3.1-8B-Instruct", 0, "127.0.0.1", 8000, draft="head",
                     per_request_metrics=True)  # vLLM refuses per-request spec metrics without speculation
    assert argv == ["vllm", "serve", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--host", "127.0.0.1", "--port",
                    "8000"]


def test_argv_with_three_steps():
    argv = vllm_argv("M", 3, "127.0.0.1", 8001, draft="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", method="eagle3",
                     max_num_seqs=512, extra=["--gpu-memory-utilization", "0.85"],
                     launcher=["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"])
    assert argv[:12] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "M", "--host",
                         "127.0.0.1", "--port", "8001", "--max-num-seqs", "512", "--speculative-config"]
    assert argv[12] == ('{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", '
                        '"num_speculative_tokens": 3}')
    assert json.loads(argv[12]) == {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                    "num_speculative_tokens": 3}
    assert argv[13:] == ["--gpu-memory-utilization", "0.85"]


GPU_VLLM = VllmInstall("/venv/bin/python", "vllm", None, "2.13.0", "test")


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    """Launch decisions must not depend on the machine the tests run on: no GPU, a GPU build of vLLM of unknown
    version (so no per-request metrics flag and no CPU sizing unless a test says so)."""
    monkeypatch.setattr("spectune.backends.vllm.backend.detect_gpu", lambda: None)
    monkeypatch.setattr("spectune.backends.vllm.backend.find_vllm", lambda: GPU_VLLM)


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
    assert acc.source == "vllm:/metrics counters"
    assert acc.warning is None


def test_acceptance_after_restart_warns():
    acc = _backend(3).acceptance(snap("vllm_metrics_after.txt"), snap("vllm_metrics_restarted.txt"), [])
    assert acc.acceptance_length == pytest.approx(2.5)
    assert "reset" in acc.warning


def test_acceptance_without_metrics_falls_back_to_proxy():
    rec = RequestRecord("r", "p", None, 0.0, chunk_times=[0.1, 0.2, 0.3], chunk_tokens=[1, 4, 4], end_time=0.3,
                        completion_tokens=9)
    acc = _backend(3).acceptance(None, None, [rec])
    assert acc.acceptance_length == pytest.approx(3.0)
    assert acc.source == "proxy:tokens-per-chunk"
    assert "no /metrics page" in acc.warning


def test_steps_zero_is_one_by_construction():
    acc = _backend(0).acceptance(None, None, [])
    assert (acc.acceptance_length, acc.source) == (1.0, "config:num_steps=0")


def test_missing_vllm_names_the_install_command(monkeypatch, tmp_path):
    """No SPECTUNE_VLLM_PYTHON, no install record, no vllm importable here or on PATH: one line naming the fix."""
    from spectune.backends.vllm import install

    monkeypatch.undo()
    monkeypatch.setenv("SPECTUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_VLLM_PYTHON", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(install, "_install_from", lambda python, source: None)
    with pytest.raises(UserError, match=r"vLLM not found: run `spectune vllm install`"):
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
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = runner_url(runner)
    try:
        backend = make_backend("vllm", BackendOptions(endpoints={0: url, 3: url}))
        no_page = f"{url} exposes no /metrics: acceptance falls back to tokens per chunk"
        assert await backend.preflight([0, 3]) == [no_page]  # K = 0 needs no counters: warned once
        pages["/metrics"] = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
        assert "no vllm:spec_decode counters" in (await backend.preflight([3]))[0]
        pages["/metrics"] = (FIXTURES / "vllm_metrics_before.txt").read_text()  # two engines: data parallel
        [dp] = await backend.preflight([0, 3])
        assert dp.startswith(f"data-parallel size 2 ({url} reports 2 engines)")
        assert (await backend.start(3)).base_url == url
        before = await backend.snapshot()
        pages["/metrics"] = (FIXTURES / "vllm_metrics_after.txt").read_text()
        acc = backend.acceptance(before, await backend.snapshot(), [])
        assert acc.acceptance_length == pytest.approx(2.8)
        await backend.stop()  # not ours: nothing launched, nothing stopped
        described = {"backend": "vllm", "endpoints": {"0": url, "3": url}, "api_key_env": "OPENAI_API_KEY",
                     "data_parallel_size": 2}
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
    assert spec["num_speculative_tokens"] == 2
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 4, 2],                                                                                                     [5, 16, 1]]


def test_adaptive_config_must_be_a_vllm_schedule(tmp_path):
    path = tmp_path / "sglang.json"
    path.write_text('{"1": {"candidate_steps": [1, 3]}}')
    with pytest.raises(UserError, match="SGLang adaptive config"):
        make_backend("vllm", BackendOptions(model="M", draft="h", adaptive_config=str(path)))


GIB = 1 << 30


def test_vllm_default_max_num_seqs_rule():
    """vllm/engine/arg_utils.py get_batch_defaults (API server): 1024 at >= 70 GiB unless A100, else 256."""
    from spectune.backends.vllm import vllm_default_max_num_seqs

    assert vllm_default_max_num_seqs("NVIDIA H100 80GB HBM3", 80 * GIB) == 1024
    assert vllm_default_max_num_seqs("NVIDIA A100-SXM4-80GB", 80 * GIB) == 256
    assert vllm_default_max_num_seqs("NVIDIA L40S", 45 * GIB) == 256
    assert vllm_default_max_num_seqs(None, None) == 256


def test_max_num_seqs_left_to_vllm_unless_the_plan_needs_more(monkeypatch):
    """On an H100 vLLM's default is 1024: a sweep to concurrency 300 must not shrink it (it sizes the schedule's
    lookup and CUDA-graph capture); on an A100 (default 256) the plan needs 300 and passes it."""
    monkeypatch.setattr("spectune.backends.vllm.backend.detect_gpu", lambda: ("NVIDIA H100 80GB HBM3", 80 * GIB))
    h100 = make_backend("vllm", BackendOptions(model="M", draft="h", max_concurrency=300))
    assert "--max-num-seqs" not in h100.build_argv(2, "127.0.0.1", 9)
    assert h100.describe()["max_num_seqs"]["value"] == 1024
    monkeypatch.setattr("spectune.backends.vllm.backend.detect_gpu", lambda: ("NVIDIA A100-SXM4-80GB", 80 * GIB))
    a100 = make_backend("vllm", BackendOptions(model="M", draft="h", max_concurrency=300))
    argv = a100.build_argv(2, "127.0.0.1", 9)
    assert argv[argv.index("--max-num-seqs") + 1] == "300"
    assert a100.describe()["max_num_seqs"]["source"].startswith("passed: the plan needs 300")


def test_max_num_seqs_from_server_args_wins():
    backend = make_backend("vllm", BackendOptions(model="M", draft="h", max_concurrency=600,
                                                  server_args=["--max-num-seqs=2048"]))
    argv = backend.build_argv(2, "127.0.0.1", 9)
    assert [a for a in argv if a.startswith("--max-num-seqs")] == ["--max-num-seqs=2048"]
    assert backend.describe()["max_num_seqs"] == {"value": 2048, "source": "--server-args"}


async def test_data_parallel_launch_warns_that_the_schedule_is_ignored(tmp_path, monkeypatch):
    """vLLM drops num_speculative_tokens_per_batch_size at --data-parallel-size > 1: a validate run would measure a
    static server while believing it runs the schedule."""
    path = tmp_path / "schedule.json"
    path.write_text("[[1, 4, 3], [5, 64, 1]]")
    backend = make_backend("vllm", BackendOptions(model="M", draft="h", adaptive_config=str(path),
                                                  server_args=["-dp", "2"]))
    [warning] = await backend.preflight([3])
    assert "ignores num_speculative_tokens_per_batch_size at data-parallel size 2" in warning
    assert backend.describe()["data_parallel_size"] == 2
    plain = make_backend("vllm", BackendOptions(model="M", draft="h", server_args=["--data-parallel-size=4"]))
    assert "schedule recommended from this sweep" in (await plain.preflight([0, 2]))[0]
    assert await make_backend("vllm", BackendOptions(model="M", draft="h")).preflight([2]) == []


def test_per_request_metrics_flag_needs_vllm_0_29(monkeypatch):
    monkeypatch.setattr("spectune.backends.vllm.backend.find_vllm",
                        lambda: VllmInstall("/venv/bin/python", "vllm", "0.29.0", None, "test"))
    backend = make_backend("vllm", BackendOptions(model="M", draft="h"))
    argv = backend.build_argv(3, "127.0.0.1", 9)
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "summary"
    assert "--per-request-spec-decode-metrics" not in backend.build_argv(0, "127.0.0.1", 9)
    monkeypatch.setattr("spectune.backends.vllm.backend.find_vllm",
                        lambda: VllmInstall("/venv/bin/python", "vllm", "0.28.2", None, "test"))
    backend = make_backend("vllm", BackendOptions(model="M", draft="h"))
    assert "--per-request-spec-decode-metrics" not in backend.build_argv(3, "127.0.0.1", 9)
    assert backend.describe()["per_request_spec_decode_metrics"] == "off: vLLM 0.28.2 predates the flag (0.29)"


def vllm_record(i: int, spec: dict | None) -> RequestRecord:
    """A record whose final usage chunk carried vLLM's top-level ``metrics`` object."""
    stats = None if spec is None else {"metrics": {"e2e_latency": 1.0, "speculative_decoding": spec}}
    return RequestRecord(f"r{i}", f"p{i}", None, 0.0, chunk_times=[0.1, 0.2], chunk_tokens=[1, 3], end_time=0.3,
                         completion_tokens=4, server_stats=stats)


# Two requests in vLLM's summary format (acceptance_metrics.md): K = 3, sparse and dense histograms.
PER_REQUEST = [
    {"mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.5, "acceptance_histogram": {"0": 10, "1": 10, "3": 20},
     "num_spec_steps": 40, "num_accepted_draft_tokens": 70, "num_draft_tokens": 120, "num_spec_tokens": 3},
    {"mean_acceptance_length": 1.5, "draft_acceptance_rate": 0.2, "acceptance_histogram": [30, 20, 10, 0],
     "num_spec_steps": 60, "num_accepted_draft_tokens": 40, "num_draft_tokens": 180, "num_spec_tokens": 3},
]


def test_per_request_metrics_are_summed_over_the_window():
    acc = _backend(3).acceptance(None, None, [vllm_record(i, m) for i, m in enumerate(PER_REQUEST)])
    assert acc.source == "vllm:per-request"
    assert acc.acceptance_length == pytest.approx(1 + 110 / 100)  # (70 + 40) accepted / (40 + 60) spec steps
    assert acc.acceptance_rate == pytest.approx(110 / 300)
    # summed histogram [40, 30, 10, 20]: > 0, > 1, > 2 accepted drafts over 100 steps
    assert acc.per_position == pytest.approx([0.6, 0.3, 0.2])
    assert acc.num_drafts == 100
    assert acc.warning is None


def test_per_request_metrics_cross_checked_against_counters():
    """The fixtures' counter deltas give 2.8; per-request sums of 2.1 disagree and are flagged, both recorded."""
    records = [vllm_record(i, m) for i, m in enumerate(PER_REQUEST)]
    acc = _backend(3).acceptance(snap("vllm_metrics_before.txt"), snap("vllm_metrics_after.txt"), records)
    assert acc.source == "vllm:per-request"
    assert acc.acceptance_length == pytest.approx(2.1)
    assert acc.cross_check == {"source": "vllm:/metrics counters", "acceptance_length": pytest.approx(2.8),
                               "acceptance_rate": pytest.approx(0.6)}
    assert "/metrics counters give acceptance length 2.800" in acc.warning
    agree = [vllm_record(0, {"num_spec_steps": 100, "num_accepted_draft_tokens": 180, "num_draft_tokens": 300,
                             "acceptance_histogram": [20, 20, 20, 40]})]
    assert _backend(3).acceptance(snap("vllm_metrics_before.txt"), snap("vllm_metrics_after.txt"), agree).warning \
        is None


def test_without_per_request_metrics_the_counters_remain():
    acc = _backend(3).acceptance(snap("vllm_metrics_before.txt"), snap("vllm_metrics_after.txt"),
                                 [vllm_record(0, None)])
    assert acc.source == "vllm:/metrics counters"
    assert acc.cross_check is None
