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
from dataclasses import dataclass, field, replace
from typing import Sequence

from spectune.core.json_types import JsonObject
from spectune.results.confidence import Bootstrap, RunRequests, ratio_interval
from spectune.results.drift import midpoint_s
from spectune.results.point import RequestLine, SweepPoint

__all__ = ["OBJECTIVE_COLUMNS", "DriftCheck", "drift_check", "drift_summary"]

OBJECTIVE_COLUMNS = {"throughput": "output_throughput_tok_s", "tpot": "tpot_p50_ms"}


@dataclass(frozen=True)
class DriftCheck:
    """One drift check (:func:`drift_check`; sweep.json ``drift.checks``, :meth:`to_json`).

    Attributes:
        label: which check (``end of sweep``, ``end of block K=3``). steps, concurrency, repeat: the reference point.
        objective: ``throughput`` or ``tpot``; first, again: its value in the two measurements (tokens/s or ms;
            as written in ``metrics``, None when missing). confidence: the interval's level.
        span_s: s between the middles of the two measurements (None without their stamps).
        ratio: again / first with its paired percentile interval ``low``/``high`` (None when unknown).
        drifted: the whole interval lies outside the noise band (module docstring). change: |ratio - 1|.
        note: why a check could not compare (None when it compared).
        extra: keys written after the check's own: a ``--ray`` sweep's ``node``, the node its block ran on.
    """

    label: str
    steps: int
    concurrency: int
    repeat: int
    objective: str
    first: float | None
    again: float | None
    confidence: float
    span_s: float | None
    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    drifted: bool = False
    change: float = 0.0
    note: str | None = None
    extra: JsonObject = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        """sweep.json's check: the attributes in order (``note`` only when set), then ``extra``."""
        out: JsonObject = {"label": self.label, "steps": self.steps, "concurrency": self.concurrency,
                           "repeat": self.repeat, "objective": self.objective, "first": self.first,
                           "again": self.again, "confidence": self.confidence, "span_s": self.span_s,
                           "ratio": self.ratio, "low": self.low, "high": self.high, "drifted": self.drifted,
                           "change": self.change}
        if self.note is not None:
            out["note"] = self.note
        return {**out, **self.extra}

    @property
    def line(self) -> str:
        """The check in a few words: ``objective first -> again, ratio [low, high]`` or why it did not compare."""
        if self.ratio is None:
            return self.note or "not comparable"
        span = f" [{self.low:.3f}, {self.high:.3f}]" if self.low is not None else ""
        return f"{self.objective} {self.first:.4g} -> {self.again:.4g}, {self.ratio:.3f}x{span}"


def drift_check(label: str, first: SweepPoint, again: SweepPoint, first_records: Sequence[RequestLine],
                again_records: Sequence[RequestLine], objective: str = "throughput",
                confidence: float = 0.95, band: float = 0.02) -> DriftCheck:
    """One drift check: the reference point ``first`` and its re-measurement ``again`` (records with ``metrics``),
    with their request objects (requests.jsonl form).

    Returns:
        the check: objective values (tokens/s or ms), the ratio again / first with its paired percentile interval
        (NaN -> None when unknown), ``drifted`` (the whole interval is outside ``[1 - band, 1 + band]``; without an
        interval, the ratio is off 1 by more than max(band, 5%)), ``change`` = |ratio - 1| (a fraction) and
        ``span_s``, the seconds between the middles of the two measurements (their ``started`` and ``finished``
        stamps; None without them).

    Raises:
        ValueError: an objective other than ``throughput`` or ``tpot``.
    """
    if objective not in OBJECTIVE_COLUMNS:
        raise ValueError(f"unknown objective {objective!r}")
    value = (lambda n: n.output_throughput_tok_s) if objective == "throughput" else (lambda n: n.tpot_p50_ms)
    a, b = value(first.numbers), value(again.numbers)
    t0, t1 = midpoint_s(first), midpoint_s(again)
    check = DriftCheck(label, first.steps, first.concurrency, first.repeat, objective, a, b, confidence,
                       t1 - t0 if t0 is not None and t1 is not None else None)
    if a is None or b is None or not a or first.status != "ok" or again.status != "ok":
        return replace(check, note="not comparable (a failed or empty measurement)")
    run_a, run_b = RunRequests.from_records(first_records), RunRequests.from_records(again_records)
    boot = Bootstrap([*run_a.prompt, *run_b.prompt])
    reps_b = boot.run_replicates(run_b, objective, float(b))
    reps_a = boot.run_replicates(run_a, objective, float(a))
    iv = ratio_interval(reps_b, reps_a, b / a, confidence)
    drifted = (iv.low > 1 + band or iv.high < 1 - band) if iv.known else abs(b / a - 1) > max(band, 0.05)
    clean = lambda x: x if math.isfinite(x) else None  # noqa: E731
    return replace(check, ratio=b / a, low=clean(iv.low), high=clean(iv.high), drifted=bool(drifted),
                   change=abs(b / a - 1))


def drift_summary(checks: Sequence[DriftCheck], order: str) -> JsonObject:
    """sweep.json's ``drift``: the run order, every check, ``drifted`` (any check drifted), ``change`` (the largest
    change among drifted checks, a fraction; 0 when none drifted) and a one-line ``summary``."""
    drifted = [c for c in checks if c.drifted]
    lines = [f"{c.label}: {c.line}" if c.ratio is None else
             f"{c.label} K={c.steps} c={c.concurrency}: {c.line}" + (" DRIFTED" if c.drifted else " (within noise)")
             for c in checks]
    return {"order": order, "checks": [c.to_json() for c in checks], "drifted": bool(drifted),
            "change": max((c.change for c in drifted), default=0.0),
            "summary": "; ".join(lines) if lines else "no drift check ran"}
