"""SGLang's throughput-aware strategy restated (spectune/backends/num_steps/throughput_policy.py): config rules,
per-position acceptance, cost lookups and decisions, on hand-computed cases; and `spectune simulate` with it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from spectune.backends.num_steps.sglang_config import parse_any_config
from spectune.backends.num_steps.throughput_policy import (
    CostTable,
    PositionTracker,
    ThroughputAwareConfig,
    ThroughputAwarePolicy,
    parse_throughput_aware_config,
)
from spectune.backends.num_steps.trace import TraceStep
from spectune.cli import app
from spectune.tune.simulate import simulate

CFG = {"strategy": "throughput_aware", "window_size": 2, "update_interval": 2, "1": {"candidate_steps": [1, 3]}}
COST = CostTable({(1, 1): 10.0, (1, 3): 12.0})


def test_parse_any_config_reads_the_throughput_aware_strategy():
    cfg = parse_any_config(CFG)
    assert (type(cfg), cfg.slots, cfg.window_size, cfg.update_interval) == (ThroughputAwareConfig, {1: (1, 3)}, 2, 2)


def test_candidate_zero_is_rejected_under_throughput_aware():
    with pytest.raises(ValueError, match="positive integers"):
        parse_throughput_aware_config({"strategy": "throughput_aware", "1": {"candidate_steps": [0, 1]}})


def test_ema_parameters_are_reported_as_ignored():
    cfg = parse_throughput_aware_config({"strategy": "throughput_aware", "1": {"candidate_steps": [1],
                                                                                "down_hysteresis": 0.0}})
    assert any("down_hysteresis ignored" in w for w in cfg.warnings)


def test_position_rates_are_shares_with_more_accepted_drafts():
    t = PositionTracker(max_steps=3, window_size=4)
    t.update([0, 1, 2, 3], 3)  # p0 = 3/4, p1 = 2/4, p2 = 1/4
    assert t.expected_tokens(3) == pytest.approx(2.5)


def test_unmeasured_positions_extrapolate_geometrically():
    t = PositionTracker(max_steps=3, window_size=4)
    t.update([0, 1, 1, 2, 2], 2)  # p0 = 0.8, p1 = 0.4: ratio 0.5, so p2 = 0.2
    assert t.expected_tokens(3) == pytest.approx(1 + 0.8 + 0.4 + 0.2)


def test_cost_lookup_takes_the_next_profiled_batch_size_up():
    table = CostTable({(1, 1): 5.0, (8, 1): 9.0})
    assert [table.lookup(b, 1) for b in (1, 2, 8, 64)] == [5.0, 9.0, 9.0, 9.0]


def test_switches_up_when_full_acceptance_makes_more_drafts_pay():
    pol = ThroughputAwarePolicy(parse_any_config(CFG), COST, initial_steps=1)
    for _ in range(2):  # two batches fill position 0's window at 1.0
        assert pol.steps_for_batch(1) == 1
        pol.on_verify([1], 1)
    # E[1] = 2 over 10 ms (0.2/ms) < E[3] = 4 (positions 1-2 extrapolated at 1.0) over 12 ms (0.33/ms)
    assert (pol.steps_for_batch(1), pol.switch_count) == (3, 1)


def test_no_cost_table_means_no_switch():
    pol = ThroughputAwarePolicy(parse_any_config(CFG), CostTable(), initial_steps=1)
    for _ in range(6):
        pol.steps_for_batch(1)
        pol.on_verify([1], 1)
    assert (pol.steps_for_batch(1), pol.switch_count) == (1, 0)


def test_moving_down_clears_the_higher_positions():
    pol = ThroughputAwarePolicy(parse_any_config(CFG), COST, initial_steps=3)
    for _ in range(2):
        pol.steps_for_batch(1)
        pol.on_verify([0], 1)  # nothing accepted: E[1] = 1/10 ms beats E[3] = 1/12 ms
    assert (pol.steps_for_batch(1), [len(w) for w in pol.tracker.windows]) == (1, [2, 0, 0])


def test_simulate_replays_the_throughput_aware_strategy():
    trace = [TraceStep(batch_size=1, accepted_drafts=[3], num_steps=3) for _ in range(6)]
    res = simulate(parse_any_config(CFG), trace, initial_steps=1, cost_table=COST)
    assert (res.kind, [(s.from_steps, s.to_steps) for s in res.switches]) == ("sglang-throughput", [(1, 3)])


def test_simulate_command_takes_a_cost_table(tmp_path):
    (tmp_path / "cfg.json").write_text(json.dumps(CFG))
    (tmp_path / "cost.json").write_text(json.dumps(COST.to_json()))
    (tmp_path / "trace.jsonl").write_text(
        "".join(json.dumps({"batch_size": 1, "accepted_drafts": [3], "num_steps": 3}) + "\n" for _ in range(6)))
    res = CliRunner().invoke(app, ["simulate", "--config", str(tmp_path / "cfg.json"), "--trace",
                                   str(tmp_path / "trace.jsonl"), "--cost-table", str(tmp_path / "cost.json"),
                                   "--initial-steps", "1"])
    assert (res.exit_code, "throughput-aware" in res.output, "switches: 1" in res.output) == (0, True, True), \
        res.output
