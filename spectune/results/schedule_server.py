"""The schedule server a sweep measured, as a record: :class:`RecordedScheduleServer` is sweep.json's
``backend.schedule_server`` (:meth:`spectune.backends.base.ScheduleServer.to_json` plus ``max_k``), which
``spectune recommend`` copies into recommendation.json and names in recommendation.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from spectune.core.json_types import JsonObject, JsonValue

__all__ = ["RecordedScheduleServer"]


@dataclass
class RecordedScheduleServer:
    """sweep.json's ``backend.schedule_server``.

    Attributes:
        engine: the engine's name (``vllm``, ``sglang``...). pinned: how one num_steps K is pinned, in the engine's
            terms. source: the engine file that says what the server runs. costs_more: whether it can cost more
            than the static server of the same num_steps. max_k: the schedule's largest K. None where the file
            lacks the key.
        extra: keys this version does not know. order: the keys in the order the file had them (written back so;
            None for a record built here).
    """

    engine: str | None = None
    pinned: str | None = None
    source: str | None = None
    costs_more: bool | None = None
    max_k: int | None = None
    extra: JsonObject = field(default_factory=dict)
    order: list[str] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_json(cls, obj: JsonValue) -> RecordedScheduleServer | None:
        """The record of a parsed ``schedule_server`` object (None for None or anything but an object)."""
        if not isinstance(obj, dict):
            return None
        return cls(**{k: v for k, v in obj.items() if k in _KNOWN},  # type: ignore[arg-type]
                   extra={k: v for k, v in obj.items() if k not in _KNOWN}, order=list(obj))

    def to_json(self) -> JsonObject:
        """The object as read: its keys in their order (a record built here: the known keys, then ``extra``)."""
        keys = self.order if self.order is not None else [*_KNOWN, *self.extra]
        return {k: getattr(self, k) if k in _KNOWN else self.extra[k] for k in keys}


_KNOWN = [f.name for f in fields(RecordedScheduleServer) if f.name not in ("extra", "order")]
