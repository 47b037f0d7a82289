"""Drift control of a sweep: is the machine still the one that measured the first points?

A reference cell (the first point the sweep measured) is measured again at the end of the sweep, and in blocks order
each block's first cell again at the end of its block (no restart needed). Each re-measurement is compared with the
first by the paired bootstrap of :mod:`spectune.results.confidence` (the same prompts in the same order, resampled
together): ``ratio`` = again / first of the objective, with its interval at the plan's confidence. The cell
**drifted** when that whole interval lies outside the noise band around 1 (``[1 - band, 1 + band]``, the plan's
``noise_band``): it moved more than its measurement noise explains, and by more than the differences the
recommendation ignores anyway. Each check's drift, ``|ratio - 1|``, and the seconds between its two measurements
are recorded in sweep.json (``drift``); ``spectune recommend`` does not call a difference between two cells smaller
than the share of that drift the time between the two cells' measurements carries
(:class:`spectune.results.drift.DriftBand`: the change scaled by the square root of that time over the check's).
"""

from __future__ import annotations

import math
from typing import Any, Sequence, TypedDict

from spectune.results.confidence import Bootstrap, RunRequests, ratio_interval
from spectune.results.drift import midpoint_s
from spectune.results.point import MetricValue, SweepPoint

__all__ = ["OBJECTIVE_COLUMNS", "DriftCheck", "drift_check", "drift_summary"]

OBJECTIVE_COLUMNS = {"throughput": "output_throughput_tok_s", "tpot": "tpot_p50_ms"}


class _DriftCheckBase(TypedDict):
    label: str
    steps: int
    concurrency: int
    repeat: int
    objective: str
    first: MetricValue
    again: MetricValue
    confidence: float
    span_s: float | None
    ratio: float | None
    low: float | None
    high: float | None
    drifted: bool
    change: float


class DriftCheck(_DriftCheckBase, total=False):
    """One drift check (:func:`spectune.sweep.drift.drift_check`; sweep.json ``drift.checks``): ``label``, the
    reference point (``steps``, ``concurrency``, ``repeat``), ``objective`` with its ``first`` and ``again`` values
    (tokens/s or ms), ``ratio`` again / first with its interval ``low``/``high`` at ``confidence`` (None when
    unknown), ``drifted``, ``change`` = |ratio - 1|, ``span_s`` and, for a check that could not compare, ``note``."""

    note: str


def drift_check(label: str, first: SweepPoint, again: SweepPoint, first_records: Sequence[dict[str, Any]],
                again_records: Sequence[dict[str, Any]], objective: str = "throughput",
                confidence: float = 0.95, band: float = 0.02) -> DriftCheck:
    """One drift check: the reference point ``first`` and its re-measurement ``again`` (records with ``metrics``),
    with their request objects (requests.jsonl form).

    Returns:
        ``{"label", "steps", "concurrency", "repeat", "objective", "first", "again", "ratio", "low", "high",
        "confidence", "drifted", "change", "span_s"}``: objective values (tokens/s or ms), the ratio again / first
        with its paired percentile interval (NaN -> None when unknown), ``drifted`` (the whole interval is outside
        ``[1 - band, 1 + band]``; without an interval, the ratio is off 1 by more than max(band, 5%)), ``change`` =
        |ratio - 1| (a fraction) and ``span_s``, the seconds between the middles of the two measurements (their
        ``started`` and ``finished`` stamps; None without them).

    Raises:
        ValueError: an objective other than ``throughput`` or ``tpot``.
    """
    if objective not in OBJECTIVE_COLUMNS:
        raise ValueError(f"unknown objective {objective!r}")
    col = OBJECTIVE_COLUMNS[objective]
    a = first.metrics.get(col)
    b = again.metrics.get(col)
    out: dict[str, Any] = {"label": label, "steps": first.steps, "concurrency": first.concurrency,
                           "repeat": first.repeat, "objective": objective, "first": a, "again": b,
                           "confidence": confidence}
    t0, t1 = midpoint_s(first), midpoint_s(again)
    out["span_s"] = t1 - t0 if t0 is not None and t1 is not None else None
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not a or first.status != "ok" \
            or again.status != "ok":
        return {**out, "ratio": None, "low": None, "high": None, "drifted": False, "change": 0.0,
                "note": "not comparable (a failed or empty measurement)"}
    boot = Bootstrap([r.get("prompt_id") for r in (*first_records, *again_records)])
    reps_b = boot.run_replicates(RunRequests.from_records(again_records), objective, float(b))
    reps_a = boot.run_replicates(RunRequests.from_records(first_records), objective, float(a))
    iv = ratio_interval(reps_b, reps_a, b / a, confidence)
    drifted = (iv.low > 1 + band or iv.high < 1 - band) if iv.known else abs(b / a - 1) > max(band, 0.05)
    clean = lambda x: x if math.isfinite(x) else None  # noqa: E731
    return {**out, "ratio": b / a, "low": clean(iv.low), "high": clean(iv.high), "drifted": bool(drifted),
            "change": abs(b / a - 1)}


def drift_summary(checks: Sequence[dict[str, Any]], order: str) -> dict[str, Any]:
    """sweep.json's ``drift``: the run order, every check, ``drifted`` (any check drifted), ``change`` (the largest
    change among drifted checks, a fraction; 0 when none drifted) and a one-line ``summary``."""
    drifted = [c for c in checks if c.get("drifted")]
    change = max((c["change"] for c in drifted), default=0.0)
    lines = []
    for c in checks:
        if c.get("ratio") is None:
            lines.append(f"{c['label']}: {c.get('note', 'not comparable')}")
            continue
        span = f" [{c['low']:.3f}, {c['high']:.3f}]" if c.get("low") is not None else ""
        lines.append(f"{c['label']} K={c['steps']} c={c['concurrency']}: {c['objective']} {c['first']:.4g} -> "
                     f"{c['again']:.4g}, {c['ratio']:.3f}x{span}" + (" DRIFTED" if c["drifted"] else " (within noise)"))
    return {"order": order, "checks": list(checks), "drifted": bool(drifted), "change": change,
            "summary": "; ".join(lines) if lines else "no drift check ran"}
