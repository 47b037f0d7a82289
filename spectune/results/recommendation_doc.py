"""recommendation.json read back as a record: :class:`RecordedRecommendation` is what ``spectune validate`` reads of
the recommendation beside a config (:meth:`spectune.tune.recommend.Recommendation.to_json` wrote it): the static and
schedule-server cells (:class:`spectune.results.cell.Cell`), the objective and the primary recommendation
(:class:`spectune.results.primary.Primary`). docs/recommend.md lists the file's keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from spectune.core.json_types import JsonObject, JsonValue
from spectune.results.cell import Cell
from spectune.results.primary import Primary

__all__ = ["RecordedRecommendation"]


@dataclass
class RecordedRecommendation:
    """What validate reads of recommendation.json.

    Attributes:
        cells: ``cells`` (the static servers' cells). schedule_cells: ``schedule_cells`` (the engine's schedule
            server pinned to each num_steps; empty without one). objective: ``options.objective`` ("" when absent).
        primary: ``primary`` as written (validate.json's ``prediction.primary`` copies it; None when absent).
    """

    cells: list[Cell] = field(default_factory=list)
    schedule_cells: list[Cell] = field(default_factory=list)
    objective: str = ""
    primary: JsonValue = None

    @property
    def recommended(self) -> Primary | None:
        """The primary recommendation as a record (None without one)."""
        return Primary.from_json(self.primary)

    @classmethod
    def from_json(cls, obj: JsonObject) -> RecordedRecommendation:
        """The record of a parsed recommendation.json.

        Raises:
            TypeError, AttributeError: a cell or ``options`` that is not what recommend writes.
        """
        options = obj.get("options") or {}
        return cls([Cell.from_json(c) for c in obj.get("cells") or []],  # type: ignore[union-attr, arg-type]
                   [Cell.from_json(c) for c in obj.get("schedule_cells") or []],  # type: ignore[union-attr, arg-type]
                   str(options.get("objective", "")), obj.get("primary"))  # type: ignore[union-attr]

    @classmethod
    def read(cls, path: Path) -> RecordedRecommendation:
        """recommendation.json at ``path``.

        Raises:
            OSError: unreadable. ValueError: not JSON. TypeError, AttributeError: not recommend's format.
        """
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(obj, dict):
            raise TypeError(f"{path} holds no JSON object")
        return cls.from_json(obj)
