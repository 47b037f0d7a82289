"""Pick the best static num_steps per concurrency from a sweep, and batch-size slots where that choice changes.

The rule, restated from vLLM's ``vllm bench sweep tune_speculative_k`` (median per cell, MAD noise check, smallest K
within a tolerance of the best) and extended (docs/recommend.md is the user-facing description):

1. Cell = (num_steps, concurrency). Repeats are reduced to medians. A cell with any failed repeat is ``failed``;
   a cell of the plan with no row is ``missing``; both are ineligible and reported, never averaged.
2. Spread of a cell = 1.4826 * MAD / |median| of the objective over its ok repeats that ran their whole window
   (robust relative standard deviation; needs >= 2 such repeats: a window stopped early (``--early-stop``, summary.csv
   ``stopped_early``) reports its statistic over its first prompts, which another run's window does not share, so
   the difference between the two is the prompts', not run-to-run noise). Above ``max_spread`` the cell is
   ``noisy``: it may win only when no quiet eligible cell exists at that concurrency, or when it beats the best
   quiet cell beyond its own spread (:func:`spectune.tune.compare.clear_wins`).
3. SLO rule (SpecServe, Huang et al.): a num_steps whose TPOT p99 exceeds the TPOT SLO is not allowed; neither is
   one whose SLO attainment is below ``min_slo_attainment``. If no num_steps at a concurrency meets the SLO the
   best by the objective is still chosen (a config needs a value there) and flagged ``slo-unmet``.
4. Among the candidates the best median wins (where windows cover different prompts, the one no other beats on
   the prompts both measured: :func:`spectune.results.confidence.best_by_pairs`), but every num_steps within the
   noise band of it (the larger of ``noise_band``, the best cell's own spread and the share of the drift a sweep's
   drift check measured that the time between the two cells' measurements carries:
   :class:`spectune.results.drift.DriftBand`) ties, and the smallest tied num_steps is chosen. Where the cells have
   bootstrap replicates (:mod:`spectune.results.confidence`: over requests within a run and over repeats) a
   num_steps also ties when the paired ``confidence`` interval of its objective ratio to the best reaches within the
   band of 1: the data cannot tell it is worse, so the smaller num_steps wins. Both the ratio and its interval are
   taken on the prompts every run of the two cells measured
   (:meth:`spectune.results.confidence.Bootstrap.matched_ratio`; windows capped by time or stopped early cover
   different prompts). Every choice carries its paired comparisons (``K=2 vs K=0:
   1.31x [1.24, 1.38], 95%``).
   Predicted cells (a guided sweep's unmeasured cells) are chosen only where nothing at that concurrency was
   measured.
5. Slots start where the chosen num_steps changes, keyed on batch size, since SGLang and vLLM route by the batch
   they actually run. The key of a concurrency is the engine's measured running batch size of its chosen cell
   (``batch_size_mean``: the time average of the engine's running-requests gauge over the window, median over
   repeats) when every chosen cell has one; else concurrency itself (a closed loop at concurrency C runs batches of
   at most C requests, fewer while requests prefill, queue or straggle). The boundary between keys a < b is the
   geometric midpoint round(sqrt(a*b)) (``boundary="geometric"``) or round(b) (``boundary="measured"``).
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import pandas as pd

from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject, JsonValue
from spectune.results.batch_acceptance import batch_dependent_acceptance
from spectune.results.cell import Cell
from spectune.results.confidence import (Bootstrap, CellRuns, RunRequests, best_by_pairs, percentile_interval,
                                         prompt_ids, requests_by_point)
from spectune.results.drift import DriftBand, cell_times
from spectune.results.point import RequestLine
from spectune.results.primary import Primary
from spectune.results.reader import Results, load_request_records, summary_with_slos, with_text_columns
from spectune.results.schedule_server import RecordedScheduleServer
from spectune.tune.compare import (OBJECTIVES, Comparison, _better, _ties, _within, clear_wins,  # noqa: F401
                                   compare, ratio)  # (re-exported)
from spectune.tune.gain import ServerCost, apply_static_primary, schedule_server_costs
from spectune.tune.options import RecommendOptions
from spectune.tune.mix import apply_mix_primary

#: columns reduced to per-cell medians
CELL_METRICS = ("output_throughput_tok_s", "tpot_p50_ms", "tpot_p99_ms", "ttft_p50_ms", "ttft_p99_ms",
                "acceptance_length", "slo_attainment", "goodput_req_s", "achieved_concurrency", "batch_size_mean")
MAD_TO_SIGMA = 1.4826  # MAD -> standard deviation for normal data (as vLLM's tune_speculative_k)


@dataclass
class Choice:
    """The chosen num_steps at one concurrency (None: nothing usable was measured there)."""

    concurrency: int
    steps: int | None
    best_steps: int | None = None
    band: float = 0.0
    tier: str = "none"  # "quiet" | "noisy" | "slo-unmet" | "predicted" | "none"
    reason: str = ""
    comparisons: list[Comparison] = field(default_factory=list)  # see :func:`compare`


@dataclass
class Slot:
    """A batch-size range [lower, upper] (upper None = open) that runs ``steps``; built from ``concurrencies``."""

    lower: int
    upper: int | None
    steps: int
    concurrencies: list[int]


@dataclass
class Recommendation:
    """Everything ``spectune recommend`` decided; :meth:`to_json` is ``recommendation.json``.

    ``batch_sizes``: concurrency -> the chosen cell's measured running batch size (requests) the slots are keyed on,
    empty when they are keyed on concurrency; ``batch_size_source``: the engine gauge it came from, or
    ``"concurrency"``.
    """

    options: RecommendOptions
    cells: list[Cell]
    choices: list[Choice]
    slots: list[Slot]
    best_static: int | None
    static_scores: dict[int, float]
    warnings: list[str]
    #: batch-dependent acceptance (spectune.results.batch_acceptance)
    findings: list[JsonObject] = field(default_factory=list)
    batch_sizes: dict[int, float] = field(default_factory=dict)
    batch_size_source: str = "concurrency"
    drift: JsonObject | None = None  # the sweep's drift check (sweep.json ``drift``), or None
    #: ``{"kind": "schedule" | "static", "num_steps", "reason"}`` (:mod:`spectune.tune.gain`): with "static" no slot
    #: beat the best static num_steps beyond noise and ``slots`` is that one num_steps for every batch size
    primary: Primary | None = None
    schedule_slots: list[Slot] = field(default_factory=list)  # the per-batch-size slots before that
    requests: list[RequestLine] | None = field(default=None, repr=False, compare=False)  # the sweep's requests
    #: the schedule server's cells (``schedule-server/``), where a schedule's slots are priced, and the choice among
    #: them per concurrency (``choices``: among the static cells); empty without one (slots priced at static cells)
    schedule_cells: list[Cell] = field(default_factory=list)
    schedule_choices: list[Choice] = field(default_factory=list)
    #: :func:`spectune.tune.gain.schedule_server_costs`: each pinned K's schedule server against the static server of that K
    server_costs: list[ServerCost] = field(default_factory=list)
    #: the engine whose schedule server was measured (sweep.json ``schedule_server``), or None
    schedule_server: RecordedScheduleServer | None = None
    #: the draft-confidence cutoffs' cells (the sweep's ``p-min/P/`` folders, ``server`` ``p_min:P``) and whether one
    #: beats the best static num_steps (:func:`spectune.tune.p_min.apply_p_min`); empty / None without them
    p_min_cells: list[Cell] = field(default_factory=list)
    p_min: JsonObject | None = None

    def cell(self, steps: int, concurrency: int) -> Cell | None:
        """The static cell at (steps, concurrency), or None if neither was in the plan."""
        return next((c for c in self.cells if c.steps == steps and c.concurrency == concurrency), None)

    def slot_cell(self, steps: int, concurrency: int) -> Cell | None:
        """Where a schedule's slot running ``steps`` is priced at ``concurrency``: the schedule server's cell when
        the sweep measured one (K=0 falls back to the static server where the schedule server could not be pinned
        to it, SGLang, and where the schedule runs K=0 at every concurrency: no file speculates, so no drafter runs),
        else the static cell."""
        speculates = any(ch.steps for ch in self.schedule_choices)  # K=0 everywhere is no drafter: the static K=0
        if not self.schedule_cells or not speculates:
            return self.cell(steps, concurrency)
        own = next((c for c in self.schedule_cells if c.steps == steps and c.concurrency == concurrency), None)
        return own if own is not None or steps != 0 else self.cell(steps, concurrency)

    def compare(self, a: Cell, b: Cell, band: float) -> Comparison:
        """:func:`compare` of cell ``a`` with cell ``b`` under this recommendation's options."""
        return compare(a, b, self.options, band)

    @property
    def steps(self) -> list[int]:
        """Every swept num_steps, ascending."""
        return sorted({c.steps for c in self.cells})

    @property
    def concurrencies(self) -> list[int]:
        """Every swept concurrency, ascending."""
        return sorted({c.concurrency for c in self.cells})

    def to_json(self) -> JsonObject:
        """A JSON-serialisable dict (NaN -> None)."""
        skip = ("replicates", "runs", "bootstrap")  # working data of the comparisons, not results
        cells, sched, cut = ([{**{f.name: copy.deepcopy(getattr(c, f.name)) for f in fields(c) if f.name not in skip},
                               "eligible": c.eligible} for c in group]
                             for group in (self.cells, self.schedule_cells, self.p_min_cells))
        return _finite({"options": asdict(self.options), "choices": [asdict(c) for c in self.choices],
                      "schedule_cells": sched, "schedule_choices": [asdict(c) for c in self.schedule_choices],
                      "schedule_server_costs": self.server_costs,
                      "schedule_server": self.schedule_server.to_json() if self.schedule_server else None,
                      "slots": [asdict(s) for s in self.slots], "slot_key": self.batch_size_source,
                      "batch_sizes": self.batch_sizes, "best_static_num_steps": self.best_static,
                      "static_scores": self.static_scores, "cells": cells, "warnings": self.warnings,
                      "batch_dependent_acceptance": self.findings, "drift": self.drift,
                      "primary": self.primary.to_json() if self.primary else {},
                      "schedule_slots": [asdict(s) for s in self.schedule_slots],
                      **({"p_min_cells": cut, "p_min": self.p_min} if self.p_min is not None else {})})


def _finite(x: object) -> JsonValue:
    """``x`` with every non-finite float (NaN, inf) as None, dict keys as strings (JSON has no NaN)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    return [_finite(v) for v in x] if isinstance(x, list) else x  # type: ignore[return-value]


def effective_slos(results: Results, opts: RecommendOptions) -> tuple[float | None, float | None, str]:
    """SLOs to apply: the command line's, else the sweep plan's. Returns (ttft_ms, tpot_ms, where from)."""
    if opts.slo_ttft_ms is not None or opts.slo_tpot_ms is not None:
        return opts.slo_ttft_ms, opts.slo_tpot_ms, "command line"
    ttft, tpot = results.meta.plan_value("slo_ttft_ms"), results.meta.plan_value("slo_tpot_ms")
    return ttft, tpot, ("sweep plan" if ttft is not None or tpot is not None else "none")


def build_cell(steps: int, conc: int, rows: pd.DataFrame, opts: RecommendOptions,
               ttft: float | None, tpot: float | None) -> Cell:
    """The cell (``steps``, ``conc``) from its summary rows (with every text column:
    :func:`spectune.results.reader.summary_with_slos`): status, median metrics and objective, the repeats'
    spread, SLO violations against ``ttft``/``tpot`` (ms, or None); a measured cell's interval comes later
    (:func:`attach_intervals`), a predicted cell's is its predicted bounds."""
    col, _, _ = OBJECTIVES[opts.objective]
    if rows.empty:
        return Cell(steps, conc, "missing", notes=["not measured"])
    predicted = "predicted" in rows and bool(rows["predicted"].fillna(False).astype(bool).all())
    ok = rows[rows["status"] == "ok"]
    cell = Cell(steps, conc, "ok", n_ok=len(ok), n_runs=len(rows), predicted=predicted)
    cell.metrics = {m: float(ok[m].median()) if m in ok and ok[m].notna().any() else math.nan for m in CELL_METRICS}
    if len(ok) < len(rows):
        cell.status = "failed"
        err = next((e for e in rows["error"] if isinstance(e, str) and e), "")
        cell.notes.append(f"{len(rows) - len(ok)}/{len(rows)} repeat(s) failed" + (f": {err}" if err else ""))
    vals = ok[col].dropna().to_numpy(float) if col in ok else np.array([])
    if len(vals) == 0:
        if cell.status == "ok":
            cell.status = "no-data"
            cell.notes.append(f"no {col} values")
        return cell
    cell.objective = float(np.median(vals))
    if predicted:
        lo, hi = _predicted_bounds(ok, opts.objective)
        cell.ci_low, cell.ci_high = lo, hi
        cell.notes.append("predicted, not measured")
    # the spread is over the repeats that ran their whole window: one stopped early (--early-stop) reports its
    # statistic over its first prompts, another run's over others, and their difference is the prompts', not noise
    early = ok["stopped_early"].fillna(False).astype(bool) if "stopped_early" in ok else pd.Series(False, ok.index)
    full = ok.loc[~early, col].dropna().to_numpy(float) if col in ok else np.array([])
    if len(full) >= 2 and not predicted:
        mid = float(np.median(full))
        if mid != 0:
            cell.spread = MAD_TO_SIGMA * float(np.median(np.abs(full - mid))) / abs(mid)
            cell.noisy = cell.spread > opts.max_spread
    p99, att = cell.metrics["tpot_p99_ms"], cell.metrics["slo_attainment"]
    if predicted and (ttft is not None or tpot is not None):  # the guided model predicts no tail latency
        cell.violations.append("SLO attainment not predicted (measure the cell)")
    if tpot is not None and math.isfinite(p99) and p99 > tpot:
        cell.violations.append(f"TPOT p99 {p99:.1f} ms > SLO {tpot:g} ms")
    if (ttft is not None or tpot is not None) and math.isfinite(att) and att < opts.min_slo_attainment:
        cell.violations.append(f"SLO attainment {att:.2f} < {opts.min_slo_attainment:g}")
    return cell


def _predicted_bounds(rows: pd.DataFrame, objective: str) -> tuple[float, float]:
    """A predicted cell's interval from summary.csv's interval columns (NaN when absent)."""
    cols = {"throughput": ("output_throughput_ci_low", "output_throughput_ci_high"),
            "tpot": ("tpot_p50_ci_low", "tpot_p50_ci_high")}.get(objective)
    if cols is None or not all(c in rows for c in cols):
        return math.nan, math.nan
    return float(rows[cols[0]].median()), float(rows[cols[1]].median())


def attach_intervals(cells: list[Cell], df: pd.DataFrame, records: list[RequestLine] | None,
                     opts: RecommendOptions, ttft: float | None, tpot: float | None,
                     boot: Bootstrap | None = None, seed_base: int = 0) -> None:
    """Give every measured ok cell its bootstrap replicates and ``confidence`` interval
    (:class:`spectune.results.confidence.Bootstrap`: over its requests, paired across cells by prompt, and over its
    repeats). Cells keep NaN bounds when neither requests nor two repeats exist. ``boot``: a Bootstrap shared with
    cells of another folder (the schedule server's), so their comparisons pair by prompt too; ``seed_base``: the
    first cell's seed offset (distinct per folder)."""
    col, _, _ = OBJECTIVES[opts.objective]
    by_point = requests_by_point(records)
    if boot is None:
        boot = Bootstrap(prompt_ids(by_point.values()))
    for i, cell in enumerate(cells, start=seed_base):
        if cell.status != "ok" or cell.predicted or not math.isfinite(cell.objective):
            continue
        rows = df[(df["steps"] == cell.steps) & (df["concurrency"] == cell.concurrency) & (df["status"] == "ok")]
        rows = rows[rows[col].notna()] if col in rows else rows.iloc[0:0]
        runs, values = [], []
        for _, r in rows.iterrows():
            recs = by_point.get((cell.steps, cell.concurrency, int(r["repeat"])))
            runs.append(RunRequests.from_records(recs, ttft, tpot) if recs else None)
            values.append(float(r[col]))
        cell.replicates = boot.cell_replicates(runs, values, opts.objective, seed_offset=i)
        cell.runs, cell.bootstrap = CellRuns(runs, values, seed_offset=i), boot
        iv = percentile_interval(cell.replicates, cell.objective, opts.confidence)
        cell.ci_low, cell.ci_high = iv.low, iv.high


def choose(cells: list[Cell], conc: int, opts: RecommendOptions, drift: DriftBand | None = None) -> Choice:
    """Choose num_steps at one concurrency (rules 2-4 of the module docstring). ``drift`` (the sweep's drifted
    checks; None: none) widens the band of each comparison by the drift expected between the two cells' measurement
    times (:meth:`spectune.results.drift.DriftBand.between`): differences smaller than what the machine may have
    moved between them are not called. The choice's ``band`` is the one its winner was compared with the best at."""
    drift = drift or DriftBand()
    col, direction, unit = OBJECTIVES[opts.objective]
    here = sorted((c for c in cells if c.concurrency == conc), key=lambda c: c.steps)
    every = [c for c in here if c.status == "ok" and math.isfinite(c.objective)]
    measured = [c for c in every if not c.predicted]
    tiers = (("quiet", [c for c in measured if c.eligible and not c.noisy]),
             ("noisy", [c for c in measured if c.eligible and c.noisy]),
             ("slo-unmet", measured), ("predicted", [c for c in every if c.eligible]))
    tier, pool = next(((t, p) for t, p in tiers if p), ("none", []))

    def best_of(group: list[Cell]) -> Cell:
        return best_by_pairs(group, lambda c: c.objective,
                             lambda a, b: ratio(a, b, opts.objective, opts.confidence)[0].value, direction == "max")

    if tier == "quiet":  # a noisy cell that beats the best quiet one beyond its own noise is a measured win
        q = best_of(pool)
        pool = sorted(pool + clear_wins(tiers[1][1], q, opts, lambda c: drift.between(c.at_s, q.at_s)),
                      key=lambda c: c.steps)
    notes = [f"K={c.steps} {c.status}" + (f" ({'; '.join(c.notes)})" if c.notes else "")
             for c in here if c.status != "ok"]
    notes += [f"K={c.steps} excluded: {'; '.join(c.violations)}" for c in measured if c.violations]
    if not pool:
        return Choice(conc, None, reason="no usable measurement: " + "; ".join(notes))
    best = best_of(pool)
    own = max(opts.noise_band, best.spread if math.isfinite(best.spread) else 0.0)

    def pair_band(a: Cell, b: Cell) -> float:  # the noise band of comparing a with b
        return max(own, drift.between(a.at_s, b.at_s))

    win = next(c for c in pool if _ties(c, best, pair_band(c, best), direction, opts))
    band = pair_band(win, best)
    parts = [f"K={win.steps}: {col} {win.interval.text('.4g')} {unit}"]
    if win is not best:
        if _within(ratio(win, best, opts.objective, opts.confidence)[0].value, 1.0, band, direction):
            parts.append(f"within the {band:.1%} noise band of the best K={best.steps} ({best.objective:.4g}); "
                         "the smaller num_steps is preferred")
        else:
            parts.append(f"ties with the best K={best.steps} ({best.objective:.4g}) at {opts.confidence:.0%} "
                         f"confidence (the interval of their ratio reaches within the {band:.1%} band of 1); the "
                         "smaller num_steps is preferred")
    comparisons = []
    if win is not best:
        comparisons.append(compare(win, best, opts, band))
    base = next((c for c in measured if c.steps == 0), None) if win.steps != 0 else None
    if base is not None:
        comparisons.append(compare(win, base, opts, pair_band(win, base)))
    runner = [c for c in pool if c is not win and c is not best and c is not base]
    if runner:
        second = runner[0]
        for c in runner[1:]:
            if _better(c.objective, second.objective, direction):
                second = c
        comparisons.append(compare(win, second, opts, pair_band(win, second)))
    parts += [cmp["text"] for cmp in comparisons]
    if win is not best and band > own:
        parts.append(f"the band includes {band:.1%} of drift, the share of the {drift.change:.1%} the sweep's drift "
                     "check measured that the time between the two cells' measurements carries")
    if win.predicted:
        parts.append("predicted, not measured: nothing at this concurrency was measured")
    noisy = [c.steps for c in measured if c.noisy]
    if noisy:
        parts.append(f"noisy (spread > {opts.max_spread:.0%}): K={','.join(map(str, noisy))}"
                     + ("; chosen only because no quiet eligible K exists" if tier == "noisy" else "")
                     + ("; it beats the best quiet K beyond its own spread" if tier == "quiet" and win.noisy else ""))
    if tier == "slo-unmet":
        parts.append("no num_steps meets the SLO here: chosen by the objective alone")
    return Choice(conc, win.steps, best.steps, band, tier, "; ".join(parts + notes), comparisons)


def build_slots(choices: list[Choice], boundary: str = "geometric",
                batch_sizes: dict[int, float] | None = None) -> list[Slot]:
    """Merge consecutive concurrencies with the same num_steps into batch-size slots (rule 5). The first slot
    starts at 1; concurrencies without a choice are skipped (the slot below them extends over them).

    ``batch_sizes`` (concurrency -> measured running batch size, requests) keys the boundaries on measured batch
    size: between keys a and b the boundary is round(sqrt(a*b)) (geometric) or round(b) (measured), and each slot
    starts at least one above the previous one. Without it the keys are the concurrencies (boundary also at most b).
    """
    def half_up(x: float) -> int:
        return math.floor(x + 0.5)

    slots: list[Slot] = []
    prev: int | None = None
    for ch in sorted((c for c in choices if c.steps is not None), key=lambda c: c.concurrency):
        if slots and ch.steps == slots[-1].steps:
            slots[-1].concurrencies.append(ch.concurrency)
        else:
            lower = 1
            if slots and prev is not None:
                if batch_sizes:
                    a, b = batch_sizes[prev], batch_sizes[ch.concurrency]
                    mid = half_up(math.sqrt(a * b)) if boundary == "geometric" else half_up(b)
                    lower = max(mid, slots[-1].lower + 1)
                else:
                    mid = half_up(math.sqrt(prev * ch.concurrency)) if boundary == "geometric" else ch.concurrency
                    lower = min(max(mid, prev + 1), ch.concurrency)
                slots[-1].upper = lower - 1
            slots.append(Slot(lower, None, int(ch.steps), [ch.concurrency]))  # type: ignore[arg-type]
        prev = ch.concurrency
    return slots


def measured_batch_sizes(cells: list[Cell], choices: list[Choice],
                         df: pd.DataFrame) -> tuple[dict[int, float], str]:
    """(concurrency -> measured running batch size of the chosen cell, the gauge it came from) when every chosen
    cell has a finite positive ``batch_size_mean``; else ({}, ``"concurrency"``): slots keyed on concurrency.
    ``df``: the summary rows, with ``batch_size_source`` (:func:`spectune.results.reader.with_text_columns`)."""
    grid = {(c.steps, c.concurrency): c for c in cells}
    sizes: dict[int, float] = {}
    for ch in choices:
        if ch.steps is None:
            continue
        v = grid[(ch.steps, ch.concurrency)].metric("batch_size_mean")
        if not (math.isfinite(v) and v > 0):
            return {}, "concurrency"
        sizes[ch.concurrency] = v
    if not sizes:
        return {}, "concurrency"
    sources = sorted({str(x) for x in df["batch_size_source"] if str(x) not in ("", "none")})
    return sizes, ", ".join(sources) or "running batch size"


def best_static(cells: list[Cell], choices: list[Choice],
                opts: RecommendOptions) -> tuple[int | None, dict[int, float]]:
    """The one num_steps with the best aggregate objective over concurrencies.

    Aggregate = geometric mean over the chosen concurrencies of (objective / best objective there), inverted for
    minimised objectives, so 1.0 means "as good as the per-concurrency best everywhere". Candidates must be
    eligible at every such concurrency (else: measured ok everywhere); ties within the noise band go to the
    smaller num_steps. Returns (num_steps or None, {num_steps: aggregate}).
    """
    _, direction, _ = OBJECTIVES[opts.objective]
    concs = [c.concurrency for c in choices if c.steps is not None]
    if not concs:
        return None, {}
    grid = {(c.steps, c.concurrency): c for c in cells}
    for need in (lambda c: c.eligible, lambda c: c.status == "ok" and math.isfinite(c.objective)):
        best = {k: max(((c.objective if direction == "max" else 1 / c.objective)
                        for c in cells if c.concurrency == k and need(c) and c.objective > 0), default=math.nan)
                for k in concs}
        scores: dict[int, float] = {}
        for k in sorted({c.steps for c in cells}):
            row = [grid.get((k, conc)) for conc in concs]
            if all(c is not None and need(c) and c.objective > 0 for c in row):
                ratios = [(c.objective if direction == "max" else 1 / c.objective) / best[c.concurrency]
                          for c in row]  # type: ignore[union-attr]
                scores[k] = float(np.exp(np.mean(np.log(ratios))))
        scores = {k: v for k, v in scores.items() if math.isfinite(v)}
        if scores:
            top = max(scores.values())
            return min(k for k, v in scores.items() if v >= top * (1 - opts.noise_band)), scores
    return None, {}


def recommend(results: Results, opts: RecommendOptions) -> Recommendation:
    """Run the whole recommendation on loaded results.

    Raises:
        UserError: unknown objective, goodput without SLOs, no concurrency with any usable measurement, or points
            of a distributed sweep from unlike nodes without ``allow_mixed_nodes``; a bad ``mix`` (:mod:`.mix`).
    """
    if opts.objective not in OBJECTIVES:
        raise UserError(f"unknown objective '{opts.objective}': use one of {', '.join(OBJECTIVES)}")
    from spectune.results.nodes import check_mixed_nodes

    warnings: list[str] = check_mixed_nodes(results.sweep, results.points or [], opts.allow_mixed_nodes)
    ttft, tpot, slo_src = effective_slos(results, opts)
    if opts.objective == "goodput" and ttft is None and tpot is None:
        raise UserError("--objective goodput needs --slo-ttft-ms and/or --slo-tpot-ms (the sweep had no SLOs)")
    df = summary_with_slos(results, ttft, tpot, warnings)
    if slo_src != "none":
        warnings.append(f"SLOs from the {slo_src}: TTFT {ttft} ms, TPOT {tpot} ms")
    meta = results.meta
    steps = sorted(set(df["steps"]) | set(meta.plan_ints("steps")))
    concs = sorted(set(df["concurrency"]) | set(meta.plan_ints("concurrency")))
    groups = dict(iter(df.groupby(["steps", "concurrency"])))
    cells = [build_cell(k, c, groups.get((k, c), df.iloc[0:0]), opts, ttft, tpot) for c in concs for k in steps]
    records = load_request_records(results.folder)
    sched = results.schedule
    sched_records = load_request_records(sched.folder) if sched is not None else None
    boot = Bootstrap(prompt_ids((records or [], sched_records or [])))
    attach_intervals(cells, df, records, opts, ttft, tpot, boot)
    sched_cells = schedule_server_cells(sched, sched_records, opts, ttft, tpot, boot, len(cells), warnings)
    drift = DriftBand.from_sweep(drift_info := meta.drift or None)
    for group, points in ((cells, results.points), (sched_cells, sched.points if sched is not None else None)):
        times = cell_times(points or [])  # when each cell was measured (a schedule server's cells are all measured)
        for cell in group:
            cell.at_s = None if cell.predicted else times.get((cell.steps, cell.concurrency))
    if drift.change > 0:
        warnings.append(f"the drift check saw the reference cell move {drift.change:.1%} during the sweep "
                        f"({meta.drift_summary}): a difference between two cells "
                        "smaller than the drift expected over the time between their measurements is not called")
    choices = [choose(cells, c, opts, drift) for c in concs]
    if all(ch.steps is None for ch in choices):
        raise UserError(f"no usable measurement of {OBJECTIVES[opts.objective][0]} at any concurrency: "
                        "every cell failed, is missing or lacks that column")
    _, direction, _ = OBJECTIVES[opts.objective]
    for ch in choices:
        cell = next((c for c in cells if c.steps == ch.steps and c.concurrency == ch.concurrency), None)
        for c in cells:
            if (cell is not None and c.concurrency == ch.concurrency and c.noisy and c.eligible and ch.tier == "quiet"
                    and not _within(cell.objective, c.objective, ch.band, direction)):
                warnings.append(f"concurrency {ch.concurrency}: the noisy K={c.steps} (median {c.objective:.4g}, "
                                f"spread {c.spread:.1%}) beats the chosen K={ch.steps} ({cell.objective:.4g}); "
                                "more repeats of that cell would settle it")
        ach = cell.metric("achieved_concurrency") if cell else math.nan
        measured = cell.metric("batch_size_mean") if cell else math.nan
        if math.isfinite(ach) and ach < 0.8 * ch.concurrency and not math.isfinite(measured):
            warnings.append(f"concurrency {ch.concurrency}: achieved concurrency {ach:.1f} is well below the target, "
                            "so it is a weak batch-size proxy there")
    batch_sizes, batch_source = measured_batch_sizes(cells, choices, df)
    slots = build_slots(choices, opts.boundary, batch_sizes or None)
    sched_choices: list[Choice] = []
    if sched_cells:  # the schedule runs on the schedule server: choose and key its slots on those cells
        pool = sched_cells + [c for c in cells if c.steps == 0 and not any(
            s.steps == 0 and s.concurrency == c.concurrency for s in sched_cells)]
        sched_choices = [choose(pool, c, opts, drift) for c in concs]
        if any(ch.steps is not None for ch in sched_choices):
            sched_df = pd.concat([with_text_columns(sched.summary), df[df["steps"] == 0]])  # type: ignore[union-attr]
            batch_sizes, batch_source = measured_batch_sizes(pool, sched_choices, sched_df)
            slots = build_slots(sched_choices, opts.boundary, batch_sizes or None)
    static, scores = best_static(cells, choices, opts)
    dp = meta.backend_value("data_parallel_size")
    if isinstance(dp, int) and dp > 1:
        warnings.append(f"the sweep ran at data-parallel size {dp}: vLLM ignores num_speculative_tokens_per_batch_size "
                        "there (static num_speculative_tokens), and SGLang's adaptive mode does not run with "
                        "attention DP; validate the configs on the deployment they are meant for")
    findings = [f.to_json() for f in batch_dependent_acceptance(results.points or [])]
    for ch in choices:
        cell = next((c for c in cells if c.steps == ch.steps and c.concurrency == ch.concurrency), None)
        if cell is None or cell.predicted:
            continue
        for c in cells:
            if c.concurrency == ch.concurrency and c.predicted and c.eligible and c.interval.known and \
                    _better(c.ci_high if direction == "max" else c.ci_low, cell.objective * (1 + ch.band)
                            if direction == "max" else cell.objective * (1 - ch.band), direction):
                warnings.append(f"concurrency {ch.concurrency}: the predicted K={c.steps} ({c.interval.text('.4g')}) "
                                f"might beat the chosen K={ch.steps} ({cell.objective:.4g}); measure it "
                                "(a larger --budget, or --plan grid) to settle it")
    rec = Recommendation(opts, cells, choices, slots, static, scores, warnings, findings, batch_sizes, batch_source,
                         drift_info, requests=records, schedule_cells=sched_cells, schedule_choices=sched_choices,
                         schedule_server=RecordedScheduleServer.from_json(sched.meta.backend_value("schedule_server"))
                         if sched is not None else None)
    rec.server_costs = schedule_server_costs(rec)
    apply_mix_primary(rec, opts.mix) if opts.mix else apply_static_primary(rec)
    return rec


def schedule_server_cells(sched: Results | None, records: list[RequestLine] | None, opts: RecommendOptions,
                          ttft: float | None, tpot: float | None, boot: Bootstrap, seed_base: int,
                          warnings: list[str]) -> list[Cell]:
    """The schedule server's cells (``server`` ``schedule``) from ``Results.schedule`` (the ``schedule-server/``
    folder), with intervals from the shared ``boot``; [] without one."""
    if sched is None or sched.summary.empty:
        return []
    df = summary_with_slos(sched, ttft, tpot, warnings)
    groups = dict(iter(df.groupby(["steps", "concurrency"])))
    cells = [build_cell(int(k), int(c), rows, opts, ttft, tpot) for (k, c), rows in sorted(groups.items())]
    for cell in cells:
        cell.server = "schedule"
    attach_intervals(cells, df, records, opts, ttft, tpot, boot, seed_base)
    return cells

