"""Does `spectune sweep` notice a server that does not run the num_steps it was given
(spectune/measure/schedule_check.py ``check_num_steps``)? Counter arithmetic on hand-made snapshots, and a sweep of
the ``vllm`` backend end to end with tests/helpers/fake_engines.py's vLLM stand-in set to draft 3 tokens per step
whatever ``num_speculative_tokens`` it is launched with (``FAKE_ENGINE_IGNORE_K``): its K=1 points are flagged
(warning naming vLLM's runner setting, ``schedule_check`` in points.jsonl and summary.csv), its K=3 points are not,
and its K=0 points (no speculative config, no spec-decode counters) are not checkable."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from helpers import fake_engines
from helpers.paths import ROOT
from spectune.backends.options import BackendOptions
from spectune.backends.snapshots import SpecSnapshot
from spectune.backends.openai import OpenAIBackend
from spectune.measure.schedule_check import check_num_steps
from spectune.results.schema import summary_row
from spectune.sweep.display import point_line


def snap(drafts: float, tokens: float, accepted: float) -> SpecSnapshot:
    return SpecSnapshot(taken_at=0.0, num_drafts=drafts, num_draft_tokens=tokens, num_accepted_tokens=accepted)


def test_drafting_k_at_num_steps_k_is_followed():
    assert check_num_steps(3, snap(0, 0, 0), snap(100, 300, 150), 4.0).followed


def test_drafting_fewer_than_k_is_followed():
    assert check_num_steps(3, snap(0, 0, 0), snap(100, 180, 90), 4.0).followed


def test_drafting_three_at_num_steps_one_is_not_followed():
    check = check_num_steps(1, snap(0, 0, 0), snap(100, 300, 150), 4.0)
    assert (check.drafted_per_step, check.k_high, check.followed) == (3.0, 1, False)


def test_drafting_in_most_steps_at_num_steps_zero_is_not_followed():
    # 100 drafting steps out of 250 output tokens - 150 accepted = 100 verify steps
    assert not check_num_steps(0, snap(0, 0, 0), snap(100, 300, 150), 2.0, output_tokens=250).followed


def test_no_counters_no_check():
    assert check_num_steps(2, SpecSnapshot(taken_at=0.0), SpecSnapshot(taken_at=1.0), 2.0) is None


def test_negative_num_steps_is_refused():
    with pytest.raises(ValueError, match="num_steps must be >= 0"):
        check_num_steps(-1, snap(0, 0, 0), snap(1, 1, 1), 1.0)


@pytest.fixture(scope="module")
def ignoring(tmp_path_factory) -> dict:
    """A grid sweep (K = 0, 1, 3 at concurrency 2) of a fake vLLM that drafts 3 tokens per step at every K > 0:
    its summary rows by K, its points by K and the console output."""
    tmp = tmp_path_factory.mktemp("ignore-k")
    paths = fake_engines.install(tmp / "engines")
    draft = tmp / "fake-eagle3-head"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(8)))
    env = dict(os.environ, PATH=f"{paths['bin']}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join([str(paths["py"]), str(ROOT), os.environ.get("PYTHONPATH", "")]),
               FAKE_ENGINE_TPS="4000", FAKE_ENGINE_IGNORE_K="3", SPECTUNE_VLLM_PYTHON=sys.executable)
    out = tmp / "sweep"
    proc = subprocess.run(
        [sys.executable, "-m", "spectune.cli", "sweep", "--backend", "vllm", "--model", "fake-org/Fake-8B",
         "--draft", str(draft), "--steps", "0,1,3", "--concurrency", "2", "--dataset", f"jsonl:{prompts}",
         "--num-prompts", "8", "--max-tokens", "32", "--warmup", "1", "--startup-timeout", "30", "--no-drift-check",
         "--output-dir", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {int(r["steps"]): r for r in csv.DictReader((out / "summary.csv").open())}
    points = {p["steps"]: p for p in map(json.loads, (out / "points.jsonl").read_text().splitlines())}
    return {"rows": rows, "points": points, "output": " ".join((proc.stdout + proc.stderr).split())}


def test_summary_says_which_points_ran_the_num_steps_they_were_given(ignoring):
    assert {k: r["schedule_check"] for k, r in ignoring["rows"].items()} == {0: "", 1: "not_followed", 3: "followed"}


def test_points_record_the_drafted_tokens_per_step(ignoring):
    assert ignoring["points"][1]["schedule_check"]["drafted_per_step"] == pytest.approx(3.0)


def test_the_warning_says_plainly_which_point_is_wrong(ignoring):
    assert "K=1 c=2: the server drafted 3.00 tokens per step" in ignoring["output"]


def test_the_warning_names_vllms_runner_setting(ignoring):
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in ignoring["output"]


def test_no_warning_for_the_points_that_followed(ignoring):
    assert "K=3 c=2: the server drafted" not in ignoring["output"]


def test_the_end_of_the_sweep_lists_the_wrong_points(ignoring):
    assert "num_steps check: 1 point(s) drafted more than the num_steps they were given (K=1 c=2)" in ignoring["output"]


def test_a_point_line_marks_a_point_not_at_its_num_steps(ignoring):
    assert "[NOT at num_steps 1: drafted 3.00/step]" in point_line(ignoring["points"][1])


def test_an_older_point_without_the_check_reads_as_empty():
    point = {"steps": 1, "concurrency": 2, "repeat": 0, "status": "ok", "error": "", "metrics": {}}
    assert summary_row(point)["schedule_check"] == ""


def test_the_openai_backend_points_at_the_servers_own_flags():
    backend = OpenAIBackend(BackendOptions(endpoints={-1: "http://127.0.0.1:8000"}))
    assert "--endpoint K=URL" in backend.schedule_setting()
