"""`spectune report`: PNG plots and a self-contained HTML page of a sweep, a validation, or a gate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def report(
    results_dir: Annotated[Path, typer.Argument(help="Sweep results folder (or its summary.csv), or a validation "
                                                "folder (validate.json).")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Output folder (default: "
                                                   "RESULTS_DIR/report).")] = None,
    baseline: Annotated[Optional[Path], typer.Option(help="Baseline sweep folder or summary.csv: write the gate's "
                                                     "page instead (RESULTS_DIR is the current sweep; pass or fail "
                                                     "per metric first).")] = None,
    max_tpot_regression: Annotated[float, typer.Option(min=0.0, help="PCT: with --baseline, allowed rise of TPOT "
                                                       "p50 (as spectune gate).")] = 5.0,
    max_throughput_drop: Annotated[float, typer.Option(min=0.0, help="PCT: with --baseline, allowed drop of "
                                                       "output tokens/s (as spectune gate).")] = 5.0,
) -> None:
    """Write report.html, one self-contained page that opens with the answer: for a sweep, the primary
    recommendation per engine with its interval, the speedup heatmap, TPOT, throughput, acceptance length and
    Pareto plots, then the tables (and the PNGs beside it); for a validation folder, the verdict and the per-phase
    table; with --baseline, the gate's pass or fail per metric."""
    results_dir = Path(results_dir)
    out = output or (results_dir if results_dir.is_dir() else results_dir.parent) / "report"
    if baseline is None and results_dir.is_dir() and (results_dir / "validate.json").is_file() \
            and not (results_dir / "summary.csv").is_file():
        from spectune.validate.report_page import write_validation_report

        typer.echo(f"wrote {write_validation_report(results_dir, out)}")
        return
    from spectune.results.reader import load_results

    results = load_results(results_dir)
    if baseline is not None:
        from spectune.tune.gate import GateLimits
        from spectune.tune.report_gate import write_gate_report

        limits = GateLimits(max_tpot_regression / 100, max_throughput_drop / 100)
        typer.echo(f"wrote {write_gate_report(load_results(baseline), results, limits, out)}")
        return
    from spectune.tune.report import write_report

    path = write_report(results, out)
    typer.echo(f"wrote {path} and {len(list(out.glob('*.png')))} plots to {out}")
