"""docs/ci/spectune-gate.yml, the gate's GitHub Actions workflow, run as written: its ``run:`` steps are taken from
the YAML and run with bash in order (a failed step skips the rest unless its ``if:`` says ``always()``), with the
workflow's own environment variables pointing at an in-test server (tests/helpers/fake_server.py, one num_steps, TPOT
set by its decode speed) and at temporary folders. The install step is left out: spectune is installed already.

A baseline is made by the workflow's own sweep step; the same server again passes the gate (every step exit code 0),
and the server made 10% slower per token (a planted TPOT regression) fails it, with the Markdown summary naming TPOT
as FAIL with baseline, current and interval.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from spectune.backends.process import free_port
from helpers.paths import DOCS, FAKE_SERVER

pytestmark = pytest.mark.timing  # a 10% speed difference between two runs of an emulated server

WORKFLOW = DOCS / "ci" / "spectune-gate.yml"
TOKENS_PER_S = 100.0  # the fake server's decode speed: TPOT about 10 ms


def job() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]["gate"]


def run_steps(env: dict[str, str], workdir: Path) -> dict[str, int]:
    """Run the workflow's ``run:`` steps but the install step in ``workdir`` with ``env``; {step id: exit code},
    steps that did not run left out. Raises ValueError on an ``if:`` this runner does not know."""
    outcome: dict[str, int] = {}

    def allowed(cond: str | None) -> bool:
        failed = any(outcome.values())
        if not cond:
            return not failed
        ok = True
        for term in (t.strip() for t in cond.split("&&")):
            m = re.fullmatch(r"steps\.(\w+)\.outcome == 'success'", term)
            if term == "always()":
                continue
            if m:
                ok = ok and outcome.get(m.group(1)) == 0
            else:
                raise ValueError(f"unknown condition {term!r}")
        return ok

    for step in job()["steps"]:
        if "run" not in step or step.get("id") == "install":
            continue
        if not allowed(step.get("if")):
            continue
        script = workdir / f"step-{step['id']}.sh"
        script.write_text(step["run"])
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=workdir,
                              env=env, capture_output=True, text=True, timeout=180)
        (workdir / f"step-{step['id']}.log").write_text(proc.stdout + proc.stderr)
        outcome[step["id"]] = proc.returncode
    return outcome


class Server:
    """The fake server at num_steps 1 and ``tokens_per_s``, stopped on exit."""

    def __init__(self, tokens_per_s: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--port", str(self.port), "--steps", "1",
                                      "--accept-prob", "0.7", "--tokens-per-second", str(tokens_per_s)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self) -> str:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1):
                    return self.url
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("fake server did not start") from None
                time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def workflow_env(tmp: Path, url: str, current: str, summary: Path) -> dict[str, str]:
    """The workflow's ``env`` with its ``${{ }}`` values (repository variables) and the paths set for this test."""
    env = {k: str(v) for k, v in job()["env"].items()}
    env.update(SPECTUNE_ENDPOINT=url, SPECTUNE_STEPS="1", SPECTUNE_PIP_SPEC="spectune",
               SPECTUNE_SWEEP_ARGS="--num-prompts 8 --max-tokens 24 --requests-per-point 8 --warmup 1 --repeats 2 "
               "--no-drift-check",
               SPECTUNE_BASELINE=str(tmp / "baseline"), SPECTUNE_CURRENT=str(tmp / current))
    unset = [k for k, v in env.items() if "${{" in v]
    assert not unset, f"workflow variables the test does not set: {unset}"
    return {**os.environ, **env, "GITHUB_STEP_SUMMARY": str(summary),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Baseline, a clean run and a run with TPOT 10% higher: {name: (step exit codes, summary text)}."""
    tmp = tmp_path_factory.mktemp("ci")
    out = {}
    with Server(TOKENS_PER_S) as url:
        env = workflow_env(tmp, url, "baseline", tmp / "baseline.md")
        sweep = next(s for s in job()["steps"] if s.get("id") == "sweep")
        (tmp / "baseline.sh").write_text(sweep["run"])
        made = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(tmp / "baseline.sh")],
                              cwd=tmp, env=env, capture_output=True, text=True, timeout=180)
        assert made.returncode == 0, made.stderr[-2000:]
        summary = tmp / "clean.md"
        out["clean"] = (run_steps(workflow_env(tmp, url, "clean", summary), tmp), summary.read_text())
    with Server(TOKENS_PER_S / 1.1) as url:
        summary = tmp / "regressed.md"
        out["regressed"] = (run_steps(workflow_env(tmp, url, "regressed", summary), tmp), summary.read_text())
    return out


def test_clean_run_passes_every_step(runs):
    assert runs["clean"][0] == {"sweep": 0, "gate": 0, "report": 0}


def test_clean_summary_says_pass(runs):
    assert runs["clean"][1].startswith("## spectune gate: PASS")


def test_planted_tpot_regression_fails_the_gate(runs):
    assert runs["regressed"][0] == {"sweep": 0, "gate": 1, "report": 0}


def test_summary_names_tpot_failure_with_baseline_current_interval(runs):
    text = runs["regressed"][1]
    assert text.startswith("## spectune gate: FAIL (TPOT p50 ms")
    rows = [line.split(" | ") for line in text.splitlines() if "| TPOT p50 ms |" in line and "| FAIL |" in line]
    assert len(rows) >= 1
    cell, metric, base, cur, change, interval, limit, verdict = (c.strip(" |") for c in rows[0])
    assert float(cur) > float(base) * 1.05
    assert re.fullmatch(r"\[[\d.]+, [\d.]+\] / \[[\d.]+, [\d.]+\]", interval), interval  # 2 repeats a side
