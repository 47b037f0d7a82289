"""The bundled server through the official openai client: chat, completions, streaming, usage, errors."""

from __future__ import annotations

import json
import time
from pathlib import Path

import openai
import pytest
import requests

from spectune.backends.local.options import EngineOptions
from helpers.engine import random_smollm2_head, serve_in_thread

MODEL = "smollm2-test"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    head = random_smollm2_head(tmp_path_factory.mktemp("head"))
    opts = EngineOptions(draft=str(head), num_steps=2, device="cpu", max_num_seqs=4, max_model_len=256, kv_cache_gb=0.5)
    yield from serve_in_thread(opts, model_name=MODEL)


@pytest.fixture()
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _chat(client: openai.OpenAI, content: str, **kw):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                          temperature=0, **kw)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_stream_and_non_stream_agree_with_usage(client: openai.OpenAI) -> None:
    full = _chat(client, "Name three colors.", max_tokens=12)
    assert full.choices[0].finish_reason in ("stop", "length")
    assert 1 <= full.usage.completion_tokens <= 12
    assert full.usage.prompt_tokens > 5
    spec = full.model_extra["spec_decode"]
    assert spec["verify_steps"] >= 1
    assert spec["draft_tokens"] == 2 * spec["verify_steps"]
    stream = _chat(client, "Name three colors.", max_tokens=12, stream=True,
                   stream_options={"include_usage": True, "continuous_usage_stats": True})
    text, usage, last_cumulative = [], None, 0
    for chunk in stream:
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
            if chunk.usage is not None:  # continuous usage: cumulative, never decreasing
                assert chunk.usage.completion_tokens >= last_cumulative
                last_cumulative = chunk.usage.completion_tokens
        elif chunk.usage is not None:
            usage = chunk.usage
    assert "".join(text) == full.choices[0].message.content  # greedy: identical
    assert usage.completion_tokens == full.usage.completion_tokens == last_cumulative
    assert usage.prompt_tokens == full.usage.prompt_tokens


def test_completions_stream_and_non_stream(client: openai.OpenAI) -> None:
    full = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0)
    assert full.usage.completion_tokens <= 6
    assert full.choices[0].text
    parts = [c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True) if c.choices]
    assert "".join(parts) == full.choices[0].text


def test_stop_string_ends_the_output_without_it(client: openai.OpenAI) -> None:
    full = _chat(client, "Count from 1 to 20, separated by commas.", max_tokens=60)
    text = full.choices[0].message.content
    assert "5" in text
    cut = _chat(client, "Count from 1 to 20, separated by commas.", max_tokens=60, stop=["5"])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index("5")]


@pytest.mark.parametrize("body, fragment", [
    ({"model": MODEL}, "messages"),
    ({"model": MODEL, "messages": []}, "messages"),
    ({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}, "does not exist"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}, "context"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "word " * 400}]}, "context"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_p": 0}, "top_p"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "role"),
])
def test_bad_requests_get_400_and_the_server_keeps_serving(server, client, body, fragment) -> None:
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert fragment in err["message"]
    assert err["type"] == "invalid_request_error"
    assert _chat(client, "Say hi.", max_tokens=3).usage.completion_tokens >= 1


def test_malformed_json_gets_400(server) -> None:
    r = requests.post(server.url + "/v1/chat/completions", data=b"{not json", timeout=30,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert "JSON" in r.json()["error"]["message"]


def test_openai_client_raises_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        _chat(client, "x", max_tokens=-5)


def _running(server) -> float:
    text = requests.get(server.url + "/metrics", timeout=10).text
    line = next(l for l in text.splitlines() if l.startswith("spectune:num_requests_running"))
    return float(line.rsplit(" ", 1)[1])


def test_client_disconnect_mid_stream_frees_the_sequence(server) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 200,
            "temperature": 0, "ignore_eos": True, "stream": True}
    with requests.post(server.url + "/v1/chat/completions", json=body, stream=True, timeout=30) as r:
        it = r.iter_lines()
        assert next(l for l in it if l).startswith(b"data: ")
        assert _running(server) == 1
    deadline = time.time() + 20
    while _running(server) != 0 and time.time() < deadline:
        time.sleep(0.1)
    assert _running(server) == 0


def test_server_info_and_metrics_expose_spec_counters(server, client) -> None:
    _chat(client, "Say hello.", max_tokens=8)
    info = requests.get(server.url + "/server_info", timeout=10).json()
    state = info["internal_states"][0]
    assert state["speculative_num_steps"] == 2
    assert state["avg_spec_accept_length"] >= 1.0
    assert requests.get(server.url + "/get_server_info", timeout=10).json() == info
    text = requests.get(server.url + "/metrics", timeout=10).text
    for name in ("spectune:spec_decode_num_drafts_total", "spectune:spec_decode_num_draft_tokens_total",
                 "spectune:spec_decode_num_accepted_tokens_total", "spectune:time_to_first_token_seconds_bucket",
                 'spectune:spec_decode_num_accepted_tokens_per_pos_total{model_name="smollm2-test",position="1"}'):
        assert name in text


def _counter(text: str, name: str) -> float:
    return float(next(l for l in text.splitlines() if l.startswith(name + "{")).rsplit(" ", 1)[1])


def test_metrics_expose_where_the_engines_time_goes(server, client) -> None:
    before = requests.get(server.url + "/metrics", timeout=10).text
    _chat(client, "Say hello.", max_tokens=8)
    after = requests.get(server.url + "/metrics", timeout=10).text
    def delta(name: str) -> float:
        return _counter(after, name) - _counter(before, name)

    rounds, decode_s = delta("spectune:engine_decode_rounds_total"), delta("spectune:engine_decode_seconds_total")
    forwards = delta("spectune:engine_prefill_forwards_total")
    assert forwards == 1
    assert rounds >= 1
    assert decode_s > 0
    assert delta("spectune:engine_decode_rows_total") == rounds  # one request: one row a round


def test_full_queue_answers_503(tmp_path: Path) -> None:
    head = random_smollm2_head(tmp_path / "head")
    opts = EngineOptions(draft=str(head), num_steps=1, device="cpu", max_num_seqs=1, max_model_len=256, kv_cache_gb=0.2)
    for srv in serve_in_thread(opts, model_name=MODEL):
        srv.engine.cfg.max_waiting = 1
        srv.engine.scheduler.max_waiting = 1
        import concurrent.futures as cf

        body = {"model": MODEL, "messages": [{"role": "user", "content": "Go on."}], "max_tokens": 64,
                "temperature": 0, "ignore_eos": True}
        with cf.ThreadPoolExecutor(6) as pool:
            codes = list(pool.map(lambda _: requests.post(srv.url + "/v1/chat/completions", json=body,
                                                          timeout=120).status_code, range(6)))
        assert 503 in codes
        assert 200 in codes
        r = requests.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200
        assert json.loads(r.text)["usage"]["completion_tokens"] == 64
