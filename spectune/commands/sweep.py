"""`spectune sweep`: measure every num_steps x concurrency point against a backend (docs/sweep.md)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from spectune.commands.options import (LOAD_PANEL, SERVER_PANEL, MaxTokens, NumPrompts, RequestTimeout, ServerOptions,
                                       Temperature, WarmupTimeout, backend_options, ray_options, server_options)
from spectune.core.errors import UserError


def parse_endpoints(values: list[str]) -> dict[int, str] | None:
    """``--endpoint [K=]URL`` values -> {K: URL}, with -1 for a URL given without ``K=`` (every num_steps).

    Raises:
        UserError: a non-integer or negative K, or the same K twice.
    """
    out: dict[int, str] = {}
    for value in values:
        head, sep, url = value.partition("=")
        if sep and not head.strip().lower().startswith(("http:", "https:")) and "://" not in head:
            try:
                k = int(head)
            except ValueError:
                raise UserError(f"bad --endpoint {value!r}: use K=URL (K a num_steps >= 0) or just URL") from None
            if k < 0:
                raise UserError(f"bad --endpoint {value!r}: num_steps must be >= 0")
        else:
            k, url = -1, value
        if k in out:
            which = "without K=" if k == -1 else f"for num_steps {k}"
            raise UserError(f"two --endpoint values {which}: give one per num_steps")
        out[k] = url.strip()
    return out or None


@server_options(
    algorithm_help="Speculative method in the engine's spelling (EAGLE/EAGLE3, eagle/eagle3; llamacpp: eagle3 or "
    "draft) (default: from the head).",
    api_key_env_help="Environment variable holding the API key (sent as a Bearer token).",
    # (\\[ in the help: rich markup's escape of a literal bracket)
    ray_help="Spread the num_steps blocks over a Ray cluster: ADDRESS (ray://host:10001, host:6379) or auto "
    "(RAY_ADDRESS, else a local Ray). Each block (server start, its points, server stop) runs as one task on a node, "
    "the load generator beside its server (docs/distributed.md; needs pip install -e \".\\[ray]\").",
)
def sweep(
    steps: Annotated[str, typer.Option(help="num_steps values K to sweep, comma-separated (0 = no speculation).")]
    = "0,1,2,3,5",
    concurrency: Annotated[str, typer.Option(help="Closed-loop concurrencies (requests in flight), comma-separated.")]
    = "1,2,4,8,16",
    dataset: Annotated[str, typer.Option(help="Prompts: mt-bench, humaneval, sharegpt[:PATH], spec-bench:PATH, "
                                         "jsonl:PATH or random[:WORDS].", rich_help_panel=LOAD_PANEL)] = "mt-bench",
    num_prompts: NumPrompts = 80,
    max_tokens: MaxTokens = 256,
    temperature: Temperature = 0.0,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="Ask the server to ignore EOS (every request "
                                             "produces --max-tokens).", rich_help_panel=LOAD_PANEL)] = False,
    api: Annotated[str, typer.Option(help="chat (/v1/chat/completions) or completions (/v1/completions).",
                                     rich_help_panel=LOAD_PANEL)] = "chat",
    slo_ttft_ms: Annotated[Optional[float], typer.Option(help="TTFT SLO, ms (slo_attainment, goodput).",
                                                         rich_help_panel=LOAD_PANEL)] = None,
    slo_tpot_ms: Annotated[Optional[float], typer.Option(help="TPOT SLO, ms (slo_attainment, goodput).",
                                                         rich_help_panel=LOAD_PANEL)] = None,
    repeats: Annotated[int, typer.Option(help="Runs of every (num_steps, concurrency) cell; the table shows "
                                         "medians.", rich_help_panel=LOAD_PANEL)] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the prompt sample.", rich_help_panel=LOAD_PANEL)] = 0,
    requests_per_point: Annotated[Optional[int], typer.Option(help="Measured requests per point (default: "
                                                              "max(num-prompts, 4 x concurrency), at most "
                                                              "max(num-prompts, 1024)).",
                                                              rich_help_panel=LOAD_PANEL)] = None,
    duration: Annotated[Optional[float], typer.Option(help="Cap on a point's sending time, s (requests in flight "
                                                      "then finish).", rich_help_panel=LOAD_PANEL)] = None,
    warmup: Annotated[Optional[int], typer.Option(help="Unrecorded warm-up requests before each point "
                                                  "(default: min(concurrency, 4)).",
                                                  rich_help_panel=LOAD_PANEL)] = None,
    max_failure_rate: Annotated[float, typer.Option(help="A point with a larger share of failed requests is "
                                                    "'failed' (0..1).", rich_help_panel=LOAD_PANEL)] = 0.1,
    plan_kind: Annotated[str, typer.Option("--plan", help="grid: measure every num_steps x concurrency point. "
                                           "guided: measure only the cells that could still be the best at each "
                                           "concurrency (predicting the rest from per-position acceptance and a "
                                           "fitted step-time model) until the choice is settled.")] = "grid",
    budget: Annotated[Optional[str], typer.Option(help="Guided plan: at most this many measured points (e.g. 12) "
                                                  "or this much measuring time (e.g. 600s, 10m), server starts "
                                                  "included.")] = None,
    objective: Annotated[str, typer.Option(help="What the guided plan settles: throughput (max output tokens/s) "
                                           "or tpot (min TPOT p50).")] = "throughput",
    confidence: Annotated[float, typer.Option(help="Confidence of the guided plan's intervals and of the drift "
                                              "check (0.5-0.999).")] = 0.95,
    noise_band: Annotated[float, typer.Option(help="PCT: the guided plan treats differences below this as ties "
                                              "(the smaller num_steps wins), as spectune recommend does.")] = 2.0,
    early_stop: Annotated[Optional[bool], typer.Option("--early-stop/--no-early-stop", help="End a point's window "
                                                       "once its interval settles the decision it serves (clearly "
                                                       "below or above the best measured at its concurrency, or "
                                                       "tight enough), after at least two closed-loop waves. "
                                                       "Default: on for --plan guided, off for the grid.")] = None,
    order: Annotated[str, typer.Option(help="auto: interleave num_steps at each concurrency where the backend "
                                       "switches cheaply (local, llamacpp), else one num_steps block after another; "
                                       "or interleaved / blocks.")] = "auto",
    drift_check: Annotated[bool, typer.Option("--drift-check/--no-drift-check", help="Measure a reference cell "
                                              "again at the end (and at the end of each block) and report whether "
                                              "the machine drifted.")] = True,
    schedule_server: Annotated[str, typer.Option(help="Also measure the engine's schedule server (the server a "
                                                 "per-batch-size config runs: vLLM's drafter works at K=0 too) pinned "
                                                 "to each num_steps, into OUTPUT_DIR/schedule-server, alternating "
                                                 "with the static blocks: auto (where it can cost more: launched vLLM "
                                                 "and SGLang, grid plans), on, or off.")] = "auto",
    p_min: Annotated[Optional[str], typer.Option("--p-min", help="Also measure draft-confidence cutoffs P, "
                                                 "comma-separated probabilities (e.g. 0,0.3,0.6,0.9): one server per "
                                                 "P at the largest --steps (the draft's cap), where a row stops "
                                                 "drafting at the first draft token whose probability is under P "
                                                 "(llamacpp: --spec-draft-p-min), into OUTPUT_DIR/p-min/P, after the "
                                                 "static cells.")] = None,
    request_timeout: RequestTimeout = 600.0,
    warmup_timeout: WarmupTimeout = 300.0,
    output_dir: Annotated[Optional[Path], typer.Option(help="Results folder (default: results/sweep-DATE-TIME).")]
    = None,
    resume: Annotated[bool, typer.Option("--resume", help="Finish an interrupted sweep in --output-dir (same "
                                         "options): only missing points run.")] = False,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="With --resume: also re-run failed "
                                               "points.")] = False,
    backend: Annotated[str, typer.Option(help="openai (running servers), launch (command template), sglang, "
                                         "vllm, llamacpp (llama-server) or local (bundled engine).")] = "local",
    endpoint: Annotated[Optional[List[str]], typer.Option(help="[K=]URL of a running server for num_steps K, or "
                                                          "for every K without 'K='. Repeatable.")] = None,
    launch: Annotated[Optional[str], typer.Option(help="Server command template (launch backend) with {steps}, "
                                                  "{draft_tokens}, {port}, {host}, {model}, {draft}.",
                                                  rich_help_panel=SERVER_PANEL)] = None,
    model: Annotated[Optional[str], typer.Option(help="Target model (path or name); also the model name sent "
                                                 "when the server lists it.", rich_help_panel=SERVER_PANEL)] = None,
    *,
    server: ServerOptions,
) -> None:
    """Measure TPOT, TTFT, ITL, throughput, acceptance length and SLO attainment for every num_steps x
    concurrency point; results go to --output-dir (sweep.json, requests.jsonl, points.jsonl, summary.csv)."""
    from rich.console import Console

    from spectune.sweep.display import LiveDisplay, summary_table
    from spectune.sweep.run import run_blocking
    from spectune.commands.options import parse_int_list
    from spectune.measure.load_settings import ClientTimeouts
    from spectune.sweep.plan import SweepPlan, parse_budget

    from spectune.sweep.p_min import p_min_lines, parse_p_min_list

    cutoffs = parse_p_min_list(p_min)
    cluster = ray_options(server.ray, server.ray_resources)
    if retry_failed and not resume:
        raise UserError("--retry-failed only works with --resume --output-dir DIR")
    plan = SweepPlan(
        steps=tuple(parse_int_list(steps, "steps", 0)),
        concurrency=tuple(parse_int_list(concurrency, "concurrency", 1)),
        repeats=repeats, dataset=dataset, num_prompts=num_prompts, max_tokens=max_tokens, temperature=temperature,
        seed=seed, ignore_eos=ignore_eos, api=api, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms,
        warmup_requests=warmup, requests_per_point=requests_per_point, duration_per_point_s=duration,
        max_failure_rate=max_failure_rate, design=plan_kind, order=order, drift_check=drift_check,
        objective=objective, budget_points=parse_budget(budget)[0], budget_s=parse_budget(budget)[1],
        confidence=confidence, noise_band=noise_band / 100, early_stop=early_stop,
    )
    plan.validate()
    timeouts = ClientTimeouts(request_timeout, warmup_timeout)
    timeouts.validate()
    options = backend_options(server, launch=launch, model=model, endpoints=parse_endpoints(endpoint or []))
    if output_dir is None:
        if resume:
            raise UserError("--resume needs --output-dir DIR (the folder of the sweep to finish)")
        output_dir = Path("results") / time.strftime("sweep-%Y%m%d-%H%M%S")
    console = Console(highlight=False)
    try:
        with LiveDisplay(console) as display:
            outcome = run_blocking(plan, backend, options, output_dir, resume, retry_failed, display, timeouts,
                                   cluster, schedule_server, cutoffs)
    except KeyboardInterrupt:
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            f"interrupted (launched servers are killed on exit); resume with --resume --output-dir {output_dir}",
            markup=False)
        raise typer.Exit(130) from None
    if outcome.points:
        from spectune.results.batch_acceptance import batch_dependent_acceptance

        from spectune.sweep.display import outcome_lines
        from spectune.tune.intervals import throughput_intervals
        from spectune.results.folder import SweepFolder
        from spectune.results.schema import SCHEDULE_FOLDER

        console.print(summary_table(outcome.points, plan.steps, plan.concurrency, throughput_intervals(output_dir),
                                    outcome.predicted))
        for line in outcome_lines(outcome):
            console.print(line, soft_wrap=True, markup=False)
        for finding in batch_dependent_acceptance(outcome.points):
            console.print(f"finding: {finding.sentence()}", soft_wrap=True, markup=False)
        sched = output_dir / SCHEDULE_FOLDER
        pinned = SweepFolder(sched).read_points() if (sched / "points.jsonl").is_file() else []
        if pinned:
            console.print(f"the engine's schedule server (what a per-batch-size config runs), pinned to each "
                          f"num_steps ({sched}):", soft_wrap=True, markup=False)
            console.print(summary_table(pinned, sorted({p.steps for p in pinned}), plan.concurrency,
                                        throughput_intervals(sched), []))
        for line in p_min_lines(output_dir):
            console.print(line, soft_wrap=True, markup=False)
    failed = sum(p.status != "ok" for p in outcome.points)
    if outcome.interrupted is not None:
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        if (output_dir / "sweep.json").exists():
            err.print(f"interrupted: {len(outcome.points)} points kept; resume with --resume --output-dir "
                      f"{output_dir} (same options)", markup=False)
        else:
            err.print("interrupted before anything was measured")
        raise typer.Exit(143 if outcome.interrupted == signal.SIGTERM else 130)
    total = len(plan.points()) if plan.design == "grid" else len(outcome.points)
    console.print(f"{len(outcome.points)} of {total} points in {output_dir} ({outcome.ran} measured now, "
                  f"{failed} failed); next: spectune recommend {output_dir}", soft_wrap=True, markup=False)
