"""recommend's choice of SGLang strategy (spectune/tune/strategy.py, written by spectune/tune/output.py), on
constructed sweeps with hand-checked answers."""

from __future__ import annotations

import json

from spectune.backends.num_steps.sglang_config import parse_any_config, parse_sglang_adaptive_config
from spectune.backends.num_steps.throughput_policy import ThroughputAwareConfig
from spectune.results.reader import load_results
from spectune.tune.output import sglang_strategy, write_recommendation
from spectune.tune.recommend import RecommendOptions, recommend
from spectune.tune.strategy import ema_settles_at
from helpers.results_folders import row, write_sweep

# K=3 best at concurrency 1, K=1 best at 8 (TPOT consistent with throughput: concurrency x 1000 / tok/s).
TABLE = {1: {1: 120.0, 2: 140.0, 3: 160.0}, 8: {1: 600.0, 2: 560.0, 3: 500.0}}
# A ladder with SGLang's default hysteresis: launched at 3, a(3) = 1.533 accepted drafts (helpers: alpha 0.7) is
# above tier 3's step-down threshold 2 - 0.5 - 0.25, so the EMA policy stays at 3 at concurrency 8, where 1 is best.
DEFAULT_LADDER = {"candidate_steps": [1, 2, 3], "down_hysteresis": -0.25, "up_hysteresis": 0.0}


def rec_from(tmp_path, table, objective="throughput"):
    rows = [row(k, c, thr, tpot_p50_ms=c * 1000.0 / thr) for c, by_k in table.items() for k, thr in by_k.items()]
    return recommend(load_results(write_sweep(tmp_path / "sweep", rows)), RecommendOptions(objective=objective))


def written(tmp_path, table, objective="throughput"):
    return write_recommendation(rec_from(tmp_path, table, objective), tmp_path / "out", "test")


def default_ladders(tmp_path):
    """sglang_strategy's outputs for TABLE with DEFAULT_LADDER in both slots (not what recommend designs)."""
    rec = rec_from(tmp_path, TABLE)
    configs = {"custom": {str(s.lower): dict(DEFAULT_LADDER) for s in rec.slots}}
    payload = {"sglang-adaptive-custom.json": configs["custom"]}
    files = {"sglang-adaptive-custom.json": "custom"}
    strategy, why = sglang_strategy(rec, configs["custom"], payload, files)
    return strategy, why, payload


def test_ema_settles_where_its_thresholds_put_it():
    slot = parse_sglang_adaptive_config({"1": DEFAULT_LADDER}).slots[0]
    assert ema_settles_at(slot, {1: 0.7, 2: 1.19, 3: 1.533}, 3) == (3,)


def test_recommends_own_ladders_keep_ema_when_it_reaches_every_best_num_steps(tmp_path):
    # the designed ladders' hysteresis follows the measured acceptance (spectune/tune/ladders.py)
    paths = written(tmp_path, TABLE)
    assert json.loads(paths["recommendation.json"].read_text())["sglang_strategy"]["strategy"] == "ema"


def test_throughput_aware_chosen_when_it_reaches_the_best_num_steps_more_often(tmp_path):
    assert default_ladders(tmp_path)[0] == "throughput_aware"


def test_the_reason_counts_both_strategies_hits(tmp_path):
    assert "reaches the best num_steps at 2 of 2 concurrencies, the EMA policy at 1" in default_ladders(tmp_path)[1]


def test_the_throughput_aware_custom_config_carries_the_strategy_key(tmp_path):
    assert default_ladders(tmp_path)[2]["sglang-adaptive-custom.json"]["strategy"] == "throughput_aware"


def test_the_throughput_aware_custom_config_is_one_spectune_replays(tmp_path):
    cfg = parse_any_config(default_ladders(tmp_path)[2]["sglang-adaptive-custom.json"])
    assert (type(cfg), cfg.slots) == (ThroughputAwareConfig, {1: (1, 2, 3), 3: (1, 2, 3)})


def test_the_cost_table_is_written_beside_it(tmp_path):
    table = default_ladders(tmp_path)[2]["sglang-cost-table.json"]
    assert table["1"]["3"] == 1000.0 / 160.0 * (1 + 0.7 + 0.7 ** 2 + 0.7 ** 3)  # TPOT x acceptance length


def test_ema_kept_without_the_strategy_key_for_a_latency_objective(tmp_path):
    paths = written(tmp_path, TABLE, objective="tpot")
    cfg = json.loads(paths["sglang-adaptive-custom.json"].read_text())
    assert ("strategy" in cfg, "**ema**" in paths["recommendation.md"].read_text()) == (False, True)


def test_ema_kept_when_a_slot_does_not_speculate(tmp_path):
    table = {1: {0: 100.0, 1: 160.0}, 8: {0: 800.0, 1: 600.0}}
    paths = written(tmp_path, table)
    assert "could not stop drafting" in json.loads(paths["recommendation.json"].read_text())["sglang_strategy"][
        "reason"]
