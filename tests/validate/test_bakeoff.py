"""A bake-off: several ``--config`` in one `spectune validate` (spectune/validate/bakeoff.py).

End to end (subprocesses, as a user runs it): tests/helpers/fake_server.py with ``--step-ms``, so every verify step
takes the same time whatever its draft length and a server's speed is its tokens per step: K=0 one token, K=1
about 1.95, K=3 about 3.7 (acceptance 0.95). Against static num_steps 0 and 1, three configs whose outcome is known
by construction: ``win`` (a vLLM schedule of K=3 alone and K=2 above, about 1.5x the best static K=1), ``lose`` (a
vLLM schedule of K=0 everywhere: about 0.5x) and ``mid`` (an SGLang adaptive config, which the fake server does
not follow: it runs its initial K=1, as static K=1). Phases of 0.5 s and the servers of a repeat up together keep
the one bake-off near 15 s; every test below reads it.

Unit: ``NAME=PATH`` naming and the duplicate-name error; the goodput and winner rules on runs with known numbers;
one config's validate.md and plan exactly as before (the committed examples re-render byte for byte).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers.paths import EXAMPLES, FAKE_SERVER, ROOT
from spectune.cli import app
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject
from spectune.results.validate_run import RunWindow
from spectune.measure.workload import parse_workload
from spectune.validate.bakeoff import goodput_req_s, rule_bakeoff
from spectune.validate.plan import ValidatePlan, parse_configs
from spectune.validate.report_page import write_validation_report
from spectune.validate.run import rule_again, rule_again_bakeoff
from spectune.validate.verdict import render_markdown

TEMPLATE = (f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE_SERVER))} --port {{port}} --steps {{steps}} "
            "--step-ms 5 --accept-prob 0.95 --adaptive-config {adaptive_config}")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spectune.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=180)


def _configs(tmp: Path) -> dict[str, Path]:
    paths = {"win": tmp / "win.json", "lose": tmp / "lose.json", "mid": tmp / "sglang.json"}
    paths["win"].write_text(json.dumps([[1, 1, 3], [2, 64, 2]]))
    paths["lose"].write_text(json.dumps([[1, 64, 0]]))
    paths["mid"].write_text(json.dumps({"1": {"candidate_steps": [0, 1]}, "4": {"candidate_steps": [0, 1]}}))
    return paths


def _args(tmp: Path) -> list[str]:
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}", "category": "chat"}) + "\n" for i in range(6)))
    return ["--backend", "launch", "--workload", "c1@0.5,c4@0.5", "--dataset", f"jsonl:{prompts}",
            "--num-prompts", "6", "--max-tokens", "12", "--warmup", "1", "--startup-timeout", "20", "--steps", "0,1",
            "--repeats", "1", "--launch", TEMPLATE]


@pytest.fixture(scope="module")
def bakeoff(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path, dict[str, Path], list[str]]:
    """One bake-off of win, lose and mid (``mid=`` names the SGLang file): (process, folder, config paths, args)."""
    tmp = tmp_path_factory.mktemp("bakeoff")
    paths, args = _configs(tmp), _args(tmp)
    out = tmp / "out"
    proc = cli("validate", "--config", str(paths["win"]), "--config", str(paths["lose"]), "--config",
               f"mid={paths['mid']}", *args, "--servers", "together", "--output-dir", str(out))
    return proc, out, paths, args


def _meta(out: Path) -> dict:
    return json.loads((out / "validate.json").read_text())


def test_three_configs_share_the_static_runs_of_one(bakeoff):
    proc, out, paths, _ = bakeoff
    assert proc.returncode == 0, proc.stdout + proc.stderr
    meta = _meta(out)
    names = [r["run"] for r in meta["runs"]]
    assert names == ["static:0", "static:1", "config:win", "config:lose", "config:mid", "aa:0"]
    one = ValidatePlan(config=str(paths["win"]), steps=(0, 1), workload=parse_workload("c1@0.5,c4@0.5", 1.0),
                       repeats=1).run_order(3)
    assert [n for n in names if not n.startswith("config")] == [n for n, _, _ in one if n != "config"]
    assert len(meta["backend"]["static"]["launches"]) == 3  # static:0, static:1, aa:0: one server each
    assert {n: len(b["launches"]) for n, b in meta["backend"]["configs"].items()} == {
        "config:win": 1, "config:lose": 1, "config:mid": 1}


def test_each_config_server_runs_its_own_file_at_its_largest_candidate(bakeoff):
    _, out, paths, _ = bakeoff
    commands = {n: b["launches"][0]["command"] for n, b in _meta(out)["backend"]["configs"].items()}
    assert f"--adaptive-config {paths['lose']}" in commands["config:lose"]
    assert "--steps 3" in commands["config:win"]
    assert "--steps 0" in commands["config:lose"]
    assert "--steps 1" in commands["config:mid"]


def test_one_table_and_one_verdict_per_config(bakeoff):
    proc, out, _, _ = bakeoff
    meta = _meta(out)
    assert [c["name"] for c in meta["bakeoff"]["configs"]] == ["win", "lose", "mid"]
    assert [c["name"] for c in meta["configs"]] == ["win", "lose", "mid"]
    md = (out / "validate.md").read_text()
    assert md.count("## Bake-off: each config against the best static num_steps") == 1
    assert md.count("| config | run | verdict | output tok/s |") == 1
    for name in ("win", "lose", "mid"):
        assert sum(line.startswith(f"{name}: ") for line in proc.stdout.splitlines()) == 1
        assert f"- **{name}**: " in md
    assert [len(c["phases"]) for c in meta["bakeoff"]["configs"]] == [2, 2, 2]


def test_the_known_winner_passes_and_the_known_loser_fails(bakeoff):
    proc, out, _, _ = bakeoff
    meta = _meta(out)
    outcome = {c["name"]: c["verdict"]["outcome"] for c in meta["bakeoff"]["configs"]}
    assert outcome["win"] == "PASS"
    assert outcome["lose"] == "FAIL"
    assert meta["bakeoff"]["best_static"]["steps"] == 1
    assert meta["bakeoff"]["winner"] == "win"
    assert meta["verdict"]["line"].startswith("PASS: win wins the bake-off: the config delivers")
    assert proc.stdout.splitlines().count(meta["verdict"]["line"]) == 1


def test_report_page_shows_the_bakeoff(bakeoff, tmp_path):
    _, out, _, _ = bakeoff
    html = write_validation_report(out, tmp_path).read_text()
    assert "Bake-off: each config against the best static num_steps" in html
    assert "Winner: win." in html
    assert '<td class="text">config:lose</td><td class="text fail-cell">FAIL</td>' in html


def test_rule_again_rules_every_config_and_refuses_other_names(bakeoff):
    _, out, paths, _ = bakeoff
    before = _meta(out)["bakeoff"]
    v, meta = rule_again_bakeoff(out, ["mid", "win", "lose"])
    assert [c["verdict"]["outcome"] for c in meta["bakeoff"]["configs"]] == [
        c["verdict"]["outcome"] for c in before["configs"]]
    assert v.line == _meta(out)["verdict"]["line"]
    with pytest.raises(UserError, match="holds a bake-off of configs win, lose, mid, not win, lose: pass the same"):
        rule_again_bakeoff(out, ["win", "lose"])
    with pytest.raises(UserError, match="holds a bake-off of configs win, lose, mid: pass each as --config NAME=PATH"):
        rule_again(out, str(paths["win"]))


def test_name_path_and_file_stem_naming(tmp_path):
    (tmp_path / "a=b.json").write_text("[]")
    assert parse_configs(["ema=x/sglang.json", "y/best-static.json", str(tmp_path / "a=b.json")]) == [
        ("ema", "x/sglang.json"), ("best-static", "y/best-static.json"), ("a=b", str(tmp_path / "a=b.json"))]


def test_duplicate_names_are_one_line_before_anything_runs(tmp_path):
    with pytest.raises(UserError, match=r"two configs named 'sched' \(a/sched.json, b/sched.json\)"):
        parse_configs(["a/sched.json", "b/sched.json"])
    paths = _configs(tmp_path)
    res = CliRunner().invoke(app, ["validate", "--config", f"x={paths['win']}", "--config", f"x={paths['lose']}",
                                   *_args(tmp_path), "--output-dir", str(tmp_path / "out")])
    assert isinstance(res.exception, UserError)  # spectune.cli.main prints it as one line, exit code 2
    assert "\n" not in str(res.exception)
    assert "name them apart with NAME=PATH" in str(res.exception)
    assert not (tmp_path / "out").exists()


def _window(tok: float, att: float | None, n: int, start: float, end: float) -> RunWindow:
    return RunWindow.from_json({"output_throughput_tok_s": tok, "steady_output_throughput_tok_s": tok,
                                "slo_attainment": att, "num_requests": n, "start_s": start, "end_s": end,
                                "tpot_p50_ms": 1000.0 / tok, "label": "c=1"})


def _meta_of(config_tok: dict[str, float], static_config: bool = False) -> dict:
    """A finished bake-off without requests: statics K=0 at 100 tok/s and K=1 at 120, one config run per entry of
    ``config_tok`` (tok/s); SLO attainment 0.5 in every window of 10 requests over 2 s (one phase). With
    ``static_config``, a last config ``s1`` that is static K=1, stood for by ``static:1``."""
    def run(name: str, steps: int, tok: float) -> JsonObject:
        return {"run": name, "steps": steps, "repeat": 1, "status": "ok",
                "overall": _window(tok, 0.5, 10, 0, 2).to_json(), "phases": [_window(tok, 0.5, 10, 0, 2).to_json()]}

    runs = [run("static:0", 0, 100.0), run("static:1", 1, 120.0)]
    runs += [run(f"config:{n}", 2, t) for n, t in config_tok.items()]
    configs = [{"name": n, "path": f"{n}.json", "run": f"config:{n}", "static_equivalent": None} for n in config_tok]
    if static_config:
        configs.append({"name": "s1", "path": "s1.json", "run": "static:1",
                        "static_equivalent": {"steps": 1, "reason": "one candidate, 1, in every slot"}})
    return {"plan": {"tolerance": 0.0, "slo_tpot_ms": 10.0, "workload": {"phases": [{"concurrency": 1}]}},
            "configs": configs, "runs": runs}


def test_goodput_is_requests_meeting_the_slos_per_second():
    assert goodput_req_s(_window(100.0, 0.5, 10, 0.0, 2.0)) == 2.5
    assert goodput_req_s(_window(100.0, None, 10, 0.0, 2.0)) is None


def test_the_fastest_passing_config_wins_and_without_one_the_best_static():
    meta = _meta_of({"b": 150.0, "a": 200.0, "c": 60.0})
    v = rule_bakeoff(meta, [])
    assert meta["bakeoff"]["winner"] == "a"
    assert v.line.startswith("PASS: a wins the bake-off")
    assert meta["bakeoff"]["configs"][1]["overall"]["goodput_req_s"] == 2.5
    assert meta["bakeoff"]["configs"][1]["phases"][0]["slo_attainment"] == 0.5
    assert meta["bakeoff"]["phase_best_static"][0]["steps"] == 1
    lost = _meta_of({"c": 60.0})
    v = rule_bakeoff(lost, [])
    assert lost["bakeoff"]["winner"] is None
    assert v.line == ("FAIL: no config beats the best static num_steps K=1 (120.0 tok/s): the best static wins the "
                      "bake-off")
    assert v.exit_code == 1


def test_a_static_config_is_ruled_as_its_static_run():
    meta = _meta_of({"c": 60.0}, static_config=True)
    v = rule_bakeoff(meta, [])
    row = meta["bakeoff"]["configs"][1]
    assert row["run"] == "static:1"
    assert row["verdict"]["line"].startswith("PASS: the config is static K=1 (one candidate, 1, in every slot), so "
                                             "it was not run again")
    assert row["overall"]["output_throughput_tok_s"] == 120.0
    assert v.line.startswith("PASS: s1 wins the bake-off")


@pytest.mark.parametrize("example", sorted(p.parent.relative_to(EXAMPLES).as_posix()
                                           for p in EXAMPLES.rglob("validate.json")))
def test_one_config_validate_md_is_unchanged(example):
    """Every committed validation of one config renders its committed validate.md byte for byte."""
    folder = EXAMPLES / example
    assert render_markdown(json.loads((folder / "validate.json").read_text())) == (folder / "validate.md").read_text()


def test_one_config_plan_json_has_no_bakeoff_key():
    plan = ValidatePlan(config="c.json", steps=(0, 1), workload=parse_workload("c1@1", 1.0), repeats=1)
    assert "configs" not in plan.to_json()
