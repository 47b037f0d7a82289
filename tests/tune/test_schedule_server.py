"""``spectune recommend`` prices a schedule on the engine's schedule server (the sweep's ``schedule-server/`` folder,
``spectune sweep --schedule-server``) and compares three answers: no drafter, one static num_steps, the schedule.

Constructed folders (no requests, so comparisons are point ratios against the 2% noise band). The static servers:
K=2 wins at concurrency 1, K=0 from 4 on, and the best single static num_steps is K=0 (K=1 ties it within the
band); priced on the static cells the schedule ``[[1, 1, 2], [2, N, 0]]`` wins at concurrency 1. Two schedule
servers: one whose drafter costs 20% at every num_steps' K=0 rounds and 4-5% at K > 0 (vLLM on this CPU, docs/
examples/vllm-cpu): the schedule must not be chosen; one that costs 1%: the schedule still wins and is chosen.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.results_folders import grid, write_sweep
from spectune.results.reader import load_results
from spectune.results.schema import SCHEDULE_FOLDER
from spectune.tune.markdown import recommendation_markdown
from spectune.tune.recommend import RecommendOptions, recommend

STATIC = {1: {0: 100.0, 1: 130.0, 2: 150.0}, 4: {0: 300.0, 1: 280.0, 2: 250.0}, 16: {0: 600.0, 1: 500.0, 2: 420.0}}
COSTLY = {1: {0: 80.0, 1: 125.0, 2: 145.0}, 4: {0: 240.0, 1: 270.0, 2: 240.0}, 16: {0: 480.0, 1: 480.0, 2: 400.0}}
CHEAP = {c: {k: v * 0.99 for k, v in by_k.items()} for c, by_k in STATIC.items()}
SERVER = {"engine": "vllm", "pinned": "num_speculative_tokens = max K, num_speculative_tokens_per_batch_size "
          "[[1, max_num_seqs, K]]", "source": "vllm/v1/spec_decode/llm_base_proposer.py (propose)",
          "costs_more": True, "max_k": 2}


def sweep(tmp: Path, schedule: dict | None) -> Path:
    """A sweep folder of the static table, with a schedule-server folder of ``schedule`` when given."""
    plan = {"steps": [0, 1, 2], "concurrency": [1, 4, 16]}
    folder = write_sweep(tmp / "sweep", grid(STATIC), plan)
    if schedule is not None:
        sub = write_sweep(folder / SCHEDULE_FOLDER, grid(schedule, server="schedule:2"))
        (sub / "sweep.json").write_text(json.dumps({"plan": plan, "backend": {"backend": "vllm",
                                                                              "schedule_server": SERVER}}))
    return folder


@pytest.fixture
def costly(tmp_path):
    return recommend(load_results(sweep(tmp_path, COSTLY)), RecommendOptions())


@pytest.fixture
def cheap(tmp_path):
    return recommend(load_results(sweep(tmp_path, CHEAP)), RecommendOptions())


def test_priced_on_static_cells_the_schedule_wins(tmp_path):
    rec = recommend(load_results(sweep(tmp_path, None)), RecommendOptions())
    assert rec.primary.kind == "schedule"


def test_a_schedule_server_that_costs_more_is_not_chosen(costly):
    assert (costly.primary.kind, costly.primary.num_steps) == ("static", 0)


def test_the_reason_names_the_concurrency_where_the_schedule_loses(costly):
    assert "schedule server K=1 vs static K=0" in costly.primary.reason


def test_the_schedule_is_chosen_on_the_schedule_servers_cells(costly):
    assert [(ch.concurrency, ch.steps) for ch in costly.schedule_choices] == [(1, 2), (4, 1), (16, 0)]


def test_the_floor_cost_is_measured_per_concurrency(costly):
    k0 = {c["concurrency"]: round(c["cost"], 3) for c in costly.server_costs if c["steps"] == 0}
    assert k0 == {1: 0.2, 4: 0.2, 16: 0.2}


def test_recommendation_md_states_the_floor_cost(costly):
    md = recommendation_markdown(costly, {}, None, {}, "sweep")
    assert "K=0 inside a vllm schedule server: 20.0% slower than no drafter at concurrency 16" in md


def test_a_cheap_schedule_server_still_wins(cheap):
    assert cheap.primary.kind == "schedule"


def test_a_cheap_schedule_servers_slots(cheap):
    assert [(s.lower, s.upper, s.steps) for s in cheap.slots] == [(1, 1, 2), (2, None, 0)]


def test_recommendation_json_carries_the_schedule_cells(cheap):
    data = cheap.to_json()
    assert {(c["steps"], c["concurrency"], c["server"]) for c in data["schedule_cells"]} == \
        {(k, c, "schedule") for c in STATIC for k in STATIC[c]}
