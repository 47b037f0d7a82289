"""`spectune validate`: run a time-varying workload against every static num_steps and a per-batch-size config, and
say whether the config wins (docs/validate.md). Exit codes: 0 PASS, 1 FAIL, 2 bad input, 130/143 interrupted."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from spectune.commands.options import (LOAD_PANEL, SERVER_PANEL, Device, Draft, Dtype, Host, MaxTokens, NumPrompts,
                                       Port, RequestTimeout, ServerArgs, ServerBin, StartupTimeout, Temperature,
                                       WarmupTimeout,
                                       split_server_args)
from spectune.errors import UserError

_WORK = "Workload"


def validate(
    config: Annotated[Path, typer.Option(help="SGLang adaptive config JSON or vLLM schedule JSON to validate.")],
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
                                             "static throughput, e.g. 0.02 for 2% noise.")] = 0.0,
    repeats: Annotated[int, typer.Option(help="Measure every run this many times, in alternating order (static "
                                         "0..K then config, then config first); tables and the verdict use the "
                                         "means. Use 2 or more on a noisy machine.")] = 1,
    max_failure_rate: Annotated[float, typer.Option(help="A run with a larger share of failed requests is "
                                                    "'failed' (0..1).", rich_help_panel=LOAD_PANEL)] = 0.1,
    request_timeout: RequestTimeout = 600.0,
    warmup_timeout: WarmupTimeout = 300.0,
    output_dir: Annotated[Optional[Path], typer.Option(help="Results folder (default: "
                                                       "results/validate-DATE-TIME).")] = None,
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
    draft: Draft = None,
    algorithm: Annotated[Optional[str], typer.Option(help="Speculative method in the engine's spelling "
                                                     "(default: from the head).", rich_help_panel=SERVER_PANEL)] = None,
    host: Host = "127.0.0.1",
    port: Port = None,
    server_args: ServerArgs = None,
    startup_timeout: StartupTimeout = 600.0,
    server_bin: ServerBin = None,
    api_key_env: Annotated[str, typer.Option(help="Environment variable holding the API key.")] = "OPENAI_API_KEY",
    device: Device = "auto",
    dtype: Dtype = "auto",
) -> None:
    """Run the same changing load against every static num_steps and against a per-batch-size config (SGLang
    adaptive JSON or vLLM schedule); PASS (exit 0) when the config's output throughput is at least the best
    static's (and, with SLOs, its SLO attainment no lower), else FAIL (exit 1)."""
    import signal
    import time

    from rich.console import Console

    from backends.base import BackendOptions
    from spectune.harness import run_with_signals
    from spectune.sweep_plan import ClientTimeouts, parse_int_list
    from spectune.validate import execute
    from spectune.validate_plan import ValidatePlan, config_candidates
    from spectune.validate_report import combine_repeats
    from spectune.workload_spec import load_arrivals, parse_workload

    _, candidates = config_candidates(str(config))  # a bad config fails first, before anything else
    if arrivals is not None and workload is not None:
        raise UserError("give --workload or --arrivals, not both")
    if arrivals is not None:
        wl = load_arrivals(arrivals, phase_seconds, max_concurrency)
    else:
        wl = parse_workload(workload, phase_seconds, cycles, burstiness, max_concurrency, seed)
    step_list = parse_int_list(steps, "steps", 0) if steps else sorted({0, *candidates})
    plan = ValidatePlan(config=str(config), steps=tuple(step_list), workload=wl, dataset=dataset,
                        num_prompts=num_prompts, max_tokens=max_tokens, temperature=temperature, seed=seed,
                        ignore_eos=ignore_eos, api=api, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms,
                        warmup_requests=warmup, tolerance=tolerance, max_failure_rate=max_failure_rate,
                        repeats=repeats)
    plan.validate()
    timeouts = ClientTimeouts(request_timeout, warmup_timeout)
    timeouts.validate()
    if backend.strip().lower() == "openai":
        raise UserError("validate launches its own servers: use --backend local, sglang, vllm or launch")
    extra_args = split_server_args(server_args)
    options = BackendOptions(launch=launch, model=model, draft=draft, algorithm=algorithm, host=host, port=port,
                             server_args=extra_args, startup_timeout_s=startup_timeout, api_key_env=api_key_env,
                             device=device, dtype=dtype, server_bin=server_bin)
    output_dir = output_dir or Path("results") / time.strftime("validate-%Y%m%d-%H%M%S")
    console = Console(highlight=False)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        with _display(console) as display:
            outcome, sig = run_with_signals(
                lambda: execute(plan, backend, options, output_dir, display, config_launch, timeouts))
    except KeyboardInterrupt:
        err.print(f"interrupted (launched servers are killed on exit); partial results in {output_dir}", markup=False)
        raise typer.Exit(130) from None
    if sig is not None or outcome is None:
        err.print(f"interrupted: partial results in {output_dir} (validate.json says which runs finished)",
                  markup=False)
        raise typer.Exit(143 if sig == signal.SIGTERM else 130)
    console.print(_table(combine_repeats(outcome.runs), plan))
    v = outcome.verdict
    console.print(v.line, style="bold green" if v.passed else "bold red", markup=False, soft_wrap=True)
    console.print(f"results in {output_dir} (validate.md, validate.json, requests.jsonl)", markup=False,
                  soft_wrap=True)
    if not v.passed:
        raise typer.Exit(1)


def _display(console: Any) -> Any:
    """A live rich display of a validation: runs done / planned, the current run's elapsed time over its scheduled
    length with its phase and running output tok/s, and one line per finished run."""
    from spectune.display import LiveProgress
    from spectune.validate_plan import ValidateListener
    from spectune.validate_report import row_cells

    class LiveValidateDisplay(LiveProgress, ValidateListener):
        def __init__(self) -> None:
            super().__init__(console)
            self.runs_task = self.run_task = None
            self.t0, self.total, self.tokens, self.phases = 0.0, 1.0, 0, 1

        def started(self, plan: Any, runs: list[str]) -> None:
            self.phases = len(plan.workload.phases)
            self.runs_task = self.progress.add_task("runs", total=len(runs), rate="")
            self.run_task = self.progress.add_task("", total=1, rate="")

        def warning(self, message: str) -> None:
            console.print(f"warning: {message}", style="yellow", markup=False, soft_wrap=True)

        def server_starting(self, run: str) -> None:
            self.progress.update(self.run_task, description=f"{run}: starting the server", completed=0, rate="")

        def run_started(self, run: str, t0: float, total_s: float) -> None:
            self.t0, self.total, self.tokens = t0, total_s, 0
            self.progress.update(self.run_task, description=f"{run}: phase 1/{self.phases}", total=total_s,
                                 completed=0)

        def request_finished(self, run: str, record: Any, phase: int) -> None:
            import time

            elapsed = max(time.perf_counter() - self.t0, 1e-9)
            self.tokens += (record.completion_tokens or 0) if record.ok else 0
            self.progress.update(self.run_task, description=f"{run}: phase {phase}/{self.phases}",
                                 completed=min(elapsed, self.total), rate=f"{self.tokens / elapsed:,.0f} tok/s")

        def run_finished(self, result: dict[str, Any]) -> None:
            self.progress.advance(self.runs_task)
            if result["status"] != "ok":
                line = f"{result['run']} failed: {result.get('error')}"
            else:
                c = dict(zip(("tok", "p50", "p99", "slo", "al", "sw"), row_cells(result["overall"])))
                line = (f"{result['run']} ok: {c['tok']} tok/s, TPOT p50 {c['p50']} ms, p99 {c['p99']} ms, "
                        f"SLO {c['slo']}, AL {c['al']}, switches {c['sw']}")
            console.print(line, markup=False, soft_wrap=True)

    return LiveValidateDisplay()


def _table(runs: list[dict[str, Any]], plan: Any) -> Any:
    """Final rich table: a row per run, a column for the whole run and one per phase; each cell shows output tok/s,
    TPOT p50/p99 (ms), acceptance length, SLO attainment (with SLOs) and switches (when known); the best tok/s of
    each column is marked *."""
    from rich.table import Table

    from spectune.validate_report import row_cells

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
