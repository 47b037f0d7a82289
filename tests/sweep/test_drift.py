"""Drift control end to end on emulated servers (tests/helpers/cost_model.py): the run order, and a server whose
speed changes by 20% halfway through the sweep is caught by the drift check; recommend then refuses to call
differences smaller than the drift expected between the two cells' measurements (spectune.results.drift)."""

from __future__ import annotations

import json

import pytest

from spectune.backends.options import BackendOptions
from spectune.results.drift import DriftBand, midpoint_s
from spectune.results.reader import load_results
from spectune.sweep.plan import SweepPlan
from spectune.sweep.run import execute
from spectune.tune.recommend import Cell, RecommendOptions, choose, recommend

from helpers.cost_model import COMPUTE_BOUND, EmulatedServers

pytestmark = pytest.mark.timing  # run alone, after the parallel part (pyproject.toml)

STEPS, CONC, REQUESTS, WARMUP = (0, 2), (1, 2, 4), 8, 1
#: steps 3x the compute-bound model's (11-15 ms): client and servers share one event loop, and its fixed cost per
#: step (0.5-2 ms on a busy 2-core machine) would otherwise dilute the 1.25x slower steps to a 10% loss (a clean-clone
#: CI run measured 0.907x)
MODEL = COMPUTE_BOUND.scaled(3.0)


def plan(**kw) -> SweepPlan:
    return SweepPlan(steps=STEPS, concurrency=CONC, num_prompts=8, max_tokens=12, requests_per_point=REQUESTS,
                     warmup_requests=WARMUP, **kw)


async def sweep(tmp_path, factor: float, **kw):
    points = len(STEPS) * len(CONC)
    # the speed changes with the first request after half the points (the reference, one of the first three points,
    # is measured before it in full)
    half = points // 2 * (REQUESTS + WARMUP) + 1
    async with EmulatedServers(MODEL, STEPS, drift_factor=factor, drift_after_requests=half) as urls:
        outcome = await execute(plan(order="interleaved", **kw), "openai", BackendOptions(endpoints=urls),
                                tmp_path / "out")
    return outcome, json.loads((tmp_path / "out" / "sweep.json").read_text())


async def test_a_server_that_slows_by_20_percent_halfway_is_caught(tmp_path):
    outcome, meta = await sweep(tmp_path, factor=1.25)  # steps take 1.25x as long: throughput -20%
    drift = meta["drift"]
    (check,) = drift["checks"]
    assert check["label"] == "end of sweep"
    assert drift["drifted"] is True
    assert 0.75 < check["ratio"] < 0.9  # the reference lost about 20% of its throughput
    assert check["high"] < 0.98  # the whole interval is below the noise band
    assert drift["change"] == check["change"]
    assert outcome.drift == drift


async def test_the_drift_check_records_the_seconds_between_its_two_measurements(tmp_path):
    _, meta = await sweep(tmp_path, factor=1.25)
    (check,) = meta["drift"]["checks"]
    points = [json.loads(x) for x in (tmp_path / "out" / "points.jsonl").read_text().splitlines()]
    ref = next(p for p in points if (p["steps"], p["concurrency"]) == (check["steps"], check["concurrency"]))
    # the re-measurement runs after every point: the span reaches past the middle of the last point
    last = max(midpoint_s(p) for p in points)
    assert check["span_s"] >= last - midpoint_s(ref)


async def test_recommend_warns_of_the_drift(tmp_path):
    await sweep(tmp_path, factor=1.25)
    rec = recommend(load_results(tmp_path / "out"), RecommendOptions())
    assert any("drift check" in w for w in rec.warnings)


def cells(gap_s: float) -> list[Cell]:
    """K=0 at 0.93 of K=1 at concurrency 1 (no intervals: the point ratio decides), measured ``gap_s`` apart."""
    return [Cell(0, 1, "ok", 1, 1, objective=93.0, at_s=1000.0), Cell(1, 1, "ok", 1, 1, objective=100.0,
                                                                     at_s=1000.0 + gap_s)]


#: a check that moved 10% over 900 s
DRIFT = DriftBand.from_sweep({"checks": [{"drifted": True, "change": 0.10, "span_s": 900.0}]})


def test_cells_measured_back_to_back_are_compared_within_the_noise_band():
    """10 s of a 900-s drift of 10%: sqrt(10 / 900) * 10% = 1.1% of drift, under the 2% band; K=0 at 0.93 loses."""
    assert choose(cells(10.0), 1, RecommendOptions(), DRIFT).steps == 1


def test_cells_measured_the_whole_span_apart_tie_within_the_drift():
    assert choose(cells(900.0), 1, RecommendOptions(), DRIFT).steps == 0


def test_the_drift_share_grows_with_the_square_root_of_the_gap():
    assert DRIFT.between(0.0, 225.0) == pytest.approx(0.05)  # a quarter of the span: half the change


def test_the_drift_share_is_at_most_the_checks_change():
    assert DRIFT.between(0.0, 3600.0) == pytest.approx(0.10)


def test_a_check_without_its_span_widens_every_comparison_by_its_change():
    """sweep.json written before the span was recorded: the whole change, as recommend did then."""
    old = DriftBand.from_sweep({"checks": [{"drifted": True, "change": 0.10}]})
    assert choose(cells(10.0), 1, RecommendOptions(), old).steps == 0


def test_checks_within_noise_add_no_drift():
    steady = DriftBand.from_sweep({"checks": [{"drifted": False, "change": 0.10, "span_s": 900.0}]})
    assert steady.between(0.0, 900.0) == 0.0


async def test_a_steady_server_passes_the_drift_check(tmp_path):
    """A 5% noise band: windows of 8 twelve-token requests on the emulated server move a few percent with the
    scheduling of a shared 2-core CI machine alone (one clean-clone run flagged the steady server at the default 2%),
    while the 20% change above stays far outside it."""
    _, meta = await sweep(tmp_path, factor=1.0, noise_band=0.05)
    assert meta["drift"]["drifted"] is False


async def test_interleaved_order_alternates_num_steps_at_each_concurrency(tmp_path):
    _, meta = await sweep(tmp_path, factor=1.0)
    order = [(p["steps"], p["concurrency"]) for p in map(json.loads, (tmp_path / "out" / "points.jsonl")
                                                          .read_text().splitlines())]
    assert order == [(0, 1), (2, 1), (0, 2), (2, 2), (0, 4), (2, 4)]
    assert meta["order"] == "interleaved"
    assert (tmp_path / "out" / "drift_requests.jsonl").is_file()  # the re-measurement's requests, kept apart


async def test_blocks_order_rechecks_each_block(tmp_path):
    async with EmulatedServers(COMPUTE_BOUND, STEPS) as urls:
        outcome = await execute(plan(order="blocks"), "openai", BackendOptions(endpoints=urls), tmp_path / "out")
    labels = [c["label"] for c in outcome.drift["checks"]]
    assert labels == ["block K=0", "block K=2", "end of sweep"]
    assert outcome.cost["drift_points"] == 3
    assert outcome.cost["points"] == 6


def test_order_is_interleaved_where_switching_is_cheap():
    from spectune.backends.local.backend import LocalBackend
    from spectune.backends.openai import OpenAIBackend

    assert SweepPlan().order_for(LocalBackend.cheap_switch) == "interleaved"
    assert SweepPlan().order_for(OpenAIBackend.cheap_switch) == "blocks"


def test_interleaved_repeats_reverse_the_num_steps_order():
    p = SweepPlan(steps=(0, 1, 2), concurrency=(4,), repeats=2)
    assert p.ordered(p.points(), "interleaved") == [(0, 4, 0), (1, 4, 0), (2, 4, 0), (2, 4, 1), (1, 4, 1), (0, 4, 1)]


async def test_a_guided_sweeps_drift_reference_is_a_window_measured_in_full(tmp_path):
    """The guided plan's early-stopped windows are its shortest, but each reports its rule's statistic over its
    first requests, which a full re-measurement would not read like: the end-of-sweep check re-measures the
    shortest window that ran in full."""
    guided = SweepPlan(steps=(0, 1, 2, 4), concurrency=(1, 2), num_prompts=32, max_tokens=16, design="guided",
                       dataset="random")
    async with EmulatedServers(COMPUTE_BOUND, guided.steps) as urls:
        await execute(guided, "openai", BackendOptions(endpoints=urls), tmp_path / "g")
    points = [json.loads(x) for x in (tmp_path / "g" / "points.jsonl").read_text().splitlines()]
    (check,) = json.loads((tmp_path / "g" / "sweep.json").read_text())["drift"]["checks"]
    measured = [p for p in points if p.get("drift_check") is None]
    ref = next(p for p in measured if (p["steps"], p["concurrency"], p["repeat"])
               == (check["steps"], check["concurrency"], check["repeat"]))
    assert any((p.get("early_stop") or {}).get("reason") for p in measured)  # there were shorter ones to avoid
    assert not (ref.get("early_stop") or {}).get("reason")


def _point(steps: int, duration_s: float, stopped: bool):
    from spectune.results.point import SweepPoint

    return SweepPoint.from_dict({"steps": steps, "concurrency": 1, "metrics": {"duration_s": duration_s},
                                 "early_stop": {"reason": "above_best"} if stopped else None})


def test_when_the_first_windows_all_stopped_early_the_reference_is_a_later_full_one():
    from types import SimpleNamespace

    from spectune.sweep.run import Sweep

    points = [_point(0, 5.0, True), _point(1, 6.0, True), _point(2, 30.0, False), _point(4, 20.0, False)]
    sweep = SimpleNamespace(folder=SimpleNamespace(points=points))
    keys = [p.key for p in points]
    assert Sweep._reference(sweep, keys[:2], keys) == keys[3]  # the shortest full window measured after them
