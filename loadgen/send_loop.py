"""The sending loop: runs one sweep point (warm-up, then measured requests) under a strategy and constraints.

The strategy says when to send (:mod:`spectune.loadgen.strategy`), the constraints when to stop
(:mod:`spectune.loadgen.constraints`),
the client how (:mod:`spectune.loadgen.client`). Sending decisions are made synchronously in :meth:`_Run._pump`, called
at
start, whenever a request finishes (so a closed loop refills its slot at once) and when a timer fires (next
open-loop arrival, phase boundary, duration deadline).

Cancelling the task that awaits :func:`run_point` (Ctrl-C in the sweep) cancels every request in flight, waits for
their connections to close and re-raises; records of unfinished requests are dropped.

The sending loop also watches itself, since a saturated client inflates the latencies it reports: each record gets its
``dispatch_delay_s`` (due time to actual POST: an open-loop arrival's scheduled time, or in a closed loop the end
of the request that freed the slot), and the point its ``client_cpu_share``, the CPU time of the event loop's
thread over the point's wall time (1.0 = one core saturated: the loop cannot use more).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable

import numpy as np

from spectune.loadgen.client import StreamingClient
from spectune.loadgen.constraints import Constraints, RunState
from spectune.loadgen.datasets import Prompt
from spectune.loadgen.record import RequestRecord
from spectune.loadgen.strategy import ClosedLoop, Strategy

__all__ = ["PointResult", "run_point", "time_average"]


@dataclass
class PointResult:
    """What one point measured.

    Attributes:
        records: measured requests in the order they finished (warm-up excluded, failed ones included).
        start_time: s (perf_counter); when measurement began, after warm-up (phase times count from here).
        window_start: s; first measured send (min ``send_time``), or None without records.
        window_end: s; last measured end (max ``end_time``), or None.
        achieved_concurrency: requests; time-average of requests in flight over the window, or None.
        stop_reason: ``"max_requests"``, ``"max_duration"``, ``"max_failures"``, ``"early_stop"`` (the constraints'
            ``stop_when`` said the point had measured enough; the requests in flight finished, or were cancelled
            and left out under ``cancel_on_early_stop``, which also lets it say so while the requests in flight
            at the duration cap drain), or ``"warmup_timeout"`` when the
            warm-up did not finish in time (nothing measured).
        warmup_records: the warm-up requests (for diagnostics: a failing warm-up means a broken server).
        client_cpu_share: CPU seconds of the client's event-loop thread per wall second of the measured run (0..1;
            near 1 the client itself is the bottleneck), or None.
    """

    records: list[RequestRecord]
    start_time: float
    window_start: float | None
    window_end: float | None
    achieved_concurrency: float | None
    stop_reason: str
    warmup_records: list[RequestRecord] = field(default_factory=list)
    client_cpu_share: float | None = None

    @property
    def duration_s(self) -> float | None:
        """Measurement window length, s (first measured send to last measured end)."""
        if self.window_start is None or self.window_end is None:
            return None
        return self.window_end - self.window_start


async def run_point(
    client: StreamingClient,
    prompts: list[Prompt],
    strategy: Strategy,
    constraints: Constraints,
    warmup_requests: int = 0,
    on_record: Callable[[RequestRecord], None] | None = None,
    *,
    warmup_concurrency: int | None = None,
    warmup_timeout_s: float | None = None,
    after_warmup: Callable[[], Awaitable[None]] | None = None,
    on_start: Callable[[float], None] | None = None,
) -> PointResult:
    """Run ``warmup_requests`` warm-up requests, wait for them, then the measured requests.

    Args:
        client: an opened :class:`StreamingClient`.
        prompts: used in order, cycling (request i gets ``prompts[i % len(prompts)]``; a phased strategy restarts the
            order in each phase: :meth:`~spectune.loadgen.strategy.Strategy.prompt_index`). Warm-up request k uses
            ``prompts[k % len]`` with a ``"(warm-up k)"`` prefix, so it does not prefill the server's prefix cache
            with a measured prompt.
        strategy: when to send (closed loop, open loop, phases).
        constraints: when to stop sending and how long to drain.
        warmup_requests: requests sent first (at the strategy's warm-up concurrency) and excluded.
        on_record: called with each finished measured record, at once (the sweep appends it to requests.jsonl).
            An exception from it stops the point and propagates.
        warmup_concurrency: warm-up requests in flight at most (None: the strategy's ``warmup_concurrency()``).
        warmup_timeout_s: s; when the warm-up has not finished by then its requests are cancelled and nothing is
            measured (``stop_reason`` ``"warmup_timeout"``, no records): the server accepts requests but does not
            answer them. None waits as long as it takes.
        after_warmup: awaited after the warm-up and before the measured run (counter snapshots go here).
        on_start: called with the measured run's start time ``t0`` (perf_counter s; what phase boundaries and
            trace offsets count from), once, before the first measured request is sent.

    Returns:
        The :class:`PointResult`.
    """
    if not prompts:
        raise ValueError("run_point needs at least one prompt")
    warmup: list[RequestRecord] = []
    if warmup_requests > 0:
        w_prompts = [warmup_prompt(prompts[k % len(prompts)], k) for k in range(warmup_requests)]
        width = strategy.warmup_concurrency() if warmup_concurrency is None else warmup_concurrency
        w_strategy = ClosedLoop(max(1, min(warmup_requests, width)))
        w_constraints = Constraints(max_requests=warmup_requests, drain_timeout_s=constraints.drain_timeout_s)
        try:
            warm = _Run(client, w_prompts, w_strategy, w_constraints, None, "warmup-").run()
            warmup = (await asyncio.wait_for(warm, warmup_timeout_s)).records
        except asyncio.TimeoutError:
            return PointResult([], time.perf_counter(), None, None, None, "warmup_timeout")
    if after_warmup is not None:
        await after_warmup()
    run = _Run(client, prompts, strategy, constraints, on_record, "r", on_start)
    await run.run()
    recs = run.records
    start = min((r.send_time for r in recs), default=None)
    end = max((r.end_time for r in recs if r.end_time is not None), default=None)
    achieved = None
    if start is not None and end is not None and end > start:
        achieved = time_average(run.changes_t, run.changes_n, start, end)
    return PointResult(recs, run.t0, start, end, achieved, run.stopped or "", warmup, run.cpu_share)


def time_average(times: list[float], values: list[int], start: float, end: float) -> float:
    """Time-average over [start, end] of a step function that takes ``values[k]`` from ``times[k]`` on (0 before).

    ``times`` must be ascending. Used for achieved concurrency (requests in flight), in requests.
    """
    t = np.clip(np.asarray(times, dtype=float), start, end)
    return float(np.dot(np.diff(np.append(t, end)), np.asarray(values, dtype=float)) / (end - start))


def warmup_prompt(p: Prompt, k: int) -> Prompt:
    """Warm-up request k's prompt: ``p`` tagged ``"(warm-up k) "`` so it never prefills a measured prompt's cache."""
    tag = f"(warm-up {k}) "
    msgs = [dict(m) for m in p.messages]
    if msgs:
        msgs[-1]["content"] = tag + msgs[-1]["content"]
    return replace(p, id=f"warmup-{p.id}", messages=msgs, text=tag + p.text)


class _Run:
    """State of one run: requests in flight, counters, and the in-flight change log for achieved concurrency."""

    def __init__(self, client: StreamingClient, prompts: list[Prompt], strategy: Strategy,
                 constraints: Constraints, on_record: Callable[[RequestRecord], None] | None, prefix: str,
                 on_start: Callable[[float], None] | None = None) -> None:
        self.client, self.prompts, self.strategy, self.constraints = client, prompts, strategy, constraints
        self.on_record, self.prefix, self.on_start = on_record, prefix, on_start
        self.state = RunState()
        self.inflight: dict[asyncio.Task, RequestRecord] = {}
        self.records: list[RequestRecord] = self.state.records
        self.changes_t: list[float] = []  # times when the in-flight count changed ...
        self.changes_n: list[int] = []  # ... and the count from then on
        self.stopped: str | None = None
        self.error: BaseException | None = None
        self.wake = asyncio.Event()
        self.t0 = 0.0
        self.cpu_share: float | None = None

    async def run(self) -> "_Run":
        loop = asyncio.get_running_loop()
        self.t0 = time.perf_counter()
        cpu0 = time.thread_time()
        self.strategy.start(self.t0)
        if self.on_start is not None:
            self.on_start(self.t0)
        deadline = self.constraints.deadline(self.t0)
        timer: asyncio.TimerHandle | None = None
        try:
            self._pump()
            while self.stopped is None:
                now = time.perf_counter()
                nxt = self.strategy.next_arrival(now)
                wake = [t for t in (nxt, self.strategy.next_change(now), deadline) if t is not None and t > now]
                self.wake.clear()
                if wake:  # perf_counter and the loop's clock (time.monotonic) are both CLOCK_MONOTONIC on Linux
                    timer = loop.call_later(min(wake) - now, self.wake.set)
                await self.wake.wait()
                if timer is not None:
                    timer.cancel()
                self._pump()
            cut = self.stopped == "early_stop" and self.constraints.cancel_on_early_stop
            if self.error is None and self.inflight and not cut:  # a cut run's requests in flight: dropped below
                bounded = self.stopped in ("max_duration", "max_failures")
                await self._drain(self.constraints.drain_timeout_s if bounded else None)
                await self._cancel_inflight(record_as_failed=True)
            if self.error is not None:
                raise self.error
        finally:
            if timer is not None:
                timer.cancel()
            await self._cancel_inflight(record_as_failed=False)
            wall = time.perf_counter() - self.t0
            self.cpu_share = min(1.0, (time.thread_time() - cpu0) / wall) if wall > 0 else None
        return self

    async def _drain(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` s (None: as long as it takes) for the requests in flight after sending stopped.

        A run that stopped at its duration cap, with ``stop_when`` and ``cancel_on_early_stop``, keeps asking
        ``stop_when`` as each of them finishes: when it says stop, the rest are cancelled and left out (``stopped``
        becomes ``"early_stop"``), as when it says so while sending. The cap cut the sending, and a closed loop's
        requests in flight then take up to one request's latency to drain (about 15 s at concurrency 32 on the
        bundled engine), while their first finished ones often settle what the caller measures the point for. A
        run that sent its ``max_requests`` runs them all to the end: it measures what was asked of it, every
        planned prompt (which the caller's comparisons pair on).
        """
        c = self.constraints
        watch = c.stop_when is not None and c.cancel_on_early_stop and self.stopped == "max_duration"
        end = None if timeout is None else time.perf_counter() + timeout
        while self.inflight:
            left = None if end is None else end - time.perf_counter()
            if left is not None and left <= 0:
                return
            await asyncio.wait(list(self.inflight), timeout=left,
                               return_when=asyncio.FIRST_COMPLETED if watch else asyncio.ALL_COMPLETED)
            if watch and self.error is None:
                self.state.elapsed_s = time.perf_counter() - self.t0
                if c.stop_when(self.state.records, self.state.elapsed_s):  # type: ignore[misc]
                    self.stopped = "early_stop"
                    await self._cancel_inflight(record_as_failed=False)
                    return

    def _pump(self, freed_at: float | None = None) -> None:
        """Send every request that is due and allowed now; set ``stopped`` when a constraint says so.

        ``freed_at``: s, when the request that just finished ended. Under an in-flight limit the first request sent
        now was held by that limit until then, so it was due at the later of its arrival time (None in a closed
        loop) and ``freed_at``; its dispatch delay counts from there (waiting for a slot is the server's doing,
        not the client's).
        """
        strategy, state = self.strategy, self.state
        while self.stopped is None:
            now = time.perf_counter()
            state.elapsed_s = now - self.t0
            self.stopped = "error" if self.error is not None else self.constraints.stop_reason(state)
            if self.stopped is not None:
                break
            t = strategy.next_arrival(now)
            limit = strategy.limit(now)
            if (t is not None and t > now) or (limit is not None and len(self.inflight) >= limit):
                break
            strategy.consume()
            i = state.started
            state.started += 1
            prompt = self.prompts[strategy.prompt_index(i) % len(self.prompts)]
            rec = RequestRecord(request_id=f"{self.prefix}{i}", prompt_id=prompt.id, category=prompt.category,
                                send_time=-1.0 if t is None else t)
            due = now if t is None else t
            if freed_at is not None and limit is not None:
                due = freed_at if t is None else max(t, freed_at)
            freed_at = None
            self.inflight[asyncio.create_task(self._one(rec, prompt, due))] = rec
            self._log_change(now)

    async def _one(self, rec: RequestRecord, prompt: Prompt, due: float) -> None:
        try:
            await self.client.stream(rec, prompt, due)
        except Exception as e:  # a bug or a tokenizer failure must not stall the loop: record it, go on
            rec.error = f"client error: {type(e).__name__}: {e}"
            rec.end_time = rec.end_time or time.perf_counter()
        self.inflight.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
        self._finish(rec)
        self._pump(rec.end_time)
        self.wake.set()

    def _finish(self, rec: RequestRecord) -> None:
        self.state.finished += 1
        self.state.failed += rec.error is not None
        self._log_change(time.perf_counter())
        self.records.append(rec)
        if self.on_record is not None and self.error is None:
            try:
                self.on_record(rec)
            except BaseException as e:  # noqa: BLE001 - re-raised by run()
                self.error = e

    def _log_change(self, now: float) -> None:
        self.changes_t.append(now)
        self.changes_n.append(len(self.inflight))

    async def _cancel_inflight(self, record_as_failed: bool) -> None:
        """Cancel the requests still in flight and wait for their connections to close."""
        if not self.inflight:
            return
        tasks = dict(self.inflight)
        self.inflight.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if record_as_failed:
            for rec in tasks.values():
                rec.error = f"unfinished {self.constraints.drain_timeout_s:g} s after the point stopped sending"
                rec.end_time = time.perf_counter()
                if rec.completion_tokens is None:
                    rec.completion_tokens = sum(rec.chunk_tokens)
                self._finish(rec)
