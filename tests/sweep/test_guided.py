"""The guided plan (spectune.sweep.guided): on two emulated servers with different cost models it picks, at every
concurrency, a num_steps whose grid-measured objective is within 3% of the grid's choice, using at most 40% of the
grid's measuring time; predicted cells are marked in summary.csv with intervals and recommend works from them."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from spectune.backends.options import BackendOptions
from spectune.core.errors import UserError
from spectune.results.point import SweepPoint
from spectune.results.sweep_meta import SweepMeta
from spectune.results.reader import load_results
from spectune.sweep.guided import GuidedPlanner, acceptance_lengths
from spectune.sweep.guided.model import Cell, _covariance
from spectune.sweep.plan import SweepPlan, parse_budget
from spectune.sweep.run import execute
from spectune.tune.recommend import RecommendOptions, recommend

from helpers.cost_model import COMPUTE_BOUND, MEMORY_BOUND, EmulatedServers, virtual_point

STEPS, CONC = (0, 1, 2, 3, 4), (1, 2, 4, 8, 16, 32)


def plan(design: str, **kw) -> SweepPlan:
    return SweepPlan(steps=STEPS, concurrency=CONC, num_prompts=8, max_tokens=16, design=design, drift_check=False,
                     **kw)


async def virtual_sweep(tmp_path, model, design: str, monkeypatch, noise: float = 0.01):
    """A sweep whose every point is answered by the virtual server of ``model`` (helpers.cost_model.virtual_point:
    the cost model's closed-loop numbers with ``noise`` relative noise, the same for a cell whichever plan asks),
    behind the openai backend on in-process servers (start/switch as usual). Returns the outcome."""
    from spectune.sweep.run import Sweep

    async def virtual(self, key, base_url, model_name, drift=None):
        point, recs = virtual_point(model, key, self.plan.requests_for(key[1]), self.plan.max_tokens, noise)
        for r in recs:
            self.folder.append_request(r)
        return SweepPoint.from_dict(point), recs

    monkeypatch.setattr(Sweep, "_point", virtual)
    async with EmulatedServers(model, STEPS) as urls:
        return await execute(plan(design), "openai", BackendOptions(endpoints=urls), tmp_path / design)


@pytest.mark.parametrize("model", [COMPUTE_BOUND, MEMORY_BOUND], ids=lambda m: m.name)
async def test_guided_agrees_with_the_grid_at_a_fraction_of_the_cost(tmp_path, model, monkeypatch):
    grid_run = await virtual_sweep(tmp_path, model, "grid", monkeypatch)
    guided_run = await virtual_sweep(tmp_path, model, "guided", monkeypatch)
    grid = recommend(load_results(tmp_path / "grid"), RecommendOptions())
    guided = recommend(load_results(tmp_path / "guided"), RecommendOptions())
    for ch in grid.choices:
        mine = next(x for x in guided.choices if x.concurrency == ch.concurrency)
        on_grid = grid.cell(mine.steps, ch.concurrency).objective
        assert on_grid >= 0.97 * grid.cell(ch.steps, ch.concurrency).objective, ch.concurrency
    # measuring time: each point's own duration (the virtual server's), summed over the points each plan measured,
    # plus server starts/switches
    seconds = {d: sum(p.metrics["duration_s"] for p in o.points) + o.cost["switch_s"]
               for d, o in (("grid", grid_run), ("guided", guided_run))}
    assert seconds["guided"] <= 0.40 * seconds["grid"]


def test_a_virtual_window_reads_the_same_whether_a_rule_watched_it_or_not():
    """The grid's windows (no rule) and the guided plan's (a rule that did not stop them) of one cell are the same
    window: both read what their requests give, so neither plan's cells scatter more than the other's."""
    from spectune.sweep.sequential import EarlyStop

    never = EarlyStop("throughput", 8, 48, min_requests=10_000)
    plain = virtual_point(COMPUTE_BOUND, (1, 8, 0), 48, 48, 0.01, 3, None, 0.1)[0]["metrics"]
    watched = virtual_point(COMPUTE_BOUND, (1, 8, 0), 48, 48, 0.01, 3, never, 0.1)[0]["metrics"]
    assert watched["output_throughput_tok_s"] == pytest.approx(plain["output_throughput_tok_s"], rel=1e-12)


def test_prompt_noise_widens_a_virtual_windows_interval_not_its_full_window():
    """A prompt's own factor is the same in every cell and scaled to mean 1: a window of whole turns of the 8
    prompts reads the same with it, while its interval (bootstrap over prompts) widens."""
    def metrics(request_noise: float, prompt_noise: float) -> dict:
        return virtual_point(COMPUTE_BOUND, (1, 8, 0), 48, 48, 0.0, 3, None, request_noise,
                             prompt_noise=prompt_noise)[0]["metrics"]

    assert metrics(0.0, 0.3)["output_throughput_tok_s"] == pytest.approx(
        metrics(0.0, 0.0)["output_throughput_tok_s"], rel=1e-9)
    noisy = {p: metrics(0.05, p) for p in (0.0, 0.3)}
    width = {p: m["output_throughput_ci_high"] - m["output_throughput_ci_low"] for p, m in noisy.items()}
    assert width[0.3] > 3 * width[0.0]


def test_the_grid_choices_differ_between_the_two_cost_models():
    """The two emulated servers call for different num_steps (else agreeing with the grid would be easy)."""
    def tput(m, k, c):
        point = virtual_point(m, (k, c, 0), 8, 16, noise=0.0, request_noise=0.0)[0]
        return point["metrics"]["output_throughput_tok_s"]

    best = {m.name: [max(STEPS, key=lambda k: tput(m, k, c)) for c in CONC] for m in (COMPUTE_BOUND, MEMORY_BOUND)}
    assert best["compute-bound"] != best["memory-bound"]
    assert len(set(best["compute-bound"])) >= 2  # and the choice changes with concurrency


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
    measured_c = {int(r["concurrency"]) for r in rows if r["predicted"] == "False"}
    assert all(not rec.cell(ch.steps, ch.concurrency).predicted for ch in rec.choices if ch.concurrency in measured_c)


async def test_under_slos_a_predicted_cell_is_never_eligible(tmp_path):
    """The model predicts no tail latency or SLO attainment, so with SLOs a predicted cell cannot count as meeting
    them (before: its empty SLO columns read as no violation, and a num_steps measured nowhere became the best
    static one on docs/examples/smollm2-cpu/sweep-guided)."""
    async with EmulatedServers(COMPUTE_BOUND, STEPS) as urls:
        await execute(plan("guided", slo_tpot_ms=1000.0), "openai", BackendOptions(endpoints=urls), tmp_path / "g")
    rec = recommend(load_results(tmp_path / "g"), RecommendOptions())
    predicted = [c for c in rec.cells if c.predicted]
    assert predicted
    assert not any(c.eligible for c in predicted)


async def test_the_budget_of_points_is_kept(tmp_path):
    async with EmulatedServers(COMPUTE_BOUND, STEPS) as urls:
        outcome = await execute(plan("guided", budget_points=5), "openai", BackendOptions(endpoints=urls),
                                tmp_path / "b")
    assert outcome.cost["points"] <= 5
    assert outcome.guided["stopped"] == "budget of 5 points"


def test_acceptance_length_of_every_smaller_num_steps_from_per_position_acceptance():
    # per position: share of verify steps whose first i+1 drafts were accepted
    assert acceptance_lengths([0.8, 0.56, 0.336], [0, 1, 2, 3]) == pytest.approx({0: 1.0, 1: 1.8, 2: 2.36, 3: 2.696})


def test_positions_a_cell_did_not_draft_do_not_count_as_rejected():
    """The bundled engine's counters cover every position up to the largest swept num_steps, so a K=1 point reports
    [p0, 0, 0, 0]; the acceptance of K=2 at that concurrency must come from the cell that drafted position 1 (K=4
    at c=1), not from those zeros (docs/examples/smollm2-cpu/sweep-guided, first run: AL(2) predicted 1.49)."""
    def point(k: int, c: int, pp: list[float]) -> dict:
        return {"steps": k, "concurrency": c, "status": "ok", "acceptance": {"per_position": pp},
                "metrics": {"output_throughput_tok_s": 10.0 * c, "tpot_p50_ms": 50.0,
                            "acceptance_length": 1 + sum(pp[:k])}}

    measured = [point(4, 1, [0.49, 0.19, 0.10, 0.05]), point(1, 2, [0.48, 0.0, 0.0, 0.0]), point(0, 2, []),
                point(0, 32, []), point(1, 32, [0.47, 0.0, 0.0, 0.0])]
    pred = GuidedPlanner(STEPS, CONC).predict(measured)[(2, 2)]
    assert pred.acceptance_length == pytest.approx(1 + 0.48 + 0.19)


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


@pytest.mark.parametrize("args,message", [
    (["--plan", "foo"], "--plan must be grid or guided"),
    (["--budget", "5"], "--budget works with --plan guided only"),
    (["--plan", "guided", "--budget", "5x"], "bad --budget '5x'"),
    (["--order", "random"], "--order must be auto, interleaved or blocks"),
])
def test_bad_plan_options_are_one_line_errors(args, message):
    import subprocess
    import sys

    from helpers.paths import ROOT

    proc = subprocess.run([sys.executable, "-m", "spectune.cli", "sweep", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {proc.stderr.strip()[7:]}"]
    assert message in proc.stderr


def test_sweep_table_shows_intervals_and_predicted_cells():
    from rich.console import Console

    from spectune.sweep.display import summary_table

    measured = {"steps": 0, "concurrency": 1, "repeat": 0, "status": "ok",
                "metrics": {"output_throughput_tok_s": 100.0, "output_throughput_ci_low": 95.0,
                            "output_throughput_ci_high": 104.0, "tpot_p50_ms": 10.0, "acceptance_length": 1.0}}
    predicted = {"steps": 2, "concurrency": 1, "repeat": 0, "status": "ok", "predicted": True,
                 "metrics": {"output_throughput_tok_s": 150.0, "tpot_p50_ms": 7.0, "acceptance_length": 1.8}}
    console = Console(width=200, record=True)
    console.print(summary_table([measured], (0, 2), (1,), predicted=[predicted]))
    text = console.export_text()
    assert "100.0 [95.0, 104.0] tok/s" in text
    assert "predicted" in text
    assert "150.0 tok/s *" not in text  # a predicted cell is never the row's best


def test_the_seed_measures_num_steps_0_and_1_at_the_same_concurrency():
    """The draft model's fixed per-step cost (the jump in step time from K=0 to K=1) is identified only by K=0 and
    K=1 measured at one concurrency."""
    seed = GuidedPlanner(STEPS, CONC).seed()
    assert {c for k, c in seed if k == 0} & {c for k, c in seed if k == 1}


def test_only_the_first_run_of_the_seeds_acceptance_cell_stops_at_the_minimum():
    """The largest num_steps at the smallest concurrency is measured for its per-position acceptance counters."""
    planner = GuidedPlanner(STEPS, CONC)
    assert planner.window_goal((STEPS[-1], CONC[0], 0)) == "seed_acceptance"
    assert planner.window_goal((1, CONC[0], 0)) is None


def test_a_settle_run_is_not_cut_at_the_minimum():
    assert GuidedPlanner(STEPS, CONC).window_goal((STEPS[-1], CONC[0], 1)) is None


def test_on_four_or_more_concurrencies_the_seeds_pair_is_at_the_second_largest():
    """The pair at the second largest concurrency leaves the largest to the model where the pair's settles on no
    speculation (docs/sweep.md, "Guided plan" 3, and spectune/sweep/guided/seed.py)."""
    seed = GuidedPlanner(STEPS, CONC).seed()
    assert [(k, c) for k, c in seed if k in (0, 1) and c == CONC[-2]] == [(0, CONC[-2]), (1, CONC[-2])]


def test_on_four_or_more_concurrencies_the_seed_measures_nothing_at_the_largest():
    assert not [c for _, c in GuidedPlanner(STEPS, CONC).seed() if c == CONC[-1]]


def test_the_seeds_batch_dependence_cell_is_num_steps_0_at_the_lower_middle_concurrency():
    assert (0, 4) in GuidedPlanner(STEPS, (1, 4, 16, 32)).seed()


def test_on_three_concurrencies_the_seeds_pair_is_at_the_largest():
    seed = GuidedPlanner(STEPS, (1, 4, 16)).seed()
    assert {(0, 16), (1, 16), (0, 4)} <= set(seed)


def pair_at_second_largest_concurrency(ratio: float) -> list[dict]:
    """Points of num_steps 0 and 1 at the second largest concurrency (the seed's pair), K=1's throughput ``ratio``
    times K=0's."""
    def point(k: int, tput: float) -> dict:
        return {"steps": k, "concurrency": CONC[-2], "status": "ok",
                "metrics": {"output_throughput_tok_s": tput, "tpot_p50_ms": 1000.0 / tput, "acceptance_length": 1.5}}
    return [point(0, 100.0), point(1, 100.0 * ratio)]


def test_where_speculation_pays_at_the_pairs_batch_the_fifth_seed_cell_is_the_middle_num_steps_there():
    planner = GuidedPlanner(STEPS, CONC)
    assert planner.seed_followup(planner.cells(pair_at_second_largest_concurrency(1.2))) == (2, 16)


def test_where_speculation_does_not_pay_at_the_pairs_batch_the_fifth_seed_cell_is_num_steps_1_at_the_middle():
    """K=1 within the noise band of K=0 at the pair's concurrency: does not pay there."""
    planner = GuidedPlanner(STEPS, CONC)
    assert planner.seed_followup(planner.cells(pair_at_second_largest_concurrency(1.01))) == (1, 4)


def test_the_fifth_seed_cell_is_the_round_after_the_seed():
    planner = GuidedPlanner(STEPS, CONC)
    seed = planner.next_round([], set())
    assert planner.next_round(exact_points(planner, seed), set(seed)) == [full_seed(planner)[-1]]


def draft_fixed_cost_ms(k: int, c: int) -> float:
    """Step time of exact_points' default model, ms: 2 + 0.5 c + 3 (K>0) + 0.4 K + 0.1 c K."""
    return 2 + 0.5 * c + 3 * (k > 0) + 0.4 * k + 0.1 * c * k


def exact_points(planner: GuidedPlanner, cells, tau_ms=draft_fixed_cost_ms) -> list[dict]:
    """Points of an exact cost model whose verify step takes ``tau_ms(K, c)`` ms (default: with a draft fixed
    cost, draft_fixed_cost_ms), per-position acceptance 0.8, 0.6, 0.4, 0.2."""
    pp = [0.8, 0.6, 0.4, 0.2]
    al = acceptance_lengths(pp, range(5))
    tau = lambda k, c: tau_ms(k, c) / 1000  # noqa: E731
    return [{"steps": k, "concurrency": c, "status": "ok", "acceptance": {"per_position": pp[:k]},
             "metrics": {"output_throughput_tok_s": c * al[k] / tau(k, c), "tpot_p50_ms": tau(k, c) / al[k] * 1e3,
                         "acceptance_length": al[k], "duration_s": 8 * 16 * tau(k, c) / al[k]}}
            for k, c in cells]


def full_seed(planner: GuidedPlanner) -> list[tuple[int, int]]:
    """The seed's four cells and the fifth chosen from their exact_points."""
    seed = planner.seed()
    return seed + [planner.seed_followup(planner.cells(exact_points(planner, seed)))]


def test_the_seed_and_one_more_cell_identify_the_draft_models_fixed_cost():
    """Cells of an exact cost model with a draft fixed cost (exact_points): from the seed and one more cell the fit
    uses the K>0 feature and predicts an unmeasured cell within 1% (a model linear in K spreads the jump over the
    per-token slope)."""
    planner = GuidedPlanner(STEPS, CONC)
    pred = planner.predict(exact_points(planner, full_seed(planner) + [(2, 2)]))[(1, 4)]
    expected = exact_points(planner, [(1, 4)])[0]["metrics"]["output_throughput_tok_s"]
    assert "K>0" in planner.fit_info["features"].split(", ")
    assert pred.throughput == pytest.approx(expected, rel=0.01)


def with_interval(point: dict, rel_halfwidth: float, scale: float = 1.0) -> dict:
    """``point`` with its throughput scaled by ``scale`` and a throughput interval of relative half-width
    ``rel_halfwidth`` around it."""
    m = dict(point["metrics"])
    t = m["output_throughput_tok_s"] * scale
    m.update(output_throughput_tok_s=t, output_throughput_ci_low=t * (1 - rel_halfwidth),
             output_throughput_ci_high=t * (1 + rel_halfwidth))
    return {**point, "metrics": m}


def off_by(outlier_halfwidth: float) -> float:
    """Relative error of the prediction of the unmeasured (1, 4) when, of eight exact cells measured within +-2%,
    (2, 2) reads 15% high with an interval of half-width ``outlier_halfwidth``."""
    planner = GuidedPlanner(STEPS, CONC)
    cells = [(4, 1), (0, 32), (1, 32), (0, 8), (2, 32), (2, 2), (0, 2), (1, 16)]
    points = [with_interval(p, outlier_halfwidth, 1.15) if (p["steps"], p["concurrency"]) == (2, 2)
              else with_interval(p, 0.02) for p in exact_points(planner, cells)]
    pred = planner.predict(points)[(1, 4)]
    return abs(pred.throughput / exact_points(planner, [(1, 4)])[0]["metrics"]["output_throughput_tok_s"] - 1)


def test_a_cell_measured_with_a_wide_interval_pulls_the_fit_less_than_a_precise_one():
    """Inverse-variance weights: the same 15% misreading moves an unmeasured cell's prediction less when its
    window's interval says it is that uncertain (an early-stopped window of a few requests) than when it claims
    +-2%."""
    assert off_by(0.16) < 0.5 * off_by(0.02)


def settled_after_seed(planner: GuidedPlanner) -> tuple[list[dict], list[tuple[int, int]], list[int]]:
    """(exact points of the full seed and K=1, 2 at the seed's middle concurrency, those cells, the concurrencies
    with nothing measured whose choice the model settles from them)."""
    seed = full_seed(planner) + [(1, 8), (2, 8)]
    points = exact_points(planner, seed)
    preds = planner.predict(points)
    settled = [c for c in CONC if all(cc != c for _, cc in seed)
               and planner.settled_by_model(preds, c, STEPS) is not None]
    return points, seed, settled


def test_after_seven_exact_cells_the_model_settles_some_concurrency():
    assert settled_after_seed(GuidedPlanner(STEPS, CONC))[2]


def test_a_concurrency_the_model_settles_gets_no_cell():
    planner = GuidedPlanner(STEPS, CONC)
    points, seed, settled = settled_after_seed(planner)
    proposed = planner.next_round(points, set(seed), width=len(STEPS) * len(CONC))
    assert not [c for _, c in proposed if c in settled]


def test_with_slos_a_concurrency_the_model_settles_still_gets_its_predicted_best():
    """SLO attainment is measured, never predicted: each concurrency opens with its predicted best num_steps."""
    planner = GuidedPlanner(STEPS, CONC, measure_every_concurrency=True)
    points, seed, settled = settled_after_seed(planner)
    preds = planner.predict(points)
    proposed = planner.next_round(points, set(seed), width=len(STEPS) * len(CONC))
    assert {(planner.settled_by_model(preds, c, STEPS), c) for c in settled} <= set(proposed)


def test_a_plan_with_an_slo_measures_every_concurrency():
    assert GuidedPlanner.for_plan(plan("guided", slo_ttft_ms=500.0)).measure_every_concurrency


def test_a_plan_without_slos_may_leave_a_concurrency_to_the_model():
    assert not GuidedPlanner.for_plan(plan("guided")).measure_every_concurrency


def compute_bound_ms(k: int, c: int) -> float:
    """Step time of a compute-bound exact model, ms: 2 + 0.5 c (K + 1) + 1 (K>0). Its best num_steps falls with
    concurrency: 3 at 1, 2 at 2 and 4, 0 from 8 up (exact_points' acceptance)."""
    return 2 + 0.5 * c * (k + 1) + 1.0 * (k > 0)


def neighbours_case(cells: list[tuple[int, int]]) -> tuple[GuidedPlanner, dict, dict, set]:
    """A planner fed compute_bound_ms's exact points of ``cells``: (planner, its cells, its predictions, tried)."""
    planner = GuidedPlanner(STEPS, CONC)
    points = exact_points(planner, cells, compute_bound_ms)
    return planner, planner.cells(points), planner.predict(points), set(cells)


BRACKET_CELLS = [(4, 1), (0, 32), (1, 32), (0, 8), (1, 8), (0, 1), (1, 1), (2, 1), (3, 1)]


def test_a_concurrency_between_two_that_settled_on_the_same_num_steps_is_settled_on_it():
    """num_steps 0 won at 8 and at 32 (nothing else worth measuring there): 16 between them gets 0 (the best
    num_steps does not rise with concurrency)."""
    planner, cells, preds, tried = neighbours_case(BRACKET_CELLS)
    assert planner.settled_by_neighbours(cells, preds, 16, tried) == 0


def test_a_concurrency_between_two_that_settled_on_different_num_steps_is_not_settled_by_them():
    planner, cells, preds, tried = neighbours_case(BRACKET_CELLS)  # 3 at concurrency 1, 0 at 8
    assert planner.settled_by_neighbours(cells, preds, 4, tried) is None


def test_above_a_concurrency_settled_on_no_speculation_every_larger_one_is_settled_on_it():
    planner, cells, preds, tried = neighbours_case([(4, 1), (0, 1), (1, 1), (2, 1), (3, 1), (0, 8), (1, 8)])
    assert planner.settled_by_neighbours(cells, preds, 32, tried) == 0


def test_a_neighbour_with_a_num_steps_still_worth_measuring_settles_nothing(monkeypatch):
    planner, cells, preds, tried = neighbours_case(BRACKET_CELLS)
    real = planner.values
    monkeypatch.setattr(planner, "values", lambda cells, preds, c, open_: {2: 0.01} if c == 8 else real(
        cells, preds, c, open_))
    assert planner.settled_by_neighbours(cells, preds, 16, tried) is None


def test_neighbours_settle_nothing_the_model_predicts_otherwise(monkeypatch):
    planner, cells, preds, tried = neighbours_case(BRACKET_CELLS)
    monkeypatch.setattr(planner, "_predicted_choice", lambda preds, c, open_: 1)
    assert planner.settled_by_neighbours(cells, preds, 16, tried) is None


def test_a_concurrency_its_neighbours_settle_gets_no_cell_and_sweep_json_says_so(monkeypatch):
    """With the model's own test out of the way (settled_by_model None), 16 is still left to the model: by its
    neighbours, as sweep.json's ``guided.left_to_model`` records."""
    planner = GuidedPlanner(STEPS, CONC)
    monkeypatch.setattr(planner, "settled_by_model", lambda preds, c, open_: None)
    points = exact_points(planner, BRACKET_CELLS, compute_bound_ms)
    proposed = planner.next_round(points, set(BRACKET_CELLS), width=len(STEPS) * len(CONC))
    assert not [c for _, c in proposed if c == 16]
    assert planner.describe()["left_to_model"]["16"] == {"steps": 0, "by": "neighbours"}


NO_SPECULATION_AT_8 = [(4, 1), (0, 1), (1, 1), (2, 1), (3, 1), (0, 8), (1, 8)]


def still_settling_at_8(planner: GuidedPlanner, monkeypatch) -> None:
    """num_steps 2 at concurrency 8 stays worth measuring there, and the model settles no concurrency itself."""
    real = planner.values
    monkeypatch.setattr(planner, "values", lambda cells, preds, c, open_: {2: 0.01} if c == 8 and 2 in open_
                        else real(cells, preds, c, open_))
    monkeypatch.setattr(planner, "settled_by_model", lambda preds, c, open_: None)


def test_above_a_concurrency_still_settling_where_no_speculation_leads_the_first_cell_waits(monkeypatch):
    planner, cells, preds, tried = neighbours_case(NO_SPECULATION_AT_8)
    still_settling_at_8(planner, monkeypatch)
    assert planner.awaits_neighbour(cells, preds, 32, tried)


def test_above_a_concurrency_where_speculation_leads_the_first_cell_does_not_wait(monkeypatch):
    """compute_bound_ms: num_steps 3 leads at concurrency 1, so 2 (above it) opens at once."""
    planner, cells, preds, tried = neighbours_case([(4, 1), (0, 1), (1, 1), (2, 1), (3, 1)])
    assert not planner.awaits_neighbour(cells, preds, 2, tried)


def test_a_waiting_first_cell_comes_after_every_cell_of_some_value(monkeypatch):
    """The cell at 8 still worth measuring goes first: once it settles 8 on num_steps 0, 16 and 32 above it are
    left to the model (settled_by_neighbours) instead of opened."""
    planner = GuidedPlanner(STEPS, CONC)
    still_settling_at_8(planner, monkeypatch)
    points = exact_points(planner, NO_SPECULATION_AT_8, compute_bound_ms)
    proposed = planner.next_round(points, set(NO_SPECULATION_AT_8), width=len(STEPS) * len(CONC))
    assert proposed.index((2, 8)) < min(i for i, (_, c) in enumerate(proposed) if c in (16, 32))


def test_a_waiting_first_cell_is_still_proposed_last(monkeypatch):
    """Deferred, not dropped: where the neighbour settles on something else, the concurrency is opened after all."""
    planner = GuidedPlanner(STEPS, CONC)
    still_settling_at_8(planner, monkeypatch)
    points = exact_points(planner, NO_SPECULATION_AT_8, compute_bound_ms)
    proposed = planner.next_round(points, set(NO_SPECULATION_AT_8), width=len(STEPS) * len(CONC))
    assert {c for _, c in proposed[-2:]} == {16, 32}


async def test_a_concurrency_left_to_the_model_gets_its_predicted_best_as_the_choice(tmp_path, monkeypatch):
    """A guided sweep without SLOs on the compute-bound virtual server: where nothing was measured, recommend
    chooses among the predicted cells (the best, or a smaller num_steps within the band of it) and says so."""
    outcome = await virtual_sweep(tmp_path, COMPUTE_BOUND, "guided", monkeypatch)
    rec = recommend(load_results(tmp_path / "guided"), RecommendOptions())
    unmeasured = [ch for ch in rec.choices
                  if all(rec.cell(k, ch.concurrency).predicted for k in STEPS if rec.cell(k, ch.concurrency))]
    assert unmeasured, "every concurrency was measured: the test shows nothing"
    assert outcome.guided["predicted_concurrencies"] == [ch.concurrency for ch in unmeasured]
    for ch in unmeasured:
        best = max(rec.cell(k, ch.concurrency).objective for k in STEPS)
        assert ch.tier == "predicted", ch.concurrency
        assert rec.cell(ch.steps, ch.concurrency).objective >= (1 - ch.band) * best, ch.concurrency


def test_a_prediction_far_from_the_measured_cells_gets_a_wider_interval():
    """K=0 at a concurrency where only K=2 was measured: the jump across the draft's fixed cost comes from the fit's
    parameters alone, so its interval is wider than the residual spread gives (leverage)."""
    planner = GuidedPlanner(STEPS, CONC)
    pred = planner.predict(exact_points(planner, full_seed(planner) + [(2, 2)]))[(0, 2)]
    residual_band = planner.z * planner.fit_info["relative_error"]
    assert (pred.throughput_high - pred.throughput) / pred.throughput > 2 * residual_band


def test_one_cell_at_a_time_where_switching_is_cheap():
    """Between cells the model is refitted, so each cell is chosen with everything measured so far."""
    planner = GuidedPlanner(STEPS, CONC)
    seed = full_seed(planner)
    assert len(planner.next_round(exact_points(planner, seed), set(seed))) == 1


def test_one_launch_per_round_where_a_restart_costs_more_than_a_point():
    """Every open cell of one num_steps at once: a round costs one restart."""
    planner = GuidedPlanner(STEPS, CONC)
    seed = full_seed(planner)
    cells = planner.next_round(exact_points(planner, seed), set(seed), all_threats=True)
    assert len({k for k, _ in cells}) == 1


def test_a_round_as_wide_as_the_servers_takes_the_most_valuable_cells_first():
    """``width`` servers side by side (a Ray cluster): the round is that many cells, the first of them the cell a
    one-server round takes."""
    planner = GuidedPlanner(STEPS, CONC)
    seed = full_seed(planner)
    points = exact_points(planner, seed)
    one = planner.next_round(points, set(seed))
    three = planner.next_round(points, set(seed), width=3)
    assert len(set(three)) == 3
    assert three[0] == one[0]


def test_a_wide_round_for_a_costly_restart_takes_that_many_num_steps():
    planner = GuidedPlanner(STEPS, CONC)
    seed = full_seed(planner)
    points = exact_points(planner, seed)
    assert len({k for k, _ in planner.next_round(points, set(seed), all_threats=True, width=2)}) == 2


def test_a_round_for_a_costly_restart_takes_more_than_one_cell():
    planner = GuidedPlanner(STEPS, CONC)
    seed = full_seed(planner)
    assert len(planner.next_round(exact_points(planner, seed), set(seed), all_threats=True)) > 1


def test_a_round_for_a_costly_restart_opens_the_most_concurrencies_with_nothing_measured():
    """After the seed, K=2 is the predicted best at two of the concurrencies with nothing measured and K=1 at one
    (an exact model whose draft costs 0.8 ms per token per sequence): the round launches K=2 (summed as infinities,
    the counts tied and the round went to the smaller num_steps)."""
    def tau_ms(k: int, c: int) -> float:
        return 8 + c + (k > 0) + 0.5 * k + 0.8 * c * k + 0.2 * c * (k > 0)

    planner = GuidedPlanner(STEPS, CONC, measure_every_concurrency=True)  # the model would settle some of them
    seed = planner.next_round([], set())
    tried = set(seed) | set(planner.next_round(exact_points(planner, seed, tau_ms), set(seed)))
    points = exact_points(planner, sorted(tried), tau_ms)
    preds = planner.predict(points)
    open_c = [c for c in CONC if all(cc != c for _, cc in tried)]
    best = [max(STEPS, key=lambda k: preds[(k, c)].throughput) for c in open_c]
    top = max(set(best), key=best.count)
    assert {k for k, _ in planner.next_round(points, tried, all_threats=True)} == {top}


def test_the_expected_duration_of_a_cell_is_the_nearest_points_tokens_over_its_predicted_throughput():
    planner = GuidedPlanner(STEPS, CONC)
    points = exact_points(planner, [(0, 1), (0, 32)])
    cells = planner.cells(points)
    pred = planner.predict(points)[(2, 1)]
    tokens = points[0]["metrics"]["duration_s"] * points[0]["metrics"]["output_throughput_tok_s"]
    assert planner._duration(cells, pred) == pytest.approx(tokens / pred.throughput)


@pytest.mark.parametrize("k,value,sd,worth", [
    (3, 99.0, 2.0, False),  # optimistic 102.3 beats the band (102) but expects 0.06% more: not worth a point
    (3, 99.0, 6.0, True),  # expects 1.2% beyond the band
    (1, 100.5, 0.5, False),  # a smaller num_steps tied with the best: at most the band to gain
])
def test_a_cell_is_measured_only_if_it_could_beat_the_best_by_the_band_and_is_expected_to(k, value, sd, worth):
    """Best measured at c=4: 100 tok/s (K=2); noise band 2%, so the target is 102; worth measuring: optimistic
    (one-sided 95%) above 102 and expected improvement beyond it at least a quarter of the band (0.5 tok/s)."""
    from spectune.sweep.guided import Prediction

    planner = GuidedPlanner(STEPS, CONC)
    measured = {"steps": 2, "concurrency": 4, "status": "ok",
                "metrics": {"output_throughput_tok_s": 100.0, "tpot_p50_ms": 10.0, "acceptance_length": 2.0}}
    z = planner.z
    preds = {(k, 4): Prediction(k, 4, 2.0, value, value - z * sd, value + z * sd, 10.0, 9.0, 11.0)}
    assert (k in planner.values(planner.cells([measured]), preds, 4, [k])) is worth


def measured_pair(ratio: float, noise: float, runs: int = 1, requests: int = 32) -> tuple[list[dict], dict]:
    """Points and request objects of K=0 and K=1 at concurrency 1, each run ``runs`` times: ``requests`` requests of
    64 tokens whose latencies scatter by ``noise`` (relative standard deviation, a seeded generator) around a run
    of exactly 100 tok/s (K=0) and ``ratio`` times that (K=1)."""

    rng = np.random.default_rng(7)
    points, records = [], {}
    for k, speed in ((0, 100.0), (1, 100.0 * ratio)):
        for r in range(runs):
            lat = 1 + noise * rng.standard_normal(requests)
            lat = 64 / speed * lat / lat.mean()  # s per request: exactly ``speed`` tokens/s over the run
            recs = [{"steps": k, "concurrency": 1, "repeat": r, "prompt_id": f"p{i}", "error": None,
                     "chunk_times": 8, "completion_tokens": 64, "e2e_ms": float(x * 1e3)} for i, x in enumerate(lat)]
            records[(k, 1, r)] = recs
            points.append({"steps": k, "concurrency": 1, "repeat": r, "status": "ok",
                           "metrics": {"output_throughput_tok_s": 64 * requests / float(lat.sum())}})
    return points, records


def test_a_tie_that_rests_on_a_wide_interval_is_measured_again():
    """K=1 6% faster than K=0 with noisy requests: the interval of K=0 / K=1 reaches the 2% band, so recommend would
    call a tie only because of the noise; the planner asks for one more run of one of the two cells."""
    planner = GuidedPlanner(STEPS, CONC)
    points, records = measured_pair(1.06, 0.12)
    [cmp] = planner.comparisons(points, records)
    assert cmp["verdict"] == "unsettled"
    assert planner.settle(points, records) in ([(0, 1, 1)], [(1, 1, 1)])


def test_of_two_cells_with_as_many_runs_the_smaller_num_steps_is_measured_again():
    """Even where the best's requests scatter more: a second run of the best would widen recommend's tie band by the
    best cell's own run-to-run spread (a drifting engine's 6% between two runs of K=1 made K=0, 10% slower, a tie on
    the bundled engine, 2026-11-26)."""
    planner = GuidedPlanner(STEPS, CONC)
    points, records = measured_pair(1.07, 0.10)
    for r in records[(1, 1, 0)]:  # K=1's requests scatter 1.5 times as much around the same mean
        r["e2e_ms"] = 640.0 / 1.07 + 1.5 * (r["e2e_ms"] - 640.0 / 1.07)
    assert planner.settle(points, records) == [(0, 1, 1)]


def test_a_tie_one_more_run_could_not_turn_is_not_measured_again():
    """K=1 6% faster, its requests scattering three times as much as K=0's: one more run of K=0 narrows the ratio's
    interval too little to leave the band, so the tie stands without it (switch probability under 1%)."""
    planner = GuidedPlanner(STEPS, CONC)
    points, records = measured_pair(1.06, 0.12)
    for r in records[(1, 1, 0)]:
        r["e2e_ms"] = 640.0 / 1.06 + 3 * (r["e2e_ms"] - 640.0 / 1.06)
    [cmp] = planner.comparisons(points, records)
    assert cmp["switch_probability"] < 0.01
    assert cmp["verdict"] == "tie"


def with_windows(points: list[dict], pair_s: float, others_s: float) -> list[dict]:
    """``points`` (measured_pair's) with windows of ``pair_s`` seconds, and K=0 measured in full at concurrencies 2,
    4 and 8 in windows of ``others_s`` seconds."""
    out = [{**p, "metrics": {**p["metrics"], "duration_s": pair_s}} for p in points]
    return out + [{"steps": 0, "concurrency": c, "repeat": 0, "status": "ok",
                   "metrics": {"output_throughput_tok_s": 100.0, "duration_s": others_s}} for c in (2, 4, 8)]


def test_an_unsettled_pair_of_long_windows_is_not_measured_again():
    """The pair of test_a_tie_that_rests_on_a_wide_interval_is_measured_again, its windows 40 s against 2 s for the
    plan's other full windows: one more run costs 2.3 mean windows, and its expected gain (its switch probability x
    what the best gains beyond the band) is under a quarter of the band per mean window. With windows as long as
    the others it is measured again."""
    planner = GuidedPlanner(STEPS, CONC)
    points, records = measured_pair(1.06, 0.12)
    [cmp] = planner.comparisons(with_windows(points, 40.0, 2.0), records)
    assert cmp["settle_cost"] > 2
    assert cmp["verdict"] == "tie"
    assert planner.comparisons(with_windows(points, 2.0, 2.0), records)[0]["verdict"] == "unsettled"


def test_an_early_stopped_window_is_compared_on_the_prompts_both_cells_measured():
    """K=0 stopped early after its first 13 prompts, K=1 15% faster on every prompt and run over 26, the last six
    1.6 times as costly: over the whole windows K=0 / K=1 is 0.99 (a tie); on the 13 prompts both measured it is
    1 / 1.15, and the comparison that decides the choice finds K=0 loses, as recommend does."""
    planner = GuidedPlanner(STEPS, CONC)
    points, records = [], {}
    for k, n, speed in ((0, 13, 100.0), (1, 26, 115.0)):
        lat = [64 / speed * (1.6 if i >= 20 else 1.0) for i in range(n)]
        records[(k, 1, 0)] = [{"steps": k, "concurrency": 1, "repeat": 0, "prompt_id": f"p{i}", "error": None,
                               "chunk_times": 8, "completion_tokens": 64, "e2e_ms": x * 1e3} for i, x in enumerate(lat)]
        points.append({"steps": k, "concurrency": 1, "repeat": 0, "status": "ok",
                       "metrics": {"output_throughput_tok_s": 64 * n / sum(lat)}})
    assert points[0]["metrics"]["output_throughput_tok_s"] / points[1]["metrics"]["output_throughput_tok_s"] > 0.98
    [cmp] = planner.comparisons(points, records)
    assert cmp["ratio"] == pytest.approx(1 / 1.15)
    assert cmp["verdict"] == "loses"


def test_a_clear_difference_is_settled():
    planner = GuidedPlanner(STEPS, CONC)
    points, records = measured_pair(1.06, 0.01)
    assert planner.settle(points, records) == []


def test_a_difference_inside_the_band_is_a_settled_tie():
    planner = GuidedPlanner(STEPS, CONC)
    points, records = measured_pair(1.01, 0.12)
    assert planner.comparisons(points, records)[0]["verdict"] == "tie"


def test_settling_stops_at_its_share_of_repeats():
    """Each cell gets at most SETTLE_REPEATS runs beyond the plan's repeats, however unsettled."""
    planner = GuidedPlanner(STEPS, CONC)
    points, records = measured_pair(1.07, 0.15, runs=1 + GuidedPlanner.SETTLE_REPEATS)
    assert planner.comparisons(points, records)[0]["verdict"] == "unsettled"
    assert planner.settle(points, records) == []


def test_the_cell_with_fewer_runs_is_measured_again_first():
    planner = GuidedPlanner(STEPS, CONC)
    points, records = measured_pair(1.06, 0.12, runs=2)
    points = [p for p in points if not (p["steps"] == 1 and p["repeat"] == 1)]
    assert planner.settle(points, records) == [(1, 1, 1)]  # K=1 has one run, K=0 two


async def test_a_guided_sweep_measures_an_unsettled_pair_again(tmp_path, monkeypatch):
    """A server whose K=1 is 6% faster than K=0 with noisy requests: after the seed the tie rests on the interval's
    width, so the sweep measures the pair again (a repeat of each, one at a time) and records the deciding comparison
    in sweep.json."""
    import json


    from spectune.sweep.run import Sweep

    async def noisy(self, key, base_url, model_name, drift=None):
        k, c, r = key
        rng = np.random.default_rng([k, r])
        lat = 1 + 0.12 * rng.standard_normal(32)
        lat = 64 / (100.0 * (1.06 if k else 1.0)) * lat / lat.mean()
        recs = [{"steps": k, "concurrency": c, "repeat": r, "prompt_id": f"p{i}", "error": None, "chunk_times": 8,
                 "completion_tokens": 64, "e2e_ms": float(x * 1e3)} for i, x in enumerate(lat)]
        for rec in recs:
            self.folder.append_request(rec)
        tput = 64 * 32 / float(lat.sum())
        return SweepPoint.from_dict({
            "steps": k, "concurrency": c, "repeat": r, "status": "ok", "error": "",
            "metrics": {"output_throughput_tok_s": tput, "tpot_p50_ms": 1e3 / tput, "acceptance_length": 1 + k,
                        "num_requests": 32, "total_output_tokens": 64 * 32, "duration_s": float(lat.sum())},
            "acceptance": {"per_position": [0.5][:k], "num_drafts": 100}}), recs

    monkeypatch.setattr(Sweep, "_point", noisy)
    p = SweepPlan(steps=(0, 1), concurrency=(1,), num_prompts=8, max_tokens=16, design="guided", drift_check=False)
    async with EmulatedServers(COMPUTE_BOUND, (0, 1)) as urls:
        outcome = await execute(p, "openai", BackendOptions(endpoints=urls), tmp_path / "g")
    assert {(q.steps, q.repeat) for q in outcome.points} >= {(0, 1), (1, 1)}
    guided = json.loads((tmp_path / "g" / "sweep.json").read_text())["guided"]
    assert guided["comparisons"][0]["steps"] == 0


def test_a_pair_whose_ratio_beats_the_band_by_a_hair_is_not_measured_again():
    """K=1 2.2% faster (0.2% beyond the 2% band, less than a quarter of it): more runs could gain too little."""
    planner = GuidedPlanner(STEPS, CONC)
    points, records = measured_pair(1.022, 0.12)
    assert planner.comparisons(points, records)[0]["verdict"] == "tie"


def test_a_grid_without_a_middle_concurrency_gets_a_three_cell_seed():
    """Two concurrencies: no middle one to measure K=0 at (the other end is opened by its predicted best right after
    the seed); with three or more the seed keeps the batch-dependence cell."""
    assert len(GuidedPlanner((0, 1, 2, 3, 5), (1, 64)).seed()) == 3
    assert len(GuidedPlanner((0, 1, 2, 3, 5), (1, 4, 16, 64)).seed()) == 4


def test_a_switch_makes_a_cell_of_another_num_steps_cost_more():
    """Of the cells worth measuring (every concurrency opened), the best value per window second goes first when
    switching is free; with a switch that costs far more than any window, a cell on the running server does."""
    cells_ = sorted(set(full_seed(GuidedPlanner(STEPS, CONC)) + [(0, c) for c in CONC] + [(2, c) for c in CONC]))
    planner = GuidedPlanner(STEPS, CONC)
    planner.rounds = [[], []]
    points = exact_points(planner, cells_)
    cells, preds = planner.cells(points), planner.predict(points)
    worth = {k for c in CONC for k in planner.values(cells, preds, c, [k for k in STEPS if (k, c) not in cells_])}
    [free] = planner.next_round(points, set(cells_))
    current = next(k for k in sorted(worth) if k != free[0])
    [costly] = planner.next_round(points, set(cells_), current=current, launch_s=1e6)
    assert costly[0] == current
    assert planner.why[-1]["switch_s"] == 0.0


async def test_sweep_json_says_why_each_cell_was_measured(tmp_path, monkeypatch):
    import json

    outcome = await virtual_sweep(tmp_path, COMPUTE_BOUND, "guided", monkeypatch)
    why = json.loads((tmp_path / "guided" / "sweep.json").read_text())["guided"]["why"]
    measured = [p.key.cell for p in outcome.points]
    assert sorted((w["steps"], w["concurrency"]) for w in why) == sorted(measured)
    assert all(w["reason"] for w in why)


@pytest.mark.parametrize("model", [COMPUTE_BOUND, MEMORY_BOUND], ids=lambda m: m.name)
@pytest.mark.parametrize("steps,concs,share", [((0, 1, 2, 3, 5), (1, 4, 16, 64), 0.35),
                                               (STEPS, CONC, 0.25)], ids=["5x4", "5x6"])
async def test_with_windows_that_stop_early_the_guided_plan_takes_a_quarter_to_a_third_of_the_grids_time(
        tmp_path, model, steps, concs, share, monkeypatch):
    """5 x 4 (num_steps 0,1,2,3,5 x concurrency 1,4,16,64) and 5 x 6 grids, 48 prompts of 48 tokens, virtual
    windows with 10% per-request noise that the guided plan's stop rule ends early (helpers.cost_model.virtual_point
    with a rule): the grid's choice within 3% at every concurrency, in at most 35% (5 x 4) and 25% (5 x 6) of the
    grid's measuring time (the modelled windows; the emulated servers switch for free)."""
    from spectune.sweep.run import Sweep

    async def virtual(self, key, base_url, model_name, drift=None):
        rule = self._early_stop(key, self.plan.requests_for(key[1])) if drift is None else None
        point, recs = virtual_point(model, key, self.plan.requests_for(key[1]), self.plan.max_tokens, 0.01, 0, rule,
                                    0.10)
        for r in recs:
            self.folder.append_request(r)
        return SweepPoint.from_dict(point), recs

    monkeypatch.setattr(Sweep, "_point", virtual)
    runs = {}
    for design in ("grid", "guided"):
        p = SweepPlan(steps=steps, concurrency=concs, num_prompts=48, max_tokens=48, design=design,
                      drift_check=False)
        async with EmulatedServers(model, steps) as urls:
            runs[design] = await execute(p, "openai", BackendOptions(endpoints=urls), tmp_path / design)
    grid = recommend(load_results(tmp_path / "grid"), RecommendOptions())
    guided = recommend(load_results(tmp_path / "guided"), RecommendOptions())
    for ch in grid.choices:
        mine = next(x for x in guided.choices if x.concurrency == ch.concurrency)
        assert grid.cell(mine.steps, ch.concurrency).objective >= 0.97 * grid.cell(ch.steps, ch.concurrency).objective
    seconds = {d: sum(p.metrics["duration_s"] for p in o.points) for d, o in runs.items()}
    assert seconds["guided"] <= share * seconds["grid"]
    assert any((p.early_stop or {}).get("reason") for p in runs["guided"].points)


def test_a_cells_expected_seconds_stop_at_the_window_cap_plus_its_drain():
    """The nearest measured window (concurrency 8: 4096 tokens in 20.48 s, 128 per request) predicts 64 s for a
    concurrency-1 cell at 64 tok/s; with --duration 30 the window ends at 30 s plus one request's drain (128 tokens
    at 64 tok/s: 2 s), as the bundled engine's concurrency-1 windows do (30-31.6 s on 2026-11-26)."""
    from spectune.sweep.guided import Prediction
    from spectune.sweep.guided.model import Cell

    cells = {(0, 8): Cell(0, 8, 200.0, 40.0, 1.0, [], 0.05, 128.0, 1.0, 20.48)}
    pred = Prediction(1, 1, 1.5, 64.0, 60.0, 68.0, 15.0, 14.0, 16.0)
    assert GuidedPlanner(STEPS, CONC)._duration(cells, pred) == pytest.approx(64.0)
    assert GuidedPlanner(STEPS, CONC, window_cap_s=30.0)._duration(cells, pred) == pytest.approx(32.0)


def model_case(k0: tuple[float, float, float], k1: tuple[float, float, float]) -> tuple[GuidedPlanner, dict]:
    """num_steps 0-2 at an unmeasured concurrency 16, predicted: 0 at ``k0``, 1 at ``k1`` (tokens/s, low, high), 2 at
    188.1 [172.3, 203.9]. (planner, preds)."""
    from spectune.sweep.guided.model import Prediction

    planner = GuidedPlanner((0, 1, 2), (1, 16))
    rows = {0: k0, 1: k1, 2: (188.1, 172.3, 203.9)}
    return planner, {(k, 16): Prediction(k, 16, 1.0 + k / 2, *v, 10.0, 9.0, 11.0) for k, v in rows.items()}


def test_a_concurrency_is_not_left_to_the_model_where_recommends_tie_could_cost_more_than_the_band():
    """The docs example grid replayed (2026-11-27): at concurrency 16 the model put num_steps 1 at 212.6 [199.2,
    226.1] and 0 at 209.8 [196.6, 223.0]. Its predicted best, 1, had no rival worth measuring, but recommend takes the
    smaller num_steps of a tie, 0, and 1 may beat that by more than the band (the grid measured 0.891 of 1 there)."""
    planner, preds = model_case((209.8, 196.6, 223.0), (212.6, 199.2, 226.1))
    assert planner.settled_by_model(preds, 16, [0, 1, 2]) is None


def test_left_to_the_model_the_choice_is_recommends_the_smaller_num_steps_within_the_band():
    planner, preds = model_case((209.8, 208.0, 211.6), (212.6, 210.8, 214.4))  # 1 is 1.3% ahead: a tie
    assert planner.settled_by_model(preds, 16, [0, 1, 2]) == 0


def turn_case(c1: dict[int, float]) -> tuple[GuidedPlanner, dict, dict, set]:
    """num_steps 0-2 at concurrency 1, 4, 16, by hand: at 1 every num_steps measured (``c1``: num_steps ->
    tokens/s), at 16 num_steps 0 and 1 (300, 280; 2 predicted at 250 [240, 260]: settled on 0), at 4 only num_steps 1
    (200), with num_steps 0 predicted at 198 [185, 211] (its optimistic bound past 200 x 1.02, its expected
    improvement beyond the band 0.33% of 200, under the 0.5% bar) and 2 at 170 [160, 180]. (planner, cells, preds,
    tried)."""
    from spectune.sweep.guided.model import Cell, Prediction

    planner = GuidedPlanner((0, 1, 2), (1, 4, 16))
    measured = {**{(k, 1): v for k, v in c1.items()}, (0, 16): 300.0, (1, 16): 280.0, (1, 4): 200.0}
    cells = {kc: Cell(kc[0], kc[1], v, 10.0, 1.0 + kc[0] / 2, [], 0.05) for kc, v in measured.items()}

    def pred(k: int, c: int, v: float, lo: float, hi: float) -> Prediction:
        return Prediction(k, c, 1.0 + k / 2, v, lo, hi, 10.0, 9.0, 11.0)

    preds = {kc: pred(*kc, v, v * 0.95, v * 1.05) for kc, v in measured.items()}
    preds.update({(2, 16): pred(2, 16, 250.0, 240.0, 260.0), (0, 4): pred(0, 4, 198.0, 185.0, 211.0),
                  (2, 4): pred(2, 4, 170.0, 160.0, 180.0)})
    return planner, cells, preds, set(measured)


TURNS = {0: 100.0, 1: 120.0, 2: 110.0}  # concurrency 1 settles on num_steps 1, 16 on 0: the choice turns at 4


def test_the_usual_rules_leave_a_rival_under_the_expected_improvement_bar_unmeasured():
    planner, cells, preds, tried = turn_case(TURNS)
    assert planner.values(cells, preds, 4, [0, 2]) == {}


def test_where_the_choice_turns_the_neighbours_num_steps_is_measured_however_small_its_expected_improvement():
    planner, cells, preds, tried = turn_case(TURNS)
    assert set(planner.rivals_at_turn(cells, preds, 4, tried, [0, 2])) == {0}


def test_where_the_choice_turns_a_neighbours_num_steps_the_model_puts_past_the_band_is_measured_too():
    """The model's interval is what a turn sharper than its shape defeats: 180 [170, 190] against the measured 200."""
    from spectune.sweep.guided.model import Prediction

    planner, cells, preds, tried = turn_case(TURNS)
    preds[(0, 4)] = Prediction(0, 4, 1.0, 180.0, 170.0, 190.0, 10.0, 9.0, 11.0)
    assert set(planner.rivals_at_turn(cells, preds, 4, tried, [0, 2])) == {0}


def test_where_the_neighbours_settled_on_the_same_num_steps_nothing_turns():
    planner, cells, preds, tried = turn_case({0: 120.0, 1: 100.0, 2: 90.0})  # 1 settles on 0 too
    assert planner.rivals_at_turn(cells, preds, 4, tried, [0, 2]) == {}


def test_where_two_num_steps_were_measured_the_turn_adds_nothing():
    from spectune.sweep.guided.model import Cell

    planner, cells, preds, tried = turn_case(TURNS)
    cells[(2, 4)] = Cell(2, 4, 170.0, 10.0, 2.0, [], 0.05)
    assert planner.rivals_at_turn(cells, preds, 4, tried | {(2, 4)}, [0]) == {}


def test_the_parameter_covariance_is_that_of_the_weighted_fit_under_each_cells_noise():
    """The sandwich (spectune.sweep.guided.model._covariance) against 4000 weighted least-squares fits of cells
    whose relative errors have the given variances (0.02 to 0.15 sd): every parameter's variance within 10%."""
    names = ("1", "c", "K", "c*K", "K>0")
    cells = [(4, 1), (0, 32), (1, 32), (0, 8), (1, 8), (1, 1), (0, 1), (2, 4), (0, 4)]
    obs = [(Cell(k, c, 1.0, 1.0, 1.0, [], 0.0), draft_fixed_cost_ms(k, c) / 1000) for k, c in cells]
    sd = np.array([0.08, 0.01, 0.02, 0.025, 0.03, 0.05, 0.05, 0.04, 0.05])
    weights_sd = np.sqrt(sd ** 2 + 0.02 ** 2)  # the fit's weights need not match the noise
    feat = lambda k, c: GuidedPlanner._features(k, c, names)  # noqa: E731
    X = np.array([feat(x.steps, x.conc) for x, _ in obs])
    y = np.array([t for _, t in obs])
    w = 1 / (y * weights_sd)
    rng = np.random.default_rng(7)
    thetas = [np.linalg.lstsq(X * w[:, None], y * (1 + sd * rng.standard_normal(len(y))) * w, rcond=None)[0]
              for _ in range(4000)]
    empirical = np.var(thetas, axis=0, ddof=1)
    predicted = np.diag(_covariance(feat, obs, sd ** 2, weights_sd))
    assert predicted == pytest.approx(empirical, rel=0.1)


def test_with_equal_weights_and_one_variance_the_covariance_is_var_times_the_inverse_design():
    names = ("1", "c", "K")
    cells = [(0, 1), (1, 4), (2, 16), (3, 2)]
    obs = [(Cell(k, c, 1.0, 1.0, 1.0, [], 0.0), 0.001 * (1 + c + k)) for k, c in cells]
    feat = lambda k, c: GuidedPlanner._features(k, c, names)  # noqa: E731
    Z = np.array([feat(x.steps, x.conc) for x, _ in obs]) / np.array([t for _, t in obs])[:, None]
    assert _covariance(feat, obs, 0.03 ** 2) == pytest.approx(0.03 ** 2 * np.linalg.inv(Z.T @ Z))


def test_a_guided_plans_settle_run_measures_its_whole_window():
    """A settle run (a repeat beyond --repeats) adds a replicate on the prompts the cell's first run measured; cut
    short it would narrow recommend's comparison to its own first prompts (Sweep._early_stop)."""
    from types import SimpleNamespace

    from spectune.sweep.run import Sweep

    plan = SweepPlan(steps=(0, 1), concurrency=(1,), design="guided")
    sweep = Sweep(plan, None, SimpleNamespace(points=[]), [], SweepMeta())  # type: ignore[arg-type]
    sweep.planner = GuidedPlanner.for_plan(plan)
    assert sweep._early_stop((1, 1, 0), 32) is not None  # the plan's own windows stop early
    assert sweep._early_stop((1, 1, 1), 32) is None
