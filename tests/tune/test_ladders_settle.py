"""Ladders that settle (issue 30): a neighbour num_steps joins a slot's ladder only where the sweep measured a gain,
hysteresis is sized from the spread of SGLang's EMA replayed on per-request acceptance, recommendation.md gives
switches per minute, and without any gain the best static num_steps is the primary recommendation."""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from spectune.cli import app
from spectune.results.reader import load_results
from spectune.tune.configs import sglang_configs
from spectune.tune.gain import gaining_steps, static_primary
from spectune.tune.ladders import design_slot
from spectune.tune.recommend import RecommendOptions, Slot, recommend
from spectune.tune.replay import AcceptancePool, slot_switch_rate
from tests.helpers.engine_configs import trtllm_config, vllm_config
from tests.helpers.results_folders import grid, write_sweep

CROSSOVER = {1: {0: 100, 1: 150, 3: 200}, 8: {0: 600, 1: 700, 3: 650}, 32: {0: 2000, 1: 1900, 3: 1500}}
#: a schedule that differs from the best static K=1 only where it ties with it: K=0 at c=8 is within 2% of K=1
NO_GAIN = {1: {0: 100, 1: 150}, 8: {0: 600, 1: 605}}


def requests(steps: list[int], concs: list[int], n: int = 40, seed: int = 0) -> list[dict]:
    """Request objects with ``server_stats.spec_decode`` counts: each request has its own per-token acceptance
    (uniform in [0.1, 0.8]: requests differ, as prompts do) and 60 verify steps; accepted_per_position[i] is the
    expected count of verify steps that accepted draft i+1 under the chain model."""
    rng = random.Random(seed)
    out = []
    for c in concs:
        for k in steps:
            for i in range(n):
                alpha = rng.uniform(0.1, 0.8)
                app = [round(60 * alpha ** (j + 1)) for j in range(k)]
                out.append({"steps": k, "concurrency": c, "prompt_id": str(i), "error": None,
                            "server_stats": {"spec_decode": {"verify_steps": 60, "accepted_per_position": app}}})
    return out


def test_a_neighbour_joins_only_where_it_gains(tmp_path):
    rec = recommend(load_results(write_sweep(tmp_path / "r", grid(CROSSOVER))), RecommendOptions())
    # at concurrency 1, K=3 (200) beats K=1 (150) beyond the band; K=0 (100) does not
    assert gaining_steps(rec, Slot(1, None, 1, [1]), [0, 1, 3]) == [3]
    assert gaining_steps(rec, Slot(1, None, 3, [1]), [0, 1, 3]) == []


def test_a_gain_is_called_against_the_choices_widened_band(tmp_path):
    """A neighbour gains only beyond the band the choice at that concurrency was made with (``Choice.band``: the
    noise band widened by the best cell's spread or the sweep's drift), not the bare ``noise_band``: at concurrency
    1, K=3 is 33% ahead of K=1, inside a band widened to 50% and outside the 2% one."""
    rec = recommend(load_results(write_sweep(tmp_path / "r", grid(CROSSOVER))), RecommendOptions())
    at_1 = next(c for c in rec.choices if c.concurrency == 1)
    assert rec.options.noise_band < 0.33 < 0.5
    at_1.band = 0.5
    assert gaining_steps(rec, Slot(1, None, 1, [1]), [0, 1, 3]) == []
    at_1.band = rec.options.noise_band
    assert gaining_steps(rec, Slot(1, None, 1, [1]), [0, 1, 3]) == [3]


def test_no_gain_makes_the_best_static_primary_for_every_engine(tmp_path):
    folder = write_sweep(tmp_path / "r", grid(NO_GAIN))
    rec = recommend(load_results(folder), RecommendOptions())
    assert rec.best_static == 1
    assert [(s.lower, s.steps) for s in rec.schedule_slots] == [(1, 1), (3, 0)]  # the per-batch-size choice
    assert rec.primary.kind == "static"
    assert [(s.lower, s.upper, s.steps) for s in rec.slots] == [(1, None, 1)]
    # the static server, as the sweep measured it: no per-batch-size schedule (that would be vLLM's schedule server)
    assert "num_speculative_tokens_per_batch_size" not in vllm_config(rec)
    assert vllm_config(rec)["num_speculative_tokens"] == 1
    # one draft length at every batch size: max_draft_len without a schedule, in every TensorRT-LLM release
    assert trtllm_config(rec) == {"max_draft_len": 1}
    assert trtllm_config(rec, "1.2.0") == {"max_draft_len": 1}
    out = tmp_path / "out"
    assert CliRunner().invoke(app, ["recommend", str(folder), "-o", str(out)]).exit_code == 0
    md = (out / "recommendation.md").read_text()
    assert "**Static num_steps K=1 for every engine**" in md
    assert "no batch-size slot's num_steps (K=0) beats the best static K=1" in md
    assert json.loads((out / "recommendation.json").read_text())["primary"]["kind"] == "static"


def test_a_gain_keeps_the_schedule_primary(tmp_path):
    rec = recommend(load_results(write_sweep(tmp_path / "r", grid(CROSSOVER))), RecommendOptions())
    assert static_primary(rec) is None
    assert rec.primary.kind == "schedule"
    assert "num_steps 3 beats 1 at concurrency 1" in rec.primary.reason
    assert len(rec.slots) == 3


def test_ema_spread_shrinks_with_batch_size():
    pool = AcceptancePool.from_requests(requests([1, 2], [1]))
    one, sixteen = pool.ema_spread(2, 1), pool.ema_spread(2, 16)
    assert one > 0.1  # a batch-1 EMA follows one request at a time
    assert sixteen < one / 2  # sixteen requests average out


def test_hysteresis_sized_from_the_ema_spread_drops_a_neighbour_it_cannot_hold():
    acc = {0: 0.0, 1: 0.40, 2: 0.57, 3: 0.63}
    steady = design_slot("custom", 2, [1, 2, 3], acc, batch_size=32, ema_spread=lambda c: 0.01)[0]
    assert steady["candidate_steps"] == [1, 2, 3]
    swinging = design_slot("custom", 2, [1, 2, 3], acc, batch_size=32, ema_spread=lambda c: 0.3)[0]
    assert swinging["candidate_steps"] == [2]  # 3 x 0.3 tokens of headroom fits no threshold between 0.40 and 0.63


def test_switches_per_minute_from_the_replay(tmp_path):
    rec = recommend(load_results(write_sweep(tmp_path / "r", grid({1: {0: 100, 1: 150, 2: 140}}))),
                    RecommendOptions())
    rec.requests = requests([1, 2], [1])
    slot = rec.slots[0]
    flapping = {"candidate_steps": [1, 2], "up_hysteresis": -0.2, "down_hysteresis": 0.0, "ceiling_coeff": 0.0}
    rate = slot_switch_rate(rec, slot, flapping)
    assert rate == pytest.approx(AcceptancePool.from_requests(rec.requests, [1]).switches_per_minute(
        flapping, 1, 1, 150 / (1 * rec.cell(1, 1).metrics["acceptance_length"])))
    assert rate > 100  # ~0.4-token EMA against a 0.3-token up threshold: it probes up every few decisions
    assert slot_switch_rate(rec, slot, sglang_configs(rec)[0].custom["1"]) == 0.0  # [1] alone never moves
    rec.requests = None
    assert slot_switch_rate(rec, slot, flapping) is None
