"""Static num_steps, the schedule and the policy configs ranked by goodput under a TPOT SLO (``spectune recommend
--slo-tpot-ms``, docs/recommend.md "Goodput under a TPOT SLO").

Goodput here is the output tokens/s of the requests that meet the SLOs: per run (one repeat of a cell) the run's
``output_throughput_tok_s`` times the share of its output tokens (``completion_tokens`` in requests.jsonl) that
belong to requests meeting them, the rule :func:`spectune.results.reader.summary_with_slos` applies (succeeded,
TTFT <= the TTFT SLO when one is given, TPOT <= the TPOT SLO; a one-token request has no TPOT and meets that part).
A cell's goodput is the median over its ok, measured repeats. Where ``goodput_req_s`` counts requests, this counts
their tokens: a request that meets the SLO streams its tokens, one that misses it streams none that count.

Intervals: every run's goodput gets paired bootstrap replicates on the static cells' prompt draws
(:class:`spectune.results.confidence.Bootstrap`, shared by every cell, so ratios pair by prompt): the run's
throughput replicates (the ratio estimator recommend uses) times the replicate share of tokens meeting the SLOs,
sum of weighted tokens of meeting requests over that of all requests; a cell's replicates are the median over its
repeats' replicates. Without request records the comparison is on point ratios.

The answers, simplest first: each static num_steps (ascending; K=0 is no drafter), the per-batch-size schedule
(the slots recommend built, priced where they run: :meth:`spectune.tune.recommend.Recommendation.slot_cell`), then
each policy config the sweep measured (its ``p-min/P/`` servers). Each is priced over the concurrencies recommend
chose at (``--mix``: its concurrencies and time shares; else every one weighs the same), the share-weighted sum of
its cells' goodput; an answer missing a cell there is listed, not ranked. The answer named is the simplest one the
best does not beat beyond the noise band (the band of :func:`spectune.tune.mix.mix_band`: the larger of
``noise_band`` and the bands of the choices at those concurrencies, each widened by the best cell's spread and the
sweep's drift share): its goodput ratio to the best is within the band of 1, or the paired interval of that ratio
reaches within it (recommend's tie rule, :func:`spectune.tune.compare._ties`). So a policy is named only where it
beats every static num_steps and the schedule beyond that band, with the interval clearing it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spectune.results.confidence import Bootstrap, Interval, RunRequests, ratio_interval, requests_by_point
from spectune.results.reader import Results, load_request_records
from spectune.tune.mix import mix_band
from spectune.tune.recommend import Cell, Recommendation, effective_slos


@dataclass
class GoodputAnswer:
    """One answer priced by goodput.

    Attributes:
        name: ``static K=1``, ``schedule`` or ``p_min 0.9 (num_steps 4)``.
        kind: ``static``, ``schedule`` or ``policy``.
        steps: the static num_steps (the policy's cap), None for the schedule.
        per_concurrency: concurrency -> the cell's goodput (tokens/s; NaN where not measured or unknown).
        attainment: concurrency -> the cell's share of requests meeting the SLOs (median over repeats).
        goodput_tok_s: the share-weighted sum over the concurrencies (NaN when a cell is missing).
        ratio: goodput_tok_s / the best answer's (NaN when not ranked), ``low``/``high`` its paired interval (NaN
            without replicates).
        replicates: (B,) bootstrap replicates of goodput_tok_s, or None.
    """

    name: str
    kind: str
    steps: int | None
    per_concurrency: dict[int, float]
    attainment: dict[int, float]
    goodput_tok_s: float = math.nan
    ratio: float = math.nan
    low: float = math.nan
    high: float = math.nan
    replicates: Any = field(default=None, repr=False)

    @property
    def ranked(self) -> bool:
        """Priced at every concurrency."""
        return math.isfinite(self.goodput_tok_s)

    def to_json(self) -> dict[str, Any]:
        """The answer for recommendation.json (NaN -> None)."""
        def fin(v: float) -> float | None:
            return v if math.isfinite(v) else None

        return {"answer": self.name, "kind": self.kind, "num_steps": self.steps,
                "goodput_tok_s": fin(self.goodput_tok_s), "ratio": fin(self.ratio), "low": fin(self.low),
                "high": fin(self.high),
                "per_concurrency": {str(c): fin(v) for c, v in self.per_concurrency.items()},
                "slo_attainment": {str(c): fin(v) for c, v in self.attainment.items()}}


@dataclass
class SloGoodput:
    """The ranking (recommendation.json ``slo_goodput``).

    Attributes:
        slo_tpot_ms, slo_ttft_ms: the SLOs (ms; TTFT None when not given).
        shares: concurrency -> time share the answers are priced at.
        band: the noise band of the comparison (fraction).
        answers: every answer, simplest first.
        pick: the answer named (None when none is ranked).
        policy_wins: the pick is a policy config.
        reason: one sentence.
        notes: what could not be priced, and why.
        confidence: the confidence of the ratios' intervals.
        replay: the policies priced by replaying a trace (:class:`spectune.tune.slo_replay.ReplayGoodput`,
            ``--trace``), or None.
    """

    slo_tpot_ms: float
    slo_ttft_ms: float | None
    shares: dict[int, float]
    band: float
    answers: list[GoodputAnswer]
    pick: GoodputAnswer | None
    policy_wins: bool
    reason: str
    notes: list[str] = field(default_factory=list)
    confidence: float = 0.95
    replay: Any = None

    def to_json(self) -> dict[str, Any]:
        """The ranking for recommendation.json."""
        return {"slo_tpot_ms": self.slo_tpot_ms, "slo_ttft_ms": self.slo_ttft_ms,
                "shares": {str(c): s for c, s in self.shares.items()}, "band": self.band,
                "confidence": self.confidence, "answers": [a.to_json() for a in self.answers],
                "pick": self.pick.name if self.pick else None,
                "policy_wins": self.policy_wins, "reason": self.reason, "notes": self.notes,
                **({"replay": self.replay.to_json()} if self.replay is not None else {})}


Grid = dict[tuple[int, int], tuple[float, float, Any]]
"""(steps, concurrency) -> (goodput tokens/s, SLO attainment, (B,) replicates or None) of one sweep folder."""


def _run_goodput(records: list[dict[str, Any]], tok_s: float, ttft: float | None, tpot: float | None,
                 boot: Bootstrap | None) -> tuple[float, float, Any] | None:
    """(goodput tokens/s, share of requests meeting the SLOs, replicates or None) of one run whose requests are
    ``records`` and whose throughput is ``tok_s``; None when the run streamed no tokens."""
    run = RunRequests.from_records(records, ttft, tpot)
    meeting = run.tokens * run.meets
    total = float(run.tokens.sum())
    if total <= 0:
        return None
    share = float(meeting.sum()) / total
    reps = None
    if boot is not None:
        thr = boot.run_replicates(run, "throughput", tok_s)
        all_tok = boot.run_replicates(run, "tokens", total)  # (B,): sum of weighted tokens
        met = RunRequests(run.prompt, meeting, run.latency_ms, run.tpot_ms, run.meets)
        met_tok = boot.run_replicates(met, "tokens", float(meeting.sum())) if meeting.sum() > 0 else None
        if thr is not None and all_tok is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                reps = thr * (met_tok / all_tok if met_tok is not None else 0.0)
    return tok_s * share, float(run.meets.mean()) if len(run) else math.nan, reps


def folder_goodput(res: Results, ttft: float | None, tpot: float | None, boot: Bootstrap | None = None) -> Grid:
    """Each cell's goodput, SLO attainment and replicates (medians over its ok, measured repeats, module
    docstring) in one sweep folder; {} without requests.jsonl."""
    records = load_request_records(res.folder)
    if not records:
        return {}
    by_run = requests_by_point(records)
    df = res.summary
    df = df[df["status"] == "ok"]
    if "predicted" in df:
        df = df[~df["predicted"].fillna(False).astype(bool)]
    runs: dict[tuple[int, int], list[tuple[float, float, Any]]] = {}
    for row in df.itertuples(index=False):
        key = (int(row.steps), int(row.concurrency), int(getattr(row, "repeat", 0) or 0))
        tok_s = float(getattr(row, "output_throughput_tok_s", math.nan))
        got = _run_goodput(by_run[key], tok_s, ttft, tpot, boot) if key in by_run and math.isfinite(tok_s) else None
        if got is not None:
            runs.setdefault(key[:2], []).append(got)
    out: Grid = {}
    for k, v in runs.items():
        reps = [r for _, _, r in v]
        out[k] = (float(np.median([g for g, _, _ in v])), float(np.median([a for _, a, _ in v])),
                  np.median(np.stack(reps), axis=0) if all(r is not None for r in reps) else None)
    return out


def _answer(name: str, kind: str, steps: int | None, cells: dict[int, Cell | None], grids: dict[str, Grid],
            shares: dict[int, float]) -> GoodputAnswer:
    per, att, reps = {}, {}, []
    for conc, cell in cells.items():
        ok = cell is not None and cell.status == "ok" and not cell.predicted
        g, a, r = grids.get(cell.server, {}).get((cell.steps, conc), (math.nan, math.nan, None)) if ok \
            else (math.nan, math.nan, None)  # type: ignore[union-attr]
        per[conc], att[conc] = g, a
        reps.append(r)
    priced = all(math.isfinite(per[c]) for c in shares)
    total = sum(shares[c] * per[c] for c in shares) if priced else math.nan
    summed = sum(shares[c] * r for c, r in zip(cells, reps)) if priced and all(r is not None for r in reps) else None
    return GoodputAnswer(name, kind, steps, per, att, float(total), replicates=summed)


def _ties_best(a: GoodputAnswer, band: float) -> bool:
    """The best answer does not beat ``a`` beyond ``band``: the point ratio, or its interval, reaches 1 - band."""
    return a.ratio >= 1 - band or (math.isfinite(a.high) and a.high >= 1 - band)


def slo_goodput(rec: Recommendation, results: Results) -> SloGoodput | None:
    """Rank every answer by goodput under ``rec.options.slo_tpot_ms`` (module docstring); None without that SLO.
    Reads the request records of the sweep folder, its ``schedule-server/`` and its ``p-min/P/`` folders."""
    opts = rec.options
    if opts.slo_tpot_ms is None:
        return None
    ttft, tpot, _ = effective_slos(results, opts)
    concs = list(opts.mix) if opts.mix else [ch.concurrency for ch in rec.choices if ch.steps is not None]
    shares = dict(opts.mix) if opts.mix else {c: 1.0 / len(concs) for c in concs}
    boot = next((c.bootstrap for c in rec.cells if c.bootstrap is not None), None)
    grids = {"static": folder_goodput(results, ttft, tpot, boot)}
    notes = []
    if not grids["static"]:
        notes.append("no requests.jsonl in the sweep folder: goodput is unknown")
    if results.schedule is not None:
        grids["schedule"] = folder_goodput(results.schedule, ttft, tpot, boot)
    for p, res in (results.p_min or {}).items():
        grids[f"p_min:{p:g}"] = folder_goodput(res, ttft, tpot, boot)
    answers = [_answer(f"static K={k}", "static", k, {c: rec.cell(k, c) for c in concs}, grids, shares)
               for k in rec.steps]
    slots = rec.schedule_slots or rec.slots
    slot_of = {c: s.steps for s in slots for c in s.concurrencies}
    if all(c in slot_of for c in concs):
        cells = {c: rec.slot_cell(slot_of[c], c) for c in concs}
        if not any(all(cells[c] is rec.cell(k, c) for c in concs) for k in rec.steps):  # else one static K
            answers.append(_answer("schedule", "schedule", None, cells, grids, shares))
    by_server: dict[str, list[Cell]] = {}
    for cell in rec.p_min_cells:
        by_server.setdefault(cell.server, []).append(cell)
    for server, cells in sorted(by_server.items()):
        k = cells[0].steps
        at = {c: next((x for x in cells if x.concurrency == c), None) for c in concs}
        answers.append(_answer(f"{server.replace(':', ' ')} (num_steps {k})", "policy", k, at, grids, shares))
    for a in answers:
        if not a.ranked:
            notes.append(f"{a.name}: not priced (no goodput at concurrency "
                         f"{', '.join(str(c) for c, v in a.per_concurrency.items() if not math.isfinite(v))})")
    band = mix_band(rec, shares)
    ranked = [a for a in answers if a.ranked]
    if not ranked or max(a.goodput_tok_s for a in ranked) <= 0:
        return SloGoodput(tpot, ttft, shares, band, answers, None, False,  # type: ignore[arg-type]
                          "no answer has a goodput above 0 under the SLO at every concurrency", notes,
                          opts.confidence)
    top = max(ranked, key=lambda a: a.goodput_tok_s)
    for a in ranked:
        iv = Interval(1.0, 1.0, 1.0) if a is top else ratio_interval(
            a.replicates, top.replicates, a.goodput_tok_s / top.goodput_tok_s, opts.confidence)
        a.ratio, a.low, a.high = iv.value, iv.low, iv.high
    pick = next(a for a in ranked if _ties_best(a, band))
    rest = [a for a in ranked if a.kind != "policy"]
    best_rest = max(rest, key=lambda a: a.goodput_tok_s) if rest else None
    where = "the load " + ", ".join(f"{c}: {s:.0%}" for c, s in shares.items()) if opts.mix else \
        f"concurrency {', '.join(map(str, concs))} (equal weight)"
    slo = f"TPOT {tpot:g} ms" + (f", TTFT {ttft:g} ms" if ttft is not None else "")
    if pick.kind == "policy":
        vs = (f"{pick.goodput_tok_s / best_rest.goodput_tok_s:.3f}x the best static or schedule answer "
              f"({best_rest.name}, {best_rest.goodput_tok_s:.4g} tok/s)") if best_rest else "no static answer priced"
        reason = (f"under the SLO ({slo}) on {where}, the policy {pick.name} streams the most goodput "
                  f"({pick.goodput_tok_s:.4g} tok/s), {vs}, beyond the {band:.1%} noise band")
    elif pick is top:
        reason = (f"under the SLO ({slo}) on {where}, {pick.name} streams the most goodput "
                  f"({pick.goodput_tok_s:.4g} tok/s)")
    else:
        vs = f"{pick.ratio:.3f}x" + (f" [{pick.low:.3f}, {pick.high:.3f}]" if math.isfinite(pick.low) else "")
        reason = (f"under the SLO ({slo}) on {where}, {pick.name} ({pick.goodput_tok_s:.4g} tok/s) is the simplest "
                  f"answer the best ({top.name}, {top.goodput_tok_s:.4g} tok/s) does not beat beyond the "
                  f"{band:.1%} noise band: {vs} of it")
    if pick.kind != "policy" and any(a.kind == "policy" for a in ranked):
        reason += "; no policy config wins beyond it"
    return SloGoodput(tpot, ttft, shares, band, answers, pick, pick.kind == "policy", reason, notes,  # type: ignore
                      opts.confidence)


def _vs(a: GoodputAnswer) -> str:
    """``0.971x [0.804, 1.099]`` (the interval where known), ``-`` when not ranked."""
    if not a.ranked:
        return "-"
    return f"{a.ratio:.3f}x" + (f" [{a.low:.3f}, {a.high:.3f}]" if math.isfinite(a.low) and a.ratio != 1.0 else "")


def goodput_markdown(g: SloGoodput) -> list[str]:
    """recommendation.md's section for the ranking."""
    concs = list(g.shares)
    lines = ["", "## Goodput under the TPOT SLO", "",
             "Output tokens/s of the requests that meet the SLOs (the run's tok/s times its tokens' share from "
             "requests meeting them; median over repeats), per concurrency and "
             + ("weighted by the load's time shares" if len(set(g.shares.values())) > 1 else "averaged over them")
             + f"; SLO attainment (share of requests) in brackets; vs best: the ratio to the best answer with its "
             f"paired {g.confidence:.0%} interval. Noise band {g.band:.1%}.", "",
             "| answer | " + " | ".join(f"c={c}" for c in concs) + " | goodput tok/s | vs best |",
             "|---|" + "---:|" * (len(concs) + 2)]
    for a in g.answers:
        cells = [f"{a.per_concurrency[c]:.4g} ({a.attainment[c]:.0%})" if math.isfinite(a.per_concurrency[c])
                 else "-" for c in concs]
        name = f"**{a.name}**" if a is g.pick else a.name
        total, ratio = (f"{a.goodput_tok_s:.4g}", _vs(a)) if a.ranked else ("-", "-")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {total} | {ratio} |")
    lines += ["", g.reason[0].upper() + g.reason[1:] + "."]
    lines += [""] + [f"- {n}" for n in g.notes] if g.notes else []
    if g.replay is not None:
        lines += ["", f"Replayed from the trace `{g.replay.trace}` with the sweep's round times (predicted, decode "
                      "rounds only; SLO attainment per row and round: docs/simulate.md):", "",
                  "| policy | predicted goodput tok/s | SLO attainment | predicted tok/s |", "|---|---:|---:|---:|"]
        lines += [f"| {p} | {g_:.4g} | {a:.0%} | {t:.4g} |" for p, g_, a, t in g.replay.rows]
        lines += ["", g.replay.reason[0].upper() + g.replay.reason[1:] + "."]
    return lines


def print_goodput(console, g: SloGoodput) -> None:  # console: rich.console.Console
    """Print the ranking table and the verdict."""
    from rich.table import Table

    concs = list(g.shares)
    slo = f"TPOT {g.slo_tpot_ms:g} ms" + (f", TTFT {g.slo_ttft_ms:g} ms" if g.slo_ttft_ms is not None else "")
    table = Table(title=f"goodput under the SLO ({slo}): output tok/s of requests within it (* named; vs best: "
                        f"ratio [{g.confidence:.0%} interval])")
    for h in ("answer", *(f"c={c}" for c in concs), "goodput tok/s", "vs best"):
        table.add_column(h, justify="left" if h == "answer" else "right")
    for a in g.answers:
        cells = [f"{a.per_concurrency[c]:.4g}" if math.isfinite(a.per_concurrency[c]) else "-" for c in concs]
        table.add_row(("* " if a is g.pick else "") + a.name, *cells,
                      f"{a.goodput_tok_s:.4g}" if a.ranked else "-", _vs(a))
    console.print(table)
    console.print(g.reason, soft_wrap=True, markup=False)
    for n in g.notes:
        console.print(n, soft_wrap=True, markup=False)
    if g.replay is not None:
        rt = Table(title=f"replayed from {g.replay.trace} (predicted with the sweep's round times)")
        for h in ("policy", "goodput tok/s", "SLO att", "tok/s"):
            rt.add_column(h, justify="left" if h == "policy" else "right")
        for p, g_, a, t in g.replay.rows:
            rt.add_row(p, f"{g_:.4g}", f"{a:.0%}", f"{t:.4g}")
        console.print(rt)
        console.print(g.replay.reason, soft_wrap=True, markup=False)
