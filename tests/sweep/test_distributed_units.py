"""The parts of a distributed sweep that need no Ray cluster: ``--ray-resources`` parsing and its Ray task options,
the one-line error without Ray, the nodes' calibration verdicts (spectune.results.nodes), the worker's folder
stand-in, and ``spectune recommend`` refusing points of unlike nodes unless ``--allow-mixed-nodes``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from spectune.cli import app
from spectune.core.errors import UserError
from spectune.results.nodes import check_mixed_nodes, node_verdicts
from spectune.sweep.distributed import RayOptions, import_ray, parse_resources
from spectune.sweep.plan import SweepPlan
from spectune.sweep.ray_block import BlockFolder

from helpers.paths import ROOT
from helpers.results_folders import grid, write_sweep


def cal(tput: float, low: float, high: float, status: str = "ok") -> dict:
    """A calibration point with its throughput (tokens/s) and interval."""
    return {"steps": 0, "concurrency": 1, "repeat": 0, "status": status,
            "metrics": {"output_throughput_tok_s": tput, "output_throughput_ci_low": low,
                        "output_throughput_ci_high": high}}


def test_resources_default_to_one_cpu_and_map_to_task_options():
    assert parse_resources(None) == {"CPU": 1.0}
    opts = RayOptions(resources=parse_resources('{"GPU": 2, "memory": 1e9, "a100": 1}')).task_options()
    assert opts == {"num_cpus": 1.0, "num_gpus": 2.0, "memory": 1e9, "resources": {"a100": 1.0}}


@pytest.mark.parametrize("text", ["[1]", "{\"GPU\": -1}", "{\"GPU\": \"one\"}", "GPU=1", "{\"GPU\": true}"])
def test_bad_resources_are_one_user_error(text):
    with pytest.raises(UserError, match="bad --ray-resources"):
        parse_resources(text)


def test_fits_needs_every_resource():
    opts = RayOptions(resources={"CPU": 1.0, "GPU": 1.0})
    assert opts.fits({"CPU": 4.0, "GPU": 1.0})
    assert not opts.fits({"CPU": 4.0})


def test_without_ray_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(UserError) as err:
        import_ray()
    assert 'pip install -e ".[ray]"' in str(err.value)
    assert "\n" not in str(err.value)


def test_cli_without_ray_is_one_line_exit_2(tmp_path):
    shadow = tmp_path / "no-ray" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named ray')\n")  # as if ray were not installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "o"
    done = subprocess.run([sys.executable, "-m", "spectune.cli", "sweep", "--ray", "auto", "--backend", "launch",
                           "--launch", "srv --port {port}", "--output-dir", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert 'pip install -e ".[ray]"' in done.stderr
    assert not out.exists()  # nothing written


def test_ray_refuses_interleaving_and_takes_the_guided_plan(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", object())  # importable
    with pytest.raises(UserError, match="--order blocks"):
        RayOptions().check(SweepPlan(order="interleaved"))
    assert RayOptions().check(SweepPlan(design="guided")) is None  # its rounds run in parallel


def test_alike_nodes_within_the_band():
    v = node_verdicts({"a": cal(100, 98, 102), "b": cal(101, 99, 103), "c": cal(99.5, 97, 101)}, 0.02)
    assert [v[n]["alike"] for n in "abc"] == [True, True, True]


def test_a_slow_node_outside_the_band_is_unlike_and_only_it():
    v = node_verdicts({"a": cal(100, 98, 102), "b": cal(101, 99, 103), "slow": cal(80, 78, 82)}, 0.02)
    assert v["slow"]["alike"] is False
    assert v["slow"]["ratio"] == pytest.approx(80 / 100)  # over the median node
    assert v["a"]["alike"] and v["b"]["alike"]


def test_a_difference_within_its_own_noise_is_not_unlike():
    # 6% slower, but its interval reaches into the band: noise could explain it
    v = node_verdicts({"a": cal(100, 99, 101), "b": cal(100, 99, 101), "c": cal(94, 85, 99.5)}, 0.02)
    assert v["c"]["alike"] is True


def test_failed_calibration_and_a_single_node_are_unknown():
    v = node_verdicts({"a": cal(100, 98, 102), "b": cal(0, 0, 0, status="failed")}, 0.02)
    assert v["a"]["alike"] is None  # nobody to compare with
    assert v["b"]["alike"] is None


def test_block_folder_drops_an_unfinished_points_requests():
    events = []
    folder = BlockFolder(events.append)
    mark = folder.request_mark()
    folder.append_request({"steps": 1, "concurrency": 1, "repeat": 0, "i": 0})
    folder.truncate_requests(mark)  # the point was cancelled
    folder.append_request({"steps": 1, "concurrency": 1, "repeat": 0, "i": 1})
    folder.append_point({"steps": 1, "concurrency": 1, "repeat": 0, "status": "ok"})
    assert [e["kind"] for e in events] == ["point"]
    assert [r["i"] for r in events[0]["requests"]] == [1]
    assert folder.read_requests() == events[0]["requests"]


def nodes_meta(slow_alike: bool) -> dict:
    return {"nodes": {"aaaaaaaa1": {"id": "aaaaaaaa1", "hostname": "gpu-1", "alike": True, "ratio": 1.0},
                      "bbbbbbbb2": {"id": "bbbbbbbb2", "hostname": "gpu-2", "alike": slow_alike, "ratio": 0.8}}}


def on(node: str, k: int) -> dict:
    return {"steps": k, "concurrency": 1, "repeat": 0, "node": {"id": node}}


def test_mixed_nodes_refused_with_the_flag_named():
    with pytest.raises(UserError) as err:
        check_mixed_nodes(nodes_meta(False), [on("aaaaaaaa1", 0), on("bbbbbbbb2", 1)], allow=False)
    assert "--allow-mixed-nodes" in str(err.value)
    assert "gpu-2" in str(err.value)


def test_mixed_nodes_allowed_say_so():
    warnings = check_mixed_nodes(nodes_meta(False), [on("aaaaaaaa1", 0), on("bbbbbbbb2", 1)], allow=True)
    assert len(warnings) == 1 and "gpu-2" in warnings[0]


def test_alike_nodes_or_one_node_compare_freely():
    assert check_mixed_nodes(nodes_meta(True), [on("aaaaaaaa1", 0), on("bbbbbbbb2", 1)], allow=False) == []
    assert check_mixed_nodes(nodes_meta(False), [on("bbbbbbbb2", 0), on("bbbbbbbb2", 1)], allow=False) == []


def test_recommend_cli_refuses_unlike_nodes_unless_allowed(tmp_path):
    plan = {"steps": [0, 1], "concurrency": [1]}
    rows = grid({1: {0: 100.0, 1: 150.0}})
    points = [on("aaaaaaaa1", 0) | {"status": "ok"}, on("bbbbbbbb2", 1) | {"status": "ok"}]
    folder = write_sweep(tmp_path / "sweep", rows, plan=plan, points=points)
    meta = json.loads((folder / "sweep.json").read_text()) | nodes_meta(False)
    (folder / "sweep.json").write_text(json.dumps(meta))
    refused = CliRunner().invoke(app, ["recommend", str(folder), "-o", str(tmp_path / "r1")])
    assert isinstance(refused.exception, UserError)  # spectune.cli.main prints it as one line, exit code 2
    assert "--allow-mixed-nodes" in str(refused.exception)
    assert not (tmp_path / "r1").exists()
    allowed = CliRunner().invoke(app, ["recommend", str(folder), "-o", str(tmp_path / "r2"), "--allow-mixed-nodes"])
    assert allowed.exit_code == 0, allowed.output
    assert "unlike nodes" in allowed.output


def block_payload(tmp_path, steps: int = 3, concurrency=(1, 8)) -> dict:
    """A block task's payload for the emulated server (tests/helpers/emulated_server.py) at num_steps ``steps``."""
    from spectune.backends.options import BackendOptions
    from spectune.loadgen.datasets import load_dataset
    from spectune.measure.load_settings import ClientTimeouts

    from helpers.emulated_server import launch_template

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}", "category": "chat"}) + "\n" for i in range(8)))
    plan = SweepPlan(steps=(steps,), concurrency=tuple(concurrency), dataset=f"jsonl:{prompts}", num_prompts=8,
                     max_tokens=12, requests_per_point=8, warmup_requests=1)
    options = BackendOptions(launch=launch_template(f"--startup-s 0.2 --pid-dir {tmp_path / 'pids'}"),
                             startup_timeout_s=30, max_concurrency=max(concurrency), max_tokens=12)
    return {"plan": plan, "backend": "launch", "options": options, "keys": [[steps, c, 0] for c in concurrency],
            "prompts": load_dataset(plan.dataset, plan.num_prompts, plan.seed), "timeouts": ClientTimeouts(),
            "points": []}


def pids_alive(folder) -> list[int]:
    out = []
    for p in folder.iterdir() if folder.exists() else []:
        try:
            os.kill(int(p.name), 0)
            out.append(int(p.name))
        except ProcessLookupError:
            pass
    return out


def test_block_events_measure_the_block_and_stop_its_server(tmp_path):
    """The task body run in this process (no Ray): node first, the points with their requests, the block's drift
    check, the server's log, done last; the server is gone afterwards."""
    from spectune.sweep.ray_block import block_events

    events = list(block_events(block_payload(tmp_path)))
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "node" and kinds[-1] == "done"
    points = [e for e in events if e["kind"] == "point"]
    assert [(p["point"]["steps"], p["point"]["concurrency"]) for p in points] == [(3, 1), (3, 8)]
    assert all(p["point"]["status"] == "ok" for p in points)
    assert [len(p["requests"]) for p in points] == [8, 8]
    assert {(r["steps"], r["concurrency"]) for r in points[1]["requests"]} == {(3, 8)}
    assert kinds.count("drift") == 1  # the block's reference cell measured again
    assert [e["name"] for e in events if e["kind"] == "log"] == ["server-steps3.log"]
    assert events[-1]["cost"]["points"] == 2
    assert pids_alive(tmp_path / "pids") == []


def test_closing_a_block_mid_point_stops_its_server_and_sends_no_partial_point(tmp_path):
    from spectune.sweep.ray_block import block_events

    gen = block_events(block_payload(tmp_path, concurrency=(1,)))
    seen = []
    for event in gen:
        seen.append(event["kind"])
        if event["kind"] == "point_started":
            gen.close()  # what a cancelled task does (its KeyboardInterrupt ends the generator)
            break
    assert "point" not in seen
    assert list((tmp_path / "pids").iterdir())  # a server was started...
    assert pids_alive(tmp_path / "pids") == []  # ...and is stopped
