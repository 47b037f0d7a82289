"""OpenAI-compatible request models (pydantic) and response/chunk builders for the bundled server.

Requests are parsed and validated in one step from the raw body (:meth:`pydantic.BaseModel.model_validate_json`,
RFC 8259 JSON in UTF-8; a ``charset`` in Content-Type is ignored), in strict mode: a field has exactly its JSON
type (``"max_tokens": "5"``, ``5.0`` or ``true`` are refused, as are ``Infinity``/``NaN`` and integers with
thousands of digits). Integers are bounded here (:data:`INT32_MAX`, the seed to 64 bits); what depends on the
engine (top_k and token ids against the vocabulary, lengths against the context) is checked by
:meth:`spectune.backends.local.engine.loop.Engine.add_request`. ``null`` for any field means its default (some
clients send every field). Field meanings follow the OpenAI API reference (Chat Completions and Completions) and vLLM's
extensions (``top_k``, ``stop_token_ids``, ``ignore_eos``, ``stream_options.continuous_usage_stats``).

Extra per-request field in responses: ``spec_decode`` (top level of the final chunk and of non-stream responses):
``{"verify_steps", "draft_tokens", "accepted_tokens", "accepted_per_position", "acceptance_length"}`` where
acceptance_length = 1 + accepted_tokens / verify_steps (null without drafting).
"""

from __future__ import annotations

import time
from typing import Any, Literal, Mapping, TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

INT32_MAX = 2**31 - 1
"""Upper bound of every count-like integer field (max_tokens, top_k, token ids): what engines store them in."""
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 256
MAX_NUM_STEPS = 64

_STRICT = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class _Strict(BaseModel):
    model_config = _STRICT

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: object) -> object:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class StreamOptions(_Strict):
    """``stream_options``: ``include_usage`` adds a final usage chunk; ``continuous_usage_stats`` (vLLM's
    extension) adds cumulative usage to every chunk."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Common(_Strict):
    model: str | None = Field(default=None, max_length=1024)
    max_tokens: int | None = Field(default=None, gt=0, le=INT32_MAX)
    max_completion_tokens: int | None = Field(default=None, gt=0, le=INT32_MAX)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1, le=INT32_MAX)
    n: int = Field(default=1, ge=1, le=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)

    @field_validator("stop")
    @classmethod
    def _stop_bounded(cls, v: str | list[str] | None) -> str | list[str] | None:
        items = [v] if isinstance(v, str) else (v or [])
        if len(items) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        if any(len(s) > MAX_STOP_CHARS for s in items):
            raise ValueError(f"a stop string may have at most {MAX_STOP_CHARS} characters")
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _ids_bounded(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(not 0 <= t <= INT32_MAX for t in v):
            raise ValueError("token ids must be >= 0")
        return v

    def stop_list(self) -> list[str]:
        """``stop`` as a list."""
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def requested_max_tokens(self) -> int | None:
        """max_completion_tokens, else max_tokens, else None (the server fills the rest of the context)."""
        return self.max_completion_tokens or self.max_tokens


class ChatMessage(BaseModel):
    """One chat message: text content, or a list of ``{"type": "text", "text": ...}`` parts (other part types,
    such as images, are refused)."""

    model_config = ConfigDict(strict=True, extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, v: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]] | None:
        if isinstance(v, list):
            for i, part in enumerate(v):
                if part.get("type") != "text":
                    raise ValueError(f"content part {i} has type {part.get('type')!r}: only 'text' parts are "
                                     "supported")
                if not isinstance(part.get("text"), str):
                    raise ValueError(f"content part {i}: 'text' must be a string")
        return v

    def text(self) -> str:
        """The message's text (parts joined)."""
        if isinstance(self.content, list):
            return "".join(p["text"] for p in self.content)
        return self.content or ""


class ChatCompletionRequest(_Common):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]

    @field_validator("messages")
    @classmethod
    def _non_empty(cls, v: list[ChatMessage]) -> list[ChatMessage]:
        if not v:
            raise ValueError("messages must not be empty")
        return v

    def text_bytes(self) -> int:
        """UTF-8 bytes of all message texts (for the cheap too-long check before tokenizing)."""
        return sum(len(m.text().encode("utf-8", "surrogatepass")) for m in self.messages)


class CompletionRequest(_Common):
    """POST /v1/completions (a single string prompt, or a list of token ids)."""

    prompt: str | list[int]

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: str | list[int]) -> str | list[int]:
        if not v:
            raise ValueError("prompt must not be empty")
        return v

    def text_bytes(self) -> int:
        """UTF-8 bytes of a text prompt (0 for token ids)."""
        return len(self.prompt.encode("utf-8", "surrogatepass")) if isinstance(self.prompt, str) else 0


class NumStepsRequest(_Strict):
    """POST /spectune/num_steps: the static num_steps and, optionally, the draft-confidence cutoff (``draft_p_min``,
    as ``--draft-p-min``: 0 = every row drafts num_steps tokens; absent = unchanged)."""

    num_steps: int = Field(ge=0, le=MAX_NUM_STEPS)
    draft_p_min: float | None = Field(default=None, ge=0.0, le=1.0)


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def validation_message(err: ValidationError) -> tuple[str, str | None]:
    """(one-line message, ``param``) for the first problem of a pydantic error: ``"max_tokens: Input should be
    greater than 0"``; a body that is not JSON gives ``"request body is not valid JSON (...)"``."""
    first = err.errors(include_url=False)[0]
    if first.get("type") == "json_invalid":
        return f"request body is not valid JSON ({first.get('msg', '').removeprefix('Invalid JSON: ')})", None
    if first.get("type") == "model_type" and not first.get("loc"):
        return "request body must be a JSON object", None
    loc = [str(x) for x in first.get("loc", ()) if not (isinstance(x, str) and ("[" in x or x.lower() in _UNION_TAGS))]
    msg = first.get("msg", "invalid value").removeprefix("Value error, ")
    where = ".".join(loc)
    return (f"{where}: {msg}" if where else msg), (where or None)


class ErrorDetail(TypedDict):
    """The ``error`` object of an OpenAI-style error body."""

    message: str
    type: str
    param: str | None
    code: int


class ErrorBody(TypedDict):
    """An OpenAI-style error body (:func:`error_body`)."""

    error: ErrorDetail


class ChunkDelta(TypedDict, total=False):
    """A chat chunk's ``delta``: the role on the first chunk only."""

    role: str
    content: str


class ChatChunkChoice(TypedDict):
    """A ``chat.completion.chunk`` choice."""

    index: int
    delta: ChunkDelta
    logprobs: None
    finish_reason: str | None


class TextChoice(TypedDict):
    """A ``text_completion`` choice (streamed chunks and non-streamed responses alike)."""

    index: int
    text: str
    logprobs: None
    finish_reason: str | None


class AssistantMessage(TypedDict):
    """A ``chat.completion`` choice's ``message``."""

    role: str
    content: str


class ChatChoice(TypedDict):
    """A ``chat.completion`` choice."""

    index: int
    message: AssistantMessage
    logprobs: None
    finish_reason: str | None


class _Head(TypedDict):
    """The fields every response and chunk starts with (``object``: ``chat.completion``, ``chat.completion.chunk``
    or ``text_completion``; ``created``: Unix seconds)."""

    id: str
    object: str
    created: int
    model: str


class _ChunkHead(_Head):
    choices: list[ChatChunkChoice | TextChoice]


class StreamChunk(_ChunkHead, total=False):
    """One streamed chunk (:func:`chunk`): ``usage`` with continuous usage stats, ``spec_decode`` on the last."""

    usage: dict[str, int]
    spec_decode: Mapping[str, object]


class CompletionResponse(_Head):
    """A non-streamed response (:func:`full_response`)."""

    choices: list[ChatChoice | TextChoice]
    usage: dict[str, int]
    spec_decode: Mapping[str, object]


def error_body(message: str, status: int, param: str | None = None) -> ErrorBody:
    """OpenAI-style error object (``{"error": {"message", "type", "param", "code"}}``)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 401:
        kind = "authentication_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI usage object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chunk(rid: str, model: str, chat: bool, text: str, finish: str | None, first: bool,
          use: dict[str, int] | None = None, spec: Mapping[str, object] | None = None) -> StreamChunk:
    """One streamed chunk (``chat.completion.chunk`` or ``text_completion``)."""
    if chat:
        delta: ChunkDelta = {"role": "assistant", "content": text} if first else {"content": text}
        choice: ChatChunkChoice | TextChoice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    out: StreamChunk = {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice]}
    if use is not None:
        out["usage"] = use
    if spec is not None:
        out["spec_decode"] = spec
    return out


def full_response(rid: str, model: str, chat: bool, text: str, finish: str | None, use: dict[str, int],
                  spec: Mapping[str, object]) -> CompletionResponse:
    """A non-streamed response."""
    if chat:
        choice: ChatChoice | TextChoice = {"index": 0, "message": {"role": "assistant", "content": text},
                                           "logprobs": None, "finish_reason": finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice],
            "usage": use, "spec_decode": spec}
