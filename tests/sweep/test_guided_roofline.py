"""The guided plan's step-time model on a roofline step time (spectune.sweep.guided.roofline) and its leave-one-out
error (StepTimeModel._loo_error): a verify step that is memory-bound at small batch x tokens and compute-bound above
the ridge has a gain of a draft token that changes sign with the batch, which the linear feature sets cannot follow."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from spectune.sweep.guided import GuidedPlanner, acceptance_lengths
from spectune.sweep.guided.roofline import fit_roofline

STEPS, CONC = (0, 1, 2, 3, 4), (1, 2, 4, 8, 16, 32)
PP = [0.8, 0.65, 0.5, 0.4]
AL = acceptance_lengths(PP, range(5))


def roofline_ms(k: int, c: int) -> float:
    """A roofline step, ms: memory-bound 6 + 0.05 c, compute-bound 0.3 c (K + 1), drafts K (0.5 + 0.01 c)."""
    return max(6 + 0.05 * c, 0.3 * c * (k + 1)) + k * (0.5 + 0.01 * c)


#: roofline_ms's parameters in RooflineFit.theta's order and unit (s): m0, m1, v, d0, d1
ROOFLINE_THETA = (0.006, 0.00005, 0.0003, 0.0005, 0.00001)


def linear_ms(k: int, c: int) -> float:
    """A step linear in every term, ms (the tests' kind of cost model)."""
    return 2 + 0.5 * c + 3 * (k > 0) + 0.4 * k + 0.1 * c * k


def points(cells, tau_ms, noise: float = 0.0, seed: int = 0) -> list[dict]:
    """Closed-loop points of the step time ``tau_ms(K, c)`` with relative noise ``noise`` on the throughput."""
    rng = np.random.default_rng(seed)
    out = []
    for k, c in cells:
        tau = tau_ms(k, c) / 1000 * (1 + noise * rng.standard_normal())
        out.append({"steps": k, "concurrency": c, "status": "ok", "acceptance": {"per_position": PP[:k]},
                    "metrics": {"output_throughput_tok_s": c * AL[k] / tau, "tpot_p50_ms": tau / AL[k] * 1e3,
                                "acceptance_length": AL[k]}})
    return out


def linear_only() -> GuidedPlanner:
    """A planner whose model never takes the roofline family (the linear terms it replaces where they misfit)."""
    planner = GuidedPlanner(STEPS, CONC)
    core = planner._fit_core
    planner._fit_core = lambda obs, family="linear", names=None: core(obs, "linear", names)
    return planner


def test_the_roofline_fit_recovers_an_exact_roofline():
    cells = list(itertools.product(STEPS, CONC))
    fit = fit_roofline([k for k, _ in cells], [c for _, c in cells], [roofline_ms(k, c) / 1000 for k, c in cells])
    assert fit is not None
    assert fit.theta == pytest.approx(ROOFLINE_THETA, rel=1e-6)


def test_the_roofline_fit_needs_seven_cells():
    cells = list(itertools.product((0, 4), (1, 8, 32)))
    assert fit_roofline([k for k, _ in cells], [c for _, c in cells],
                        [roofline_ms(k, c) / 1000 for k, c in cells]) is None


def test_the_roofline_fit_places_each_cell_on_its_side_of_the_ridge():
    cells = list(itertools.product(STEPS, CONC))
    fit = fit_roofline([k for k, _ in cells], [c for _, c in cells], [roofline_ms(k, c) / 1000 for k, c in cells])
    assert [fit.compute_bound(k, c) for k, c in cells] == [0.3 * c * (k + 1) > 6 + 0.05 * c for k, c in cells]


# cells a guided run measures on the way: the seed, one or more at every concurrency
KINKED = [(4, 1), (0, 32), (1, 32), (0, 8), (2, 32), (2, 2), (1, 4), (1, 16), (2, 8), (3, 1), (2, 1)]


def test_on_a_roofline_server_the_fit_takes_the_roofline():
    planner = GuidedPlanner(STEPS, CONC)
    planner.predict(points(KINKED, roofline_ms, noise=0.01))
    assert planner.fit_info["features"].startswith("roofline")


def test_on_a_linear_server_the_fit_keeps_the_linear_terms():
    planner = GuidedPlanner(STEPS, CONC)
    planner.predict(points(KINKED, linear_ms, noise=0.01))
    assert not planner.fit_info["features"].startswith("roofline")


def test_the_roofline_fit_predicts_the_best_num_steps_the_linear_terms_miss():
    """At concurrency 8 the roofline server's best num_steps is 2 (K=1 and K=3 at 0.88 and 0.89 of it); with only
    K=0 measured there (noise-free), the roofline fit predicts K=2 best, where the linear terms predict K=1."""
    cells = [x for x in KINKED if x != (2, 8)]
    planner = GuidedPlanner(STEPS, CONC)
    pred = planner.predict(points(cells, roofline_ms))
    assert max(STEPS, key=lambda k: pred[(k, 8)].throughput) == 2
    pred = linear_only().predict(points(cells, roofline_ms))
    assert max(STEPS, key=lambda k: pred[(k, 8)].throughput) == 1


def test_the_leave_one_out_error_is_the_misfit_the_residuals_hide():
    """Fitted with the linear terms only, the roofline server's cells leave a leave-one-out error several times
    their in-sample residual spread; an exactly linear server leaves none."""
    planner = GuidedPlanner(STEPS, CONC)
    cells = planner.cells(points(KINKED, roofline_ms))
    obs = [(x, planner._tau_obs(x)) for x in cells.values()]
    loo, n, _ = planner._loo_error(obs, "linear")
    assert n >= 5
    assert loo > 0.05
    exact = planner.cells(points(KINKED, linear_ms))
    loo_exact, _, _ = planner._loo_error([(x, planner._tau_obs(x)) for x in exact.values()], "linear")
    assert loo_exact < 1e-6


def test_a_misfit_sets_the_relative_error_of_unmeasured_cells():
    """The roofline server's cells fitted with the linear terms only (noise-free): the leave-one-out misfit, not the
    in-sample residual spread, sets the relative error of every prediction."""
    planner = linear_only()
    planner.predict(points(KINKED, roofline_ms))
    assert planner.fit_info["loo_error"] > 0.05
    assert planner.fit_info["relative_error"] == pytest.approx(planner.fit_info["loo_error"], rel=1e-6)


def noisy_points(tau_ms, seed: int, noise: float = 0.03) -> list[dict]:
    """points() of the KINKED cells with relative noise ``noise``, each with its 95% interval (+- 1.96 noise)."""
    out = points(KINKED, tau_ms, noise=noise, seed=seed)
    for p in out:
        m = p["metrics"]
        v = m["output_throughput_tok_s"]
        m["output_throughput_ci_low"], m["output_throughput_ci_high"] = v * (1 - 1.96 * noise), v * (1 + 1.96 * noise)
    return out


def linear_misfit(tau_ms, seed: int) -> tuple[float, float]:
    """(the misfit the leave-one-out error shows beyond what a correct model would show, the square root of that
    expected squared error) of the linear terms on noisy_points, as StepTimeModel.fit computes them."""
    planner = linear_only()
    cells = planner.cells(noisy_points(tau_ms, seed))
    obs = [(x, planner._tau_obs(x)) for x in cells.values()]
    loo, _, expected = planner._loo_error(obs, "linear", planner._feature_set([x for x, _ in obs]))
    return max(loo * loo - expected, 0.0) ** 0.5, expected ** 0.5


def test_a_left_out_cell_is_expected_to_miss_by_more_than_its_own_noise():
    """With 3% noise per cell, a left-out prediction of a correct model also carries its anchors' noise and the
    reduced fit's at its leverage: the expected error exceeds the cell's own 3%."""
    assert min(linear_misfit(linear_ms, seed)[1] for seed in range(8)) > 0.04


def test_a_correct_model_shows_next_to_no_misfit_on_noisy_cells():
    """The linear terms on a linear server, 3% noise, 8 draws: the misfit beyond the expected error averages under
    1% (with only the cells' own noise subtracted, not the anchors' and the reduced fit's, it is 1-5.5% in each
    draw)."""
    assert np.mean([linear_misfit(linear_ms, seed)[0] for seed in range(8)]) < 0.01


def test_a_wrong_shape_shows_its_misfit_through_the_noise():
    """The linear terms on the roofline server, 3% noise: a misfit over 30% in every one of 8 draws."""
    assert min(linear_misfit(roofline_ms, seed)[0] for seed in range(8)) > 0.3


def test_a_roofline_cell_given_a_wide_deviation_pulls_the_fit_less():
    """A cell read 20% slow moves the fitted parameters less when its relative standard deviation says it is that
    uncertain (sd 0.15 against 0.02 for the others) than with equal weights."""
    cells = list(itertools.product(STEPS, CONC))
    taus = [roofline_ms(k, c) / 1000 * (1.2 if (k, c) == (2, 4) else 1.0) for k, c in cells]
    exact = np.array(ROOFLINE_THETA)

    def off(sd) -> float:
        fit = fit_roofline([k for k, _ in cells], [c for _, c in cells], taus, sd)
        return float(np.max(np.abs(np.array(fit.theta) / exact - 1)))

    assert off([0.15 if kc == (2, 4) else 0.02 for kc in cells]) < 0.5 * off(None)


#: a seed's six cells (num_steps, concurrency) on the linear server, three of them read off by window noise (a
#: step 30% fast at num_steps 4 and 2, 15% fast at 1): the richest feature set these identify fits a step time at
#: concurrency 1 that falls by a sixth from num_steps 1 to 4 (the shape of a recorded 5 x 4 grid's young fit)
YOUNG = [(0, 1), (0, 16), (0, 32), (1, 32), (4, 1), (2, 32)]
YOUNG_OFF = {(4, 1): 0.7, (1, 32): 0.85, (2, 32): 0.7}


def young_points() -> list[dict]:
    """points() of the YOUNG cells with the YOUNG_OFF readings."""
    return points(YOUNG, lambda k, c: linear_ms(k, c) * YOUNG_OFF.get((k, c), 1.0))


def young_richest_fit(planner: GuidedPlanner):
    """The richest identifiable linear fit of young_points, without fit()'s check of its shape in num_steps: raw
    tau(k, c)."""
    cells = planner.cells(young_points())
    obs = [(x, planner._tau_obs(x)) for x in cells.values()]
    return planner._fit_core(obs, "linear", planner._feature_set(list(cells.values())))[3]


def test_the_richest_young_fit_falls_as_num_steps_grows():
    """The premise of the two tests below: the richest fit's step time at concurrency 1 falls from num_steps 1 to 4
    by more than 10%."""
    planner = GuidedPlanner(STEPS, (1, 16, 32))
    assert planner._shape_error(young_richest_fit(planner)) > 0.1


def test_a_fit_whose_step_falls_in_num_steps_gives_way_to_a_smaller_feature_set_that_does_not():
    planner = GuidedPlanner(STEPS, (1, 16, 32))
    tau, _ = planner.fit(planner.cells(young_points()))
    assert all(tau(k, c) <= tau(k + 1, c) for c in (1, 16, 32) for k in STEPS[:-1])


def test_the_smaller_feature_set_is_recorded_in_the_fit():
    planner = GuidedPlanner(STEPS, (1, 16, 32))
    planner.predict(young_points())
    assert planner.fit_info["features"] != ", ".join(planner._feature_set(list(planner.cells(young_points()).values())))


def test_a_fit_with_no_smaller_set_to_give_way_to_is_as_wrong_as_its_fall():
    """Only the richest feature set allowed: the fit keeps its fall in num_steps, and its relative error is at least
    that fall (what the shape is wrong by, with nothing left out to show it)."""
    planner = GuidedPlanner(STEPS, (1, 16, 32))
    planner.FEATURE_SETS = (planner._feature_set(list(planner.cells(young_points()).values())),)
    planner.predict(young_points())
    assert planner.fit_info["relative_error"] >= planner._shape_error(young_richest_fit(planner)) - 1e-12
