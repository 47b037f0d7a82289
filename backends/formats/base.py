"""What every engine config format takes and gives: a :class:`Plan` of plain data (the batch-size slots, the draft
head, the best static num_steps), the :class:`ConfigFile` objects it writes, and the :class:`EngineFormat`
interface (its files, its launch line in recommendation.md, its flags in ``best-static.json``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from spectune.core.json_types import JsonObject

SlotSpec = tuple[int, "int | None", int]
"""A batch-size slot: (lower, upper or None for open-ended, num_steps)."""


@dataclass(frozen=True)
class StaticChoice:
    """The best single static num_steps over the measured concurrency range, for engines that take one value:
    ``per_concurrency`` rows ``{"concurrency", "best_steps", "best_objective", "static_objective",
    "static_vs_best"}``."""

    steps: int
    objective: str
    concurrency_range: tuple[int, int]
    per_concurrency: list[JsonObject]


@dataclass
class Plan:
    """A recommendation as plain data, what the engine formats write from.

    ``slots``: (lower, upper, num_steps) per batch-size slot, ascending, the last open-ended: above ``top`` every
    engine's file keeps the last slot's num_steps; ``top``: the slot table's top, where vLLM's last range ends
    (``max_batch_size``, else the largest measured concurrency; 0 when nothing was measured);
    ``method``/``method_source``: the draft head's method (spectune's lower-case name, :mod:`spectune.backends
    .methods`) and how it was found; ``head``: the draft head the sweep loaded; ``target``: the target model;
    ``versions``: engine -> the release to write for (None: the newest); ``ladders``: the adaptive per-slot
    configs per preset (``custom``, ...) for formats with :attr:`EngineFormat.adaptive`; ``static``: the best
    static num_steps; ``warnings``: where formats add what they changed (the recommendation's own list);
    ``p_min``: whether a swept draft-confidence cutoff beats the best static num_steps
    (:func:`spectune.tune.p_min.choose_p_min`: ``p_min``, ``num_steps``, ``beats``, ``reason``, ...), None when the
    sweep swept none.
    """

    slots: Sequence[SlotSpec] = ()
    top: int = 0
    method: str | None = None
    method_source: str = "unknown"
    head: str | None = None
    target: str | None = None
    versions: Mapping[str, str | None] = field(default_factory=dict)
    ladders: Mapping[str, JsonObject] = field(default_factory=dict)
    static: StaticChoice | None = None
    warnings: list[str] = field(default_factory=list)
    p_min: JsonObject | None = None


@dataclass(frozen=True)
class ConfigFile:
    """One file a format writes: its name, its JSON object and recommendation.md's line about it."""

    name: str
    config: JsonObject
    description: str


class EngineFormat:
    """An engine's config format. Subclasses set :attr:`engine` and override what they write; every method
    defaults to writing nothing."""

    engine = ""
    adaptive = False
    """True for a format that writes :attr:`Plan.ladders` (per-slot adaptive configs)."""

    def write(self, plan: Plan) -> list[ConfigFile]:
        """The files for ``plan``, each checked by the engine-format reader; [] when the engine gets none.

        Raises:
            ValueError: a config fails its reader (a spectune bug, never user input).
        """
        return []

    def launch_line(self, plan: Plan, files: Mapping[str, str]) -> str | None:
        """recommendation.md's launch paragraph after the slot table (``files``: every file written, name ->
        description), or None."""
        return None

    def section(self, plan: Plan) -> list[str]:
        """recommendation.md's section of its own (after the predicted performance), or []."""
        return []

    def static_launch(self, steps: int, method: str | None) -> JsonObject:
        """``best-static.json``'s keys for launching this engine at the static num_steps ``steps`` > 0."""
        return {}


def fmt(x: object, spec: str = ".4g") -> str:
    """A number for recommendation.md; ``-`` for None and non-finite floats."""
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
