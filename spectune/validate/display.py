"""Rendering of ``spectune validate``: live progress while it runs and the runs x phases table at the end (and a
bake-off's tables)."""

from __future__ import annotations

import time
from typing import Sequence

from rich.console import Console
from rich.table import Table

from spectune.core.json_types import JsonObject
from spectune.loadgen.record import RequestRecord
from spectune.measure.node_progress import NodeTask
from spectune.measure.progress import LiveProgress
from spectune.results.validate_run import RunEntry
from spectune.validate.bakeoff_table import winner_sentence
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

    def run_finished(self, result: RunEntry) -> None:
        self.progress.advance(self.runs_task)
        if result["status"] != "ok":
            line = f"{result['run']} failed: {result.get('error')}"
        else:
            c = dict(zip(("tok", "p50", "p99", "slo", "al", "sw"), row_cells(result["overall"])))
            line = (f"{result['run']} ok: {c['tok']} tok/s, TPOT p50 {c['p50']} ms, p99 {c['p99']} ms, "
                    f"SLO {c['slo']}, AL {c['al']}, switches {c['sw']}")
        node = result.get("node")
        if isinstance(node, dict) and node.get("id"):  # --ray
            line += f" @ node {str(node['id'])[:8]}"
        self.console.print(line, markup=False, soft_wrap=True)

    def node_progress(self, task: NodeTask) -> None:
        """--ray: one bar per running run (its node, seconds of the workload done, its phase) instead of the one
        current run's bar (:meth:`LiveProgress.node_progress`)."""
        if self.run_task is not None:
            self.progress.update(self.run_task, visible=False)
        super().node_progress(task)


def results_table(runs: Sequence[RunEntry], plan: ValidatePlan) -> Table:
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
    windows = [lambda r: r.get("overall")] + [lambda r, i=i: (r.get("phases") or [None] * (i + 1))[i]
                                              for i in range(len(bounds))]
    best = [max((w(r) or {}).get("output_throughput_tok_s") or 0.0 for r in runs if r["status"] == "ok")
            if any(r["status"] == "ok" for r in runs) else None for w in windows]
    for r in runs:
        if r["status"] != "ok" and not r.get("phases"):
            table.add_row(r["run"], f"[red]failed[/]: {r.get('error') or ''}", *[""] * len(bounds))
            continue
        row = [r["run"] + ("" if r["status"] == "ok" else " [red](failed)[/]")]
        for w, top in zip(windows, best):
            d = w(r)
            if not d:
                row.append("-")
                continue
            tok, p50, p99, att, al, sw, _, _ = row_cells(d)
            mark = top is not None and d.get("output_throughput_tok_s") == top and top > 0
            lines = [f"{tok} tok/s" + (" *" if mark else ""), f"{p50} / {p99} ms", f"AL {al}"]
            lines += [f"SLO {att}"] if slo else []
            lines += [f"sw {sw}"] if d.get("num_steps_switches") is not None else []
            text = "\n".join(lines)
            row.append(f"[bold green]{text}[/]" if mark else text)
        table.add_row(*row)
    return table


def bakeoff_table(bakeoff: JsonObject, plan: JsonObject) -> Table:
    """A bake-off's table for the terminal (validate.json ``bakeoff``): a row per config, the best static num_steps
    first; a column for the whole run and one per phase. Each cell: output tok/s (per phase the steady tok/s), the
    ratio to the best static (per phase: that phase's best static) with its interval, TPOT p50 (ms) and, with SLOs,
    SLO attainment and goodput (req/s); per phase the ruling. ``plan``: validate.json's ``plan`` (phases, SLOs)."""
    slo = plan.get("slo_ttft_ms") is not None or plan.get("slo_tpot_ms") is not None
    table = Table(title=f"bake-off: {winner_sentence(bakeoff)}", title_justify="left", show_lines=True,
                  caption="each cell: output tok/s (phases: steady), x the best static [95%] (phases: that phase's "
                          "best static), TPOT p50 ms" + (", SLO attainment, goodput req/s" if slo else "")
                          + "; phases: ruling", caption_justify="left")
    table.add_column("config")
    table.add_column("overall", justify="right")
    for p in (plan.get("workload") or {}).get("phases") or []:
        table.add_column(f"{p.get('label')}\n{p.get('start_s', 0):g}-{p.get('end_s', 0):g} s", justify="right")
    tops = list(bakeoff.get("phase_best_static") or [])
    rows = [(f"best static K={bakeoff['best_static'].get('steps')}", bakeoff["best_static"], True)] \
        if bakeoff.get("best_static") else []
    rows += [(str(r.get("name")), r, False) for r in bakeoff.get("configs") or []]
    for name, row, is_best in rows:
        outcome = str((row.get("verdict") or {}).get("outcome") or "")
        cells = [f"{name}\n{row.get('run')}" + (f"\n[{_STYLE.get(outcome, 'red')}]{outcome}[/]" if outcome else "")]
        windows = [(row.get("overall") or {}, None)] + [
            (ph, tops[i] if i < len(tops) else None) for i, ph in enumerate(row.get("phases") or [])]
        for i, (w, top) in enumerate(windows):
            if i > 0 and is_best:  # per phase the best static row shows that phase's best static
                w = top or {}
            key = "output_throughput_tok_s" if i == 0 else "steady_output_throughput_tok_s"
            tok = w.get(key)
            lines = ["-" if tok is None else f"{tok:,.1f} tok/s"]
            if is_best:
                lines.append("K=" + str(w.get("steps")) if i > 0 and w else "1")
            else:
                lines.append(_ratio_text(w) + (f" K={w['best_static']}" if i > 0 and w.get("best_static") is not None
                                               else ""))
            p50 = w.get("tpot_p50_ms")
            lines.append("-" if p50 is None else f"{p50:.2f} ms")
            if slo:
                att, good = w.get("slo_attainment"), w.get("goodput_req_s")
                lines.append(f"SLO {'-' if att is None else f'{att:.1%}'}, "
                             f"{'-' if good is None else f'{good:.2f}'} req/s")
            if i > 0 and not is_best:
                lines.append(str(w.get("ruling") or "-"))
            cells.append("\n".join(lines))
        table.add_row(*cells)
    return table


_STYLE = {"PASS": "bold green", "FAIL": "bold red", "INCONCLUSIVE": "bold yellow"}


def _ratio_text(w: JsonObject) -> str:
    """``x1.031 [0.990, 1.072]`` (a ratio to the best static with its interval), ``-`` without one."""
    r = w.get("ratio")
    if not isinstance(r, (int, float)):
        return "-"
    iv = f" [{w['low']:.3f}, {w['high']:.3f}]" if isinstance(w.get("low"), (int, float)) else ""
    return f"x{r:.3f}{iv}"
