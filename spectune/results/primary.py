"""recommend's primary recommendation as a record: :class:`Primary` is recommendation.json's ``primary``
(docs/recommend.md, docs/results-format.md), which ``spectune recommend`` writes (:mod:`spectune.tune.gain`,
:mod:`spectune.tune.mix`) and ``spectune validate`` reads back beside a config (its verdict rules a static primary
with :func:`spectune.validate.verdict.static_agreement`).
"""

from __future__ import annotations

import dataclasses

from spectune.core.json_types import JsonObject, JsonValue

__all__ = ["Primary"]


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
    mix: JsonObject | None = None

    @property
    def static(self) -> int | None:
        """K when the primary is static num_steps K, else None."""
        return int(self.num_steps) if self.kind == "static" and self.num_steps is not None else None

    def to_json(self) -> JsonObject:
        """``{"kind", "num_steps", "reason"}`` plus ``mix`` when priced on a load."""
        out: JsonObject = {"kind": self.kind, "num_steps": self.num_steps, "reason": self.reason}
        if self.mix is not None:
            out["mix"] = self.mix
        return out

    @classmethod
    def from_json(cls, obj: JsonValue) -> Primary | None:
        """The record of a parsed ``primary`` object; None for None, ``{}`` (recommend wrote no primary) or an object
        without ``kind``."""
        if not isinstance(obj, dict) or "kind" not in obj:
            return None
        k, mix = obj.get("num_steps"), obj.get("mix")
        return cls(str(obj["kind"]), None if k is None else int(k),  # type: ignore[arg-type]
                   str(obj.get("reason") or ""), mix if isinstance(mix, dict) else None)
