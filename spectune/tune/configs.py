"""Turn a :class:`~spectune.tune.recommend.Recommendation` into engine configs: SGLang
``--speculative-adaptive-config`` JSON (custom, conservative, aggressive ladders per batch-size slot, designed by
:mod:`spectune.tune.ladders`), a vLLM speculative config with ``num_speculative_tokens_per_batch_size``,
TensorRT-LLM's ``draft_len_schedule``, llama.cpp's one static ``--spec-draft-n-max`` and the best static num_steps
with its launch flags.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from spectune.backends.llamacpp.settings import settings_json
from spectune.backends.num_steps.sglang_config import parse_sglang_adaptive_config
from spectune.backends.num_steps.trtllm_schedule import UPPER_BOUND_SINCE, build_schedule, check_schedule, schedule_form
from spectune.tune.gain import gaining_steps
from spectune.tune.ladders import PRESETS, SGLANG_GLOBALS, design_slot, ladder_for
from spectune.tune.recommend import OBJECTIVES, Recommendation, Slot
from spectune.tune.replay import AcceptancePool, ladder_noise


def slot_acceptance(rec: Recommendation, slot: Slot) -> dict[int, float]:
    """Median accepted drafts per verify (acceptance_length - 1) per num_steps over the slot's concurrencies."""
    out = {}
    for k in rec.steps:
        vals = [c.metrics.get("acceptance_length", math.nan) - 1 for conc in slot.concurrencies
                if (c := rec.cell(k, conc)) is not None and c.status == "ok"]
        vals = sorted(v for v in vals if math.isfinite(v))
        out[k] = vals[len(vals) // 2] if vals else math.nan
    return out


def sglang_configs(rec: Recommendation) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """The three SGLang adaptive configs ({preset: config}) and per-slot notes ({"preset slot": [notes]})."""
    configs: dict[str, dict] = {p: dict(SGLANG_GLOBALS) for p in PRESETS}
    notes: dict[str, list[str]] = {}
    for slot in rec.slots:
        allowed = [k for k in rec.steps if all((c := rec.cell(k, conc)) is not None and c.eligible
                                               for conc in slot.concurrencies)]
        acc = slot_acceptance(rec, slot)
        pool = AcceptancePool(rec.requests, slot.concurrencies)
        # custom and conservative: a neighbour only where the sweep measured it beating the slot's num_steps
        # (spectune.tune.gain); aggressive keeps its deliberate probing
        gain = sorted(set(gaining_steps(rec, slot, allowed)) | {slot.steps})
        for preset in PRESETS:
            cand = sorted(set(allowed) | {slot.steps}) if preset == "aggressive" else gain
            spread, replay = ladder_noise(pool, ladder_for(preset, slot.steps, cand), slot.lower)
            cfg, why = design_slot(preset, slot.steps, cand, acc, slot.lower, ema_spread=spread, replay=replay)
            if preset != "aggressive":
                skipped = [k for k in ladder_for(preset, slot.steps, sorted(set(allowed) | {slot.steps}))
                           if k not in cand]
                if skipped:
                    why = [f"K={','.join(map(str, skipped))} not in the ladder: the sweep measured no gain over "
                           f"K={slot.steps} beyond the noise band at concurrency "
                           f"{', '.join(map(str, slot.concurrencies))}"] + why
            if spread is not None and len(cfg["candidate_steps"]) > 1:
                sd = max(spread(c) for c in cfg["candidate_steps"] if c > 0)
                why = why + [f"hysteresis keeps 3 x {sd:.2f} accepted drafts of headroom: the spread of SGLang's "
                             f"EMA at batch size {slot.lower} (the sweep's requests replayed)"]
            configs[preset][str(slot.lower)] = cfg
            if why:
                notes[f"{preset} {slot.lower}"] = why
    return configs, notes


def vllm_config(rec: Recommendation, method: str | None = None, head: str | None = None) -> dict[str, Any] | None:
    """vLLM's complete ``--speculative-config`` value: ``{"method": METHOD, "model": HEAD, "num_speculative_tokens":
    max K, "num_speculative_tokens_per_batch_size": [[lo, hi, K], ...]}`` (``vllm/config/speculative.py``,
    ``SpeculativeConfig``; the schedule checked by ``validate_and_normalize_dynamic_sd_schedule`` in
    ``vllm/v1/spec_decode/dynamic/utils.py``: inclusive ranges, the first starting at 1, no overlaps, K >= 0).

    ``method``: the sweep's draft-head method (``eagle``/``eagle3``), ``head``: the head it loaded
    (:func:`spectune.backends.draft_head`); a key whose value is unknown is left out (recommendation.md says to add
    it). Ranges are the slots; the last ends at ``max_batch_size`` (default: the largest measured concurrency; vLLM
    carries the last K to larger batches). None when no slot speculates (vLLM needs num_speculative_tokens > 0).
    """
    if not rec.slots or max(s.steps for s in rec.slots) == 0:
        return None
    top = rec.options.max_batch_size or max(rec.concurrencies)
    top = max(top, rec.slots[-1].lower)
    sched = [[s.lower, s.upper if s.upper is not None else top, s.steps] for s in rec.slots]
    out: dict[str, Any] = {}
    if method:
        out["method"] = method
    if head:
        out["model"] = head
    out.update(num_speculative_tokens=max(s.steps for s in rec.slots), num_speculative_tokens_per_batch_size=sched)
    return out


def trtllm_config(rec: Recommendation, version: str | None = None) -> dict[str, Any] | None:
    """TensorRT-LLM's ``speculative_config`` fields ``{"max_draft_len": K1, "draft_len_schedule": {...}}`` in the
    form TensorRT-LLM ``version`` reads (None: the newest), :mod:`spectune.backends.num_steps.trtllm_schedule`.

    The ranges are the slots, the last ending at ``max_batch_size`` (default: the largest measured concurrency), as
    for vLLM. Upper-bound form (1.3.0rc8 on): keys are each slot's largest batch size, and batch sizes above the
    last key run no drafts. Lower-bound form (older): keys are the slots' lower bounds, the first 1. TensorRT-LLM
    requires the smallest key's draft length to equal ``max_draft_len``, so a slot asking for more drafts than the
    batch-size-1 slot is capped at its value (with a warning). None when the batch-size-1 slot does not speculate
    (TensorRT-LLM's EAGLE needs ``max_draft_len`` > 0).

    Raises:
        ValueError: ``version`` is not a version number.
    """
    form = schedule_form(version)
    if not rec.slots or rec.slots[0].steps == 0:
        return None
    first = rec.slots[0].steps
    last = max(rec.options.max_batch_size or max(rec.concurrencies), rec.slots[-1].lower)
    ranges = []
    for slot in rec.slots:
        k = slot.steps
        if k > first:
            rec.warnings.append(f"TensorRT-LLM: batch sizes from {slot.lower} asked for {k} drafts, more than "
                                f"batch size 1's {first}: capped at {first} (its schedule cannot exceed max_draft_len)")
            k = first
        ranges.append((slot.lower, slot.upper if slot.upper is not None else last, k))
    schedule = build_schedule(ranges, form)
    check_schedule(schedule, first, form)
    return {"max_draft_len": first, "draft_len_schedule": schedule}


def trtllm_description(config: Mapping[str, Any], version: str | None) -> str:
    """recommendation.md's line for ``trtllm-speculative-config.json``: how to use it and how its keys read."""
    head = "merge into TensorRT-LLM's `speculative_config` (add `decoding_type` and `speculative_model`); "
    named = f"TensorRT-LLM {version}" if version else "the newest TensorRT-LLM"
    if schedule_form(version) == "upper":
        top = max(int(k) for k in config["draft_len_schedule"])
        return (head + f"written for {named}: each key is the LARGEST batch size of its range (the form of "
                f"{UPPER_BOUND_SINCE} on); batch sizes above {top} run no drafts; for an older release rerun "
                "with `--trtllm-version`")
    return (head + f"written for {named}: each key is the SMALLEST batch size of its range (the form before "
            f"{UPPER_BOUND_SINCE}); the last entry also covers larger batches")


def llamacpp_settings(rec: Recommendation) -> dict[str, Any] | None:
    """``llamacpp-settings.json`` (:mod:`spectune.backends.llamacpp.settings`): llama.cpp takes one draft length per
    server,
    so the best single static num_steps over the measured concurrency range, with each concurrency's own winner
    and what the static choice keeps of it (``static_vs_best``: objective ratio, inverted for minimised
    objectives, 1.0 = no loss). None when no static num_steps was measured ok everywhere."""
    if rec.best_static is None:
        return None
    _, direction, _ = OBJECTIVES[rec.options.objective]
    rows = []
    for ch in rec.choices:
        best, static = rec.cell(ch.steps, ch.concurrency), rec.cell(rec.best_static, ch.concurrency)
        ratio = math.nan
        if best is not None and static is not None and best.objective > 0 and static.objective > 0:
            ratio = (static.objective / best.objective if direction == "max" else best.objective / static.objective)
        rows.append({"concurrency": ch.concurrency, "best_steps": ch.steps,
                     "best_objective": best.objective if best is not None else None,
                     "static_objective": static.objective if static is not None else None,
                     "static_vs_best": None if not math.isfinite(ratio) else round(ratio, 4)})
    return settings_json(rec.best_static, objective=rec.options.objective,
                         concurrency_range=[min(rec.concurrencies), max(rec.concurrencies)], per_concurrency=rows)


#: ``--speculative-algorithm`` values SGLang runs adaptively (``adaptive_spec_params.py``,
#: ``adaptive_unsupported_reason``: any other algorithm falls back to static settings).
SGLANG_ADAPTIVE_ALGORITHMS = ("EAGLE", "EAGLE3")


def sglang_algorithm(method: str | None) -> str:
    """``--speculative-algorithm`` for a draft head's method (``eagle3`` -> ``EAGLE3``); ``EAGLE`` when unknown."""
    return method.upper() if method else "EAGLE"


def sglang_initial_steps(config: Mapping[str, Any], first_steps: int) -> int | None:
    """``--speculative-num-steps`` to launch SGLang with the adaptive ``config``, or None when no tier speculates.

    SGLang's rule (``python/sglang/srt/arg_groups/speculative_hook.py``, ``_init_adaptive_speculative_params``):
    the value must be one of the union of every slot's ``candidate_steps``, else start-up fails with ``ValueError``.
    spectune writes the batch-size-1 slot's chosen num_steps ``first_steps`` when it is positive (it is always in
    that slot's ladder, hence in the union), else the smallest positive candidate of the union; a union of only 0
    means no slot speculates (launch without speculation). Each slot starts at this value when it is one of its
    candidates, else at its own middle candidate.

    Raises:
        ValueError: ``config`` is not a valid SGLang adaptive config.
    """
    union = parse_sglang_adaptive_config(dict(config), source="config").candidate_steps
    if first_steps > 0 and first_steps in union:
        return first_steps
    positive = [k for k in union if k > 0]
    return positive[0] if positive else None


def sglang_launch_args(config: Mapping[str, Any], first_steps: int, method: str | None,
                       config_file: str = "sglang-adaptive-custom.json") -> list[str] | None:
    """SGLang's adaptive speculative flags for ``config`` (saved as ``config_file``), or None when no tier
    speculates: ``--speculative-algorithm`` from the head's ``method`` (:func:`sglang_algorithm`), topk 1,
    ``--speculative-num-steps`` by :func:`sglang_initial_steps` and ``--speculative-num-draft-tokens`` one more
    (SGLang sets that itself with topk 1).

    Raises:
        ValueError: ``config`` is not a valid SGLang adaptive config.
    """
    k = sglang_initial_steps(config, first_steps)
    if k is None:
        return None
    return ["--speculative-algorithm", sglang_algorithm(method), "--speculative-eagle-topk", "1",
            "--speculative-num-steps", str(k), "--speculative-num-draft-tokens", str(k + 1),
            "--speculative-adaptive", "--speculative-adaptive-config", config_file]


def best_static_json(rec: Recommendation, method: str | None = None) -> dict[str, Any]:
    """``best-static.json``: the one num_steps for servers that take a single value, with launch flags
    (``method``: the draft head's speculative method, ``eagle``/``eagle3``, or None when unknown)."""
    k = rec.best_static
    out: dict[str, Any] = {"num_steps": k, "objective": rec.options.objective,
                           "aggregate_score": rec.static_scores.get(k) if k is not None else None}
    if k:
        out["sglang_args"] = ["--speculative-algorithm", sglang_algorithm(method), "--speculative-num-steps", str(k),
                              "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(k + 1)]
        out["vllm_speculative_config"] = {"num_speculative_tokens": k}
    elif k == 0:
        out["note"] = "no speculation wins overall: launch the server without speculative decoding"
    return out
