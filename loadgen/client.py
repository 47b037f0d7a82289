"""Streaming client for OpenAI-compatible servers: one POST per request, every chunk timestamped.

Requests ask for ``stream_options: {include_usage: true, continuous_usage_stats: true}`` (vLLM and SGLang then put
the cumulative ``usage.completion_tokens`` in every chunk), so the tokens a chunk carries are the usage delta; with
speculative decoding one chunk often carries several tokens (background §4). Without continuous usage the chunk
text is tokenized with the given tokenizer, else each chunk counts as one token; the final usage (if any) still sets
``completion_tokens``. Chat deltas count ``content``, else ``reasoning_content``/``reasoning`` (reasoning models
stream their thinking there: those are output tokens too).

All times are :func:`time.perf_counter` (CLOCK_MONOTONIC on Linux). A chunk's time is when the client read it;
events that arrived in one read share that read's time.

Streams that cannot be right fail the request instead of producing numbers: a cumulative ``completion_tokens``
that goes down or is negative (a chunk of -3 tokens), a negative ``prompt_tokens``, and a finish that is not a
normal end: ``finish_reason`` ``abort``, ``error``, ``cancelled``, ``content_filter``... (:data:`FAILED_FINISHES`),
or ``length`` before ``max_tokens`` by the server's own count (the server truncated the output). A failed request
is never averaged into latencies or throughput; its ``error`` names the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence, TypedDict

import aiohttp

from spectune.loadgen.datasets import Prompt
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject, JsonValue
from spectune.loadgen.record import RequestRecord
from spectune.loadgen.sse import SSEParser

__all__ = ["ClientConfig", "StreamingClient"]

# Top-level keys of standard chunk objects; any other key is kept in ``record.server_stats``.
_STANDARD_KEYS = frozenset(
    {"id", "object", "created", "model", "choices", "usage", "system_fingerprint", "service_tier", "prompt_logprobs"}
)
_MAX_ERROR_CHARS = 300
_DECODER = json.JSONDecoder()
#: finish_reason values that mean the request did not end normally (vLLM and SGLang send "abort" for requests they
#: dropped; OpenAI "content_filter" for truncated output). Compared in lower case.
FAILED_FINISHES = frozenset({"abort", "aborted", "cancelled", "canceled", "error", "content_filter", "timeout",
                             "preempted", "rejected"})


class ChunkTokenizer(Protocol):
    """What :attr:`ClientConfig.tokenizer` must offer: a Hugging Face tokenizer's ``encode`` (only the number of ids
    is used)."""

    def encode(self, text: str, *, add_special_tokens: bool) -> Sequence[int]: ...


class StreamOptionsBody(TypedDict, total=False):
    """A request's ``stream_options`` (``continuous_usage_stats``: vLLM's and SGLang's extension)."""

    include_usage: bool
    continuous_usage_stats: bool


class RequestBody(TypedDict, total=False):
    """The JSON body :meth:`StreamingClient.body` sends (``messages`` for chat, ``prompt`` for completions), before
    the backend's :attr:`ClientConfig.extra_body` fields are merged into it."""

    model: str | None
    max_tokens: int
    temperature: float
    stream: bool
    stream_options: StreamOptionsBody
    messages: list[dict[str, str]]
    prompt: str
    ignore_eos: bool


@dataclass
class ClientConfig:
    """What every request of a run looks like.

    Attributes:
        base_url: ``scheme://host:port`` (a trailing ``/v1`` is accepted).
        model: model name to send, or None to use the first id of ``GET /v1/models`` (resolved by :meth:`open`).
        api: ``"chat"`` (``/v1/chat/completions``, default) or ``"completions"`` (``/v1/completions``).
        max_tokens: output tokens per request.
        temperature: sampling temperature (0 = greedy; acceptance depends on it, so it is recorded).
        ignore_eos: ask the server to ignore EOS so every request produces ``max_tokens`` (vLLM/SGLang field).
        extra_body: extra request-body fields from the backend (merged last, so they win).
        api_key_env: name of the environment variable holding the API key, sent as ``Authorization: Bearer``;
            nothing is sent when the variable is unset or empty.
        timeout_s: s; per-request limit on the whole request (connect + stream); ``--request-timeout``.
        tokenizer: object with ``encode(text, add_special_tokens=False)``, used to count chunk tokens when the
            server sends no continuous usage; None counts one token per chunk.
        continuous_usage: ask for ``continuous_usage_stats`` (servers that reject unknown fields need False).
        reuse_connections: keep connections open between requests (HTTP keep-alive); False opens a new connection
            per request, for servers that close a connection after a streamed response (llama-server).
    """

    base_url: str
    model: str | None = None
    api: str = "chat"
    max_tokens: int = 256
    temperature: float = 0.0
    ignore_eos: bool = False
    extra_body: JsonObject | None = None
    api_key_env: str | None = "OPENAI_API_KEY"
    timeout_s: float = 600.0
    tokenizer: ChunkTokenizer | None = field(default=None, repr=False, compare=False)
    continuous_usage: bool = True
    reuse_connections: bool = True

    def __post_init__(self) -> None:
        if self.api not in ("chat", "completions"):
            raise UserError(f"unknown api {self.api!r}: use chat or completions")
        self.base_url = self.base_url.rstrip("/").removesuffix("/v1")


class StreamingClient:
    """Sends streamed completion requests over one pooled :class:`aiohttp.ClientSession` (no connection limit).

    Use as ``async with StreamingClient(config) as client: record = await client.send(prompt, "r0")``.
    Request failures never raise: they are recorded in ``record.error`` (and ``record.status``). Cancelling a
    request closes its connection.
    """

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.session: aiohttp.ClientSession | None = None
        path = "/v1/chat/completions" if config.api == "chat" else "/v1/completions"
        self.url = config.base_url + path
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        key = os.environ.get(config.api_key_env or "") if config.api_key_env else None
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
        self._timeout = aiohttp.ClientTimeout(total=config.timeout_s)

    async def __aenter__(self) -> "StreamingClient":
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Create the session; resolve ``config.model`` from ``GET /v1/models`` when it is None.

        Raises:
            UserError: the model list cannot be read (server down, wrong URL, no model served).
        """
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, force_close=not self.config.reuse_connections)
        self.session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
        if self.config.model is None:
            url = self.config.base_url + "/v1/models"
            try:
                async with self.session.get(url, headers=self.headers, timeout=self._timeout) as resp:
                    models = (await resp.json(content_type=None)).get("data") or []
                self.config.model = models[0]["id"]
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, LookupError, AttributeError) as e:
                await self.close()
                why = _one_line(e)
                raise UserError(f"cannot read the model name from {url} ({why}); pass the model name") from None

    async def close(self) -> None:
        """Close the session and its connections."""
        if self.session is not None:
            await self.session.close()
            self.session = None

    def body(self, prompt: Prompt) -> RequestBody:
        """The JSON request body for ``prompt``."""
        cfg = self.config
        body: RequestBody = {"model": cfg.model, "max_tokens": cfg.max_tokens, "temperature": cfg.temperature,
                             "stream": True, "stream_options": {"include_usage": True}}
        if cfg.continuous_usage:
            body["stream_options"]["continuous_usage_stats"] = True
        if cfg.api == "chat":
            body["messages"] = prompt.messages
        else:
            body["prompt"] = prompt.text
        if cfg.ignore_eos:
            body["ignore_eos"] = True
        if cfg.extra_body:
            body.update(cfg.extra_body)
        return body

    async def send(self, prompt: Prompt, request_id: str, send_time: float | None = None) -> RequestRecord:
        """Send one request and stream its response into a new record (see :meth:`stream`)."""
        record = RequestRecord(request_id=request_id, prompt_id=prompt.id, category=prompt.category,
                               send_time=-1.0 if send_time is None else send_time)
        await self.stream(record, prompt)
        return record

    async def stream(self, record: RequestRecord, prompt: Prompt, due: float | None = None) -> None:
        """Send ``prompt`` and fill ``record`` in place as chunks arrive (so a cancelled request keeps its data).

        ``record.send_time`` < 0 is replaced by the time of the POST; a preset value (an open-loop arrival's
        scheduled time) is kept. ``due`` (s, perf_counter) is when the request should have gone out; the delay
        to the POST is recorded as ``record.dispatch_delay_s``. Never raises for request failures;
        :class:`asyncio.CancelledError` propagates.
        """
        if self.session is None:
            raise RuntimeError("StreamingClient.open() was not called")
        data = json.dumps(self.body(prompt)).encode()
        now = time.perf_counter()
        if record.send_time < 0:
            record.send_time = now
        if due is not None:
            record.dispatch_delay_s = max(0.0, now - due)
        try:
            async with self.session.post(self.url, data=data, headers=self.headers, timeout=self._timeout) as resp:
                record.status = resp.status
                if resp.status >= 400:
                    record.error = f"HTTP {resp.status}: {_error_message(await resp.read())}"
                else:
                    await self._read_stream(resp, record)
        except asyncio.TimeoutError:
            record.error = f"timeout after {self.config.timeout_s:g} s"
        except aiohttp.ClientPayloadError as e:  # the body broke off (connection closed mid-chunk)
            record.error = f"stream closed before [DONE] ({_one_line(e)})"
        except aiohttp.ClientError as e:
            record.error = f"connection error: {_one_line(e)}"
        except ValueError as e:  # SSEParser: an event beyond its size limit
            record.error = f"unusable stream: {_one_line(e)}"
        if record.end_time is None:
            record.end_time = time.perf_counter()
        if record.completion_tokens is None:
            record.completion_tokens = sum(record.chunk_tokens)

    async def _read_stream(self, resp: aiohttp.ClientResponse, rec: RequestRecord) -> None:
        """The hot loop: parse SSE events, timestamp output chunks, count their tokens.

        Sets ``rec.end_time`` at ``[DONE]``, at an error event or when the body ends; then reads what is left of
        the body (briefly) so that the connection can be reused.
        """
        chat, tokenizer = self.config.api == "chat", self.config.tokenizer
        raw_decode, perf_counter, read = _DECODER.raw_decode, time.perf_counter, resp.content.readany
        times, tokens, texts, stats = rec.chunk_times, rec.chunk_tokens, [], {}
        parser, last_ct, fallback, finished, raw = SSEParser(), 0, None, False, b"?"
        try:
            while not finished and raw:
                raw = await read()
                now = perf_counter()
                for kind, payload in parser.feed(raw) if raw else parser.finish():
                    if payload == b"[DONE]":
                        finished = True
                        break
                    try:  # raw_decode on str skips json.loads' wrappers and encoding sniffing (~2 us per event)
                        obj = raw_decode(payload.decode())[0]
                    except ValueError:  # also UnicodeDecodeError; retry leniently (whitespace around the JSON)
                        obj = _loads_or_none(payload)
                    if kind == "error" or not isinstance(obj, dict) or "error" in obj or obj.get("object") == "error":
                        rec.error, finished = "server error event: " + _error_message(payload, obj), True
                        break
                    if rec.server_request_id is None and isinstance(obj.get("id"), str):
                        rec.server_request_id = obj["id"]
                    for key in obj:
                        if key not in _STANDARD_KEYS:
                            merge_stats(stats, key, obj[key])
                    choices, usage, ntok = obj.get("choices"), obj.get("usage"), None
                    if usage:
                        ct, pt = usage.get("completion_tokens"), usage.get("prompt_tokens")
                        if ct is not None:
                            if not _count(ct) or ct < last_ct:
                                rec.error, finished = (f"impossible stream: usage.completion_tokens went from "
                                                       f"{last_ct} to {_one_line(ct)}"), True
                                break
                            ntok, last_ct = ct - last_ct, ct
                            rec.completion_tokens = ct
                        if pt is not None:
                            if not _count(pt):
                                rec.error, finished = f"impossible stream: usage.prompt_tokens {_one_line(pt)}", True
                                break
                            rec.prompt_tokens = pt
                    if not choices:
                        continue  # usage-only chunk: counts updated, no output chunk
                    c0 = choices[0]
                    if chat:
                        delta = c0.get("delta") or {}
                        text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or ""
                    else:
                        text = c0.get("text") or ""
                    if c0.get("finish_reason"):
                        rec.finish_reason = c0["finish_reason"]
                    if ntok is None:  # no continuous usage in this chunk
                        if not text:
                            continue
                        fallback = "tokenizer" if tokenizer is not None else "chunks"
                        ntok = 1 if tokenizer is None else len(tokenizer.encode(text, add_special_tokens=False))
                    elif ntok <= 0 and not text:
                        continue
                    times.append(now)
                    tokens.append(ntok)
                    if text:
                        texts.append(text)
            rec.end_time = perf_counter()
            if not finished:
                rec.error = "stream closed before [DONE]"
            elif rec.error is None:
                rec.error = self._bad_finish(rec)
            if finished and not resp.content.at_eof():
                try:  # drain the end of the body so the connection goes back to the pool
                    await asyncio.wait_for(resp.content.read(), 1.0)
                except (asyncio.TimeoutError, aiohttp.ClientError):
                    pass
        finally:
            rec.output_text = "".join(texts)
            if fallback:
                rec.token_count_source = fallback
            if stats:
                rec.server_stats = stats

    def _bad_finish(self, rec: RequestRecord) -> str | None:
        """Why a stream that ended with ``[DONE]`` still failed (aborted or truncated), or None."""
        reason = rec.finish_reason
        if isinstance(reason, str) and reason.lower() in FAILED_FINISHES:
            return f"server ended the request with finish_reason {reason!r} after {sum(rec.chunk_tokens)} tokens"
        want = self.config.max_tokens
        # completion_tokens is set here only from the server's usage (the client's own count comes later)
        if (reason == "length" and rec.completion_tokens is not None and rec.completion_tokens < want
                and "max_tokens" not in (self.config.extra_body or {})):
            return (f"truncated: finish_reason 'length' after {rec.completion_tokens} of {want} tokens (the server "
                    "cut the output: its context or its own limit)")
        return None


def _count(value: JsonValue) -> bool:
    """A token count a server may report: a non-negative integer (an integral float is tolerated)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return value >= 0 and float(value).is_integer()


def merge_stats(stats: JsonObject, key: str, value: JsonValue) -> None:
    """Fold one non-standard chunk field into ``stats`` (``record.server_stats``), per key.

    A server may spread its extension object over several chunks: SGLang sends ``sglext`` with
    ``spec_tokens_details`` and may send another ``sglext`` chunk after it (routed experts, cached-token details,
    output ids; ``python/sglang/srt/entrypoints/openai/serving_chat.py``, ``_generate_chat_stream``), each a
    pydantic ``SglExt`` dump whose other fields are ``null``. Objects are therefore merged key by key
    (recursively), a ``null`` never replaces a value already kept, and any other value replaces the earlier one
    (the last chunk's cumulative counters win).
    """
    if value is None and key in stats:
        return
    old = stats.get(key)
    if isinstance(old, dict) and isinstance(value, dict):
        merged = dict(old)
        for k, v in value.items():
            merge_stats(merged, k, v)
        stats[key] = merged
    else:
        stats[key] = value


def _loads_or_none(payload: bytes) -> JsonValue:
    try:
        return json.loads(payload)
    except ValueError:
        return None


def _one_line(e: object) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:_MAX_ERROR_CHARS]


def _error_message(body: bytes, obj: JsonValue = None) -> str:
    """One line from an error body: OpenAI ``{"error": {"message"}}``, ``{"message"}``, ``{"detail"}`` or text."""
    if obj is None:
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            msg: JsonValue = err.get("message") or err.get("detail") or err.get("msg") or json.dumps(err)
        else:
            msg = err
        return _one_line(msg)
    return _one_line(body.decode("utf-8", "replace")) or "(empty body)"
