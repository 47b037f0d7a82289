"""``spectune recommend --slo-tpot-ms``: static num_steps, the schedule and the policy configs (the sweep's
``p-min/P/`` servers) ranked by goodput, the output tokens/s of requests within the SLO
(:mod:`spectune.tune.slo_goodput`).

Constructed folders. Output tokens/s: static K=0 100 / 300 at concurrency 1 / 4, K=2 150 / 280; p_min 0.3 at K=2
160 / 310. Every run sends the same 10 prompts, 100 tokens each, TPOT 10 ms, except where a test makes some miss a
25 ms TPOT SLO (TPOT 30 ms). recommend chooses K=2 at 1 and K=0 at 4, so the schedule streams (150 + 300) / 2 = 225
tokens/s within the SLO when every request meets it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers.results_folders import grid, write_sweep
from spectune.cli import app
from spectune.core.errors import UserError
from spectune.results.reader import load_results
from spectune.results.schema import P_MIN_FOLDER
from spectune.tune.p_min import apply_p_min
from spectune.tune.recommend import RecommendOptions, recommend
from spectune.tune.slo_goodput import SloGoodput, slo_goodput

STATIC = {1: {0: 100.0, 2: 150.0}, 4: {0: 300.0, 2: 280.0}}
CUTOFF = {1: {2: 160.0}, 4: {2: 310.0}}
PLAN = {"concurrency": [1, 4]}


def requests(table: dict[int, dict[int, float]], missing: dict[tuple[int, int], int], n: int = 10) -> list[dict]:
    """``n`` requests per cell of ``table``; ``missing[(steps, concurrency)]`` of them at TPOT 30 ms, the rest 10."""
    out = []
    for conc, by_k in table.items():
        for k in by_k:
            for i in range(n):
                out.append({"steps": k, "concurrency": conc, "repeat": 0, "prompt_id": f"p{i}", "error": None,
                            "chunk_times": [0.0] * 100, "completion_tokens": 100, "ttft_ms": 50.0,
                            "e2e_ms": 1000.0, "tpot_ms": 30.0 if i < missing.get((k, conc), 0) else 10.0})
    return out


def sweep(tmp: Path, static_missing: dict, cutoff_missing: dict, n: int = 10) -> Path:
    folder = write_sweep(tmp / "sweep", grid(STATIC), {**PLAN, "steps": [0, 2]},
                         requests=requests(STATIC, static_missing, n))
    write_sweep(folder / P_MIN_FOLDER / "0.3", grid(CUTOFF, server="p_min:0.3", p_min=0.3), {**PLAN, "steps": [2]},
                requests=requests(CUTOFF, cutoff_missing, n))
    return folder


def ranked(tmp: Path, static_missing: dict | None = None, cutoff_missing: dict | None = None,
           n: int = 10) -> SloGoodput:
    results = load_results(sweep(tmp, static_missing or {}, cutoff_missing or {}, n))
    rec = recommend(results, RecommendOptions(slo_tpot_ms=25.0))
    apply_p_min(rec, results)
    g = slo_goodput(rec, results)
    assert g is not None
    return g


def answer(g: SloGoodput, name: str):
    return next(a for a in g.answers if a.name == name)


def test_goodput_counts_only_the_tokens_of_requests_within_the_slo(tmp_path):
    g = ranked(tmp_path, static_missing={(2, 4): 5})
    assert answer(g, "static K=2").per_concurrency[4] == pytest.approx(280.0 * 0.5)


def test_the_cells_slo_attainment_is_the_share_of_requests_meeting_it(tmp_path):
    g = ranked(tmp_path, static_missing={(2, 4): 3})
    assert answer(g, "static K=2").attainment[4] == pytest.approx(0.7)


def test_every_answer_is_ranked_static_schedule_and_policy(tmp_path):
    names = [a.name for a in ranked(tmp_path).answers]
    assert names == ["static K=0", "static K=2", "schedule", "p_min 0.3 (num_steps 2)"]


def test_a_policy_whose_goodput_wins_beyond_the_noise_band_is_named(tmp_path):
    g = ranked(tmp_path)  # p_min: (160 + 310) / 2 = 235 against the schedule's 225: 1.044x
    assert g.pick is not None and g.pick.name == "p_min 0.3 (num_steps 2)"
    assert g.policy_wins is True


def test_a_policy_whose_requests_miss_the_slo_is_not_named(tmp_path):
    g = ranked(tmp_path, cutoff_missing={(2, 4): 4})  # p_min: (160 + 310 x 0.6) / 2 = 173 < 225
    assert g.pick is not None and g.pick.name == "schedule"
    assert "no policy config wins beyond it" in g.reason


def test_a_policy_ahead_within_the_noise_band_is_not_named(tmp_path):
    # 40 requests a cell; p_min at concurrency 4: 310 x 0.95 = 294.5, (160 + 294.5) / 2 = 227.25, the schedule's
    # 225 is 0.990x of it: within the 2% band, so a simpler answer is named
    g = ranked(tmp_path, cutoff_missing={(2, 4): 2}, n=40)
    assert max(g.answers, key=lambda a: a.goodput_tok_s).name == "p_min 0.3 (num_steps 2)"
    assert g.pick is not None and g.pick.kind != "policy"


def test_without_the_option_recommend_writes_no_goodput_ranking(tmp_path):
    folder = sweep(tmp_path, {}, {})
    res = CliRunner().invoke(app, ["recommend", str(folder), "-o", str(tmp_path / "plain")])
    assert res.exit_code == 0, res.output
    assert "slo_goodput" not in json.loads((tmp_path / "plain" / "recommendation.json").read_text())
    assert "Goodput under the TPOT SLO" not in (tmp_path / "plain" / "recommendation.md").read_text()


def test_with_the_option_recommend_writes_and_prints_the_ranking(tmp_path):
    folder = sweep(tmp_path, {}, {})
    res = CliRunner().invoke(app, ["recommend", str(folder), "-o", str(tmp_path / "slo"), "--slo-tpot-ms", "25"])
    assert res.exit_code == 0, res.output
    assert "the policy p_min 0.3 (num_steps 2) streams the most goodput" in " ".join(res.output.split())
    doc = json.loads((tmp_path / "slo" / "recommendation.json").read_text())["slo_goodput"]
    assert doc["pick"] == "p_min 0.3 (num_steps 2)"
    assert "## Goodput under the TPOT SLO" in (tmp_path / "slo" / "recommendation.md").read_text()


def test_a_trace_adds_the_replayed_policies_specserve_included(tmp_path):
    from helpers.policy_traces import synthetic_trace
    from spectune.backends.num_steps.trace import write_trace

    folder, trace = sweep(tmp_path, {}, {}), tmp_path / "trace.jsonl"
    write_trace(trace, synthetic_trace(seed=1, rounds=24, num_steps=2, batch_sizes=(1, 4)))
    res = CliRunner().invoke(app, ["recommend", str(folder), "-o", str(tmp_path / "slo"), "--slo-tpot-ms", "25",
                                   "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    replay = json.loads((tmp_path / "slo" / "recommendation.json").read_text())["slo_goodput"]["replay"]
    assert [p["policy"] for p in replay["policies"] if p["policy"].startswith(("static", "specserve"))] == \
        ["static:0", "static:1", "static:2", "specserve:25"]


def test_a_trace_without_the_slo_is_refused(tmp_path):
    folder = sweep(tmp_path, {}, {})
    res = CliRunner().invoke(app, ["recommend", str(folder), "--trace", str(tmp_path / "t.jsonl")])
    assert isinstance(res.exception, UserError), res.output
    assert "add --slo-tpot-ms" in str(res.exception)
