"""The guided planner: the step-time model, the seed, the choice of the next cell and the settle step in one object
(:class:`GuidedPlanner`), as :mod:`spectune.sweep.run` drives it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

from spectune.core.json_types import JsonObject
from spectune.results.point import PointObject, RequestLine, SweepPoint, as_points
from spectune.results.schema import PointKey
from spectune.sweep.guided.choose import Choosing
from spectune.sweep.guided.model import StepTimeModel
from spectune.sweep.guided.seed import Seeding
from spectune.sweep.guided.settle import Comparison, Settling

__all__ = ["GuidedPlanner"]


class GuidedSettings(Protocol):
    """What :meth:`GuidedPlanner.for_plan` reads of a guided sweep's plan (:class:`spectune.sweep.plan.SweepPlan`;
    the sweep package sits above this one, so a protocol)."""

    steps: Sequence[int]
    concurrency: Sequence[int]
    repeats: int
    objective: str
    confidence: float
    noise_band: float
    slo_tpot_ms: float | None
    slo_ttft_ms: float | None
    duration_per_point_s: float | None


@dataclass
class GuidedPlanner(StepTimeModel, Seeding, Choosing, Settling):
    """Chooses what a guided sweep measures next and predicts the rest (:mod:`spectune.sweep.guided`).

    The model and its predictions: :class:`spectune.sweep.guided.model.StepTimeModel` (``cells``, ``fit``,
    ``predict``); the first cells: :class:`spectune.sweep.guided.seed.Seeding` (``seed``, ``seed_followup``); the next
    cell by expected improvement per second: :class:`spectune.sweep.guided.choose.Choosing` (``next_round``,
    ``values``); more runs where a tie rests on a wide interval: :class:`spectune.sweep.guided.settle.Settling`
    (``comparisons``, ``settle``).

    Args:
        steps, concurrency: the plan's num_steps and concurrencies (ascending). repeats: runs per measured cell.
        objective: ``throughput`` or ``tpot``. confidence: of the prediction intervals (0..1).
        noise_band: fraction; differences below it are ties (the smaller num_steps wins).
        measure_every_concurrency: open every concurrency with a measured cell, even where the model settles the
            choice there (a plan with SLOs: recommend needs each chosen cell's measured SLO attainment).
        window_cap_s: s, the plan's cap on a point's sending time (``--duration``), or None.
    """

    steps: Sequence[int]
    concurrency: Sequence[int]
    repeats: int = 1
    objective: str = "throughput"
    confidence: float = 0.95
    noise_band: float = 0.02
    rounds: list[list[tuple[int, int]]] = field(default_factory=list)
    fit_info: JsonObject = field(default_factory=dict)
    #: the deciding comparisons the settle step last saw (:meth:`comparisons`), for sweep.json
    decisions: list[Comparison] = field(default_factory=list)
    #: why each proposed cell was measured, in order (sweep.json ``guided.why``)
    why: list[JsonObject] = field(default_factory=list)
    #: the concurrencies with nothing measured whose choice was left to the model when last looked at: concurrency
    #: -> {"steps": the predicted choice, "by": "model" (no other num_steps worth measuring against its predicted
    #: best) or "neighbours" (between measured concurrencies that settled on it)} (sweep.json ``guided.left_to_model``)
    left_to_model: dict[int, JsonObject] = field(default_factory=dict)
    #: every concurrency gets a measured cell even where the model settles its choice (:meth:`next_round`): the
    #: plan has SLOs, whose attainment is measured, never predicted
    measure_every_concurrency: bool = False
    #: s, the plan's cap on a point's sending time (``--duration``), or None: a cell's expected seconds
    #: (:meth:`spectune.sweep.guided.choose.Choosing._duration`) are at most the cap plus the drain
    window_cap_s: float | None = None

    @classmethod
    def for_plan(cls, plan: GuidedSettings) -> "GuidedPlanner":
        """The planner of a guided sweep plan (:class:`spectune.sweep.plan.SweepPlan`: its num_steps, concurrencies,
        repeats, objective, confidence and noise band; with SLOs every concurrency is measured)."""
        slo = plan.slo_tpot_ms is not None or plan.slo_ttft_ms is not None
        return cls(plan.steps, plan.concurrency, plan.repeats, plan.objective, plan.confidence, plan.noise_band,
                   measure_every_concurrency=slo, window_cap_s=plan.duration_per_point_s)

    def next_keys(self, points: Sequence[SweepPoint | PointObject], tried: set[tuple[int, int]],
                  cost: dict[str, float], records: Callable[[], Mapping[PointKey, Sequence[RequestLine]]],
                  current: int | None = None, width: int = 1) -> list[PointKey]:
        """The points (steps, concurrency, repeat) a running sweep measures next: every repeat of the next round's
        cells (:meth:`next_round`), or, when no cell is worth measuring, the settle step's runs (:meth:`settle`,
        fed ``records()``: request objects by point, read only then); [] when the plan is done. The round's launch
        cost comes from the sweep's ``cost`` (sweep.json ``cost``: ``switch_s`` over ``launches``, s per launch) and
        the mean window of the ``points`` measured so far (``duration_s``): where a launch costs more than a point, a
        round is whole num_steps (one launch each). ``current``: the running server's num_steps; ``width``: servers
        side by side."""
        points = as_points(points)
        restart = cost["switch_s"] / cost["launches"] if cost["launches"] else 0.0
        windows = [p.numbers.duration_s or 0.0 for p in points]
        point = sum(windows) / len(windows) if windows else 0.0  # s per point's measurement window
        cells = self.next_round(points, tried, all_threats=restart > point > 0, current=current, launch_s=restart,
                                width=width)
        if not cells:  # no cell left worth measuring: settle the comparisons that decide the choices
            return self.settle(points, records())
        return [PointKey(k, c, r) for k, c in cells for r in range(self.repeats)]

    def finish(self, points: Sequence[SweepPoint | PointObject],
               stop: str) -> tuple[list[JsonObject], JsonObject]:
        """At the end of a guided sweep: (the predicted rows of every unmeasured cell, for summary.csv; sweep.json's
        ``guided``: :meth:`describe` plus why it stopped, ``stop`` or ``settled``, the measured and predicted cell
        counts, and the concurrencies left to the model, with nothing measured)."""
        points = as_points(points)
        preds = self.predict(points)
        measured = {p.key.cell for p in points}
        rows = [pred.row() for kc, pred in sorted(preds.items()) if kc not in measured]
        return rows, {**self.describe(), "stopped": stop or "settled", "measured_cells": len(measured),
                      "predicted_cells": len(rows),
                      "predicted_concurrencies": [c for c in self.concurrency if all(cc != c for _, cc in measured)]}

    def describe(self) -> JsonObject:
        """sweep.json's ``guided``: the rounds measured and the last fit."""
        return {"objective": self.objective, "confidence": self.confidence, "noise_band": self.noise_band,
                "rounds": [[list(x) for x in r] for r in self.rounds], "fit": self.fit_info,
                "comparisons": self.decisions, "why": self.why,
                "left_to_model": {str(c): v for c, v in sorted(self.left_to_model.items())}}
