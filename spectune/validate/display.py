"""Rendering of ``spectune validate``: live progress while it runs and the runs x phases table at the end (and a
bake-off's tables)."""

from __future__ import annotations

import time
from typing import Sequence

from rich.console import Console
from rich.table import Table

from spectune.loadgen.record import RequestRecord
from spectune.measure.node_progress import NodeTask
from spectune.measure.progress import LiveProgress
from spectune.results.validate_doc import BakeoffCell, RecordedBakeoff, RecordedPlan
from spectune.results.validate_run import ValidateRun
from spectune.validate.bakeoff_table import ratio_text, winner_sentence
from spectune.validate.plan import ValidateListener, ValidatePlan
from spectune.validate.verdict import row_cells


class LiveValidateDisplay(LiveProgress, ValidateListener):
    """A live rich display of a validation: runs done / planned, the current run's elapsed time over its scheduled
    length with its phase and running output tok/s, and one line per finished run (with ``--ray``: one bar per
    running run with its node instead of the current run's). Use as a context manager."""

    def __init__(self, console: Console | None = None) -> None:
        super().__init__(console)
        self.runs_task = self.run_task = None
        self.t0, self.total, self.tokens, self.phases = 0.0, 1.0, 0, 1

    def started(self, plan: ValidatePlan, runs: list[str]) -> None:
        self.phases = len(plan.workload.phases)
        self.runs_task = self.progress.add_task("runs", total=len(runs), rate="")
        self.run_task = self.progress.add_task("", total=1, rate="")

    def warning(self, message: str) -> None:
        self.console.print(f"warning: {message}", style="yellow", markup=False, soft_wrap=True)

    def server_starting(self, run: str) -> None:
        self.progress.update(self.run_task, description=f"{run}: starting the server", completed=0, rate="")

    def run_started(self, run: str, t0: float, total_s: float) -> None:
        self.t0, self.total, self.tokens = t0, total_s, 0
        self.progress.update(self.run_task, description=f"{run}: phase 1/{self.phases}", total=total_s,
                             completed=0)

    def request_finished(self, run: str, record: RequestRecord, phase: int) -> None:
        elapsed = max(time.perf_counter() - self.t0, 1e-9)
        self.tokens += (record.completion_tokens or 0) if record.ok else 0
        self.progress.update(self.run_task, description=f"{run}: phase {phase}/{self.phases}",
                             completed=min(elapsed, self.total), rate=f"{self.tokens / elapsed:,.0f} tok/s")

    def run_finished(self, result: ValidateRun) -> None:
        self.progress.advance(self.runs_task)
        if not result.ok:
            line = f"{result.run} failed: {result.error}"
        else:
            c = dict(zip(("tok", "p50", "p99", "slo", "al", "sw"), row_cells(result.overall)))
            line = (f"{result.run} ok: {c['tok']} tok/s, TPOT p50 {c['p50']} ms, p99 {c['p99']} ms, "
                    f"SLO {c['slo']}, AL {c['al']}, switches {c['sw']}")
        node = result.node
        if isinstance(node, dict) and node.get("id"):  # --ray
            line += f" @ node {str(node['id'])[:8]}"
        self.console.print(line, markup=False, soft_wrap=True)

    def node_progress(self, task: NodeTask) -> None:
        """--ray: one bar per running run (its node, seconds of the workload done, its phase) instead of the one
        current run's bar (:meth:`LiveProgress.node_progress`)."""
        if self.run_task is not None:
            self.progress.update(self.run_task, visible=False)
        super().node_progress(task)


def results_table(runs: Sequence[ValidateRun], plan: ValidatePlan) -> Table:
    """Final rich table: a row per run, a column for the whole run and one per phase; each cell shows output tok/s,
    TPOT p50/p99 (ms), acceptance length, SLO attainment (with SLOs) and switches (when known); the best tok/s of
    each column is marked *."""
    slo = plan.slo_ttft_ms is not None or plan.slo_tpot_ms is not None
    bounds = plan.workload.bounds
    table = Table(title="spectune validate", title_justify="left", show_lines=True,
                  caption="each cell: output tok/s, TPOT p50/p99 ms, acceptance length (AL)"
                          + (", SLO attainment" if slo else "") + ", num_steps switches (sw); * = best tok/s",
                  caption_justify="left")
    table.add_column("run")
    table.add_column("overall", justify="right")
    for p, (a, b) in zip(plan.workload.phases, bounds):
        table.add_column(f"{p.label}\n{a:g}-{b:g} s", justify="right")
    windows = [lambda r: r.overall] + [lambda r, i=i: r.phases[i] if len(r.phases) > i else None
                                       for i in range(len(bounds))]
    best = [max((d.output_throughput_tok_s or 0.0 if (d := w(r)) else 0.0) for r in runs if r.ok)
            if any(r.ok for r in runs) else None for w in windows]
    for r in runs:
        if not r.ok and not r.phases:
            table.add_row(r.run, f"[red]failed[/]: {r.error or ''}", *[""] * len(bounds))
            continue
        row = [r.run + ("" if r.ok else " [red](failed)[/]")]
        for w, top in zip(windows, best):
            d = w(r)
            if not d:
                row.append("-")
                continue
            tok, p50, p99, att, al, sw, _, _ = row_cells(d)
            mark = top is not None and d.output_throughput_tok_s == top and top > 0
            lines = [f"{tok} tok/s" + (" *" if mark else ""), f"{p50} / {p99} ms", f"AL {al}"]
            lines += [f"SLO {att}"] if slo else []
            lines += [f"sw {sw}"] if d.num_steps_switches is not None else []
            text = "\n".join(lines)
            row.append(f"[bold green]{text}[/]" if mark else text)
        table.add_row(*row)
    return table


def bakeoff_table(bakeoff: RecordedBakeoff, plan: RecordedPlan) -> Table:
    """A bake-off's table for the terminal (validate.json ``bakeoff``): a row per config, the best static num_steps
    first; a column for the whole run and one per phase. Each cell: output tok/s (per phase the steady tok/s), the
    ratio to the best static (per phase: that phase's best static) with its interval, TPOT p50 (ms) and, with SLOs,
    SLO attainment and goodput (req/s); per phase the ruling. ``plan``: validate.json's ``plan`` (phases, SLOs)."""
    slo = plan.with_slo
    table = Table(title=f"bake-off: {winner_sentence(bakeoff)}", title_justify="left", show_lines=True,
                  caption="each cell: output tok/s (phases: steady), x the best static [95%] (phases: that phase's "
                          "best static), TPOT p50 ms" + (", SLO attainment, goodput req/s" if slo else "")
                          + "; phases: ruling", caption_justify="left")
    table.add_column("config")
    table.add_column("overall", justify="right")
    for p in plan.workload.phases:
        table.add_column(f"{p.label}\n{p.start_s:g}-{p.end_s:g} s", justify="right")
    tops = bakeoff.phase_best_static
    rows = [(f"best static K={bakeoff.best_static.steps}", bakeoff.best_static, True)] if bakeoff.best_static else []
    rows += [(str(r.name), r, False) for r in bakeoff.configs]
    for name, row, is_best in rows:
        outcome = row.verdict.outcome if row.verdict is not None else ""
        cells = [f"{name}\n{row.run}" + (f"\n[{_STYLE.get(outcome, 'red')}]{outcome}[/]" if outcome else "")]
        windows: list[tuple[BakeoffCell | None, BakeoffCell | None]] = [(row.overall, None)] + [
            (ph, tops[i] if i < len(tops) else None) for i, ph in enumerate(row.phases)]
        for i, (cell, top) in enumerate(windows):
            if i > 0 and is_best:  # per phase the best static row shows that phase's best static
                cell = top
            w = cell or BakeoffCell()
            tok = w.output_throughput_tok_s if i == 0 else w.steady_output_throughput_tok_s
            lines = ["-" if tok is None else f"{tok:,.1f} tok/s"]
            if is_best:
                lines.append("K=" + str(w.steps) if i > 0 and cell else "1")
            else:
                lines.append(ratio_text(w, lead=True) + (f" K={w.best_static}" if i > 0 and w.best_static is not None else ""))
            lines.append("-" if w.tpot_p50_ms is None else f"{w.tpot_p50_ms:.2f} ms")
            if slo:
                att, good = w.slo_attainment, w.goodput_req_s
                lines.append(f"SLO {'-' if att is None else f'{att:.1%}'}, "
                             f"{'-' if good is None else f'{good:.2f}'} req/s")
            if i > 0 and not is_best:
                lines.append(str(w.ruling or "-"))
            cells.append("\n".join(lines))
        table.add_row(*cells)
    return table


_STYLE = {"PASS": "bold green", "FAIL": "bold red", "INCONCLUSIVE": "bold yellow"}
