"""Windows that stop when the decision is settled (spectune.sweep.sequential): the confidence sequence keeps its error
rate when looked at after every request (a fixed-n interval does not), the rule stops for the stated reasons only
after its minimum, and on the emulated servers an early-stopped window's estimate agrees with the full window's
within its interval; summary.csv says which points stopped early and why, and reads back."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass

import numpy as np
import pytest

from spectune.backends.options import BackendOptions
from spectune.results.reader import load_results
from spectune.sweep.plan import SweepPlan
from spectune.sweep.run import execute
from spectune.sweep.sequential import (MIN_SECONDS, EarlyStop, closed_loop_throughput, cs_half_width, prompt_sums,
                                       request_parts)

from helpers.cost_model import COMPUTE_BOUND, EmulatedServers


def _crossings(width, runs: int = 400, n: int = 200, start: int = 8) -> float:
    """Share of simulated runs of n standard-normal draws whose running mean leaves ``width(sd, t)`` of 0 at some
    t >= start."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((runs, n))
    t = np.arange(1, n + 1)
    mean = np.cumsum(x, axis=1) / t
    sq = np.cumsum(x * x, axis=1)
    sd = np.sqrt(np.maximum(sq - t * mean ** 2, 0) / np.maximum(t - 1, 1))
    out = np.zeros(runs, dtype=bool)
    for i in range(start - 1, n):
        w = np.array([width(s, i + 1) for s in sd[:, i]])
        out |= np.abs(mean[:, i]) > w
    return float(out.mean())


def test_the_confidence_sequence_keeps_its_error_rate_over_every_look():
    assert _crossings(lambda sd, t: cs_half_width(sd, t, 0.05, 200)) <= 0.06


def test_a_fixed_n_interval_looked_at_after_every_request_errs_far_more_often():
    """Why the rule needs a confidence sequence: the 95% normal interval, checked after each request, excludes the
    true mean at some point in many more runs than 5%."""
    assert _crossings(lambda sd, t: 1.96 * sd / math.sqrt(t)) > 0.15


def test_the_sequence_narrows_with_more_requests():
    assert cs_half_width(1.0, 400, 0.05, 100) < cs_half_width(1.0, 100, 0.05, 100) < cs_half_width(1.0, 20, 0.05, 100)


@dataclass
class Rec:
    completion_tokens: int
    e2e_s: float
    tpot_s: float | None = None
    ok: bool = True
    prompt_id: str | None = None


def records(n: int, tput_per_request: float, noise: float, seed: int = 0) -> list[Rec]:
    """n requests of 64 tokens whose latencies scatter by ``noise`` around 64 / tput_per_request s."""
    rng = np.random.default_rng(seed)
    lat = 64 / tput_per_request * (1 + noise * rng.standard_normal(n))
    return [Rec(64, float(x), float(x) / 64) for x in lat]


def test_a_cell_clearly_below_the_best_stops_below_best():
    rule = EarlyStop("throughput", 1, 100, reference=120.0)
    assert rule.check(records(20, 100.0, 0.03), 5.0) == "below_best"


def test_a_cell_clearly_above_the_best_stops_above_best_at_half_its_window():
    rule = EarlyStop("throughput", 1, 100, reference=80.0)
    assert rule.check(records(50, 100.0, 0.03), 5.0) == "above_best"


def test_a_cell_above_the_best_runs_on_before_half_its_window():
    """It becomes the reference of its concurrency: a few requests would leave its interval too wide for that."""
    rule = EarlyStop("throughput", 1, 100, reference=80.0)
    assert rule.check(records(20, 100.0, 0.03), 5.0) is None


def test_a_larger_num_steps_that_cannot_beat_the_best_by_the_band_stops():
    """recommend takes the smaller num_steps of a tie: K=3 at 101 tok/s against K=1's 100 needs more than 102 to be
    chosen, and its upper bound is below that."""
    rule = EarlyStop("throughput", 1, 400, reference=100.0, steps=3, reference_steps=1)
    assert rule.check(records(300, 99.0, 0.02), 5.0) == "below_best"


def test_a_smaller_num_steps_within_the_band_of_the_best_takes_the_choice():
    rule = EarlyStop("throughput", 1, 400, reference=100.0, steps=0, reference_steps=1)
    assert rule.check(records(300, 100.5, 0.02), 5.0) == "above_best"


def at_ratio(recs: list[Rec], ratio: float, planned: int, **kw) -> EarlyStop:
    """A throughput rule at concurrency 1 whose reference puts the estimate of ``recs`` at exactly ``ratio`` of it
    (the records' own draw decides no test)."""
    value = EarlyStop("throughput", 1, planned).estimate(recs)[0]
    return EarlyStop("throughput", 1, planned, reference=value / ratio, **kw)


LARGER = {"steps": 3, "reference_steps": 1}  # a larger num_steps than the reference's: its edge is 2% above
SMALLER = {"steps": 0, "reference_steps": 1}  # a smaller one: its edge is 2% below


def test_a_near_tie_that_could_still_take_the_choice_runs_on():
    """1.5% above the reference at 20 of 100 requests, the edge at 2%: the window may well end beyond it."""
    recs = records(20, 100.0, 0.05)
    assert at_ratio(recs, 1.015, 100, **LARGER).check(recs, 5.0) is None


def test_a_near_tie_that_cannot_take_the_choice_in_its_window_stops_futile():
    """1% below the reference at 20 of 100 requests (5% per request): neither bound settles it, and the predictive
    probability that the full window ends 2% above the reference is far under 5%."""
    recs = records(20, 100.0, 0.05)
    assert at_ratio(recs, 0.99, 100, **LARGER).check(recs, 5.0) == "futile"


def test_a_futile_stop_weighs_the_estimates_own_uncertainty():
    """The same near-tie after the minimum 8 requests at 10% per request, of 400: the estimate itself may be 3.5%
    off, so the window runs on (the conditional power at the estimate, sd x sqrt(N - n) / N, would stop it)."""
    recs = records(8, 100.0, 0.10)
    assert at_ratio(recs, 0.99, 400, **LARGER).check(recs, 5.0) is None


def test_a_near_tie_with_many_requests_to_come_runs_on():
    """1% above the reference at 20 of 1000 requests: the rest of the window may still take it past the edge."""
    recs = records(20, 100.0, 0.05)
    assert at_ratio(recs, 1.01, 1000, **LARGER).check(recs, 5.0) is None


def test_a_window_capped_by_time_has_fewer_requests_left_to_change_the_call():
    """The same near-tie with a 6 s cap at 5 s: four requests to come at its rate, too few to pass the edge."""
    recs = records(20, 100.0, 0.05)
    assert at_ratio(recs, 1.01, 1000, max_s=6.0, **LARGER).check(recs, 5.0) == "futile"


def test_a_smaller_num_steps_is_never_stopped_futile():
    """K=0 4% below K=1 at 20 of 100 requests: the rest of the window would not bring it within the band, but a
    window cut short would leave an interval wide enough for recommend's tie rule to hand it the choice; it runs on
    to ``below_best`` or its end."""
    recs = records(20, 100.0, 0.05)
    assert at_ratio(recs, 0.96, 100, **SMALLER).check(recs, 5.0) is None


def test_a_smaller_num_steps_the_full_window_would_leave_within_the_band_stops_within_band():
    """K=0 0.5% below K=1 at 60 of 100 requests (8% per request): its confidence sequence still reaches under
    0.98 of K=1 (no above_best), but the full window ends above 0.98 with predictive probability over 99%, so
    recommend would give K=0 the choice either way."""
    recs = records(60, 100.0, 0.08)
    assert at_ratio(recs, 0.995, 100, **SMALLER).check(recs, 5.0) == "within_band"


def test_a_smaller_num_steps_near_the_edge_runs_on():
    """K=0 1.5% below K=1 at 20 of 100 requests (5% per request): the full window may still end beyond the band."""
    recs = records(20, 100.0, 0.05)
    assert at_ratio(recs, 0.985, 100, **SMALLER).check(recs, 5.0) is None


def test_a_smaller_num_steps_above_the_reference_waits_for_half_its_window():
    """K=0 0.5% above K=1 at 40 of 100 requests (8% per request): it would become its concurrency's reference, so,
    as above_best, it runs at least half its window; at 60 of 100 it stops."""
    recs = records(40, 100.0, 0.08)
    assert at_ratio(recs, 1.005, 100, **SMALLER).check(recs, 5.0) is None
    recs = records(60, 100.0, 0.08)
    assert at_ratio(recs, 1.005, 100, **SMALLER).check(recs, 5.0) == "within_band"


def test_a_larger_num_steps_is_never_stopped_within_band():
    """K=3 1% below K=1: a tie, which recommend gives to the smaller K=1; the rule that can stop it is futile."""
    recs = records(60, 100.0, 0.02)
    assert at_ratio(recs, 0.99, 100, **LARGER).check(recs, 5.0) != "within_band"


def closed_loop(c: int, n: int, stop_after: int | None = None, per_token_s: float = 0.01,
                seed: int = 0) -> tuple[list[dict], float]:
    """requests.jsonl objects of a closed loop of ``c`` slots sending ``n`` requests of 16-128 tokens at
    ``per_token_s`` each, and the window's own tokens/s (tokens over first send to last end). ``stop_after``: the
    window stops once that many have finished; the requests in flight finish and count, nothing more is sent."""
    import heapq

    rng = np.random.default_rng(seed)
    toks = rng.integers(16, 129, n)
    free = [(0.0, i) for i in range(c)]  # (time the slot frees, slot)
    recs: list[dict] = []
    ends: list[float] = []
    for i in range(n):
        t, slot = heapq.heappop(free)
        if stop_after is not None and sum(e <= t for e in ends) >= stop_after:
            break
        lat = float(toks[i]) * per_token_s
        recs.append({"prompt_id": str(i % 32), "error": None, "completion_tokens": int(toks[i]),
                     "e2e_ms": lat * 1e3, "dispatch_delay_s": 0.0, "send": t, "end": t + lat})
        ends.append(t + lat)
        heapq.heappush(free, (t + lat, slot))
    return recs, sum(r["completion_tokens"] for r in recs) / max(r["end"] for r in recs)


def test_the_closed_loop_throughput_is_littles_law():
    recs, _ = closed_loop(4, 40)
    want = 4 * sum(r["completion_tokens"] for r in recs) / sum(r["e2e_ms"] / 1e3 for r in recs)
    assert closed_loop_throughput(recs + [{"error": "boom", "completion_tokens": 0}], 4) == pytest.approx(want)


def test_a_window_cut_short_reads_low_against_its_full_window():
    """Why an early-stopped window reports the rule's statistic, not its own figure: the same closed loop of 4,
    stopped after 12 of 32 requests with those in flight finishing, reads lower by its drain (the last requests
    finishing with the loop no longer full weigh more in it)."""
    _, full = closed_loop(4, 32)
    _, cut = closed_loop(4, 32, stop_after=12)
    assert cut < 0.95 * full


def test_a_tight_estimate_stops_precise_without_a_reference():
    rule = EarlyStop("throughput", 1, 100)
    assert rule.check(records(40, 100.0, 0.005), 5.0) == "precise"


def test_a_window_whose_halves_disagree_is_not_precise():
    """Requests that barely scatter but slow down by 10% halfway (the machine drifts): not a precise result."""
    recs = records(20, 100.0, 0.001) + records(20, 90.0, 0.001, seed=1)
    assert EarlyStop("throughput", 1, 100).check(recs, 5.0) is None


def test_no_stop_before_the_minimum_requests():
    rule = EarlyStop("throughput", 8, 100, reference=200.0)  # two waves of 8: 16 requests
    assert rule.check(records(12, 100.0, 0.01), 5.0) is None


def test_a_window_its_cap_holds_to_under_two_waves_may_stop_after_one():
    """c=8 with a 6 s cap, 12 requests at 5 s: 14.4 by the cap at this rate, under two waves (16), so one wave is
    the minimum and a cell at half the best stops."""
    rule = EarlyStop("throughput", 8, 100, reference=1600.0, max_s=6.0)
    assert rule.check(records(12, 100.0, 0.01), 5.0) == "below_best"


def test_points_jsonl_names_the_minimum_in_force():
    rule = EarlyStop("throughput", 8, 100, reference=1600.0, max_s=6.0)
    rule.check(records(12, 100.0, 0.01), 5.0)
    assert rule.describe()["minimum"] == 8


def test_a_window_its_cap_lets_reach_two_waves_waits_for_them():
    """The same window with a 60 s cap reaches 144 requests by it: two waves stay the minimum."""
    rule = EarlyStop("throughput", 8, 100, reference=1600.0, max_s=60.0)
    assert rule.check(records(12, 100.0, 0.01), 5.0) is None


def test_no_stop_before_the_minimum_seconds():
    rule = EarlyStop("throughput", 1, 100, reference=200.0, min_s=2.0)
    assert rule.check(records(20, 100.0, 0.01), 1.0) is None


def test_a_window_measured_for_its_counters_stops_at_the_minimum():
    """The guided seed's acceptance cell (``at_minimum``): it stops as soon as the minimum is reached, whatever its
    interval, and not before."""
    rule = EarlyStop("throughput", 4, 100, at_minimum="seed_acceptance", min_s=1.0)
    assert rule.check(records(7, 100.0, 0.10), 5.0) is None  # two waves of 4: 8 requests
    assert rule.check(records(8, 100.0, 0.10), 5.0) == "seed_acceptance"


def costly_first(n: int, speed: float) -> tuple[list[Rec], list[dict]]:
    """n requests of prompts p0.. at ``speed`` tokens/s per request, the first 20 prompts 1.3 times as slow: as
    records of a window and as requests.jsonl objects (the reference cell's)."""
    lat = [64 / speed * (1.3 if i < 20 else 1.0) for i in range(n)]
    recs = [Rec(64, x, x / 64, prompt_id=f"p{i}") for i, x in enumerate(lat)]
    return recs, [{"prompt_id": f"p{i}", "error": None, "completion_tokens": 64, "e2e_ms": x * 1e3}
                  for i, x in enumerate(lat)]


def test_a_window_on_costly_first_prompts_is_compared_with_the_reference_on_those_prompts():
    """num_steps 0 as fast as the reference K=1 on every prompt, its window's first 20 prompts the costly ones: on
    those prompts it ties with the reference and takes the choice (the smaller num_steps of a tie)."""
    mine, _ = costly_first(20, 100.0)
    ref_recs, ref_json = costly_first(40, 100.0)
    whole = EarlyStop("throughput", 1, 40).estimate(ref_recs)[0]
    rule = EarlyStop("throughput", 1, 40, reference=whole, steps=0, reference_steps=1,
                     reference_prompts=prompt_sums(ref_json, "throughput"))
    assert rule.check(mine, 5.0) in ("above_best", "within_band")


def test_against_the_references_whole_figure_the_same_window_reads_as_a_loss():
    mine, _ = costly_first(20, 100.0)
    ref_recs, _ = costly_first(40, 100.0)
    whole = EarlyStop("throughput", 1, 40).estimate(ref_recs)[0]
    rule = EarlyStop("throughput", 1, 40, reference=whole, steps=0, reference_steps=1)
    assert rule.check(mine, 5.0) == "below_best"


def test_tpot_objective_stops_a_slower_cell_below_best():
    """TPOT: lower is better; a cell whose TPOT is clearly above the best's by more than the band loses."""
    rule = EarlyStop("tpot", 1, 100, reference=0.5)  # ms; the records' TPOT is 64/100/64 s = 10 ms
    assert rule.check(records(20, 100.0, 0.03), 5.0) == "below_best"


def prompt_costs(n: int, speed: float, noise: float = 0.02, seed: int = 0) -> list[Rec]:
    """n requests of 64 tokens, prompt i of 16 (``p0``..``p15``, each sent in turn) costing 0.5-2 times the mean:
    latencies 64 / ``speed`` x the prompt's cost x (1 + ``noise`` x a normal draw). Prompts differ far more than two
    num_steps on one prompt do, as on the bundled engine (relative sd per request 0.20-0.26 in a window, 0.10-0.15
    paired with another num_steps' window on the same prompts at concurrency 1-8)."""
    cost = np.geomspace(0.5, 2.0, 16)
    rng = np.random.default_rng(seed)
    return [Rec(64, float(64 / speed * cost[i % 16] * (1 + noise * rng.standard_normal())),
                prompt_id=f"p{i % 16}") for i in range(n)]


def paired_rule(ref: list[Rec], planned: int, pairs: bool = True, **kw) -> EarlyStop:
    """A throughput rule whose reference is the window ``ref`` (its figure, its prompts, and with ``pairs`` its
    requests for the paired test)."""
    as_json = [{"prompt_id": r.prompt_id, "error": None, "completion_tokens": r.completion_tokens,
                "e2e_ms": r.e2e_s * 1e3} for r in ref]
    whole = EarlyStop("throughput", 1, planned).estimate(ref)[0]
    return EarlyStop("throughput", 1, planned, reference=whole, reference_prompts=prompt_sums(as_json, "throughput"),
                     reference_requests=request_parts(as_json, "throughput") if pairs else None, **kw)


def test_a_cell_faster_on_every_prompt_stops_above_best_by_the_paired_test():
    """8% faster than the reference on each of its prompts, whose costs differ fourfold: paired on the prompts, half
    the window settles it."""
    rule = paired_rule(prompt_costs(64, 100.0, seed=1), 64)
    assert rule.check(prompt_costs(32, 108.0, seed=2), 5.0) == "above_best"


def test_the_same_window_without_the_pairs_runs_on():
    """The unpaired test's interval carries the prompts' spread: at half the window it still reaches the band."""
    rule = paired_rule(prompt_costs(64, 100.0, seed=1), 64, pairs=False)
    assert rule.check(prompt_costs(32, 108.0, seed=2), 5.0) is None


def test_a_cell_slower_on_every_prompt_stops_below_best_after_the_minimum():
    rule = paired_rule(prompt_costs(64, 100.0, seed=1), 64, steps=2, reference_steps=1)
    assert rule.check(prompt_costs(16, 93.0, seed=2), 5.0) == "below_best"


def test_the_early_stop_record_gives_the_paired_ratio_and_its_pairs():
    rule = paired_rule(prompt_costs(64, 100.0, seed=1), 64)
    rule.check(prompt_costs(20, 100.0, seed=2), 5.0)
    assert rule.describe()["paired"]["pairs"] == 20


def test_the_paired_ratio_is_the_cells_figure_over_the_references_on_the_shared_requests():
    rule = paired_rule(prompt_costs(64, 100.0, noise=0.0), 64)
    rule.check(prompt_costs(20, 110.0, noise=0.0), 5.0)
    assert rule.describe()["paired"]["ratio"] == pytest.approx(1.1)


def test_a_window_with_fewer_than_the_minimum_pairs_has_no_paired_test():
    rule = paired_rule(prompt_costs(4, 100.0, seed=1), 64)
    rule.check(prompt_costs(20, 100.0, seed=2), 5.0)
    assert "paired" not in rule.describe()


def test_the_ith_request_of_a_prompt_is_paired_with_the_references_ith():
    recs = [{"prompt_id": p, "error": None, "completion_tokens": 10, "e2e_ms": 1000.0} for p in ("a", "b", "a")]
    assert list(request_parts(recs, "throughput")) == [("a", 0), ("b", 0), ("a", 1)]


def test_the_paired_test_keeps_its_error_rate_where_the_cell_equals_the_reference():
    """A cell as fast as its reference on every prompt (unknown num_steps: the band counts both ways), looked at after
    every request: the share of windows stopped ``below_best`` or ``above_best`` (both wrong here) stays under
    1 - confidence, the two tests (unpaired and paired, each at half of it) together. With 20% noise per request a
    fixed-n 95% interval in place of the confidence sequence ends 20 of these 200 windows so."""
    wrong = 0
    runs = 200
    for seed in range(runs):
        rule = paired_rule(prompt_costs(64, 100.0, noise=0.2, seed=10_000 + seed), 64)
        window = prompt_costs(64, 100.0, noise=0.2, seed=seed)
        for n in range(2, 65):
            if rule.check(window[:n], 5.0) is not None:
                break
        wrong += rule.reason in ("below_best", "above_best")
    assert wrong / runs <= 0.05


@pytest.mark.timing  # emulated servers' speeds: run alone (pyproject.toml)
async def test_windows_stop_early_and_their_estimates_agree_with_the_full_windows(tmp_path):
    """The same cells on the emulated compute-bound server, full windows then early-stopped ones (interleaved, so
    each concurrency's second num_steps has a reference). The early run stops the clear losers (K=4) with fewer
    requests and says so in summary.csv. Agreement is checked within each full window (two runs seconds apart on
    a shared 2-core machine differ by more than either's interval): its requests, fed in the order they finished to the
    same rule, stop it early, and the estimate's confidence-sequence bounds at that request hold the estimate over the
    full window."""
    from spectune.loadgen.record import RequestRecord

    steps = (0, 4)  # K=4 is 20% (c=4) and 33% (c=16) below K=0 on this server: clearly below the best
    out = {}
    for early in (False, True):
        plan = SweepPlan(steps=steps, concurrency=(4, 16), num_prompts=48, max_tokens=16, drift_check=False,
                         dataset="random", early_stop=early, order="interleaved")
        async with EmulatedServers(COMPUTE_BOUND, steps) as urls:
            o = await execute(plan, "openai", BackendOptions(endpoints=urls), tmp_path / str(early))
        out[early] = {p.key.cell: p for p in o.points}
    stopped = [kc for kc, p in out[True].items() if (p.early_stop or {}).get("reason")]
    assert {kc for kc in stopped if out[True][kc].early_stop["reason"] == "below_best"} == {(4, 4), (4, 16)}
    for kc in stopped:
        assert out[True][kc].metrics["num_requests"] < out[False][kc].metrics["num_requests"]
    with open(tmp_path / "True" / "summary.csv", newline="") as fh:
        rows = {(int(r["steps"]), int(r["concurrency"])): r for r in csv.DictReader(fh)}
    assert {kc for kc, r in rows.items() if r["stopped_early"] == "True"} == set(stopped)
    assert all(rows[kc]["early_stop_reason"] in ("below_best", "above_best", "futile", "within_band", "precise")
               for kc in stopped)
    # an early-stopped window reports the rule's statistic, Little's-law throughput over the requests finished by the
    # stop; those in flight were cancelled, not recorded (failed or not)
    import json as _json

    early_reqs = [_json.loads(x) for x in (tmp_path / "True" / "requests.jsonl").read_text().splitlines()]
    for kc in stopped:
        es, m = out[True][kc].early_stop, out[True][kc].metrics
        mine = [r for r in early_reqs if (r["steps"], r["concurrency"]) == kc]
        assert m["output_throughput_tok_s"] == pytest.approx(closed_loop_throughput(mine, kc[1]), rel=1e-9)
        assert es["window_output_throughput_tok_s"] == pytest.approx(
            m["total_output_tokens"] / m["duration_s"], rel=1e-9)
        assert m["num_failed"] == 0
        assert len(mine) == m["num_requests"]
    assert load_results(tmp_path / "True").summary["stopped_early"].dtype == bool

    reqs = load_results(tmp_path / "False")
    import json

    lines = [json.loads(x) for x in (tmp_path / "False" / "requests.jsonl").read_text().splitlines()]
    checked = 0
    for (k, c), full in out[False].items():
        recs = sorted((RequestRecord.from_json(r) for r in lines if (r["steps"], r["concurrency"]) == (k, c)),
                      key=lambda r: r.end_time)
        ref = out[False][(0, c)].metrics["output_throughput_tok_s"] if k else None
        rule = EarlyStop("throughput", c, len(recs), ref, min_s=MIN_SECONDS)
        for i in range(1, len(recs) + 1):
            if rule.check(recs[:i], recs[i - 1].end_time - recs[0].send_time):
                break
        if rule.reason is not None:
            checked += 1
            v = rule.estimate(recs)[0]  # the same statistic over the whole window
            assert rule.last["low"] <= v <= rule.last["high"], (k, c, rule.describe(), v)
    assert reqs is not None and checked >= 2


def test_the_grid_runs_full_windows_unless_asked():
    assert not SweepPlan().stops_early
    assert SweepPlan(early_stop=True).stops_early
    assert SweepPlan(design="guided").stops_early


def test_a_summary_without_the_early_stop_columns_still_reads(tmp_path):
    (tmp_path / "summary.csv").write_text("steps,concurrency,repeat,status,output_throughput_tok_s\n"
                                          "0,1,0,ok,100\n1,1,0,ok,120\n")
    df = load_results(tmp_path / "summary.csv").summary
    assert list(df["output_throughput_tok_s"]) == [100.0, 120.0]
