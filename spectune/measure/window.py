"""Measuring one window against a running server: what every ``spectune sweep`` point and every ``spectune validate``
run does, in one function (:func:`measure_window`).

1. warm-up: ``warmup_prompts`` closed-loop requests, not recorded; if they do not all finish within
   ``warmup_timeout_s`` nothing is measured (the server accepts requests but does not answer them);
2. a :class:`Sample` (the backend's counter snapshot, and its num_steps switches when asked), the measured
   requests under the given strategy and constraints (each record handed to ``on_record`` as it finishes), a
   sample at each of ``boundaries_s`` (s after the run's start: validate's phase ends) and one after the run;
   meanwhile the engine's running batch size is read every ``batch_size_interval_s`` s
   (:class:`~spectune.measure.batch_size.BatchSizeSampler`);
3. the window's load metrics (:func:`~spectune.loadgen.metrics.compute_metrics`), its acceptance
   (``Backend.acceptance`` over the first and the last sample: the last boundary when there are boundaries, else the
   sample after the run), the engine's time over the same samples where it counts it
   (:mod:`spectune.measure.engine_time`) and its status (:func:`~spectune.measure.status.point_status`).

The caller turns the :class:`Window` into its own record (a points.jsonl point, a validate.json run).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from spectune.backends.base import Backend
from spectune.backends.snapshots import Acceptance, SpecSnapshot
from spectune.core.errors import UserError
from spectune.loadgen.record import RequestRecord
from spectune.measure.acceptance import window_acceptance
from spectune.measure.batch_size import BATCH_SIZE_INTERVAL_S, BatchSizeSampler
from spectune.measure.engine_time import EngineTime, engine_time
from spectune.measure.status import point_status

if TYPE_CHECKING:
    from spectune.loadgen.client import ClientConfig
    from spectune.loadgen.constraints import Constraints
    from spectune.loadgen.datasets import Prompt
    from spectune.loadgen.send_loop import PointResult
    from spectune.loadgen.strategy import Strategy
    from spectune.results.point import BatchSize, MetricValue

__all__ = ["Sample", "Window", "client_config", "measure_window", "resolve_model", "RequestSettings"]


class RequestSettings(Protocol):
    """What :func:`client_config` reads of a plan (:class:`~spectune.sweep.plan.SweepPlan`,
    :class:`~spectune.validate.plan.ValidatePlan`: a :class:`~spectune.measure.load_settings.LoadSpec`): ``api``
    (``chat`` or ``completions``), ``max_tokens``, ``temperature``, ``ignore_eos``."""

    @property
    def api(self) -> str: ...

    @property
    def max_tokens(self) -> int: ...

    @property
    def temperature(self) -> float: ...

    @property
    def ignore_eos(self) -> bool: ...


async def resolve_model(base_url: str, preferred: str | None, api_key_env: str | None) -> str:
    """The model name to send: ``preferred`` when ``GET /v1/models`` lists it (or lists nothing), else the only
    listed id (a server started with another served name), else ``preferred``, else the first listed id. The
    request carries the API key from the environment variable ``api_key_env`` (if set).

    Raises:
        UserError: no model list and no ``preferred`` name (the point or run fails with this message).
    """
    from spectune.backends.http import auth_headers, get

    reply = await get(base_url + "/v1/models", 10.0, auth_headers(api_key_env))
    data = reply.json() if reply.status == 200 else None
    ids = [m.get("id") for m in (data.get("data") or [])] if isinstance(data, dict) else []
    ids = [i for i in ids if isinstance(i, str)]
    if preferred and (preferred in ids or len(ids) != 1):
        return preferred
    if ids:
        return ids[0]
    why = reply.error or f"HTTP {reply.status}"
    raise UserError(f"cannot read the model name from {base_url}/v1/models ({why}); pass --model")


def client_config(plan: RequestSettings, backend: Backend, base_url: str, model: str | None,
                  api_key_env: str | None, timeout_s: float = 600.0) -> ClientConfig:
    """The :class:`spectune.loadgen.ClientConfig` of a measured run: ``plan``'s ``api``, ``max_tokens``,
    ``temperature`` and ``ignore_eos`` (a :class:`~spectune.sweep.plan.SweepPlan`, a
    :class:`~spectune.validate.plan.ValidatePlan` or any object with those fields) plus the backend's extra request
    fields and connection reuse; ``timeout_s`` (s) per request."""
    from spectune.loadgen import ClientConfig

    extra = backend.request_extra()
    return ClientConfig(base_url, model=model, api=plan.api, max_tokens=plan.max_tokens,
                        temperature=plan.temperature, ignore_eos=plan.ignore_eos, extra_body=extra or None,
                        api_key_env=api_key_env, timeout_s=timeout_s, reuse_connections=backend.reuse_connections)


@dataclass
class Sample:
    """The server's counters at one instant.

    Attributes:
        snap: the backend's snapshot (None when it has none or the read failed).
        switches: cumulative num_steps switches (``Backend.switches``), or None (not asked, or not exposed).
        switches_source: where ``switches`` came from.
    """

    snap: SpecSnapshot | None = None
    switches: float | None = None
    switches_source: str | None = None


@dataclass
class Window:
    """What :func:`measure_window` measured.

    Attributes:
        result: the load generator's :class:`~spectune.loadgen.send_loop.PointResult` (records, window, t0...).
        warmup: the warm-up records. stuck: why nothing was measured (the warm-up timed out), else None.
        samples: ``samples[0]`` before the run, then one per boundary reached (a run cut short has fewer).
        after: the sample taken after the run.
        batch_size: :func:`~spectune.measure.batch_size.batch_size_summary` of the window, or None.
        acceptance: the window's acceptance (see the module docstring).
        status, error: ``"ok"``/``""`` or ``"failed"`` and why.
        metrics: :func:`~spectune.loadgen.metrics.compute_metrics` of the window (summary.csv's load columns).
        client_limit: why the load generator itself limited the window
            (:func:`~spectune.loadgen.metrics.client_limit`), or None.
        engine_time: the engine's mean decode round, its rows and prefill share over the window (the acceptance's
            snapshots; :func:`~spectune.measure.engine_time.engine_time`), or None where the engine counts none.
    """

    result: PointResult
    warmup: list[RequestRecord]
    stuck: str | None = None
    samples: list[Sample] = field(default_factory=list)
    after: Sample | None = None
    batch_size: BatchSize | None = None
    acceptance: Acceptance = field(default_factory=lambda: Acceptance(None, source="none"))
    status: str = "failed"
    error: str = ""
    metrics: dict[str, MetricValue] = field(default_factory=dict)
    client_limit: str | None = None
    engine_time: EngineTime | None = None

    @property
    def records(self) -> list[RequestRecord]:
        """The measured requests (empty when the warm-up timed out)."""
        return list(self.result.records)


async def measure_window(backend: Backend, config: ClientConfig, prompts: list[Prompt], strategy: Strategy,
                         constraints: Constraints, *,
                         warmup_requests: int, warmup_concurrency: int, warmup_timeout_s: float,
                         max_failure_rate: float, slo_ttft_ms: float | None = None,
                         slo_tpot_ms: float | None = None, on_record: Callable[[RequestRecord], None] | None = None,
                         on_start: Callable[[float], None] | None = None, boundaries_s: Sequence[float] = (),
                         switches: bool = False, batch_size_interval_s: float | None = BATCH_SIZE_INTERVAL_S,
                         warn: Callable[[str], None] = lambda message: None) -> Window:
    """Warm up, sample, run, sample, and judge one measurement window (module docstring).

    Args:
        backend: the started backend. config: the client's :class:`~spectune.loadgen.client.ClientConfig`
            (:func:`client_config`); the client is opened for the window and closed after it.
        prompts: request i sends ``prompts[i % len]`` (in a phased load, i counts within its phase:
            :meth:`~spectune.loadgen.strategy.Strategy.prompt_index`); warm-up request k a tagged copy of
            ``prompts[k % len]``.
        strategy, constraints: when to send and when to stop (:mod:`spectune.loadgen.strategy`,
            :mod:`spectune.loadgen.constraints`).
        warmup_requests: unrecorded requests first, ``warmup_concurrency`` at a time, within ``warmup_timeout_s`` s.
        max_failure_rate: a larger share of failed requests makes the window ``failed`` (0..1).
        slo_ttft_ms, slo_tpot_ms: SLOs (ms) for the metrics' SLO attainment and goodput, or None.
        on_record: each measured record as it finishes. on_start: the run's start ``t0`` (perf_counter s).
        boundaries_s: s after ``t0`` at which to sample (ascending); after the run ends the sampler gets until the
            last boundary plus 5 s, unless the run stopped for failures.
        switches: also read ``Backend.switches()`` in every sample.
        batch_size_interval_s: s between batch-size readings, or None for none.
        warn: receives one-line warnings (a snapshot that failed).

    Raises:
        asyncio.CancelledError: cancelled; what the window measured is dropped.
    """
    from spectune.loadgen import StreamingClient, compute_metrics, run_point
    from spectune.loadgen.metrics import client_limit

    async def sample() -> Sample:
        try:
            snap = await backend.snapshot()
        except Exception as err:  # noqa: BLE001 - a metrics page problem must not lose the window
            warn(f"snapshot failed: {type(err).__name__}: {err}")
            snap = None
        if not switches:
            return Sample(snap)
        try:
            found = await backend.switches()
        except Exception:  # noqa: BLE001
            found = None
        return Sample(snap, *(found or (None, None)))

    samples: list[Sample] = []
    started = asyncio.Event()
    t0: list[float] = []
    sampler = BatchSizeSampler(backend, batch_size_interval_s) if batch_size_interval_s else None

    async def before_run() -> None:
        samples.append(await sample())
        if sampler is not None:
            sampler.start()

    def start(t: float) -> None:
        t0.append(t)
        started.set()
        if on_start is not None:
            on_start(t)

    async def at_boundaries() -> None:
        await started.wait()
        for end in boundaries_s:
            await asyncio.sleep(max(0.0, t0[0] + end - time.perf_counter()))
            samples.append(await sample())

    ticker = asyncio.ensure_future(at_boundaries()) if boundaries_s else None
    batch = None
    try:
        async with StreamingClient(config) as client:
            result = await run_point(client, prompts, strategy, constraints, warmup_requests, on_record,
                                     warmup_concurrency=warmup_concurrency, warmup_timeout_s=warmup_timeout_s,
                                     after_warmup=before_run, on_start=start)
        if ticker is not None and t0 and result.stop_reason != "max_failures":
            remaining = t0[0] + boundaries_s[-1] - time.perf_counter() + 5.0
            await asyncio.wait([ticker], timeout=max(remaining, 0.1))
    finally:
        if ticker is not None:
            ticker.cancel()
        if sampler is not None:
            batch = await sampler.stop()
    if result.stop_reason == "warmup_timeout":
        stuck = (f"warm-up: {warmup_requests} request(s) did not finish within {warmup_timeout_s:g} s (the server "
                 "accepts requests but does not answer them); raise --warmup-timeout if it is only slow")
        return Window(result, [], stuck, error=stuck)
    after = await sample()
    last = samples[len(boundaries_s)] if boundaries_s and len(samples) > len(boundaries_s) else (
        None if boundaries_s else after)
    acc = window_acceptance(backend, samples[0].snap if samples else None, last.snap if last else None,
                            result.records)
    status, error = point_status(result.records, max_failure_rate)
    metrics = compute_metrics(result.records, result.window_start, result.window_end, result.achieved_concurrency,
                              slo_ttft_ms, slo_tpot_ms, result.client_cpu_share)
    busy = engine_time(samples[0].snap if samples else None, last.snap if last else None)
    return Window(result, list(result.warmup_records), None, samples, after, batch, acc, status, error, metrics,
                  client_limit(metrics), busy)


