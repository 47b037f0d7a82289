"""``spectune sweep``: measure every (num_steps, concurrency, repeat) point against a backend (docs/sweep.md).

Order: for each num_steps K (ascending) the backend starts a server once (``start(K)``), then every concurrency
(ascending) and, innermost, every repeat runs on it; ``stop()`` after the last point of K. One point:

1. ``start(K)`` again (returns the running server, or relaunches one that died);
2. warm-up: ``warmup_requests`` closed-loop requests on tagged prompts, not recorded; if they do not finish
   within ``warmup_timeout_s`` the point fails at once (``stop_reason`` ``warmup_timeout``);
3. ``snapshot()``, the measured requests (``ClosedLoop(concurrency)``, each record appended to requests.jsonl
   as it finishes), ``snapshot()``: acceptance is scoped to the measurement window; meanwhile the engine's running
   batch size (``backend.running_requests()``) is read every :data:`~spectune.harness.BATCH_SIZE_INTERVAL_S` s
   (:class:`~spectune.harness.BatchSizeSampler`);
4. metrics (:func:`loadgen.compute_metrics`), acceptance (``backend.acceptance``), the batch-size summary,
   per-category numbers and a status; the point is appended to points.jsonl and summary.csv is rewritten. A point
   the load generator itself limited (:func:`loadgen.metrics.client_limit`) is marked ``client_limited`` and
   warned about.

A point is ``failed`` when its server never came up (``BackendStartError``: every remaining point of that K),
when more than ``max_failure_rate`` of its requests failed, or when none produced output; it is never averaged.
Cancelling the sweep (Ctrl-C) drops the current point's partial records; finished points stay.

The plan, its defaults and the listener/outcome types are in :mod:`spectune.sweep_plan`; what a sweep shares with
``spectune validate`` (model name, client settings, environment, signal handling) is in :mod:`spectune.harness`.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Sequence

from backends import make_backend
from backends.base import Acceptance, Backend, BackendOptions, BackendStartError
from loadgen.datasets import Prompt
from loadgen.errors import UserError
from loadgen.record import RequestRecord
from loadgen.runner import warmup_prompt
from spectune.harness import (BATCH_SIZE_INTERVAL_S, BatchSizeSampler, client_config, environment, resolve_model,
                               run_with_signals, warm_up)
from spectune.results import Key, ResultsFolder, failed_point, now_iso, per_category_points, point_status
from spectune.sweep_plan import ClientTimeouts, SweepListener, SweepOutcome, SweepPlan

__all__ = ["Sweep", "execute", "run_blocking"]


class Sweep:
    """Runs the points of one sweep on an already-checked backend and an opened :class:`ResultsFolder`.

    Args:
        plan: what to measure. backend: the target (preflight done). folder: opened results folder.
        prompts: the dataset sample (request i of every point sends ``prompts[i % len]``).
        meta: the sweep.json object (its ``backend`` entry is refreshed after each start and point).
        listener: progress events. model: preferred model name (``--model``). api_key_env: API key variable.
        timeouts: the client's time limits (request, warm-up).
    """

    def __init__(self, plan: SweepPlan, backend: Backend, folder: ResultsFolder, prompts: list[Prompt],
                 meta: dict[str, Any], listener: SweepListener | None = None, model: str | None = None,
                 api_key_env: str | None = "OPENAI_API_KEY", timeouts: ClientTimeouts | None = None) -> None:
        self.plan, self.backend, self.folder, self.prompts, self.meta = plan, backend, folder, prompts, meta
        self.listener = listener or SweepListener()
        self.model, self.api_key_env = model, api_key_env
        self.timeouts = timeouts or ClientTimeouts()
        self.ran = 0
        self.batch_size_interval_s = BATCH_SIZE_INTERVAL_S

    async def run(self, todo: Sequence[Key]) -> None:
        """Measure the points ``todo`` (in plan order), one num_steps at a time."""
        for steps in sorted({k[0] for k in todo}):
            keys = [k for k in todo if k[0] == steps]
            self.listener.server_starting(steps)
            try:
                for i, key in enumerate(keys):
                    try:
                        endpoint = await self.backend.start(steps)
                    except (BackendStartError, UserError) as err:
                        self._start_failed(steps, keys[i:], err)
                        break
                    self._save_meta()
                    await self._point(key, endpoint.base_url, endpoint.model)
            finally:
                await self.backend.stop()
                self._save_meta()

    def _start_failed(self, steps: int, keys: list[Key], err: Exception) -> None:
        message = str(err).strip()
        first = message.splitlines()[0] if message else type(err).__name__
        tail = getattr(err, "log_tail", "") or ""
        self.listener.server_failed(steps, first, tail)
        for key in keys:
            self._finish(failed_point(key, first, self.plan.requests_for(key[1]), tail))

    def _finish(self, point: dict[str, Any]) -> None:
        self.folder.append_point(point)
        self.ran += 1
        self.listener.point_finished(point)

    def _save_meta(self) -> None:
        self.meta["backend"] = self.backend.describe()
        self.folder.write_meta(self.meta)

    async def _point(self, key: Key, base_url: str, model: str | None) -> None:
        from backends.http import auth_headers
        from loadgen import ClosedLoop, StreamingClient, compute_metrics, run_point
        from loadgen.metrics import client_limit

        steps, conc, rep = key
        plan, planned = self.plan, self.plan.requests_for(conc)
        started = now_iso()
        try:
            model = model or await resolve_model(base_url, self.model, auth_headers(self.api_key_env))
        except UserError as err:
            self._finish(failed_point(key, str(err), planned) | {"stop_reason": "no_model"})
            return
        config = client_config(plan, self.backend, base_url, model, self.api_key_env, self.timeouts.request_timeout_s)
        done = 0

        def on_record(rec: RequestRecord) -> None:
            nonlocal done
            done += 1
            self.folder.append_request({"steps": steps, "concurrency": conc, "repeat": rep, **rec.to_json()})
            self.listener.request_finished(key, rec, done, planned)

        mark = self.folder.request_mark()
        try:
            async with StreamingClient(config) as client:
                warm_prompts = [warmup_prompt(self.prompts[i % len(self.prompts)], i)
                                for i in range(plan.warmup_for(conc))]
                warmup, stuck = await warm_up(client, warm_prompts, conc, self.timeouts.warmup_timeout_s)
                if stuck is not None:
                    self.listener.warning(f"K={steps} c={conc}: {stuck}")
                    self._finish(failed_point(key, stuck, planned) | {"stop_reason": "warmup_timeout"})
                    return
                before = await self._snapshot()
                self.listener.point_started(key, planned)
                sampler = BatchSizeSampler(self.backend, self.batch_size_interval_s)
                sampler.start()
                try:
                    result = await run_point(client, self.prompts, ClosedLoop(conc), plan.constraints(planned),
                                             on_record=on_record)
                finally:
                    batch = await sampler.stop()
                after = await self._snapshot()
        except BaseException:
            self.folder.truncate_requests(mark)  # an unfinished point leaves no records behind
            raise
        records = result.records
        acc = self._acceptance(before, after, records)
        metrics = compute_metrics(records, result.window_start, result.window_end, result.achieved_concurrency,
                                  plan.slo_ttft_ms, plan.slo_tpot_ms, result.client_cpu_share)
        limited = client_limit(metrics)
        if limited is not None:
            self.listener.warning(f"K={steps} c={conc}: {limited}; its latencies include the client's own queueing "
                                  "(lower the concurrency, or give spectune a core of its own)")
        metrics.update(acceptance_length=acc.acceptance_length, acceptance_rate=acc.acceptance_rate,
                       acceptance_length_source=acc.source, batch_size_mean=batch["mean"] if batch else None,
                       batch_size_p50=batch["p50"] if batch else None,
                       batch_size_source=batch["source"] if batch else "none")
        status, error = point_status(records, plan.max_failure_rate)
        log_tail = self.backend.failure_log() if status != "ok" else ""
        if log_tail:
            self.listener.server_failed(steps, f"the server died during K={steps} c={conc}: {error}", log_tail)
        warm_failed = sum(not r.ok for r in warmup)
        if warmup and warm_failed == len(warmup):
            self.listener.warning(f"K={steps} c={conc}: every warm-up request failed ({warmup[0].error})")
        self._finish({
            "steps": steps, "concurrency": conc, "repeat": rep, "status": status, "error": error,
            "metrics": metrics,
            "acceptance": {"per_position": acc.per_position, "num_drafts": acc.num_drafts, "warning": acc.warning,
                           "cross_check": acc.cross_check},
            "batch_size": batch,
            "per_category": per_category_points(records, result.duration_s, steps, self._ask_acceptance),
            "window": {"start_s": result.window_start, "end_s": result.window_end},
            "requests_planned": planned, "stop_reason": result.stop_reason,
            "warmup": {"requests": len(warmup), "failed": warm_failed}, "client_limit": limited,
            "model": model, "base_url": base_url, "started": started, "finished": now_iso(),
            **({"log_tail": log_tail} if log_tail else {}),
        })

    async def _snapshot(self) -> Any:
        try:
            return await self.backend.snapshot()
        except Exception as err:  # noqa: BLE001 - a metrics page problem must not lose the point
            self.listener.warning(f"snapshot failed: {type(err).__name__}: {err}")
            return None

    def _ask_acceptance(self, records: list[RequestRecord]) -> Acceptance:
        """The backend's acceptance for a subset of records without snapshots (its per-request sources)."""
        return self._acceptance(None, None, records)

    def _acceptance(self, before: Any, after: Any, records: list[RequestRecord]) -> Acceptance:
        try:
            return self.backend.acceptance(before, after, records)
        except Exception as err:  # noqa: BLE001
            return Acceptance(None, source="none", warning=f"acceptance failed: {type(err).__name__}: {err}")


async def execute(plan: SweepPlan, backend_name: str, options: BackendOptions, output_dir: Path,
                  resume: bool = False, retry_failed: bool = False,
                  listener: SweepListener | None = None, timeouts: ClientTimeouts | None = None) -> SweepOutcome:
    """Check everything, then run the sweep: the whole of ``spectune sweep`` except signals and rendering.

    Order of checks (each a one-line :class:`UserError`, before anything is measured or written): the plan, the
    backend options (``make_backend``), the dataset, the output folder (plan and finished points), and the
    backend's ``preflight`` (endpoints reachable, executables present). Then sweep.json is written and the
    missing points run. The backend is always closed (servers stopped), also when cancelled.

    Raises:
        UserError: see above. asyncio.CancelledError: the sweep was cancelled (finished points are kept).
    """
    from loadgen.datasets import load_dataset

    listener = listener or SweepListener()
    timeouts = timeouts or ClientTimeouts()
    plan.validate()
    timeouts.validate()
    folder = ResultsFolder(output_dir)
    options.max_concurrency = max(plan.concurrency)
    options.max_tokens = plan.max_tokens
    options.log_dir = folder.logs
    backend = make_backend(backend_name, options)
    outcome = SweepOutcome(folder.path, plan)
    try:
        with warnings.catch_warnings(record=True) as caught:  # e.g. 'random' prompts: shown as sweep warnings
            warnings.simplefilter("always")
            prompts = load_dataset(plan.dataset, plan.num_prompts, plan.seed)
        for w in caught:
            listener.warning(str(w.message))
        kept = folder.check(plan.to_json(), resume, retry_failed)
        for warning in await backend.preflight(list(plan.steps)):
            listener.warning(warning)
        done = {(p["steps"], p["concurrency"], p.get("repeat", 0)) for p in kept}
        todo = [k for k in plan.points() if k not in done]
        meta = _meta(folder, plan, backend)
        meta["client"] = timeouts.to_json()
        folder.open(meta, kept)
        listener.sweep_started(plan, todo, kept)
        sweep = Sweep(plan, backend, folder, prompts, meta, listener, options.model, options.api_key_env, timeouts)
        try:
            await sweep.run(todo)
        finally:
            outcome.ran, outcome.points = sweep.ran, list(folder.points)
    finally:
        try:
            await backend.close()
        finally:
            folder.close()
    return outcome


def _meta(folder: ResultsFolder, plan: SweepPlan, backend: Backend) -> dict[str, Any]:
    """sweep.json for this run; a resumed sweep keeps ``created`` and moves the earlier runs' environment into
    ``history``."""
    import spectune

    env = environment()
    meta = {"spectune_version": spectune.__version__, "created": now_iso(), "plan": plan.to_json(),
            "backend": backend.describe(), **env}
    old = folder.read_meta()
    if old is not None:
        history = list(old.get("history") or [])
        history.append({k: old.get(k) for k in ("created", "resumed", "backend", "host", "versions") if k in old})
        meta.update(created=old.get("created", meta["created"]), resumed=now_iso(), history=history)
    return meta


def run_blocking(plan: SweepPlan, backend_name: str, options: BackendOptions, output_dir: Path,
                 resume: bool = False, retry_failed: bool = False,
                 listener: SweepListener | None = None, timeouts: ClientTimeouts | None = None) -> SweepOutcome:
    """Run :func:`execute` under :func:`run_with_signals`: SIGINT/SIGTERM cancel it cleanly (the current point is
    dropped, finished points stay, servers are stopped) and the outcome's ``interrupted`` holds the signal number.

    Raises:
        UserError: from :func:`execute`.
    """
    outcome, sig = run_with_signals(
        lambda: execute(plan, backend_name, options, output_dir, resume, retry_failed, listener, timeouts))
    if sig is not None:
        return SweepOutcome(Path(output_dir), plan, ResultsFolder(output_dir).read_points(), 0, sig)
    assert outcome is not None
    return outcome
