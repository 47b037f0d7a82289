"""Where a per-batch-size choice can gain over one static num_steps, by the sweep's paired comparisons.

A comparison "beats" only when the whole paired bootstrap interval of the objective ratio clears the noise band
(:func:`spectune.tune.recommend.compare`; without intervals the point ratio against the band). Two uses:

- :func:`gaining_steps`: the num_steps worth a place in a slot's SGLang ladder beside the slot's own: those that beat
  it at one of the slot's concurrencies. A neighbour that gains nothing only adds switches (at batch size 1 a
  ``[1, 2]`` ladder switched 32 times in 30 s on the bundled engine and ran 3.4% behind static K=1).
- :func:`static_primary`: when no slot's num_steps beats the best static num_steps anywhere, the schedule cannot
  win by more than noise, so the primary recommendation is that static num_steps for every engine
  (:func:`apply_static_primary`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

from spectune.results.cell import Cell
from spectune.results.primary import Primary
from spectune.tune.compare import OBJECTIVES, Comparison
from spectune.tune.options import RecommendOptions


class SlotLike(Protocol):
    """What this module reads and sets of a batch-size slot (:class:`spectune.tune.recommend.Slot`)."""

    lower: int
    upper: int | None
    steps: int
    concurrencies: list[int]


class ChoiceLike(Protocol):
    """What this module reads of a choice (:class:`spectune.tune.recommend.Choice`)."""

    concurrency: int
    steps: int | None
    band: float


class RecommendationLike(Protocol):
    """What this module reads and sets of a recommendation (:class:`spectune.tune.recommend.Recommendation`, whose
    module imports this one: these protocols keep the import one way)."""

    options: RecommendOptions
    cells: list[Cell]
    choices: list[ChoiceLike]
    slots: list[SlotLike]
    schedule_slots: list[SlotLike]
    best_static: int | None
    static_scores: dict[int, float]
    primary: Primary | None

    def cell(self, steps: int, concurrency: int) -> Cell | None: ...

    def slot_cell(self, steps: int, concurrency: int) -> Cell | None: ...

    @property
    def schedule_cells(self) -> list[Cell]: ...

    def compare(self, a: Cell, b: Cell, band: float) -> Comparison: ...

    @property
    def steps(self) -> list[int]: ...


class ScheduleComparison(Comparison):
    """:func:`schedule_comparisons`: a comparison with the slot cell's ``server``."""

    server: str


class ServerCost(Comparison):
    """:func:`schedule_server_costs`: a comparison with its ``steps`` and ``cost`` (fraction)."""

    steps: int
    cost: float


def _band(rec: RecommendationLike, conc: int) -> float:
    ch = next((c for c in rec.choices if c.concurrency == conc), None)
    return ch.band if ch is not None else rec.options.noise_band


def gaining_steps(rec: RecommendationLike, slot: SlotLike, allowed: list[int]) -> list[int]:
    """The num_steps in ``allowed`` (other than ``slot.steps``) that beat ``slot.steps`` beyond the noise band at
    one of the slot's concurrencies (measured cells, not predicted), ascending."""
    out = []
    for k in allowed:
        if k == slot.steps:
            continue
        for conc in slot.concurrencies:
            a, b = rec.cell(k, conc), rec.cell(slot.steps, conc)
            if a is None or b is None or not a.eligible or a.predicted or b.status != "ok" or b.predicted:
                continue
            if rec.compare(a, b, _band(rec, conc))["verdict"] == "beats":
                out.append(k)
                break
    return out


def schedule_comparisons(rec: RecommendationLike) -> list[ScheduleComparison]:
    """The schedule against the best static num_steps at each measured concurrency of each slot
    (:func:`spectune.tune.recommend.compare`, slot cell / static cell): the slot's cell is where the schedule is
    priced (:meth:`~spectune.tune.recommend.Recommendation.slot_cell`: the schedule server's cell when the sweep
    measured it, so a slot whose num_steps equals the static one is compared too: its server differs); without
    schedule-server cells, only slots whose num_steps differs from the static one. Each dict also has ``server``
    (the slot cell's server)."""
    k0 = rec.best_static
    if k0 is None:
        return []
    priced = bool(rec.schedule_cells)
    out = []
    for slot in rec.slots:
        if slot.steps == k0 and not priced:
            continue
        for conc in slot.concurrencies:
            a, b = rec.slot_cell(slot.steps, conc), rec.cell(k0, conc)
            if a is None or b is None or a.status != "ok" or b.status != "ok" or a.predicted or b.predicted:
                continue
            if a is b:
                continue
            cmp = rec.compare(a, b, _band(rec, conc))
            if a.server != "static":
                cmp["text"] = f"on the {a.server} server, {cmp['text']}"
            out.append({**cmp, "server": a.server})
    return out


def schedule_gains(rec: RecommendationLike) -> list[ScheduleComparison]:
    """The comparisons of :func:`schedule_comparisons` where the schedule beats the best static num_steps beyond
    the noise band."""
    return [c for c in schedule_comparisons(rec) if c["verdict"] == "beats"]


def static_primary(rec: RecommendationLike) -> str | None:
    """Why the best static num_steps is the primary recommendation, or None when the schedule gains over it.

    With schedule-server cells the schedule must also lose nowhere: a slot priced on the schedule server that is
    worse than the static server beyond the noise band at one of its concurrencies (vLLM's drafter at K=0) makes
    the static num_steps (no drafter, when that is K=0) the answer."""
    k0 = rec.best_static
    if k0 is None or not rec.slots:
        return None
    if all(s.steps == k0 for s in rec.slots):
        return f"num_steps {k0} is the choice at every measured concurrency"
    losses = [c for c in schedule_comparisons(rec) if c["verdict"] == "loses"] if rec.schedule_cells else []
    if losses:
        what = "no drafter (static K=0)" if k0 == 0 else f"the static K={k0}"
        return (f"priced where it runs, the schedule loses to {what} beyond the noise band: "
                + "; ".join(f"{c['text']} ({c['server']} server K={c['a']} vs static K={c['b']})" for c in losses))
    if schedule_gains(rec):
        return None
    others = sorted({s.steps for s in rec.slots if s.steps != k0})
    return (f"no batch-size slot's num_steps ({', '.join(f'K={k}' for k in others)}) beats the best static K={k0} by "
            "more than the noise band at any of its measured concurrencies, so a per-batch-size schedule cannot "
            "be told apart from it and would only add switching")


def apply_static_primary(rec: RecommendationLike) -> None:
    """When :func:`static_primary` gives a reason, make the best static num_steps the answer (:func:`use_static`);
    else record the schedule's gains in ``rec.primary``. ``rec.schedule_slots`` keeps the per-batch-size choice."""
    why = static_primary(rec)
    rec.schedule_slots = list(rec.slots)
    if why is None:
        rec.primary = Primary("schedule", None, "; ".join(c["text"] for c in schedule_gains(rec)))
        return
    use_static(rec, int(rec.best_static), why)  # type: ignore[arg-type]


def use_static(rec: RecommendationLike, k0: int, why: str) -> None:
    """Make static num_steps ``k0`` the primary recommendation: ``rec.primary`` says so and why, and ``rec.slots``
    becomes one slot running ``k0`` at every batch size, so every engine's file carries it (set
    ``rec.schedule_slots`` to the per-batch-size slots first)."""
    rec.primary = Primary("static", k0, why)
    if any(s.steps != k0 for s in rec.slots):
        concs = sorted({c for s in rec.slots for c in s.concurrencies})
        rec.slots = [dataclasses.replace(rec.slots[0], lower=1, upper=None, steps=k0, concurrencies=concs)]


def schedule_server_costs(rec: RecommendationLike) -> list[ServerCost]:
    """Each schedule-server cell (ok) against the static cell of its (num_steps, concurrency) (ok; at K=0: no
    drafter): :func:`spectune.tune.compare.compare` of the two plus ``steps`` and ``cost``, the fraction the schedule
    server is worse by (1 - ratio; TPOT: ratio - 1)."""
    out = []
    _, direction, _ = OBJECTIVES[rec.options.objective]
    for a in rec.schedule_cells:
        b = rec.cell(a.steps, a.concurrency)
        if b is None or a.status != "ok" or b.status != "ok" or not math.isfinite(a.objective) \
                or not math.isfinite(b.objective):
            continue
        cmp = rec.compare(a, b, rec.options.noise_band)
        worse = (1 - cmp["ratio"]) if direction == "max" else (cmp["ratio"] - 1)
        out.append({**cmp, "steps": a.steps, "cost": worse})
    return out
