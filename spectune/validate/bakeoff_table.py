"""The bake-off's tables (validate.json ``bakeoff``, :mod:`spectune.validate.bakeoff`) as text: validate.md's
section (:func:`markdown`), its opening words (:func:`subject`) and the cells the terminal and the report page
show (:func:`overall_cells`, :func:`phase_cells`), from validate.json's records
(:class:`spectune.results.validate_doc.RecordedBakeoff`), so validate.md's renderer can use it."""

from __future__ import annotations

from typing import Sequence

from spectune.results.validate_doc import BakeoffCell, BakeoffRow, RecordedBakeoff, ValidateDoc

OVERALL_HEADERS = ("config", "run", "verdict", "output tok/s", "/ best static [95%]", "TPOT p50 ms", "TPOT p99 ms",
                   "SLO attainment", "goodput req/s")
"""Columns of the overall bake-off table (:func:`overall_cells`)."""

PHASE_HEADERS = ("phase", "config", "steady tok/s", "/ phase's best static [95%]", "TPOT p50 ms", "TPOT p99 ms",
                 "SLO attainment", "goodput req/s", "ruling")
"""Columns of the per-phase bake-off table (:func:`phase_cells`)."""


def _f(v: object, spec: str) -> str:
    return "-" if not isinstance(v, (int, float)) or isinstance(v, bool) else format(v, spec)


def _pct(v: object) -> str:
    return "-" if not isinstance(v, (int, float)) else f"{v:.1%}"


def ratio_text(d: BakeoffCell, lead: bool = False) -> str:
    """A cell's ratio to the best static with its interval: ``1.031x [0.990, 1.072]`` (``x1.031 [...]`` with
    ``lead``, as the terminal shows it), without the brackets when it has no interval, ``-`` without a ratio."""
    r = d.ratio
    if not isinstance(r, (int, float)):
        return "-"
    iv = f" [{d.low:.3f}, {d.high:.3f}]" if isinstance(d.low, (int, float)) else ""
    return (f"x{r:.3f}" if lead else f"{r:.3f}x") + iv


def _label(row: BakeoffRow) -> str:
    return str(row.name) if row.name is not None else f"best static K={row.steps}"


def overall_cells(bakeoff: RecordedBakeoff) -> list[list[str]]:
    """One row per config, the best static first (:data:`OVERALL_HEADERS`): output tok/s, its ratio to the best
    static with the interval, TPOT p50/p99 (ms), SLO attainment, goodput (req/s); means over repeats."""
    rows = []
    for row in ([bakeoff.best_static] if bakeoff.best_static else []) + bakeoff.configs:
        o = row.overall or BakeoffCell()
        outcome = row.verdict.outcome if row.verdict is not None else ""
        rows.append([_label(row), str(row.run), outcome or "-", _f(o.output_throughput_tok_s, ",.1f"),
                     "1" if row.name is None else ratio_text(o), _f(o.tpot_p50_ms, ".2f"), _f(o.tpot_p99_ms, ".2f"),
                     _pct(o.slo_attainment), _f(o.goodput_req_s, ".2f")])
    return rows


def phase_cells(bakeoff: RecordedBakeoff, labels: Sequence[str] = ()) -> list[list[str]]:
    """Per phase, that phase's best static num_steps (``phase_best_static``) then each config
    (:data:`PHASE_HEADERS`): steady output tok/s, its ratio to that phase's best static with the interval, TPOT
    p50/p99 (ms), SLO attainment, goodput (req/s) and the ruling (``holds``, ``noise``, ``behind``)."""
    tops, configs = bakeoff.phase_best_static, bakeoff.configs
    n = max([len(tops), *(len(r.phases) for r in configs)], default=0)
    out = []
    for i in range(n):
        top = tops[i] if i < len(tops) else None
        rows = ([("best static K=" + str(top.steps), top, "-")] if top else []) + [
            (str(r.name), r.phases[i], None) for r in configs if len(r.phases) > i]
        for name, ph, fixed in rows:
            label = ph.label or (labels[i] if i < len(labels) else "")
            ratio = fixed or ratio_text(ph)
            if fixed is None and ph.best_static is not None and ratio != "-":
                ratio += f" K={ph.best_static}"
            out.append([f"{i + 1}: {label}", name, _f(ph.steady_output_throughput_tok_s, ",.1f"), ratio,
                        _f(ph.tpot_p50_ms, ".2f"), _f(ph.tpot_p99_ms, ".2f"), _pct(ph.slo_attainment),
                        _f(ph.goodput_req_s, ".2f"), str(ph.ruling or "-")])
    return out


def winner_sentence(bakeoff: RecordedBakeoff) -> str:
    """``Winner: NAME.`` or, with no passing config, ``Winner: the best static num_steps K=k (no config passes).``"""
    if bakeoff.winner is not None:
        return f"Winner: {bakeoff.winner}."
    if bakeoff.best_static is None:
        return "Winner: none (no static num_steps run succeeded)."
    return f"Winner: the best static num_steps K={bakeoff.best_static.steps} (no config passes)."


def subject(doc: ValidateDoc) -> str | None:
    """validate.md's opening words for a bake-off (``Bake-off of 2 configs: `a` (`a.json`, vllm-schedule,
    candidate steps 0, 3) and `b` (...)``), None for one config."""
    if not doc.configs:
        return None
    parts = [f"`{c.name}` (`{c.path}`, {c.format}, candidate steps {', '.join(map(str, c.candidate_steps or []))})"
             for c in doc.configs]
    return f"Bake-off of {len(parts)} configs: " + ", ".join(parts[:-1]) + f" and {parts[-1]}"


def _table(headers: Sequence[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
            + ["| " + " | ".join(r) + " |" for r in rows] + [""])


def markdown(doc: ValidateDoc) -> list[str]:
    """validate.md's bake-off section (nothing without ``bakeoff``): the winner, the overall table, the per-phase
    table and every config's verdict line."""
    b = doc.bakeoff
    if b is None:
        return []
    labels = [p.label or "" for p in doc.plan.workload.phases]
    lines = ["## Bake-off: each config against the best static num_steps", "",
             f"{winner_sentence(b)} The same static runs serve every config; each config is ruled as a validation of "
             "it alone would rule it, against the best static num_steps (highest overall output tok/s). `/ best "
             "static`: output tok/s over the best static's with its 95% interval (server-to-server spread of the "
             "whole bake-off included); goodput: requests that met the SLOs per s.", ""]
    lines += _table(OVERALL_HEADERS, overall_cells(b))
    lines += ["Per phase: steady output tok/s (after the earlier phases' spill-over) against that phase's best static "
              "num_steps (`K=`), TPOT and SLO attainment over the requests sent in the phase; the ruling as in the "
              "one-config phase check (`holds` within 3%, `noise`, `behind`).", ""]
    lines += _table(PHASE_HEADERS, phase_cells(b, labels))
    lines += ["Verdicts:", ""] + [f"- **{r.name}**: {r.verdict.line if r.verdict is not None else None}"
                                  for r in b.configs] + [""]
    return lines
