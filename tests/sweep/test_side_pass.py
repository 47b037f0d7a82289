"""The side passes beside the static cells (spectune/sweep/side_pass.py): what ``schedule_pass`` hands
``execute`` for a backend with a schedule server, and what it hands without one. The passes' measurements run end to
end in test_schedule_server_sweep.py (timing) and test_p_min_sweep.py."""

from __future__ import annotations

import sys

from spectune.backends import make_backend
from spectune.backends.options import BackendOptions
from spectune.sweep.plan import SweepPlan
from spectune.sweep.schedule_server import schedule_pass

TEMPLATE = f"{sys.executable} server.py --port {{port}} --steps {{steps}}"


def launch(adaptive: bool):
    extra = " --adaptive-config {adaptive_config}" if adaptive else ""
    return make_backend("launch", BackendOptions(launch=TEMPLATE + extra))


def test_the_schedule_pass_pins_the_schedule_server_to_the_largest_num_steps():
    side, _ = schedule_pass(SweepPlan(steps=(0, 1, 3), concurrency=(1, 4)), launch(True), "on")
    assert side.options == {"schedule_server_max_k": 3}


def test_the_schedule_pass_has_its_own_folder():
    side, _ = schedule_pass(SweepPlan(steps=(0, 1, 3), concurrency=(1, 4)), launch(True), "on")
    assert side.folder == "schedule-server"


def test_the_schedule_pass_measures_the_sweeps_concurrencies():
    side, _ = schedule_pass(SweepPlan(steps=(0, 1, 3), concurrency=(1, 4)), launch(True), "on")
    assert side.plan.concurrency == (1, 4)


def test_a_template_without_a_schedule_has_no_schedule_pass():
    side, _ = schedule_pass(SweepPlan(steps=(0, 1, 3), concurrency=(1, 4)), launch(False), "auto")
    assert side is None
