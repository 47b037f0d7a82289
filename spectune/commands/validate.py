"""`spectune validate`: run a time-varying workload against every static num_steps and a per-batch-size config, and
say whether the config wins (docs/validate.md); with several ``--config``, a bake-off that rules each and names the
winner. Exit codes: 0 PASS, 1 FAIL, 2 bad input, 3 INCONCLUSIVE (behind the best static, but the interval,
server-to-server spread included, reaches it), 130/143 interrupted."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from spectune.commands.options import (LOAD_PANEL, SERVER_PANEL, MaxTokens, NumPrompts, RequestTimeout, ServerOptions,
                                       Temperature, WarmupTimeout, backend_options, ray_options, server_options)
from spectune.core.errors import UserError

if TYPE_CHECKING:
    from spectune.results.validate_doc import ValidateDoc

_WORK = "Workload"


@server_options(
    algorithm_help="Speculative method in the engine's spelling (default: from the head).",
    api_key_env_help="Environment variable holding the API key.",
    # (\\[ in the help: rich markup's escape of a literal bracket)
    ray_help="Run the static and config runs in parallel on a Ray cluster: ADDRESS (ray://host:10001, host:6379) or "
    "auto (RAY_ADDRESS, else a local Ray). Each run (server start, its workload, server stop) is one task on a node, "
    "the load generator beside its server (docs/distributed.md; needs pip install -e \".\\[ray]\").",
)
def validate(
    config: Annotated[list[str], typer.Option(metavar="PATH", help="SGLang adaptive config JSON or vLLM schedule "
                                              "JSON to validate. "
                                              "Repeat it for a bake-off of several configs on the same static runs, "
                                              "each named NAME=PATH or by its file stem.")],
    steps: Annotated[Optional[str], typer.Option(help="Static num_steps to compare with, comma-separated "
                                                 "(default: the config's candidate steps plus 0).")] = None,
    workload: Annotated[Optional[str], typer.Option(help="swing (concurrency 1 and 32 alternating), ramp (1 to 32 "
                                                    "and back), burst (1 then 8 requests/s), or phases such as "
                                                    "c1@30,c32,r4.5 (cN concurrency, rX requests/s, @S seconds). "
                                                    "Default: swing.", rich_help_panel=_WORK)] = None,
    arrivals: Annotated[Optional[Path], typer.Option(help="Replay an arrival trace instead: JSONL of "
                                                     "{\"t\": seconds} send offsets, optional \"category\".",
                                                     rich_help_panel=_WORK)] = None,
    phase_seconds: Annotated[float, typer.Option(help="s per phase (phases without @S; trace windows).",
                                                 rich_help_panel=_WORK)] = 60.0,
    cycles: Annotated[Optional[int], typer.Option(help="Repeats of the phase list (default: swing 2, ramp 1, "
                                                  "burst 2, a phase list 1).", rich_help_panel=_WORK)] = None,
    burstiness: Annotated[float, typer.Option(help="Gamma shape of open-loop inter-arrival times (1 = Poisson, "
                                              "below 1 burstier).", rich_help_panel=_WORK)] = 1.0,
    max_concurrency: Annotated[int, typer.Option(help="Cap on requests in flight in open-loop phases and traces "
                                                 "(later arrivals wait; the wait counts in TTFT).",
                                                 rich_help_panel=_WORK)] = 64,
    dataset: Annotated[str, typer.Option(help="Prompts: mt-bench, humaneval, sharegpt:PATH, spec-bench:PATH, "
                                         "jsonl:PATH or random:WORDS.", rich_help_panel=LOAD_PANEL)] = "mt-bench",
    num_prompts: NumPrompts = 80,
    max_tokens: MaxTokens = 256,
    temperature: Temperature = 0.0,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="Ask the server to ignore EOS.",
                                             rich_help_panel=LOAD_PANEL)] = False,
    api: Annotated[str, typer.Option(help="chat or completions.", rich_help_panel=LOAD_PANEL)] = "chat",
    slo_ttft_ms: Annotated[Optional[float], typer.Option(help="TTFT SLO, ms (SLO attainment; the config must not "
                                                         "do worse).", rich_help_panel=LOAD_PANEL)] = None,
    slo_tpot_ms: Annotated[Optional[float], typer.Option(help="TPOT SLO, ms (as --slo-ttft-ms).",
                                                         rich_help_panel=LOAD_PANEL)] = None,
    seed: Annotated[int, typer.Option(help="Seed of the prompt sample and open-loop arrivals.",
                                      rich_help_panel=LOAD_PANEL)] = 0,
    warmup: Annotated[Optional[int], typer.Option(help="Unrecorded warm-up requests before each run (default: "
                                                  "min(first phase concurrency, 4)).",
                                                  rich_help_panel=LOAD_PANEL)] = None,
    tolerance: Annotated[float, typer.Option(help="PASS when the config reaches (1 - tolerance) x the best "
                                             "static throughput, e.g. 0.02 to accept a 2% loss (noise is in the "
                                             "intervals already).")] = 0.0,
    repeats: Annotated[int, typer.Option(help="Measure every run this many times (on fresh servers unless "
                                         "--servers kept), in alternating order (static 0..K then config, "
                                         "then config first); tables and the verdict use the means, and every "
                                         "interval the server-to-server spread of the repeats. 1: an A/A run (a "
                                         "second server of one static num_steps) measures that spread "
                                         "instead.")] = 3,
    servers: Annotated[str, typer.Option(help="How the servers are held: one (one up at a time, each run on a fresh "
                                         "one), together (a repeat's servers up at once, its runs back to back; "
                                         "fresh every repeat) or kept (started once, kept up through all repeats: "
                                         "more repeats per hour where the machine's speed drifts, but two processes "
                                         "of one server are never compared). together and kept need room for all "
                                         "servers at once.")] = "one",
    max_failure_rate: Annotated[float, typer.Option(help="A run with a larger share of failed requests is "
                                                    "'failed' (0..1).", rich_help_panel=LOAD_PANEL)] = 0.1,
    request_timeout: RequestTimeout = 600.0,
    warmup_timeout: WarmupTimeout = 300.0,
    output_dir: Annotated[Optional[Path], typer.Option(help="Results folder (default: "
                                                       "results/validate-DATE-TIME).")] = None,
    rule_again: Annotated[bool, typer.Option("--rule-again", help="Measure nothing: rule again on the finished "
                                             "validation in --output-dir with this version's verdict and "
                                             "--config's recommendation.json, rewriting validate.json and "
                                             "validate.md.")] = False,
    backend: Annotated[str, typer.Option(help="local (bundled engine), sglang, vllm, llamacpp (llama-server, "
                                         "static num_steps only) or launch (command template).")] = "local",
    launch: Annotated[Optional[str], typer.Option(help="Server command template (launch backend) with {steps}, "
                                                  "{draft_tokens}, {port}, {host}, {model}, {draft}, "
                                                  "{adaptive_config}.", rich_help_panel=SERVER_PANEL)] = None,
    config_launch: Annotated[Optional[str], typer.Option(help="Template for the config run (launch backend; "
                                                         "default: --launch), e.g. with adaptive flags and "
                                                         "{adaptive_config}.", rich_help_panel=SERVER_PANEL)] = None,
    model: Annotated[Optional[str], typer.Option(help="Target model (path or name).", rich_help_panel=SERVER_PANEL)]
    = None,
    *,
    server: ServerOptions,
) -> None:
    """Run the same changing load against every static num_steps and against a per-batch-size config (SGLang
    adaptive JSON or vLLM schedule); PASS (exit 0) when the config's output throughput is at least the best
    static's (and, with SLOs, its SLO attainment no lower), FAIL (exit 1) when it loses beyond the interval,
    INCONCLUSIVE (exit 3) when it is behind but the interval (server-to-server spread included) reaches the best
    static. A config that is one static num_steps
    (one candidate everywhere) is not run again: the verdict asks whether another static beats it."""
    from rich.console import Console

    from spectune.measure.signals import run_with_signals
    from spectune.commands.options import parse_int_list
    from spectune.measure.load_settings import ClientTimeouts
    from spectune.validate.run import execute
    from spectune.validate.plan import BakeoffConfig, ValidatePlan, config_candidates, parse_configs
    from spectune.results.validate_doc import RecordedPrediction, ValidateDoc
    from spectune.results.validate_run import ValidateRun
    from spectune.validate.repeats import combine_repeats
    from spectune.validate.display import LiveValidateDisplay, results_table
    from spectune.validate.verdict import spread_line
    from spectune.measure.workload import load_arrivals, parse_workload

    pairs = parse_configs(config)  # a bad config fails first, before anything else
    bakeoff = tuple(BakeoffConfig.read(n, p) for n, p in pairs) if len(pairs) > 1 else ()
    candidates = (sorted({k for c in bakeoff for k in c.candidates}) if bakeoff
                  else config_candidates(pairs[0][1])[1])
    if rule_again:
        _rule_again(pairs, output_dir)
        return
    cluster = ray_options(server.ray, server.ray_resources)
    if arrivals is not None and workload is not None:
        raise UserError("give --workload or --arrivals, not both")
    if arrivals is not None:
        wl = load_arrivals(arrivals, phase_seconds, max_concurrency)
    else:
        wl = parse_workload(workload, phase_seconds, cycles, burstiness, max_concurrency, seed)
    step_list = parse_int_list(steps, "steps", 0) if steps else sorted({0, *candidates})
    plan = ValidatePlan(config="" if bakeoff else pairs[0][1], steps=tuple(step_list), workload=wl, dataset=dataset,
                        num_prompts=num_prompts, max_tokens=max_tokens, temperature=temperature, seed=seed,
                        ignore_eos=ignore_eos, api=api, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms,
                        warmup_requests=warmup, tolerance=tolerance, max_failure_rate=max_failure_rate,
                        repeats=repeats, servers=servers.strip().lower(), bakeoff=bakeoff)
    plan.validate()
    timeouts = ClientTimeouts(request_timeout, warmup_timeout)
    timeouts.validate()
    if backend.strip().lower() == "openai":
        raise UserError("validate launches its own servers: use --backend local, sglang, vllm or launch")
    options = backend_options(server, launch=launch, model=model)
    output_dir = output_dir or Path("results") / time.strftime("validate-%Y%m%d-%H%M%S")
    console = Console(highlight=False)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        with LiveValidateDisplay(console) as display:
            outcome, sig = run_with_signals(
                lambda: execute(plan, backend, options, output_dir, display, config_launch, timeouts, cluster))
    except KeyboardInterrupt:
        err.print(f"interrupted (launched servers are killed on exit); partial results in {output_dir}", markup=False)
        raise typer.Exit(130) from None
    if sig is not None or outcome is None:
        err.print(f"interrupted: partial results in {output_dir} (validate.json says which runs finished)",
                  markup=False)
        raise typer.Exit(143 if sig == signal.SIGTERM else 130)
    console.print(results_table(combine_repeats([ValidateRun.from_dict(r) for r in outcome.runs]), plan))
    if outcome.bakeoff is not None:
        _print_bakeoff(console, ValidateDoc.from_json({"plan": plan.to_json(), "bakeoff": outcome.bakeoff}))
    v = outcome.verdict
    console.print(v.line, style=_STYLE.get(v.outcome, "bold red"), markup=False, soft_wrap=True)
    spread = spread_line(outcome.instance_spread, v.confidence)
    if spread:
        console.print(spread, markup=False, soft_wrap=True)
    if outcome.phase_check:
        console.print(f"per phase: {outcome.phase_check['line']}", markup=False, soft_wrap=True)
    from spectune.validate.prediction import summary_lines

    for line in summary_lines(RecordedPrediction.from_json(outcome.prediction)):
        console.print(line, markup=False, soft_wrap=True)
    console.print(f"results in {output_dir} (validate.md, validate.json, requests.jsonl)", markup=False,
                  soft_wrap=True)
    if v.exit_code:
        raise typer.Exit(v.exit_code)


_STYLE = {"PASS": "bold green", "FAIL": "bold red", "INCONCLUSIVE": "bold yellow"}


def _print_bakeoff(console, doc: ValidateDoc) -> None:
    """A bake-off's table and one verdict line per config (``NAME: PASS: ...``), before the overall line
    (validate.json's ``bakeoff``, and its ``plan`` for the phases and SLOs)."""
    from spectune.validate.display import bakeoff_table

    if doc.bakeoff is None:
        return
    console.print(bakeoff_table(doc.bakeoff, doc.plan))
    for row in doc.bakeoff.configs:
        v = row.verdict
        console.print(f"{row.name}: {v.line if v else None}", style=_STYLE.get(v.outcome if v else "", "bold red"),
                      markup=False, soft_wrap=True)


def _rule_again(configs: list[tuple[str, str]], output_dir: Optional[Path]) -> None:
    """``--rule-again``: print the new verdict, spread and prediction lines (a bake-off, several ``configs``: its
    tables and every config's line first); exit 1 on FAIL, 3 on INCONCLUSIVE. ``configs``: (name, path) of each
    ``--config``."""
    from rich.console import Console

    from spectune.results.validate_doc import RecordedPrediction, ValidateDoc
    from spectune.validate.prediction import summary_lines
    from spectune.validate.run import rule_again, rule_again_bakeoff
    from spectune.validate.verdict import spread_line

    if output_dir is None:
        raise UserError("--rule-again needs --output-dir: the folder of the finished validation")
    console = Console(highlight=False)
    if len(configs) > 1:
        v, meta = rule_again_bakeoff(output_dir, [n for n, _ in configs])
        prediction, phases, spread = None, None, meta.get("instance_spread")
        _print_bakeoff(console, ValidateDoc.from_json(meta))
    else:
        v, prediction, phases, spread = rule_again(output_dir, configs[0][1])
    console.print(v.line, style=_STYLE.get(v.outcome, "bold red"), markup=False, soft_wrap=True)
    line = spread_line(spread, v.confidence)
    if line:
        console.print(line, markup=False, soft_wrap=True)
    if phases:
        console.print(f"per phase: {phases['line']}", markup=False, soft_wrap=True)
    for line in summary_lines(RecordedPrediction.from_json(prediction)):
        console.print(line, markup=False, soft_wrap=True)
    console.print(f"rewrote {output_dir}/validate.json and validate.md", markup=False, soft_wrap=True)
    if v.exit_code:
        raise typer.Exit(v.exit_code)
