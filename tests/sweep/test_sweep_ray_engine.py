"""``spectune sweep --ray`` with the bundled engine (``--backend local``, the default pair: SmolLM2-135M-Instruct and
the bundled EAGLE-3 head, on CPU): a small grid serially and with ``--ray`` on a local Ray cluster
(tests/helpers/ray_cluster.py) gives the same points, all ok, and the same choices (or, where recommend called
the best num_steps a tie within its noise in one folder and chose the smaller one, the same best num_steps: on this
2-core machine K=1 and K=0 of the default pair are 7-13% apart at concurrency 1-2, inside 12-request intervals).

The cluster has one worker node, so its blocks run one after another, as the serial sweep's do: on a 2-core machine
two engines side by side would each get half the cores and the noisier measurements could flip a close choice;
that tasks run in parallel is shown with the emulated servers (test_sweep_ray.py). What this test adds is the real
engine inside a Ray task: its server launched by the task, measured beside it, its points streamed back, stopped.
"""

from __future__ import annotations

import json

import pytest

from helpers.engine import bundled_head_available
from helpers.ray_cluster import (RESOURCES, agree, recommended, start_cluster,  # before Ray: loopback
                                 stop_cluster, worker_ids)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not bundled_head_available(), reason="the bundled SmolLM2 head is not installed")]

ray = pytest.importorskip("ray")

from spectune.backends.options import BackendOptions, BundledEngineOptions
from spectune.sweep.distributed import RayOptions  # noqa: E402
from spectune.sweep.plan import SweepPlan  # noqa: E402
from spectune.sweep.run import execute  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    c = start_cluster(1)
    yield c
    stop_cluster(c)


def plan() -> SweepPlan:
    return SweepPlan(steps=(0, 1), concurrency=(1, 2), dataset="mt-bench", num_prompts=8, max_tokens=24,
                     requests_per_point=12, warmup_requests=1, drift_check=False)


def options() -> BackendOptions:
    return BackendOptions(startup_timeout_s=600, local=BundledEngineOptions(device="cpu", compile="off"))


async def test_bundled_engine_sweep_under_ray_matches_the_serial_one(cluster, tmp_path):
    serial = await execute(plan(), "local", options(), tmp_path / "serial")
    spread = await execute(plan(), "local", options(), tmp_path / "ray",
                           ray=RayOptions(address=cluster.address, resources=RESOURCES))
    keys = {name: {p.key for p in out.points}
            for name, out in (("serial", serial), ("ray", spread))}
    assert keys["ray"] == keys["serial"] == set(plan().points())
    assert all(p.status == "ok" for p in spread.points)
    assert {p.extra["node"]["id"] for p in spread.points} <= worker_ids(cluster)
    k1 = [p for p in spread.points if p.steps == 1]
    assert all(p.metrics["acceptance_length"] > 1.0 for p in k1)  # the head's drafts were accepted in the task
    serial_choice, ray_choice = recommended(tmp_path / "serial"), recommended(tmp_path / "ray")
    for c in plan().concurrency:
        assert agree(serial_choice[c], ray_choice[c]), (c, serial_choice[c], ray_choice[c])
    meta = json.loads((tmp_path / "ray" / "sweep.json").read_text())
    # the engine's launches came back from the tasks: one per block, and the node's calibration cell (K=0 at c=1),
    # measured by a task of its own because the node's first block was K=1's (the larger num_steps goes first)
    assert sorted(launch["steps"] for launch in meta["backend"]["launches"]) == [0, 0, 1]
