"""`spectune recommend`: best num_steps per concurrency -> SGLang adaptive configs and a vLLM schedule."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer


class Objective(str, Enum):
    throughput = "throughput"
    tpot = "tpot"
    goodput = "goodput"


class Boundary(str, Enum):
    geometric = "geometric"
    measured = "measured"


def recommend(
    results_dir: Annotated[Path, typer.Argument(help="Sweep results folder (or its summary.csv).")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Output folder (default: "
                                                   "RESULTS_DIR/recommendation).")] = None,
    objective: Annotated[Objective, typer.Option(
        help="throughput: max output tokens/s; tpot: min TPOT p50; goodput: max SLO-meeting req/s (needs SLOs).",
    )] = Objective.throughput,
    slo_ttft_ms: Annotated[Optional[float], typer.Option(help="TTFT SLO, ms (default: the sweep's).")] = None,
    slo_tpot_ms: Annotated[Optional[float], typer.Option(help="TPOT SLO, ms; a num_steps whose TPOT p99 exceeds it "
                                                         "is not eligible (default: the sweep's). Given here: "
                                                         "static, schedule and policy configs are also ranked by "
                                                         "goodput, the tokens/s of requests within the SLO, and a "
                                                         "policy that wins beyond the noise band is named.")] = None,
    min_slo_attainment: Annotated[float, typer.Option(min=0.0, max=1.0, help="Least share of requests meeting "
                                                      "the SLOs for a num_steps to be eligible.")] = 0.9,
    noise_band: Annotated[float, typer.Option(min=0.0, max=50.0, help="PCT: options within this of the best "
                                              "(or within the best cell's repeat spread) go to the smaller "
                                              "num_steps.")] = 2.0,
    max_spread: Annotated[float, typer.Option(min=0.0, help="PCT: a cell whose repeats spread more (1.4826 * MAD "
                                              "/ median) is noisy and wins only if nothing quiet is "
                                              "eligible.")] = 5.0,
    boundary: Annotated[Boundary, typer.Option(help="Slot boundary between measured concurrencies a < b: "
                                               "geometric = round(sqrt(a*b)), measured = b.")] = Boundary.geometric,
    max_batch_size: Annotated[Optional[int], typer.Option(min=1, help="End of the last vLLM schedule range "
                                                          "(default: the largest measured concurrency).")] = None,
    confidence: Annotated[float, typer.Option(min=0.5, max=0.999, help="Confidence of the bootstrap intervals "
                                              "(over requests and repeats): a num_steps whose paired ratio to the "
                                              "best reaches within the noise band of 1 ties, and ties go to the "
                                              "smaller num_steps.")] = 0.95,
    trtllm_version: Annotated[Optional[str], typer.Option(
        "--trtllm-version", help="TensorRT-LLM release to write draft_len_schedule for: keys are the largest "
        "batch size of each range from 1.3.0rc8 on, the smallest before (default: the newest).")] = None,
    mix: Annotated[Optional[str], typer.Option(
        help="The load the config will serve, as concurrency:time-share pairs (1:1,32:1 = equal time at 1 and 32, "
        "as validate's swing workload; 1,32 the same): no drafter, each static num_steps and the schedule are "
        "then ranked by the output tokens/s that load streams, and the simplest the best does not beat beyond the "
        "noise band is the primary (default: every swept concurrency weighs the same, a geometric mean).")] = None,
    trace: Annotated[Optional[Path], typer.Option(
        "--trace", help="With --slo-tpot-ms: a verify-step trace of the bundled engine (its --trace) to replay every "
        "per-row policy on (spectune simulate --policy all, SpecServe included) with the sweep's round times; the "
        "predicted goodput ranks them beside the measured answers.")] = None,
    allow_mixed_nodes: Annotated[bool, typer.Option("--allow-mixed-nodes", help="Compare num_steps measured on "
                                                    "nodes whose calibration cells differ beyond the noise band "
                                                    "(a --ray sweep; refused by default).")] = False,
) -> None:
    """Recommend num_steps per batch size from a sweep: SGLang --speculative-adaptive-config files (custom,
    conservative, aggressive), a vLLM num_speculative_tokens_per_batch_size schedule, the best static num_steps
    and recommendation.md explaining every choice."""
    from rich.console import Console
    from rich.table import Table

    from spectune.tune.output import write_recommendation
    from spectune.tune.recommend import RecommendOptions
    from spectune.tune.recommend import recommend as run
    from spectune.tune.markdown import cell_grid
    from spectune.results.reader import load_results

    from spectune.backends.num_steps.trtllm_schedule import schedule_form
    from spectune.core.errors import UserError

    try:
        schedule_form(trtllm_version)
    except ValueError as err:
        raise UserError(f"--trtllm-version: {err}") from None
    if trace is not None and slo_tpot_ms is None:
        raise UserError("--trace prices replayed policies by goodput under a TPOT SLO: add --slo-tpot-ms MS, or "
                        "drop --trace")
    from spectune.tune.mix import parse_mix

    shares = parse_mix(mix) if mix is not None else None
    results = load_results(results_dir)
    opts = RecommendOptions(objective=objective.value, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms,
                            min_slo_attainment=min_slo_attainment, noise_band=noise_band / 100,
                            max_spread=max_spread / 100, boundary=boundary.value, max_batch_size=max_batch_size,
                            confidence=confidence, allow_mixed_nodes=allow_mixed_nodes, mix=shares)
    rec = run(results, opts)
    from spectune.tune.p_min import apply_p_min

    apply_p_min(rec, results)
    from spectune.tune.slo_goodput import print_goodput, slo_goodput

    goodput = slo_goodput(rec, results) if slo_tpot_ms is not None else None
    if trace is not None:
        from spectune.tune.slo_replay import replay_goodput

        if goodput is None or results.folder is None:
            raise UserError("--trace replays policies with a sweep folder's round times: give the sweep folder, "
                            "not its summary.csv, or drop --trace")
        goodput.replay = replay_goodput(trace, results.folder, goodput.slo_tpot_ms, goodput.band)
    out = output or (results_dir if results_dir.is_dir() else results_dir.parent) / "recommendation"
    from spectune.backends import draft_algorithm, draft_head

    description = (results.sweep or {}).get("backend")
    target = description.get("model") if isinstance(description, dict) else None
    paths = write_recommendation(rec, out, str(results.source), draft_algorithm(description), draft_head(description),
                                 str(target) if target else None, trtllm_version=trtllm_version, goodput=goodput)
    console = Console()
    header, rows = cell_grid(rec)
    table = Table(title=f"{opts.objective} per concurrency x num_steps [{opts.confidence:.0%} interval] (* chosen, "
                        "~ noisy, (slo) breaks the SLO, (pred) predicted)")
    for h in header:
        table.add_column(h, justify="right")
    for r in rows:
        table.add_row(*r)
    console.print(table)
    for ch in rec.choices:
        for cmp in ch.comparisons:
            console.print(cmp["text"], soft_wrap=True, markup=False)
    for s in rec.slots:
        console.print(f"batch sizes {s.lower}-{s.upper if s.upper is not None else ''}: num_steps {s.steps}")
    console.print(f"best single static num_steps: {rec.best_static}")
    if rec.p_min is not None:
        for value in rec.p_min["values"]:
            for cmp in value["comparisons"]:
                console.print(cmp["text"], soft_wrap=True, markup=False)
        said = (f"llama.cpp: --spec-draft-p-min {rec.p_min['p_min']:g}" if rec.p_min["beats"]
                else "draft-confidence cutoff")
        console.print(f"{said}: {rec.p_min['reason']}", soft_wrap=True, markup=False)
    if goodput is not None:
        print_goodput(console, goodput)
    for w in rec.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    console.print(f"wrote {len(paths)} files to {out}")
