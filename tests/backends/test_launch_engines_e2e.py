"""The ``vllm`` and ``sglang`` backends' launch modes end to end, as users run them: ``spectune sweep --backend vllm
--model M --draft D`` (and ``sglang``) in a subprocess, with tests/helpers/fake_engines.py standing in for the engine
programs (the ``vllm.entrypoints.openai.api_server`` and ``sglang.launch_server`` modules on PYTHONPATH). Checked: the argv each engine
receives, the acceptance length over each measurement window against the streamed chunks (each verify step
streams accepted + 1 tokens as one chunk) and against the acceptance probability, and that every launched server
is stopped when the sweep ends."""

from __future__ import annotations

import csv
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import fake_engines
from spectune.backends.sglang import SGLANG_SPEC_MAX_RUNNING

ROOT = Path(__file__).resolve().parents[2]
MODEL = "fake-org/Fake-8B-Instruct"
ACCEPT = 0.7  # FAKE_ENGINE_ACCEPT: each of the K drafts is accepted in turn with this probability
K = 2


@pytest.fixture
def engines(tmp_path: Path) -> dict:
    paths = fake_engines.install(tmp_path / "engines")
    draft = tmp_path / "fake-eagle3-head"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}", "category": "chat"}) + "\n" for i in range(8)))
    env = dict(os.environ, PATH=f"{paths['bin']}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join([str(paths["py"]), os.environ.get("PYTHONPATH", "")]),
               FAKE_ENGINE_ACCEPT=str(ACCEPT), FAKE_ENGINE_TPS="3000", SPECTUNE_VLLM_PYTHON=sys.executable)
    return {**paths, "draft": str(draft), "prompts": f"jsonl:{prompts}", "env": env, "tmp": tmp_path}


def sweep(engines: dict, backend: str, schedule_server: str = "off") -> Path:
    out = engines["tmp"] / f"sweep-{backend}-{schedule_server}"
    cmd = [sys.executable, "-m", "spectune.cli", "sweep", "--backend", backend, "--model", MODEL,
           "--draft", engines["draft"], "--steps", f"0,{K}", "--concurrency", "1,2", "--dataset", engines["prompts"],
           "--num-prompts", "8", "--max-tokens", "40", "--warmup", "1", "--startup-timeout", "30",
           "--schedule-server", schedule_server, "--output-dir", str(out)]
    run = subprocess.run(cmd, cwd=ROOT, env=engines["env"], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def launches(engines: dict) -> list[dict]:
    return [json.loads(line) for line in engines["log"].read_text().splitlines()]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def without_port(argv: list[str]) -> list[str]:
    i = argv.index("--port")
    return argv[:i] + argv[i + 2:]


def chunk_acceptance(out: Path, steps: int, concurrency: int) -> tuple[float, int, int]:
    """(tokens per verify chunk, verify chunks, requests) over the point's recorded requests: the first chunk of
    each is the prefill's token, every later one a verify step's accepted drafts + 1."""
    tokens = chunks = n = 0
    for line in (out / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["steps"] == steps and r["concurrency"] == concurrency:
            tokens += sum(r["chunk_tokens"][1:])
            chunks += len(r["chunk_tokens"]) - 1
            n += 1
    return tokens / chunks, chunks, n


def check_window_acceptance(out: Path, source_prefix: str) -> None:
    rows = {(int(r["steps"]), int(r["concurrency"])): r for r in csv.DictReader((out / "summary.csv").open())}
    assert set(rows) == {(0, 1), (0, 2), (K, 1), (K, 2)}
    for key, r in rows.items():
        assert r["status"] == "ok", (key, r["error"])
    for c in (1, 2):
        assert float(rows[(0, c)]["acceptance_length"]) == 1.0
        spec = rows[(K, c)]
        assert spec["acceptance_length_source"].startswith(source_prefix), spec["acceptance_length_source"]
        measured = float(spec["acceptance_length"])
        truth, verifies, requests = chunk_acceptance(out, K, c)
        assert measured == pytest.approx(truth, rel=1e-9)  # the engine's report covers exactly the window's verifies
        # and it agrees with the acceptance probability: E[accepted + 1] = 1 + p + p^2 (chain model); a verify's
        # accepted count has variance E[x^2] - E[x]^2 with P(1) = p(1-p), P(2) = p^2; 4 standard errors, plus at most
        # K drafts per request cut by max_tokens at the end of each request
        mean = ACCEPT + ACCEPT ** 2
        var = ACCEPT * (1 - ACCEPT) + 4 * ACCEPT ** 2 - mean ** 2
        slack = 4 * math.sqrt(var / verifies) + K * requests / verifies
        assert abs(measured - (1 + mean)) <= slack, (measured, 1 + mean, slack)


def check_stopped(engines: dict) -> None:
    for launch in launches(engines):
        with pytest.raises(ProcessLookupError):
            os.kill(launch["pid"], 0)
        port = int(flag(launch["argv"], "--port"))
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))  # nothing listens there any more


def test_vllm_launch_sweep_end_to_end(engines: dict) -> None:
    out = sweep(engines, "vllm")
    seen = launches(engines)
    # one server per num_steps, reused across concurrencies, then the drift check relaunches its reference cell's
    assert [x["engine"] for x in seen] == ["vllm", "vllm", "vllm"]
    plain, spec = seen[0]["argv"], seen[1]["argv"]
    assert without_port(seen[2]["argv"]) in (without_port(plain), without_port(spec))
    assert plain == ["--model", MODEL, "--host", "127.0.0.1", "--port", flag(plain, "--port")]
    assert spec[:6] == ["--model", MODEL, "--host", "127.0.0.1", "--port", flag(spec, "--port")]
    assert json.loads(flag(spec, "--speculative-config")) == {"method": "eagle3", "model": engines["draft"],
                                                             "num_speculative_tokens": K}
    assert flag(spec, "--per-request-spec-decode-metrics") == "summary"  # vLLM 0.29 "installed"
    check_window_acceptance(out, "vllm:")
    points = [json.loads(line) for line in (out / "points.jsonl").read_text().splitlines()]
    for p in (p for p in points if p["steps"] == K):
        # the /metrics counter deltas over the window agree with the per-request sums
        cross = p["metrics"].get("acceptance_cross_check") or p.get("acceptance", {}).get("cross_check")
        assert cross is not None, sorted(p)
        assert cross["acceptance_length"] == pytest.approx(p["metrics"]["acceptance_length"], rel=1e-9)
    check_stopped(engines)


def test_sglang_launch_sweep_end_to_end(engines: dict) -> None:
    out = sweep(engines, "sglang")
    seen = launches(engines)
    assert [x["engine"] for x in seen] == ["sglang", "sglang", "sglang"]  # K=0, K, the drift check's reference
    plain, spec = seen[0]["argv"], seen[1]["argv"]
    assert without_port(seen[2]["argv"]) in (without_port(plain), without_port(spec))
    common = ["--model-path", MODEL, "--host", "127.0.0.1", "--port", flag(plain, "--port"), "--max-running-requests",
              str(SGLANG_SPEC_MAX_RUNNING), "--enable-metrics"]  # concurrency 2 < SGLang's 48 for speculation
    assert plain == common
    assert spec[:6] == common[:4] + ["--port", flag(spec, "--port")]
    assert spec[6:] == ["--max-running-requests", str(SGLANG_SPEC_MAX_RUNNING), "--enable-metrics",
                        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", engines["draft"],
                        "--speculative-num-steps", str(K), "--speculative-eagle-topk", "1",
                        "--speculative-num-draft-tokens", str(K + 1)]
    check_window_acceptance(out, "sglang")
    check_stopped(engines)


def sweep_run(engines: dict, draft: str, steps: str, env: dict | None = None, *extra: str) -> tuple[Path, subprocess.CompletedProcess]:
    out = engines["tmp"] / f"sweep-{Path(draft).name}"
    cmd = [sys.executable, "-m", "spectune.cli", "sweep", "--backend", "vllm", "--model", MODEL, "--draft", draft,
           "--steps", steps, "--concurrency", "1", "--dataset", engines["prompts"], "--num-prompts", "8",
           "--max-tokens", "40", "--warmup", "1", "--startup-timeout", "30", "--no-drift-check",
           "--schedule-server", "off", "--output-dir", str(out), *extra]
    run = subprocess.run(cmd, cwd=ROOT, env={**engines["env"], **(env or {})}, capture_output=True, text=True,
                         timeout=240)
    return out, run


def summary_rows(out: Path) -> dict[int, dict]:
    return {int(r["steps"]): r for r in csv.DictReader((out / "summary.csv").open())}


def test_vllm_head_rejected_at_start_fails_its_points_and_keeps_the_rest(engines: dict) -> None:
    """vLLM exits during start-up for a head it cannot load: that K's points are failed with the log's last lines,
    the K=0 point before it is kept."""
    head = engines["tmp"] / "rejected-head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    out, run = sweep_run(engines, str(head), "0,2")
    rows = summary_rows(out)
    assert rows[0]["status"] == "ok"
    assert rows[2]["status"] == "failed"
    assert "unsupported draft head architecture" in rows[2]["error"] + run.stdout + run.stderr


def test_vllm_server_dying_mid_point_fails_that_point_only(engines: dict) -> None:
    out, run = sweep_run(engines, engines["draft"], "2", {"FAKE_ENGINE_EXIT_AFTER": "3"})
    rows = summary_rows(out)
    assert rows[2]["status"] == "failed"
    assert "died" in run.stdout + run.stderr


def test_vllm_start_past_the_startup_timeout_is_a_failed_point(engines: dict) -> None:
    out, run = sweep_run(engines, engines["draft"], "2", {"FAKE_ENGINE_STARTUP_DELAY": "30"}, "--startup-timeout",
                         "2")
    rows = summary_rows(out)
    assert rows[2]["status"] == "failed"
    assert "not healthy within 2 s" in rows[2]["error"]


def test_a_gguf_head_is_refused_before_anything_runs(engines: dict) -> None:
    head = engines["tmp"] / "head.gguf"
    head.write_bytes(b"GGUF")
    out, run = sweep_run(engines, str(head), "0,2")
    assert run.returncode == 2
    assert "vLLM loads EAGLE heads as HF folders" in run.stderr + run.stdout
    assert not (out / "summary.csv").exists()


def spec_config(argv: list[str]) -> dict | None:
    return json.loads(flag(argv, "--speculative-config")) if "--speculative-config" in argv else None


def test_vllm_launch_sweep_measures_its_schedule_server_by_default(engines: dict) -> None:
    """``--schedule-server auto`` on launched vLLM: after each static num_steps block, the schedule server pinned to
    that num_steps (``num_speculative_tokens`` = the largest K, one range ``[1, max_num_seqs, K]``; at K=0 too, where
    vLLM keeps its drafter), into ``schedule-server/``."""
    out = sweep(engines, "vllm", "auto")
    first = [spec_config(x["argv"]) for x in launches(engines)[:4]]
    pinned = lambda k: {"method": "eagle3", "model": engines["draft"], "num_speculative_tokens": K,  # noqa: E731
                        "num_speculative_tokens_per_batch_size": [[1, 2, k]]}
    assert first == [None, pinned(0), {"method": "eagle3", "model": engines["draft"], "num_speculative_tokens": K},
                     pinned(K)]
    rows = list(csv.DictReader((out / "schedule-server" / "summary.csv").open()))
    assert sorted((int(r["steps"]), int(r["concurrency"]), r["server"]) for r in rows) == \
        [(0, 1, f"schedule:{K}"), (0, 2, f"schedule:{K}"), (K, 1, f"schedule:{K}"), (K, 2, f"schedule:{K}")]
    assert {r["server"] for r in csv.DictReader((out / "summary.csv").open())} == {"static"}
