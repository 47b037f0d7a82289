"""Streaming client against an in-test aiohttp server: timings, token counts, request body, error paths."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from spectune.loadgen.client import ClientConfig, StreamingClient
from spectune.loadgen.datasets import user_prompt

FIRST_S, GAP_S = 0.06, 0.05  # server waits FIRST_S before the first chunk, GAP_S between chunks
SIZES = [1, 3, 2, 4]  # tokens per chunk
TOL_S = 0.02  # delay allowed between the server's write and the client's read (a loaded 2-core machine)


def chunk(text: str | None, ct: int | None = None, *, finish: str | None = None, api: str = "chat", **extra) -> bytes:
    """One SSE event holding a chat (or completions) chunk; ``ct`` = cumulative completion tokens (usage)."""
    choice = {"index": 0, "finish_reason": finish}
    if api == "chat":
        choice["delta"] = {} if text is None else {"content": text}
    else:
        choice["text"] = text or ""
    obj = {"id": "x", "object": "chat.completion.chunk", "model": "m", "choices": [choice], **extra}
    if ct is not None:
        obj["usage"] = {"prompt_tokens": 7, "completion_tokens": ct, "total_tokens": 7 + ct}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


USAGE_ONLY = b'data: {"id": "x", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 10}}\n\n'
DONE = b"data: [DONE]\n\n"


class Fake:
    """Routes on the request's ``model`` field; remembers the last request and the server-side write times."""

    def __init__(self) -> None:
        self.body: dict = {}
        self.headers: dict = {}
        self.sent: list[float] = []  # perf_counter at each chunk write of the "schedule" scenario

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.body, self.headers = await request.json(), dict(request.headers)
        mode = self.body["model"]
        if mode == "http500":
            return web.json_response({"error": {"message": "engine   crashed\nbadly", "code": 500}}, status=500)
        if mode == "http400":
            return web.Response(status=400, text="max_tokens is too large")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        api = "chat" if request.path.endswith("chat/completions") else "completions"
        if mode in ("schedule", "served-model"):
            await asyncio.sleep(FIRST_S)
            ct = 0
            for i, n in enumerate(SIZES):
                if i:
                    await asyncio.sleep(GAP_S)
                ct += n
                self.sent.append(time.perf_counter())
                await resp.write(chunk("w" * n, ct, api=api, finish="length" if i == 3 else None))
            await resp.write(USAGE_ONLY + DONE)
        elif mode == "split":  # byte by byte, with comments, CRLF and multibyte characters
            body = (b": hello\r\n\r\n" + chunk("h\u00e9", 1) + chunk("\u65e5\u672c", 3) + b": tick\n\n"
                    + chunk(None, 4, finish="stop") + USAGE_ONLY.replace(b"10", b"4") + DONE).replace(b"\n", b"\r\n")
            for i in range(len(body)):
                await resp.write(body[i : i + 1])
                await asyncio.sleep(0)
        elif mode in ("nousage", "finalusage"):
            for text in ("a b", "c", "d e f"):
                await resp.write(chunk(text))
            await resp.write((USAGE_ONLY if mode == "finalusage" else b"") + DONE)
        elif mode == "stats":
            await resp.write(chunk("a", 1, meta_info={"spec_verify_ct": 1}))
            await resp.write(chunk("b", 2, finish="stop", spec_decode={"accepted": 1}, meta_info={"spec_verify_ct": 2}))
            await resp.write(DONE)
        elif mode == "sglext":  # SGLang: spec details, then a second extension chunk (pydantic dumps with nulls)
            details = {"spec_verify_ct": 3, "spec_num_correct_drafts": 4, "spec_num_proposed_drafts": 9}
            await resp.write(chunk("a", 1) + chunk("b c", 3, finish="stop"))
            ext = {"id": "x", "choices": [], "sglext": {"spec_tokens_details": details, "routed_experts": None}}
            await resp.write(b"data: " + json.dumps(ext).encode() + b"\n\n")
            ext = {"id": "x", "choices": [], "sglext": {"spec_tokens_details": None, "output_ids": [5, 6, 7]}}
            await resp.write(b"data: " + json.dumps(ext).encode() + b"\n\n" + USAGE_ONLY.replace(b"10", b"3") + DONE)
        elif mode == "errorevent":
            await resp.write(chunk("a", 1) + b'data: {"error": {"message": "out of memory", "code": 500}}\n\n' + DONE)
        elif mode == "eventerror":
            await resp.write(chunk("a", 1) + b"event: error\ndata: worker died\n\n")
        elif mode == "early":
            await resp.write(chunk("a", 1) + chunk("b", 2))
        elif mode == "reset":
            await resp.write(chunk("a", 1))
            await asyncio.sleep(0.02)
            request.transport.close()
            await asyncio.sleep(1)
        elif mode == "slow":
            await resp.write(chunk("a", 1))
            await asyncio.sleep(5)
        elif mode == "decreasing":  # usage 1, 3, then 0: a chunk of -3 tokens
            await resp.write(chunk("a", 1) + chunk("b c", 3) + chunk("d", 0, finish="stop") + DONE)
        elif mode == "negative":
            await resp.write(chunk("a", -2, finish="stop") + DONE)
        elif mode == "negativeprompt":
            await resp.write(chunk("a", 1).replace(b'"prompt_tokens": 7', b'"prompt_tokens": -7') + DONE)
        elif mode in ("abort", "content_filter"):
            await resp.write(chunk("a", 1) + chunk("b", 2, finish=mode) + DONE)
        elif mode == "truncated":  # "length" after 5 of the 10 tokens asked for
            await resp.write(chunk("abc", 3) + chunk("de", 5, finish="length") + DONE)
        return resp


@pytest.fixture
async def fake():
    f = Fake()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", f.handle)
    app.router.add_post("/v1/completions", f.handle)
    app.router.add_get("/v1/models", lambda r: web.json_response({"data": [{"id": "served-model"}]}))
    server = TestServer(app)
    await server.start_server()
    f.url = str(server.make_url("")).rstrip("/")
    yield f
    await server.close()


async def send(fake: Fake, model: str | None, **cfg):
    async with StreamingClient(ClientConfig(fake.url, model=model, **cfg)) as client:
        return await client.send(user_prompt("p1", "writing", "Hi"), "r0")


async def test_schedule_timings_and_tokens(fake: Fake) -> None:
    rec = await send(fake, "schedule", max_tokens=10)
    assert rec.error is None
    assert rec.ok
    assert rec.status == 200
    assert rec.chunk_tokens == SIZES
    assert rec.token_count_source == "usage"
    assert (rec.completion_tokens, rec.prompt_tokens, rec.finish_reason) == (10, 7, "length")
    assert rec.output_text == "w" * 10
    # timings are checked against the server's own write times (fake.sent), not its nominal sleeps: on a loaded
    # machine asyncio.sleep overshoots by more than any fixed tolerance, which is no fault of the client
    gaps = [b - a for a, b in zip(fake.sent, fake.sent[1:])]
    assert rec.ttft_s >= FIRST_S  # the server slept FIRST_S after the request arrived
    assert rec.chunk_latencies_s == pytest.approx(gaps, abs=TOL_S)
    # per-token ITL: each gap spread over the chunk's tokens (3, 2, 4)
    expected_itl = [gaps[0] / 3] * 3 + [gaps[1] / 2] * 2 + [gaps[2] / 4] * 4
    assert rec.itl_per_token_s == pytest.approx(expected_itl, abs=TOL_S / 2)
    assert rec.tpot_s == pytest.approx((fake.sent[-1] - fake.sent[0]) / 9, abs=TOL_S / 3)  # (t_last - t_first) / 9
    # client arrival times track the server's write times on the same clock
    assert [b - a for a, b in zip(fake.sent, rec.chunk_times)] == pytest.approx([0.0] * 4, abs=TOL_S)


async def test_server_request_id_is_the_response_id(fake: Fake) -> None:
    rec = await send(fake, "schedule", max_tokens=10)
    assert rec.server_request_id == "x"  # every chunk of the fake server carries "id": "x"


async def test_request_body_and_auth(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", "sekrit")
    await send(fake, "schedule", max_tokens=10, temperature=0.5, ignore_eos=True, api_key_env="MY_KEY",
               extra_body={"top_k": 1, "temperature": 0.7})
    body = fake.body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert (body["max_tokens"], body["temperature"], body["ignore_eos"], body["top_k"]) == (10, 0.7, True, 1)
    assert body["messages"] == [{"role": "user", "content": "Hi"}]
    assert fake.headers["Authorization"] == "Bearer sekrit"


async def test_no_api_key_no_header(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    await send(fake, "schedule")
    assert "Authorization" not in fake.headers


async def test_completions_api_and_model_discovery(fake: Fake) -> None:
    rec = await send(fake, None, api="completions", max_tokens=10)  # model None: taken from GET /v1/models
    assert fake.body["model"] == "served-model"
    assert fake.body["prompt"] == "Hi"
    assert "messages" not in fake.body
    assert rec.error is None
    assert rec.output_text == "w" * 10
    assert rec.chunk_tokens == SIZES


async def test_events_split_byte_by_byte_with_comments(fake: Fake) -> None:
    rec = await send(fake, "split")
    assert rec.error is None
    assert rec.output_text == "h\u00e9\u65e5\u672c"
    # chunks: "hé" (1 token), "日本" (2), empty delta with usage +1 (a token without text), then usage-only
    assert rec.chunk_tokens == [1, 2, 1]
    assert rec.completion_tokens == 4
    assert rec.finish_reason == "stop"


class SpaceTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert add_special_tokens is False
        return [0] * len(text.split())


async def test_fallback_counts_without_usage(fake: Fake) -> None:
    rec = await send(fake, "nousage")
    assert (rec.chunk_tokens, rec.token_count_source, rec.completion_tokens) == ([1, 1, 1], "chunks", 3)
    rec = await send(fake, "nousage", tokenizer=SpaceTokenizer())
    assert (rec.chunk_tokens, rec.token_count_source, rec.completion_tokens) == ([2, 1, 3], "tokenizer", 6)


async def test_final_usage_only_chunk_sets_counts_without_a_chunk(fake: Fake) -> None:
    rec = await send(fake, "finalusage")
    assert rec.chunk_tokens == [1, 1, 1]
    assert len(rec.chunk_times) == 3
    assert rec.completion_tokens == 10
    assert rec.prompt_tokens == 7
    assert rec.token_count_source == "chunks"


async def test_non_standard_fields_kept(fake: Fake) -> None:
    rec = await send(fake, "stats")
    assert rec.server_stats == {"meta_info": {"spec_verify_ct": 2}, "spec_decode": {"accepted": 1}}


async def test_extension_chunks_are_merged_per_key(fake: Fake) -> None:
    """A second ``sglext`` chunk (output ids, ``spec_tokens_details: null``) must not erase the spec details."""
    rec = await send(fake, "sglext")
    assert rec.server_stats["sglext"]["spec_tokens_details"] == {"spec_verify_ct": 3, "spec_num_correct_drafts": 4,
                                                                 "spec_num_proposed_drafts": 9}
    assert rec.server_stats["sglext"]["output_ids"] == [5, 6, 7]


@pytest.mark.parametrize(
    "mode, status, error",
    [
        ("http500", 500, "HTTP 500: engine crashed badly"),
        ("http400", 400, "HTTP 400: max_tokens is too large"),
        ("errorevent", 200, "server error event: out of memory"),
        ("eventerror", 200, "server error event: worker died"),
        ("early", 200, "stream closed before [DONE]"),
    ],
)
async def test_error_paths(fake: Fake, mode: str, status: int, error: str) -> None:
    rec = await send(fake, mode)
    assert (rec.status, rec.error) == (status, error)
    assert not rec.ok
    assert rec.end_time is not None


async def test_connection_reset_mid_stream(fake: Fake) -> None:
    rec = await send(fake, "reset")
    assert rec.error is not None
    assert rec.error.startswith("stream closed before [DONE]")
    assert rec.output_text == "a"
    assert rec.chunk_tokens == [1]  # what arrived before the break is kept


async def test_timeout(fake: Fake) -> None:
    rec = await send(fake, "slow", timeout_s=0.3)  # the server stalls 5 s after the first chunk
    assert rec.error == "timeout after 0.3 s"
    assert rec.chunk_tokens == [1]
    assert rec.e2e_s == pytest.approx(0.3, abs=0.1)


async def test_connection_refused() -> None:
    async with StreamingClient(ClientConfig("http://127.0.0.1:9", model="m")) as client:
        rec = await client.send(user_prompt("p", None, "x"), "r0")
    assert rec.status is None
    assert rec.error.startswith("connection error:")


@pytest.mark.parametrize("mode, error", [
    ("decreasing", "impossible stream: usage.completion_tokens went from 3 to 0"),
    ("negative", "impossible stream: usage.completion_tokens went from 0 to -2"),
    ("negativeprompt", "impossible stream: usage.prompt_tokens -7"),
    ("abort", "server ended the request with finish_reason 'abort' after 2 tokens"),
    ("content_filter", "server ended the request with finish_reason 'content_filter' after 2 tokens"),
    ("truncated", "truncated: finish_reason 'length' after 5 of 10 tokens"),
])
async def test_impossible_or_cut_streams_fail_with_the_reason(fake: Fake, mode: str, error: str) -> None:
    rec = await send(fake, mode, max_tokens=10)
    assert rec.error is not None
    assert rec.error.startswith(error)
    assert not rec.ok
    assert all(n >= 0 for n in rec.chunk_tokens)


async def test_length_at_max_tokens_is_a_normal_finish(fake: Fake) -> None:
    rec = await send(fake, "truncated", max_tokens=5)
    assert rec.error is None
    assert rec.finish_reason == "length"
