"""recommendation.md: the choice per concurrency, the slots, every config file with its launch line, and why
(:func:`recommendation_markdown`); :func:`cell_grid` is also the table ``spectune recommend`` prints."""

from __future__ import annotations

import math

from spectune.backends.formats import Plan, engine_formats
from spectune.backends.formats.base import fmt as _fmt
from spectune.backends.formats.base import md_table as _md_table
from spectune.backends.num_steps.sglang_config import SlotConfig, parse_sglang_adaptive_config
from spectune.core.json_types import JsonObject
from spectune.measure.workload import parse_workload
from spectune.results.batch_acceptance import BatchAcceptanceFinding
from spectune.results.primary import MixPricing
from spectune.results.schedule_server import RecordedScheduleServer
from spectune.results.validate_doc import RecordedWorkload
from spectune.tune.configs import SGLangLadders, engine_plan
from spectune.tune.predict import predict_validate
from spectune.tune.mix import mix_text
from spectune.tune.gain import ServerCost
from spectune.tune.ladders import SlotJson
from spectune.tune.recommend import OBJECTIVES, Recommendation, Slot
from spectune.tune.replay import slot_switch_rate


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


def _ladders(config: JsonObject, preset: str) -> dict[int, SlotConfig]:
    """The slots of the SGLang config ``recommend`` wrote for ``preset``, by lower bound (as SGLang parses it)."""
    return {s.lower_bound: s for s in parse_sglang_adaptive_config(config, source=preset, strict=False).slots}


def _ladder(slot: SlotConfig) -> str:
    text = f"{list(slot.candidate_steps)} down {slot.down_hysteresis:g} up {slot.up_hysteresis:g}"
    return text + (f" ceiling {slot.ceiling_coeff:g}" if slot.ceiling_coeff else "")


def _rate(rec: Recommendation, slot: Slot, cfg: SlotJson) -> str:
    rate = slot_switch_rate(rec, slot, cfg)
    return f", {'?' if rate is None else format(rate, '.1f')} sw/min"


def primary_section(rec: Recommendation) -> list[str]:
    """recommendation.md's "Primary recommendation": the per-batch-size schedule with the comparisons where it
    beats the best static num_steps beyond the noise band, or that static num_steps for every engine and why
    (:mod:`spectune.tune.gain`)."""
    p = rec.primary
    if not p:
        return []
    if p.kind == "static":
        k = p.num_steps
        before = ", ".join(f"{s.lower}-{s.upper if s.upper is not None else ''}: K={s.steps}"
                           for s in rec.schedule_slots)
        return ["## Primary recommendation\n",
                f"**Static num_steps K={k} for every engine** (`best-static.json`; the SGLang, vLLM and TensorRT-LLM "
                f"files below carry the same K at every batch size): {p.reason}."
                + (f" The per-batch-size choice would have been {before}." if len(rec.schedule_slots) > 1 else "")
                + "\n", *(mix_table(p.mix) if p.mix else [])]
    if p.mix:
        return ["## Primary recommendation\n",
                f"**The per-batch-size schedule** (`sglang-adaptive-custom.json`, the vLLM and TensorRT-LLM "
                f"schedules): {p.reason}.\n", *mix_table(p.mix)]
    return ["## Primary recommendation\n",
            f"**The per-batch-size schedule** (`sglang-adaptive-custom.json`, the vLLM and TensorRT-LLM schedules): "
            f"where it differs from the best static K={rec.best_static} the sweep measured a gain beyond the noise "
            f"band: {p.reason}.\n"]


def mix_table(mix: MixPricing) -> list[str]:
    """The answers priced on ``recommend --mix``'s load (``primary.mix``, :mod:`spectune.tune.mix`): output
    tokens/s the load streams and the paired ratio to the best, one row each."""
    rows = []
    for a in mix.answers:
        lo, hi = a.low, a.high
        iv = f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None and math.isfinite(lo) \
            and math.isfinite(hi) and a.ratio != 1.0 else ""
        rows.append([a.answer, f"{a.output_tok_s:.4g}", f"{a.ratio:.3f}x{iv}"])
    return [f"\nOn the load (concurrency: share of time) {mix_text(mix.shares)}, noise band {mix.band:.1%}:\n",
            _md_table(["answer", "output tok/s on the load", f"ratio to the best [{float(mix.confidence):.0%}]"],
                      rows), ""]


def floor_cost_sentence(cost: ServerCost, engine: str, objective: str) -> str:
    """One line of a schedule server's measured cost: ``K=0 inside a vllm schedule server: 12.3% slower than no
    drafter at concurrency 16 (throughput ratio 0.877x [0.850, 0.905], 95%)`` (``cost``: one entry of
    :func:`spectune.tune.recommend.schedule_server_costs`)."""
    k, conc, worse = cost["steps"], cost["concurrency"], cost["cost"]
    other = "no drafter" if k == 0 else f"the static K={k} server"
    how = f"{abs(worse):.1%} {'slower' if worse > 0 else 'faster'}" if objective != "tpot" else \
        f"TPOT {abs(worse):.1%} {'higher' if worse > 0 else 'lower'}"
    lo, hi = cost["low"], cost["high"]
    band = f" [{lo:.3f}, {hi:.3f}], {cost['confidence']:.0%}" if math.isfinite(lo) and math.isfinite(hi) else ""
    return (f"K={k} inside a {engine} schedule server: {how} than {other} at concurrency {conc} ({objective} ratio "
            f"{cost['ratio']:.3f}x{band}; {cost['verdict']} beyond the noise band)")


def _or_unknown(x: object) -> str:
    """``x`` as text, ``?`` where the file did not say."""
    return "?" if x is None else str(x)


def schedule_server_section(rec: Recommendation) -> list[str]:
    """recommendation.md's "Schedule server": what the engine's per-batch-size config runs, its measured cost against
    the static servers at each pinned num_steps, and the three answers side by side per concurrency (no drafter,
    the best static num_steps, the schedule priced on the schedule server). Empty without schedule-server cells."""
    if not rec.schedule_cells:
        return []
    info = rec.schedule_server or RecordedScheduleServer()
    engine = str(info.engine or "engine's")
    o = rec.options
    out = ["\n## Schedule server\n",
           f"A per-batch-size config runs on the engine's schedule server, not on the static servers the sweep "
           f"measured per num_steps: {engine}, pinned as `{_or_unknown(info.pinned)}` with max K "
           f"{_or_unknown(info.max_k)} (`{_or_unknown(info.source)}`). The sweep measured it at each num_steps "
           "(`schedule-server/`), and the schedule's slots are chosen and priced on those cells.\n"]
    out += [f"- {floor_cost_sentence(c, engine, o.objective)}" for c in rec.server_costs]
    col = OBJECTIVES[o.objective][0]
    rows = []
    for sch in rec.schedule_choices:
        conc = sch.concurrency
        k0, ks = rec.cell(0, conc), rec.cell(rec.best_static, conc) if rec.best_static is not None else None
        kk = rec.slot_cell(sch.steps, conc) if sch.steps is not None else None
        val = lambda c: c.interval.text(".4g") if c is not None and c.status == "ok" else "-"  # noqa: E731
        rows.append([str(conc), val(k0), f"K={rec.best_static}: {val(ks)}",
                     f"K={sch.steps}: {val(kk)}" if kk is not None else "-"])
    out += ["\nThe three answers per concurrency (`" + col + "`, median [interval]): no drafter (static K=0), the "
            "best static num_steps, the schedule's choice on the schedule server. The primary recommendation is "
            "the one that wins beyond the noise band, else the simplest (no drafter, then one static num_steps).\n",
            _md_table(["concurrency", "no drafter", "best static", "schedule (schedule server)"], rows), ""]
    return out


def slot_key_sentence(rec: Recommendation) -> str:
    """What recommendation.md says the batch-size slots are keyed on: the engine's measured running batch size
    (and its gauge) or, when some chosen cell lacks it, concurrency as the proxy."""
    if rec.batch_sizes:
        return (f"Slots are keyed on the engine's measured running batch size (`batch_size_mean`, from "
                f"`{rec.batch_size_source}`: its time average over each chosen cell's window), which SGLang and vLLM "
                "route by.")
    return ("Concurrency is used as the batch-size proxy: the sweep has no measured running batch size for every "
            "chosen cell.")


def recommendation_markdown(rec: Recommendation, files: dict[str, str], configs: SGLangLadders | None,
                            notes: dict[str, list[str]], source: str,
                            algorithm: tuple[str | None, str] = (None, "unknown"), target: str | None = None,
                            plan: Plan | None = None) -> str:
    """``recommendation.md``: options, the cell table, reasoning per concurrency, slots and their SGLang ladders,
    each engine format's launch line (:meth:`~spectune.backends.formats.EngineFormat.launch_line`; ``algorithm``:
    the sweep's draft-head method and how it was found), predicted gains vs the best static num_steps and vs no
    speculation, each format's own section, the emitted files, notes and warnings. ``plan``: what the formats
    wrote from (default: :func:`spectune.tune.configs.engine_plan` of ``rec``, ``configs``, ``algorithm`` and
    ``target``)."""
    if plan is None:
        plan = engine_plan(rec, configs, algorithm, target=target)
    engines = engine_formats()
    o = rec.options
    col, direction, unit = OBJECTIVES[o.objective]
    out = [f"# spectune recommendation\n\nSource: `{source}`. Objective: **{o.objective}** "
           f"({'maximise' if direction == 'max' else 'minimise'} `{col}`, {unit}). Noise band {o.noise_band:.1%}, "
           f"max spread {o.max_spread:.1%}, min SLO attainment {o.min_slo_attainment:g}, slot boundary rule "
           f"`{o.boundary}`. {slot_key_sentence(rec)}\n",
           *primary_section(rec), *schedule_server_section(rec),
           "## Measured cells (median over repeats)\n",
           "`*` chosen, `~` noisy (spread above the limit), `(slo)` breaks the SLO, `(pred)` predicted by a guided "
           "sweep (not measured), `FAILED` a repeat failed. "
           f"`[low, high]`: {o.confidence:.0%} bootstrap interval (over requests and repeats; see docs/recommend.md)."
           "\n",
           _md_table(*cell_grid(rec)), "\n## Reasoning per concurrency\n"]
    out += [f"- **concurrency {ch.concurrency}** -> {ch.reason}" for ch in rec.choices]
    by_preset = configs.by_preset() if configs is not None else {}
    presets = list(by_preset)
    ladders = {p: _ladders(by_preset[p], p) for p in presets}
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
                 + [_ladder(ladders[p][s.lower]) + _rate(rec, s, by_preset[p][str(s.lower)]) for p in presets]
                 for s in rec.slots])]
    out += [line for engine in engines if (line := engine.launch_line(plan, files)) is not None]
    static = rec.best_static
    score = rec.static_scores.get(static, math.nan) if static is not None else math.nan
    out += [f"\nBest single static num_steps: **K={static}** (geometric mean of objective / per-concurrency best = "
            f"{_fmt(score, '.3f')}). Scores: " + ", ".join(f"K={k}: {v:.3f}" for k, v in rec.static_scores.items())
            + (f". Scores within the {rec.options.noise_band:.0%} noise band of the top score count as ties, which go "
               "to the smaller num_steps." if rec.static_scores and static is not None
               and rec.static_scores[static] < max(rec.static_scores.values()) else ""),
            "\n## Predicted performance (measured cells" + (": the schedule on its schedule server" if
                                                             rec.schedule_cells else "") + ")\n",
            _md_table(["concurrency", "K rec", "tok/s rec", "TPOT ms rec", "K static", "tok/s static",
                       "TPOT static", "tok/s K=0", "TPOT K=0", "tput vs static", "tput vs K=0", "TPOT vs K=0"],
                      [[str(r["concurrency"]), str(r["recommended"]), _fmt(r["rec_tput"]), _fmt(r["rec_tpot"]),
                        str(r["static"]), _fmt(r["static_tput"]), _fmt(r["static_tpot"]), _fmt(r["k0_tput"]),
                        _fmt(r["k0_tpot"]), _fmt(r["tput_vs_static"], ".3f"), _fmt(r["tput_vs_k0"], ".3f"),
                        _fmt(r["tpot_vs_k0"], ".3f")] for r in versus_static(rec)]),
            ]
    out += validate_section(rec, configs.custom if configs is not None else None)
    for engine in engines:
        out += engine.section(plan)
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
    wl = RecordedWorkload.from_json(parse_workload("swing").to_json())
    pred = predict_validate(rec.cells, rec.options.objective, wl, rec.steps,
                            parse_sglang_adaptive_config(custom, strict=True), 256, config_cells=rec.schedule_cells)
    if not pred:
        return []
    labels = [f"{p.label} ({p.start_s:g}-{p.end_s:g} s)" for p in wl.phases]
    cell = lambda v: f"{v[0]:.4g} [{v[1]:.4g}, {v[2]:.4g}]"  # noqa: E731
    return ["\n## What `spectune validate` should measure (swing workload)\n",
            "Output tok/s per phase predicted from the measured cells (a fluid model of the closed loop: the "
            "requests in flight at a drop finish first; docs/validate.md), with the interval from the cells' own "
            "intervals; validate prints these beside what it measures when this file sits next to the config, and "
            "marks a miss only outside the interval widened by the server-to-server spread it measures."
            "\n",
            _md_table(["run", "overall"] + labels,
                      [[name, cell(p.overall)] + [cell(v) for v in p.phases] for name, p in pred.items()])]


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


def versus_static(rec: Recommendation) -> list[dict[str, float | int | None]]:
    """Per concurrency: measured throughput (tokens/s) and TPOT p50 (ms) of the recommended num_steps, of the best
    single static num_steps and of no speculation (K=0). The recommendation's numbers are the cells its slots are
    priced at (:meth:`Recommendation.slot_cell`: the schedule server's where the sweep measured it, else the static
    cells; adaptive switching overhead is not modelled); NaN where a cell was not measured ok."""
    rows = []
    for ch in rec.schedule_choices or rec.choices:
        row: dict[str, float | int | None] = {"concurrency": ch.concurrency, "recommended": ch.steps,
                                              "static": rec.best_static}
        for name, k in (("rec", ch.steps), ("static", rec.best_static), ("k0", 0)):
            look = rec.slot_cell if name == "rec" else rec.cell
            cell = look(k, ch.concurrency) if k is not None else None
            ok = cell is not None and cell.status == "ok"
            for m, short in (("output_throughput_tok_s", "tput"), ("tpot_p50_ms", "tpot")):
                row[f"{name}_{short}"] = cell.metric(m) if ok else math.nan  # type: ignore[union-attr]
        for ref in ("static", "k0"):
            row[f"tput_vs_{ref}"] = row["rec_tput"] / row[f"{ref}_tput"] if row[f"{ref}_tput"] else math.nan
            row[f"tpot_vs_{ref}"] = row["rec_tpot"] / row[f"{ref}_tpot"] if row[f"{ref}_tpot"] else math.nan
        rows.append(row)
    return rows
