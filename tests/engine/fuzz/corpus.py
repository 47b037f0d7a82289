"""A seeded corpus of malformed, extreme and abandoned requests for the bundled server (tests/fuzz/test_fuzz_server.py).

Three kinds of case:

- ``http``: a complete HTTP request (method, path, headers, body) built from a valid chat or completion body by
  replacing one field with a wrong type or an extreme value, or from a broken body (not JSON, truncated, deeply
  nested, other encodings), a wrong method, an odd path or Content-Type. The server must answer with a valid
  response (200: JSON, or an SSE stream ending in ``[DONE]``) or a 4xx/5xx OpenAI-style JSON error.
- ``raw``: bytes that are not valid HTTP (a bad request line, a header too long, a broken chunked body). aiohttp's
  HTTP parser answers these itself (a 4xx with a text body) or closes the connection, before the application sees
  a request; the server must survive them.
- ``disconnect``: a request the client abandons: after part of the headers, part of the body, some bytes of a
  stream, or a delay on a non-streaming request. Nothing is checked per case; afterwards no slot may stay taken.

Every body is small enough that valid ones generate at most a few tokens (both ``max_tokens`` and
``max_completion_tokens`` are set, so removing one keeps the other), so the storm stays short on a CPU.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

# JSON texts (not Python values): some are not representable with json.dumps.
BAD_VALUES: list[str] = [
    "null", "true", "false", "0", "-1", "1", "2147483648", "9223372036854775808", "1" + "0" * 30, "-" + "9" * 40,
    "1.5", "-0.0", "1e308", "1e999", "-1e999", "NaN", "Infinity", "-Infinity", "9" * 5000, '"5"', '""',
    json.dumps("x" * 20000), "[]", "[1]", '["a"]', "{}", '{"a": 1}', "[[[[]]]]", '"\\u0000"', '"\\ud800"',
    '"\u00e9\u4e2d\U0001f600"', '"\\n\\r\\t"', "[" * 50 + "]" * 50, json.dumps(list(range(300))),
    json.dumps(["stop"] * 40), json.dumps([{"type": "text", "text": 5}]), json.dumps({"include_usage": "yes"}),
]
FIELDS = ["model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "n", "stop",
          "stop_token_ids", "stream", "stream_options", "ignore_eos", "seed", "unknown_field"]
BAD_MESSAGES: list[Any] = [
    None, [], [{}], [{"role": "user"}], [{"content": "hi"}], [{"role": 5, "content": "hi"}],
    [{"role": "wizard", "content": "hi"}], [{"role": "user", "content": 5}], [{"role": "user", "content": {}}],
    [{"role": "user", "content": [5]}], [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
    [{"role": "user", "content": [{"type": "text"}]}], [{"role": "user", "content": [{"text": "hi"}]}],
    [{"role": "user", "content": [{"type": "text", "text": None}]}], [{"role": "user", "content": "\x00\x01\x02"}],
    [{"role": "system", "content": "s"}], [{"role": "assistant", "content": "a"}],
    [{"role": "tool", "content": "t", "tool_call_id": 5}], [{"role": "user", "content": "hi", "name": ["x"]}],
    [{"role": "user", "content": "hi"}] * 200, [{"role": "user", "content": "word " * 2000}],
    [{"role": "user", "content": "\ud800"}], "hi", {"role": "user", "content": "hi"}, [["user", "hi"]],
    [{"role": "user", "content": "{% for x in range(10**9) %}x{% endfor %}"}],
]
BAD_PROMPTS: list[Any] = [
    None, "", [], [0], [49151], [49152], [-1], [2**31], [2**63], [1.0], ["a"], [True], [[1, 2]], ["a", "b"],
    list(range(1000)), "word " * 2000, {"text": "hi"}, 5, "\x00", "\udfff",
]
CONTENT_TYPES = [None, "text/plain", "application/json; charset=bogus", "application/json; charset=utf-16",
                 "multipart/form-data; boundary=x", "application/x-www-form-urlencoded", "application/json;;;"]


@dataclass
class Case:
    """One fuzz case: ``kind`` is ``http``, ``raw`` or ``disconnect`` (see the module docstring)."""

    kind: str
    name: str
    method: str = "POST"
    path: str = CHAT
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    raw: bytes = b""  # raw and disconnect: the bytes to send
    read_bytes: int = 0  # disconnect: bytes of the answer to read before closing
    delay_s: float = 0.0  # disconnect: wait before closing


def base_body(chat: bool, stream: bool = False) -> dict[str, Any]:
    """A valid request body that generates at most 3 tokens."""
    body: dict[str, Any] = {"max_tokens": 3, "max_completion_tokens": 3, "temperature": 0}
    if chat:
        body["messages"] = [{"role": "user", "content": "Hi"}]
    else:
        body["prompt"] = "Hello"
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return body


def with_raw_field(body: dict[str, Any], name: str, raw_json: str) -> bytes:
    """``body`` as JSON with field ``name`` set to the JSON text ``raw_json`` (which may be invalid JSON)."""
    rest = {k: v for k, v in body.items() if k != name}
    text = json.dumps(rest)
    return (text[:-1] + (", " if rest else "") + json.dumps(name) + ": " + raw_json + "}").encode("utf-8",
                                                                                              "surrogatepass")


def _http(name: str, body: bytes, path: str = CHAT, method: str = "POST",
          content_type: str | None = "application/json", headers: dict[str, str] | None = None) -> Case:
    h = dict(headers or {})
    if content_type is not None:
        h["Content-Type"] = content_type
    return Case("http", name, method, path, h, body)


def _request_bytes(method: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: fuzz\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode("latin-1") + f"Content-Length: {len(body)}\r\n\r\n".encode() + body


def build(seed: int = 0, auth: dict[str, str] | None = None) -> list[Case]:
    """The corpus, in a seeded random order. ``auth``: headers every well-formed case sends (the API key)."""
    rng = random.Random(seed)
    auth = dict(auth or {})
    cases: list[Case] = []
    # one field at a time, every bad value, chat and completions, streamed or not
    for name in FIELDS:
        for raw in BAD_VALUES:
            chat, stream = rng.random() < 0.6, rng.random() < 0.3
            cases.append(_http(f"field {name}={raw[:20]}", with_raw_field(base_body(chat, stream), name, raw),
                               CHAT if chat else COMPLETIONS, headers=auth))
    for i, msgs in enumerate(BAD_MESSAGES):
        body = base_body(True, rng.random() < 0.3)
        body["messages"] = msgs
        cases.append(_http(f"messages #{i}", json.dumps(body).encode("utf-8", "surrogatepass"), headers=auth))
    for i, prompt in enumerate(BAD_PROMPTS):
        body = base_body(False, rng.random() < 0.3)
        body["prompt"] = prompt
        cases.append(_http(f"prompt #{i}", json.dumps(body).encode("utf-8", "surrogatepass"), COMPLETIONS,
                           headers=auth))
    # broken bodies and encodings
    good = json.dumps(base_body(True)).encode()
    bodies = {
        "empty": b"", "not json": b"{not json", "truncated": good[: len(good) // 2], "array": b"[]",
        "string": b'"hi"', "number": b"5", "null": b"null", "trailing garbage": good + b"}}", "two objects": good * 2,
        "utf-16": json.dumps(base_body(True)).encode("utf-16"), "utf-8 bom": b"\xef\xbb\xbf" + good,
        "invalid utf-8": good.replace(b'"Hi"', b'"\xff\xfe\xc3"'), "latin-1": good.replace(b'"Hi"', '"caf\xe9"'.encode(
            "latin-1")), "nul bytes": good.replace(b"Hi", b"H\x00i"), "deep nesting": b"[" * 100_000 + b"]" * 100_000,
        "deep object": b'{"a":' * 20_000 + b"1" + b"}" * 20_000, "duplicate keys": good[:-1] + b', "max_tokens": -5}',
        "big whitespace": b" " * 2_000_000 + good,
        "huge string": json.dumps({**base_body(True), "pad": "x" * 3_000_000}).encode(),
    }
    for name, body in bodies.items():
        cases.append(_http(f"body {name}", body, CHAT if rng.random() < 0.5 else COMPLETIONS, headers=auth))
    for ct in CONTENT_TYPES:
        cases.append(_http(f"content-type {ct}", good, content_type=ct, headers=auth))
    cases.append(_http("gzip claimed, not gzip", good, headers={**auth, "Content-Encoding": "gzip"}))
    cases.append(_http("unknown encoding", good, headers={**auth, "Content-Encoding": "x-bogus"}))
    # methods and paths
    for method, path in [("GET", CHAT), ("PUT", COMPLETIONS), ("DELETE", CHAT), ("PATCH", "/v1/models"),
                         ("POST", "/v1/models"), ("POST", "/health"), ("GET", "/spectune/num_steps"),
                         ("OPTIONS", CHAT), ("GET", "/v1/chat/completions/"), ("GET", "/V1/MODELS"),
                         ("GET", "/%00"), ("GET", "/../../etc/passwd"), ("GET", "/" + "a" * 4000),
                         ("GET", "/v1/models?x=" + "%ff" * 100), ("POST", "/v1/embeddings"), ("GET", "/metrics/x")]:
        cases.append(_http(f"{method} {path[:30]}", good if method != "GET" else b"", path, method, headers=auth))
    for raw in ["-1", "65", "3", '"1"', "1.5", "null", "true", "[]", "{}", "1e999", "Infinity", "9" * 5000]:
        cases.append(_http(f"num_steps {raw[:10]}", f'{{"num_steps": {raw}}}'.encode(), "/spectune/num_steps",
                           headers=auth))
    # auth: wrong, missing, odd keys (only meaningful with a key)
    if auth:
        for value in ["", "Bearer", "Bearer wrong", "Basic abc", "Bearer " + "k" * 5000, "Bearer \u00e9\u00e9"]:
            cases.append(_http(f"auth {value[:15]!r}", good, headers={"Authorization": value}))
    # raw bytes that are not HTTP
    raws = [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(64)),  # a TLS ClientHello start
            b"GET / HTTP/9.9\r\n\r\n", b"POST " + b"/x" * 10_000 + b" HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET /health HTTP/1.1\r\nHost: a\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
            b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n0\r\n\r\n",
            b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: -5\r\n\r\n",
            b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nhello",
            b"\r\n\r\n\r\n", b"GET /health\r\n\r\n", b"\x00" * 100, b"GET /health HTTP/1.1\r\nBad Header\r\n\r\n"]
    for i, raw in enumerate(raws):
        cases.append(Case("raw", f"raw #{i}", raw=raw))
    # disconnects at random points
    for i in range(60):
        chat, stream = rng.random() < 0.5, rng.random() < 0.5
        body = {**base_body(chat, stream), "max_tokens": 40, "max_completion_tokens": 40, "ignore_eos": True}
        full = _request_bytes("POST", CHAT if chat else COMPLETIONS, json.dumps(body).encode(),
                              {**auth, "Content-Type": "application/json"})
        where = rng.random()
        if where < 0.25:  # inside the headers or the body
            cut = rng.randrange(1, len(full))
            cases.append(Case("disconnect", f"disconnect after {cut} bytes sent", raw=full[:cut]))
        elif where < 0.35:  # a body shorter than its Content-Length
            cases.append(Case("disconnect", "short body", raw=full[:-5], delay_s=rng.random() * 0.2))
        elif stream:
            cases.append(Case("disconnect", "stream abandoned", raw=full, read_bytes=rng.randrange(0, 3000)))
        else:
            cases.append(Case("disconnect", "non-stream abandoned", raw=full, delay_s=rng.random() * 1.0))
    rng.shuffle(cases)
    return cases
