"""recommend's llama.cpp and TensorRT-LLM outputs, validate's llama.cpp settings, and the batch-dependent
acceptance finding (spectune/results/batch_acceptance.py), on constructed results with hand-computed answers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from spectune.backends.llamacpp.settings import read_settings, settings_json
from spectune.results.batch_acceptance import acceptance_se, acceptance_vs_c1, batch_dependent_acceptance
from spectune.tune.output import write_recommendation
from spectune.core.errors import UserError
from spectune.tune.recommend import RecommendOptions, recommend
from spectune.results.reader import load_results
from spectune.validate.plan import config_candidates
from helpers.engine_configs import llamacpp_settings, trtllm_config, vllm_config
from helpers.results_folders import row, write_sweep

# throughput (tok/s) per concurrency and num_steps: K=2 wins at 1, K=1 at 8, K=0 at 32
TABLE = {1: {0: 100.0, 1: 120.0, 2: 140.0}, 8: {0: 400.0, 1: 440.0, 2: 420.0}, 32: {0: 900.0, 1: 800.0, 2: 700.0}}


def rec_from(tmp_path: Path, table: dict[int, dict[int, float]], points: list[dict] | None = None):
    rows = [row(k, c, thr) for c, by_k in table.items() for k, thr in by_k.items()]
    folder = write_sweep(tmp_path / "sweep", rows, points=points)
    return recommend(load_results(folder), RecommendOptions())


def test_trtllm_schedule_keys_are_slot_upper_bounds_for_the_newest_release(tmp_path):
    cfg = trtllm_config(rec_from(tmp_path, TABLE))
    # geometric midpoints sqrt(8)~3, sqrt(256)=16: slots 1-2, 3-15, 16 and up (the last key covers every larger batch)
    assert cfg["draft_len_schedule"] == {"2": 2, "15": 1, "2147483647": 0}


def test_trtllm_schedule_keys_are_slot_lower_bounds_before_1_3_0rc8(tmp_path):
    cfg = trtllm_config(rec_from(tmp_path, TABLE), "1.3.0rc7")
    assert cfg["draft_len_schedule"] == {"1": 2, "3": 1, "16": 0}


@pytest.mark.parametrize("version", [None, "1.2.1"])
def test_trtllm_max_draft_len_equals_the_smallest_keys_entry(tmp_path, version):
    cfg = trtllm_config(rec_from(tmp_path, TABLE), version)
    assert cfg["max_draft_len"] == cfg["draft_len_schedule"][min(cfg["draft_len_schedule"], key=int)]


def test_trtllm_caps_a_slot_above_batch_one(tmp_path):
    table = {1: {0: 100.0, 1: 120.0, 2: 110.0}, 8: {0: 400.0, 1: 410.0, 2: 480.0}}  # K=1 at 1, K=2 at 8
    rec = rec_from(tmp_path, table)
    cfg = trtllm_config(rec)
    # capped, both slots draft 1: one draft length at every batch size, written without a schedule
    assert (cfg, any("capped at 1" in w for w in rec.warnings)) == ({"max_draft_len": 1}, True)


def test_trtllm_bad_version_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="not a version number"):
        trtllm_config(rec_from(tmp_path, TABLE), "latest")


def test_trtllm_not_written_when_batch_one_does_not_speculate(tmp_path):
    table = {1: {0: 100.0, 1: 90.0}, 8: {0: 400.0, 1: 300.0}}
    assert trtllm_config(rec_from(tmp_path, table)) is None


def test_llamacpp_settings_use_the_best_static_num_steps(tmp_path):
    rec = rec_from(tmp_path, TABLE)
    assert llamacpp_settings(rec)["spec_draft_n_max"] == rec.best_static


def test_llamacpp_settings_say_what_the_static_choice_costs(tmp_path):
    rec = rec_from(tmp_path, TABLE)  # best static: K=1 (geomean of 120/140, 440/440, 800/900 beats the others)
    rows = {r["concurrency"]: r for r in llamacpp_settings(rec)["per_concurrency"]}
    assert rows[32]["static_vs_best"] == pytest.approx(800 / 900, abs=1e-4)


def test_llamacpp_settings_flags(tmp_path):
    s = settings_json(3)
    assert s["llama_server_args"] == ["--spec-type", "draft-eagle3", "--spec-draft-n-max", "3"]


def test_written_files_include_both_engines(tmp_path):
    paths = write_recommendation(rec_from(tmp_path, TABLE), tmp_path / "out", "x")
    assert {"trtllm-speculative-config.json", "llamacpp-settings.json"} <= set(paths)


def test_recommendation_md_has_the_llamacpp_section(tmp_path):
    paths = write_recommendation(rec_from(tmp_path, TABLE), tmp_path / "out", "x")
    assert "--spec-draft-n-max 1" in paths["recommendation.md"].read_text()


def test_validate_reads_llamacpp_settings_as_one_static_num_steps(tmp_path):
    path = tmp_path / "llamacpp-settings.json"
    path.write_text(json.dumps(settings_json(2)))
    assert config_candidates(str(path)) == ("llamacpp-settings", (2,))


def test_llamacpp_settings_with_a_bad_draft_length_is_a_user_error(tmp_path):
    path = tmp_path / "llamacpp-settings.json"
    path.write_text(json.dumps({"format": "llamacpp-settings", "spec_draft_n_max": -1}))
    with pytest.raises(UserError, match="spec_draft_n_max"):
        config_candidates(str(path))


def test_other_configs_are_not_llamacpp_settings(tmp_path):
    path = tmp_path / "sglang.json"
    path.write_text(json.dumps({"1": {"candidate_steps": [1, 3]}}))
    assert read_settings(path) is None


# -- batch-dependent acceptance --------------------------------------------------------------------------------
def point(k: int, c: int, a: float, per_pos: list[float] | None = None, drafts: float | None = None,
          source: str = "llamacpp:/metrics counters", done: int = 16, planned: int = 16) -> dict:
    return {"steps": k, "concurrency": c, "repeat": 0, "status": "ok", "requests_planned": planned,
            "metrics": {"acceptance_length": a, "acceptance_length_source": source, "num_requests": done},
            "acceptance": {"per_position": per_pos or [], "num_drafts": drafts}}


def test_se_from_per_position_by_hand():
    # n in {0,1,2} with P(n>=1)=0.5, P(n>=2)=0.2: E[n]=0.7, E[n^2]=0.5+3*0.2=1.1, var=0.61, SE=sqrt(0.61/100)
    assert acceptance_se([0.5, 0.2], 100) == pytest.approx(math.sqrt(0.61 / 100))


def test_a_drop_beyond_noise_is_a_finding():
    pts = [point(3, 1, 1.65, [0.45, 0.15, 0.05], 2000), point(3, 4, 1.22, [0.17, 0.04, 0.01], 3000)]
    found = batch_dependent_acceptance(pts)
    assert [(f.steps, f.concurrency) for f in found] == [(3, 4)]


def test_a_difference_within_noise_is_not_a_finding():
    pts = [point(3, 1, 1.658, [0.45, 0.15, 0.058], 2000), point(3, 4, 1.643, [0.44, 0.15, 0.053], 2000)]
    assert batch_dependent_acceptance(pts) == []


def test_without_se_only_the_relative_floor_applies():
    pts = [point(2, 1, 1.50), point(2, 8, 1.46)]  # -2.7% > 2% floor
    assert len(batch_dependent_acceptance(pts)) == 1


def test_proxy_acceptance_is_ignored():
    pts = [point(2, 1, 1.5, source="proxy:tokens-per-chunk"), point(2, 8, 1.0, source="proxy:tokens-per-chunk")]
    assert batch_dependent_acceptance(pts) == []


def test_a_concurrency_one_point_cut_short_is_not_compared():
    pts = [point(3, 1, 1.65, done=13, planned=32), point(3, 4, 1.22, done=32, planned=32)]  # other prompt mix
    assert batch_dependent_acceptance(pts) == []


def test_a_higher_concurrency_point_cut_short_is_not_compared():
    pts = [point(3, 1, 1.65, done=16, planned=16), point(3, 16, 1.22, done=10, planned=64)]
    assert batch_dependent_acceptance(pts) == []


def test_finding_sentence_has_the_figures():
    pts = [point(3, 1, 1.651), point(3, 4, 1.217)]
    assert "1.651 at concurrency 1 to 1.217 at concurrency 4" in batch_dependent_acceptance(pts)[0].sentence()


def test_ratio_column_values():
    pts = [point(3, 1, 1.6), point(3, 4, 1.2), point(0, 4, 1.0, source="config:num_steps=0")]
    assert acceptance_vs_c1(pts) == {(3, 1): 1.0, (3, 4): pytest.approx(0.75)}


def test_recommendation_md_states_the_finding(tmp_path):
    pts = [point(2, 1, 1.6), point(2, 8, 1.2)]
    rec = rec_from(tmp_path, {1: {0: 100.0, 2: 130.0}, 8: {0: 400.0, 2: 380.0}}, points=pts)
    paths = write_recommendation(rec, tmp_path / "out", "x")
    assert "acceptance length fell from 1.600 at concurrency 1 to 1.200 at concurrency 8" in \
        paths["recommendation.md"].read_text()


def test_vllm_config_is_a_complete_speculative_config(tmp_path):
    """method and model from the sweep make vllm-speculative-config.json a --speculative-config vLLM starts with as
    written (vllm/config/speculative.py); the schedule's ranges are the slots."""
    cfg = vllm_config(rec_from(tmp_path, TABLE), "eagle3", "/heads/h")
    assert cfg == {"method": "eagle3", "model": "/heads/h", "num_speculative_tokens": 2,
                   "num_speculative_tokens_per_batch_size": [[1, 2, 2], [3, 15, 1], [16, 32, 0]]}


def test_vllm_config_leaves_out_what_the_sweep_did_not_record(tmp_path):
    assert set(vllm_config(rec_from(tmp_path, TABLE))) == {"num_speculative_tokens",
                                                           "num_speculative_tokens_per_batch_size"}


def test_default_pair_sweeps_name_the_bundled_head():
    from spectune.backends import draft_head
    from spectune.backends.local.options import DEFAULT_HEAD

    assert draft_head({"backend": "local", "model": None, "draft": None}) == str(DEFAULT_HEAD)
    assert draft_head({"backend": "llamacpp", "model": "smollm2", "draft": None}) == str(DEFAULT_HEAD)
    assert draft_head({"backend": "local", "model": "/models/llama", "draft": None}) is None
    assert draft_head({"backend": "openai", "model": None, "draft": None}) is None
    assert draft_head({"backend": "vllm", "model": "/t", "draft": "/heads/h"}) == "/heads/h"


def test_recommend_writes_the_head_and_target_without_a_machine_s_folders(tmp_path, monkeypatch):
    """vllm-speculative-config.json's ``model``: the bundled head (here, or recorded under another checkout's
    ``backends/local/heads/``) relative to the output folder, which vLLM resolves from there; a user's head as
    recorded, or relative when inside the output folder. The launch line's target: ``~/...`` under the home folder."""
    import os

    from spectune.backends.local.options import bundled_head
    from spectune.backends.local.options import DEFAULT_HEAD
    from spectune.tune.output import portable_head, portable_target

    out = DEFAULT_HEAD.parents[3] / "docs" / "examples" / "x" / "recommend"  # the checkout's example depth
    assert bundled_head("/elsewhere/main/backends/local/heads/" + DEFAULT_HEAD.name) == DEFAULT_HEAD
    assert bundled_head("/elsewhere/main/backends/local/heads/not-bundled") is None
    assert bundled_head("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B") is None
    rel = portable_head("/elsewhere/main/backends/local/heads/" + DEFAULT_HEAD.name, out)
    assert rel == portable_head(str(DEFAULT_HEAD), out) == "../../../../backends/local/heads/" + DEFAULT_HEAD.name
    assert (out / rel).resolve() == DEFAULT_HEAD.resolve()
    assert portable_head("/models/heads/h", out) == "/models/heads/h"
    assert portable_head("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", out) == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert portable_head(str(tmp_path / "rec" / "head"), tmp_path / "rec") == "head"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert portable_target(str(tmp_path / ".cache" / "spectune" / "t"), Path("/nowhere")) == "~/.cache/spectune/t"
    assert portable_target("meta-llama/Llama-3.1-8B-Instruct", tmp_path) == "meta-llama/Llama-3.1-8B-Instruct"
    assert portable_target(os.sep + "models" + os.sep + "t", tmp_path / "out") == "/models/t"


def test_recommendation_md_gives_the_vllm_launch_line(tmp_path):
    paths = write_recommendation(rec_from(tmp_path, TABLE), tmp_path / "out", "sweep", ("eagle3", "test"), "/heads/h",
                                 "/models/target")
    md = paths["recommendation.md"].read_text()
    assert 'vllm serve /models/target --speculative-config "$(cat vllm-speculative-config.json)"' in md
    assert "`vllm-speculative-config.json`: vLLM's `--speculative-config` value, as written" in md
