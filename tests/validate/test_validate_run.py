"""`spectune validate` as a user runs it (subprocesses): tests/fake_server.py launched per num_steps through the
launch backend, two 1 s phases (concurrency 1, then 4). The config run gets its own template (--config-launch) so
that its server is clearly faster or slower than the static ones (3x to 10x), which makes the verdict certain.
No server runs above 1,500 tok/s per sequence: at 5,000 a 12-token request is 2.4 ms and the client's own CPU
sets the figure, so on two loaded cores a 5,000 tok/s static server once failed to beat a 300 tok/s config."""

from __future__ import annotations

import json
import math
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from spectune.validate.phases import phase_index
from helpers.paths import FAKE_SERVER, ROOT as REPO_ROOT

ROOT = REPO_ROOT
FAKE = FAKE_SERVER


def template(tokens_per_second: int) -> str:
    return (f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE))} --port {{port}} --steps {{steps}} "
            f"--tokens-per-second {tokens_per_second} --adaptive-config {{adaptive_config}}")


@pytest.fixture
def setup(tmp_path) -> tuple[Path, list[str]]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}", "category": "chat"}) + "\n" for i in range(6)))
    config = tmp_path / "adaptive.json"
    config.write_text(json.dumps({"1": {"candidate_steps": [1, 3]}, "4": {"candidate_steps": [0, 1]}}))
    args = ["--config", str(config), "--backend", "launch", "--workload", "c1@1,c4@1", "--dataset", f"jsonl:{prompts}",
            "--num-prompts", "6", "--max-tokens", "12", "--warmup", "1", "--startup-timeout", "20"]
    return tmp_path, args


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spectune.cli", "validate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=90)


def test_validate_end_to_end_pass(setup):
    tmp, args = setup
    out = tmp / "out"
    proc = cli(*args, "--steps", "0,3", "--repeats", "1", "--launch", template(500), "--config-launch",
               template(1500), "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    verdict_lines = [line for line in proc.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert len(verdict_lines) == 1
    assert verdict_lines[0].startswith("PASS: the config delivers")
    meta = json.loads((out / "validate.json").read_text())
    assert meta["status"] == "done"
    assert meta["verdict"]["passed"]
    # both static servers decode 500 tok/s whatever K (fake_server sleeps per token), so either can be faster: the
    # verdict must name the one with the higher measured overall throughput (first of equals: smaller K)
    static = {r["steps"]: r["overall"]["output_throughput_tok_s"] for r in meta["runs"]
              if r["run"].startswith("static:")}
    fastest = min(k for k, v in static.items() if v == max(static.values()))
    assert meta["verdict"]["best_static"] == fastest
    assert f"K={fastest} ({static[fastest]:,.1f} tok/s)" in verdict_lines[0]
    assert meta["config"]["candidate_steps"] == [0, 1, 3] and meta["config"]["initial_steps"] == 3
    assert [r["run"] for r in meta["runs"]] == ["static:0", "static:3", "config", "aa:0"]  # one repeat: an A/A run
    for r in meta["runs"]:
        assert r["status"] == "ok"
        assert [p["label"] for p in r["phases"]] == ["c=1", "c=4"]
        assert all(p["num_requests"] > 0 and p["output_throughput_tok_s"] > 0 for p in r["phases"])
    assert meta["runs"][0]["overall"]["acceptance_length"] == 1.0  # K = 0
    config_launch = meta["backend"]["config"]["launches"][0]["command"]
    assert "--adaptive-config " + str(tmp / "adaptive.json") in config_launch
    assert "--steps 3" in config_launch
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    t0 = {r["run"]: r["t0"] for r in meta["runs"]}
    bounds = [(0.0, 1.0), (1.0, 2.0)]
    assert {(r["run"], r["phase"]) for r in records} == {(n, p) for n in t0 for p in (1, 2)}
    assert all(r["phase"] == phase_index(r["send_time"] - t0[r["run"]], bounds) + 1 for r in records)
    counts = {(n, p): sum(r["run"] == n and r["phase"] == p for r in records) for n in t0 for p in (1, 2)}
    assert all(counts[n, p] == meta["runs"][i]["phases"][p - 1]["num_requests"]
               for i, n in enumerate(t0) for p in (1, 2))
    md = (out / "validate.md").read_text()
    assert "## Phase 1: c=1 (0-1 s)" in md
    assert [r["phase"] for r in meta["phase_check"]["phases"]] == [1, 2]
    assert any(line.startswith("per phase: ") for line in proc.stdout.splitlines())
    assert "## Each phase: the config vs that phase's best static num_steps" in md
    assert "## Phase 2: c=4 (1-2 s)" in md
    assert "**PASS: " in md


def test_validate_fail_exit_code_and_margin(setup):
    tmp, args = setup
    proc = cli(*args, "--steps", "3", "--repeats", "1", "--launch", template(1500), "--config-launch", template(150),
               "--output-dir", str(tmp / "out"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL: static K=3 beats the config by " in proc.stdout
    assert "% in output throughput" in proc.stdout
    meta = json.loads((tmp / "out" / "validate.json").read_text())
    assert not meta["verdict"]["passed"]
    assert meta["verdict"]["margin_pct"] < 0


def test_rule_again_applies_a_static_recommendation_without_measuring(setup):
    """recommend's primary recommendation beside the config is static K=3: --rule-again re-reads the finished runs,
    rules that the config falls behind the static it stands for, and rewrites validate.json and validate.md while
    requests.jsonl stays as measured."""
    tmp, args = setup
    out = tmp / "out"
    proc = cli(*args, "--steps", "3", "--repeats", "1", "--launch", template(1500), "--config-launch", template(150),
               "--output-dir", str(out))
    assert proc.returncode == 1, proc.stderr
    measured = (out / "requests.jsonl").read_bytes()
    (tmp / "recommendation.json").write_text(json.dumps({"primary": {"kind": "static", "num_steps": 3}}))
    before = json.loads((out / "validate.json").read_text())
    steady = [p.pop("steady_output_throughput_tok_s") for r in before["runs"] for p in r["phases"]]
    for r in before["runs"]:
        for p in r["phases"]:
            p.pop("settle_s")
    (out / "validate.json").write_text(json.dumps(before))  # as a validation from before the steady windows
    again = cli(*args, "--rule-again", "--output-dir", str(out))
    assert again.returncode == 1, again.stderr
    assert again.stdout.startswith("FAIL: the config falls behind static K=3, the num_steps it stands for")
    meta = json.loads((out / "validate.json").read_text())
    assert meta["verdict"]["recommended_static"] == 3
    assert [p["steady_output_throughput_tok_s"] for r in meta["runs"] for p in r["phases"]] == pytest.approx(steady)
    assert any(line.startswith("per phase: ") for line in again.stdout.splitlines())
    assert "the num_steps it stands for" in (out / "validate.md").read_text()
    assert (out / "requests.jsonl").read_bytes() == measured
    empty = cli(*args, "--rule-again", "--output-dir", str(tmp / "nothing"))
    assert empty.returncode == 2
    assert "no validation to rule on" in empty.stderr


def test_validate_repeats_interleave_and_average(setup):
    tmp, args = setup
    out = tmp / "out"
    proc = cli(*args, "--steps", "0", "--repeats", "2", "--launch", template(500), "--config-launch",
               template(1500), "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "validate.json").read_text())
    assert [(r["run"], r["repeat"]) for r in meta["runs"]] == [("static:0", 1), ("config", 1), ("config", 2),
                                                               ("static:0", 2)]
    assert all(r["status"] == "ok" for r in meta["runs"])
    launches = [meta["backend"]["static"]["launches"], meta["backend"]["config"]["launches"]]
    assert [len(x) for x in launches] == [2, 2]  # each repeat starts its servers afresh, the config's too
    mean = sum(r["overall"]["output_throughput_tok_s"] for r in meta["runs"] if r["run"] == "config") / 2
    assert "PASS" in meta["verdict"]["line"]
    assert f"{mean:,.1f} tok/s" in meta["verdict"]["line"]
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert {(r["run"], r["repeat"]) for r in records} == {("static:0", 1), ("static:0", 2), ("config", 1),
                                                          ("config", 2)}


def test_bad_config_is_one_line_before_anything_runs(setup):
    tmp, args = setup
    (tmp / "adaptive.json").write_text('{"1": {"candidate_step": [1, 3]}}')  # a typo SGLang would ignore
    proc = cli(*args, "--launch", template(500), "--output-dir", str(tmp / "out"))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "candidate_step" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp / "out").exists()


def test_config_of_the_wrong_engine_is_refused(setup):
    tmp, args = setup
    (tmp / "adaptive.json").write_text("[[1, 8, 3], [9, 64, 1]]")  # a vLLM schedule for SGLang
    args[args.index("launch")] = "sglang"
    proc = cli(*args, "--model", "M", "--draft", "h", "--output-dir", str(tmp / "out"))
    assert proc.returncode == 2
    assert "vLLM schedule" in proc.stderr
    assert not (tmp / "out").exists()


def test_recommends_best_static_json_validates_as_that_static_num_steps(setup):
    """``best-static.json`` at K=0 (recommend's "no drafter" answer, which writes no vLLM or SGLang file): the
    config is static K=0, so only the static servers run and the verdict asks whether one beats K=0."""
    tmp, args = setup
    best = tmp / "best-static.json"
    best.write_text(json.dumps({"num_steps": 0, "objective": "throughput", "aggregate_score": 1.0}))
    args[args.index("--config") + 1] = str(best)
    out = tmp / "out"
    proc = cli(*args, "--steps", "0,3", "--repeats", "1", "--launch", template(500), "--output-dir", str(out))
    meta = json.loads((out / "validate.json").read_text())
    assert meta["config"]["static_equivalent"]["steps"] == 0
    assert [r["run"] for r in meta["runs"]] == ["static:0", "static:3", "aa:0"]
    assert "the config is static K=0 (best-static.json: no drafter on any engine)" in proc.stdout


def _launch_times(meta: dict) -> list[tuple[int, float]]:
    """(num_steps, time.time() of the start) of every launch, static and config, in start order."""
    launches = meta["backend"]["static"]["launches"] + meta["backend"]["config"]["launches"]
    return sorted(((x["steps"], x["started"]) for x in launches), key=lambda x: x[1])


def _run_starts(meta: dict) -> dict[tuple[str, int], float]:
    """(run, repeat) -> its start, from validate.json's ISO time (whole seconds)."""
    from datetime import datetime
    return {(r["run"], r["repeat"]): datetime.fromisoformat(r["started"]).timestamp() for r in meta["runs"]}


def _before(launch: float, start: float) -> bool:
    """A launch (``time.time()``) came before a run start given in whole seconds: its second is not later."""
    return math.floor(launch) <= start


def _held(setup, servers: str, steps: str) -> tuple[dict, Path]:
    """validate.json and the folder of a 2-repeat validation with ``--servers servers`` (the config 3x faster)."""
    tmp, args = setup
    out = tmp / "out"
    proc = cli(*args, "--steps", steps, "--repeats", "2", "--servers", servers, "--launch", template(500),
               "--config-launch", template(1500), "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "validate.json").read_text()), out


def test_servers_kept_are_started_once_and_up_together(setup):
    """``--servers kept``: every server starts once, before the first run, and serves every repeat."""
    meta, out = _held(setup, "kept", "0,1")
    assert [(r["run"], r["repeat"]) for r in meta["runs"]] == [
        ("static:0", 1), ("static:1", 1), ("config", 1), ("config", 2), ("static:1", 2), ("static:0", 2)]
    assert all(r["status"] == "ok" for r in meta["runs"])
    assert sorted(k for k, _ in _launch_times(meta)) == [0, 1, 3]  # one server per run name, the config's at K=3
    pids = {x["pid"] for x in meta["backend"]["static"]["launches"] + meta["backend"]["config"]["launches"]}
    assert len(pids) == 3
    assert _before(max(t for _, t in _launch_times(meta)), min(_run_starts(meta).values()))
    assert meta["plan"]["servers"] == "kept"
    assert meta["instance_spread"]["kept"] is True
    assert "servers kept up" in meta["verdict"]["line"]
    assert "(`--servers kept`)" in (out / "validate.md").read_text()


def test_servers_together_start_afresh_every_repeat(setup):
    """``--servers together``: each repeat's servers start at once before its first run, and again next repeat."""
    meta, _ = _held(setup, "together", "0")
    launches = _launch_times(meta)
    assert sorted(k for k, _ in launches) == [0, 0, 3, 3]
    starts = _run_starts(meta)
    assert _before(max(t for _, t in launches[:2]), min(starts[("static:0", 1)], starts[("config", 1)]))
    assert min(t for _, t in launches[2:]) > max(starts[("static:0", 1)], starts[("config", 1)])
    assert _before(max(t for _, t in launches[2:]), min(starts[("static:0", 2)], starts[("config", 2)]))
    assert meta["instance_spread"]["kept"] is False


@pytest.mark.parametrize("extra, needle", [(("--servers", "all"), "--servers must be one of one, together, kept"),
                                          (("--servers", "kept", "--port", "8123"), "omit --port"),
                                          (("--servers", "together", "--ray", "auto"), "drop one of the two")])
def test_bad_servers_setting_is_one_line_before_anything_runs(setup, extra, needle):
    tmp, args = setup
    proc = cli(*args, "--launch", template(500), *extra, "--output-dir", str(tmp / "out"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert needle in proc.stderr
    assert not (tmp / "out").exists()
