"""``spectune report`` of a validation folder: one self-contained ``report.html`` that opens with the verdict
(PASS, FAIL or INCONCLUSIVE and its line from validate.json), then the per-phase table (each static num_steps and
the config, steady output tokens/s averaged over repeats, the config against that phase's best static num_steps
with its interval and ruling), then each run's overall numbers. A bake-off (several configs) shows its tables instead
of the per-phase table: each config against the best static num_steps, overall and per phase
(:mod:`spectune.validate.bakeoff_table`). validate.json and validate.md are linked, not shown.
"""

from __future__ import annotations

import json
from pathlib import Path
from spectune.core.errors import UserError
from spectune.results.validate_doc import RecordedBakeoff, RecordedVerdict, ValidateDoc
from spectune.results.validate_run import RunWindow
from spectune.tune.report_html import esc, file_links, num, page, table
from spectune.validate.bakeoff_table import (OVERALL_HEADERS, PHASE_HEADERS, overall_cells, phase_cells,
                                             winner_sentence)
from spectune.validate.phase_check import STEADY, PhaseCheck


def load_validation(folder: Path) -> ValidateDoc:
    """The ``validate.json`` of ``folder`` as a record.

    Raises:
        UserError: it is missing, not JSON, or has no runs.
    """
    path = folder / "validate.json"
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{folder}: no validate.json (a validation folder) and no summary.csv (a sweep)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not readable as JSON: {e}") from None
    doc = ValidateDoc.from_json(obj) if isinstance(obj, dict) else None
    if doc is None or not doc.runs:
        raise UserError(f"{path}: no runs recorded")
    return doc


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def phase_rows(doc: ValidateDoc) -> tuple[list[str], list[list[str]]]:
    """The per-phase table: header and rows (phase, one column per run with its steady output tokens/s averaged over
    ok repeats, best static, config / best [low, high], ruling)."""
    runs = [r for r in doc.runs if r.ok]
    names = list(dict.fromkeys(r.run for r in runs))
    checks = {p.phase: p for p in PhaseCheck.from_json(doc.phase_check).phases}
    phases: dict[int, str] = {}
    for r in runs:
        for ph in r.phases:
            phases.setdefault(int(ph.phase), ph.label or "")

    def steady(ph: RunWindow) -> float | None:
        return ph.steady_output_throughput_tok_s if ph.has(STEADY) else ph.output_throughput_tok_s

    rows = []
    for i, label in sorted(phases.items()):
        vals = []
        for name in names:
            xs = [float(v) for r in runs if r.run == name for ph in r.phases if int(ph.phase) == i
                  and isinstance(v := steady(ph), (int, float))]
            vals.append(num(_mean(xs), ".1f"))
        c = checks.get(i)
        ratio = (f"{c.ratio:.3f}x [{c.low:.3f}, {c.high:.3f}]" if c is not None and all(
            isinstance(x, (int, float)) for x in (c.ratio, c.low, c.high)) else "-")
        best = f"K={c.best_static}" if c is not None and c.best_static is not None else "-"
        rows.append([f"{i}: {label}", *vals, best, ratio, c.ruling if c is not None else "-"])
    return ["phase", *names, "best static", "config / best [95%]", "ruling"], rows


def overall_rows(doc: ValidateDoc) -> tuple[list[str], list[list[str]]]:
    """Each run's overall numbers per repeat: output tokens/s, TPOT p50, TTFT p50, SLO attainment, status."""
    rows = []
    for r in doc.runs:
        o = r.overall
        rows.append([r.run, "-" if "repeat" in r.absent else str(r.repeat), num(o.output_throughput_tok_s, ".1f"),
                     num(o.tpot_p50_ms, ".1f"), num(o.ttft_p50_ms, ".0f"), num(o.slo_attainment, ".2f"), r.status])
    return ["run", "repeat", "output tok/s", "TPOT p50 ms", "TTFT p50 ms", "SLO attainment", "status"], rows


_OUTCOME_CLASS = {"PASS": "pass-cell", "FAIL": "fail-cell", "INCONCLUSIVE": "fail-cell", "holds": "pass-cell",
                  "behind": "fail-cell", "noise": "fail-cell"}


def bakeoff_html(b: RecordedBakeoff) -> str:
    """A bake-off's section (validate.json ``bakeoff``): the winner, each config against the best static num_steps
    overall, then per phase against that phase's best static (verdicts and rulings coloured)."""
    overall = overall_cells(b)
    phases = phase_cells(b)
    marks = {(i, 2): _OUTCOME_CLASS[r[2]] for i, r in enumerate(overall) if r[2] in _OUTCOME_CLASS}
    rulings = {(i, len(PHASE_HEADERS) - 1): _OUTCOME_CLASS[r[-1]] for i, r in enumerate(phases)
               if r[-1] in _OUTCOME_CLASS}
    lines = "".join(f"<li><b>{esc(r.name)}</b>: {esc(r.verdict.line if r.verdict else None)}</li>"
                    for r in b.configs)
    return (f"<h2>Bake-off: each config against the best static num_steps</h2><p>{esc(winner_sentence(b))} Output "
            "tokens/s, mean over repeats; the ratio to the best static with its 95% interval; goodput: requests that "
            f"met the SLOs per s.</p>{table(OVERALL_HEADERS, overall, text_cols=(0, 1, 2), cell_class=marks)}"
            "<h2>Each phase: each config against that phase's best static num_steps</h2><p>Steady output tokens/s."
            f"</p>{table(PHASE_HEADERS, phases, text_cols=(0, 1, 8), cell_class=rulings)}<ul>{lines}</ul>")


def write_validation_report(folder: Path, out: Path) -> Path:
    """``report.html`` of the validation in ``folder`` written into ``out``; returns its path.

    Raises:
        UserError: ``folder`` holds no readable validate.json.
    """
    rec = load_validation(folder)
    verdict = rec.verdict or RecordedVerdict()
    outcome = verdict.outcome or ("PASS" if verdict.passed else "no verdict")
    line = verdict.line or ""
    rest = line[len(outcome):].lstrip(": ") if line.startswith(outcome) else line
    css = outcome.lower() if outcome in ("PASS", "FAIL", "INCONCLUSIVE") else ""
    phase_line = PhaseCheck.from_json(rec.phase_check).line
    answer = (f'<section id="answer" class="answer {css}"><p class="lead"><span class="verdict">{esc(outcome)}'
              f"</span>: {esc(rest)}</p>" + (f"<p>{esc(phase_line)}.</p>" if phase_line else "") + "</section>")
    header, rows = phase_rows(rec)
    ruling = {(i, len(header) - 1): ("pass-cell" if r[-1] == "holds" else "fail-cell") for i, r in enumerate(rows)}
    oh, orows = overall_rows(rec)
    wl = rec.plan.workload
    meta = " · ".join(x for x in (
        f"config <code>{esc(rec.config.path)}</code>" if rec.config.path else "",
        "configs " + ", ".join(f"<code>{esc(c.name)}</code>" for c in rec.configs) if rec.configs else "",
        f"workload {esc(wl.name)}" if wl.name is not None or wl.phases else "",
        f"measured {esc(str(rec.created)[:16].replace('T', ' '))} UTC" if rec.created else "")
        if x)
    body = (bakeoff_html(rec.bakeoff) if rec.bakeoff else
            f"<h2>Each phase: the config against that phase's best static num_steps</h2>"
            f"<p>Steady output tokens/s, mean over repeats.</p>"
            f"{table(header, rows, text_cols=(0,), cell_class=ruling)}") + (
            f"<h2>Each run</h2>{table(oh, orows, text_cols=(0,))}"
            + file_links(folder, out, ("validate.md", "validate.json", "requests.jsonl", "requests.jsonl.gz")))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.html"
    path.write_text(page("spectune validation report", meta, answer, body), encoding="utf-8")
    return path
