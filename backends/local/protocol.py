"""OpenAI-compatible request models (pydantic) and response/chunk builders for the bundled server.

Extra per-request field in responses: ``spec_decode`` (top level of the final chunk and of non-stream responses):
``{"verify_steps", "draft_tokens", "accepted_tokens", "accepted_per_position", "acceptance_length"}`` where
acceptance_length = 1 + accepted_tokens / verify_steps (null without drafting).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a final usage chunk; ``continuous_usage_stats`` (vLLM's
    extension) adds cumulative usage to every chunk."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, gt=0)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)
    n: int = Field(default=1, ge=1, le=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    seed: int | None = None

    def stop_list(self) -> list[str]:
        """``stop`` as a list."""
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def requested_max_tokens(self) -> int | None:
        """max_completion_tokens, else max_tokens, else None (the server fills the rest of the context)."""
        return self.max_completion_tokens or self.max_tokens


class ChatMessage(BaseModel):
    """One chat message (text content, or a list of ``{"type": "text", "text": ...}`` parts)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.get("text", "") for p in self.content if isinstance(p, dict))
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


class CompletionRequest(_Common):
    """POST /v1/completions (a single string prompt, or a list of token ids)."""

    prompt: str | list[int]

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: str | list[int]) -> str | list[int]:
        if (isinstance(v, str) and not v) or (isinstance(v, list) and not v):
            raise ValueError("prompt must not be empty")
        return v


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """OpenAI-style error object."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI usage object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chunk(rid: str, model: str, chat: bool, text: str, finish: str | None, first: bool,
          use: dict[str, int] | None = None, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """One streamed chunk (``chat.completion.chunk`` or ``text_completion``)."""
    if chat:
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    out: dict[str, Any] = {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice]}
    if use is not None:
        out["usage"] = use
    if spec is not None:
        out["spec_decode"] = spec
    return out


def full_response(rid: str, model: str, chat: bool, text: str, finish: str | None, use: dict[str, int],
                  spec: dict[str, Any]) -> dict[str, Any]:
    """A non-streamed response."""
    if chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice],
            "usage": use, "spec_decode": spec}
