"""`spectune gate`: CI performance gate between a baseline and a current sweep (exit 0 pass, 1 regression, 2 bad
input)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def gate(
    baseline: Annotated[Path, typer.Option(help="Baseline results folder or summary.csv.")],
    current: Annotated[Path, typer.Option(help="Current results folder or summary.csv.")],
    max_tpot_regression: Annotated[float, typer.Option(min=0.0, help="PCT: allowed rise of TPOT p50.")] = 5.0,
    max_throughput_drop: Annotated[float, typer.Option(min=0.0, help="PCT: allowed drop of output tokens/s.")] = 5.0,
    max_acceptance_drop: Annotated[Optional[float], typer.Option(min=0.0, help="Allowed drop of acceptance length, "
                                                                 "tokens/verify (default: 0.1 when both sweeps "
                                                                 "measured it).")] = None,
    min_slo_attainment: Annotated[Optional[float], typer.Option(min=0.0, max=1.0, help="Fail cells whose current "
                                                                "SLO attainment is below this share.")] = None,
    junit: Annotated[Optional[Path], typer.Option(help="Write JUnit XML here.")] = None,
    markdown: Annotated[Optional[Path], typer.Option(help="Write a GitHub-flavoured markdown summary here.")] = None,
    summary_md: Annotated[Optional[Path], typer.Option(help="Append the verdict as Markdown to this file: each "
                                                       "metric's baseline, current, interval and verdict (pass "
                                                       "\"$GITHUB_STEP_SUMMARY\" in a GitHub Actions step).")] = None,
) -> None:
    """Compare matching (num_steps, concurrency) cells of two sweeps; a regression must exceed its limit and the
    repeats' spread. Exit code 0: pass, 1: regression, 2: bad input."""
    from rich.console import Console
    from rich.table import Table

    from spectune.tune import gate as g
    from spectune.results.reader import load_results

    limits = g.GateLimits(max_tpot_regression / 100, max_throughput_drop / 100, max_acceptance_drop,
                          min_slo_attainment)
    checks, notes = g.gate_checks(load_results(baseline), load_results(current), limits)
    if junit:
        junit.parent.mkdir(parents=True, exist_ok=True)
        junit.write_text(g.junit_xml(checks), encoding="utf-8")
    if markdown:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(g.markdown(checks, notes), encoding="utf-8")
    if summary_md:
        summary_md.parent.mkdir(parents=True, exist_ok=True)
        with summary_md.open("a", encoding="utf-8") as f:
            f.write(g.summary_markdown(checks, notes))
    console = Console()
    fails = [c for c in checks if c.outcome == "fail"]
    for n in notes:
        console.print(f"note: {n}")
    if not fails:
        console.print(f"[green]gate passed[/]: {sum(c.outcome == 'pass' for c in checks)} checks passed, "
                      f"{sum(c.outcome == 'skip' for c in checks)} skipped")
        return
    table = Table(title=f"{len(fails)} regression(s)")
    for col in ("cell", "check", "baseline", "current", "limit", "detail"):
        table.add_column(col)
    for c in fails:
        table.add_row(c.cell, c.name, f"{c.baseline:.4g}", f"{c.current:.4g}", c.limit, c.message)
    console.print(table)
    raise typer.Exit(1)
