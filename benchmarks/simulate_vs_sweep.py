"""simulate's predictions beside the measured sweep cells: the prediction error per policy and concurrency, split
into the round time and the tokens per round.

Reads a trace (``spectune serve --trace``, every round recorded at the cap) and the sweep folder whose cells it should
predict: static num_steps K cells (``summary.csv``) and ``--p-min`` cutoff cells (``p-min/P/summary.csv`` and
``points.jsonl``, at num_steps = the cap). The step-time model is the one ``spectune simulate --trace T --sweep S``
uses (:mod:`spectune.tune.step_time`): the static cells' ``engine_round_ms`` at the round's verify width, plus the
trace's fitted draft step per position computed beyond it (``--charge static``: the model before that, every round
charged the static round of K = max(D, W - 1); ``--model trace``: the trace's own timings alone). The static cells
are the model's table, so their round times are the fit; the p-min cells are held out.

For a measured cell at concurrency c it replays the cell's policy (``static:K`` or ``p_min:P``) on the trace's rounds
of batch size c and times them at the cell's measured mean batch size b (a cell at concurrency 4 runs fewer rows while
a request finishes and the next one prefills). Predicted:

- tokens per row per round = 1 + mean accepted drafts per row (the trace's acceptance under the policy); measured:
  1 + (acceptance length - 1) x the share of row-rounds that drafted (points.jsonl ``schedule_check``; 1 for static);
- round ms = the model's mean round over those rounds at batch b; measured: the cell's ``engine_round_ms``;
- tok/s = 1000 x tokens per row x b / round ms x (1 - the cell's ``engine_prefill_share``): simulate counts decode
  rounds only, a cell's time also holds its prefills. Compared with the cell's output tok/s and its 95% bootstrap
  interval over requests (``output_throughput_ci_low``/``_high``).

Usage: ``python benchmarks/simulate_vs_sweep.py TRACE SWEEP_DIR [--charge verify-width|static] [--model sweep|trace]``.
Prints a Markdown table and a summary.
"""

from __future__ import annotations

import argparse
import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spectune.backends.num_steps.trace import read_trace
from spectune.tune.draft_policies import PolicySpec, TraceArrays, trace_arrays
from spectune.tune.policy_replay import replay
from spectune.tune.step_time import StepTimeModel, cells_step_time, fit_trace_step_time, trace_draft_step


@dataclass(frozen=True)
class Cell:
    """One measured sweep cell: its policy, concurrency and what it measured (tok/s and its interval, round ms,
    tokens per row-round, mean batch size, prefill share)."""

    spec: PolicySpec
    concurrency: int
    tok_s: float
    ci: tuple[float, float]
    round_ms: float
    tokens_per_row: float
    batch: float
    prefill_share: float


def _drafting_share(folder: Path) -> dict[int, float]:
    """Concurrency -> share of row-rounds that drafted (points.jsonl ``schedule_check.drafting_share``)."""
    out = {}
    for line in (folder / "points.jsonl").read_text().splitlines():
        pt = json.loads(line)
        share = (pt.get("schedule_check") or {}).get("drafting_share")
        if pt.get("status") == "ok" and share is not None:
            out[int(pt["concurrency"])] = float(share)
    return out


def _cells_in(folder: Path, p_min: float | None) -> list[Cell]:
    share = _drafting_share(folder) if p_min is not None else {}
    out = []
    for row in csv.DictReader((folder / "summary.csv").open()):
        if row["status"] != "ok":
            continue
        c = int(row["concurrency"])
        spec = PolicySpec("static", float(row["steps"])) if p_min is None else PolicySpec("p_min", p_min)
        acc = float(row["acceptance_length"] or 1.0)
        tokens = acc if p_min is None else 1.0 + (acc - 1.0) * share.get(c, 1.0)
        out.append(Cell(spec, c, float(row["output_throughput_tok_s"]),
                        (float(row["output_throughput_ci_low"]), float(row["output_throughput_ci_high"])),
                        float(row["engine_round_ms"]), tokens, float(row["batch_size_mean"] or c),
                        float(row["engine_prefill_share"] or 0.0)))
    return out


def cells(sweep: Path) -> list[Cell]:
    """Every ok cell of ``sweep`` and of its ``p-min/P`` folders."""
    out = _cells_in(sweep, None)
    for sub in sorted((sweep / "p-min").glob("*")) if (sweep / "p-min").is_dir() else []:
        out += _cells_in(sub, float(sub.name))
    return out


def predict(arr: TraceArrays, model: StepTimeModel, cell: Cell) -> tuple[float, float, float]:
    """(tok/s, round ms, tokens per row-round) predicted for ``cell`` (the module docstring)."""
    rep = replay(arr, cell.spec)
    rounds = np.flatnonzero(arr.batch == cell.concurrency)
    rows = np.isin(arr.row_round, rounds)
    tokens = 1.0 + float(np.minimum(arr.accepted, rep.lengths)[rows].mean())
    width = np.array([rep.lengths[arr.start[r]:arr.start[r] + arr.batch[r]].max() + 1 for r in rounds], float)
    verified = np.array([(rep.lengths[arr.start[r]:arr.start[r] + arr.batch[r]] + 1).sum() for r in rounds], float)
    scale = cell.batch / cell.concurrency
    ms = model.round_ms(np.full(len(rounds), cell.batch), rep.draft_steps[rounds].astype(float), width,
                        verified * scale, arr.context[rounds] * scale)
    round_ms = float(ms.mean())
    return 1000.0 * tokens * cell.batch / round_ms * (1.0 - cell.prefill_share), round_ms, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--charge", choices=("verify-width", "static"), default="verify-width",
                        help="sweep model: charge a round the static round at its verify width plus its extra draft "
                             "steps (default), or the static round at K = max(D, W - 1) (before)")
    parser.add_argument("--model", choices=("sweep", "trace"), default="sweep")
    args = parser.parse_args()
    steps = read_trace(args.trace)
    arr = trace_arrays(steps)
    if args.model == "trace":
        model: StepTimeModel | None = fit_trace_step_time(steps)
    else:
        model = cells_step_time(args.sweep, trace_draft_step(steps) if args.charge == "verify-width" else None)
    assert model is not None, "the trace holds no draft_ms/verify_ms"
    print(f"step-time model: {model.description}")
    print("| policy | c | measured tok/s [95%] | predicted | error | round ms measured / predicted | "
          "tokens per row-round measured / predicted |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    errs: dict[str, list[tuple[float, float, float, bool]]] = {"static": [], "p_min": []}
    for cell in cells(args.sweep):
        tok_s, round_ms, tokens = predict(arr, model, cell)
        e, e_round = tok_s / cell.tok_s - 1.0, round_ms / cell.round_ms - 1.0
        e_tok = tokens / cell.tokens_per_row - 1.0
        errs[cell.spec.kind].append((e, e_round, e_tok, cell.ci[0] <= tok_s <= cell.ci[1]))
        print(f"| {cell.spec.label} | {cell.concurrency} | {cell.tok_s:.1f} [{cell.ci[0]:.1f}, {cell.ci[1]:.1f}] | "
              f"{tok_s:.1f} | {e:+.1%} | {cell.round_ms:.1f} / {round_ms:.1f} ({e_round:+.1%}) | "
              f"{cell.tokens_per_row:.3f} / {tokens:.3f} ({e_tok:+.1%}) |")
    print()
    table = " (the model's table)" if args.model == "sweep" else ""
    for kind, label in (("static", f"static cells{table}"), ("p_min", "p-min cells (held out)")):
        es = errs[kind]
        if not es:
            continue
        a = np.abs(np.array([x[:3] for x in es]))
        print(f"{label}: {len(es)} cells; tok/s mean |error| {a[:, 0].mean():.1%}, max {a[:, 0].max():.1%}, "
              f"within 10%: {int((a[:, 0] <= 0.10).sum())}, inside the cell's interval: {sum(x[3] for x in es)}; "
              f"round ms mean |error| {a[:, 1].mean():.1%} (max {a[:, 1].max():.1%}); tokens per row-round mean "
              f"|error| {a[:, 2].mean():.1%} (max {a[:, 2].max():.1%})")


if __name__ == "__main__":
    main()
