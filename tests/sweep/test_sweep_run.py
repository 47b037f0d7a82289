"""spectune sweep end to end in-process (spectune.sweep.run.execute) on tests/helpers/fake_server.py: in-process fake
servers
behind the openai/sglang backends, and real subprocesses behind the launch backend (a server that never starts,
a server killed mid-point)."""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import sys
from pathlib import Path

import pytest

from spectune.backends.options import BackendOptions
from spectune.results.schema import SUMMARY_COLUMNS
from spectune.sweep.run import execute
from spectune.sweep.plan import SweepListener, SweepPlan

from helpers.fake_server import FakeServers
from helpers.paths import FAKE_SERVER

FAKE = FAKE_SERVER


@pytest.fixture
def prompts(tmp_path) -> str:
    """A 6-prompt JSONL dataset in two categories."""
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "prompt": f"question {i}", "category": ("code", "chat")[i % 2]})
                            + "\n" for i in range(6)))
    return f"jsonl:{path}"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def chunk_acceptance(records: list[dict]) -> float:
    """Tokens per verify step seen by the client: each chunk after the first is one verify step (accepted + 1)."""
    chunks = [n for r in records for n in r["chunk_tokens"][1:]]
    return sum(chunks) / len(chunks)


async def test_small_sweep_writes_the_results_folder(tmp_path, prompts):
    plan = SweepPlan(steps=(0, 2, 3), concurrency=(1, 2), dataset=prompts, num_prompts=6, max_tokens=41,
                     requests_per_point=8, warmup_requests=2)
    async with FakeServers(k0="", k2="--accept-prob 0.6", k3="--accept-prob 1.0") as urls:
        options = BackendOptions(endpoints=urls)
        out = tmp_path / "out"
        outcome = await execute(plan, "openai", options, out)
    assert outcome.ran == 6
    assert outcome.interrupted is None
    meta = json.loads((out / "sweep.json").read_text())
    assert meta["plan"] == plan.to_json()
    assert meta["backend"]["backend"] == "openai"
    assert meta["versions"]["spectune"]
    assert meta["host"]["cpus"] >= 1
    points = read_jsonl(out / "points.jsonl")
    assert [(p["steps"], p["concurrency"], p["repeat"]) for p in points] == [
        (0, 1, 0), (0, 2, 0), (2, 1, 0), (2, 2, 0), (3, 1, 0), (3, 2, 0)]  # for K, for concurrency, for repeat
    requests = read_jsonl(out / "requests.jsonl")
    assert len(requests) == 6 * 8
    assert not any(r["prompt_id"].startswith("warmup") for r in requests)
    with open(out / "summary.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        rows = {(int(r["steps"]), int(r["concurrency"])): r for r in reader}
    assert reader.fieldnames == list(SUMMARY_COLUMNS)
    for (k, c), row in rows.items():
        mine = [r for r in requests if (r["steps"], r["concurrency"]) == (k, c)]
        assert row["status"] == "ok"
        assert int(row["num_requests"]) == 8
        assert int(row["num_failed"]) == 0
        assert int(row["total_output_tokens"]) == 8 * 41 == sum(r["completion_tokens"] for r in mine)
        assert float(row["output_throughput_tok_s"]) > 0
        assert 0 < float(row["tpot_p50_ms"]) < 1000
        assert 0 < float(row["achieved_concurrency"]) <= c + 1e-9
        # the window's counter deltas equal what the client saw: the warm-up requests are outside the window
        assert float(row["acceptance_length"]) == pytest.approx(chunk_acceptance(mine), abs=1e-9)
    assert {rows[0, c]["acceptance_length"] for c in (1, 2)} == {"1.0"}
    assert {rows[3, c]["acceptance_length"] for c in (1, 2)} == {"4.0"}  # every draft accepted: K + 1
    assert rows[3, 1]["acceptance_rate"] == "1.0"
    assert rows[3, 1]["acceptance_length_source"] == "vllm:/metrics counters"
    for c in (1, 2):  # configured 0.6: 1 + 0.6 + 0.36 = 1.96 expected tokens per verify step
        assert float(rows[2, c]["acceptance_length"]) == pytest.approx(1.96, abs=0.2)
    k3 = next(p for p in points if p["steps"] == 3)
    assert k3["acceptance"]["per_position"] == [1.0, 1.0, 1.0]
    assert k3["acceptance"]["num_drafts"] == 8 * 10
    assert set(k3["per_category"]) == {"code", "chat"}
    assert k3["warmup"] == {"requests": 2, "failed": 0}
    assert sum(v["num_requests"] for v in k3["per_category"].values()) == 8


async def test_a_sweep_sizes_its_servers_on_a_copy_of_the_callers_options(tmp_path, prompts):
    """execute sizes the backend for the plan (max_concurrency, max_tokens, log_dir) without changing the
    options it was given (BackendOptions is frozen; the sweep builds its backend from a copy)."""
    plan = SweepPlan(steps=(0,), concurrency=(1, 3), dataset=prompts, num_prompts=6, max_tokens=9,
                     requests_per_point=3, warmup_requests=1)
    async with FakeServers(k0="") as urls:
        options = BackendOptions(endpoints=urls)
        await execute(plan, "openai", options, tmp_path / "out")
    assert options == BackendOptions(endpoints=urls)


async def test_sweep_json_records_the_cpu_and_the_load_before_the_run(tmp_path, prompts):
    plan = SweepPlan(steps=(0,), concurrency=(1,), dataset=prompts, num_prompts=6, max_tokens=9,
                     requests_per_point=2, warmup_requests=1)
    async with FakeServers(k0="") as urls:
        await execute(plan, "openai", BackendOptions(endpoints=urls), tmp_path / "out")
    host = json.loads((tmp_path / "out" / "sweep.json").read_text())["host"]
    assert (len(host["load_average"]), set(host["cpu"])) == (3, {"model", "vector_flags"})


async def test_per_category_acceptance_from_sglang_details(tmp_path, prompts):
    """The sglang backend asks for per-request spec details, so each category gets its own acceptance length."""
    plan = SweepPlan(steps=(2,), concurrency=(2,), dataset=prompts, num_prompts=6, max_tokens=31,
                     requests_per_point=12, warmup_requests=0)
    async with FakeServers(k2="--accept-prob 0.5 --metrics none") as urls:
        outcome = await execute(plan, "sglang", BackendOptions(endpoints=urls), tmp_path / "out")
    (pt,) = outcome.points
    assert pt.status == "ok"
    assert pt.metrics["acceptance_length_source"] == "sglang:per-request"
    requests = read_jsonl(tmp_path / "out" / "requests.jsonl")
    for cat in ("code", "chat"):
        entry = pt.per_category[cat]
        mine = [r for r in requests if r["category"] == cat]
        assert entry["acceptance_length_source"] == "sglang:per-request"
        assert entry["acceptance_length"] == pytest.approx(chunk_acceptance(mine), abs=1e-9)


class Recorder(SweepListener):
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def server_failed(self, steps, message, log_tail):
        self.events.append(("server_failed", steps, message, log_tail))

    def point_finished(self, point):
        self.events.append(("point", point.steps, point.concurrency, point.repeat, point.status))


def launch_options(template_tail: str, **kw) -> BackendOptions:
    template = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE))} --port {{port}} --steps {{steps}} "
    return BackendOptions(launch=template + template_tail, startup_timeout_s=20.0, **kw)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_server_that_never_starts_fails_its_points_and_the_sweep_goes_on(tmp_path, prompts):
    inner = f"exec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE))} --port {{port}} --steps {{steps}}"
    script = f"if [ {{steps}} = 1 ]; then echo 'CUDA out of memory (fake)' >&2; exit 1; fi; {inner}"
    options = BackendOptions(launch=f"sh -c {shlex.quote(script)}", startup_timeout_s=20.0)
    plan = SweepPlan(steps=(0, 1, 2), concurrency=(1, 2), dataset=prompts, num_prompts=6, max_tokens=9,
                     requests_per_point=4, warmup_requests=0)
    recorder = Recorder()
    outcome = await execute(plan, "launch", options, tmp_path / "out", listener=recorder)
    status = {p.key.cell: p for p in outcome.points}
    assert [status[k, c].status for k in (0, 1, 2) for c in (1, 2)] == ["ok", "ok", "failed", "failed", "ok", "ok"]
    failed = status[1, 1]
    assert failed.error.startswith("server for num_steps 1 exited with code 1 during startup")
    assert "out of GPU memory" in failed.error
    assert "\n" not in failed.error
    assert "CUDA out of memory (fake)" in failed.log_tail
    assert failed.metrics["num_requests"] == 0
    (event,) = [e for e in recorder.events if e[0] == "server_failed"]
    assert event[1] == 1
    assert "CUDA out of memory (fake)" in event[3]
    with open(tmp_path / "out" / "summary.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["error"] for r in rows if r["status"] == "failed"] == [failed.error] * 2
    assert not any(r["steps"] == 1 for r in read_jsonl(tmp_path / "out" / "requests.jsonl"))
    launches = json.loads((tmp_path / "out" / "sweep.json").read_text())["backend"]["launches"]
    # the last launch is the drift check's: the reference cell (K=0) measured again at the end
    assert [(x["steps"], bool(x.get("failed"))) for x in launches] == [(0, False), (1, True), (2, False), (0, False)]
    assert all(gone(x["pid"]) for x in launches)
    # each launch's log is named relative to the results folder it lies in (sweep.json names no machine's folders)
    assert all(x["log"] == f"logs/server-steps{x['steps']}.log" for x in launches)


class Killer(Recorder):
    """Kills the launched server (SIGKILL to its process group) at the 3rd request of one point."""

    def __init__(self, folder: Path, key: tuple[int, int, int]) -> None:
        super().__init__()
        self.folder, self.key = folder, key
        self.killed: int | None = None

    def request_finished(self, key, record, done, planned):
        if key == self.key and done == 3 and self.killed is None:
            launches = json.loads((self.folder / "sweep.json").read_text())["backend"]["launches"]
            self.killed = launches[-1]["pid"]
            os.killpg(self.killed, signal.SIGKILL)


async def test_server_killed_mid_point(tmp_path, prompts):
    plan = SweepPlan(steps=(1,), concurrency=(1, 2), repeats=2, dataset=prompts, num_prompts=6, max_tokens=9,
                     requests_per_point=8, warmup_requests=1)
    out = tmp_path / "out"
    killer = Killer(out, (1, 1, 1))
    outcome = await execute(plan, "launch", launch_options("--tokens-per-second 2000"), out, listener=killer)
    assert [e[1:] for e in killer.events if e[0] == "point"] == [
        (1, 1, 0, "ok"), (1, 1, 1, "failed"), (1, 2, 0, "ok"), (1, 2, 1, "ok")]
    bad = outcome.points[1]
    m = bad.metrics
    assert m["num_failed"] >= 1
    assert m["num_requests"] == 3 + m["num_failed"] < 8  # stopped early, not averaged
    assert bad.stop_reason == "max_failures"
    assert bad.error.startswith(f"{m['num_failed']} of {m['num_requests']}")
    launches = json.loads((out / "sweep.json").read_text())["backend"]["launches"]
    assert len(launches) == 2
    assert launches[0]["pid"] == killer.killed
    assert launches[0].get("died")
    assert all(gone(x["pid"]) for x in launches)
    requests = read_jsonl(out / "requests.jsonl")
    assert sum(1 for r in requests if (r["concurrency"], r["repeat"]) == (1, 1)) == m["num_requests"]


async def test_sweep_records_the_engines_running_batch_size(tmp_path, prompts, monkeypatch):
    """Each window's running batch comes from the engine's own gauge (here vllm:num_requests_running), through the
    backend, whatever the engine: a time average at or below the client's concurrency."""
    monkeypatch.setattr("spectune.sweep.run.BATCH_SIZE_INTERVAL_S", 0.02)
    plan = SweepPlan(steps=(0, 2), concurrency=(1, 3), dataset=prompts, num_prompts=6, max_tokens=41,
                     requests_per_point=9, warmup_requests=1)
    slow = "--tokens-per-second 400"
    async with FakeServers(k0=slow, k2=slow) as urls:
        out = tmp_path / "out"
        await execute(plan, "openai", BackendOptions(endpoints=urls), out)
    points = read_jsonl(out / "points.jsonl")
    assert {p["batch_size"]["source"] for p in points} == {"vllm:num_requests_running"}
    for p in points:
        assert 0 < p["batch_size"]["mean"] <= p["concurrency"]
        assert p["metrics"]["batch_size_mean"] == p["batch_size"]["mean"]
    assert max(p["batch_size"]["max"] for p in points if p["concurrency"] == 3) == 3
    with open(out / "summary.csv", newline="") as fh:
        assert {r["batch_size_source"] for r in csv.DictReader(fh)} == {"vllm:num_requests_running"}


async def test_vllm_per_request_metrics_end_to_end(tmp_path, prompts):
    """A running vLLM with --per-request-spec-decode-metrics: the window's acceptance comes from the responses'
    metrics.speculative_decoding, and the /metrics counter deltas agree (cross-check recorded, no warning)."""
    plan = SweepPlan(steps=(3,), concurrency=(2,), dataset=prompts, num_prompts=6, max_tokens=41,
                     requests_per_point=8, warmup_requests=2)
    async with FakeServers(k3="--accept-prob 0.6 --per-request-metrics") as urls:
        out = tmp_path / "out"
        await execute(plan, "vllm", BackendOptions(endpoints=urls), out)
    [point] = read_jsonl(out / "points.jsonl")
    requests = read_jsonl(out / "requests.jsonl")
    assert point["metrics"]["acceptance_length_source"] == "vllm:per-request"
    assert point["metrics"]["acceptance_length"] == pytest.approx(chunk_acceptance(requests), abs=1e-9)
    cross_check = point["acceptance"]["cross_check"]["acceptance_length"]
    assert cross_check == pytest.approx(point["metrics"]["acceptance_length"])
    assert point["acceptance"]["warning"] is None


async def test_an_engine_warning_said_during_a_window_is_kept_with_its_point(tmp_path, prompts, monkeypatch):
    """A warning the engine lists (the bundled engine's step-model guard: ``raw["engine_warnings"]`` in its
    snapshot) that appears during a point's window is written with that point, and only that point."""
    from spectune.backends.openai import OpenAIBackend

    real = OpenAIBackend.snapshot
    said: list[str] = []

    async def snapshot(self):
        snap = await real(self)
        if snap is not None:
            snap.raw["engine_warnings"] = list(said)
        return snap

    monkeypatch.setattr(OpenAIBackend, "snapshot", snapshot)

    class Listener(SweepListener):
        def point_started(self, key, planned):  # the engine flags a shape while K=2 is measured
            if key[0] == 2 and not said:  # (the drift check measures a point again)
                said.append("decode rounds at batch 1 x num_steps 2: 60.8 ms ...")

    plan = SweepPlan(steps=(0, 2), concurrency=(1,), dataset=prompts, num_prompts=6, max_tokens=9,
                     requests_per_point=2, warmup_requests=0)
    async with FakeServers(k0="", k2="--accept-prob 0.6") as urls:
        await execute(plan, "openai", BackendOptions(endpoints=urls), tmp_path / "out", listener=Listener())
    points = {p["steps"]: p for p in read_jsonl(tmp_path / "out" / "points.jsonl")}
    assert (points[2].get("engine_warnings"), "engine_warnings" in points[0]) == (said, False)
