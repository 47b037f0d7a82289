"""SGLang adaptive config and vLLM schedule validation (backends.num_steps.sglang_config / schedule)."""

from __future__ import annotations

import json

import pytest

from spectune.backends.num_steps.sglang_config import (
    SGLANG_DEFAULT_CONFIG,
    AdaptiveConfig,
    VllmSchedule,
    load_config_file,
    parse_any_config,
    parse_sglang_adaptive_config,
    parse_vllm_schedule,
    parse_vllm_speculative_config,
)
from spectune.backends.num_steps.vllm_schedule import SchedulePolicy
from spectune.core.errors import UserError

# SGLang docs, "Recommended configs".
CONSERVATIVE = {
    "1": {"candidate_steps": [1, 3, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
    "8": {"candidate_steps": [1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}
AGGRESSIVE = {
    "1": {"candidate_steps": [1, 3, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
    "8": {"candidate_steps": [1, 3, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 3.0},
    "64": {"candidate_steps": [1, 3], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 1.67},
    "128": {"candidate_steps": [1, 3], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 1.2},
}


def _err(obj: object, match: str, **kw: object) -> None:
    with pytest.raises(ValueError, match=match):
        parse_sglang_adaptive_config(obj, **kw)  # type: ignore[arg-type]


def test_presets_parse_with_documented_values() -> None:
    cons = parse_sglang_adaptive_config(CONSERVATIVE, source="conservative")
    assert cons.lower_bounds == (1, 8, 32)
    assert [s.candidate_steps for s in cons.slots] == [(1, 3, 7), (1, 3), (1,)]
    assert [s.down_hysteresis for s in cons.slots] == [-0.25, 0.0, 0.0]
    assert all(s.ceiling_coeff == 0 for s in cons.slots)
    aggr = parse_sglang_adaptive_config(AGGRESSIVE)
    assert aggr.lower_bounds == (1, 8, 64, 128)
    assert [s.ceiling_coeff for s in aggr.slots] == [0.0, 3.0, 1.67, 1.2]
    assert all(s.down_hysteresis == -0.25 for s in aggr.slots)
    assert aggr.candidate_steps == (1, 3, 7)
    # globals not given: SGLang's defaults
    assert all((s.ema_alpha, s.update_interval, s.warmup_batches) == (0.2, 5, 10) for s in aggr.slots)
    assert parse_sglang_adaptive_config(SGLANG_DEFAULT_CONFIG).candidate_steps == (0, 1, 3, 5, 7)


def test_globals_merge_and_slot_overrides_and_sorting() -> None:
    cfg = parse_sglang_adaptive_config({
        "ema_alpha": 0.5, "warmup_batches": 3, "down_hysteresis": 0.1,
        "8": {"candidate_steps": [3, 1, 3], "warmup_batches": 0},
        "1": {"candidate_steps": [7, 0, 3]},
    })
    s1, s8 = cfg.slots
    assert (s1.lower_bound, s8.lower_bound) == (1, 8)  # sorted by lower bound
    assert s1.candidate_steps == (0, 3, 7)
    assert s8.candidate_steps == (1, 3)  # sorted, unique
    assert (s1.ema_alpha, s1.warmup_batches, s1.down_hysteresis, s1.update_interval) == (0.5, 3, 0.1, 5)
    assert (s8.ema_alpha, s8.warmup_batches) == (0.5, 0)  # slot overrides a global


@pytest.mark.parametrize("obj", [CONSERVATIVE, AGGRESSIVE, SGLANG_DEFAULT_CONFIG, {
    "update_interval": 2, "1": {"candidate_steps": [1, 3], "ema_alpha": 0.3}, "4": {"candidate_steps": [0, 1]}}])
def test_round_trip(obj: dict) -> None:
    cfg = parse_sglang_adaptive_config(obj)
    out = cfg.to_json()
    assert parse_sglang_adaptive_config(json.loads(json.dumps(out))) == cfg
    assert all(isinstance(out[str(b)]["candidate_steps"], list) for b in cfg.lower_bounds)


def test_to_json_hoists_only_shared_globals() -> None:
    out = parse_sglang_adaptive_config({"1": {"candidate_steps": [1], "ema_alpha": 0.3},
                                        "8": {"candidate_steps": [1]}}).to_json()
    assert "ema_alpha" not in out
    assert out["update_interval"] == 5
    assert out["warmup_batches"] == 10
    assert out["1"]["ema_alpha"] == 0.3
    assert out["8"]["ema_alpha"] == 0.2
    assert out["8"]["down_hysteresis"] == -0.25  # hysteresis and ceiling always per slot


def test_structure_errors() -> None:
    _err([1, 2], "must be a JSON object, got list")
    _err({"ema_alpha": 0.2}, "no batch-size slot")
    _err({"candidate_steps": [1, 3, 7]}, "old flat format")
    _err({"candidate_steps": [1], "1": {"candidate_steps": [1]}}, "old flat format")
    _err({"1": [1, 3]}, "slot '1': must be an object")
    _err({1: {"candidate_steps": [1]}}, "keys must be strings")
    _err({"1": {"down_hysteresis": 0.0}}, "slot '1': missing 'candidate_steps'")


@pytest.mark.parametrize("steps", [[], [-1], [True], [1.0], "1,3", None, [1, "3"]])
def test_candidate_steps_must_be_non_negative_ints(steps: object) -> None:
    _err({"1": {"candidate_steps": steps}}, "slot '1': 'candidate_steps' must be a non-empty list of non-negative")


def test_strategy() -> None:
    assert parse_sglang_adaptive_config({"strategy": "ema", "1": {"candidate_steps": [1]}}).slots
    _err({"strategy": "throughput_aware", "1": {"candidate_steps": [1]}}, "'throughput_aware' is not the EMA strategy")
    _err({"strategy": "greedy", "1": {"candidate_steps": [1]}}, "'strategy' must be 'ema' or 'throughput_aware'")


def test_unknown_keys_rejected_when_strict_warned_when_lenient() -> None:
    typo = {"1": {"candidate_steps": [1, 3], "down_hysterisis": 0.5}}
    _err(typo, r"slot '1': unknown key\(s\) 'down_hysterisis'")
    cfg = parse_sglang_adaptive_config(typo, strict=False)
    assert cfg.slots[0].down_hysteresis == -0.25  # ignored, as SGLang does
    assert len(cfg.warnings) == 1
    assert "down_hysterisis" in cfg.warnings[0]
    _err({"emaalpha": 0.5, "1": {"candidate_steps": [1]}}, r"config: unknown key\(s\) 'emaalpha'")
    _err({"1": {"candidate_steps": [1], "strategy": "ema"}}, "unknown key")  # strategy is top-level only


def test_smallest_slot_must_be_1_when_strict() -> None:
    obj = {"4": {"candidate_steps": [1, 3]}, "16": {"candidate_steps": [1]}}
    _err(obj, "smallest batch-size slot is 4.*sizes 1-3")
    cfg = parse_sglang_adaptive_config(obj, strict=False)
    assert cfg.lower_bounds == (4, 16)
    assert "smallest batch-size slot" in cfg.warnings[0]


def test_slot_key_spelling() -> None:
    _err({"1": {"candidate_steps": [1]}, "8": {"candidate_steps": [1]}, "08": {"candidate_steps": [3]}},
         "slot '08': names the same batch size as slot '8'")
    _err({"1": {"candidate_steps": [1]}, "08": {"candidate_steps": [1]}}, "without leading zeros")
    _err({"0": {"candidate_steps": [1]}, "8": {"candidate_steps": [1]}}, "slot '0'.*positive integers")
    cfg = parse_sglang_adaptive_config({"01": {"candidate_steps": [1]}}, strict=False)  # SGLang accepts "01"
    assert cfg.lower_bounds == (1,)
    assert cfg.warnings


@pytest.mark.parametrize("key,value,match", [
    ("update_interval", 0, "'update_interval' must be an integer >= 1"),
    ("update_interval", 5.0, "'update_interval' must be an integer >= 1"),
    ("warmup_batches", -1, "'warmup_batches' must be an integer >= 0"),
    ("warmup_batches", True, "'warmup_batches' must be an integer"),
    ("ema_alpha", 1.5, "'ema_alpha' must be in"),
    ("ema_alpha", 0, "'ema_alpha' 0 freezes the EMA"),
    ("down_hysteresis", "0.1", "'down_hysteresis' must be a finite number"),
    ("up_hysteresis", float("nan"), "'up_hysteresis' must be a finite number"),
    ("ceiling_coeff", False, "'ceiling_coeff' must be a finite number"),
    ("ceiling_coeff", -1.0, "'ceiling_coeff' -1.0 is negative"),
])
def test_parameter_types_and_ranges(key: str, value: object, match: str) -> None:
    _err({"1": {"candidate_steps": [1], key: value}}, f"slot '1': {match}")  # in a slot
    _err({key: value, "1": {"candidate_steps": [1]}}, f"config: {match}", )  # as a global


def test_source_names_the_file_in_messages() -> None:
    _err({"1": {"candidate_steps": []}}, "^adaptive.json: slot '1'", source="adaptive.json")


# ---- vLLM ---------------------------------------------------------------------------------------------------------

def test_vllm_background_example() -> None:
    sched = parse_vllm_schedule([[1, 8, 6], [9, 32, 4], [33, 128, 3]], max_k=6)
    assert [sched.k_for_batch_size(b) for b in (1, 8, 9, 32, 33, 128)] == [6, 6, 4, 4, 3, 3]
    assert sched.k_for_batch_size(500) == 3  # above the last range: the last K (vLLM fills up to max_num_seqs)
    assert sched.to_json() == [[1, 8, 6], [9, 32, 4], [33, 128, 3]]
    assert parse_vllm_schedule(sched.to_json(), max_k=6) == sched


def test_vllm_gap_inherits_previous_k() -> None:
    sched = parse_vllm_schedule([[1, 4, 5], [10, 16, 0]])
    assert [sched.k_for_batch_size(b) for b in (4, 5, 9, 10, 17)] == [5, 5, 5, 0, 0]
    with pytest.raises(ValueError, match="batch size must be an integer >= 1"):
        sched.k_for_batch_size(0)


@pytest.mark.parametrize("obj,match", [
    ([], "non-empty list"),
    ({"1": 3}, "non-empty list"),
    ([[2, 8, 3]], "first schedule range starts at 2, must start at batch size 1"),
    ([[1, 8, 3], [8, 16, 1]], r"\[1, 8\] and \[8, 16\] overlap"),
    ([[1, 8, 3], [9, 4, 1]], r"entry 1 \[9, 4, 1\]: needs 1 <= range_start <= range_end"),
    ([[0, 8, 3]], "needs 1 <= range_start"),
    ([[1, 8, -1]], "K must be >= 0"),
    ([[1, 8]], "three integers"),
    ([[1, 8.0, 3]], "three integers"),
    ([[1, True, 3]], "three integers"),
    ([[1, 8, 1, 4096, 3]], "5-item context-bucketed entries are not supported"),
    ([[9, 16, 1], [1, 8, 3]], "ascending batch-size order"),
])
def test_vllm_schedule_errors(obj: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_vllm_schedule(obj)


def test_vllm_unsorted_accepted_when_lenient_and_max_k() -> None:
    sched = parse_vllm_schedule([[9, 16, 1], [1, 8, 3]], strict=False)  # vLLM sorts
    assert sched.to_json() == [[1, 8, 3], [9, 16, 1]]
    with pytest.raises(ValueError, match="K 4 exceeds num_speculative_tokens 3"):
        parse_vllm_schedule([[1, 8, 4]], max_k=3)


def test_vllm_speculative_config_object() -> None:
    obj = {"method": "eagle3", "model": "head", "num_speculative_tokens": 6,
           "num_speculative_tokens_per_batch_size": [[1, 8, 6], [9, 32, 4]]}
    sched = parse_vllm_speculative_config(obj)
    assert sched.max_k == 6
    assert sched.k_for_batch_size(10) == 4
    with pytest.raises(ValueError, match="needs 'num_speculative_tokens'"):
        parse_vllm_speculative_config({"num_speculative_tokens_per_batch_size": [[1, 8, 6]]})
    with pytest.raises(ValueError, match="num_speculative_tokens must be an integer >= 1"):
        parse_vllm_speculative_config({**obj, "num_speculative_tokens": 0})
    with pytest.raises(ValueError, match="K 6 exceeds num_speculative_tokens 5"):
        parse_vllm_speculative_config({**obj, "num_speculative_tokens": 5})


def test_schedule_policy_interface() -> None:
    pol = SchedulePolicy(parse_vllm_schedule([[1, 8, 6], [9, 32, 4], [33, 64, 4], [65, 128, 0]]))
    assert pol.candidate_steps == (0, 4, 6)
    assert pol.max_steps == 6
    assert pol.steps_for_batch(9) == 4
    assert pol.on_verify([1, 2], 2) is None  # still the first range's K
    assert pol.on_verify([1] * 10, 10) == 4  # moved into [9, 32]
    assert pol.on_verify([1] * 40, 40) is None  # [33, 64] has the same K
    assert pol.on_verify([0] * 70, 70) == 0
    assert pol.on_verify([1], 1) == 6
    assert (pol.switch_count, pol.num_batches, pol.current_steps) == (3, 5, 6)


# ---- format detection and files -----------------------------------------------------------------------------------

def test_parse_any_config_detects_format() -> None:
    assert isinstance(parse_any_config([[1, 8, 3]]), VllmSchedule)
    assert isinstance(parse_any_config({"num_speculative_tokens": 3,
                                        "num_speculative_tokens_per_batch_size": [[1, 8, 3]]}), VllmSchedule)
    assert isinstance(parse_any_config(CONSERVATIVE), AdaptiveConfig)
    with pytest.raises(ValueError, match="^f.json: the first schedule range"):
        parse_any_config([[2, 8, 3]], source="f.json")


def test_load_config_file_errors_are_user_errors(tmp_path) -> None:
    good = tmp_path / "a.json"
    good.write_text(json.dumps(AGGRESSIVE))
    assert load_config_file(good).lower_bounds == (1, 8, 64, 128)  # type: ignore[union-attr]
    with pytest.raises(UserError, match="cannot read config"):
        load_config_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"1": {"candidate_steps": [1,]}}')
    with pytest.raises(UserError, match="bad.json: not valid JSON .* line 1"):
        load_config_file(bad)
    typo = tmp_path / "typo.json"
    typo.write_text('{"1": {"candidate_step": [1]}}')
    with pytest.raises(UserError, match=r"typo.json: slot '1': unknown key\(s\) 'candidate_step'"):
        load_config_file(typo)
