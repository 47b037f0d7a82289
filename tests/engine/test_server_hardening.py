"""`spectune serve` against hostile or careless clients (issue 18): requests that used to kill the server or get a
text/plain 500, the API key on every route, disconnects of non-streaming requests, seeds, engine failures that
stay with one request, and tokenization off the event loop.

Two servers: the real ``python -m spectune.backends.local`` process with the default pair (an exception that escapes its
engine loop ends the process, which is how the crashes showed), and a tiny engine in a thread for the checks that
need to reach inside (fault injection, which thread tokenizes).
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import requests

from helpers.engine import SubprocessServer, ThreadedServer
from helpers.tiny_models import tiny_engine

KEY = "test-key-5f0e"
CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def real():
    server = SubprocessServer({"num_steps": 2, "max_num_seqs": 4, "max_model_len": 256, "kv_cache_gb": 0.3,
                               "threads": 1, "device": "cpu"}, api_key=KEY)
    yield server
    server.close()


def _post(server, path: str, body: object = None, data: bytes | None = None, headers: dict | None = None,
          auth: bool = True) -> requests.Response:
    h = {**(server.headers if auth else {}), **(headers or {})}
    if data is None:
        data = json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
    return requests.post(server.url + path, data=data, headers=h, timeout=60)


def _error(r: requests.Response) -> dict:
    assert r.headers["Content-Type"].startswith("application/json"), r.text[:200]
    return r.json()["error"]


def _still_serving(server) -> None:
    assert server.alive()
    r = _post(server, CHAT, {"messages": MSG, "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text


# ---- requests that killed the server -----------------------------------------------------------------------------

@pytest.mark.parametrize("body, param", [
    ({"messages": MSG, "max_tokens": 2, "top_k": 10**30}, "top_k"),
    ({"messages": MSG, "max_tokens": 2, "top_k": 10**6}, "top_k"),  # fits int64, larger than the vocabulary
    ({"prompt": [1000000], "max_tokens": 2}, "prompt"),
    ({"prompt": [-1], "max_tokens": 2}, "prompt"),
    ({"prompt": "hi", "max_tokens": 2, "stop_token_ids": [10**6]}, "stop_token_ids"),
])
def test_out_of_range_values_get_400_and_the_server_lives(real, body, param) -> None:
    r = _post(real, CHAT if "messages" in body else "/v1/completions", body)
    assert r.status_code == 400
    assert _error(r)["param"] == param
    _still_serving(real)


# ---- requests that got a text/plain 500 --------------------------------------------------------------------------

def test_bogus_charset_is_ignored(real) -> None:
    r = _post(real, "/v1/completions", data=b'{"prompt": "hi", "max_tokens": 2}',
              headers={"Content-Type": "application/json; charset=bogus"})
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("path, data, fragment", [
    (CHAT, b'{"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}], "max_tokens": 2}',
     "must be a string"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", "not valid JSON"),
    ("/spectune/num_steps", b'{"num_steps": Infinity}', "num_steps"),
    ("/spectune/num_steps", b'{"num_steps": 1e999}', "num_steps"),
])
def test_odd_values_get_a_400_json_error(real, path, data, fragment) -> None:
    r = _post(real, path, data=data, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert fragment in _error(r)["message"]
    _still_serving(real)


# ---- one auth rule -----------------------------------------------------------------------------------------------

def test_the_key_guards_every_route_but_health(real) -> None:
    before = requests.get(real.url + "/server_info", headers=real.headers, timeout=10).json()["speculative_num_steps"]
    r = _post(real, "/spectune/num_steps", {"num_steps": 0 if before else 1}, auth=False)
    assert r.status_code == 401
    assert _error(r)["type"] == "authentication_error"
    after = requests.get(real.url + "/server_info", headers=real.headers, timeout=10).json()["speculative_num_steps"]
    assert after == before
    for path in ("/metrics", "/server_info", "/get_server_info", "/v1/models"):
        assert requests.get(real.url + path, timeout=10).status_code == 401, path
    assert requests.get(real.url + "/health", timeout=10).status_code == 200


def test_a_wrong_key_of_any_shape_is_refused(real) -> None:
    for value in (f"Bearer {KEY[:-1]}x", f"Bearer {KEY}x", "Bearer", KEY, f"Basic {KEY}", "Bearer k\u00e9y"):
        r = requests.get(real.url + "/v1/models", headers={"Authorization": value.encode("utf-8")}, timeout=10)
        assert r.status_code == 401, value
    assert requests.get(real.url + "/v1/models", headers={"Authorization": f"bearer {KEY}"}, timeout=10).ok


# ---- disconnects, seeds ------------------------------------------------------------------------------------------

def _finished(server, reason: str) -> float:
    import requests as rq

    text = rq.get(server.url + "/metrics", headers=server.headers, timeout=10).text
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith("spectune:request_success_total") and f'finished_reason="{reason}"' in l)


def test_a_non_streaming_request_is_aborted_when_its_client_disconnects(real) -> None:
    done_before = _finished(real, "length")
    body = json.dumps({"messages": MSG, "max_tokens": 200, "ignore_eos": True, "temperature": 0}).encode()
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", real.port)) as sock:
        sock.sendall(head + body)
        deadline = time.monotonic() + 30
        while real.gauge("spectune:num_requests_running") < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    deadline = time.monotonic() + 60
    while real.gauge("spectune:num_requests_running") > 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert _finished(real, "length") == done_before  # aborted, not run to max_tokens


def test_the_same_seed_gives_the_same_sample(real) -> None:
    def sample(seed: int) -> str:
        r = _post(real, CHAT, {"messages": [{"role": "user", "content": "Write a word."}], "max_tokens": 12,
                               "temperature": 1.0, "seed": seed, "ignore_eos": True})
        assert r.status_code == 200
        return r.json()["choices"][0]["message"]["content"]

    first = sample(7)
    assert sample(7) == first
    assert len({first, sample(8), sample(9)}) > 1


# ---- a tiny engine in a thread: reaching inside ------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    server = ThreadedServer(tiny_engine(num_steps=2), model_name="tiny", api_key=KEY)
    server.headers = {"Authorization": f"Bearer {KEY}"}
    yield server
    server.close()


def test_tokenization_runs_off_the_event_loop(tiny, monkeypatch) -> None:
    seen: list[str] = []
    encode_chat = tiny.engine.tokenizer.encode_chat

    def spy(messages):
        seen.append(threading.current_thread().name)
        return encode_chat(messages)

    monkeypatch.setattr(tiny.engine.tokenizer, "encode_chat", spy)
    r = _post(tiny, CHAT, {"messages": [{"role": "user", "content": "t1 t2 t3"}], "max_tokens": 2})
    assert r.status_code == 200
    assert seen
    assert tiny.thread.name not in seen


def test_an_engine_failure_stays_with_its_request(tiny, monkeypatch) -> None:
    prefill = tiny.engine.decoder.prefill

    def faulty(slots, prompts, st, draft):
        if any(13 in prompt for prompt in prompts):  # "t13" marks the request to fail
            raise RuntimeError("injected fault")
        return prefill(slots, prompts, st, draft)

    monkeypatch.setattr(tiny.engine.decoder, "prefill", faulty)
    bad = {"messages": [{"role": "user", "content": "t1 t13"}], "max_tokens": 4}
    r = _post(tiny, CHAT, bad)
    assert r.status_code == 500
    assert "injected fault" in _error(r)["message"]
    r = _post(tiny, CHAT, {**bad, "stream": True})
    events = [l for l in r.text.splitlines() if l.startswith("data: ")]
    assert "injected fault" in json.loads(events[0][6:])["error"]["message"]
    assert events[-1] == "data: [DONE]"
    good = _post(tiny, CHAT, {"messages": [{"role": "user", "content": "t1 t2"}], "max_tokens": 4,
                              "ignore_eos": True})
    assert good.status_code == 200
    assert good.json()["usage"]["completion_tokens"] == 4
    assert requests.get(tiny.url + "/health", timeout=10).status_code == 200


def test_the_key_is_compared_in_constant_time(tiny, monkeypatch) -> None:
    import spectune.backends.local.server.app as server_module

    calls: list[tuple] = []
    real_compare = server_module.hmac.compare_digest
    monkeypatch.setattr(server_module.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real_compare(a, b))
    assert requests.get(tiny.url + "/v1/models", headers={"Authorization": "Bearer nope"}, timeout=10).status_code \
        == 401
    assert calls == [(b"nope", KEY.encode())]


@pytest.mark.parametrize("method, path, data", [
    ("GET", "/no/such/route", None),
    ("GET", CHAT, None),
    ("PUT", "/v1/completions", b"{}"),
    ("POST", "/v1/completions", b"x" * (64 * 2**20 + 1)),
])
def test_every_error_body_is_openai_json(tiny, method, path, data) -> None:
    r = requests.request(method, tiny.url + path, data=data, headers=tiny.headers, timeout=60)
    assert r.status_code in (404, 405, 413)
    assert _error(r)["code"] == r.status_code


def test_metrics_can_be_left_open_by_choice() -> None:
    server = ThreadedServer(tiny_engine(num_steps=0), model_name="tiny", api_key=KEY, metrics_without_key=True)
    try:
        assert requests.get(server.url + "/metrics", timeout=10).status_code == 200
        assert requests.get(server.url + "/server_info", timeout=10).status_code == 401
    finally:
        server.close()


def test_a_body_that_does_not_match_its_content_encoding_is_a_400(tiny) -> None:
    r = _post(tiny, "/v1/completions", data=b'{"prompt": "t1", "max_tokens": 1}',
              headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert r.status_code == 400
    assert "cannot be read" in _error(r)["message"]


def test_the_served_key_comes_from_the_flag_or_the_environment(monkeypatch) -> None:
    from spectune.commands.serve import resolve_api_key

    monkeypatch.delenv("SPECTUNE_API_KEY", raising=False)
    assert resolve_api_key(None) is None
    monkeypatch.setenv("SPECTUNE_API_KEY", "from-env")
    assert resolve_api_key(None) == "from-env"
    assert resolve_api_key("from-flag") == "from-flag"
    monkeypatch.setenv("SPECTUNE_API_KEY", "")
    assert resolve_api_key(None) is None


@pytest.mark.parametrize("prompt, params, param", [
    ([1, 16], {}, "prompt"),  # the tiny vocabulary is 0..15
    ([1, -1], {}, "prompt"),
    ([1, 2], {"top_k": 17}, "top_k"),
    ([1, 2], {"stop_token_ids": [16]}, "stop_token_ids"),
    ([1, 2], {"max_tokens": 10_000}, "max_tokens"),
])
def test_the_engine_refuses_what_it_cannot_run(prompt, params, param) -> None:
    from spectune.backends.local.engine.loop import InvalidRequest
    from spectune.backends.local.engine.sequence import SamplingParams

    engine = tiny_engine(num_steps=0)
    with pytest.raises(InvalidRequest) as info:
        engine.add_request("r", prompt, SamplingParams(**{"max_tokens": 2, **params}), lambda out: None)
    assert info.value.param == param
    assert engine.num_waiting == 0
