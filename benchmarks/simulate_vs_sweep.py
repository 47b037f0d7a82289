"""simulate's predictions beside the measured sweep cells: the prediction error per policy and concurrency, split
into the round time and the tokens per round.

Reads a trace (``spectune serve --trace``, every round recorded at the cap) and the sweep folder whose cells it should
predict: static num_steps K cells (``summary.csv``) and ``--p-min`` cutoff cells (``p-min/P/summary.csv`` and
``points.jsonl``, at num_steps = the cap). The step-time model is the one ``spectune simulate --trace T --sweep S``
uses (:mod:`spectune.tune.step_time`): the static cells' ``engine_round_ms`` at the round's verify width, plus the
trace's fitted draft step per position computed beyond it (``--charge static``: the model before that, every round
charged the static round of K = max(D, W - 1); ``--model trace``: the trace's own timings alone). The static cells
are the model's table, so their round times are the fit; the p-min cells are held out.

``--pairing repeat`` (the default): a run of repeat r is timed by the static cells of repeat r only, measured in the
same minutes when the sweep went repeat by repeat (docs/sweep.md, "Draft-confidence cutoff"); a cell's summary is
the median over its repeats of the per-run errors. On a machine whose speed drifts by tens of percent within minutes,
this compares the model with what it models rather than with the drift between a cell and a table measured a quarter
of an hour apart. ``--pairing pooled``: every run timed by the median of each static cell's repeats, and a cell's
summary the median of its measured tok/s against the median of its predictions.

For a measured cell at concurrency c it replays the cell's policy (``static:K`` or ``p_min:P``) on the trace's rounds
of batch size c and times them at the cell's batch size b, the one the step-time table is keyed on
(:func:`~spectune.tune.step_time.cells_step_time`: ``engine_round_rows``, else ``batch_size_mean``). Predicted:

- tokens per row per round = 1 + mean accepted drafts per row (the trace's acceptance under the policy); measured:
  1 + (acceptance length - 1) x the share of row-rounds that drafted (points.jsonl ``schedule_check``; 1 for static);
- round ms = the model's mean round over those rounds at batch b; measured: the cell's ``engine_round_ms``;
- tok/s = 1000 x tokens per row x rows / round ms x (1 - the cell's ``engine_prefill_share``): simulate counts decode
  rounds only, a cell's time also holds its prefills. Compared with the cell's output tok/s and its 95% bootstrap
  interval over requests (``output_throughput_ci_low``/``_high``).

rows: the mean rows of the cell's decode rounds. A cell at concurrency 4 runs fewer than 4 while a request finishes
and the next one prefills, and fewer than its running-requests gauge says (``batch_size_mean``): the gauge counts a
request while it waits for or runs its prefill (:mod:`spectune.measure.engine_time`). The engine's own count
(summary.csv ``engine_round_rows``) where the sweep has it; in an older folder, counted from the streamed chunks
(:func:`chunk_rows`: the engine streams one chunk per row per round, so the chunks of one round arrive together).
``--rows gauge`` takes ``batch_size_mean`` instead (the script before ``engine_round_rows``).

The cell's own prompts: a window of 20 s at concurrency 1 serves 10-13 requests, so the prompts it drew move its
acceptance by several percent. When the trace's rows carry request ids (``request_ids``) and the requests.jsonl of
the sweep that recorded it (``TRACE_DIR/requests.jsonl``, ``server_request_id``) names each one's prompt, a cell's
prediction keeps only the trace's rows of the prompts that cell served (each row weighted by how often the cell
served its prompt) and the rounds that hold such a row; ``coverage`` says which share of the cell's requests the
trace holds at its batch size. ``--all-rows`` (or a trace without ids) replays every round of the batch size.

Several sweep folders of one plan (``TRACE SWEEP_DIR SWEEP_DIR ...``, e.g. a second ``--repeats`` sweep run
after the first) count as one sweep with their repeats numbered on: each run still timed by the static cells of its
own sweep and repeat (``pooled``: the median of its own sweep's repeats).

Usage: ``python benchmarks/simulate_vs_sweep.py TRACE SWEEP_DIR [SWEEP_DIR ...] [--charge verify-width|static]
[--model sweep|trace] [--pairing repeat|pooled] [--rows engine|gauge] [--all-rows]``. Prints a Markdown table and a
summary.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spectune.backends.num_steps.trace import TraceStep, read_trace
from spectune.results.reader import load_request_records, request_objects
from spectune.tune.draft_policies import PolicySpec, TraceArrays, trace_arrays
from spectune.tune.policy_replay import replay
from spectune.tune.step_time import StepTimeModel, cells_step_time, fit_trace_step_time, trace_draft_step


@dataclass(frozen=True)
class Cell:
    """One measured sweep cell (one repeat): its policy, concurrency, the prompts its ok requests drew (prompt id ->
    requests) and what it measured (tok/s and its interval, round ms, tokens per row-round, the batch size its round
    is keyed on in the step-time table, the mean rows of its decode rounds, prefill share)."""

    spec: PolicySpec
    concurrency: int
    repeat: int
    prompts: Counter[str]
    tok_s: float
    ci: tuple[float, float]
    round_ms: float
    tokens_per_row: float
    batch: float
    rows: float
    prefill_share: float


def _drafting_share(folder: Path) -> dict[tuple[int, int], float]:
    """(concurrency, repeat) -> share of row-rounds that drafted (points.jsonl ``schedule_check.drafting_share``)."""
    out = {}
    for line in (folder / "points.jsonl").read_text().splitlines():
        pt = json.loads(line)
        share = (pt.get("schedule_check") or {}).get("drafting_share")
        if pt.get("status") == "ok" and share is not None:
            out[int(pt["concurrency"]), int(pt["repeat"])] = float(share)
    return out


def _prompts(records: list[dict]) -> dict[tuple[int, int, int], Counter[str]]:
    """(steps, concurrency, repeat) -> prompt id -> ok requests, from a folder's request objects
    (:func:`~spectune.results.reader.request_objects`)."""
    out: dict[tuple[int, int, int], Counter[str]] = {}
    for r in records:
        if r.get("error") is None and r.get("chunk_times"):
            out.setdefault((int(r["steps"]), int(r["concurrency"]), int(r.get("repeat", 0))), Counter())[
                r["prompt_id"]] += 1
    return out


def chunk_rows(records: list[dict], round_ms: dict[tuple[int, int, int], float]) -> dict[tuple[int, int, int], float]:
    """(steps, concurrency, repeat) -> the mean rows of the cell's decode rounds, counted from its requests' streamed
    chunks (``records``: :func:`~spectune.results.reader.request_objects`): every ok request's chunk times but its
    first (the token its prefill emits), sorted, split into rounds at each gap over a quarter of the cell's mean round
    (``round_ms``, ms); chunks / rounds. The engine streams one chunk per row per round
    (``backends/local/engine/loop.py``, ``Engine._emit``), so a round's chunks arrive within a fraction of a round of
    each other. On a sweep that has both (num_steps 0 and 1 at concurrency 4, 2-vCPU Zen 3), this count and the
    engine's ``engine_round_rows`` agree to every digit (3.520 and 3.205 rows)."""
    times: dict[tuple[int, int, int], list[float]] = {}
    for r in records:
        if r.get("error") is None and len(r.get("chunk_times") or []) > 1:
            times.setdefault((int(r["steps"]), int(r["concurrency"]), int(r.get("repeat", 0))), []).extend(
                r["chunk_times"][1:])
    out = {}
    for key, ts in times.items():
        if key in round_ms:
            t = np.sort(np.array(ts))
            out[key] = len(t) / (1 + int((np.diff(t) > round_ms[key] / 4000.0).sum()))
    return out


def _cells_in(folder: Path, p_min: float | None, rows_from: str) -> list[Cell]:
    share = _drafting_share(folder) if p_min is not None else {}
    records = request_objects(folder) or []
    prompts = _prompts(records)
    summary = [row for row in csv.DictReader((folder / "summary.csv").open()) if row["status"] == "ok"]
    keys = [(int(row["steps"]), int(row["concurrency"]), int(row["repeat"])) for row in summary]
    need_chunks = rows_from == "engine" and not all(row.get("engine_round_rows") for row in summary)
    counted = chunk_rows(records, {k: float(r["engine_round_ms"]) for k, r in zip(keys, summary)}) if need_chunks \
        else {}
    out = []
    for row, key in zip(summary, keys):
        c = key[1]
        spec = PolicySpec("static", float(row["steps"])) if p_min is None else PolicySpec("p_min", p_min)
        acc = float(row["acceptance_length"] or 1.0)
        tokens = acc if p_min is None else 1.0 + (acc - 1.0) * share.get((c, key[2]), 1.0)
        gauge = float(row["batch_size_mean"] or c)
        engine_rows = float(row.get("engine_round_rows") or 0.0) or None
        rows = gauge if rows_from == "gauge" else engine_rows or counted.get(key, gauge)
        out.append(Cell(spec, c, key[2], prompts.get(key, Counter()), float(row["output_throughput_tok_s"]),
                        (float(row["output_throughput_ci_low"]), float(row["output_throughput_ci_high"])),
                        float(row["engine_round_ms"]), tokens, engine_rows or gauge, rows,
                        float(row["engine_prefill_share"] or 0.0)))
    return out


def cells(sweep: Path, rows_from: str = "engine") -> list[Cell]:
    """Every ok cell of ``sweep`` and of its ``p-min/P`` folders; ``rows_from``: ``engine`` (each cell's
    ``engine_round_rows``, else :func:`chunk_rows`) or ``gauge`` (``batch_size_mean``)."""
    out = _cells_in(sweep, None, rows_from)
    for sub in sorted((sweep / "p-min").glob("*")) if (sweep / "p-min").is_dir() else []:
        out += _cells_in(sub, float(sub.name), rows_from)
    return out


def row_prompts(trace: Path, steps: list[TraceStep]) -> np.ndarray | None:
    """[N] the prompt id of every trace row ('' where unknown), joined through the trace's ``request_ids`` and the
    ``server_request_id`` of ``requests.jsonl`` beside the trace; None when either is missing."""
    records = load_request_records(trace.parent)
    if records is None or any(s.request_ids is None for s in steps):
        return None
    by_id = {r["server_request_id"]: r["prompt_id"] for r in records if r.get("server_request_id")}
    if not by_id:
        return None
    return np.array([by_id.get(i, "") for s in steps for i in s.request_ids], dtype=object)


def engine_path(folder: Path) -> dict | None:
    """The compute path a sweep folder's server ran (sweep.json ``backend.engine.path``: path, lm_head kernel, kernel
    ranges), or None where the file does not say: a trace predicts only cells of the same path, since the lm_head
    kernel and the row ranges change the greedy tokens (so the acceptance) and the round times."""
    try:
        path = json.loads((folder / "sweep.json").read_text())["backend"]["engine"]["path"]
    except (OSError, KeyError, TypeError, ValueError):
        return None
    return {key: path.get(key) for key in ("path", "lm_head", "kernel_ranges")}


def predict(arr: TraceArrays, model: StepTimeModel, cell: Cell,
            prompts: np.ndarray | None) -> tuple[float, float, float, float | None]:
    """(tok/s, round ms, tokens per row-round, coverage) predicted for ``cell`` (the module docstring); coverage is
    None when every row of the batch size is replayed (``prompts`` None)."""
    rep = replay(arr, cell.spec)
    at_batch = arr.batch[arr.row_round] == cell.concurrency
    coverage = None
    if prompts is None:
        weight = at_batch.astype(float)
    else:
        weight = np.where(at_batch, [float(cell.prompts.get(p, 0)) for p in prompts], 0.0)
        held = set(prompts[at_batch])
        coverage = sum(n for p, n in cell.prompts.items() if p in held) / max(1, sum(cell.prompts.values()))
        if not weight.any():  # none of the cell's prompts at this batch size: every row of it
            weight = at_batch.astype(float)
    rounds = np.unique(arr.row_round[weight > 0])
    tokens = 1.0 + float(np.average(np.minimum(arr.accepted, rep.lengths), weights=weight))
    width = np.array([rep.lengths[arr.start[r]:arr.start[r] + arr.batch[r]].max() + 1 for r in rounds], float)
    verified = np.array([(rep.lengths[arr.start[r]:arr.start[r] + arr.batch[r]] + 1).sum() for r in rounds], float)
    scale = cell.batch / cell.concurrency
    ms = model.round_ms(np.full(len(rounds), cell.batch), rep.draft_steps[rounds].astype(float), width,
                        verified * scale, arr.context[rounds] * scale)
    round_ms = float(ms.mean())
    return 1000.0 * tokens * cell.rows / round_ms * (1.0 - cell.prefill_share), round_ms, tokens, coverage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("sweep", type=Path, nargs="+", help="one sweep folder, or several of one plan")
    parser.add_argument("--charge", choices=("verify-width", "static"), default="verify-width",
                        help="sweep model: charge a round the static round at its verify width plus its extra draft "
                             "steps (default), or the static round at K = max(D, W - 1) (before)")
    parser.add_argument("--model", choices=("sweep", "trace"), default="sweep")
    parser.add_argument("--pairing", choices=("repeat", "pooled"), default="repeat",
                        help="sweep model: time each run by the static cells of its own repeat (default), or by the "
                             "median of every repeat")
    parser.add_argument("--rows", choices=("engine", "gauge"), default="engine",
                        help="a cell's rows per round: the engine's count (else counted from its streamed chunks; "
                             "default), or the running-requests gauge's mean batch size")
    parser.add_argument("--all-rows", action="store_true",
                        help="replay every round of the cell's batch size, not only its prompts' rows")
    args = parser.parse_args()
    steps = read_trace(args.trace)
    arr = trace_arrays(steps)
    prompts = None if args.all_rows else row_prompts(args.trace, steps)
    trace_path = engine_path(args.trace.parent)
    for folder in args.sweep:
        sweep_path = engine_path(folder)
        if sweep_path != trace_path:
            print(f"WARNING: the trace's server ran {trace_path}, {folder}'s {sweep_path}: the predictions mix two "
                  "engine paths (start the trace's server with the sweep's path, e.g. --native-lm-head)")
    print("rows replayed per cell: " + ("every row of the cell's batch size" if prompts is None
                                         else "the rows of the prompts the cell served (trace request ids)"))
    draft = trace_draft_step(steps) if args.charge == "verify-width" else None
    per_repeat = args.model == "sweep" and args.pairing == "repeat"
    all_cells: list[Cell] = []
    origin: dict[int, tuple[Path, int]] = {}  # repeat numbered on over the folders -> (folder, its own repeat)
    for folder in args.sweep:
        these = cells(folder, args.rows)
        offset = max(origin, default=-1) + 1
        origin.update({offset + r: (folder, r) for r in sorted({c.repeat for c in these})})
        all_cells += [dataclasses.replace(c, repeat=offset + c.repeat) for c in these]
    print("rows per decode round: " + ("the running-requests gauge's mean batch size (batch_size_mean)"
                                       if args.rows == "gauge" else "the engine's engine_round_rows, or counted from "
                                       "the streamed chunks where a folder lacks it"))
    pooled = {folder: cells_step_time(folder, draft) for folder in args.sweep} \
        if args.model == "sweep" and not per_repeat else {}
    models: dict[int, StepTimeModel | None] = {
        r: fit_trace_step_time(steps) if args.model == "trace" else
        cells_step_time(folder, draft, own) if per_repeat else pooled[folder]
        for r, (folder, own) in origin.items()}
    assert all(m is not None for m in models.values()), "the trace holds no draft_ms/verify_ms"
    several = len(args.sweep) > 1
    if per_repeat:
        for r, (folder, own) in origin.items():
            which = f" ({folder}'s repeat {own})" if several else ""
            print(f"step-time model of repeat {r}{which}: {models[r].description}")  # type: ignore[union-attr]
    else:
        for folder, model in (pooled.items() if pooled else [(args.sweep[0], models[0])]):
            which = f" of {folder}" if several else ""
            print(f"step-time model{which}: {model.description}")  # type: ignore[union-attr]

    def model_for(repeat: int) -> StepTimeModel:
        return models[repeat]  # type: ignore[return-value]
    print("| policy | c | repeat | measured tok/s [95%] | predicted | error | round ms measured / predicted | "
          "tokens per row-round measured / predicted | coverage |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    errs: dict[str, list[tuple[float, float, float, bool]]] = {"static": [], "p_min": []}
    per_cell: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    for cell in all_cells:
        tok_s, round_ms, tokens, coverage = predict(arr, model_for(cell.repeat), cell, prompts)
        per_cell.setdefault((cell.spec.kind, cell.spec.label, cell.concurrency), []).append((cell.tok_s, tok_s))
        e, e_round = tok_s / cell.tok_s - 1.0, round_ms / cell.round_ms - 1.0
        e_tok = tokens / cell.tokens_per_row - 1.0
        errs[cell.spec.kind].append((e, e_round, e_tok, cell.ci[0] <= tok_s <= cell.ci[1]))
        cover = "all rows" if coverage is None else f"{coverage:.0%}"
        print(f"| {cell.spec.label} | {cell.concurrency} | {cell.repeat} | {cell.tok_s:.1f} [{cell.ci[0]:.1f}, "
              f"{cell.ci[1]:.1f}] | {tok_s:.1f} | {e:+.1%} | {cell.round_ms:.1f} / {round_ms:.1f} ({e_round:+.1%}) | "
              f"{cell.tokens_per_row:.3f} / {tokens:.3f} ({e_tok:+.1%}) | {cover} |")
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
    paired = args.pairing == "repeat"
    what = "the median of its per-run errors" if paired else "the median of its measured and of its predicted tok/s"
    print(f"\nper cell, over its repeats ({what}):")
    print("| policy | c | repeats | measured (median) | predicted (median) | error |")
    print("|---|---:|---:|---:|---:|---:|")
    within: dict[str, list[bool]] = {"static": [], "p_min": []}
    for (kind, label, conc), runs in per_cell.items():
        measured, predicted = (float(np.median([r[i] for r in runs])) for i in (0, 1))
        e = float(np.median([p / m - 1.0 for m, p in runs])) if paired else predicted / measured - 1.0
        within[kind].append(abs(e) <= 0.10)
        print(f"| {label} | {conc} | {len(runs)} | {measured:.1f} | {predicted:.1f} | {e:+.1%} |")
    print(f"cells within 10% ({what}): " +
          ", ".join(f"{kind} {sum(w)} of {len(w)}" for kind, w in within.items() if w))


if __name__ == "__main__":
    main()
