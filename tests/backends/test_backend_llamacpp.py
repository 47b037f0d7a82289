"""The ``llamacpp`` backend: argv, acceptance sources, finding the program, bad input; and, with a real
``llama-server`` (built by ``spectune llamacpp install``; .ci/run builds it), a sweep of the default pair end to
end, a server that crashes mid-point, and a running server without ``--metrics``."""

from __future__ import annotations

import csv
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from spectune.backends import make_backend
from spectune.backends.options import BackendOptions, LlamaCppOptions
from spectune.backends.snapshots import SpecSnapshot
from spectune.backends.llamacpp.backend import LlamaCppBackend, cpu_workarounds, llamacpp_argv, timings_totals
from spectune.backends.llamacpp.install import find_llama_server, server_features
from spectune.backends.prometheus import snapshot_from_text
from spectune.core.errors import UserError
from spectune.loadgen.record import RequestRecord
from helpers.llamacpp import SERVER, needs_server




def fake_program(tmp_path: Path, help_text: str) -> Path:
    """An executable that prints ``help_text`` for --help and a version line for --version."""
    path = tmp_path / "llama-server"
    path.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'version: 1 (x)'; exit 0; fi\n"
                    f"cat <<'EOF'\n{help_text}\nEOF\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def record(timings: dict | None, ok: bool = True) -> RequestRecord:
    rec = RequestRecord(request_id="r", prompt_id="p", category=None, send_time=0.0, chunk_times=[1.0],
                        chunk_tokens=[1], end_time=1.0, completion_tokens=1)
    if not ok:
        rec.error = "boom"
    rec.server_stats = {"timings": timings} if timings is not None else None
    return rec


def backend(tmp_path: Path, **kw) -> LlamaCppBackend:
    gguf = tmp_path / "target.gguf"
    gguf.write_bytes(b"GGUF")
    opts = BackendOptions(model=str(gguf), max_concurrency=4, max_tokens=128, **kw)
    return make_backend("llamacpp", opts)  # type: ignore[return-value]


# -- argv ----------------------------------------------------------------------------------------------------
def test_argv_without_speculation_has_no_draft_model():
    argv = llamacpp_argv("llama-server", "t.gguf", 0, "127.0.0.1", 8000, 4, 2176, "h.gguf")
    assert "-md" not in argv


def test_argv_with_speculation_sets_the_draft_length():
    argv = llamacpp_argv("llama-server", "t.gguf", 3, "127.0.0.1", 8000, 4, 2176, "h.gguf")
    assert argv[argv.index("--spec-draft-n-max") + 1] == "3"


def test_argv_uses_the_eagle3_spec_type():
    argv = llamacpp_argv("llama-server", "t.gguf", 3, "127.0.0.1", 8000, 4, 2176, "h.gguf")
    assert argv[argv.index("--spec-type") + 1] == "draft-eagle3"


def test_argv_sizes_total_context_for_every_slot():
    argv = llamacpp_argv("llama-server", "t.gguf", 0, "127.0.0.1", 8000, 4, 2176)
    assert (argv[argv.index("-np") + 1], argv[argv.index("-c") + 1]) == ("4", str(4 * 2176))


def test_threads_leave_a_cpu_to_the_load_generator(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    argv = llamacpp_argv("llama-server", "t.gguf", 0, "127.0.0.1", 8000, 1, 100)
    assert argv[argv.index("-t") + 1] == "1"


def test_an_amx_cpu_gets_no_repack(tmp_path, monkeypatch):
    """ggml's AMX buffer segfaults on some AMX CPUs (llama.cpp #20824): such a CPU's servers run --no-repack."""
    monkeypatch.delenv("SPECTUNE_LLAMACPP_REPACK", raising=False)
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: Xeon\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n")
    assert cpu_workarounds(str(info)) == ["--no-repack"]


def test_a_cpu_without_amx_keeps_repacking(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECTUNE_LLAMACPP_REPACK", raising=False)
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: EPYC\nflags\t\t: fpu avx2 fma f16c\n")
    assert cpu_workarounds(str(info)) == []


def test_repack_can_be_forced_on_an_amx_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTUNE_LLAMACPP_REPACK", "1")
    info = tmp_path / "cpuinfo"
    info.write_text("flags\t\t: avx512f amx_int8\n")
    assert cpu_workarounds(str(info)) == []


def test_server_args_come_last_so_they_win():
    argv = llamacpp_argv("llama-server", "t.gguf", 0, "127.0.0.1", 8000, 1, 100, extra=["-c", "999"])
    assert argv[-2:] == ["-c", "999"]


def test_speculation_without_a_head_is_a_user_error():
    with pytest.raises(UserError, match="needs a draft head"):
        llamacpp_argv("llama-server", "t.gguf", 2, "127.0.0.1", 8000, 1, 100, None)


# -- acceptance ----------------------------------------------------------------------------------------------
METRICS_BEFORE = """# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 10
llamacpp:spec_decode_num_draft_tokens_total 30
llamacpp:spec_decode_num_accepted_tokens_total 12
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 7
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 4
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 1
"""
# +100 verify steps, +300 draft tokens, +90 accepted (50 + 30 + 10 per position)
METRICS_AFTER = METRICS_BEFORE.replace(" 10\n", " 110\n").replace(" 30\n", " 330\n").replace(" 12\n", " 102\n") \
    .replace("} 7", "} 57").replace("} 4", "} 34").replace("} 1", "} 11")


def windows() -> tuple[SpecSnapshot, SpecSnapshot]:
    return snapshot_from_text(METRICS_BEFORE, "llamacpp:"), snapshot_from_text(METRICS_AFTER, "llamacpp:")


def test_counter_acceptance_length_is_one_plus_accepted_per_verify_step(tmp_path):
    b = backend(tmp_path)
    b.steps = 3
    assert b.acceptance(*windows(), []).acceptance_length == pytest.approx(1.9)


def test_counter_acceptance_per_position(tmp_path):
    b = backend(tmp_path)
    b.steps = 3
    assert b.acceptance(*windows(), []).per_position == pytest.approx([0.5, 0.3, 0.1])


def test_counter_acceptance_names_its_source(tmp_path):
    b = backend(tmp_path)
    b.steps = 3
    assert b.acceptance(*windows(), []).source == "llamacpp:/metrics counters"


def test_counters_without_total_suffix_are_read():
    snap = snapshot_from_text(METRICS_BEFORE.replace("_total", ""), "llamacpp:")
    assert (snap.num_drafts, snap.num_accepted_tokens) == (10.0, 12.0)


def test_timings_that_agree_with_the_counters_leave_no_warning(tmp_path):
    b = backend(tmp_path)
    b.steps = 3
    records = [record({"draft_n": 150, "draft_n_accepted": 45}), record({"draft_n": 150, "draft_n_accepted": 45})]
    assert b.acceptance(*windows(), records).warning is None


def test_timings_that_disagree_with_the_counters_are_warned_about(tmp_path):
    b = backend(tmp_path)
    b.steps = 3
    records = [record({"draft_n": 300, "draft_n_accepted": 150})]
    assert "differs from the responses' timings" in (b.acceptance(*windows(), records).warning or "")


def test_without_counters_acceptance_comes_from_timings(tmp_path):
    b = backend(tmp_path)
    b.steps = 3
    # 300 drafted at K=3 -> 100 verify steps; 90 accepted -> 1 + 90/100
    acc = b.acceptance(None, None, [record({"draft_n": 200, "draft_n_accepted": 60}),
                                    record({"draft_n": 100, "draft_n_accepted": 30})])
    assert (acc.acceptance_length, acc.source.startswith("llamacpp:timings")) == (pytest.approx(1.9), True)


def test_timings_of_failed_requests_are_not_counted():
    assert timings_totals([record({"draft_n": 10, "draft_n_accepted": 5}),
                           record({"draft_n": 10, "draft_n_accepted": 5}, ok=False)]) == (10.0, 5.0, 1)


def test_num_steps_zero_without_counters_is_one(tmp_path):
    b = backend(tmp_path)
    b.steps = 0
    assert b.acceptance(None, None, [record(None)]).acceptance_length == 1.0


# -- finding the program and bad input -------------------------------------------------------------------------
def test_explicit_program_that_is_not_executable_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not an executable"):
        find_llama_server(tmp_path / "nope")


def test_no_program_anywhere_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("SPECTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("spectune.backends.llamacpp.install._package_binary", lambda: None)
    with pytest.raises(UserError, match="spectune llamacpp install"):
        find_llama_server()


def test_a_build_without_eagle3_is_a_user_error(tmp_path):
    prog = fake_program(tmp_path, "--port N\n--spec-type {none,draft-simple,ngram-simple}\n--metrics")
    b = backend(tmp_path, llamacpp=LlamaCppOptions(server_bin=str(prog)))
    with pytest.raises(UserError, match="no --spec-type draft-eagle3"):
        b.check_executable()


def test_features_are_read_from_help(tmp_path):
    prog = fake_program(tmp_path, "--port N\n--spec-type {none,draft-eagle3}   types\n")
    feats = server_features(str(prog))
    assert (feats.eagle3, feats.metrics, feats.spec_types) == (True, False, ("none", "draft-eagle3"))


def test_a_program_that_is_not_llama_server_is_a_user_error(tmp_path):
    prog = fake_program(tmp_path, "usage: something else")
    with pytest.raises(UserError, match="is it llama.cpp's llama-server"):
        server_features(str(prog))


def test_model_that_is_not_gguf_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not a .gguf file"):
        make_backend("llamacpp", BackendOptions(model=str(tmp_path)))


def test_missing_draft_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="neither a .gguf file nor"):
        backend(tmp_path, draft=str(tmp_path / "missing"))


def test_unknown_algorithm_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="unknown --algorithm"):
        backend(tmp_path, algorithm="medusa")


def test_a_per_batch_size_schedule_is_refused(tmp_path):
    with pytest.raises(UserError, match="no per-batch-size num_steps"):
        backend(tmp_path, adaptive_config=str(tmp_path / "sglang.json"))


def test_cli_missing_program_is_one_line(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}", "SPECTUNE_CACHE_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "spectune.cli", "sweep", "--backend", "llamacpp",
                          "--server-bin", str(tmp_path / "nope"), "--steps", "0", "--concurrency", "1",
                          "--output-dir", str(tmp_path / "out")], capture_output=True, text=True, env=env,
                         timeout=120)
    assert (run.returncode, run.stderr.count("\n"), "Traceback" in run.stderr) == (2, 1, False)


# -- a real llama-server ---------------------------------------------------------------------------------------
@needs_server
def test_default_pair_sweep_on_llama_server(tmp_path):
    """``spectune sweep --backend llamacpp`` with no model arguments: two num_steps, one concurrency."""
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "spectune.cli", "sweep", "--backend", "llamacpp", "--steps", "0,2",
           "--concurrency", "1", "--num-prompts", "4", "--max-tokens", "32", "--output-dir", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {int(r["steps"]): r for r in csv.DictReader((out / "summary.csv").open())}
    assert [rows[k]["status"] for k in (0, 2)] == ["ok", "ok"]
    assert rows[2]["acceptance_length_source"] == "llamacpp:/metrics counters"
    assert 1.2 < float(rows[2]["acceptance_length"]) <= 3.0  # the bundled head's drafts are accepted
    assert float(rows[0]["acceptance_length"]) == 1.0
    points = [json.loads(line) for line in (out / "points.jsonl").open()]
    assert [p["acceptance"]["warning"] for p in points] == [None, None]  # counters agree with the timings
    launches = json.loads((out / "sweep.json").read_text())["backend"]["launches"]
    # K=2's server (a drift check may relaunch the reference cell's num_steps after it)
    assert "--spec-draft-n-max 2" in next(x for x in launches if x["steps"] == 2)["command"]


@needs_server
async def test_server_that_crashes_mid_point_fails_the_point_with_its_log(tmp_path):
    from spectune.loadgen.datasets import load_dataset
    from spectune.results.folder import SweepFolder
    from spectune.results.sweep_meta import SweepMeta
    from spectune.sweep.run import Sweep
    from spectune.sweep.plan import SweepListener, SweepPlan

    plan = SweepPlan(steps=(0,), concurrency=(1,), num_prompts=6, max_tokens=48, warmup_requests=0)
    opts = BackendOptions(max_concurrency=1, max_tokens=48, log_dir=tmp_path / "logs")
    b = make_backend("llamacpp", opts)
    await b.preflight([0])

    class Killer(SweepListener):
        def request_finished(self, key, rec, done, planned):  # noqa: ANN001
            if done == 2:
                os.kill(b.server.pid, signal.SIGKILL)  # type: ignore[attr-defined]

    folder = SweepFolder(tmp_path / "out")
    folder.check(plan.to_json(), False)
    meta = SweepMeta(plan=plan.to_json())
    folder.open(meta, [])
    try:
        await Sweep(plan, b, folder, load_dataset("mt-bench", 6, 0), meta, Killer()).run(plan.points())
    finally:
        await b.close()
        folder.close()
    point = folder.read_points()[0]
    assert point.status == "failed"
    assert "llama-server" in point.log_tail or "main:" in point.log_tail


@needs_server
async def test_running_server_without_metrics_gets_acceptance_from_timings(tmp_path):
    from spectune.backends.llamacpp.head_gguf import cached_head_gguf
    from spectune.backends.local.options import DEFAULT_HEAD
    from spectune.backends.local.weights.loader import default_model_path
    from spectune.backends.process import ServerProcess, free_port
    from spectune.loadgen import ClientConfig, ClosedLoop, Constraints, StreamingClient, run_point
    from spectune.loadgen.datasets import load_dataset

    head = cached_head_gguf(DEFAULT_HEAD, default_model_path())
    port = free_port()
    argv = [SERVER, "-m", str(default_model_path()), "-md", str(head), "--spec-type", "draft-eagle3",
            "--spec-draft-n-max", "2", "--port", str(port), "-np", "1", "-c", "2048", "-t", "1", *cpu_workarounds()]
    server = ServerProcess(argv, "127.0.0.1", port, tmp_path / "s.log", ("/health",))
    await server.start(120)
    try:
        b = make_backend("llamacpp", BackendOptions(endpoints={2: server.base_url}))
        await b.preflight([2])
        endpoint = await b.start(2)
        config = ClientConfig(endpoint.base_url, model="m", max_tokens=24, extra_body=b.request_extra(),
                              reuse_connections=b.reuse_connections)
        async with StreamingClient(config) as client:
            before = await b.snapshot()
            result = await run_point(client, load_dataset("mt-bench", 3, 0), ClosedLoop(1), Constraints(max_requests=3))
            after = await b.snapshot()
        acc = b.acceptance(before, after, result.records)
    finally:
        await server.stop()
    assert acc.source.startswith("llamacpp:timings")
    assert acc.acceptance_length > 1.0
