"""``spectune recommend --mix``: the answers (each static num_steps, the schedule where it runs) ranked by the output
tokens/s a load of given time shares per concurrency streams (:mod:`spectune.tune.mix`).

The static table is vLLM's CPU build's shape (docs/examples/vllm-cpu): K=1 leads at low concurrency, no drafter
leads at 32. Without a mix the geometric mean over concurrencies picks K=1; equal time at 1 and 32 streams most
tokens at 32, where K=0 leads. Constructed folders without requests compare point ratios against the 2% band;
one folder with requests checks the paired interval of the sums.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers.results_folders import grid, row, write_sweep
from spectune.cli import app
from spectune.core.errors import UserError
from spectune.results.reader import load_results
from spectune.results.schema import SCHEDULE_FOLDER
from spectune.tune.markdown import recommendation_markdown
from spectune.tune.mix import parse_mix
from spectune.tune.recommend import RecommendOptions, recommend
from tune.test_confidence import records, throughput

STATIC = {1: {0: 12.0, 1: 24.0}, 4: {0: 46.0, 1: 57.0}, 32: {0: 185.0, 1: 150.0}}
SERVER = {"engine": "vllm", "pinned": "[[1, max_num_seqs, K]]", "source": "vllm/v1/spec_decode/llm_base_proposer.py",
          "costs_more": True, "max_k": 1}
PLAN = {"steps": [0, 1], "concurrency": [1, 4, 32]}


def sweep(tmp: Path, schedule_cost: float | None = None) -> Path:
    """The static table; with ``schedule_cost`` a schedule-server folder ``schedule_cost`` slower at every cell."""
    folder = write_sweep(tmp / "sweep", grid(STATIC), PLAN)
    if schedule_cost is not None:
        table = {c: {k: v * (1 - schedule_cost) for k, v in by_k.items()} for c, by_k in STATIC.items()}
        sub = write_sweep(folder / SCHEDULE_FOLDER, grid(table, server="schedule:1"))
        (sub / "sweep.json").write_text(json.dumps({"plan": PLAN, "backend": {"backend": "vllm",
                                                                              "schedule_server": SERVER}}))
    return folder


def run(folder: Path, mix: str | None) -> object:
    return recommend(load_results(folder), RecommendOptions(mix=parse_mix(mix) if mix else None))


def test_parse_mix_normalises_time_shares():
    assert parse_mix("1:1,32:3") == {1: 0.25, 32: 0.75}


def test_parse_mix_without_shares_is_equal_time():
    assert parse_mix("32,1") == {1: 0.5, 32: 0.5}


@pytest.mark.parametrize("text", ["1:x", "", "1:0", "0:1", "1,1"])
def test_parse_mix_refuses_bad_text(text):
    with pytest.raises(UserError, match="--mix"):
        parse_mix(text)


def test_without_a_mix_the_geometric_mean_picks_k1(tmp_path):
    assert run(sweep(tmp_path), None).best_static == 1


def test_equal_time_at_1_and_32_makes_no_drafter_the_best_static(tmp_path):
    assert run(sweep(tmp_path), "1,32").best_static == 0


def test_a_load_mostly_at_concurrency_1_keeps_k1(tmp_path):
    rec = run(sweep(tmp_path), "1:9,32:1")  # K=1: 0.9*24 + 0.1*150 = 36.6 tok/s; K=0: 10.8 + 18.5 = 29.3
    assert rec.best_static == 1


def test_the_mix_prices_each_answer_as_the_tokens_the_load_streams(tmp_path):
    rec = run(sweep(tmp_path), "1,32")
    got = {a.answer: a.output_tok_s for a in rec.primary.mix.answers}
    assert got == {"static K=0": pytest.approx(98.5), "static K=1": pytest.approx(87.0),
                   "schedule": pytest.approx(104.5)}  # the schedule on the static cells: K=1 at 1, K=0 at 32


def test_priced_on_static_cells_the_schedule_wins_the_mix(tmp_path):
    assert run(sweep(tmp_path), "1,32").primary.kind == "schedule"  # an engine whose schedule costs nothing


def test_a_cheap_schedule_server_is_chosen_for_the_mix(tmp_path):
    rec = run(sweep(tmp_path, schedule_cost=0.01), "1,32")  # 0.99 * 104.5 = 103.5 against K=0's 98.5
    assert rec.primary.kind == "schedule"


def test_a_costly_schedule_server_is_not_chosen_for_the_mix(tmp_path):
    rec = run(sweep(tmp_path, schedule_cost=0.10), "1,32")  # 0.9 * 104.5 = 94.1 against K=0's 98.5
    assert (rec.primary.kind, rec.primary.num_steps) == ("static", 0)


def test_a_mix_concurrency_the_sweep_did_not_measure_is_refused(tmp_path):
    with pytest.raises(UserError, match="concurrency 48 was not measured"):
        run(sweep(tmp_path), "1,48")


def test_a_mix_needs_the_throughput_objective(tmp_path):
    with pytest.raises(UserError, match="--objective throughput"):
        recommend(load_results(sweep(tmp_path)), RecommendOptions(objective="tpot", mix={1: 1.0}))


def test_recommendation_md_tables_the_answers_on_the_load(tmp_path):
    md = recommendation_markdown(run(sweep(tmp_path, schedule_cost=0.10), "1,32"), {}, None, {}, "sweep")
    assert "| static K=0 | 98.5 | 1.000x |" in md


def test_the_cli_refuses_a_bad_mix_in_one_line(tmp_path):
    res = CliRunner().invoke(app, ["recommend", str(sweep(tmp_path)), "--mix", "1:two"])
    assert isinstance(res.exception, UserError)  # spectune.cli.main prints it as one line, exit code 2
    assert "\n" not in str(res.exception)


def test_with_requests_the_ratio_on_the_load_has_a_paired_interval(tmp_path):
    rows, reqs = [], []
    for seed, (conc, by_k) in enumerate(STATIC.items()):
        for k, thr in by_k.items():
            recs = records(k, conc, 30, conc * 64 / thr * 1000.0, 0.2, seed=10 * seed + k)
            rows.append(row(k, conc, throughput(recs, conc)))
            reqs += recs
    folder = write_sweep(tmp_path / "sweep", rows, PLAN, requests=reqs)
    k1 = next(a for a in run(folder, "1,32").primary.mix.answers if a.answer == "static K=1")
    assert math.isfinite(k1.low) and k1.low < k1.ratio < k1.high
