"""Rendering of ``spectune sweep``: rich live progress while it runs, the concurrency x num_steps table at the end.

The sweep loop only emits events (:class:`spectune.sweep.plan.SweepListener`); :class:`LiveDisplay` renders them.
:func:`summarize` is plain data (tested without a terminal); :func:`summary_table` turns it into a rich table.
:class:`~spectune.measure.progress.LiveProgress` draws the bars (and checks for a terminal).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

from rich.console import Console
from rich.progress import TaskID
from rich.table import Table

from spectune.loadgen.record import RequestRecord
from spectune.measure.progress import LiveProgress
from spectune.results.point import PointObject, SweepPoint, as_points
from spectune.results.schema import Key
from spectune.sweep.drift import DriftCheck
from spectune.sweep.plan import SweepListener, SweepOutcome, SweepPlan


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


class LiveDisplay(LiveProgress, SweepListener):
    """Live progress: points done / planned, the current point's requests done / planned, elapsed time and the
    running output throughput (tokens/s of the current point's finished requests); one line per finished point.
    A distributed sweep (``--ray``) shows one bar per running block instead of the current point's: its node, its
    points done / total and its current point (:meth:`LiveProgress.node_progress`).

    Use as a context manager around the sweep; without a terminal rich prints only the per-point lines.
    """

    def __init__(self, console: Console | None = None) -> None:
        super().__init__(console)
        self.sweep_task: TaskID | None = None
        self.point_task: TaskID | None = None
        self.t0 = 0.0
        self.tokens = 0

    def sweep_started(self, plan: SweepPlan, todo: list[Key], kept: list[SweepPoint]) -> None:
        if kept:
            self.console.print(f"resuming: {len(kept)} finished point(s) kept, {len(todo)} to run")
        self.sweep_task = self.progress.add_task("points", total=len(todo), rate="")
        self.point_task = self.progress.add_task("", total=None, rate="", visible=False)

    def warning(self, message: str) -> None:
        self.console.print(f"[yellow]warning:[/] {message}", markup=True)

    def note(self, message: str) -> None:
        self.console.print(message, markup=False)

    def server_starting(self, steps: int) -> None:
        if self.point_task is not None:
            self.progress.reset(self.point_task, description=f"starting server K={steps}", total=None, rate="",
                                visible=not self.node_bars)  # --ray: the nodes' bars say it

    def server_failed(self, steps: int, message: str, log_tail: str) -> None:
        self.console.print(f"[red]server for num_steps {steps} failed:[/] {message}", markup=True)
        if log_tail:
            self.console.print(log_tail, style="dim", markup=False)

    def point_started(self, key: Key, planned: int) -> None:
        self.t0, self.tokens = time.perf_counter(), 0
        if self.point_task is not None:
            k, c, r = key
            self.progress.reset(self.point_task, description=f"K={k} c={c} r={r}", total=planned, rate="",
                                visible=not self.node_bars)

    def request_finished(self, key: Key, record: RequestRecord, done: int, planned: int) -> None:
        if record.ok:
            self.tokens += record.completion_tokens or 0
        elapsed = time.perf_counter() - self.t0
        rate = f"{self.tokens / elapsed:,.0f} tok/s" if elapsed > 0 else ""
        if self.point_task is not None:
            self.progress.update(self.point_task, completed=done, rate=rate)

    def point_finished(self, point: SweepPoint) -> None:
        if self.sweep_task is not None:
            self.progress.advance(self.sweep_task)
        self.console.print(point_line(point), markup=False)

    def drift_checked(self, check: DriftCheck) -> None:
        self.console.print(drift_line(check), markup=False)


def drift_line(check: DriftCheck) -> str:
    """One line about a drift check: ``drift check (end of sweep) K=0 c=4: throughput 1.000x [0.97, 1.03] within
    noise``."""
    head = f"drift check ({check.label}) K={check.steps} c={check.concurrency}"
    if check.ratio is None:
        return f"{head}: {check.line}"
    return f"{head}: {check.line}: " + (f"DRIFTED by {check.change:.1%}" if check.drifted else "within noise")


def outcome_lines(outcome: SweepOutcome) -> list[str]:
    """The summary lines after the table: the order and drift verdict, the guided plan's outcome, the points whose
    server did not run the num_steps it was given, and the measuring cost (points, launches, seconds)."""
    lines = []
    drift = outcome.drift
    if drift:
        lines.append(f"order: {drift['order']}; drift: " + (f"the reference moved {drift['change']:.1%}, more than its "
                     "interval: spectune recommend will not call differences smaller than that"
                     if drift["drifted"] else "none beyond noise") + f" ({drift['summary']})")
    if outcome.guided:
        g = outcome.guided
        lines.append(f"guided plan: {g.get('measured_cells')} cells measured in {len(g.get('rounds') or [])} rounds, "
                     f"{g.get('predicted_cells')} predicted (marked predicted in summary.csv); stopped: "
                     f"{g.get('stopped')}")
    wrong = [p for p in outcome.points if p.schedule_check is not None and not p.schedule_check.followed]
    if wrong:
        keys = ", ".join(f"K={p.steps} c={p.concurrency}" for p in wrong)
        lines.append(f"num_steps check: {len(wrong)} point(s) drafted more than the num_steps they were given "
                     f"({keys}): they measured another num_steps (schedule_check in points.jsonl and summary.csv)")
    c = outcome.cost
    if c:
        lines.append(f"measuring cost: {c['points']} points, {c['drift_points']} drift re-measurements, "
                     f"{c['launches']} server starts/switches; {c['total_s']:.1f} s ({c['measure_s']:.1f} s points, "
                     f"{c['drift_s']:.1f} s drift checks, {c['switch_s']:.1f} s starts/switches)")
    return lines


def point_line(point: SweepPoint | PointObject) -> str:
    """One line about a finished point (a record, or a points.jsonl object): ``K=3 c=16 r=0 ok: 812 tok/s, TPOT p50
    4.10 ms, AL 2.31 (64 req, 0 failed)``.

    Raises:
        KeyError: a points.jsonl object lacks ``steps`` or ``concurrency``.
    """
    (point,) = as_points([point])
    n = point.numbers
    server = ("" if point.server is None else f" (p_min {point.server['p_min']:g})"
              if point.server["kind"] == "p_min" else f" (schedule server, max K {point.server['max_k']})")
    head = f"K={point.steps}{server} c={point.concurrency} r={point.repeat} {point.status}"
    body = (f"{_fmt(n.output_throughput_tok_s, ',.0f')} tok/s, TPOT p50 {_fmt(n.tpot_p50_ms, '.2f')} ms, "
            f"AL {_fmt(n.acceptance_length, '.2f')} ({n.num_requests or 0} req, {n.num_failed or 0} failed)")
    node = point.node
    where = f" @ node {node.id[:8]}" if node is not None and node.id else ""  # --ray
    if point.status != "ok":
        return f"{head}: {point.error or 'failed'} ({n.num_requests or 0} req){where}"
    check = point.schedule_check
    wrong = f" [NOT at num_steps {point.steps}: drafted {check.drafted_per_step:.2f}/step]" \
        if check is not None and not check.followed else ""
    return f"{head}: {body}" + (" [client-limited]" if n.client_limited else "") + wrong + where


@dataclass
class SummaryCell:
    """One (concurrency, num_steps) cell of the final table: medians over its ``ok`` repeats.

    Attributes:
        throughput: output tokens/s. tpot_p50_ms: ms. acceptance_length: tokens per verify step.
        ok, total: repeats that succeeded / ran. best: highest throughput of its row (ties: smaller K).
        speedup: throughput / the row's num_steps-0 throughput, or None.
        client_limited: ok repeats that the load generator itself limited (``client_limited`` in summary.csv).
    """

    throughput: float | None = None
    tpot_p50_ms: float | None = None
    acceptance_length: float | None = None
    ok: int = 0
    total: int = 0
    best: bool = False
    speedup: float | None = None
    client_limited: int = 0
    ci_low: float | None = None
    ci_high: float | None = None
    predicted: bool = False

    @property
    def failed(self) -> bool:
        """True when the cell ran but no repeat succeeded."""
        return self.total > 0 and self.ok == 0


def _median(values: Iterable[float | None]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize(points: Sequence[SweepPoint | PointObject], steps: Sequence[int],
              concurrency: Sequence[int], intervals: dict[tuple[int, int], tuple[float, float]] | None = None,
              predicted: Sequence[PointObject] = ()) -> dict[tuple[int, int], SummaryCell]:
    """(concurrency, steps) -> :class:`SummaryCell` for every planned cell (``total`` 0 where nothing ran).

    ``intervals``: (concurrency, steps) -> the cell's throughput interval (tokens/s) over requests and repeats
    (:func:`spectune.tune.intervals.throughput_intervals`); without it a cell of one ok repeat shows that point's
    own interval (``output_throughput_ci_low/high``). ``predicted``: a guided sweep's predicted cells (point-like
    objects with ``metrics``), shown where nothing was measured. ``points``: records, or points.jsonl objects
    (:func:`spectune.results.point.as_points`)."""
    cells: dict[tuple[int, int], SummaryCell] = {}
    records, guesses = as_points(points), as_points(predicted)
    for c in concurrency:
        for k in steps:
            pts = [p for p in records if p.key.cell == (k, c)]
            guess = [p for p in guesses if p.key.cell == (k, c)] if not pts else []
            ok = [p.numbers for p in pts + guess if p.status == "ok"]
            cells[c, k] = SummaryCell(_median(n.output_throughput_tok_s for n in ok),
                                      _median(n.tpot_p50_ms for n in ok),
                                      _median(n.acceptance_length for n in ok), len(ok), len(pts + guess),
                                      client_limited=sum(n.client_limited for n in ok), predicted=bool(guess))
            cell = cells[c, k]
            if intervals and (c, k) in intervals:
                cell.ci_low, cell.ci_high = intervals[c, k]
            elif len(ok) == 1:
                cell.ci_low, cell.ci_high = ok[0].output_throughput_ci_low, ok[0].output_throughput_ci_high
        best: SummaryCell | None = None
        for k in sorted(steps):  # ascending: a tie keeps the smaller K
            cell = cells[c, k]
            if cell.predicted:
                continue
            if cell.throughput is not None and (best is None or cell.throughput > best.throughput):  # type: ignore
                best = cell
        if best is not None:
            best.best = True
        base = cells.get((c, 0))
        for k in steps:
            cell = cells[c, k]
            if base is not None and base.throughput and cell.throughput is not None:
                cell.speedup = cell.throughput / base.throughput
    return cells


def summary_table(points: Sequence[SweepPoint | PointObject], steps: Sequence[int], concurrency: Sequence[int],
                  intervals: dict[tuple[int, int], tuple[float, float]] | None = None,
                  predicted: Sequence[PointObject] = ()) -> Table:
    """The final table: a row per concurrency, a column per num_steps; each cell shows output throughput
    (tok/s) with its 95% interval where known (``intervals``, see :func:`summarize`), TPOT p50 (ms), acceptance
    length and speedup vs num_steps 0 (medians over ok repeats); a guided sweep's predicted cells read
    ``predicted`` (``predicted``: their point-like objects); the best
    cell of each row (by throughput, ties to the smaller K) is marked ``*``; cells with no ok repeat read
    ``failed``; cells the load generator limited (:func:`spectune.loadgen.metrics.client_limit`) say
    ``client-limited``."""
    cells = summarize(points, steps, concurrency, intervals, predicted)
    table = Table(title="spectune sweep (medians over ok repeats)", title_justify="left", show_lines=True,
                  caption="each cell: output tok/s [95% interval], TPOT p50, acceptance length (AL), speedup vs K=0; "
                          "* = best tok/s of the row; client-limited = the load generator was the bottleneck "
                          "(its latencies include the client's own queueing)", caption_justify="left")
    table.add_column("concurrency", justify="right")
    for k in steps:
        table.add_column(f"K={k}", justify="right")
    for c in concurrency:
        row = [str(c)]
        for k in steps:
            cell = cells[c, k]
            if cell.total == 0:
                row.append("[dim]missing[/]")
                continue
            if cell.failed:
                row.append("[red]failed[/]")
                continue
            span = (f" [{cell.ci_low:,.1f}, {cell.ci_high:,.1f}]" if cell.ci_low is not None and cell.ci_high is not None
                    and math.isfinite(cell.ci_low) and math.isfinite(cell.ci_high) else "")
            lines = [f"{_fmt(cell.throughput, ',.1f')}{span} tok/s" + (" *" if cell.best else ""),
                     f"{_fmt(cell.tpot_p50_ms, '.2f')} ms", f"AL {_fmt(cell.acceptance_length, '.2f')}"]
            if cell.speedup is not None and k != 0:
                lines.append(f"{cell.speedup:.2f}x")
            if cell.predicted:
                lines.append("[cyan]predicted[/]")
            if cell.ok < cell.total:
                lines.append(f"[red]{cell.total - cell.ok}/{cell.total} failed[/]")
            if cell.client_limited:
                lines.append("[yellow]client-limited[/]" + (f" {cell.client_limited}/{cell.ok}" if cell.ok > 1 else ""))
            text = "\n".join(lines)
            row.append(f"[bold green]{text}[/]" if cell.best else text)
        table.add_row(*row)
    return table
