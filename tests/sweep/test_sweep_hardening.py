"""The sweep machinery against careless servers and machines (issue 18): a load generator that is itself the
bottleneck, a server that never streams, num_steps 0 on a server that streams several tokens per chunk, secrets
in commands and server logs, folders that cannot be written and disks that fill up."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spectune.backends.options import BackendOptions
from spectune.sweep.display import summarize
from spectune.sweep.run import execute
from spectune.sweep.plan import SweepListener, SweepPlan
from test_sweep_run import FAKE, FakeServers, read_jsonl
from helpers.paths import ROOT as REPO_ROOT

ROOT = REPO_ROOT
HF = "hf_" + "Q" * 34  # a Hugging Face token shape
KEY = "s3cret-key-1234"


@pytest.fixture
def prompts(tmp_path) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"question {i}", "category": "chat"}) + "\n" for i in range(6)))
    return f"jsonl:{path}"


class Listener(SweepListener):
    def __init__(self, busy_s: float = 0.0) -> None:
        self.warnings: list[str] = []
        self.busy_s = busy_s

    def warning(self, message: str) -> None:
        self.warnings.append(message)

    def request_finished(self, key, record, done, planned) -> None:
        t = time.thread_time()  # the client's own CPU, on its event loop: the next request waits for it
        while time.thread_time() - t < self.busy_s:
            pass


async def test_a_point_the_client_limited_is_marked_and_warned_about(tmp_path, prompts):
    plan = SweepPlan(steps=(0,), concurrency=(2,), dataset=prompts, num_prompts=6, max_tokens=8,
                     requests_per_point=8, warmup_requests=0)
    listener = Listener(busy_s=0.04)
    async with FakeServers(k0="--tokens-per-second 20000") as urls:
        outcome = await execute(plan, "openai", BackendOptions(endpoints=urls), tmp_path / "out", listener=listener)
    (point,) = outcome.points
    m = point.metrics
    assert point.status == "ok"
    assert m["client_limited"] is True
    assert m["dispatch_delay_p90_ms"] >= 35  # each request waited for the busy callback of the one before
    assert point.client_limit.startswith("the load generator limited this point")
    assert any("K=0 c=2: the load generator limited this point" in w for w in listener.warnings)
    with open(tmp_path / "out" / "summary.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert row["client_limited"] == "True"
    assert float(row["client_cpu_share"]) > 0
    assert summarize(outcome.points, (0,), (2,))[2, 0].client_limited == 1


async def test_a_server_that_never_streams_fails_the_point_after_the_warmup_timeout(tmp_path, prompts):
    from spectune.measure.load_settings import ClientTimeouts

    plan = SweepPlan(steps=(0,), concurrency=(1, 2), dataset=prompts, num_prompts=6, max_tokens=8,
                     requests_per_point=4, warmup_requests=2)
    listener = Listener()
    async with FakeServers(k0="--never-answer") as urls:
        outcome = await asyncio.wait_for(
            execute(plan, "openai", BackendOptions(endpoints=urls), tmp_path / "out", listener=listener,
                    timeouts=ClientTimeouts(request_timeout_s=600.0, warmup_timeout_s=0.5)), 60)
    assert [(p.status, p.stop_reason) for p in outcome.points] == [("failed", "warmup_timeout")] * 2
    assert outcome.points[0].error.startswith("warm-up: 2 request(s) did not finish within 0.5 s")
    assert json.loads((tmp_path / "out" / "sweep.json").read_text())["client"] == {
        "request_timeout_s": 600.0, "warmup_timeout_s": 0.5}


async def test_request_timeout_is_the_users(tmp_path, prompts):
    from spectune.measure.load_settings import ClientTimeouts

    plan = SweepPlan(steps=(0,), concurrency=(2,), dataset=prompts, num_prompts=6, max_tokens=8,
                     requests_per_point=2, warmup_requests=0)
    async with FakeServers(k0="--never-answer") as urls:
        outcome = await asyncio.wait_for(
            execute(plan, "openai", BackendOptions(endpoints=urls), tmp_path / "out",
                    timeouts=ClientTimeouts(request_timeout_s=0.3)), 60)
    assert outcome.points[0].status == "failed"
    assert {r["error"] for r in read_jsonl(tmp_path / "out" / "requests.jsonl")} == {"timeout after 0.3 s"}


async def test_num_steps_0_is_one_on_a_server_that_streams_several_tokens_per_chunk(tmp_path, prompts):
    plan = SweepPlan(steps=(0,), concurrency=(1,), dataset=prompts, num_prompts=6, max_tokens=30,
                     requests_per_point=4, warmup_requests=0)
    async with FakeServers(k0="--chunk-tokens 3 --metrics none") as urls:
        outcome = await execute(plan, "openai", BackendOptions(endpoints=urls), tmp_path / "out")
    (point,) = outcome.points
    m = point.metrics
    assert m["mean_tokens_per_chunk"] == pytest.approx(3.0)  # the server's chunking, reported as such
    assert m["acceptance_length"] == 1.0
    assert m["acceptance_length_source"] == "config:num_steps=0"
    assert "streamed 3.00 tokens per chunk without speculating" in point.acceptance["warning"]


async def test_secrets_stay_out_of_the_results_folder(tmp_path, prompts, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-value-000111")  # a secret of spectune's own environment
    template = (f"env HF_TOKEN={HF} {shlex.quote(sys.executable)} {shlex.quote(str(FAKE))} --port {{port}} "
                f"--steps {{steps}} --api-key {KEY} --speculative-num-draft-tokens {{draft_tokens}} "
                "--model m --adaptive-config sk-env-value-000111")
    plan = SweepPlan(steps=(1,), concurrency=(1,), dataset=prompts, num_prompts=6, max_tokens=8,
                     requests_per_point=2, warmup_requests=0)
    out = tmp_path / "out"
    outcome = await execute(plan, "launch", BackendOptions(launch=template, startup_timeout_s=20.0), out)
    assert outcome.points[0].status == "ok"
    (log,) = (out / "logs").iterdir()
    assert "fake_server: starting" in log.read_text()  # the server's own output is there ...
    command = json.loads((out / "sweep.json").read_text())["backend"]["launches"][0]["command"]
    assert "--speculative-num-draft-tokens 2" in command  # numeric engine flags kept: the command replays
    assert "HF_TOKEN=***" in command
    assert "--api-key '***'" in command
    for path in [out / "sweep.json", out / "points.jsonl", out / "requests.jsonl", out / "summary.csv", log]:
        text = path.read_text()
        for secret in (HF, KEY, "sk-env-value-000111"):
            assert secret not in text, (path.name, secret)  # ... but not its secrets


def _cli(*args: str, fsize: int | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``spectune sweep`` in a subprocess; ``fsize``: a file-size limit (bytes) that makes writes beyond it fail
    as on a full disk (EFBIG; SIGXFSZ ignored so the write returns the error instead of killing the process)."""
    code = "import runpy, sys; sys.argv = ['spectune'] + sys.argv[1:]; runpy.run_module('spectune.cli', " \
           "run_name='__main__')"
    if fsize is not None:
        code = (f"import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
                f"resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize})); " + code)
    return subprocess.run([sys.executable, "-c", code, "sweep", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _launch_args(prompts: str, out: Path) -> list[str]:
    template = (f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE))} --port {{port}} --steps {{steps}} "
                "--tokens-per-second 4000")
    return ["--backend", "launch", "--launch", template, "--steps", "0,1", "--concurrency", "1,2", "--dataset",
            prompts, "--num-prompts", "6", "--max-tokens", "9", "--requests-per-point", "6", "--warmup", "0",
            "--startup-timeout", "20", "--output-dir", str(out)]


def test_an_unwritable_output_folder_is_one_line(tmp_path, prompts):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = _cli(*_launch_args(prompts, blocker / "out"))
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot write {blocker / 'out'}"), res.stderr
    assert "writable --output-dir" in lines[0]
    assert "Traceback" not in res.stderr + res.stdout


def test_a_full_disk_mid_sweep_is_one_line_and_resume_finishes(tmp_path, prompts):
    out = tmp_path / "out"
    res = _cli(*_launch_args(prompts, out), fsize=12_000)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 1, res.stderr
    assert len(lines) == 1 and lines[0].startswith("error: cannot write ") and "--resume" in lines[0], res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    kept = read_jsonl(out / "points.jsonl")
    assert 1 <= len(kept) < 4  # what finished before the disk filled is there
    done = _cli(*_launch_args(prompts, out), "--resume")
    assert done.returncode == 0, done.stderr
    points = read_jsonl(out / "points.jsonl")
    assert points[: len(kept)] == kept
    assert len(points) == 4
    assert [json.loads(line)["steps"] for line in (out / "requests.jsonl").read_text().splitlines()].count(1) == 12


def test_atomic_writes_fsync_the_folder(tmp_path, monkeypatch):
    from spectune.results.durable import atomic_write

    synced: list[bool] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(stat.S_ISDIR(os.fstat(fd).st_mode)) or real(fd))
    atomic_write(tmp_path / "x.json", lambda fh: fh.write("{}"))
    assert synced == [False, True]  # the file, then the folder holding the new name
    assert (tmp_path / "x.json").read_text() == "{}"
