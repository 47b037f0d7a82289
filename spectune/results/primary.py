"""recommend's primary recommendation as a record: :class:`Primary` is recommendation.json's ``primary``
(docs/recommend.md), which ``spectune recommend`` writes (:mod:`spectune.tune.gain`,
:mod:`spectune.tune.mix`) and ``spectune validate`` reads back beside a config (its verdict rules a static primary
with :func:`spectune.validate.verdict.static_agreement`).
"""

from __future__ import annotations

import dataclasses
import math

from spectune.core.json_types import JsonObject, JsonValue

__all__ = ["MixPricing", "PricedAnswer", "Primary"]


@dataclasses.dataclass
class PricedAnswer:
    """One answer priced on ``recommend --mix``'s load (:class:`spectune.tune.mix.Answer`): the ``answer``
    (``static K=1``, ``schedule``), its ``num_steps`` (None for the schedule), the ``output_tok_s`` the load streams
    and the ``ratio`` to the best with its interval ``low``/``high`` (NaN in memory and None in the file where
    unknown)."""

    answer: str
    num_steps: int | None
    output_tok_s: float
    ratio: float = math.nan
    low: float | None = math.nan
    high: float | None = math.nan


@dataclasses.dataclass
class MixPricing:
    """:attr:`Primary.mix`: the load's time ``shares`` by concurrency (keys as text, as the file has them), the noise
    ``band`` and ``confidence`` of the comparisons, and every priced ``answers`` (:mod:`spectune.tune.mix`)."""

    shares: dict[str, float]
    band: float
    confidence: float = 0.95
    answers: list[PricedAnswer] = dataclasses.field(default_factory=list)

    def to_json(self) -> JsonObject:
        """``{"shares", "band", "confidence", "answers"}``."""
        answers: JsonValue = [dataclasses.asdict(a) for a in self.answers]  # type: ignore[misc]
        shares: JsonValue = dict(self.shares)  # type: ignore[assignment]
        return {"shares": shares, "band": self.band, "confidence": self.confidence, "answers": answers}

    @classmethod
    def from_json(cls, obj: JsonValue) -> MixPricing | None:
        """The record of a parsed ``primary.mix`` (None for anything else)."""
        if not isinstance(obj, dict) or not isinstance(obj.get("shares"), dict):
            return None
        names = [f.name for f in dataclasses.fields(PricedAnswer)]
        answers = [PricedAnswer(**{n: a.get(n) for n in names})  # type: ignore[arg-type]
                   for a in obj.get("answers") or [] if isinstance(a, dict)]  # type: ignore[union-attr]
        return cls(dict(obj["shares"]), float(obj.get("band") or 0.0),  # type: ignore[arg-type]
                   float(obj.get("confidence", 0.95)), answers)  # type: ignore[arg-type]


@dataclasses.dataclass
class Primary:
    """The primary recommendation (recommendation.json ``primary``).

    Attributes:
        kind: ``schedule`` (the per-batch-size slots) or ``static`` (one num_steps for every batch size).
        num_steps: K of a static primary; None for the schedule.
        reason: why, in words (the comparisons that gain, or why none does).
        mix: ``recommend --mix``'s prices of every answer on the load (:mod:`spectune.tune.mix`), or None.
    """

    kind: str
    num_steps: int | None
    reason: str
    mix: MixPricing | None = None

    @property
    def static(self) -> int | None:
        """K when the primary is static num_steps K, else None."""
        return int(self.num_steps) if self.kind == "static" and self.num_steps is not None else None

    def to_json(self) -> JsonObject:
        """``{"kind", "num_steps", "reason"}`` plus ``mix`` when priced on a load."""
        out: JsonObject = {"kind": self.kind, "num_steps": self.num_steps, "reason": self.reason}
        if self.mix is not None:
            out["mix"] = self.mix.to_json()
        return out

    @classmethod
    def from_json(cls, obj: JsonValue) -> Primary | None:
        """The record of a parsed ``primary`` object; None for None, ``{}`` (recommend wrote no primary) or an object
        without ``kind``."""
        if not isinstance(obj, dict) or "kind" not in obj:
            return None
        k, mix = obj.get("num_steps"), obj.get("mix")
        return cls(str(obj["kind"]), None if k is None else int(k),  # type: ignore[arg-type]
                   str(obj.get("reason") or ""), MixPricing.from_json(mix))
