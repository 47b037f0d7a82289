"""How far the machine's drift can move the comparison of two cells measured at different times.

A sweep's drift check (:mod:`spectune.sweep.drift`) measures a reference cell again after ``span_s`` seconds and
finds it moved by ``change`` (a fraction, ``|again / first - 1|``). Two cells measured ``gap`` seconds apart share the
drift of the time between them only. The engine's speed is modelled as a random walk (a Wiener process: the variance
of its relative change grows in proportion to the time elapsed, so its typical size with the square root): one
check's change ``d`` over ``span_s`` gives a change of about ``d * sqrt(gap / span_s)`` over ``gap``. That share,
never more than the check's own ``d``, is what :meth:`DriftBand.between` returns: the largest over the checks that
drifted. Where cells are measured one after another (the interleaved order of a sweep on an engine that switches
num_steps cheaply, or the guided plan's adjacent pair of cells), the comparison carries a small part of the sweep's
drift; cells a whole num_steps block apart carry most of it.

Why not the whole change for every pair: on the bundled engine (``python benchmarks/guided_vs_grid.py --backend
local``, the command in docs/sweep.md) a guided sweep's check re-measured K=0 at concurrency 8
after about 180 s and read +5.7%; widened by the whole 5.7%, the tie band at concurrency 1 reaches the interval
[0.776, 0.964] of K=0 against K=1, though the two windows ran back to back, 17 s apart, and K=0 is chosen at 0.746 of
K=1 (the grid's measurement). With the random-walk share (``0.057 * sqrt(17 / 180)``, 1.8%) the band stays at the
plan's 2% and K=1 is chosen. On sixteen grids of that command scored against each other
(``benchmarks/grid_vs_grid.py``) the share makes them agree at concurrency 1 in 240 of 240 ordered pairs, the whole
change in 212 (docs/sweep.md, "How reproducible the grid's own choice is"). A check without its span (a sweep.json
drift entry without ``span_s``) keeps the whole change for every pair.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from spectune.core.json_types import JsonObject
from spectune.results.point import SweepPoint

__all__ = ["DriftBand", "cell_times", "midpoint_s"]


def midpoint_s(point: SweepPoint | JsonObject) -> float | None:
    """The middle of a point's measurement (a record's, or a points.jsonl object's, ``started`` and ``finished``,
    ISO 8601), in seconds since the Unix epoch; None when either stamp is missing or unreadable."""
    if isinstance(point, SweepPoint):
        started, finished = point.started, point.finished
    else:
        started, finished = point.get("started"), point.get("finished")
    try:
        a = _dt.datetime.fromisoformat(str(started)).timestamp()
        b = _dt.datetime.fromisoformat(str(finished)).timestamp()
    except (TypeError, ValueError):
        return None
    return (a + b) / 2


def cell_times(points: Iterable[JsonObject]) -> dict[tuple[int, int], float]:
    """(steps, concurrency) -> the mean of :func:`midpoint_s` over the cell's measured points (s since the epoch);
    drift re-measurements (``drift_check`` set), predicted rows and points without stamps are left out."""
    times: dict[tuple[int, int], list[float]] = {}
    for p in points:
        if p.get("drift_check") or p.get("predicted"):
            continue
        t = midpoint_s(p)
        if t is not None:
            times.setdefault((int(p["steps"]), int(p["concurrency"])), []).append(t)
    return {kc: sum(ts) / len(ts) for kc, ts in times.items()}


@dataclass(frozen=True)
class DriftBand:
    """The drift share of a comparison (module docstring) from a sweep's drifted checks.

    Attributes:
        checks: ``(change, span_s)`` of each check that drifted: its change (a fraction) and the seconds between its
            two measurements (None when unknown: the whole change then counts for every pair).
    """

    checks: tuple[tuple[float, float | None], ...] = ()

    @classmethod
    def from_sweep(cls, drift: JsonObject | None) -> "DriftBand":
        """From sweep.json's ``drift`` (:func:`spectune.sweep.drift.drift_summary`; None: no check ran)."""
        checks: Sequence[JsonObject] = (drift or {}).get("checks") or []
        out = []
        for c in checks:
            if c.get("drifted"):
                span = c.get("span_s")
                out.append((float(c.get("change") or 0.0),
                            float(span) if isinstance(span, (int, float)) and span > 0 else None))
        return cls(tuple(out))

    @property
    def change(self) -> float:
        """The largest change among the drifted checks (a fraction; 0 when none drifted)."""
        return max((c for c, _ in self.checks), default=0.0)

    def between(self, a_s: float | None, b_s: float | None) -> float:
        """The drift two cells measured at ``a_s`` and ``b_s`` (s, any common origin; None: unknown) may differ by,
        a fraction: the largest over the drifted checks of ``change * min(1, sqrt(gap / span_s))``, ``gap`` =
        ``|a_s - b_s|``; the whole change where a time or a span is unknown; 0 without a drifted check."""
        if a_s is None or b_s is None or not (math.isfinite(a_s) and math.isfinite(b_s)):
            return self.change
        gap = abs(a_s - b_s)
        return max((change if span is None else change * min(1.0, math.sqrt(gap / span))
                    for change, span in self.checks), default=0.0)
