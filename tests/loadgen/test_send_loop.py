"""The sending loop: closed-loop concurrency, open-loop arrivals, phases, warm-up, constraints, cancellation."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from spectune.loadgen.client import ClientConfig, StreamingClient
from spectune.loadgen.constraints import Constraints
from spectune.loadgen.datasets import user_prompt
from spectune.core.errors import UserError
from spectune.loadgen.send_loop import run_point, time_average
from spectune.loadgen.strategy import ClosedLoop, OpenLoop, Phase, Phased, TraceArrivals

PROMPTS = [user_prompt(str(i), "c%d" % (i % 2), f"prompt {i}") for i in range(5)]


class CountingServer:
    """Streams ``chunks`` one-token chunks ``gap_ms`` apart (extra body fields; ``chunks_for``: chunks by prompt
    content, for some prompts only); counts requests in flight."""

    def __init__(self) -> None:
        self.in_flight = self.max_in_flight = self.served = 0
        self.contents: list[str] = []
        self.peers: set = set()  # client (host, port) pairs: one per connection

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.served += 1
        self.peers.add(request.transport.get_extra_info("peername"))
        self.contents.append(body["messages"][-1]["content"])
        if body["model"] == "fail":
            return web.json_response({"error": {"message": "nope"}}, status=500)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            chunks = (body.get("chunks_for") or {}).get(body["messages"][-1]["content"], body.get("chunks", 3))
            for i in range(chunks):
                await asyncio.sleep(body.get("gap_ms", 20) / 1000)
                obj = {"choices": [{"delta": {"content": "t"}}], "usage": {"completion_tokens": i + 1}}
                await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            self.in_flight -= 1


@pytest.fixture
async def server():
    s = CountingServer()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", s.handle)
    ts = TestServer(app)
    await ts.start_server()
    s.url = str(ts.make_url("")).rstrip("/")
    yield s
    await ts.close()


def client(server: CountingServer, model: str = "m", **extra) -> StreamingClient:
    return StreamingClient(ClientConfig(server.url, model=model, extra_body=extra))


async def test_closed_loop_keeps_n_in_flight(server: CountingServer) -> None:
    seen = []
    async with client(server, chunks=4, gap_ms=15) as c:
        res = await run_point(c, PROMPTS, ClosedLoop(4), Constraints(max_requests=12), on_record=seen.append)
    assert server.max_in_flight == 4
    assert server.served == 12
    assert len(server.peers) == 4  # connections are reused after [DONE]
    assert res.stop_reason == "max_requests"
    assert len(res.records) == 12
    assert seen == res.records
    assert all(r.ok for r in res.records)
    assert sorted(r.request_id for r in res.records) == sorted(f"r{i}" for i in range(12))
    assert [r.prompt_id for r in sorted(res.records, key=lambda r: int(r.request_id[1:]))] == [
        str(i % 5) for i in range(12)]  # prompts used in order, cycling
    # 12 equal requests in 3 full waves of 4: about 4 in flight over the whole window
    assert 3.5 < res.achieved_concurrency <= 4.0
    assert res.window_start == min(r.send_time for r in res.records)
    assert res.duration_s == pytest.approx(max(r.end_time for r in res.records) - res.window_start)


async def test_warmup_runs_first_and_is_excluded(server: CountingServer) -> None:
    async with client(server) as c:
        res = await run_point(c, PROMPTS, ClosedLoop(2), Constraints(max_requests=5), warmup_requests=3)
    assert server.served == 8
    assert len(res.records) == 5
    assert len(res.warmup_records) == 3
    assert all(c.startswith("(warm-up ") for c in server.contents[:3])
    assert not any(c.startswith("(warm-up") for c in server.contents[3:])
    assert max(r.end_time for r in res.warmup_records) <= res.start_time <= res.window_start


async def test_after_warmup_runs_between_warmup_and_the_run(server: CountingServer) -> None:
    seen = []

    async def after_warmup() -> None:
        seen.append(server.served)

    async with client(server) as c:
        await run_point(c, PROMPTS, ClosedLoop(2), Constraints(max_requests=4), warmup_requests=3,
                        after_warmup=after_warmup)
    assert seen == [3]  # every warm-up request answered, no measured request sent yet


async def test_on_start_gets_the_runs_t0_before_the_first_send(server: CountingServer) -> None:
    starts = []
    async with client(server) as c:
        res = await run_point(c, PROMPTS, ClosedLoop(2), Constraints(max_requests=4), on_start=starts.append)
    assert starts == [res.start_time]
    assert starts[0] <= res.window_start


async def test_a_warmup_past_its_timeout_measures_nothing(server: CountingServer) -> None:
    async with client(server, chunks=100, gap_ms=20) as c:  # 2 s per request
        res = await run_point(c, PROMPTS, ClosedLoop(2), Constraints(max_requests=4), warmup_requests=2,
                              warmup_timeout_s=0.2)
    assert res.stop_reason == "warmup_timeout"
    assert res.records == []


async def test_warmup_concurrency_overrides_the_strategys(server: CountingServer) -> None:
    async with client(server, chunks=3, gap_ms=20) as c:
        await run_point(c, PROMPTS, ClosedLoop(4), Constraints(max_requests=1), warmup_requests=4,
                        warmup_concurrency=1)
    assert server.max_in_flight == 1


async def test_duration_constraint_stops_sending_and_drains(server: CountingServer) -> None:
    async with client(server, chunks=5, gap_ms=20) as c:  # ~100 ms per request
        res = await run_point(c, PROMPTS, ClosedLoop(2), Constraints(max_duration_s=0.35))
    assert res.stop_reason == "max_duration"
    assert all(r.send_time - res.start_time < 0.35 for r in res.records)
    assert all(r.ok for r in res.records)  # requests in flight at the deadline finished (drain)
    assert 4 <= len(res.records) <= 10  # 2 streams x ~4 rounds of 100 ms


async def test_drain_timeout_cancels_and_records_failures(server: CountingServer) -> None:
    async with client(server, chunks=100, gap_ms=20) as c:  # 2 s per request
        res = await run_point(c, PROMPTS, ClosedLoop(2), Constraints(max_duration_s=0.1, drain_timeout_s=0.2))
    assert len(res.records) == 2
    assert all(r.error == "unfinished 0.2 s after the point stopped sending" for r in res.records)
    assert all(5 <= len(r.chunk_times) <= 20 for r in res.records)  # partial data kept
    await asyncio.sleep(0.1)
    assert server.in_flight == 0  # connections closed


async def test_an_early_stop_that_cancels_drops_the_requests_in_flight(server: CountingServer) -> None:
    """``cancel_on_early_stop``: once ``stop_when`` says stop, the requests in flight (2 s each here) are cancelled
    at once, not waited for, and left out of the point (not recorded as failures); their connections close."""
    settled = lambda recs, elapsed: "settled" if recs else None  # noqa: E731 - stop at the first finished request
    async with client(server, chunks=100, gap_ms=20, chunks_for={"prompt 0": 1}) as c:
        t = time.perf_counter()
        res = await run_point(c, PROMPTS, ClosedLoop(3), Constraints(max_requests=10, stop_when=settled,
                                                                     cancel_on_early_stop=True))
        took = time.perf_counter() - t
    assert res.stop_reason == "early_stop"
    assert [r.prompt_id for r in res.records] == ["0"]
    assert took < 1.0
    for _ in range(50):
        if server.in_flight == 0:
            break
        await asyncio.sleep(0.02)
    assert server.in_flight == 0


async def test_an_early_stop_rule_still_watches_the_drain_after_the_duration_cap(server: CountingServer) -> None:
    """With ``cancel_on_early_stop``, sending stopped at the cap (5 ms: the first 3 sent, prompt 0 fast, the other two
    2 s each): the rule is asked again as each request in flight finishes, and its stop after prompt 0 cancels the
    other two instead of waiting for them."""
    settled = lambda recs, elapsed: "settled" if recs else None  # noqa: E731 - stop at the first finished request
    async with client(server, chunks=100, gap_ms=20, chunks_for={"prompt 0": 1}) as c:
        res = await run_point(c, PROMPTS, ClosedLoop(3), Constraints(max_duration_s=0.005, stop_when=settled,
                                                                     cancel_on_early_stop=True))
    assert res.stop_reason == "early_stop"
    assert [r.prompt_id for r in res.records] == ["0"]


async def test_the_requests_sent_up_to_the_request_count_all_finish(server: CountingServer) -> None:
    """A window that sent its ``max_requests`` runs them to the end: the rule is not asked in that drain."""
    settled = lambda recs, elapsed: "settled" if recs else None  # noqa: E731
    async with client(server, chunks=10, gap_ms=20, chunks_for={"prompt 0": 1}) as c:  # 0.2 s each but prompt 0
        res = await run_point(c, PROMPTS, ClosedLoop(3), Constraints(max_requests=3, stop_when=settled,
                                                                     cancel_on_early_stop=True))
    assert res.stop_reason == "max_requests"
    assert sorted(r.prompt_id for r in res.records if r.ok) == ["0", "1", "2"]


async def test_an_early_stop_waits_for_the_requests_in_flight_by_default(server: CountingServer) -> None:
    settled = lambda recs, elapsed: "settled" if recs else None  # noqa: E731
    async with client(server, chunks=10, gap_ms=20, chunks_for={"prompt 0": 1}) as c:  # 0.2 s each but prompt 0
        res = await run_point(c, PROMPTS, ClosedLoop(3), Constraints(max_requests=10, stop_when=settled))
    assert sorted(r.prompt_id for r in res.records if r.ok) == ["0", "1", "2"]


async def test_max_failures_stops_early(server: CountingServer) -> None:
    async with client(server, model="fail") as c:
        res = await run_point(c, PROMPTS, ClosedLoop(1), Constraints(max_requests=100, max_failures=3))
    assert res.stop_reason == "max_failures"
    assert len(res.records) == 3
    assert all(r.status == 500 and r.error == "HTTP 500: nope" for r in res.records)


async def test_open_loop_sends_on_the_seeded_schedule(server: CountingServer) -> None:
    strategy = OpenLoop(rate=40.0, burstiness=1.0, seed=3)
    async with client(server, chunks=2, gap_ms=5) as c:
        res = await run_point(c, PROMPTS, strategy, Constraints(max_requests=15))
    # send_time is the scheduled arrival: the start plus the same seeded gamma gaps
    ref = OpenLoop(rate=40.0, burstiness=1.0, seed=3)
    ref.start(res.start_time)
    expected = []
    for _ in range(15):
        expected.append(ref.next_arrival(0.0))
        ref.consume()
    assert sorted(r.send_time for r in res.records) == pytest.approx(expected, abs=1e-9)


async def test_open_loop_cap_queues_and_counts_waiting_in_ttft(server: CountingServer) -> None:
    async with client(server, chunks=2, gap_ms=25) as c:  # ~50 ms service time; arrivals every ~5 ms
        res = await run_point(c, PROMPTS, OpenLoop(rate=200.0, seed=1, max_concurrency=1), Constraints(max_requests=4))
    assert server.max_in_flight == 1
    last = max(res.records, key=lambda r: r.send_time)
    assert last.ttft_s > 0.1  # queued behind ~3 requests of 50 ms: waiting counts in TTFT


async def test_phases_change_concurrency(server: CountingServer) -> None:
    phases = Phased([Phase(0.2, concurrency=1), Phase(0.3, concurrency=3)])
    async with client(server, chunks=2, gap_ms=20) as c:
        res = await run_point(c, PROMPTS, phases, Constraints(max_duration_s=0.5))
    early = [r for r in res.records if r.end_time - res.start_time < 0.19]
    assert early
    assert all(a.end_time <= b.send_time for a, b in zip(early, early[1:]))  # one at a time
    assert server.max_in_flight == 3


async def test_every_phase_sends_the_prompts_from_the_first(server: CountingServer) -> None:
    phases = Phased([Phase(0.2, concurrency=1), Phase(0.4, concurrency=3)])
    async with client(server, chunks=4, gap_ms=20) as c:  # about 85 ms a request: 2-3 in the first phase
        res = await run_point(c, PROMPTS, phases, Constraints(max_duration_s=0.6))
    sent = sorted(res.records, key=lambda r: r.send_time)
    first = [r.prompt_id for r in sent if r.send_time - res.start_time < 0.2]
    second = [r.prompt_id for r in sent if r.send_time - res.start_time >= 0.2]
    assert 0 < len(first) < len(PROMPTS)  # the first phase ended inside the list
    assert second[:len(PROMPTS)] == [p.id for p in PROMPTS]


async def test_callback_error_propagates(server: CountingServer) -> None:
    def boom(rec):
        raise OSError("disk full")

    async with client(server) as c:
        with pytest.raises(OSError, match="disk full"):
            await run_point(c, PROMPTS, ClosedLoop(2), Constraints(max_requests=10), on_record=boom)
    await asyncio.sleep(0.1)
    assert server.in_flight == 0


async def test_cancellation_closes_connections_quickly(server: CountingServer) -> None:
    async with client(server, chunks=200, gap_ms=10) as c:  # 2 s per request
        task = asyncio.create_task(run_point(c, PROMPTS, ClosedLoop(4), Constraints(max_requests=10)))
        await asyncio.sleep(0.2)
        assert server.in_flight == 4
        t = time.perf_counter()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.perf_counter() - t < 1.0  # not waiting for the 2 s requests
    for _ in range(50):
        if server.in_flight == 0:
            break
        await asyncio.sleep(0.02)
    assert server.in_flight == 0


def test_constraints_need_a_limit() -> None:
    with pytest.raises(UserError):
        Constraints()


def test_open_loop_gamma_arrivals() -> None:
    # mean gap 1/rate; coefficient of variation 1/sqrt(burstiness) (gamma with shape = burstiness)
    for burstiness, cv in ((1.0, 1.0), (4.0, 0.5), (0.25, 2.0)):
        s = OpenLoop(rate=10.0, burstiness=burstiness, seed=7)
        s.start(0.0)
        times = []
        for _ in range(4001):
            times.append(s.next_arrival(0.0))
            s.consume()
        gaps = np.diff(times)
        assert times[0] == 0.0
        assert gaps.mean() == pytest.approx(0.1, rel=0.1)  # 4000 samples: std error of the mean <= 3.2 %
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.15)
    a, b = OpenLoop(rate=5, seed=1), OpenLoop(rate=5, seed=1)
    for s in (a, b):
        s.start(0.0)
        s.consume()
    assert a.next_arrival(0) == b.next_arrival(0)  # seeded


def test_phased_schedule() -> None:
    s = Phased([Phase(1.0, concurrency=2), Phase(1.0, rate=10.0, max_concurrency=5), Phase(1.0, concurrency=1)])
    s.start(100.0)
    assert (s.next_arrival(100.5), s.limit(100.5), s.next_change(100.5)) == (None, 2, 101.0)
    assert s.next_arrival(101.2) == 101.0
    assert s.limit(101.2) == 5  # open-loop phase: arrivals from its start
    for _ in range(200):  # arrivals never spill past the phase end
        s.consume()
    assert s.next_arrival(101.5) == 102.0
    assert (s.next_arrival(102.0), s.limit(102.0), s.next_change(102.0)) == (None, 1, None)


def test_a_phased_loads_prompt_index_restarts_in_each_phase() -> None:
    s = Phased([Phase(1.0, concurrency=2), Phase(1.0, rate=10.0)])
    s.start(0.0)
    seen = []
    for now in (0.1, 0.2, 0.3, 1.1, 1.2):
        s.next_arrival(now)
        s.consume()
        seen.append(s.prompt_index(len(seen)))
    assert seen == [0, 1, 2, 0, 1]


def test_other_strategies_send_the_runs_own_request_number() -> None:
    assert [ClosedLoop(2).prompt_index(i) for i in (0, 7)] == [0, 7]


def test_trace_arrivals_replay_offsets_from_t0() -> None:
    s = TraceArrivals([0.0, 0.5, 2.0], max_concurrency=3)
    s.start(10.0)
    sends = []
    for _ in range(3):
        sends.append(s.next_arrival(10.0))
        s.consume()
    assert sends == [10.0, 10.5, 12.0]
    assert s.limit(10.0) == 3


def test_time_average() -> None:
    # 0 until 1, then 2 until 3, then 1 until 4 -> over [1, 4]: (2*2 + 1*1) / 3
    assert time_average([1.0, 3.0], [2, 1], 1.0, 4.0) == pytest.approx(5 / 3)
    assert time_average([1.0, 3.0], [2, 1], 0.0, 2.0) == pytest.approx(1.0)  # (0*1 + 2*1) / 2


async def test_a_busy_client_shows_in_dispatch_delay_and_cpu_share(server: CountingServer) -> None:
    from spectune.loadgen.metrics import compute_metrics

    def busy(_rec) -> None:  # 40 ms of the client's own CPU after every request: its successor waits for it
        t = time.thread_time()
        while time.thread_time() - t < 0.04:
            pass

    async with client(server, chunks=2, gap_ms=5) as c:
        res = await run_point(c, PROMPTS, ClosedLoop(2), Constraints(max_requests=10), on_record=busy)
    delays = [r.dispatch_delay_s for r in res.records]
    assert all(d is not None and d >= 0 for d in delays)
    later = sorted(delays)[2:]  # the first two were sent at the start, before any busy callback
    assert all(d >= 0.035 for d in later)
    assert res.client_cpu_share is not None
    assert 0.2 < res.client_cpu_share <= 1.0  # 0.4 s of CPU in ~1 s
    m = compute_metrics(res.records, res.window_start, res.window_end, client_cpu_share=res.client_cpu_share)
    assert m["client_limited"] is True


async def test_waiting_for_a_slot_is_not_dispatch_delay(server: CountingServer) -> None:
    # arrivals every ~2 ms but one slot, each request ~40 ms: arrivals queue behind the cap (the server's doing)
    async with client(server, chunks=2, gap_ms=20) as c:
        res = await run_point(c, PROMPTS, OpenLoop(rate=500.0, seed=1, max_concurrency=1),
                              Constraints(max_requests=6))
    waits = sorted(res.records, key=lambda r: r.send_time)
    # the 6th arrival was scheduled ~10 ms in but sent after five 40 ms requests: its queueing is in TTFT ...
    assert waits[-1].ttft_s > 0.15
    # ... but not in its dispatch delay, which counts from when the slot freed
    assert all(r.dispatch_delay_s < 0.03 for r in res.records)
