"""The emulated server (tests/helpers/emulated_server.py) running a vLLM per-batch-size schedule, the "schedule
server" that validate's config runs and soon sweep cells measure: the K of each step from the batch size, drafts
counted with that K, and the extra cost of a server whose drafter runs over the batch at K=0.

Claims: started through the launch backend with the schedule ``[[1, 1, 2], [2, 8, 0]]`` as its
``{adaptive_config}``, one request alone drafts 2 tokens a step and accepts some, and four requests together draft
none (acceptance length 1.0); K is looked up as vLLM does (gaps and sizes past the last range: the range below,
clamped to ``num_speculative_tokens``); an SGLang config or no config leaves the server at ``--steps``, draft floor
or not; with the draft floor a K=0 step at batch b costs one draft step more than the cost model's K=0 step, the
factor multiplies every step, and without either a schedule server's steps cost what the model says.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from helpers.cost_model import COMPUTE_BOUND, EmulatedEngine, ScheduleServer, load_vllm_schedule
from helpers.emulated_server import launch_template, schedule_server
from spectune.backends import make_backend
from spectune.backends.options import BackendOptions
from spectune.backends.snapshots import counter_acceptance
from spectune.backends.num_steps.vllm_schedule import parse_vllm_schedule

SCHEDULE = [[1, 1, 2], [2, 8, 0]]
"""K=2 for one sequence, no drafting from two to eight (and above, the last range's K)."""


async def complete(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int) -> None:
    """One streamed completion, read to its end."""
    body = {"model": "emulated-model", "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for _ in resp.content:
            pass


async def wait_running(backend, n: int, timeout_s: float = 10.0) -> None:
    """Until the server's running-requests gauge reads ``n``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while (await backend.running_requests() or (0.0, ""))[0] != n:
        assert loop.time() < deadline, f"the server never ran {n} requests at once"
        await asyncio.sleep(0.005)


async def measure(tmp: Path) -> dict:
    """Windows on one schedule server: ``"c1"``: one request alone, ``"c4"``: while four requests run together (it
    opens once all four run and closes before any ends); each ``(before, after, running at the end)``."""
    config = tmp / "schedule.json"
    config.write_text(json.dumps(SCHEDULE))
    backend = make_backend("launch", BackendOptions(launch=launch_template("--adaptive-config {adaptive_config}"),
                                                    adaptive_config=str(config), startup_timeout_s=30,
                                                    log_dir=tmp / "logs"))
    out = {}
    try:
        url = (await backend.start(2)).base_url
        async with aiohttp.ClientSession() as session:
            before = await backend.snapshot()
            await complete(session, url, "alone", 40)
            out["c1"] = (before, await backend.snapshot(), None)
            tasks = [asyncio.ensure_future(complete(session, url, f"together {i}", 300)) for i in range(4)]
            await wait_running(backend, 4)
            before = await backend.snapshot()
            await asyncio.sleep(0.3)
            after = await backend.snapshot()
            out["c4"] = (before, after, (await backend.running_requests())[0])
            await asyncio.gather(*tasks)
    finally:
        await backend.stop()
        await backend.close()
    return out


@pytest.fixture(scope="module")
def windows(tmp_path_factory) -> dict:
    return asyncio.run(measure(tmp_path_factory.mktemp("emulated-schedule")))


def test_alone_a_schedule_server_drafts_the_first_ranges_k(windows):
    before, after, _ = windows["c1"]
    assert (after.num_draft_tokens - before.num_draft_tokens) / (after.num_drafts - before.num_drafts) == 2


def test_alone_a_schedule_server_accepts_drafts(windows):
    before, after, _ = windows["c1"]
    assert counter_acceptance(before, after, "vllm").acceptance_length > 1.0


def test_the_four_request_window_ran_four_requests_throughout(windows):
    assert windows["c4"][2] == 4


def test_four_requests_together_count_no_drafts(windows):
    before, after, _ = windows["c4"]
    assert after.num_drafts - before.num_drafts == 0


def test_four_requests_together_read_acceptance_length_one(windows):
    before, after, _ = windows["c4"]
    assert counter_acceptance(before, after, "vllm").acceptance_length == 1.0


def test_k_is_looked_up_as_vllm_does_gaps_and_past_the_end_use_the_range_below():
    server = ScheduleServer(parse_vllm_schedule([[1, 2, 3], [5, 8, 1]]))
    assert [server.steps_for(b) for b in (1, 2, 3, 4, 5, 9, 64)] == [3, 3, 3, 3, 1, 1, 1]


def test_a_speculative_config_k_above_num_speculative_tokens_is_clamped(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"method": "eagle3", "num_speculative_tokens": 2,
                                "num_speculative_tokens_per_batch_size": [[3, 8, 1], [1, 2, 4]]}))
    server = ScheduleServer(load_vllm_schedule(str(path)))
    assert [server.steps_for(b) for b in (1, 2, 3, 20)] == [2, 2, 1, 1]


def test_a_bare_list_file_is_a_schedule(tmp_path):
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps(SCHEDULE))
    assert load_vllm_schedule(str(path)).to_json() == SCHEDULE


def test_an_invalid_schedule_is_refused(tmp_path):
    path = tmp_path / "overlap.json"
    path.write_text(json.dumps([[1, 4, 2], [3, 8, 0]]))
    with pytest.raises(ValueError, match="overlap"):
        load_vllm_schedule(str(path))


def args(config: str) -> object:
    from types import SimpleNamespace

    return SimpleNamespace(adaptive_config=config, schedule_draft_floor=True, schedule_factor=1.5)


def test_an_sglang_config_leaves_the_server_at_its_steps_with_no_extra_cost(tmp_path):
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps({"1": {"candidate_steps": [1]}, "4": {"candidate_steps": [0, 1]}}))
    assert schedule_server(args(str(path))) is None


def test_no_config_leaves_the_server_at_its_steps_with_no_extra_cost():
    assert schedule_server(args("")) is None


def test_a_schedule_file_gets_the_servers_extra_cost(tmp_path):
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps(SCHEDULE))
    server = schedule_server(args(str(path)))
    assert (server.schedule.to_json(), server.draft_floor, server.factor) == (SCHEDULE, True, 1.5)


def test_the_draft_floor_makes_a_k0_step_cost_one_draft_step_more():
    server = ScheduleServer(parse_vllm_schedule(SCHEDULE), draft_floor=True)
    model = COMPUTE_BOUND.scaled(2.0)
    assert server.step_s(model, 4, 0) == pytest.approx(model.step_s(4, 0) + (0.8 + 0.08 * 4) * 2.0 / 1000)


def test_with_the_draft_floor_a_k0_step_is_slower_than_the_model_without_a_schedule():
    server = ScheduleServer(parse_vllm_schedule(SCHEDULE), draft_floor=True)
    assert server.step_s(COMPUTE_BOUND, 4, 0) > COMPUTE_BOUND.step_s(4, 0)


def test_the_draft_floor_leaves_drafting_steps_alone():
    server = ScheduleServer(parse_vllm_schedule(SCHEDULE), draft_floor=True)
    assert server.step_s(COMPUTE_BOUND, 1, 2) == pytest.approx(COMPUTE_BOUND.step_s(1, 2))


def test_the_schedule_factor_multiplies_every_step():
    server = ScheduleServer(parse_vllm_schedule(SCHEDULE), factor=1.2)
    assert [server.step_s(COMPUTE_BOUND, b, k) for b, k in ((1, 2), (4, 0))] == pytest.approx(
        [1.2 * COMPUTE_BOUND.step_s(1, 2), 1.2 * COMPUTE_BOUND.step_s(4, 0)])


def test_an_engine_with_a_plain_schedule_steps_as_the_model_says():
    engine = EmulatedEngine(COMPUTE_BOUND, 2, 0.0, schedule=ScheduleServer(parse_vllm_schedule(SCHEDULE)))
    assert [engine.step_s(b, engine.steps_for(b)) for b in (1, 4)] == [COMPUTE_BOUND.step_s(1, 2),
                                                                        COMPUTE_BOUND.step_s(4, 0)]


def test_an_engine_without_a_schedule_drafts_its_steps_at_every_batch_size():
    engine = EmulatedEngine(COMPUTE_BOUND, 3, 0.0)
    assert [engine.steps_for(b) for b in (1, 4, 64)] == [3, 3, 3]
