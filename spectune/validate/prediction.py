"""Predicted beside measured: what the sweep behind a config says each validate run should deliver
(:func:`spectune.tune.predict.predict_validate`), and where the measurement misses it.

The sweep's cells come from the ``recommendation.json`` that ``spectune recommend`` wrote next to the config (the
config's own folder). A validate run usually comes minutes or hours after the sweep, and a shared machine's speed
drifts by several percent in that time, equally for every run; so the comparison first takes the **speed factor**,
the median over the static runs of measured / predicted overall throughput, and then flags a run or phase whose
measured / (predicted x speed factor) falls outside its interval (predicted low / predicted, high / predicted)
widened by the same server-to-server spread validate's own intervals carry
(:class:`spectune.validate.repeats.InstanceSpread`: a run is one fresh server per repeat, and that server's own speed
is in what it measures, as much as in any ratio of two runs). Such a miss is not noise the sweep or the servers
knew of: either the engine behaves differently under changing load than in
the sweep's fixed-concurrency cells (an adaptive engine's own cost, a ladder that does not settle), or the model
(:mod:`spectune.tune.predict`) is wrong for that phase (the drain after a drop from high concurrency is modelled
coarsely).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

from spectune.tune.predict import MODEL, StaticSteps, predict_validate

from spectune.backends.num_steps import load_config_file
from spectune.core.json_types import JsonObject
from spectune.measure.workload import Workload
from spectune.results.cell import Cell
from spectune.results.recommendation_doc import RecordedRecommendation
from spectune.results.validate_doc import (ComparisonRow, RecordedComparison, RecordedPrediction, RecordedWorkload,
                                          ValidateDoc)
from spectune.results.validate_run import RunWindow, ValidateRun
from spectune.validate.config_formats import STATIC_FORMATS

if TYPE_CHECKING:
    from spectune.validate.repeats import InstanceSpread

RECOMMENDATION = "recommendation.json"


def find_recommendation(config: str) -> Path | None:
    """``recommendation.json`` in the config file's folder, or None. Spelled from ``config`` as the user gave it
    (relative stays relative), since validate.json's ``prediction.source`` and validate.md's "Predicted from" line
    record it and a committed result should name no machine's folders."""
    path = Path(config).parent / RECOMMENDATION
    return path if path.is_file() else None


class PlanLike(Protocol):
    """What :func:`predict_for` reads of a :class:`~spectune.validate.plan.ValidatePlan` (whose module imports this
    one through the verdict: the protocol keeps the import one way)."""

    config: str
    workload: Workload
    steps: Sequence[int]
    max_tokens: int


def predict_for(plan: PlanLike, fmt: str, candidates: Sequence[int]) -> JsonObject | None:
    """Predictions (:func:`spectune.tune.predict.predict_validate`) for ``plan`` from the recommendation.json
    beside its config, with ``source``; None when there is none or it cannot be read (a prediction is extra
    information, never a reason to fail)."""
    path = find_recommendation(plan.config)
    if path is None:
        return None
    workload = RecordedWorkload.from_json(plan.workload.to_json())
    try:
        rec = RecordedRecommendation.read(path)
        config = StaticSteps(int(candidates[0])) if fmt in STATIC_FORMATS else load_config_file(plan.config)
        runs = predict_validate(rec.cells, rec.objective, workload, list(plan.steps), config, plan.max_tokens,
                                [a.t for a in plan.workload.arrivals], rec.schedule_cells)
    except Exception as err:  # noqa: BLE001 - a broken or foreign recommendation.json only loses the prediction
        return {"source": str(path), "error": f"{type(err).__name__}: {err}", "runs": {}}
    predicted: JsonObject = {n: asdict(r) for n, r in runs.items()}  # type: ignore[misc]
    return {"source": str(path), "primary": rec.primary, "runs": predicted, "model": MODEL,
            **load_notes(rec.cells, workload)}


def usable_prediction(meta: JsonObject) -> JsonObject | None:
    """validate.json's ``prediction`` object when there is one without an ``error`` (the one the verdict compares
    with and ``--rule-again`` updates in place), else None."""
    pred = ValidateDoc.from_json(meta).prediction
    return meta["prediction"] if pred is not None and not pred.error else None  # type: ignore[return-value]


def load_notes(cells: Sequence[Cell], workload: RecordedWorkload) -> JsonObject:
    """What the prediction says about the workload against the recommendation: ``above_sweep``
    (:func:`above_sweep`) and ``load_mix`` (:func:`workload_mix`); computed when predicting and again by
    ``--rule-again``. ``cells``: recommendation.json's ``cells``; ``workload``: validate.json's ``plan.workload``
    (:meth:`spectune.measure.workload.Workload.to_json`)."""
    return {"above_sweep": above_sweep(cells, workload), "load_mix": workload_mix(workload)}  # type: ignore[dict-item]


def above_sweep(cells: Sequence[Cell], workload: RecordedWorkload) -> JsonObject | None:
    """The workload's closed-loop phases whose concurrency lies above the sweep's largest measured concurrency:
    ``{"sweep_max": C, "phases": [{"phase" (1-based), "concurrency"}]}``, or None when every phase is within the
    sweep. There the config's num_steps is its last slot's, chosen at ``sweep_max``, and the prediction holds that
    cell's rate, so neither was measured at the phase's load (a larger batch costs a step more, and which
    num_steps wins can change with it). ``cells``: recommendation.json's ``cells``; ``workload``:
    :meth:`spectune.measure.workload.Workload.to_json`."""
    concs = [int(c.concurrency) for c in cells if c.concurrency is not None]
    if not concs:
        return None
    top = max(concs)
    phases = [{"phase": int(ph.phase), "concurrency": int(ph.concurrency or 0)}
              for ph in workload.phases if (ph.concurrency or 0) > top]
    return {"sweep_max": top, "phases": phases} if phases else None  # type: ignore[dict-item]


def workload_mix(workload: RecordedWorkload) -> dict[str, float]:
    """Seconds per concurrency of the workload's closed-loop phases (``{"1": 60.0, "32": 60.0}`` for the swing at
    30 s a phase), the load ``spectune recommend --mix`` prices answers on (:mod:`spectune.tune.mix`); open-loop
    phases have no concurrency and are left out. ``workload``: :meth:`spectune.measure.workload.Workload.to_json`."""
    out: dict[str, float] = {}
    for ph in workload.phases:
        if ph.concurrency:
            key = str(int(ph.concurrency))
            out[key] = out.setdefault(key, 0.0) + float(ph.end_s) - float(ph.start_s)
    return out


def mix_line(pred: RecordedPrediction) -> str | None:
    """When the recommendation ranked its answers without a load mix (every swept concurrency weighing the same)
    and the workload's closed-loop phases span two or more concurrencies: the ``--mix`` that prices the answers
    on this workload's load, as this validation rules (overall output tokens/s). None otherwise."""
    mix, primary = pred.load_mix, pred.recommended
    if len(mix) < 2 or (primary is not None and primary.mix):
        return None
    arg = ",".join(f"{c}:{s:g}" for c, s in sorted(mix.items(), key=lambda kv: int(kv[0])))
    return (f"recommend ranked its answers with every swept concurrency weighing the same; this workload spends "
            f"its time as {arg} (concurrency:seconds): `spectune recommend SWEEP --mix {arg}` ranks them by the "
            "tokens this load streams, as this verdict does.")


def above_sweep_line(pred: RecordedPrediction) -> str | None:
    """One sentence on :func:`above_sweep`'s phases (None without any)."""
    above = pred.above_sweep
    if not above:
        return None
    phases = above["phases"]
    concs = sorted({ph["concurrency"] for ph in phases})
    names = ", ".join(str(ph["phase"]) for ph in phases)
    return (f"Phase{'s' if len(phases) > 1 else ''} {names} (concurrency {', '.join(map(str, concs))}) "
            f"lie{'s' if len(phases) == 1 else ''} above the sweep's largest concurrency {above['sweep_max']}: the "
            f"config's num_steps there and the prediction both extrapolate from concurrency {above['sweep_max']}; "
            f"a sweep up to {max(concs)} measures them.")


def compare(prediction: RecordedPrediction, runs: Sequence[ValidateRun],
            spreads: Mapping[int | str, InstanceSpread] | None = None, confidence: float = 0.95) -> JsonObject:
    """Measured beside predicted for combined runs (:func:`spectune.validate.repeats.combine_repeats`).

    ``spreads``: the server-to-server spread of each window (keys ``"overall"`` and the 1-based phase;
    :func:`spectune.validate.repeats.overall_spread`, :func:`spectune.validate.phase_check.phase_spreads`). A
    window's interval [low / predicted, high / predicted] is widened on both sides by the half-width
    (:meth:`~spectune.validate.repeats.InstanceSpread.half_width`) the spread gives the ratio of the run (its
    repeats) to the static runs the speed factor comes from (as many repeats); a window without a spread is not
    widened.

    Returns ``{"speed_factor": f or None, "rows": [{"run", "window" ("overall" or the 1-based phase), "predicted",
    "low", "high" (tok/s at the sweep's speed, the sweep's own interval), "band" (the fraction the interval was
    widened by on each side), "measured", "ratio" (measured / (predicted x f)), "miss" (bool)}], "misses": [text]}``.
    """
    pred = prediction.runs
    ok = {r.run: r for r in runs if r.ok}
    factors = [(ok[n].throughput or 0.0) / p.overall[0] for n, p in pred.items()
               if n.startswith("static:") and n in ok and p.overall[0] > 0 and ok[n].throughput]
    f = statistics.median(factors) if factors else None
    rows, misses = [], []
    for name, p in pred.items():
        r = ok.get(name)
        if r is None:
            continue
        windows: list[tuple[int | str, list[float], RunWindow]] = [("overall", p.overall, r.overall)]
        windows += [(i + 1, ph, r.phases[i] if i < len(r.phases) else RunWindow.empty())
                    for i, ph in enumerate(p.phases)]
        repeats = int(r.repeats or 1)
        for label, (point, lo, hi), m in windows:
            measured = m.output_throughput_tok_s
            if measured is None or not point or f is None:
                continue
            spread = (spreads or {}).get(label)
            band = math.expm1(spread.half_width(repeats, repeats, confidence)) if spread is not None else 0.0
            ratio = measured / (point * f)
            miss = not (lo / point / (1 + band) - 1e-9 <= ratio <= hi / point * (1 + band) + 1e-9)
            rows.append({"run": name, "window": label, "predicted": point, "low": lo, "high": hi, "band": band,
                         "measured": measured, "ratio": ratio, "miss": miss})
            if miss:
                where = "overall" if label == "overall" else f"phase {label}"
                misses.append(f"{name} {where}: measured {measured:,.1f} tok/s, predicted {point * f:,.1f} "
                              f"[{lo * f / (1 + band):,.1f}, {hi * f * (1 + band):,.1f}] (x{f:.3f} speed factor, "
                              f"+-{band:.1%} server-to-server)")
    return {"speed_factor": f, "rows": rows, "misses": misses}


def markdown(pred: RecordedPrediction | None) -> list[str]:
    """validate.md's "Predicted vs measured" section (nothing without a prediction)."""
    if pred is None:
        return []
    if pred.error:
        return ["## Predicted vs measured", "", f"No prediction: `{pred.source}` could not be used "
                f"({pred.error}).", ""]
    cmp = pred.comparison
    f = cmp.speed_factor
    lines = ["## Predicted vs measured", "",
             f"Predicted from the sweep's cells in `{pred.source}` ({pred.model}; docs/validate.md). "
             + (f"Speed factor {f:.3f}: the median over the static runs of measured / predicted overall output "
                "tok/s (the machine's speed drift between the sweep and this run); predicted values below are "
                "scaled by it. The interval is the sweep's, widened on both sides by the server-to-server spread "
                "of the window (`+-`, as in every interval of this validation). `MISS`: outside it, an engine or "
                "model finding rather than noise."
                if f else "No static run finished, so no speed factor and no comparison."), ""]
    lines += [x for line in (above_sweep_line(pred), mix_line(pred)) if line is not None for x in (line, "")]
    if not cmp.rows or f is None:
        return lines
    lines += ["| run | window | predicted tok/s | interval | +- | measured tok/s | measured / predicted | |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in cmp.rows:
        band = r.band or 0.0
        lines.append(f"| {r.run} | {r.window} | {r.predicted * f:,.1f} | [{r.low * f / (1 + band):,.1f}, "
                     f"{r.high * f * (1 + band):,.1f}] | {band:.1%} | {r.measured:,.1f} | {r.ratio:.3f} | "
                     f"{'MISS' if r.miss else ''} |")
    return lines + [""]


def summary_lines(pred: RecordedPrediction | None) -> list[str]:
    """Terminal lines: predicted beside measured overall per run, and every miss."""
    cmp = pred.comparison if pred is not None else RecordedComparison()
    f = cmp.speed_factor
    if pred is None or not cmp.rows or not f:
        return []

    def bounds(r: ComparisonRow) -> str:
        band = r.band or 0.0
        return f"[{r.low * f / (1 + band):,.1f}, {r.high * f * (1 + band):,.1f}]"

    out = [f"predicted (sweep, x{f:.3f} speed factor, with the server-to-server spread) vs measured overall tok/s: "
           + "; ".join(f"{r.run} {r.predicted * f:,.1f} {bounds(r)} vs {r.measured:,.1f}"
                       + (" MISS" if r.miss else "") for r in cmp.rows if r.window == "overall")]
    phase_misses = [m for m in cmp.misses if "overall" not in m]
    if phase_misses:
        out.append(f"{len(phase_misses)} phase(s) outside the predicted interval (validate.md lists them)")
    return out + [line for line in (above_sweep_line(pred), mix_line(pred)) if line is not None]
