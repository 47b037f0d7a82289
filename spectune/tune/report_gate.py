"""``spectune report CURRENT --baseline BASELINE``: the gate's verdict as a self-contained ``report.html`` that
opens with pass or fail per metric (TPOT p50, output tokens/s, acceptance length, failed repeats), then one row per
failed check and the rest collapsed (the same checks as ``spectune gate``, :mod:`spectune.tune.gate`)."""

from __future__ import annotations

from pathlib import Path

from spectune.results.reader import Results
from spectune.tune.gate import Check, GateLimits, gate_checks, metric_label
from spectune.tune.report_html import esc, file_links, num, page, table

HEADER = ["cell", "metric", "baseline", "current", "change", "repeats: baseline", "repeats: current", "limit",
          "verdict"]


def _rows(checks: list[Check]) -> list[list[str]]:
    def rng(r: tuple[float, float]) -> str:
        return num(r[0]) if r[0] == r[1] else f"[{num(r[0])}, {num(r[1])}]"

    return [[c.cell, metric_label(c.name), num(c.baseline), num(c.current),
             f"{(c.current - c.baseline) / c.baseline:+.1%}" if c.name not in ("status", "slo_attainment")
             and c.baseline else "-", rng(c.baseline_range), rng(c.current_range), c.limit, c.outcome.upper()]
            for c in checks]


def write_gate_report(baseline: Results, current: Results, limits: GateLimits, out: Path) -> Path:
    """``report.html`` of ``spectune gate``'s checks of ``current`` against ``baseline`` under ``limits``, in
    ``out``; returns its path.

    Raises:
        UserError: as :func:`spectune.tune.gate.gate_checks` (no common cell, a checked column without values).
    """
    checks, notes = gate_checks(baseline, current, limits)
    fails = [c for c in checks if c.outcome == "fail"]
    per_metric = []
    for name in dict.fromkeys(c.name for c in checks):
        cs = [c for c in checks if c.name == name]
        bad = [c for c in cs if c.outcome == "fail"]
        verdict = "FAIL" if bad else "pass"
        cells = f" ({', '.join(c.cell for c in bad)})" if bad else ""
        per_metric.append(f'<li><span class="{"fail-cell" if bad else "pass-cell"}">{verdict}</span> '
                          f"<b>{esc(metric_label(name))}</b>: {len(bad)} of {len(cs)} cells failed"
                          f"{esc(cells)}; limit {esc(cs[0].limit)}</li>")
    outcome = "FAIL" if fails else "PASS"
    answer = (f'<section id="answer" class="answer {outcome.lower()}"><p class="lead"><span class="verdict">'
              f"{outcome}</span>: {len(fails)} of {len(checks)} checks failed</p><ul>{''.join(per_metric)}</ul>"
              "</section>")
    body = ""
    if fails:
        body += f"<h2>Failed checks</h2>{table(HEADER, _rows(fails), text_cols=(0, 1))}"
    rest = [c for c in checks if c.outcome != "fail"]
    if rest:
        body += (f"<details><summary>{len(rest)} passed or skipped checks</summary>"
                 f"{table(HEADER, _rows(rest), text_cols=(0, 1))}</details>")
    if notes:
        body += "<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>"
    body += file_links(current.folder, out, ("summary.csv", "sweep.json"))
    meta = f"baseline <code>{esc(baseline.source)}</code> · current <code>{esc(current.source)}</code>"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.html"
    path.write_text(page("spectune gate report", meta, answer, body), encoding="utf-8")
    return path
