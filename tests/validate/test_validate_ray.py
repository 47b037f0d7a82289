"""``spectune validate --ray``: every run (static num_steps and the config) as a Ray task on a real multi-node
cluster on this machine (tests/helpers/ray_cluster.py: two worker nodes with one CPU each), against
tests/helpers/fake_server.py launched per run (it sleeps per token, so two servers run side by side on two cores).

Claims: the same runs (names, order, phases) and the same verdict as the serial validation, every run naming the node
it ran on, two runs at the same time on two nodes, the requests and the servers' logs in the one folder; without
Ray, ``--ray`` is one line naming the extra and nothing is written.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from helpers.paths import FAKE_SERVER, ROOT
from helpers.ray_cluster import RESOURCES, start_cluster, stop_cluster, worker_ids  # before Ray: loopback

pytestmark = pytest.mark.timing  # run alone, after the parallel part (pyproject.toml)


def template(tokens_per_second: int) -> str:
    return (f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE_SERVER))} --port {{port}} --steps {{steps}} "
            f"--tokens-per-second {tokens_per_second} --adaptive-config {{adaptive_config}}")


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray")
    c = start_cluster(2)
    yield c
    stop_cluster(c)


@pytest.fixture
def setup(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}", "category": "chat"}) + "\n" for i in range(6)))
    config = tmp_path / "adaptive.json"
    config.write_text(json.dumps({"1": {"candidate_steps": [1, 3]}, "4": {"candidate_steps": [0, 1]}}))
    return tmp_path, prompts, config


def plan_and_options(prompts: Path, config: Path):
    from spectune.backends.options import BackendOptions
    from spectune.validate.plan import ValidatePlan
    from spectune.measure.workload import parse_workload

    wl = parse_workload("c1@1,c4@1", 60.0, None, 1.0, 64, 0)
    plan = ValidatePlan(config=str(config), steps=(0, 3), workload=wl, dataset=f"jsonl:{prompts}", num_prompts=6,
                        max_tokens=12, warmup_requests=1, repeats=1)  # one repeat: an A/A run (aa:0) follows
    return plan, BackendOptions(launch=template(500), startup_timeout_s=30)


def overlap(a: dict, b: dict) -> bool:
    """Whether two runs' [started, finished] spans overlap (validate.json's UTC ISO times)."""
    t = {k: (datetime.fromisoformat(r["started"]), datetime.fromisoformat(r["finished"])) for k, r in (("a", a),
                                                                                                    ("b", b))}
    return t["a"][0] < t["b"][1] and t["b"][0] < t["a"][1]


async def test_validate_ray_same_runs_and_verdict_as_serial(cluster, setup):
    from spectune.sweep.distributed import RayOptions
    from spectune.validate.run import execute

    tmp, prompts, config = setup
    plan, options = plan_and_options(prompts, config)
    serial = await execute(plan, "launch", options, tmp / "serial", config_launch=template(1500))
    spread = await execute(plan, "launch", options, tmp / "ray", config_launch=template(1500),
                           ray=RayOptions(address=cluster.address, resources=RESOURCES))
    meta = {name: json.loads((tmp / name / "validate.json").read_text()) for name in ("serial", "ray")}
    runs = {name: [(r["run"], r["repeat"]) for r in m["runs"]] for name, m in meta.items()}
    assert runs["ray"] == runs["serial"] == [("static:0", 1), ("static:3", 1), ("config", 1), ("aa:0", 1)]
    assert all(r["status"] == "ok" for r in meta["ray"]["runs"])
    phases = {name: [[p["label"] for p in r["phases"]] for r in m["runs"]] for name, m in meta.items()}
    assert phases["ray"] == phases["serial"] == [["c=1", "c=4"]] * 4
    assert serial.verdict.passed and spread.verdict.passed  # the config's server is 3x faster (not 10x: a
    # 5,000 tok/s server keeps its client busy enough that, next to a parallel run on 2 cores, it fell behind K=0)
    assert meta["ray"]["verdict"]["passed"] is True
    assert meta["ray"]["status"] == "done"
    nodes = [r["node"]["id"] for r in meta["ray"]["runs"]]
    assert set(nodes) <= worker_ids(cluster)  # every run names the node it ran on
    r = meta["ray"]["runs"]
    assert any(overlap(r[i], r[j]) and nodes[i] != nodes[j] for i in range(3) for j in range(i + 1, 3))  # parallel
    records = [json.loads(line) for line in (tmp / "ray" / "requests.jsonl").read_text().splitlines()]
    assert {(q["run"], q["phase"]) for q in records} == {(n, p) for n, _ in runs["ray"] for p in (1, 2)}
    counts = {(x["run"], i + 1): p["num_requests"] for x in r for i, p in enumerate(x["phases"])}
    assert {k: sum((q["run"], q["phase"]) == k for q in records) for k in counts} == counts
    launches = meta["ray"]["backend"]["config"]["launches"]
    assert len(launches) == 1 and "--adaptive-config " in launches[0]["command"]  # the config file's copy
    assert len(meta["ray"]["backend"]["static"]["launches"]) == 3  # static:0, static:3 and the A/A server
    logs = sorted(p.name for p in (tmp / "ray" / "logs").iterdir() if p.is_file())
    assert any(name.startswith("server-steps3@") for name in logs)  # the servers' logs came back
    assert any((tmp / "ray" / "logs" / "config").iterdir())
    assert meta["ray"]["ray"]["nodes_available"] == 2


def test_validate_ray_without_ray_is_one_line_and_writes_nothing(setup):
    tmp, prompts, config = setup
    shadow = tmp / "no-ray" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named ray')\n")  # as if ray were not installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")])}
    out = tmp / "out"
    done = subprocess.run([sys.executable, "-m", "spectune.cli", "validate", "--config", str(config), "--backend",
                           "launch", "--launch", template(500), "--workload", "c1@1", "--dataset", f"jsonl:{prompts}",
                           "--ray", "auto", "--output-dir", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert 'pip install -e ".[ray]"' in done.stderr
    assert not out.exists()


def test_ray_resources_without_ray_is_refused(setup):
    tmp, prompts, config = setup
    done = subprocess.run([sys.executable, "-m", "spectune.cli", "validate", "--config", str(config), "--backend",
                           "launch", "--launch", template(500), "--ray-resources", '{"GPU": 1}', "--output-dir",
                           str(tmp / "out")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--ray-resources works with --ray" in done.stderr


@pytest.mark.slow
async def test_a_run_whose_node_dies_runs_again_elsewhere(cluster, setup):
    """The node of the first run to start is killed as that run starts measuring: the run is submitted again, lands
    on the other node, and the validation completes with every run ok and the loss recorded."""
    from helpers.ray_cluster import NodeKiller
    from spectune.sweep.distributed import RayOptions
    from spectune.validate.plan import ValidateListener
    from spectune.validate.run import execute

    class KillFirst(ValidateListener):
        def __init__(self) -> None:
            self.killed: tuple[str, str] | None = None  # (run label, node id)
            self.killer = NodeKiller(cluster)

        def node_progress(self, task) -> None:
            if self.killed is None and task.current.startswith("phase"):
                self.killed = (task.label, task.node["id"])
                self.killer.kill(task.node["id"])

    tmp, prompts, config = setup
    plan, options = plan_and_options(prompts, config)
    killer = KillFirst()
    try:
        out = await execute(plan, "launch", options, tmp / "out", listener=killer, config_launch=template(5000),
                            ray=RayOptions(address=cluster.address, resources=RESOURCES))
    finally:
        killer.killer.restore()  # the module's cluster has two worker nodes again
    assert killer.killed is not None
    meta = json.loads((tmp / "out" / "validate.json").read_text())
    assert [(r["run"], r["status"]) for r in meta["runs"]] == [("static:0", "ok"), ("static:3", "ok"),
                                                               ("config", "ok"), ("aa:0", "ok")]
    label, node = killer.killed
    assert [(x["run"], x["node"]["id"]) for x in meta["lost_runs"]] == [(label, node)]
    assert next(r for r in meta["runs"] if r["run"] == label)["node"]["id"] != node  # measured again elsewhere
    records = [json.loads(line) for line in (tmp / "out" / "requests.jsonl").read_text().splitlines()]
    lost_run = next(r for r in meta["runs"] if r["run"] == label)
    assert sum(q["run"] == label for q in records) == sum(p["num_requests"] for p in lost_run["phases"])  # once
    assert out.verdict is not None and out.verdict.passed
