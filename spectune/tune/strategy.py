"""Which SGLang adaptive strategy ``spectune recommend`` writes: the EMA policy (SGLang's default) or
``"strategy": "throughput_aware"`` (:mod:`spectune.backends.num_steps.throughput_policy`), decided from the sweep.

Both run the custom config's per-slot ladders. Per measured concurrency c, with the cells' medians:

- The EMA policy settles where its thresholds put it: with the EMA at the accepted drafts a(s) =
  acceptance_length(c, s) - 1 that tier s measured, a decision steps down while a(s) <= (p - 0.5) +
  down_hysteresis (p the next lower candidate; base 0.5 when p is 0), else up while a(s) > s - 0.5 +
  up_hysteresis, and probes up from 0 (:func:`ema_settles_at`: the decisions iterated from the slot's start tier;
  the tiers it cycles through when it does not settle).
- The throughput-aware strategy takes the candidate with the highest E[tokens | s] / round time(b, s): with the
  sweep's numbers, acceptance_length(c, s) / (TPOT p50(c, s) x acceptance_length(c, s)), so the smallest TPOT p50
  among the slot's positive candidates (:func:`throughput_aware_picks`; ties to the smaller num_steps).

Rule (:func:`choose_strategy`): ``"ema"`` unless the objective is throughput, every slot speculates (the
throughput-aware strategy rejects candidate 0, so it cannot stop drafting where the sweep found that best), and it
reaches the sweep's choice at more concurrencies than the EMA policy does. The throughput-aware strategy also needs
CUDA graphs (it times each (batch size, num_steps) at start-up; without graphs its cost table is empty and it never
switches) and ``--pp-size`` 1; the reason says so.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Mapping

from spectune.backends.num_steps.sglang_config import SlotConfig, parse_sglang_adaptive_config
from spectune.backends.num_steps.throughput_policy import CostTable
from spectune.core.json_types import JsonObject
from spectune.tune.recommend import Recommendation

STRATEGY_NOTE = ("it times every (CUDA-graph batch size, num_steps) of the ladders at start-up, so it needs CUDA "
                 "graphs and --pp-size 1, and it reads the ladders' candidate_steps only (no hysteresis)")


def _cell_metric(rec: Recommendation, k: int, conc: int, name: str) -> float:
    cell = rec.cell(k, conc)
    if cell is None or not cell.eligible:
        return math.nan
    return float(cell.metric(name))


def ema_settles_at(slot: SlotConfig, accepted: Mapping[int, float], start: int) -> tuple[int, ...]:
    """Tiers the EMA policy ends on (one when it settles, the cycle otherwise), deciding with the EMA equal to the
    accepted drafts ``accepted[s]`` measured at the current tier s (source of the rule: the module docstring and
    :mod:`spectune.backends.num_steps.ema_policy`). A tier without a measurement counts as accepting nothing.
    ``slot``: one slot of the parsed config (its ``candidate_steps`` and hysteresis)."""
    steps = sorted(slot.candidate_steps)
    down, up = slot.down_hysteresis, slot.up_hysteresis
    idx = steps.index(start) if start in steps else len(steps) // 2
    seen: list[int] = []
    for _ in range(4 * len(steps) + 8):
        seen.append(steps[idx])
        s = steps[idx]
        a = accepted.get(s, math.nan)
        a = a if math.isfinite(a) else 0.0
        if s == 0:
            idx = min(idx + 1, len(steps) - 1)
            continue
        new = idx
        while new > 0 and a <= (0.5 if steps[new - 1] == 0 else steps[new - 1] - 0.5) + down:
            new -= 1
        if new == idx:
            while new < len(steps) - 1 and a > steps[new] - 0.5 + up:
                new += 1
        idx = new
    tail = seen[-2 * len(steps):]
    return tuple(sorted(Counter(tail)))


def throughput_aware_picks(rec: Recommendation, candidates: list[int], conc: int) -> int | None:
    """The candidate the throughput-aware strategy scores highest at ``conc`` from the sweep's cells (smallest TPOT
    p50 among the positive candidates measured eligible there), or None when none is."""
    tpot = {k: _cell_metric(rec, k, conc, "tpot_p50_ms") for k in candidates if k > 0}
    tpot = {k: v for k, v in tpot.items() if math.isfinite(v) and v > 0}
    return min(tpot, key=lambda k: (tpot[k], k)) if tpot else None


def choose_strategy(rec: Recommendation, custom: JsonObject, start: int | None) -> tuple[str, str]:
    """``("ema" | "throughput_aware", one-paragraph reason)`` for the custom config ``custom`` (the SGLang adaptive
    config recommend writes, read with :func:`~spectune.backends.num_steps.sglang_config.parse_sglang_adaptive_config`)
    launched at ``--speculative-num-steps start`` (rule in the module docstring)."""
    if rec.options.objective != "throughput":
        return "ema", (f"the objective is {rec.options.objective}; the throughput-aware strategy maximises tokens "
                       "per ms of a decode round (throughput) and ignores latency SLOs")
    zero = [s.lower for s in rec.slots if s.steps == 0]
    if zero:
        return "ema", (f"the sweep found no speculation best from batch size {zero[0]}; the throughput-aware "
                       "strategy needs positive candidate_steps, so it could not stop drafting there")
    ema_hits, ta_hits, rows = 0, 0, []
    ladders = {s.lower_bound: s for s in parse_sglang_adaptive_config(custom, source="custom", strict=False).slots}
    for slot in rec.slots:
        cfg = ladders[slot.lower]
        for conc in slot.concurrencies:
            acc = {k: _cell_metric(rec, k, conc, "acceptance_length") - 1 for k in cfg.candidate_steps}
            ema = ema_settles_at(cfg, acc, start if start is not None else slot.steps)
            ta = throughput_aware_picks(rec, list(cfg.candidate_steps), conc)
            ema_hits += ema == (slot.steps,)
            ta_hits += ta == slot.steps
            rows.append(f"{conc}: best {slot.steps}, EMA settles at {'/'.join(map(str, ema))}, throughput-aware "
                        f"picks {ta if ta is not None else '-'}")
    n = len(rows)
    detail = "; ".join(rows)
    if ta_hits > ema_hits:
        return "throughput_aware", (f"from the sweep's cells the throughput-aware strategy reaches the best "
                                    f"num_steps at {ta_hits} of {n} concurrencies, the EMA policy at {ema_hits} "
                                    f"({detail}); {STRATEGY_NOTE}")
    return "ema", (f"the EMA policy reaches the best num_steps at {ema_hits} of {n} concurrencies, the "
                   f"throughput-aware strategy at {ta_hits} ({detail}); EMA is SGLang's default and needs no "
                   "start-up profiling")


def throughput_aware_config(custom: JsonObject) -> JsonObject:
    """The custom EMA config as a throughput-aware one: ``"strategy": "throughput_aware"``, each slot's positive
    candidate_steps (EMA parameters dropped: that strategy does not read them)."""
    out: JsonObject = {"strategy": "throughput_aware"}
    for key, slot in custom.items():
        if key.isdigit():
            out[key] = {"candidate_steps": [k for k in slot["candidate_steps"]  # type: ignore[index, union-attr]
                                            if k > 0]}  # type: ignore[operator]
    return out


def cost_table_from_cells(rec: Recommendation) -> CostTable:
    """Decode-round times (ms) from the sweep for ``spectune simulate --cost-table``: per eligible cell with
    num_steps > 0, TPOT p50 x acceptance length (one round emits acceptance_length tokens per request), keyed on
    the measured batch size (rounded) when the sweep has it, else the concurrency."""
    entries: dict[tuple[int, int], float] = {}
    for cell in rec.cells:
        if cell.steps <= 0 or not cell.eligible:
            continue
        tpot, acc = cell.metric("tpot_p50_ms"), cell.metric("acceptance_length")
        bs = cell.metric("batch_size_mean")
        b = max(1, round(bs)) if math.isfinite(bs) else cell.concurrency
        if math.isfinite(tpot) and math.isfinite(acc) and tpot > 0:
            entries[(b, cell.steps)] = tpot * acc
    return CostTable(entries)
