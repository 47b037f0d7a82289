"""What the sequential stop rule (:mod:`spectune.sweep.sequential`) reads of one finished request, as a typed record:
:class:`RequestFigures`, from a request the load generator just handed over (a
:class:`spectune.loadgen.record.RequestRecord`-like object) or from a requests.jsonl object (docs/results-format.md)
read back, each read once with the units it is written in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol

__all__ = ["FinishedRequest", "RequestFigures"]


class FinishedRequest(Protocol):
    """What the rule reads of a finished request as the load generator hands it over
    (:class:`spectune.loadgen.record.RequestRecord`-like): ``ok``, ``prompt_id``, ``completion_tokens``, ``e2e_s``,
    ``tpot_s`` (s, None where unknown) and, when present, ``dispatch_delay_s`` (read with ``getattr``)."""

    @property
    def ok(self) -> bool: ...

    @property
    def prompt_id(self) -> str: ...

    @property
    def completion_tokens(self) -> int | None: ...

    @property
    def e2e_s(self) -> float | None: ...

    @property
    def tpot_s(self) -> float | None: ...


@dataclass(frozen=True)
class RequestFigures:
    """One finished request's figures.

    Attributes:
        prompt_id: the prompt's id (None: unknown). ok: it finished without error.
        completion_tokens: output tokens (None: unknown). e2e_s: end-to-end latency, s (None or 0: unknown).
        dispatch_delay_s: s from when its slot freed to when it was sent (None: unknown).
        tpot_ms: time per output token, ms (None: unknown, or a failed request as the load generator hands it over).
    """

    prompt_id: str | None
    ok: bool
    completion_tokens: float | None
    e2e_s: float | None
    dispatch_delay_s: float | None
    tpot_ms: float | None

    @classmethod
    def of(cls, request: FinishedRequest | Mapping[str, object]) -> RequestFigures:
        """The figures of a finished request: a record (:class:`FinishedRequest`) or a requests.jsonl object
        (``prompt_id``, ``error``, ``completion_tokens``, ``e2e_ms``, ``dispatch_delay_s``, ``tpot_ms``)."""
        if isinstance(request, Mapping):
            return cls.from_json(request)
        tpot = request.tpot_s * 1e3 if request.ok and request.tpot_s is not None else None
        return cls(getattr(request, "prompt_id", None), request.ok, request.completion_tokens, request.e2e_s,
                   getattr(request, "dispatch_delay_s", None), tpot)

    @classmethod
    def from_json(cls, obj: Mapping[str, object]) -> RequestFigures:
        """The figures of a requests.jsonl object (``e2e_ms`` read as s; a missing ``e2e_ms`` as 0)."""
        def number(key: str) -> float | None:
            value = obj.get(key)
            return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        prompt = obj.get("prompt_id")
        return cls(None if prompt is None else str(prompt), obj.get("error") is None, number("completion_tokens"),
                   (number("e2e_ms") or 0) / 1e3, number("dispatch_delay_s"), number("tpot_ms"))
