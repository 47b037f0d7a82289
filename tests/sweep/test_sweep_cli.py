"""`spectune sweep` as a user runs it (subprocesses): Ctrl-C keeps finished points and stops the servers,
--resume finishes the table without re-running them, and bad input is one line on stderr with exit code 2."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from spectune.backends.process import free_port
from helpers.paths import FAKE_SERVER, ROOT as REPO_ROOT

ROOT = REPO_ROOT
FAKE = FAKE_SERVER


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spectune.cli", "sweep", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def processes_with(marker: str) -> list[int]:
    """pids whose command line contains ``marker`` (launched fake servers carry it as their --model)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


@pytest.fixture
def prompts(tmp_path) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"question {i}", "category": "chat"}) + "\n" for i in range(6)))
    return f"jsonl:{path}"


def test_ctrl_c_keeps_finished_points_and_resume_completes(tmp_path, prompts):
    marker = f"sweep-ctrlc-{uuid.uuid4().hex[:10]}"
    template = (f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE))} --port {{port}} --steps {{steps}} "
                f"--tokens-per-second 400 --model {marker}")
    out = tmp_path / "out"
    args = ["--backend", "launch", "--launch", template, "--steps", "0,1", "--concurrency", "1,2",
            "--dataset", prompts, "--num-prompts", "6", "--max-tokens", "17", "--requests-per-point", "8",
            "--warmup", "1", "--output-dir", str(out), "--startup-timeout", "20"]
    proc = subprocess.Popen([sys.executable, "-m", "spectune.cli", "sweep", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    points_file = out / "points.jsonl"
    deadline = time.monotonic() + 40
    while not (points_file.exists() and points_file.read_text().count("\n") >= 1):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    before_points = points_file.read_text().splitlines()
    n = len(before_points)
    assert 1 <= n < 4
    assert f"interrupted: {n} points kept; resume with --resume --output-dir {out}" in err
    assert "Traceback" not in err
    assert processes_with(marker) == []  # every launched server stopped
    kept = {(p["steps"], p["concurrency"], p["repeat"]) for p in map(json.loads, before_points)}
    before_requests = (out / "requests.jsonl").read_text()
    keys = [(r["steps"], r["concurrency"], r["repeat"]) for r in map(json.loads, before_requests.splitlines())]
    assert set(keys) == kept
    assert len(keys) == 8 * n  # the interrupted point's partial records are gone

    done = cli(*args, "--resume")
    assert done.returncode == 0, done.stderr
    assert f"resuming: {n} finished point(s) kept, {4 - n} to run" in done.stdout
    after_points = points_file.read_text().splitlines()
    assert after_points[:n] == before_points  # finished points untouched, not re-run
    assert [(p["steps"], p["concurrency"]) for p in map(json.loads, after_points)] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    after_requests = (out / "requests.jsonl").read_text()
    assert after_requests.startswith(before_requests)
    assert after_requests.count("\n") == 4 * 8
    assert "failed" not in {json.loads(p)["status"] for p in after_points}
    meta = json.loads((out / "sweep.json").read_text())
    assert meta["resumed"]
    assert len(meta["history"]) == 1
    assert processes_with(marker) == []


def _bad_cases(tmp_path: Path, prompts: str) -> list[tuple[list[str], str]]:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    ok = ["--backend", "openai", "--endpoint", "http://127.0.0.1:9", "--dataset", prompts]
    dead = f"http://127.0.0.1:{free_port()}"
    return [
        (["--backend", "openai", "--endpoint", "http://127.0.0.1:9", "--dataset", "mtbench"],
         "unknown dataset 'mtbench'"),
        (["--backend", "openai", "--endpoint", "http://127.0.0.1:9", "--dataset", f"jsonl:{empty}"], "is empty"),
        (["--backend", "openai", "--endpoint", "localhost:8000", "--dataset", prompts], "malformed endpoint URL"),
        (["--backend", "openai", "--endpoint", dead, "--dataset", prompts, "--steps", "0"], f"cannot reach {dead}"),
        ([*ok, "--steps", "-1,2"], "--steps -1 is negative"),
        ([*ok, "--concurrency", "0,4"], "--concurrency 0 is not positive"),
        ([*ok, "--steps", "1,,2"], "bad --steps list"),
        ([*ok, "--concurrency", "1,two"], "bad --concurrency value 'two'"),
        ([*ok, "--backend", "tgi"], "unknown backend 'tgi'"),
        ([*ok, "--endpoint", "x=http://h:1"], "bad --endpoint 'x=http://h:1'"),
        ([*ok, "--server-args", "--flag 'open"], "cannot split --server-args"),
        ([*ok, "--max-failure-rate", "2"], "--max-failure-rate must be in 0..1"),
        (["--backend", "local", "--compile", "fast", "--dataset", prompts], "--compile 'fast': use auto, on or off"),
        ([*ok, "--schedule-server", "maybe"], "--schedule-server 'maybe': use auto, on or off"),
        ([*ok, "--schedule-server", "on"], "--schedule-server on: the openai backend has no schedule server"),
    ]


def test_bad_input_is_one_line_exit_2(tmp_path, prompts):
    for i, (args, words) in enumerate(_bad_cases(tmp_path, prompts)):
        out = tmp_path / f"out{i}"
        res = cli(*args, "--output-dir", str(out))
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert res.returncode == 2, (args, res.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], (args, res.stderr)
        assert "Traceback" not in res.stderr + res.stdout
        assert not (out / "sweep.json").exists()
        assert not (out / "points.jsonl").exists()  # nothing written


def test_existing_folder_with_another_plan_or_finished_points(tmp_path, prompts):
    out = tmp_path / "out"
    out.mkdir()
    plan = {"steps": [0, 1], "concurrency": [1], "repeats": 1}
    (out / "sweep.json").write_text(json.dumps({"plan": plan}))
    point = json.dumps({"steps": 0, "concurrency": 1, "repeat": 0, "status": "ok", "metrics": {}}) + "\n"
    (out / "points.jsonl").write_text(point)
    before = sorted((p.name, p.read_bytes()) for p in out.iterdir())
    args = ["--backend", "openai", "--endpoint", "http://127.0.0.1:9", "--dataset", prompts, "--output-dir", str(out)]
    for extra in ([], ["--resume"]):
        res = cli(*args, *extra)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert "holds a different sweep plan (" in res.stderr
        assert "use a new --output-dir" in res.stderr
        assert sorted((p.name, p.read_bytes()) for p in out.iterdir()) == before
    # the same plan as the folder's, without --resume: refused, pointing at --resume
    from spectune.sweep.plan import SweepPlan

    same = SweepPlan(steps=(0, 1), concurrency=(1,), dataset=prompts, num_prompts=6).to_json()
    (out / "sweep.json").write_text(json.dumps({"plan": same}))
    before = sorted((p.name, p.read_bytes()) for p in out.iterdir())
    res = cli(*args, "--steps", "0,1", "--concurrency", "1", "--num-prompts", "6")
    assert res.returncode == 2
    assert "already holds 1 finished point(s) of this plan: add --resume" in res.stderr
    assert sorted((p.name, p.read_bytes()) for p in out.iterdir()) == before  # nothing measured was touched
