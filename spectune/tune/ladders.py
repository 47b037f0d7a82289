"""SGLang adaptive ladders per batch-size slot that settle where the sweep measured the optimum.

SGLang's EMA policy (restated from python/sglang/srt/speculative/adaptive_spec_params.py; background §2): a slot
keeps an EMA of accepted drafts per verify (bonus token not counted); every ``update_interval`` batches after
``warmup_batches`` it steps down from s to the next lower candidate p while EMA <= base(p) + down_hysteresis
(base(p) = p - 0.5, or 0.5 when p = 0), else up while EMA > s - 0.5 + up_hysteresis; at 0 it always probes the next
candidate up; ``ceiling_coeff`` > 0 caps a non-rising target at max(1, ceil(EMA * coeff)).

A ladder only helps if the policy settles on the measured optimum K* when acceptance is what was measured. With
a(c) = measured acceptance_length - 1 at each candidate c, :func:`design_hysteresis` collects the linear bounds on
the two hysteresis values that make K* a fixed point and every other candidate move to it, keeps SGLang's
defaults (-0.25, 0.0) where they satisfy the bounds with a 0.25-token margin, and otherwise moves the least
distance needed. :func:`simulate_slot` then replays the policy (spectune's restatement in
:mod:`spectune.backends.num_steps.ema_policy`) batch by batch from every start, once on the mean acceptance and once on
per-request accepted counts drawn at the slot's smallest batch size (at batch 1 the EMA of single requests swings
by about a third of a token: with a 0.4-token acceptance it moved 44 times in 30 s on the bundled engine);
candidates that still stop it from settling are dropped (farthest first) until it does (a one-candidate ladder
always does).
"""

from __future__ import annotations

import math
import random
from typing import Callable, Mapping

from spectune.backends.num_steps.ema_policy import AdaptivePolicy
from spectune.backends.num_steps.sglang_config import parse_sglang_adaptive_config
from spectune.core.json_types import JsonValue


SGLANG_GLOBALS = {"ema_alpha": 0.2, "update_interval": 5, "warmup_batches": 10}  # SGLang's defaults, explicit
DEFAULT_DOWN, DEFAULT_UP = -0.25, 0.0
MARGIN = 0.25  # tokens of EMA headroom kept on each side of a threshold
HYSTERESIS_Z = 3.0
"""With the EMA's measured spread (sd at the slot's batch size), the headroom kept on each side of a threshold, in
standard deviations: under a normal EMA a threshold 3 sd away is crossed at about 0.1% of decisions."""
PRESETS = ("custom", "conservative", "aggressive")

SlotJson = Mapping[str, JsonValue]
"""One slot of an SGLang adaptive config as written (``candidate_steps``, ``down_hysteresis``, ``up_hysteresis``,
``ceiling_coeff``)."""

Replay = Callable[[SlotJson, int, int, int, int], list[int]]
"""(slot, batch size, start num_steps, batches, seed) -> num_steps of each verify batch
(:meth:`spectune.tune.replay.AcceptancePool.replay`'s first item)."""


def _base(p: int) -> float:
    return 0.5 if p == 0 else p - 0.5


def simulate_slot(slot: SlotJson, accepted: Mapping[int, float], initial_steps: int,
                  batches: int = 400, batch_size: int | None = None, seed: int = 0) -> list[int]:
    """Replay SGLang's EMA policy (:class:`spectune.backends.num_steps.ema_policy.AdaptivePolicy`) for one slot.

    With ``batch_size`` None every verify batch reports the mean, ``accepted[s]`` accepted drafts at num_steps s.
    Otherwise each of ``batch_size`` requests per verify batch reports a count drawn from the chain model of
    Leviathan et al. (2023): draft i is accepted with probability alpha given drafts 1..i-1 were, alpha solved so
    that the mean is ``accepted[s]`` (seeded with ``seed``).

    Returns the num_steps used by each of ``batches`` verify batches. Raises ValueError for an invalid slot.
    """
    config = parse_sglang_adaptive_config({**SGLANG_GLOBALS, "1": dict(slot)}, source="slot", strict=True)
    policy = AdaptivePolicy(config, initial_steps=initial_steps)
    rng = random.Random(seed)
    alpha = {s: _chain_alpha(s, accepted[s]) for s in slot["candidate_steps"] if s > 0}
    trace = []
    for _ in range(batches):
        k = policy.steps_for_batch(1)
        trace.append(k)
        if batch_size is None:
            policy.on_verify([accepted[k] if k > 0 else 0.0], 1)
        else:
            policy.on_verify([_chain_sample(rng, alpha[k], k) if k > 0 else 0 for _ in range(batch_size)],
                             batch_size)
    return trace


def _chain_sample(rng: random.Random, alpha: float, k: int) -> int:
    """Accepted drafts of one verify under the chain model: the first rejection ends the run (at most k)."""
    n = 0
    while n < k and rng.random() < alpha:
        n += 1
    return n


NOISY_SHARE = 0.9  # share of batches a ladder must spend at its optimum under sampled acceptance


def settles(slot: SlotJson, accepted: Mapping[int, float], target: int, window: int = 100,
            batch_size: int | None = None, replay: Replay | None = None) -> bool:
    """True when, from every start, the last ``window`` batches all run ``target`` (for target 0: at least half
    of them, since SGLang probes up from 0 at every decision). With ``batch_size`` and a target > 0, also when
    per-request acceptance is sampled (:func:`simulate_slot`) at that batch size, at least 90% of the last 500
    of 1000 batches run ``target``. ``replay``: optional (slot, batch size, start, batches, seed) -> num_steps per
    batch (:meth:`spectune.tune.replay.AcceptancePool.replay`'s first item: the sweep's own per-request acceptance)
    used instead of the chain model."""
    return _settles_on_mean(slot, accepted, target, window) and (
        batch_size is None or _settles_under_noise(slot, accepted, target, batch_size, replay))


def _settles_on_mean(slot: SlotJson, accepted: Mapping[int, float], target: int, window: int = 100) -> bool:
    for start in slot["candidate_steps"]:
        tail = simulate_slot(slot, accepted, start)[-window:]
        if (tail.count(target) < window // 2) if target == 0 else any(s != target for s in tail):
            return False
    return True


def _settles_under_noise(slot: SlotJson, accepted: Mapping[int, float], target: int, batch_size: int,
                         replay: Replay | None = None) -> bool:
    if target == 0 or len(slot["candidate_steps"]) == 1:
        return True
    for start in slot["candidate_steps"]:
        noisy = (replay(slot, batch_size, start, 1000, start) if replay is not None else
                 simulate_slot(slot, accepted, start, batches=1000, batch_size=batch_size, seed=start))[-500:]
        if noisy.count(target) < NOISY_SHARE * len(noisy):
            return False
    return True


def design_hysteresis(cand: list[int], k: int, a: Mapping[int, float],
                      margin: float = MARGIN, strict: bool = False) -> tuple[float, float] | None:
    """(down_hysteresis, up_hysteresis) making K* = ``k`` the resting point of ladder ``cand`` given accepted
    drafts ``a[c]`` at each candidate, or None if no values can. Bounds: stay at k: e > base(prev) + down and
    e <= k - 0.5 + up for the EMA e one decision after arriving from any other candidate c (e = a[k] + (a[c] -
    a[k]) * (1 - ema_alpha)^update_interval); from c > k: base(k) + down >= a[c] > base(prev) + down; from
    0 < c < k: a[c] > c - 0.5 + up and no step down; thresholds reachable. ``margin``: tokens of EMA headroom
    wanted on each side of a threshold (:data:`MARGIN`, or a multiple of the EMA's measured spread); where the
    bounds leave less room, half of it, or with ``strict`` None (the EMA's own swings would cross a threshold)."""
    j = cand.index(k)
    decay = (1 - SGLANG_GLOBALS["ema_alpha"]) ** SGLANG_GLOBALS["update_interval"]
    arrive = [a[k] + (a[c] - a[k]) * decay for c in cand if c not in (0, k)] + [a[k]]
    d_lo, d_hi, u_lo, u_hi = [], [], [], []
    if j > 0:
        d_hi.append(min(arrive) - _base(cand[j - 1]))
        d_lo.append(-_base(cand[j - 1]))
    if j < len(cand) - 1 and k > 0:
        u_lo.append(max(arrive) - k + 0.5)
        u_hi.append(0.5)
    for c in cand[j + 1:]:
        d_lo.append(a[c] - _base(k))
        if j > 0:
            d_hi.append(a[c] - _base(cand[j - 1]))
    for i, c in enumerate(cand[:j]):
        if c > 0:
            u_hi.append(a[c] - c + 0.5)
        if i > 0:
            d_hi.append(a[c] - _base(cand[i - 1]))

    def pick(default: float, lo: list[float], hi: list[float]) -> float | None:
        low, high = max(lo, default=-math.inf), min(hi, default=math.inf)
        if high - low <= 0.02:
            return None
        if strict and high - low < 2 * margin and math.isfinite(high - low):
            return None
        m = min(margin, (high - low) / 2)
        return round(min(max(default, low + m), high - m), 2)

    down, up = pick(DEFAULT_DOWN, d_lo, d_hi), pick(DEFAULT_UP, u_lo, u_hi)
    return None if down is None or up is None else (down, up)


def _chain_alpha(k: int, accepted_k: float) -> float:
    """Per-token acceptance alpha with alpha + alpha^2 + ... + alpha^k = ``accepted_k`` (Leviathan et al. (2023):
    E[tokens per verify] = (1 - alpha^(K+1)) / (1 - alpha)); clamped to [0, 1]."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid ** i for i in range(1, k + 1)) < accepted_k else (lo, mid)
    return lo


def _estimate_accepted(k: int, accepted_k: float, c: int) -> float:
    """Accepted drafts at c from those at k under the chain model (:func:`_chain_alpha`)."""
    alpha = _chain_alpha(k, accepted_k)
    return sum(alpha ** i for i in range(1, c + 1))


def ladder_for(preset: str, k: int, allowed: list[int]) -> list[int]:
    """Initial candidate_steps for a slot whose optimum is k, from the eligible swept num_steps ``allowed``.

    custom: k and its nearest eligible neighbours ([0] alone when k = 0: from 0 SGLang probes up at every
    decision); conservative: never above k, pinned to k when k <= 1; aggressive: one below, two above, and
    [0, next] when k = 0 (deliberate probing).
    """
    below, above = [s for s in allowed if s < k], [s for s in allowed if s > k]
    if preset == "custom":
        return [k] if k == 0 else below[-1:] + [k] + above[:1]
    if preset == "conservative":
        return [k] if k <= 1 else below[-1:] + [k]
    return [k] + above[:1] if k == 0 else below[-1:] + [k] + above[:2]


def design_slot(preset: str, k: int, allowed: list[int], accepted: Mapping[int, float],
                batch_size: int = 1, ema_spread: Callable[[int], float] | None = None,
                replay: Replay | None = None) -> tuple[dict, list[str]]:
    """One slot's config for ``preset`` and the notes explaining it. ``accepted``: measured drafts per verify
    (NaN where unknown; estimated from k's when possible). ``batch_size``: the slot's smallest batch size, at
    which the ladder must also settle under sampled per-request acceptance (:func:`settles`; ``replay`` as there).
    ``ema_spread``: optional callable num_steps -> sd of SGLang's EMA at that num_steps and batch size
    (:meth:`spectune.tune.replay.AcceptancePool.ema_spread`); with it each threshold keeps :data:`HYSTERESIS_Z` x
    the largest spread over the ladder's candidates (at least :data:`MARGIN`) or the farther candidate is left
    out."""
    notes: list[str] = []
    cand = ladder_for(preset, k, allowed)
    a = {c: math.nan for c in (k, *cand)} | dict(accepted)  # a num_steps not measured: NaN
    if k > 0 and not math.isfinite(a[k]):
        notes.append(f"no acceptance measured at K={k}: ladder pinned to it")
        cand = [k]
    for c in cand:
        if not math.isfinite(a[c]) and k > 0:
            a[c] = _estimate_accepted(k, a[k], c)
            notes.append(f"acceptance at K={c} estimated from K={k} (Leviathan model)")
    cand = [c for c in cand if c == 0 or math.isfinite(a[c])]
    a[0] = 0.0
    coeff = 0.0
    if preset == "aggressive" and k >= 2 and a[k] > 0:
        coeff = math.floor(100 * k / a[k]) / 100  # ceil(a[k] * coeff) == k: caps at k when acceptance falls

    def build(ladder: list[int]) -> tuple[dict, bool, bool]:
        """The slot for ``ladder``; whether it settles on the mean acceptance, and also under per-request noise."""
        margin = MARGIN if ema_spread is None else max(
            [MARGIN] + [HYSTERESIS_Z * ema_spread(c) for c in ladder if c > 0 and math.isfinite(ema_spread(c))])
        hyst = (design_hysteresis(ladder, k, a, margin, strict=ema_spread is not None) if len(ladder) > 1
                else (DEFAULT_DOWN, DEFAULT_UP))
        slot = {"candidate_steps": ladder, "up_hysteresis": hyst[1] if hyst else DEFAULT_UP,
                "down_hysteresis": hyst[0] if hyst else DEFAULT_DOWN, "ceiling_coeff": coeff}
        on_mean = hyst is not None and _settles_on_mean(slot, a, k)
        return slot, on_mean, on_mean and _settles_under_noise(slot, a, k, batch_size, replay)

    slot, on_mean, ok = build(cand)
    while not ok:
        # leave out one candidate: the farthest from k whose removal lets the ladder settle, else the farthest
        order = sorted((c for c in cand if c != k), key=lambda c: (-abs(c - k), -c))
        tried = []
        for c in order:
            tried.append((c, build([x for x in cand if x != c])))
            if tried[-1][1][2]:
                break
        drop, built = tried[-1] if tried[-1][1][2] else tried[0]
        why = f"stay (>= {NOISY_SHARE:.0%} of batches) under per-request noise at batch size {batch_size}" \
            if on_mean else "settle"
        notes.append(f"K={drop} left out: with {a[k]:.2f} accepted drafts/verify at K={k} and {a[drop]:.2f} at "
                     f"K={drop}, no hysteresis makes SGLang's EMA policy {why} at K={k} with it in the ladder")
        cand = [c for c in cand if c != drop]
        slot, on_mean, ok = built
    return slot, notes
