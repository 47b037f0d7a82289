"""recommend predicts validate (issue 30): the fluid model over a sweep's cells, and validate's predicted-beside-measured
comparison with its speed factor and misses."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from spectune.cli import app
from spectune.results.validate_doc import RecordedPhase, RecordedPrediction
from spectune.results.validate_run import ValidateRun
from spectune.tune.predict import rate_of, simulate
from spectune.validate.plan import ValidatePlan
from spectune.validate.prediction import compare, markdown, predict_for
from spectune.measure.workload import parse_workload
from tests.helpers.results_folders import grid, write_sweep

T = {1: 100.0, 8: 400.0, 32: 640.0}  # tokens/s at 1, 8, 32 requests in flight


def phases(*spec: tuple[float, int | None, float | None]) -> list[RecordedPhase]:
    out, t = [], 0.0
    for d, c, r in spec:
        out.append(RecordedPhase(len(out) + 1, "", t, t + d, c, r))
        t += d
    return out


def test_a_steady_closed_loop_runs_at_its_cell():
    got = simulate(phases((60, 8, None), (60, 32, None)), rate_of(T), max_tokens=128)
    assert got[0] == pytest.approx(400.0, rel=0.01)
    assert got[1] == pytest.approx(640.0, rel=0.01)


def test_rate_interpolates_in_log_concurrency():
    r = rate_of(T)
    assert r(4) == pytest.approx(100 + (400 - 100) * 2 / 3)  # log2 4 is 2/3 of the way from 1 to 8
    assert r(64) == 640.0  # flat beyond the sweep
    assert r(0) == 0.0


def test_a_drop_drains_the_requests_already_running():
    got = simulate(phases((30, 32, None), (30, 1, None)), rate_of(T), max_tokens=128)
    assert got[1] > 100.0 * 1.2  # the 32 requests in flight at the drop finish inside the c=1 phase
    assert got[1] < 640.0


def test_an_open_loop_below_capacity_delivers_its_offered_load():
    got = simulate(phases((60, None, 2.0)), rate_of(T), max_tokens=100)
    assert got[0] == pytest.approx(2.0 * 100, rel=0.1)  # 2 requests/s x 100 tokens


def measured(name: str, overall: float, ph: list[float]) -> ValidateRun:
    return ValidateRun.from_dict({"run": name, "status": "ok", "overall": {"output_throughput_tok_s": overall},
                                  "phases": [{"output_throughput_tok_s": v} for v in ph]})


def swing_prediction(tmp_path, table: dict) -> dict:
    """recommend on a sweep of ``table`` ({concurrency: {K: tok/s}}), then validate's prediction for its SGLang
    config on the swing workload (concurrency 1 and 32, 30 s phases)."""
    sweep = write_sweep(tmp_path / "sweep", grid(table))
    out = tmp_path / "rec"
    assert CliRunner().invoke(app, ["recommend", str(sweep), "-o", str(out)]).exit_code == 0
    plan = ValidatePlan(config=str(out / "sglang-adaptive-custom.json"), steps=(0, 1),
                        workload=parse_workload("swing", 30.0), max_tokens=128)
    return predict_for(plan, "sglang-adaptive", (1,))


def test_validate_predicts_from_the_recommendation_beside_the_config(tmp_path):
    pred = swing_prediction(tmp_path, {1: {0: 100, 1: 150}, 32: {0: 2000, 1: 1500}})
    assert set(pred["runs"]) == {"static:0", "static:1", "config"}
    cfg, k0, k1 = (pred["runs"][n]["phases"] for n in ("config", "static:0", "static:1"))
    assert cfg[0][0] == pytest.approx(150.0, rel=0.01)  # c=1: the config runs K=1
    assert cfg[1][0] == pytest.approx(2000.0, rel=0.01)  # c=32: K=0
    assert k0[1][0] == pytest.approx(2000.0, rel=0.01)
    assert k1[0][0] == pytest.approx(150.0, rel=0.01)
    # the machine runs 10% faster than during the sweep; the config loses 10% at c=32 against that
    fast = 1.1
    runs = [measured(n, fast * p["overall"][0], [fast * ph[0] for ph in p["phases"]])
            for n, p in pred["runs"].items()]
    runs[-1].phases[1].output_throughput_tok_s *= 0.9
    cmp = compare(RecordedPrediction.from_json(pred), runs)
    assert cmp["speed_factor"] == pytest.approx(1.1)
    assert [(r["run"], r["window"]) for r in cmp["rows"] if r["miss"]] == [("config", 2)]
    assert "config phase 2" in cmp["misses"][0]
    md = "\n".join(markdown(RecordedPrediction.from_json({**pred, "comparison": cmp})))
    assert "Speed factor 1.100" in md
    assert "| config | 2 |" in md and "MISS" in md


def test_phases_above_the_sweeps_largest_concurrency_are_named(tmp_path):
    """A sweep up to concurrency 16 and the swing workload (1 and 32): phases 2 and 4 extrapolate."""
    pred = swing_prediction(tmp_path, {1: {0: 100, 1: 150}, 16: {0: 1000, 1: 900}})
    assert pred["above_sweep"] == {"sweep_max": 16, "phases": [{"phase": 2, "concurrency": 32},
                                                               {"phase": 4, "concurrency": 32}]}
    runs = [measured(n, p["overall"][0], [ph[0] for ph in p["phases"]]) for n, p in pred["runs"].items()]
    md = "\n".join(markdown(RecordedPrediction.from_json({**pred, "comparison": compare(RecordedPrediction.from_json(pred), runs)})))
    assert "Phases 2, 4 (concurrency 32) lie above the sweep's largest concurrency 16" in md


def test_a_workload_within_the_sweep_names_no_phase(tmp_path):
    assert swing_prediction(tmp_path, {1: {0: 100, 1: 150}, 32: {0: 2000, 1: 1500}})["above_sweep"] is None


def test_the_swing_loads_mix_is_its_seconds_per_concurrency(tmp_path):
    pred = swing_prediction(tmp_path, {1: {0: 100, 1: 150}, 32: {0: 2000, 1: 1500}})
    assert pred["load_mix"] == {"1": 60.0, "32": 60.0}  # 2 cycles of 30 s phases


def test_a_recommendation_without_a_mix_is_told_the_workloads(tmp_path):
    pred = swing_prediction(tmp_path, {1: {0: 100, 1: 150}, 32: {0: 2000, 1: 1500}})
    md = "\n".join(markdown(RecordedPrediction.from_json({**pred, "comparison": {}})))
    assert "`spectune recommend SWEEP --mix 1:60,32:60`" in md


def test_a_recommendation_on_a_mix_is_not_told_again(tmp_path):
    pred = swing_prediction(tmp_path, {1: {0: 100, 1: 150}, 32: {0: 2000, 1: 1500}})
    pred["primary"] = {**(pred["primary"] or {}), "mix": {"shares": {"1": 0.5, "32": 0.5}}}
    assert "--mix" not in "\n".join(markdown(RecordedPrediction.from_json({**pred, "comparison": {}})))


def test_no_recommendation_no_prediction(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"1": {"candidate_steps": [1]}}')
    plan = ValidatePlan(config=str(cfg), steps=(0, 1), workload=parse_workload("swing", 30.0), max_tokens=128)
    assert predict_for(plan, "sglang-adaptive", (1,)) is None
