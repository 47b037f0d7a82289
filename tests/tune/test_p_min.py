"""``spectune recommend`` with draft-confidence cutoff cells (the sweep's ``p-min/P/`` folders, ``spectune sweep
--p-min``): a cutoff replaces the static answer in ``llamacpp-settings.json`` only when it beats the best static
num_steps beyond the noise band at some concurrency and loses at none.

Constructed folders (no requests, so comparisons are point ratios against the 2% noise band). Static cells: K=0
100 / 300 tokens/s at concurrency 1 / 4, K=2 150 / 280, so the best single static num_steps is K=2. Cutoffs at K=2:
p_min 0 ties K=2 everywhere, 0.3 beats it at both concurrencies, 0.6 beats it at 1 and loses at 4.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers.results_folders import grid, write_sweep
from spectune.results.reader import load_results
from spectune.results.schema import P_MIN_FOLDER, summary_row
from spectune.tune.output import write_recommendation
from spectune.tune.p_min import apply_p_min
from spectune.tune.recommend import RecommendOptions, Recommendation, recommend

STATIC = {1: {0: 100.0, 2: 150.0}, 4: {0: 300.0, 2: 280.0}}
CUTOFFS = {0.0: {1: {2: 150.0}, 4: {2: 280.0}}, 0.3: {1: {2: 160.0}, 4: {2: 310.0}},
           0.6: {1: {2: 170.0}, 4: {2: 270.0}}}


def sweep(tmp: Path, values: tuple[float, ...]) -> Path:
    """A sweep folder of the static table with the cutoff folders of ``values``."""
    folder = write_sweep(tmp / "sweep", grid(STATIC), {"steps": [0, 2], "concurrency": [1, 4]})
    for p in values:
        write_sweep(folder / P_MIN_FOLDER / f"{p:g}", grid(CUTOFFS[p], server=f"p_min:{p:g}", p_min=p),
                    {"steps": [2], "concurrency": [1, 4]})
    return folder


def decided(tmp: Path, values: tuple[float, ...]) -> Recommendation:
    results = load_results(sweep(tmp, values))
    rec = recommend(results, RecommendOptions())
    apply_p_min(rec, results)
    return rec


def test_the_cutoff_folders_are_read_by_value(tmp_path):
    assert list(load_results(sweep(tmp_path, (0.0, 0.3, 0.6))).p_min) == [0.0, 0.3, 0.6]


def test_the_best_static_num_steps_is_the_baseline(tmp_path):
    assert decided(tmp_path, (0.0, 0.3, 0.6)).p_min["static_num_steps"] == 2


def test_a_cutoff_that_beats_and_never_loses_wins(tmp_path):
    assert decided(tmp_path, (0.0, 0.3, 0.6)).p_min["p_min"] == 0.3


def test_a_cutoff_that_loses_somewhere_does_not_win(tmp_path):
    assert decided(tmp_path, (0.0, 0.6)).p_min["beats"] is False


def test_the_reason_names_the_losing_concurrency(tmp_path):
    assert "p_min 0.6: c=1 beats, c=4 loses" in decided(tmp_path, (0.0, 0.6)).p_min["reason"]


def test_the_cutoff_cells_carry_their_server(tmp_path):
    assert {c.server for c in decided(tmp_path, (0.3,)).p_min_cells} == {"p_min:0.3"}


def test_without_cutoff_folders_there_is_no_decision(tmp_path):
    assert decided(tmp_path, ()).p_min is None


def test_recommendation_json_holds_the_decision(tmp_path):
    assert decided(tmp_path, (0.3,)).to_json()["p_min"]["p_min"] == 0.3


def test_the_llamacpp_settings_carry_the_winning_cutoff(tmp_path):
    write_recommendation(decided(tmp_path, (0.0, 0.3, 0.6)), tmp_path / "rec", "sweep")
    settings = json.loads((tmp_path / "rec" / "llamacpp-settings.json").read_text())
    assert settings["llama_server_args"][-4:] == ["--spec-draft-n-max", "2", "--spec-draft-p-min", "0.3"]


def test_the_llamacpp_settings_keep_the_static_answer_when_no_cutoff_wins(tmp_path):
    write_recommendation(decided(tmp_path, (0.0, 0.6)), tmp_path / "rec", "sweep")
    settings = json.loads((tmp_path / "rec" / "llamacpp-settings.json").read_text())
    assert "spec_draft_p_min" not in settings


def test_the_llamacpp_settings_say_why_the_static_answer_stands(tmp_path):
    write_recommendation(decided(tmp_path, (0.0, 0.6)), tmp_path / "rec", "sweep")
    settings = json.loads((tmp_path / "rec" / "llamacpp-settings.json").read_text())
    assert settings["p_min_reason"].endswith("the static answer stands")


def test_recommendation_md_says_the_cutoff_replaced_the_static_answer(tmp_path):
    write_recommendation(decided(tmp_path, (0.3,)), tmp_path / "rec", "sweep")
    assert "`--spec-draft-p-min 0.3` at `--spec-draft-n-max 2`" in (tmp_path / "rec" / "recommendation.md").read_text()


def test_a_cutoff_points_summary_row_names_its_server_and_value():
    point = {"steps": 2, "concurrency": 1, "status": "ok", "metrics": {},
             "server": {"kind": "p_min", "p_min": 0.3, "max_k": 2, "args": ["--spec-draft-p-min", "0.3"]}}
    row = summary_row(point)
    assert (row["server"], row["p_min"]) == ("p_min:0.3", 0.3)


def test_a_cutoff_points_summary_row_has_no_num_steps_check():
    point = {"steps": 2, "concurrency": 1, "status": "ok", "metrics": {}, "schedule_check": {"followed": False},
             "server": {"kind": "p_min", "p_min": 0.3, "max_k": 2}}
    assert summary_row(point)["schedule_check"] == ""
