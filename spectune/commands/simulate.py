"""`spectune simulate`: replay a recorded verify-step trace through an adaptive config or a vLLM schedule (the tier
timeline, ``--config`` alone), or through draft-length policies compared side by side (``--policy``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, List, Optional

import typer

_APPROX = ("Acceptance comes from the trace: accepted drafts recorded at a higher num_steps than the simulated tier "
           "are clipped to it (exact for greedy chain drafting); at a tier above the recorded one the recorded "
           "count is a lower bound.")


def simulate(
    trace: Annotated[Path, typer.Option("--trace", help="JSONL trace of verify steps: one {\"batch_size\", "
                                        "\"accepted_drafts\", \"num_steps\", ...} object per line "
                                        "(docs/engine.md).")],
    config: Annotated[Optional[Path], typer.Option(
        "--config", help="SGLang --speculative-adaptive-config JSON, a vLLM num_speculative_tokens_per_batch_size "
        "list, or a vLLM speculative-config object holding one (the format is detected). Alone: print its num_steps "
        "timeline (a p_min or specdec config: compared with static n_max and the oracle); with --policy: one more "
        "policy in the comparison.")] = None,
    policy: Annotated[Optional[List[str]], typer.Option(
        "--policy", help="Draft-length policies to compare, repeatable: static:K[,K..], p_min:P[,P..] (llama.cpp "
        "--spec-draft-p-min), specdec:H[,H..] (SpecDec++ threshold, acceptance head if recorded), "
        "specdec-raw:H[,H..], config:FILE, ema (SGLang's default config), oracle, or all. A kind without values "
        "takes a default grid. Default without --config: all.")] = None,
    sweep: Annotated[Optional[Path], typer.Option(
        "--sweep", help="--policy: a sweep results folder whose cells' engine_round_ms per (num_steps, batch size) "
        "time the replayed rounds: a round costs the cell of its verify width plus, per draft position computed "
        "beyond it, the trace's fitted draft step (default: a model fitted to the trace's own draft_ms and "
        "verify_ms).")] = None,
    n_max: Annotated[Optional[int], typer.Option(
        "--n-max", min=0, help="--policy: the cap of p_min and specdec draft lengths (llama.cpp --spec-draft-n-max; "
        "default: each round's recorded num_steps).")] = None,
    draft_to_cap: Annotated[bool, typer.Option(
        "--draft-to-cap", help="--policy: charge p_min and specdec rounds n_max draft steps (an engine that drafts "
        "the cap on the device and cuts rows after) instead of the most positions a row's drafter computed.")] = False,
    initial_steps: Annotated[Optional[int], typer.Option(
        "--initial-steps", min=0, help="SGLang: the server's --speculative-num-steps; a slot starts there when it "
        "is a candidate, else at its own middle candidate (default: what SGLang picks without the flag, the middle "
        "of the union of all slots' candidates).")] = None,
    cuda_graph_bs: Annotated[Optional[str], typer.Option(
        "--cuda-graph-bs", help="SGLang: captured CUDA-graph batch sizes, e.g. 1,2,4,8,16; batch sizes are padded "
        "up to them before slot routing (default: no padding).")] = None,
    json_out: Annotated[Optional[Path], typer.Option(
        "--json", help="Also write the full result to this JSON file (timeline: segments, switches, per-tier "
        "counts; --policy: every policy overall and per batch size, the best per batch size, the step-time "
        "model).")] = None,
    lenient: Annotated[bool, typer.Option("--lenient", help="Accept everything SGLang/vLLM accept (unknown keys, "
                                          "smallest slot above 1, unsorted vLLM ranges) with warnings.")] = False,
    max_rows: Annotated[int, typer.Option("--max-rows", min=1, help="Timeline rows (--policy: batch sizes) to "
                                          "print.")] = 40,
    slo_tpot_ms: Annotated[Optional[float], typer.Option(
        "--slo-tpot-ms", help="--policy: a TPOT SLO in ms: each policy's SLO attainment "
        "(share of rows whose TPOT in their round is within it) and goodput (tok/s of those rows), and the SLO "
        "of a bare specserve policy.")] = None,
    cost_table: Annotated[Optional[Path], typer.Option(
        "--cost-table", help="SGLang \"strategy\": \"throughput_aware\" configs: decode-round times in ms, "
        "{\"batch size\": {\"num_steps\": ms}}, standing in for SGLang's start-up profile (without it the "
        "strategy never switches).")] = None,
) -> None:
    """Replay a trace through SGLang's EMA num_steps policy (or a static vLLM schedule) and print the tier timeline,
    or (--policy) compare draft-length policies on it: acceptance length, drafted tokens per accepted token, predicted
    tok/s and TPOT, and the best value per batch size.

    Acceptance comes from the trace: accepted drafts recorded at a higher num_steps than the simulated tier are clipped
    to it (exact for greedy chain drafting); at a tier above the recorded one the recorded count is a lower bound.
    """  # noqa: E501 (typer keeps line breaks in help text)
    from rich.console import Console
    from rich.table import Table

    from spectune.backends.num_steps.confidence_config import ConfidenceConfig
    from spectune.backends.num_steps.sglang_config import VllmSchedule, load_config_file
    from spectune.backends.num_steps.trace import read_trace
    from spectune.commands.options import parse_int_list
    from spectune.tune.simulate import simulate as run_simulation
    from spectune.tune.simulate import write_result_json

    console = Console(highlight=False)
    if slo_tpot_ms is not None and not slo_tpot_ms > 0:
        from spectune.core.errors import UserError

        raise UserError(f"--slo-tpot-ms must be a number of ms > 0, got {slo_tpot_ms:g}; e.g. --slo-tpot-ms 50")
    if policy or config is None:
        _compare(console, trace, config, policy or ["all"], sweep=sweep, n_max=n_max, draft_to_cap=draft_to_cap,
                 initial_steps=initial_steps, cuda_graph_bs=cuda_graph_bs, cost_table=cost_table, json_out=json_out,
                 lenient=lenient, max_rows=max_rows, slo_tpot_ms=slo_tpot_ms)
        return
    from spectune.core.errors import UserError

    for name, given in (("--sweep", sweep is not None), ("--n-max", n_max is not None),
                        ("--draft-to-cap", draft_to_cap), ("--slo-tpot-ms", slo_tpot_ms is not None)):
        if given:
            raise UserError(f"{name} applies to the policy comparison: add --policy (e.g. --policy "
                            f"config:{config.name} --policy static --policy oracle) or drop {name}")
    cfg = load_config_file(config, strict=not lenient)
    if isinstance(cfg, ConfidenceConfig):  # per-row draft lengths have no tier timeline: compare instead
        _compare(console, trace, config, [f"static:{cfg.n_max}", "oracle"], sweep=None, n_max=None,
                 draft_to_cap=False, initial_steps=initial_steps, cuda_graph_bs=cuda_graph_bs, cost_table=cost_table,
                 json_out=json_out, lenient=lenient, max_rows=max_rows)
        return
    graph_bs = parse_int_list(cuda_graph_bs, "cuda-graph-bs", 1) if cuda_graph_bs else None
    steps = read_trace(trace)
    for w in getattr(cfg, "warnings", ()):
        console.print(f"[yellow]warning:[/] {w}")
    if isinstance(cfg, VllmSchedule) and (graph_bs or initial_steps is not None):
        console.print("[dim]note: --cuda-graph-bs and --initial-steps apply to SGLang configs only; vLLM looks up "
                      "the unpadded batch size in a static schedule.[/]")
    table_ms = _cost_table(cost_table)
    result = run_simulation(cfg, steps, initial_steps=initial_steps, cuda_graph_bs=graph_bs, cost_table=table_ms)

    kind = {"sglang": "SGLang EMA policy", "sglang-throughput": "SGLang throughput-aware strategy"}.get(
        result.kind, "vLLM schedule")
    table = Table(title=f"num_steps timeline ({kind}, {result.num_verify_steps} verify steps)")
    for col, just in (("verify steps", "right"), ("count", "right"), ("slot", "right"), ("num_steps", "right"),
                      ("EMA at start", "right"), ("cause", "left")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for seg in result.segments[:max_rows]:
        table.add_row(f"{seg.start}-{seg.end}", str(seg.end - seg.start + 1), seg.slot, str(seg.num_steps),
                      "-" if seg.ema is None else f"{seg.ema:.3f}", seg.cause)
    console.print(table)
    if len(result.segments) > max_rows:
        console.print(f"... {len(result.segments) - max_rows} more segments (raise --max-rows or use --json)")
    tiers = ", ".join(f"{k}: {n}" for k, n in sorted(result.steps_per_tier.items()))
    console.print(f"switches: {result.switch_count}   verify steps per num_steps: {tiers}")
    console.print(f"acceptance length (accepted drafts + 1): simulated {result.acceptance_length:.3f}, "
                  f"recorded {result.recorded_acceptance_length:.3f}")
    if result.steps_above_recorded:
        console.print(f"[yellow]note:[/] {result.steps_above_recorded} verify steps ran above the recorded "
                      "num_steps; their acceptance is a lower bound.")
    console.print(f"[dim]{_APPROX}[/]")
    if json_out is not None:
        write_result_json(result, json_out)
        console.print(f"wrote {json_out}")


def _cost_table(path: Path | None):  # -> CostTable | None
    """``--cost-table``'s decode-round times, or None. Raises UserError on a bad file."""
    if path is None:
        return None
    from spectune.backends.num_steps.throughput_policy import CostTable
    from spectune.core.errors import UserError

    try:
        return CostTable.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, AttributeError) as err:
        raise UserError(f"--cost-table {path}: {err}; write {{\"batch size\": {{\"num_steps\": ms}}}}") from None


def _compare(console, trace: Path, config: Path | None, policies: List[str], *, sweep: Path | None,
             n_max: int | None, draft_to_cap: bool, initial_steps: int | None, cuda_graph_bs: str | None,
             cost_table: Path | None, json_out: Path | None, lenient: bool, max_rows: int,
             slo_tpot_ms: float | None = None) -> None:
    """The --policy comparison: replay, print, and write --json."""
    from spectune.backends.num_steps.trace import read_trace
    from spectune.commands.options import parse_int_list
    from spectune.tune.policy_report import compare, print_comparison, write_comparison_json

    graph_bs = parse_int_list(cuda_graph_bs, "cuda-graph-bs", 1) if cuda_graph_bs else None
    steps = read_trace(trace)
    texts = list(policies) + ([f"config:{config}"] if config is not None else [])
    cmp = compare(steps, texts, sweep=sweep, n_max=n_max, draft_to_cap=draft_to_cap, initial_steps=initial_steps,
                  cuda_graph_bs=graph_bs, cost_table=_cost_table(cost_table), strict=not lenient,
                  slo_tpot_ms=slo_tpot_ms)
    print_comparison(console, cmp, max_rows)
    if json_out is not None:
        write_comparison_json(cmp, json_out)
        console.print(f"wrote {json_out}")
