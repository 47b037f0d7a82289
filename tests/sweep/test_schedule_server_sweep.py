"""``spectune sweep --schedule-server on`` then ``spectune recommend`` on emulated servers (tests/helpers/
emulated_server.py through the launch backend) whose schedule server carries a known extra cost.

The static servers: the compute-bound cost model with a larger fixed step cost, a costly verify and acceptance 0.5
(``--base-ms 10 --per-token-ms 2 --accept 0.5``): num_steps 1 is about 21% ahead of 0 at concurrency 1 and about 14%
behind it at 16, so the per-concurrency choice is the schedule ``[[1, N, 1], [N + 1, M, 0]]``. Priced on the static
cells that schedule beats the best single static num_steps at one concurrency by more than 10%.

- A schedule server that costs what the static ones do (the emulated server follows the pinned vLLM schedule, no
  extra cost): the schedule still wins and is the primary recommendation.
- One whose drafter runs in K=0 steps (``--schedule-draft-floor``) and whose every step is 25% slower
  (``--schedule-factor 1.25``, vLLM's graph downgrade): priced there, the schedule loses to no drafter beyond the
  noise band, and must not be chosen.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.emulated_server import launch_template
from helpers.paths import ROOT

pytestmark = pytest.mark.timing  # run alone, after the parallel part (pyproject.toml)

BASE = "--scale 2 --continuous-usage --base-ms 10 --per-token-ms 2 --accept 0.5 --adaptive-config {adaptive_config}"


def sweep_and_recommend(tmp: Path, extra: str) -> dict:
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(24)))
    out = tmp / "sweep"
    cmd = [sys.executable, "-m", "spectune.cli", "sweep", "--backend", "launch", "--launch",
           launch_template(f"{BASE} {extra}"), "--steps", "0,1", "--concurrency", "1,16", "--dataset",
           f"jsonl:{prompts}", "--num-prompts", "24", "--requests-per-point", "24", "--max-tokens", "16",
           "--warmup", "2", "--schedule-server", "on", "--no-drift-check", "--output-dir", str(out)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rec = subprocess.run([sys.executable, "-m", "spectune.cli", "recommend", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert rec.returncode == 0, rec.stdout[-2000:] + rec.stderr[-2000:]
    return json.loads((out / "recommendation" / "recommendation.json").read_text())


@pytest.fixture(scope="module")
def cheap(tmp_path_factory) -> dict:
    return sweep_and_recommend(tmp_path_factory.mktemp("cheap"), "")


@pytest.fixture(scope="module")
def costly(tmp_path_factory) -> dict:
    return sweep_and_recommend(tmp_path_factory.mktemp("costly"), "--schedule-draft-floor --schedule-factor 1.25")


def test_the_static_cells_choose_a_schedule(cheap):
    assert [(c["concurrency"], c["steps"]) for c in cheap["choices"]] == [(1, 1), (16, 0)]


def test_a_schedule_server_without_extra_cost_keeps_the_schedule(cheap):
    assert cheap["primary"]["kind"] == "schedule"


def test_its_choices_are_made_on_the_schedule_server(cheap):
    assert [(c["concurrency"], c["steps"]) for c in cheap["schedule_choices"]] == [(1, 1), (16, 0)]


def test_its_slots_run_k1_then_k0(cheap):
    assert [s["steps"] for s in cheap["slots"]] == [1, 0]


def test_a_costly_schedule_server_is_not_chosen(costly):
    assert (costly["primary"]["kind"], costly["primary"]["num_steps"]) == ("static", 0)


def test_the_costly_servers_k0_is_measured_slower_than_no_drafter(costly):
    k0 = [c for c in costly["schedule_server_costs"] if c["steps"] == 0 and c["concurrency"] == 16]
    assert k0[0]["verdict"] == "loses"
