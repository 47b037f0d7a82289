"""SGLang's EMA num_steps policy (backends.num_steps.ema_policy) on hand-built verify sequences.

Every expected EMA is worked out in the comments: EMA' = (1 - alpha) * EMA + alpha * mean(accepted drafts).
Values are chosen to be exact in binary floating point, so equality checks at the thresholds are exact.
"""

from __future__ import annotations

import pytest

from spectune.backends.num_steps.sglang_config import parse_sglang_adaptive_config
from spectune.backends.num_steps.ema_policy import AdaptivePolicy


def policy(steps: list[int], *, initial: int | None = None, graphs: list[int] | None = None,
           **params: float) -> AdaptivePolicy:
    """A one-slot policy (slot "1") with the given candidates and parameters."""
    cfg = parse_sglang_adaptive_config({"1": {"candidate_steps": steps, **params}})
    return AdaptivePolicy(cfg, initial_steps=initial, cuda_graph_bs=graphs)


def ema(p: AdaptivePolicy, bs: int = 1) -> float:
    return p.slot_state(bs).ema


def test_initial_steps_and_ema() -> None:
    assert policy([1, 3, 7], initial=3).steps_for_batch(1) == 3
    assert policy([1, 3, 7], initial=5).steps_for_batch(1) == 3  # 5 not a candidate: middle, index 3 // 2 = 1
    assert policy([1, 3, 5, 7]).steps_for_batch(1) == 5  # index 4 // 2 = 2
    assert policy([0, 1]).steps_for_batch(1) == 1  # index 2 // 2 = 1
    assert ema(policy([1, 3, 7], initial=7)) == 6.0  # EMA starts at current_steps - 1
    assert ema(policy([0, 1, 3], initial=0)) == -1.0


def test_warmup_then_first_decision() -> None:
    p = policy([1, 3, 7], initial=3, ema_alpha=0.5, warmup_batches=3, update_interval=2)
    # EMA 2 -> 1 -> 0.5 -> 0.25 (warm-up, 3 batches) -> 0.125 (batch 4: (4-3) % 2 != 0) -> 0.0625 (batch 5: decide)
    results = [p.on_verify([0, 0], 2) for _ in range(5)]
    assert results == [None, None, None, None, 1]  # 0.0625 <= (1 - 0.5) - 0.25 = 0.25: down to 1
    assert ema(p) == 0.0625
    st = p.slot_state(1)
    assert (st.current_steps, st.batches, st.switches) == (1, 5, 1)
    assert p.switch_count == 1


def test_no_decision_during_warmup_even_if_ema_collapses() -> None:
    p = policy([1, 3], initial=3, ema_alpha=1.0, warmup_batches=4, update_interval=1)
    assert [p.on_verify([0], 1) for _ in range(4)] == [None] * 4  # EMA 0 from batch 1, but still warming up
    assert p.steps_for_batch(1) == 3
    assert p.on_verify([0], 1) == 1  # batch 5: first decision


def test_update_interval() -> None:
    p = policy([1, 3], initial=3, ema_alpha=1.0, warmup_batches=2, update_interval=3)
    # alpha 1: EMA = the batch mean. Decisions at batches 5, 8, 11 ((n - 2) % 3 == 0).
    assert [p.on_verify([0], 1) for _ in range(5)] == [None, None, None, None, 1]  # EMA 0 <= 0.25: down
    assert [p.on_verify([1], 1) for _ in range(3)] == [None, None, 3]  # batch 8: EMA 1 > 1 - 0.5: up


def test_empty_batch_is_ignored() -> None:
    p = policy([1, 3], initial=3, warmup_batches=0, update_interval=1)
    assert p.on_verify([], 1) is None
    assert p.slot_state(1).batches == 0
    assert ema(p) == 2.0


def test_down_threshold_exact_equality_steps_down() -> None:
    # default down_hysteresis -0.25: threshold for 3 -> 1 is (1 - 0.5) - 0.25 = 0.25
    p = policy([1, 3], initial=3, ema_alpha=0.5, warmup_batches=2, update_interval=1)
    assert p.on_verify([0], 1) is None  # EMA 0.5*2 + 0.5*0 = 1.0
    assert p.on_verify([0], 1) is None  # EMA 0.5
    assert p.on_verify([0, 0], 2) == 1  # EMA 0.25 == threshold: steps down
    assert ema(p) == 0.25


def test_down_threshold_just_above_does_not_step_down() -> None:
    p = policy([1, 3], initial=3, ema_alpha=0.5, warmup_batches=2, update_interval=1)
    p.on_verify([0], 1)  # EMA 1.0
    p.on_verify([0], 1)  # EMA 0.5
    assert p.on_verify([0, 0, 0, 1], 4) is None  # mean 0.25, EMA 0.5*0.5 + 0.5*0.25 = 0.375 > 0.25
    assert p.steps_for_batch(1) == 3
    assert ema(p) == 0.375


def test_down_hysteresis_sets_the_threshold() -> None:
    # EMA 0.5*2 + 0.5*0 = 1.0; threshold (1 - 0.5) + h
    assert policy([1, 3], initial=3, ema_alpha=0.5, warmup_batches=0, update_interval=1,
                  down_hysteresis=0.5).on_verify([0], 1) == 1  # 1.0 <= 1.0
    assert policy([1, 3], initial=3, ema_alpha=0.5, warmup_batches=0, update_interval=1,
                  down_hysteresis=0.25).on_verify([0], 1) is None  # 1.0 > 0.75


def test_down_to_zero_uses_base_half() -> None:
    # 1 -> 0: threshold 0.5 + (-0.25) = 0.25 (with p - 0.5 it would be -0.75 and never fire here)
    p = policy([0, 1], initial=1, ema_alpha=0.5, warmup_batches=0, update_interval=1)
    assert p.on_verify([1, 0], 2) == 0  # EMA 0.5*0 + 0.5*0.5 = 0.25 <= 0.25


def test_up_threshold_exact_equality_does_not_step_up() -> None:
    # up from 1: EMA > (1 - 0.5) + 0.0 = 0.5
    p = policy([1, 3], initial=1, ema_alpha=0.5, warmup_batches=0, update_interval=1)
    assert p.on_verify([1], 1) is None  # EMA 0.5*0 + 0.5*1 = 0.5, not > 0.5
    assert ema(p) == 0.5
    assert p.on_verify([1], 1) == 3  # EMA 0.5*0.5 + 0.5*1 = 0.75 > 0.5


def test_up_hysteresis_sets_the_threshold() -> None:
    p = policy([1, 3], initial=1, ema_alpha=0.5, warmup_batches=0, update_interval=1, up_hysteresis=0.5)
    assert p.on_verify([2], 1) is None  # EMA 1.0, threshold 1.0: not above
    assert p.on_verify([2], 1) == 3  # EMA 0.5*1 + 0.5*2 = 1.5 > 1.0


def test_multi_tier_moves_in_one_decision() -> None:
    down = policy([1, 3, 5, 7], initial=7, ema_alpha=1.0, warmup_batches=0, update_interval=1)
    # EMA 0: <= 4.25 (to 5), <= 2.25 (to 3), <= 0.25 (to 1)
    assert down.on_verify([0, 0], 2) == 1
    up = policy([1, 3, 5, 7], initial=1, ema_alpha=1.0, warmup_batches=0, update_interval=1)
    # EMA 3: > 0.5 (to 3), > 2.5 (to 5), not > 4.5: stops at 5 (one tier beyond the observed acceptance)
    assert up.on_verify([3, 3], 2) == 5
    top = policy([1, 3, 5, 7], initial=1, ema_alpha=1.0, warmup_batches=0, update_interval=1)
    assert top.on_verify([7], 1) == 7  # EMA 7 clears every threshold; capped at the largest candidate


def test_no_step_up_after_stepping_down() -> None:
    # 3 -> 1 at EMA 1.0 <= (1 - 0.5) + 0.5; the up rule (EMA > 1 - 0.5 - 2 = -1.5) would send it back to 3,
    # but it only runs when the decision did not step down.
    p = policy([1, 3], initial=3, ema_alpha=0.5, warmup_batches=0, update_interval=1,
               down_hysteresis=0.5, up_hysteresis=-2.0)
    assert p.on_verify([0], 1) == 1  # EMA 0.5*2 + 0 = 1.0


def test_ceiling_caps_when_not_stepping_up() -> None:
    kw = dict(initial=7, ema_alpha=0.5, warmup_batches=0, update_interval=1)
    # EMA 0.5*6 + 0.5*4 = 5.0; no down move (5 > 2.25), already at the top.
    assert policy([1, 3, 7], **kw).on_verify([4], 1) is None  # ceiling off: stays at 7
    # ceiling = max(1, ceil(5.0 * 1.0)) = 5 < 7 <= 7 (old): walk down to 3 (<= 5)
    assert policy([1, 3, 7], ceiling_coeff=1.0, **kw).on_verify([4], 1) == 3


def test_ceiling_rounding_and_floor_of_one() -> None:
    kw = dict(initial=3, ema_alpha=0.5, warmup_batches=0, update_interval=1)
    # EMA 0.5*2 + 0.5*1 = 1.5 in each case; no hysteresis move (1.5 > 0.25; top candidate)
    assert policy([1, 3], ceiling_coeff=1.67, **kw).on_verify([1], 1) is None  # ceil(2.505) = 3: 3 allowed
    assert policy([1, 3], ceiling_coeff=1.2, **kw).on_verify([1], 1) == 1  # ceil(1.8) = 2 < 3: down to 1
    assert policy([1, 3], ceiling_coeff=0.1, **kw).on_verify([1], 1) == 1  # max(1, ceil(0.15)) = 1
    # EMA 0 (alpha 1, mean 0); down_hysteresis -2 keeps the down rule quiet (0 > 0.5 - 2); ceiling
    # max(1, ceil(0 * 1.0)) = 1 walks 3 -> 1 and stops there instead of going on to 0
    assert policy([0, 1, 3], initial=3, ema_alpha=1.0, warmup_batches=0, update_interval=1, down_hysteresis=-2.0,
                  ceiling_coeff=1.0).on_verify([0], 1) == 1


def test_ceiling_never_blocks_a_step_up() -> None:
    p = policy([1, 3, 7], initial=1, ema_alpha=1.0, warmup_batches=0, update_interval=1, ceiling_coeff=1.0)
    assert p.on_verify([3], 1) == 7  # EMA 3 > 0.5, > 2.5: target 7 > old 1, so ceil(3) = 3 does not apply


def test_probe_from_zero_and_ema_frozen_at_zero() -> None:
    p = policy([0, 1, 3], initial=0, ema_alpha=0.5, warmup_batches=0, update_interval=2)
    assert p.on_verify([2, 2], 2) is None  # at step 0 the EMA is not updated
    assert ema(p) == -1.0
    assert p.on_verify([2, 2], 2) == 1  # decision at step 0: probe the next candidate up
    assert ema(p) == 0.0  # negative EMA reset to target - 1 = 0
    assert p.on_verify([0], 1) is None  # EMA 0.5*0 + 0 = 0
    assert p.on_verify([0], 1) == 0  # EMA 0 <= 0.5 - 0.25: back to 0
    assert p.on_verify([0], 1) is None
    assert p.on_verify([0], 1) == 1  # probe again; EMA 0 is not negative so it is kept
    assert ema(p) == 0.0
    assert p.switch_count == 3


def test_only_zero_candidate_never_switches() -> None:
    p = policy([0], warmup_batches=0, update_interval=1)
    assert [p.on_verify([0], 1) for _ in range(3)] == [None, None, None]
    assert p.steps_for_batch(1) == 0


def _three_slots(**kw: object) -> AdaptivePolicy:
    cfg = parse_sglang_adaptive_config({"1": {"candidate_steps": [1, 3, 7]}, "8": {"candidate_steps": [1, 3]},
                                        "32": {"candidate_steps": [0, 1]}})
    return AdaptivePolicy(cfg, initial_steps=3, **kw)  # type: ignore[arg-type]


def test_routing_by_lower_bound() -> None:
    p = _three_slots()
    assert [p.slot_for_batch(b) for b in (1, 7, 8, 31, 32, 1000)] == [1, 1, 8, 8, 32, 32]
    assert [p.steps_for_batch(b) for b in (1, 8, 32)] == [3, 3, 1]  # slot 32: 3 not a candidate -> [0,1][1]


def test_routing_pads_to_cuda_graph_sizes() -> None:
    p = _three_slots(cuda_graph_bs=[16, 1, 2, 4, 8, 32])
    assert [p.padded_batch_size(b) for b in (3, 5, 17, 33)] == [4, 8, 32, 33]  # 33: above every graph, unpadded
    assert [p.slot_for_batch(b) for b in (3, 4, 5, 17, 33)] == [1, 1, 8, 32, 32]


def test_batch_below_smallest_slot_goes_to_smallest() -> None:
    cfg = parse_sglang_adaptive_config({"4": {"candidate_steps": [1]}, "16": {"candidate_steps": [3]}}, strict=False)
    p = AdaptivePolicy(cfg)
    assert [p.slot_for_batch(b) for b in (1, 3, 4, 16)] == [4, 4, 4, 16]


def test_slots_track_independently() -> None:
    p = _three_slots()
    p.on_verify([0] * 8, 8)  # slot 8: EMA 0.8*2 + 0.2*0 = 1.6 (defaults: alpha 0.2)
    assert p.slot_state(8).ema == pytest.approx(1.6)
    assert p.slot_state(1).ema == 2.0
    assert p.slot_state(1).batches == 0
    assert [s.lower_bound for s in p.slot_states()] == [1, 8, 32]


def test_slot_overrides_global_parameters() -> None:
    cfg = parse_sglang_adaptive_config({"ema_alpha": 0.5, "warmup_batches": 0, "update_interval": 1,
                                        "1": {"candidate_steps": [1, 3], "ema_alpha": 0.25},
                                        "8": {"candidate_steps": [1, 3], "warmup_batches": 2}})
    p = AdaptivePolicy(cfg, initial_steps=3)
    assert p.on_verify([0], 1) is None  # slot 1: EMA 0.75*2 = 1.5 > 0.25
    assert ema(p, 1) == 1.5
    assert p.on_verify([0] * 8, 8) is None  # slot 8: EMA 0.5*2 = 1.0, warm-up 2 (own override)
    assert ema(p, 8) == 1.0
    assert p.on_verify([0] * 8, 8) is None  # EMA 0.5, still warming up
    assert p.on_verify([0] * 8, 8) == 1  # EMA 0.25 <= 0.25, first decision (interval 1 from the global)
