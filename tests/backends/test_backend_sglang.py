"""SGLang backend: launch argv, per-request spec details, /server_info, acceptance source order."""

from __future__ import annotations

import json

import pytest

from spectune.backends import make_backend
from spectune.backends.options import BackendOptions
from spectune.backends.snapshots import SpecSnapshot
from spectune.backends.eagle_heads import eagle_version
from spectune.backends.sglang import per_request_acceptance, server_info_stats, sglang_argv, spec_details
from spectune.core.errors import UserError
from spectune.loadgen.record import RequestRecord
from helpers.paths import FIXTURES as FIXTURES_DIR
from helpers.web import runner_url

FIXTURES = FIXTURES_DIR
RESPONSES = json.loads((FIXTURES / "sglang_responses.json").read_text())


def record(i: int, answer: dict | None, completion_tokens: int | None = None) -> RequestRecord:
    """A successful record whose server_stats holds an SGLang answer (minus choices/usage), as the client keeps it."""
    stats = None if answer is None else {k: v for k, v in answer.items() if k != "usage"}
    if completion_tokens is None and answer is not None:
        completion_tokens = (answer.get("usage") or answer.get("meta_info") or {}).get("completion_tokens")
    return RequestRecord(f"r{i}", f"p{i}", None, 0.0, chunk_times=[0.1, 0.2], chunk_tokens=[1, 3],
                         end_time=0.3, completion_tokens=completion_tokens, server_stats=stats)


def test_argv_without_speculation():
    argv = sglang_argv("meta-llama/Llama-3.1-8B-Instruct", 0, "127.0.0.1", 30000, draft="head", python="python")
    assert argv == ["python", "-m", "sglang.launch_server", "--model-path", "meta-llama/Llama-3.1-8B-Instruct",
                    "--host", "127.0.0.1", "--port", "30000", "--max-running-requests", "48", "--enable-metrics"]


def test_argv_with_three_steps():
    argv = sglang_argv("M", 3, "0.0.0.0", 30001, draft="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", algorithm="EAGLE3",
                       max_running_requests=64, extra=["--mem-fraction-static", "0.8"], python="/py")
    assert argv == ["/py", "-m", "sglang.launch_server", "--model-path", "M", "--host", "0.0.0.0", "--port", "30001",
                    "--max-running-requests", "64", "--enable-metrics",
                    "--speculative-algorithm", "EAGLE3",
                    "--speculative-draft-model-path", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                    "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                    "--speculative-num-draft-tokens", "4", "--mem-fraction-static", "0.8"]


def test_argv_needs_a_draft_for_speculation():
    with pytest.raises(UserError, match="draft"):
        sglang_argv("M", 2, "127.0.0.1", 1, draft=None)


def test_backend_sizes_running_requests_for_the_sweep():
    low = make_backend("sglang", BackendOptions(model="M", draft="h", algorithm="eagle", max_concurrency=16))
    high = make_backend("sglang", BackendOptions(model="M", draft="h", max_concurrency=96))
    argv_low, argv_high = low.build_argv(1, "127.0.0.1", 9), high.build_argv(1, "127.0.0.1", 9)
    assert argv_low[argv_low.index("--max-running-requests") + 1] == "48"
    assert argv_high[argv_high.index("--max-running-requests") + 1] == "96"
    assert argv_low[argv_low.index("--speculative-algorithm") + 1] == "EAGLE"


def test_eagle_version_from_config(tmp_path):
    e3 = tmp_path / "e3"
    e3.mkdir()
    (e3 / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    (vocab / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "draft_vocab_size": 32000}))
    e1 = tmp_path / "e1"
    e1.mkdir()
    (e1 / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert eagle_version(str(e3))[0] == "eagle3"
    assert eagle_version(str(vocab))[0] == "eagle3"
    assert eagle_version(str(e1)) == ("eagle", str(e1 / "config.json"))
    backend = make_backend("sglang", BackendOptions(model="M", draft=str(e3)))
    assert backend.build_argv(2, "h", 1)[backend.build_argv(2, "h", 1).index("--speculative-algorithm") + 1] == "EAGLE3"


def test_construction_needs_model_or_endpoints():
    with pytest.raises(UserError, match="--model"):
        make_backend("sglang", BackendOptions())
    with pytest.raises(UserError, match="malformed endpoint URL 'localhost:30000'"):
        make_backend("sglang", BackendOptions(endpoints={3: "localhost:30000"}))
    assert make_backend("sglang", BackendOptions(endpoints={-1: "http://127.0.0.1:30000/v1/"})).remote is not None


def test_spec_details_found_in_every_shape():
    current = RESPONSES["current"][0]
    details = current["sglext"]["spec_tokens_details"]
    assert spec_details({"sglext": current["sglext"]}) == details
    assert spec_details({"spec_tokens_details": [details]}) == details
    assert spec_details(RESPONSES["legacy_meta_info"][0])["spec_accept_token_num"] == 29
    assert spec_details({"spec_verify_ct": 3}) == {"spec_verify_ct": 3}
    assert spec_details({"spec_decode": {}}) is None
    assert spec_details(None) is None


def test_per_request_acceptance_current_fields():
    records = [record(i, a) for i, a in enumerate(RESPONSES["current"])]
    acc = per_request_acceptance(records)
    # 1 + accepted drafts (60 + 25) / verify steps (40 + 20); SGLang's completion/verify would be 147 / 60
    assert acc.acceptance_length == pytest.approx(1 + 85 / 60)
    # accepted 60 + 25 over proposed 120 + 60
    assert acc.acceptance_rate == pytest.approx(85 / 180)
    # summed histogram [15, 15, 20, 10] (60 verify steps): > 0, > 1, > 2 drafts accepted
    assert acc.per_position == pytest.approx([45 / 60, 30 / 60, 10 / 60])
    assert acc.num_drafts == 60
    assert acc.source == "sglang:per-request"
    assert acc.warning is None


def test_per_request_acceptance_legacy_meta_info():
    records = [record(i, a) for i, a in enumerate(RESPONSES["legacy_meta_info"])]
    acc = per_request_acceptance(records)
    assert acc.acceptance_length == pytest.approx(1 + 48 / 30)  # accepted 29 + 19 over verify steps 20 + 10
    assert acc.acceptance_rate == pytest.approx(48 / 90)
    assert acc.per_position == []


def test_per_request_acceptance_without_accepted_counts_uses_sglang_formula():
    records = [record(0, {"meta_info": {"completion_tokens": 25, "spec_verify_ct": 10}}),
               record(1, {"meta_info": {"completion_tokens": 31, "spec_verify_ct": 10}})]
    acc = per_request_acceptance(records)
    assert acc.acceptance_length == pytest.approx(56 / 20)
    assert acc.acceptance_rate is None


def test_per_request_acceptance_warns_about_requests_without_details():
    records = [record(0, RESPONSES["current"][0]), record(1, None, completion_tokens=50)]
    acc = per_request_acceptance(records)
    assert acc.acceptance_length == pytest.approx(1 + 60 / 40)
    assert acc.warning == "1 of 2 requests had no spec details"
    assert per_request_acceptance([record(0, None, 10)]) is None


def test_server_info_current_shape():
    info = json.loads((FIXTURES / "sglang_server_info.json").read_text())
    stats = server_info_stats(info)
    assert stats == {"avg_spec_accept_length": 2.875, "speculative_num_steps": 3, "speculative_algorithm": "EAGLE3"}
    assert server_info_stats({"internal_states": [{"last_gen_throughput": 1.0}]})["avg_spec_accept_length"] is None


def _launched(steps: int):
    """An SGLang backend that believes it launched a server for ``steps`` (no process involved)."""
    backend = make_backend("sglang", BackendOptions(model="M", draft="h"))
    backend.steps, backend.server, backend._windows_on_server = steps, object(), 0
    return backend


def test_acceptance_order_of_sources():
    no_details = [record(0, None, 40)]
    info = SpecSnapshot(1.0, avg_accept_length=2.9, raw={"spec_accept_length_gauge": 3.25})
    gauge_only = SpecSnapshot(1.0, raw={"spec_accept_length_gauge": 3.25})

    backend = _launched(3)
    per_req = backend.acceptance(None, info, [record(0, RESPONSES["current"][0])])
    assert per_req.source == "sglang:per-request"
    assert per_req.acceptance_length == pytest.approx(1 + 60 / 40)

    fresh = _launched(3).acceptance(None, info, no_details)  # first window on a server launched for it
    assert fresh.acceptance_length == 2.9
    assert "launched for this point" in fresh.source
    later = backend.acceptance(None, info, no_details)  # second window on the same server
    assert later.source == "sglang:/server_info lifetime average"
    assert "not scoped" in later.warning

    gauge = _launched(3).acceptance(None, gauge_only, no_details)
    assert gauge.acceptance_length == 3.25
    assert gauge.source == "sglang:spec_accept_length gauge"
    assert gauge.warning

    proxy = _launched(3).acceptance(None, None, no_details)
    assert proxy.source == "proxy:tokens-per-chunk"
    assert proxy.acceptance_length == pytest.approx(2.0)

    zero = _launched(0).acceptance(None, info, no_details)
    assert zero.acceptance_length == 1.0
    assert zero.source == "config:num_steps=0"


def test_requests_ask_for_spec_details():
    assert make_backend("sglang", BackendOptions(model="M")).request_extra() == {"return_spec_tokens_details": True}


def test_argv_with_an_adaptive_config(tmp_path):
    cfg = tmp_path / "adaptive.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0, 1]}}))
    backend = make_backend("sglang", BackendOptions(model="M", draft="h", algorithm="EAGLE3",
                                                    adaptive_config=str(cfg)))
    argv = backend.build_argv(3, "127.0.0.1", 9)
    assert argv[argv.index("--speculative-num-steps") + 1] == "3"  # the initial tier
    i = argv.index("--speculative-adaptive")
    assert argv[i + 1:i + 3] == ["--speculative-adaptive-config", str(cfg.resolve())]
    assert "--speculative-adaptive" not in backend.build_argv(0, "127.0.0.1", 9)  # K = 0 has no speculation
    assert "--speculative-adaptive" not in sglang_argv("M", 3, "h", 1, draft="d")


def test_adaptive_config_must_be_an_sglang_config(tmp_path):
    schedule = tmp_path / "schedule.json"
    schedule.write_text("[[1, 8, 3], [9, 64, 1]]")
    with pytest.raises(UserError, match="vLLM schedule"):
        make_backend("sglang", BackendOptions(model="M", draft="h", adaptive_config=str(schedule)))
    bad = tmp_path / "bad.json"
    bad.write_text('{"1": {"candidate_step": [1]}}')
    with pytest.raises(UserError, match="candidate_step"):
        make_backend("sglang", BackendOptions(model="M", draft="h", adaptive_config=str(bad)))


def _adaptive_backend(tmp_path, **options):
    cfg = tmp_path / "adaptive.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0, 1]}}))
    return make_backend("sglang", BackendOptions(draft="h", adaptive_config=str(cfg), **options))


def test_adaptive_server_reports_no_acceptance_rate(tmp_path):
    """SGLang charges each verify (launch num_draft_tokens - 1) proposed drafts: on an adaptive server launched at
    the largest candidate that understates the rate, so none is reported; acceptance length stays."""
    backend = _adaptive_backend(tmp_path, model="M")
    backend.steps, backend.server = 3, object()
    acc = backend.acceptance(None, None, [record(i, a) for i, a in enumerate(RESPONSES["current"])])
    assert acc.acceptance_length == pytest.approx(1 + 85 / 60)
    assert acc.acceptance_rate is None
    assert "adaptive" in acc.warning


async def _info_server(info: dict):
    """An in-test SGLang stand-in serving /health and /server_info (``info``); returns (runner, url)."""
    from aiohttp import web

    app = web.Application()
    app.router.add_get("/health", lambda r: web.Response(status=200))
    app.router.add_get("/server_info", lambda r: web.json_response(info))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner_url(runner)


async def test_remote_adaptive_server_checks(tmp_path):
    """A running adaptive server's live tier (here 1) follows the load: it is checked against the config's
    candidates, never against the initial num_steps; a static sweep is warned that the server adapts."""
    info = json.loads((FIXTURES / "sglang_server_info.json").read_text())
    info.update(speculative_adaptive=True)
    info["internal_states"][0]["speculative_num_steps"] = 1
    runner, url = await _info_server(info)
    try:
        adaptive = _adaptive_backend(tmp_path, endpoints={3: url})
        assert await adaptive.preflight([3]) == []
        static = make_backend("sglang", BackendOptions(endpoints={3: url}))
        assert "runs --speculative-adaptive" in (await static.preflight([3]))[0]
        info.update(speculative_adaptive=False)
        assert "does not run --speculative-adaptive" in (await adaptive.preflight([3]))[0]
    finally:
        await runner.cleanup()


async def test_remote_adaptive_server_detected_from_server_info_reports_no_rate(tmp_path):
    info = json.loads((FIXTURES / "sglang_server_info.json").read_text())
    info.update(speculative_adaptive=True)
    runner, url = await _info_server(info)
    try:
        backend = make_backend("sglang", BackendOptions(endpoints={-1: url}))
        await backend.start(3)
        after = await backend.snapshot()
        acc = backend.acceptance(None, after, [record(i, a) for i, a in enumerate(RESPONSES["current"])])
        assert acc.acceptance_rate is None
    finally:
        await runner.cleanup()


def test_flag_sources_cited_where_sglang_now_defines_them():
    """SGLang's speculative flags moved from server_args.py to arg_groups/fields/spec.py (handled in
    arg_groups/speculative_hook.py); the module docstring is the contract's reference."""
    from spectune.backends import sglang

    assert "python/sglang/srt/arg_groups/fields/spec.py" in sglang.__doc__
    assert "server_args.py" not in sglang.__doc__


async def test_adaptive_config_with_dp_attention_is_warned(tmp_path, monkeypatch):
    """SGLang falls back to static settings under attention DP (adaptive_unsupported_reason)."""
    monkeypatch.setattr("spectune.backends.sglang.SGLangBackend.check_executable", lambda self: None)
    backend = _adaptive_backend(tmp_path, model="M", server_args=["--enable-dp-attention", "--dp", "2"])
    [warning] = await backend.preflight([3])
    assert "disables --speculative-adaptive with --enable-dp-attention" in warning
