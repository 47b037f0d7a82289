"""Is a per-batch-size schedule followed (spectune/measure/schedule_check.py)? Counter arithmetic on hand-made
snapshots, the vLLM backend's remedy, and `spectune validate` end to end with tests/helpers/fake_server.py serving
vLLM counters: once following a vLLM schedule given as its --adaptive-config, once drafting its static K (what vLLM
issue #57053 reports of Model Runner V2)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from spectune.backends.num_steps.sglang_config import parse_vllm_schedule
from spectune.backends.options import BackendOptions
from spectune.backends.snapshots import SpecSnapshot
from spectune.backends.vllm import VLLMBackend
from spectune.measure.schedule_check import check_schedule
from helpers.paths import FAKE_SERVER, ROOT

SCHEDULE = [[1, 2, 3], [3, 64, 0]]


def snap(drafts: float, tokens: float, accepted: float) -> SpecSnapshot:
    return SpecSnapshot(taken_at=0.0, num_drafts=drafts, num_draft_tokens=tokens, num_accepted_tokens=accepted)


def test_drafting_the_scheduled_k_is_followed():
    check = check_schedule(parse_vllm_schedule(SCHEDULE), snap(0, 0, 0), snap(100, 300, 150), 1.6)
    assert (check.drafted_per_step, check.k_high, check.followed) == (3.0, 3, True)


def test_drafting_more_than_the_scheduled_k_is_not_followed():
    schedule = parse_vllm_schedule([[1, 2, 3], [3, 8, 1], [9, 64, 0]])
    assert not check_schedule(schedule, snap(0, 0, 0), snap(100, 300, 150), 5.0).followed


def test_drafting_in_most_steps_where_the_schedule_says_none_is_not_followed():
    # 100 drafting steps out of 400 output tokens - 150 accepted = 250 verify steps: 40%, then 100%
    schedule = parse_vllm_schedule(SCHEDULE)
    few = check_schedule(schedule, snap(0, 0, 0), snap(100, 300, 150), 6.0, output_tokens=400)
    most = check_schedule(schedule, snap(0, 0, 0), snap(100, 300, 150), 6.0, output_tokens=250)
    assert (few.followed, most.followed) == (True, False)


def test_no_counters_no_check():
    assert check_schedule(parse_vllm_schedule(SCHEDULE), SpecSnapshot(taken_at=0.0), SpecSnapshot(1.0), 4.0) is None


def test_the_vllm_backend_names_the_runner_setting():
    backend = VLLMBackend(BackendOptions(model="m", draft="d"))
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in backend.schedule_setting()


def template(follow: bool) -> str:
    config = " --adaptive-config {adaptive_config}" if follow else ""
    return (f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE_SERVER))} --port {{port}} --steps {{steps}} "
            f"--metrics vllm --tokens-per-second 4000{config}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """validate.json's config run, and the output, with a server that follows the schedule and one that ignores it."""
    tmp = tmp_path_factory.mktemp("schedule")
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(8)))
    config = tmp / "schedule.json"
    config.write_text(json.dumps(SCHEDULE))
    out = {}
    for follow in (True, False):
        folder = tmp / f"out-{follow}"
        proc = subprocess.run(
            [sys.executable, "-m", "spectune.cli", "validate", "--config", str(config), "--backend", "launch",
             "--workload", "c1@1.5,c8@2", "--dataset", f"jsonl:{prompts}", "--num-prompts", "8", "--max-tokens",
             "24", "--warmup", "1", "--startup-timeout", "20", "--steps", "3", "--launch", template(False),
             "--config-launch", template(follow), "--output-dir", str(folder)],
            cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert folder.joinpath("validate.json").exists(), proc.stderr[-2000:]
        meta = json.loads((folder / "validate.json").read_text())
        out[follow] = (next(r for r in meta["runs"] if r["run"] == "config"), proc.stdout + proc.stderr)
    return out


def test_validate_records_a_followed_schedule(runs):
    run, _ = runs[True]
    assert [p["schedule_check"]["followed"] for p in run["phases"]] == [True, True]


def test_validate_records_an_ignored_schedule_at_the_batch_size_it_gives_no_drafts(runs):
    run, _ = runs[False]
    assert [p["schedule_check"]["followed"] for p in run["phases"]] == [True, False]


def test_validate_says_plainly_that_the_schedule_was_not_followed(runs):
    _, output = runs[False]
    assert "NOT following the per-batch-size schedule" in " ".join(output.split())


def test_no_warning_when_the_schedule_is_followed(runs):
    _, output = runs[True]
    assert "NOT following" not in output
