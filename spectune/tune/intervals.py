"""The throughput interval of every cell of a sweep's results folder, as ``spectune recommend`` computes it; the
sweep's summary table shows them (:func:`spectune.sweep.display.summarize`)."""

from __future__ import annotations

from pathlib import Path

from spectune.core.errors import UserError
from spectune.results.reader import load_request_records, load_results, with_text_columns
from spectune.tune.recommend import RecommendOptions, attach_intervals, build_cell


def throughput_intervals(folder: str | Path) -> dict[tuple[int, int], tuple[float, float]]:
    """(concurrency, steps) -> the 95% bootstrap interval of the cell's output throughput (tokens/s) over its
    requests and repeats, as ``spectune recommend`` computes it (:func:`spectune.tune.recommend.attach_intervals`);
    {} when the folder cannot be read."""
    try:
        results = load_results(folder)
    except UserError:
        return {}
    df, opts = with_text_columns(results.summary), RecommendOptions()
    if "predicted" in df:
        df = df[~df["predicted"].astype(bool)]
    cells = [build_cell(int(k), int(c), rows, opts, None, None)
             for (k, c), rows in df.groupby(["steps", "concurrency"])]
    attach_intervals(cells, df, load_request_records(results.folder), opts, None, None)
    return {(cell.concurrency, cell.steps): (cell.ci_low, cell.ci_high) for cell in cells if cell.interval.known}
