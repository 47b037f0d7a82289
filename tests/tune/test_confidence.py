"""Confidence intervals and paired comparisons in ``spectune recommend`` (spectune.results.confidence): the bootstrap
on constructed request records, and the tie rule (two num_steps within noise are a tie, the smaller one wins)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from spectune.results.confidence import (Bootstrap, CellRuns, RunRequests, best_by_pairs, percentile_interval,
                                         restricted_value)
from spectune.results.reader import load_results
from spectune.tune.recommend import RecommendOptions, recommend

from helpers.results_folders import row, write_sweep


def records(steps: int, conc: int, n: int, latency_ms: float, jitter: float, seed: int, tokens: int = 64,
            repeat: int = 0) -> list[dict]:
    """``n`` request objects of one point: prompt p{i}, ``tokens`` output tokens, latency around ``latency_ms``
    with relative spread ``jitter`` (normal, seeded)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        lat = latency_ms * max(0.05, 1 + jitter * rng.standard_normal())
        out.append({"steps": steps, "concurrency": conc, "repeat": repeat, "prompt_id": f"p{i}", "error": None,
                    "chunk_times": [0.0] * 4, "completion_tokens": tokens, "e2e_ms": lat, "ttft_ms": 10.0,
                    "tpot_ms": (lat - 10.0) / (tokens - 1)})
    return out


def throughput(recs: list[dict], conc: int) -> float:
    """Closed-loop throughput the records imply: concurrency x tokens / latency (tokens/s)."""
    return conc * sum(r["completion_tokens"] for r in recs) / sum(r["e2e_ms"] for r in recs) * 1000.0


def sweep_with(tmp_path, jitter: float, gain: float, n: int = 40):
    """K=0 and K=2 at concurrency 1: K=2's requests are ``gain`` times faster on average."""
    r0 = records(0, 1, n, 1000.0, jitter, seed=1)
    r2 = records(2, 1, n, 1000.0 / gain, jitter, seed=2)
    rows = [row(0, 1, throughput(r0, 1)), row(2, 1, throughput(r2, 1))]
    folder = write_sweep(tmp_path / "sweep", rows, plan={"steps": [0, 2], "concurrency": [1]}, requests=r0 + r2)
    return recommend(load_results(folder), RecommendOptions())


def test_noisy_cells_four_percent_apart_are_a_tie_and_the_smaller_num_steps_wins(tmp_path):
    rec = sweep_with(tmp_path, jitter=0.30, gain=1.04)
    choice = rec.choices[0]
    assert choice.best_steps == 2  # K=2 has the higher median...
    assert choice.steps == 0  # ...but its interval against K=0 holds 1 within the band: a tie, the smaller wins
    assert choice.comparisons[0]["verdict"] == "ties"
    assert choice.comparisons[0]["low"] < 1.0 < choice.comparisons[0]["high"]


def test_quiet_cells_four_percent_apart_are_called(tmp_path):
    rec = sweep_with(tmp_path, jitter=0.005, gain=1.04)
    assert rec.choices[0].steps == 2


def test_the_reason_names_the_ratio_with_its_interval(tmp_path):
    rec = sweep_with(tmp_path, jitter=0.02, gain=1.3)
    cmp = rec.choices[0].comparisons[0]
    assert cmp["verdict"] == "beats"
    assert cmp["low"] <= cmp["ratio"] <= cmp["high"]
    assert "num_steps 2 beats 0 at concurrency 1: throughput 1.3" in rec.choices[0].reason
    assert ", 95%" in rec.choices[0].reason


def test_recommendation_md_shows_cell_intervals(tmp_path):
    from spectune.tune.output import write_recommendation

    rec = sweep_with(tmp_path, jitter=0.02, gain=1.3)
    cell = rec.cell(2, 1)
    assert cell.ci_low < cell.objective < cell.ci_high
    md = write_recommendation(rec, tmp_path / "rec", "x")["recommendation.md"].read_text()
    assert f"[{cell.ci_low:.4g}, {cell.ci_high:.4g}]" in md
    data = json.loads((tmp_path / "rec" / "recommendation.json").read_text())
    assert data["cells"][1]["ci_high"] == pytest.approx(cell.ci_high)


def test_throughput_interval_covers_the_true_ratio_in_most_draws():
    """Coverage check of the ratio estimator: 95% intervals of 40 simulated runs hold the true throughput in at
    least 85% of them (a loose bound: 40 draws)."""
    true = 1000.0 * 64 / 1000.0  # tokens/s at latency 1000 ms, 64 tokens, concurrency 1
    covered = 0
    for seed in range(40):
        recs = records(0, 1, 30, 1000.0, 0.3, seed=100 + seed)
        run = RunRequests.from_records(recs)
        boot = Bootstrap({r["prompt_id"] for r in recs}, replicates=1000, seed=seed)
        value = throughput(recs, 1)
        iv = percentile_interval(boot.run_replicates(run, "throughput", value), value)
        covered += iv.low <= true <= iv.high
    assert covered >= 34


def test_one_repeat_without_requests_has_no_interval(tmp_path):
    folder = write_sweep(tmp_path / "s", [row(0, 1, 100.0), row(2, 1, 120.0)],
                         plan={"steps": [0, 2], "concurrency": [1]})
    rec = recommend(load_results(folder), RecommendOptions())
    assert math.isnan(rec.cell(2, 1).ci_low)
    assert rec.choices[0].steps == 2


def test_repeats_alone_give_an_interval(tmp_path):
    rows = [row(2, 1, v, rep=i) for i, v in enumerate((118.0, 120.0, 123.0))] + [row(0, 1, 100.0)]
    folder = write_sweep(tmp_path / "s", rows, plan={"steps": [0, 2], "concurrency": [1]})
    cell = recommend(load_results(folder), RecommendOptions()).cell(2, 1)
    assert 118.0 <= cell.ci_low <= cell.objective <= cell.ci_high <= 123.0


def prefix_and_full(tmp_path, gain: float = 1.15):
    """Concurrency 1, prompts p0..p25, the last six (p20..p25) 1.6 times as costly as the rest: K=0 stopped early
    after the first 13 prompts, K=1 ``gain`` times faster on every prompt and run over all 26 (the shape of an
    early-stopped window against a full one on the bundled engine, 2026-11-27). Returns the recommendation and
    the two cells' whole-window throughputs (tokens/s)."""
    def recs(steps: int, n: int, speed: float) -> list[dict]:
        out = records(steps, 1, n, 1000.0 / speed, 0.01, seed=steps + 3)
        for r in out:
            if int(r["prompt_id"][1:]) >= 20:
                r["e2e_ms"] *= 1.6
        return out

    r0, r1 = recs(0, 13, 1.0), recs(1, 26, gain)
    t0, t1 = throughput(r0, 1), throughput(r1, 1)
    rows = [row(0, 1, t0), row(1, 1, t1)]
    folder = write_sweep(tmp_path / "sweep", rows, plan={"steps": [0, 1], "concurrency": [1]}, requests=r0 + r1)
    return recommend(load_results(folder), RecommendOptions()), t0, t1


def test_an_early_stopped_window_is_compared_on_the_prompts_both_cells_measured(tmp_path):
    rec, t0, t1 = prefix_and_full(tmp_path)
    assert t1 / t0 < 1.02  # the whole windows alone: a tie, so the smaller num_steps would win
    assert rec.choices[0].steps == 1


def test_the_comparison_names_the_prompts_it_rests_on(tmp_path):
    rec, _, _ = prefix_and_full(tmp_path)
    [cmp] = rec.choices[0].comparisons
    assert cmp["prompts"] == 13
    assert cmp["ratio"] == pytest.approx(1.15, rel=0.01)
    assert "on the 13 prompts both measured" in rec.choices[0].reason


def test_the_best_is_the_cell_no_other_beats_on_the_prompts_both_measured(tmp_path):
    """K=0's early-stopped window on the cheap prompts reads above K=1's full window, yet K=1 is 1.1x on the
    prompts both measured: K=1 is the best."""
    rec, t0, t1 = prefix_and_full(tmp_path, gain=1.1)
    assert t1 < t0  # the whole windows alone would make K=0 the best
    assert rec.choices[0].best_steps == 1


def test_a_cell_without_requests_is_compared_on_its_whole_window():
    boot = Bootstrap(["p0", "p1", "p2"])
    run = RunRequests.from_records(records(0, 1, 3, 1000.0, 0.0, seed=1))
    got = boot.matched_ratio(CellRuns([run], [64.0]), CellRuns([None], [60.0], seed_offset=1), "throughput")
    assert got is None


def test_restricting_a_run_rescales_its_throughput_by_the_prompts_tokens_over_latency():
    recs = records(0, 4, 3, 1000.0, 0.0, seed=1)
    recs[2]["e2e_ms"] = 3000.0  # p2 three times as slow: the whole run's tokens / latency is 192 / 5000 ms
    sub, value = restricted_value(RunRequests.from_records(recs), {"p0", "p1"}, "throughput", 100.0)
    assert value == pytest.approx(100.0 * (128 / 2000) / (192 / 5000))
    assert sub.prompt == ["p0", "p1"]


def test_the_walk_to_the_best_stops_where_pairs_go_round():
    """a has the best whole window; b beats a on their shared prompts and a beats b on theirs (ratios on different
    prompts need not be transitive): the walk moves to b and stops there instead of going back."""
    ratios = {("b", "a"): 1.05, ("c", "a"): 0.9, ("a", "b"): 1.1, ("c", "b"): 0.9}
    values = {"a": 100.0, "b": 90.0, "c": 80.0}
    assert best_by_pairs(["a", "b", "c"], values.get, lambda x, y: ratios[(x, y)]) == "b"
