"""Turn a :class:`~spectune.tune.recommend.Recommendation` into what the engine formats write from
(:mod:`spectune.backends.formats`, each engine's files and launch lines): the SGLang adaptive ladders per batch-size
slot (custom, conservative, aggressive, designed by :mod:`spectune.tune.ladders`), the best static num_steps for
engines that take one value, the plain-data :class:`~spectune.backends.formats.Plan`, and ``best-static.json`` with
every engine's launch flags.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from spectune.backends.formats import Plan, StaticChoice, engine_formats
from spectune.core.json_types import JsonObject
from spectune.tune.gain import gaining_steps
from spectune.tune.ladders import PRESETS, SGLANG_GLOBALS, design_slot, ladder_for
from spectune.tune.recommend import OBJECTIVES, Recommendation, Slot
from spectune.tune.replay import AcceptancePool, ladder_noise


def slot_acceptance(rec: Recommendation, slot: Slot) -> dict[int, float]:
    """Median accepted drafts per verify (acceptance_length - 1) per num_steps over the slot's concurrencies."""
    out = {}
    for k in rec.steps:
        vals = [c.metric("acceptance_length") - 1 for conc in slot.concurrencies
                if (c := rec.cell(k, conc)) is not None and c.status == "ok"]
        vals = sorted(v for v in vals if math.isfinite(v))
        out[k] = vals[len(vals) // 2] if vals else math.nan
    return out


@dataclass(frozen=True)
class SGLangLadders:
    """The three SGLang adaptive configs recommend designs, one per preset of
    :data:`spectune.tune.ladders.PRESETS`: each SGLang's globals plus one slot object per batch-size slot, keyed by
    the slot's lower bound as a string (the ``--speculative-adaptive-config`` JSON)."""

    custom: dict
    conservative: dict
    aggressive: dict

    def by_preset(self) -> dict[str, dict]:
        """{preset: config} in :data:`~spectune.tune.ladders.PRESETS` order (what a
        :class:`~spectune.backends.formats.Plan` carries)."""
        return {preset: getattr(self, preset) for preset in PRESETS}


def sglang_configs(rec: Recommendation) -> tuple[SGLangLadders, dict[str, list[str]]]:
    """The three SGLang adaptive configs and per-slot notes ({"preset slot": [notes]})."""
    configs: dict[str, dict] = {p: dict(SGLANG_GLOBALS) for p in PRESETS}
    notes: dict[str, list[str]] = {}
    for slot in rec.slots:
        allowed = [k for k in rec.steps if all((c := rec.cell(k, conc)) is not None and c.eligible
                                               for conc in slot.concurrencies)]
        acc = slot_acceptance(rec, slot)
        pool = AcceptancePool.from_requests(rec.requests, slot.concurrencies)
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
    return SGLangLadders(**configs), notes


def static_choice(rec: Recommendation) -> StaticChoice | None:
    """The best single static num_steps over the measured concurrency range, for engines that take one draft length
    per server (llama.cpp, :mod:`spectune.backends.formats.llamacpp`), with each concurrency's own winner and what
    the static choice keeps of it (``static_vs_best``: objective ratio, inverted for minimised objectives, 1.0 = no
    loss). None when no static num_steps was measured ok everywhere."""
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
    return StaticChoice(rec.best_static, rec.options.objective, (min(rec.concurrencies), max(rec.concurrencies)),
                        rows)


def engine_plan(rec: Recommendation, ladders: SGLangLadders | None = None,
                algorithm: tuple[str | None, str] = (None, "unknown"), head: str | None = None,
                target: str | None = None, versions: Mapping[str, str | None] | None = None) -> Plan:
    """``rec`` as the plain data every engine format writes from (:class:`spectune.backends.formats.Plan`):
    the slots, the slot table's top, where vLLM's last range ends (``max_batch_size``, default: the largest
    measured concurrency; above it every engine's file keeps the last slot's num_steps), the draft head's method
    and how it was found (``algorithm``), the ``head`` and ``target``, the engine releases to write for
    (``versions``), the adaptive ``ladders`` (:func:`sglang_configs`), the best static num_steps
    (:func:`static_choice`), ``rec.warnings``, where formats add theirs, and the cutoff decision (``rec.p_min``)."""
    top = rec.options.max_batch_size or (max(rec.concurrencies) if rec.concurrencies else 0)
    return Plan(slots=[(s.lower, s.upper, s.steps) for s in rec.slots], top=top, method=algorithm[0],
                method_source=algorithm[1], head=head, target=target, versions=dict(versions or {}),
                ladders=ladders.by_preset() if ladders is not None else {}, static=static_choice(rec),
                warnings=rec.warnings, p_min=rec.p_min)


def best_static_json(rec: Recommendation, method: str | None = None) -> JsonObject:
    """``best-static.json``: the one num_steps for servers that take a single value, with launch flags
    (``method``: the draft head's speculative method, ``eagle``/``eagle3``, or None when unknown)."""
    k = rec.best_static
    out: JsonObject = {"num_steps": k, "objective": rec.options.objective,
                           "aggregate_score": rec.static_scores.get(k) if k is not None else None}
    if k:
        for engine in engine_formats():
            out.update(engine.static_launch(k, method))
    elif k == 0:
        out["note"] = "no speculation wins overall: launch the server without speculative decoding"
    return out
