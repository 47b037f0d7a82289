"""The guided plan (spectune.sweep.guided): on two emulated servers with different cost models it picks, at every
concurrency, a num_steps whose grid-measured objective is within 3% of the grid's choice, using at most 40% of the
grid's measuring time; predicted cells are marked in summary.csv with intervals and recommend works from them."""

from __future__ import annotations

import csv
import json

import pytest

from spectune.backends.base import BackendOptions
from spectune.loadgen.errors import UserError
from spectune.results.reader import load_results
from spectune.sweep.guided import GuidedPlanner, acceptance_lengths
from spectune.sweep.plan import SweepPlan, parse_budget
from spectune.sweep.run import execute
from spectune.tune.recommend import RecommendOptions, recommend

from helpers.cost_model import COMPUTE_BOUND, MEMORY_BOUND, EmulatedServers

STEPS, CONC = (0, 1, 2, 3, 4), (1, 2, 4, 8, 16)


def plan(design: str, **kw) -> SweepPlan:
    return SweepPlan(steps=STEPS, concurrency=CONC, num_prompts=8, max_tokens=24, design=design, drift_check=False,
                     **kw)


async def grid_then_guided_replay(tmp_path, model, monkeypatch):
    """The grid measured live on the emulated servers, then the guided plan run on the same servers with every point
    it asks for answered by the grid's measurement of that point (its records and its measuring time): the two
    plans see the same numbers, so the test isolates the guided plan's choices and cost from run-to-run noise."""
    from spectune.sweep.run import Sweep

    async with EmulatedServers(model, STEPS) as urls:
        grid = await execute(plan("grid"), "openai", BackendOptions(endpoints=urls), tmp_path / "grid")
        by_key = {(p["steps"], p["concurrency"], p["repeat"]): p for p in grid.points}
        requests = [json.loads(line) for line in (tmp_path / "grid" / "requests.jsonl").read_text().splitlines()]

        async def replay(self, key, base_url, model_name, drift=None):
            for r in requests:
                if (r["steps"], r["concurrency"], r["repeat"]) == key:
                    self.folder.append_request(r)
            recs = [r for r in requests if (r["steps"], r["concurrency"], r["repeat"]) == key]
            return dict(by_key[key]), recs

        monkeypatch.setattr(Sweep, "_point", replay)
        guided = await execute(plan("guided"), "openai", BackendOptions(endpoints=urls), tmp_path / "guided")
    return grid, guided


@pytest.mark.parametrize("model", [COMPUTE_BOUND, MEMORY_BOUND], ids=lambda m: m.name)
async def test_guided_agrees_with_the_grid_at_a_fraction_of_the_cost(tmp_path, model, monkeypatch):
    grid_run, guided_run = await grid_then_guided_replay(tmp_path, model, monkeypatch)
    grid = recommend(load_results(tmp_path / "grid"), RecommendOptions())
    guided = recommend(load_results(tmp_path / "guided"), RecommendOptions())
    for ch in grid.choices:
        mine = next(x for x in guided.choices if x.concurrency == ch.concurrency)
        on_grid = grid.cell(mine.steps, ch.concurrency).objective
        assert on_grid >= 0.97 * grid.cell(ch.steps, ch.concurrency).objective, ch.concurrency
    # measuring time: the grid's own per-point times, summed over the points each plan measured
    seconds = {(p["steps"], p["concurrency"]): p["timing"]["measure_s"] for p in grid_run.points}
    guided_cells = {(p["steps"], p["concurrency"]) for p in guided_run.points}
    assert sum(seconds[c] for c in guided_cells) <= 0.40 * sum(seconds.values())
    assert guided_run.cost["launches"] <= grid_run.cost["launches"]


async def test_predicted_cells_are_marked_with_intervals_and_never_chosen_over_measured(tmp_path):
    async with EmulatedServers(COMPUTE_BOUND, STEPS) as urls:
        outcome = await execute(plan("guided"), "openai", BackendOptions(endpoints=urls), tmp_path / "g")
    with open(tmp_path / "g" / "summary.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    predicted = [r for r in rows if r["predicted"] == "True"]
    assert len(predicted) == len(STEPS) * len(CONC) - outcome.guided["measured_cells"]
    for r in predicted:
        assert float(r["output_throughput_ci_low"]) < float(r["output_throughput_tok_s"]) \
            < float(r["output_throughput_ci_high"])
    assert all(r["predicted"] == "False" for r in rows if r not in predicted)
    rec = recommend(load_results(tmp_path / "g"), RecommendOptions())
    assert all(not rec.cell(ch.steps, ch.concurrency).predicted for ch in rec.choices)


async def test_the_budget_of_points_is_kept(tmp_path):
    async with EmulatedServers(COMPUTE_BOUND, STEPS) as urls:
        outcome = await execute(plan("guided", budget_points=5), "openai", BackendOptions(endpoints=urls),
                                tmp_path / "b")
    assert outcome.cost["points"] <= 5
    assert outcome.guided["stopped"] == "budget of 5 points"


def test_acceptance_length_of_every_smaller_num_steps_from_per_position_acceptance():
    # per position: share of verify steps whose first i+1 drafts were accepted
    assert acceptance_lengths([0.8, 0.56, 0.336], [0, 1, 2, 3]) == pytest.approx({0: 1.0, 1: 1.8, 2: 2.36, 3: 2.696})


def test_the_model_predicts_an_unmeasured_cell_of_an_exact_cost_model():
    """Cells generated from tau = 2 + 0.5 c + 1 K + 0.2 c K (ms) and AL from per-position acceptance: the fitted
    model recovers an unmeasured cell's throughput within 1%."""
    pp = [0.8, 0.6, 0.4, 0.2]
    al = acceptance_lengths(pp, range(5))
    tau = lambda k, c: (2 + 0.5 * c + 1 * k + 0.2 * c * k) / 1000  # noqa: E731

    def point(k: int, c: int) -> dict:
        return {"steps": k, "concurrency": c, "status": "ok", "acceptance": {"per_position": pp[:k]},
                "metrics": {"output_throughput_tok_s": c * al[k] / tau(k, c), "tpot_p50_ms": tau(k, c) / al[k] * 1e3,
                            "acceptance_length": al[k]}}

    planner = GuidedPlanner(STEPS, CONC)
    measured = [point(4, 1), point(0, 16), point(2, 16), point(0, 4), point(1, 2)]
    pred = planner.predict(measured)[(3, 8)]
    assert pred.throughput == pytest.approx(8 * al[3] / tau(3, 8), rel=0.01)
    assert pred.throughput_low < pred.throughput < pred.throughput_high


@pytest.mark.parametrize("text,expected", [("12", (12, None)), ("600s", (None, 600.0)), ("10m", (None, 600.0)),
                                           ("1h", (None, 3600.0)), (None, (None, None))])
def test_budget_parsing(text, expected):
    assert parse_budget(text) == expected


@pytest.mark.parametrize("text", ["0", "-3s", "ten", "5x"])
def test_bad_budget_is_a_user_error(text):
    with pytest.raises(UserError, match="--budget"):
        parse_budget(text)


def test_budget_needs_the_guided_plan():
    with pytest.raises(UserError, match="--plan guided"):
        SweepPlan(budget_points=4).validate()


def test_guided_plan_rejects_goodput():
    with pytest.raises(UserError, match="goodput"):
        SweepPlan(design="guided", objective="goodput").validate()
