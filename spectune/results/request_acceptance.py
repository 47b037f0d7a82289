"""One measured request's accepted drafts as a record: :class:`RequestAcceptance` is what a requests.jsonl line
(docs/results-format.md) says of speculation, from the engine's per-request ``server_stats.spec_decode``
(``verify_steps`` and ``accepted_per_position``: how many of the request's verify steps accepted draft i,
i = 1..num_steps). :mod:`spectune.tune.replay` replays SGLang's policy on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from spectune.core.json_types import JsonValue

__all__ = ["RequestAcceptance", "request_acceptances"]


@dataclass(frozen=True)
class RequestAcceptance:
    """A request's accepted-draft counts.

    Attributes:
        steps: num_steps the request ran at (> 0). concurrency: the point's concurrency (None when the line lacks
            it). prompt_id: its dataset record. verify_steps: its verify steps (> 0).
        accepted_at_least: P(accepted >= i) for i = 1..steps: ``accepted_per_position[i-1] / verify_steps``,
            clipped to [0, 1].
    """

    steps: int
    concurrency: int | None
    prompt_id: str
    verify_steps: int
    accepted_at_least: list[float]

    @classmethod
    def from_json(cls, obj: Mapping[str, JsonValue]) -> RequestAcceptance | None:
        """The record of a requests.jsonl object; None for a failed request, num_steps 0 or a line without
        ``spec_decode`` counts for every draft position."""
        k = int(obj.get("steps") or 0)  # type: ignore[arg-type]
        stats = obj.get("server_stats")
        sd = stats.get("spec_decode") if isinstance(stats, dict) else None
        if k <= 0 or obj.get("error") or not isinstance(sd, dict):
            return None
        n, app = sd.get("verify_steps"), sd.get("accepted_per_position")
        if not n or not isinstance(app, list) or len(app) < k:
            return None
        conc = obj.get("concurrency")
        probs = [min(1.0, max(0.0, float(a) / n)) for a in app[:k]]  # type: ignore[arg-type, operator]
        return cls(k, int(conc) if isinstance(conc, (int, float)) else None, str(obj.get("prompt_id")),
                   int(n), probs)  # type: ignore[arg-type]


def request_acceptances(records: Iterable[Mapping[str, JsonValue]] | None) -> list[RequestAcceptance]:
    """The :class:`RequestAcceptance` of every requests.jsonl object that has one, in order."""
    return [a for r in records or () if (a := RequestAcceptance.from_json(r)) is not None]
