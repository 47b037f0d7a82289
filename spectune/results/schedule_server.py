"""The schedule server a sweep measured, as a record: :class:`RecordedScheduleServer` is sweep.json's
``backend.schedule_server`` (:meth:`spectune.backends.base.ScheduleServer.to_json` plus ``max_k``), which
``spectune recommend`` copies into recommendation.json and names in recommendation.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from spectune.results.open_record import OrderedRecord

__all__ = ["RecordedScheduleServer"]


@dataclass
class RecordedScheduleServer(OrderedRecord):
    """sweep.json's ``backend.schedule_server``; :meth:`~spectune.results.open_record.OrderedRecord.from_json` reads
    it (None for None or anything but an object) and
    :meth:`~spectune.results.open_record.OrderedRecord.to_json` writes it back, its keys in their order (a record
    built here: the known keys, then ``extra``).

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
