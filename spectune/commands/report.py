"""`spectune report`: PNG plots and a self-contained HTML page of a sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def report(
    results_dir: Annotated[Path, typer.Argument(help="Sweep results folder (or its summary.csv).")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Output folder (default: "
                                                   "RESULTS_DIR/report).")] = None,
) -> None:
    """Plot TPOT, throughput and SLO attainment vs concurrency per num_steps, acceptance length vs num_steps (per
    prompt category when points.jsonl has them), and write report.html with everything embedded."""
    from spectune.tune.report import write_report
    from spectune.results.reader import load_results

    results = load_results(results_dir)
    out = output or (results_dir if results_dir.is_dir() else results_dir.parent) / "report"
    path = write_report(results, out)
    typer.echo(f"wrote {path} and {len(list(out.glob('*.png')))} plots to {out}")
