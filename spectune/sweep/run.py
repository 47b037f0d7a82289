"""``spectune sweep``: measure every (num_steps, concurrency, repeat) point against a backend (docs/sweep.md).

Order: for each num_steps K (ascending) the backend starts a server once (``start(K)``), then every concurrency
(ascending) and, innermost, every repeat runs on it; ``stop()`` after the last point of K. One point:

1. ``start(K)`` again (returns the running server, or relaunches one that died);
2. :func:`spectune.measure.window.measure_window` with a closed loop at the point's concurrency: the warm-up
   (``warmup_requests``, not recorded; a warm-up past ``warmup_timeout_s`` fails the point at once,
   ``stop_reason`` ``warmup_timeout``), counter snapshots around the measured requests (each record appended to
   requests.jsonl as it finishes), the engine's running batch size over the window, the load metrics, the
   window's acceptance and its status; whether the server drafted the K it was given
   (:func:`spectune.measure.schedule_check.check_num_steps`, ``schedule_check``, a warning when it did not);
3. per-category numbers (:func:`spectune.measure.acceptance.per_category_points`); the point is appended to
   points.jsonl and summary.csv is rewritten (:class:`spectune.results.folder.SweepFolder`). A point the load
   generator itself limited (:func:`spectune.loadgen.metrics.client_limit`) is marked ``client_limited`` and
   warned about.

A point is ``failed`` when its server never came up (``BackendStartError``: every remaining point of that K),
when more than ``max_failure_rate`` of its requests failed, or when none produced output; it is never averaged.
Cancelling the sweep (Ctrl-C) drops the current point's partial records; finished points stay.

The plan, its defaults and the listener/outcome types are in :mod:`spectune.sweep.plan`; what a sweep shares with
``spectune validate`` is in :mod:`spectune.measure`.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from pathlib import Path
from typing import Sequence

from spectune.backends import make_backend
from spectune.backends.base import Backend, BackendStartError
from spectune.backends.options import BackendOptions
from spectune.backends.snapshots import SpecSnapshot
from spectune.loadgen.datasets import Prompt, load_dataset
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject
from spectune.loadgen.record import RequestRecord
from spectune.measure.acceptance import per_category_points, window_acceptance
from spectune.measure.batch_size import BATCH_SIZE_INTERVAL_S
from spectune.measure.engine_time import engine_warnings
from spectune.measure.load_settings import ClientTimeouts
from spectune.measure.schedule_check import check_num_steps
from spectune.measure.signals import run_with_signals
from spectune.measure.window import client_config, measure_window, resolve_model
from spectune.results.confidence import point_intervals, requests_by_point
from spectune.results.folder import SweepFolder
from spectune.results.point import MetricValue, RequestLine, ScheduleCheck, ServerRecord, SweepPoint
from spectune.results.point_numbers import PointNumbers
from spectune.results.schema import SCHEDULE_FOLDER, Key, PointKey, key_fields, now_iso, point_key
from spectune.results.sweep_meta import SweepMeta
from spectune.sweep.drift import DriftCheck, drift_check, drift_summary
from spectune.sweep.guided import GuidedPlanner
from spectune.sweep.plan import SweepListener, SweepOutcome, SweepPlan
from spectune.sweep.schedule_server import PairedRunner, schedule_pass
from spectune.sweep.p_min import PMinRunner, p_min_passes, p_min_summary
from spectune.sweep.prepare import prepare_folder
from spectune.sweep.runner import RaySweeping, SweepRunner
from spectune.sweep.side_pass import OpenPass, SidePass
from spectune.sweep.sequential import MIN_SECONDS, EarlyStop, closed_loop_throughput, prompt_sums, request_parts

__all__ = ["Sweep", "execute", "run_blocking", "SCHEDULE_FOLDER"]


class Sweep:
    """Runs the points of one sweep on an already-checked backend and an opened :class:`SweepFolder`.

    Args:
        plan: what to measure. backend: the target (preflight done). folder: opened results folder.
        prompts: the dataset sample (request i of every point sends ``prompts[i % len]``).
        meta: sweep.json's record (its ``backend`` entry is refreshed after each start and point).
        listener: progress events. model: preferred model name (``--model``). api_key_env: API key variable.
        timeouts: the client's time limits (request, warm-up).
    """

    def __init__(self, plan: SweepPlan, backend: Backend, folder: SweepFolder, prompts: list[Prompt],
                 meta: SweepMeta, listener: SweepListener | None = None, model: str | None = None,
                 api_key_env: str | None = "OPENAI_API_KEY", timeouts: ClientTimeouts | None = None) -> None:
        self.plan, self.backend, self.folder, self.prompts, self.meta = plan, backend, folder, prompts, meta
        self.listener = listener or SweepListener()
        self.model, self.api_key_env = model, api_key_env
        self.timeouts = timeouts or ClientTimeouts()
        self.ran = 0
        self.batch_size_interval_s = BATCH_SIZE_INTERVAL_S
        self.order = "blocks"
        self.current: int | None = None  # num_steps of the running server
        self.broken: dict[int, tuple[str, str]] = {}  # num_steps whose server failed -> (message, log tail)
        self.records: dict[Key, list[RequestLine]] = {}  # request objects of the points measured now
        self.drift_checks: list[DriftCheck] = []
        self.predicted: list[JsonObject] = []
        self.planner: GuidedPlanner | None = None  # the guided plan's, while it runs
        #: measuring cost: points (and drift re-measurements) measured now, server starts/switches, seconds
        self.cost: dict[str, float] = {"points": 0, "drift_points": 0, "launches": 0, "measure_s": 0.0,
                                     "drift_s": 0.0, "switch_s": 0.0}
        #: points.jsonl ``server`` of every point this sweep records: None for static servers, the schedule
        #: server's description for the ``schedule-server/`` folder (:func:`schedule_pass`)
        self.server: ServerRecord | None = None

    async def run(self, todo: Sequence[Key]) -> None:
        """Measure the points ``todo`` in the plan's order (grid), or let the guided planner pick them (guided);
        then the drift check at the end. The backend is stopped at the end."""
        todo = [PointKey(*k) for k in todo]
        self.order = self.plan.order_for(self.backend.cheap_switch)
        self.meta.order = self.order
        try:
            if self.plan.design == "guided":
                await self._guided()
            else:
                keys = self.plan.ordered(list(todo), self.order)
                if self.order == "blocks":
                    for steps in dict.fromkeys(k.steps for k in keys):
                        await self.measure_block([k for k in keys if k.steps == steps])
                else:
                    for key in keys:
                        await self._measure(key)
            await self.end_check()
        finally:
            await self.backend.stop()
            self._save_meta()

    async def end_check(self) -> None:
        """The end-of-sweep drift check (with the plan's drift check on and a point measured now): the reference
        cell among the first points measured again (label ``end of sweep``)."""
        if self.plan.drift_check and self.ran > 0:
            first = [p.key for p in self.folder.points]
            ref = self._reference(first[:max(len(self.plan.steps), len(self.plan.concurrency), 2)], first)
            if ref is not None:
                await self._drift("end of sweep", ref)

    async def measure_block(self, keys: Sequence[Key]) -> None:
        """One num_steps block: the points ``keys`` (one num_steps, in run order) on its server, then, with the drift
        check on and two or more points, the block's reference cell again (label ``block K=<steps>``). The server is
        left running (:meth:`run` or the caller stops it). Also the body of one Ray task of a distributed sweep
        (:mod:`spectune.sweep.ray_block`)."""
        keys = [PointKey(*k) for k in keys]
        for key in keys:
            await self._measure(key)
        ref = self._reference(keys)
        if self.plan.drift_check and len(keys) >= 2 and ref is not None:
            await self._drift(f"block K={keys[0].steps}", ref)

    async def _measure(self, key: Key, drift: str | None = None) -> tuple[SweepPoint, list[RequestLine]] | None:
        """Start (or switch to) the server of ``key``'s num_steps and measure the point; a drift re-measurement
        (``drift``: its label) is returned instead of being recorded as a point. None when its server failed."""
        steps = key.steps
        planned = self.plan.requests_for(key.concurrency)
        if steps in self.broken:
            if drift is None:
                message, tail = self.broken[steps]
                self._finish(failed_point(key, message, planned, tail))
            return None
        if self.current is not None and self.current != steps:
            await self.backend.stop()
        if self.current != steps:
            self.listener.server_starting(steps)
        t = time.perf_counter()
        try:
            endpoint = await self.backend.start(steps)
        except (BackendStartError, UserError) as err:
            self.current = None
            message = str(err).strip()
            first = message.splitlines()[0] if message else type(err).__name__
            tail = getattr(err, "log_tail", "") or ""
            self.broken[steps] = (first, tail)
            self.listener.server_failed(steps, first, tail)
            if drift is None:
                self._finish(failed_point(key, first, planned, tail))
            return None
        switch_s = 0.0
        if self.current != steps:
            switch_s = time.perf_counter() - t
            self.cost["launches"] += 1
            self.cost["switch_s"] += switch_s
        self.current = steps
        self._save_meta()
        t = time.perf_counter()
        point, records = await self._point(key, endpoint.base_url, endpoint.model, drift)
        measure_s = time.perf_counter() - t
        self.cost["drift_s" if drift else "measure_s"] += measure_s
        point.timing = {"switch_s": switch_s, "measure_s": measure_s}
        self.cost["drift_points" if drift else "points"] += 1
        if drift is None:
            self.records[key] = records
            self._finish(point)
        return point, records

    def _reference(self, keys: Sequence[Key], later: Sequence[Key] = ()) -> Key | None:
        """The drift reference among ``keys``: the ok point with the shortest measurement window (the cheapest to
        measure again) among those measured in full, else among the full ones of ``later`` (points measured after
        them), else among all of ``keys``; None without an ok point. A window that stopped early reports its rule's
        statistic over its first requests (:mod:`spectune.sweep.sequential`), which its re-measurement, a full
        window, would not read like: the difference would pass for drift (docs/sweep.md, "Order and drift")."""
        pts = {p.key: p for p in self.folder.points if p.status == "ok"}
        cands = [k for k in keys if k in pts]
        if not cands:
            return None
        full = ([k for k in cands if not pts[k].stopped_early]
                or [k for k in later if k in pts and not pts[k].stopped_early])
        return min(full or cands, key=lambda k: pts[k].numbers.duration_s or float("inf"))

    async def _drift(self, label: str, key: Key) -> None:
        """Re-measure ``key`` and compare it with its first measurement (:func:`spectune.sweep.drift.drift_check`)."""
        first = next((p for p in self.folder.points if p.key == key), None)
        if first is None or first.status != "ok":
            return
        got = await self._measure(key, drift=label)
        if got is None:
            return
        again, again_records = got
        first_records = self.records.get(key)
        if first_records is None:
            first_records = [r for r in self.folder.read_requests() if point_key(r) == key]
        check = drift_check(label, first, again, first_records, again_records, self.plan.objective,
                            self.plan.confidence, self.plan.noise_band)
        self.drift_checks.append(check)
        self.meta.drift = drift_summary(self.drift_checks, self.order)
        self._save_meta()
        self.listener.drift_checked(check)

    async def _guided(self) -> None:
        """The guided plan (:mod:`spectune.sweep.guided`): rounds of cells chosen by the planner, each round in
        num_steps order starting with the running server's, until settled or out of budget; then every unmeasured
        cell is predicted into summary.csv."""
        planner = self.planner = GuidedPlanner.for_plan(self.plan)
        tried = {p.key.cell for p in self.folder.points}
        stop = ""
        while not stop:
            keys = planner.next_keys(self.folder.points, tried, self.cost, self._records_by_point,
                                     current=self.current)
            if not keys:
                break
            current = self.current
            keys.sort(key=lambda key: (key.steps != current, key))
            for key in keys:
                stop = self._over_budget()
                if stop:
                    break
                tried.add(key.cell)
                await self._measure(key)
        self.predicted, guided = planner.finish(self.folder.points, stop)
        self.folder.predicted = self.predicted
        self.folder.write_summary()
        self.meta.guided = guided

    def _early_stop(self, key: Key, planned: int) -> EarlyStop | None:
        """The sequential stop rule of ``key``'s window (:mod:`spectune.sweep.sequential`), or None when the plan's
        windows run in full: its reference is the best objective measured at the key's concurrency by another
        num_steps (median over repeats; None before any). A guided plan's settle run (a repeat beyond ``--repeats``,
        :mod:`spectune.sweep.guided.settle`) runs in full too: it adds a replicate to a comparison that ``spectune
        recommend`` makes on the prompts every run of the two cells measured, and cut short it would narrow those
        to its own first prompts (the bundled engine, docs/sweep.md's command: num_steps 0 and 1 at concurrency 1 at
        0.939 [0.890, 0.988] on 13 prompts; one settle run stopped after 8 and left 0.876 [0.736, 1.012] on 8, a
        tie, with num_steps 0 at 0.677 of 1 on the grid)."""
        plan, key = self.plan, PointKey(*key)
        if not plan.stops_early or (self.planner is not None and key.repeat >= plan.repeats):
            return None
        steps, conc = key.cell
        maximise = plan.objective != "tpot"
        runs: dict[int, list[float]] = {}
        for p in self.folder.points:
            v = p.numbers.output_throughput_tok_s if maximise else p.numbers.tpot_p50_ms
            if p.status == "ok" and p.concurrency == conc and p.steps != steps and v is not None and v > 0:
                runs.setdefault(p.steps, []).append(float(v))
        meds = {k: sorted(v)[len(v) // 2] for k, v in runs.items()}
        best = ((max if maximise else min)(meds, key=lambda k: meds[k])) if meds else None
        goal = self.planner.window_goal(key) if self.planner is not None else None
        sums = pairs = None
        if best is not None:  # the reference's requests, to compare on the prompts both measured
            recs = [r for (k, c, _), rs in sorted(self._records_by_point().items(), key=lambda x: x[0])
                    if k == best and c == conc for r in rs]
            sums = prompt_sums(recs, plan.objective) or None
            pairs = request_parts(recs, plan.objective) or None
        return EarlyStop(plan.objective, conc, planned, None if best is None else meds[best], plan.noise_band,
                         plan.confidence, min_s=MIN_SECONDS, steps=steps, reference_steps=best, at_minimum=goal,
                         max_s=plan.duration_per_point_s, reference_prompts=sums,
                         reference_requests=pairs)

    @staticmethod
    def _as_statistic(key: Key, records: list[RequestLine], metrics: dict[str, MetricValue], rule: EarlyStop) -> None:
        """An early-stopped window's ``output_throughput_tok_s``: the stop rule's statistic, Little's-law throughput
        over its finished requests (:mod:`spectune.sweep.sequential`, "What an early-stopped window reports"); the
        window's own figure (tokens over its length) goes to its ``early_stop`` record
        (``window_output_throughput_tok_s``)."""
        value = closed_loop_throughput(records, key.concurrency)
        if value is not None:
            rule.last.update(window_output_throughput_tok_s=PointNumbers.from_metrics(metrics).output_throughput_tok_s)
            metrics["output_throughput_tok_s"] = value

    def _records_by_point(self) -> dict[Key, list[RequestLine]]:
        """Request objects of every point, keyed (steps, concurrency, repeat): those measured now, and those of a
        resumed folder's earlier points (requests.jsonl)."""
        out = dict(self.records)
        missing = {p.key for p in self.folder.points} - set(out)
        if missing:
            for key, recs in requests_by_point(self.folder.read_requests()).items():
                if key in missing:
                    out[key] = recs
        return out

    def _over_budget(self) -> str:
        """Why the guided plan must stop measuring (its budget is spent), or ""."""
        plan, cost = self.plan, self.cost
        if plan.budget_points is not None and cost["points"] + self.plan.repeats > plan.budget_points:
            return f"budget of {plan.budget_points} points"
        if plan.budget_s is not None and cost["measure_s"] + cost["drift_s"] + cost["switch_s"] >= plan.budget_s:
            return f"budget of {plan.budget_s:g} s"
        return ""

    def _finish(self, point: SweepPoint) -> None:
        """Make ``point`` durable in the folder and announce it."""
        point.server = self.server
        self.folder.append_point(point)
        self.ran += 1
        self.listener.point_finished(point)

    def _save_meta(self) -> None:
        self.meta.backend = self.backend.describe()
        c = self.cost
        self.meta.cost = {**c, "total_s": c["measure_s"] + c["drift_s"] + c["switch_s"]}
        self.folder.write_meta(self.meta)

    async def _point(self, key: Key, base_url: str, model: str | None,
                     drift: str | None = None) -> tuple[SweepPoint, list[RequestLine]]:
        """Measure one point; returns its points.jsonl record and its request objects (``drift``: a drift
        re-measurement, whose requests go to drift_requests.jsonl)."""
        steps, conc, rep = key
        plan, planned = self.plan, self.plan.requests_for(conc)
        started = now_iso()
        try:
            model = model or await resolve_model(base_url, self.model, self.api_key_env)
        except UserError as err:
            return SweepPoint.failed(key, str(err), planned, stop_reason="no_model"), []
        config = client_config(plan, self.backend, base_url, model, self.api_key_env, self.timeouts.request_timeout_s)
        done = 0

        kept: list[RequestLine] = []

        def on_record(rec: RequestRecord) -> None:
            nonlocal done
            done += 1
            obj = {**key_fields(key), **rec.to_json()}
            if drift is None:
                self.folder.append_request(obj)
            else:
                self.folder.append_drift_request({**obj, "drift_check": drift})
            kept.append({k: v for k, v in obj.items() if k not in ("chunk_times", "chunk_tokens")}
                        | {"chunk_times": len(rec.chunk_times)})
            self.listener.request_finished(key, rec, done, planned)

        rule = self._early_stop(key, planned) if drift is None else None
        stop_when = None if rule is None else rule.check
        mark = self.folder.request_mark()
        try:
            w = await measure_window(
                self.backend, config, self.prompts, plan.strategy(conc), plan.constraints(planned, stop_when),
                warmup_requests=plan.warmup_for(conc), warmup_concurrency=conc,
                warmup_timeout_s=self.timeouts.warmup_timeout_s, max_failure_rate=plan.max_failure_rate,
                slo_ttft_ms=plan.slo_ttft_ms, slo_tpot_ms=plan.slo_tpot_ms, on_record=on_record,
                on_start=lambda t0: self.listener.point_started(key, planned),
                batch_size_interval_s=self.batch_size_interval_s, warn=self.listener.warning)
        except BaseException:
            if drift is None:
                self.folder.truncate_requests(mark)  # an unfinished point leaves no records behind
            raise
        if w.stuck is not None:
            self.listener.warning(f"K={steps} c={conc}: {w.stuck}")
            return SweepPoint.failed(key, w.stuck, planned, stop_reason="warmup_timeout"), kept
        result, records, acc, batch, metrics, limited = (w.result, w.records, w.acceptance, w.batch_size,
                                                         dict(w.metrics), w.client_limit)
        if limited is not None:
            self.listener.warning(f"K={steps} c={conc}: {limited}; its latencies include the client's own queueing "
                                  "(lower the concurrency, or give spectune a core of its own)")
        as_json = [r.to_json() for r in records]
        if rule is not None and rule.reason:
            self._as_statistic(key, as_json, metrics, rule)
        metrics.update(point_intervals(as_json, metrics))
        metrics.update(acceptance_length=acc.acceptance_length, acceptance_rate=acc.acceptance_rate,
                       acceptance_length_source=acc.source, batch_size_mean=batch["mean"] if batch else None,
                       batch_size_p50=batch["p50"] if batch else None,
                       batch_size_source=batch["source"] if batch else "none",
                       engine_round_ms=w.engine_time.round_ms if w.engine_time else None,
                       engine_prefill_share=w.engine_time.prefill_share if w.engine_time else None,
                       engine_round_rows=w.engine_time.round_rows if w.engine_time else None)
        log_tail = self.backend.failure_log() if w.status != "ok" else ""
        if log_tail:
            self.listener.server_failed(steps, f"the server died during K={steps} c={conc}: {w.error}", log_tail)
        warm_failed = sum(not r.ok for r in w.warmup)
        if w.warmup and warm_failed == len(w.warmup):
            self.listener.warning(f"K={steps} c={conc}: every warm-up request failed ({w.warmup[0].error})")
        said = engine_warnings(w.samples[0].snap if w.samples else None, w.after.snap if w.after else None)
        for message in said:
            self.listener.warning(f"K={steps} c={conc}: {message}")
        numbers = PointNumbers.from_metrics(metrics)
        check = self._check_steps(key, w.samples[0].snap if w.samples else None, w.after.snap if w.after else None,
                                  batch["mean"] if batch else numbers.achieved_concurrency,
                                  numbers.total_output_tokens)
        ask = lambda recs: window_acceptance(self.backend, None, None, recs)  # noqa: E731 - per-request sources
        return SweepPoint(
            steps, conc, rep, w.status, w.error, metrics,
            # positions past num_steps were not drafted at this point (a server sized for a larger num_steps reports
            # them as 0): only the first ``steps`` are acceptance
            acceptance={"per_position": acc.per_position[:steps], "num_drafts": acc.num_drafts,
                        "warning": acc.warning, "cross_check": acc.cross_check},
            batch_size=batch, per_category=per_category_points(records, result.duration_s, steps, ask),
            window={"start_s": result.window_start, "end_s": result.window_end},
            requests_planned=planned, stop_reason=result.stop_reason,
            early_stop=rule.describe() if rule is not None else None,
            warmup={"requests": len(w.warmup), "failed": warm_failed}, client_limit=limited, schedule_check=check,
            model=model, base_url=base_url, started=started, finished=now_iso(), log_tail=log_tail,
            drift_check=drift, engine_warnings=said), kept

    def _check_steps(self, key: Key, before: SpecSnapshot | None, after: SpecSnapshot | None,
                     batch_size: float | None, output_tokens: float | None) -> ScheduleCheck | None:
        """Did the point's server run the num_steps it was given? The window's counters against K
        (:func:`spectune.measure.schedule_check.check_num_steps`): points.jsonl's ``schedule_check`` (None when the
        server has no spec-decode counters), and a warning naming the backend's remedy when it did not."""
        check = check_num_steps(key.steps, before, after, batch_size, output_tokens)
        if check is None:
            return None
        if not check.followed and (self.server is None or self.server["kind"] != "p_min"):  # a cutoff shortens drafts
            self.listener.warning(check.steps_message(f"K={key.steps} c={key.concurrency}", self.backend.schedule_setting()))
        return check


async def execute(plan: SweepPlan, backend_name: str, options: BackendOptions, output_dir: Path,
                  resume: bool = False, retry_failed: bool = False,
                  listener: SweepListener | None = None, timeouts: ClientTimeouts | None = None,
                  ray: RaySweeping | None = None, schedule_server: str = "auto",
                  p_min: Sequence[float] = ()) -> SweepOutcome:
    """Check everything, then run the sweep: the whole of ``spectune sweep`` except signals and rendering.

    Order of checks (each a one-line :class:`UserError`, before anything is measured or written): the plan, the
    backend options (``make_backend``), the dataset, the output folder (plan and finished points), and the
    backend's ``preflight`` (endpoints reachable, executables present). Then sweep.json is written and the
    missing points run. The backend is always closed (servers stopped), also when cancelled.

    ``ray``: a :class:`spectune.sweep.distributed.RayOptions` to run each num_steps block as a Ray task
    (docs/distributed.md; the backend's preflight then runs inside each task, on its node), or None.

    ``schedule_server`` (``auto``, ``on``, ``off``): whether the engine's schedule server is measured too
    (:func:`schedule_pass`): into ``output_dir/schedule-server`` (:data:`SCHEDULE_FOLDER`, a sweep folder of its own
    whose points carry ``server``), its num_steps blocks alternating with the static ones (:class:`PairedRunner`).

    ``p_min``: draft-confidence cutoffs to measure too (:mod:`spectune.sweep.p_min`), one server per cutoff P at the
    largest num_steps, into ``output_dir/p-min/P``, after the static cells (:class:`PMinRunner`).

    Raises:
        UserError: see above. asyncio.CancelledError: the sweep was cancelled (finished points are kept).
    """
    listener = listener or SweepListener()
    timeouts = timeouts or ClientTimeouts()
    plan.validate()
    timeouts.validate()
    folder = SweepFolder(output_dir)
    options = dataclasses.replace(options, max_concurrency=max(plan.concurrency), max_tokens=plan.max_tokens,
                                  log_dir=folder.logs)
    backend = make_backend(backend_name, options)
    if ray is not None:
        ray.check(plan, backend)
    pair_pass, pair_warnings = schedule_pass(plan, backend, schedule_server, ray)
    cutoff_passes = p_min_passes(p_min, plan, backend, ray)
    sides: list[OpenPass] = []  # the side passes opened: their servers and folders are closed with the sweep's
    outcome = SweepOutcome(folder.path, plan)
    try:
        with warnings.catch_warnings(record=True) as caught:  # e.g. 'random' prompts: shown as sweep warnings
            warnings.simplefilter("always")
            prompts = load_dataset(plan.dataset, plan.num_prompts, plan.seed)
        for w in caught:
            listener.warning(str(w.message))
        kept, todo, meta = await prepare_folder(folder, plan, backend, resume, retry_failed, listener, timeouts,
                                                preflight=ray is None)
        for side in ([pair_pass] if pair_pass is not None else []) + cutoff_passes:
            sides.append(await open_side_pass(side, backend_name, options, folder, prompts, resume, retry_failed,
                                              listener, timeouts))
        pair = sides[0] if pair_pass is not None else None
        cutoffs = sides[1:] if pair_pass is not None else sides
        if pair is not None:
            meta.schedule_server = pair.sweep.meta.backend_value("schedule_server")
        for warning in pair_warnings:
            listener.warning(warning)
        if cutoffs:
            meta.p_min = p_min_summary(p_min, plan, backend)
        folder.open(meta, kept)
        listener.sweep_started(plan, todo + [k for side in sides for k in side.todo],
                               kept + [p for side in sides for p in side.kept])
        if ray is None:
            sweep: SweepRunner = Sweep(plan, backend, folder, prompts, meta, listener, options.model,
                                       options.api_key_env, timeouts)
        else:
            sweep = ray.sweep(plan, backend_name, options, folder, prompts, meta, listener, timeouts)
        if pair is not None:
            sweep = PairedRunner(sweep, pair.sweep, pair.todo)
        if cutoffs:
            sweep = PMinRunner(sweep, [(s.sweep, s.todo) for s in cutoffs])
        try:
            await sweep.run(todo)
        finally:
            outcome.ran, outcome.points = sweep.ran, list(folder.points)
            outcome.predicted, outcome.cost = list(sweep.predicted), dict(sweep.meta.cost or {})
            outcome.drift, outcome.guided = sweep.meta.drift, sweep.meta.guided
    finally:
        try:
            await backend.close()
            for side in sides:
                await side.sweep.backend.close()
        finally:
            folder.close()
            for side in sides:
                side.sweep.folder.close()
    return outcome


async def open_side_pass(side: SidePass, backend_name: str, options: BackendOptions, parent: SweepFolder,
                         prompts: list[Prompt], resume: bool, retry_failed: bool, listener: SweepListener,
                         timeouts: ClientTimeouts) -> OpenPass:
    """A side pass (:mod:`spectune.sweep.side_pass`) ready to run, the way the static sweep gets ready: its backend
    (``options`` with the pass's own fields), its folder ``parent/side.folder`` checked, the preflight, sweep.json's
    record (with what the pass notes of its server) and the folder opened; its :class:`Sweep` records ``server`` on
    every point.

    Raises:
        UserError: from the backend options, the folder check or the backend's preflight.
    """
    folder = SweepFolder(parent.path / side.folder)
    backend = make_backend(backend_name, dataclasses.replace(options, **side.options, log_dir=folder.logs))
    kept, todo, meta = await prepare_folder(folder, side.plan, backend, resume, retry_failed, listener, timeouts)
    server = side.server(backend, meta)
    if side.note is not None:
        side.note(meta, server)
    folder.open(meta, kept)
    sweep = Sweep(side.plan, backend, folder, prompts, meta, listener, options.model, options.api_key_env, timeouts)
    sweep.server = server
    return OpenPass(sweep, todo, kept)


def run_blocking(plan: SweepPlan, backend_name: str, options: BackendOptions, output_dir: Path,
                 resume: bool = False, retry_failed: bool = False,
                 listener: SweepListener | None = None, timeouts: ClientTimeouts | None = None,
                 ray: RaySweeping | None = None, schedule_server: str = "auto",
                 p_min: Sequence[float] = ()) -> SweepOutcome:
    """Run :func:`execute` under :func:`run_with_signals`: SIGINT/SIGTERM cancel it cleanly (the current point is
    dropped, finished points stay, servers are stopped) and the outcome's ``interrupted`` holds the signal number.

    Raises:
        UserError: from :func:`execute`.
    """
    outcome, sig = run_with_signals(
        lambda: execute(plan, backend_name, options, output_dir, resume, retry_failed, listener, timeouts, ray,
                        schedule_server, p_min))
    if sig is not None:
        return SweepOutcome(Path(output_dir), plan, SweepFolder(output_dir).read_points(), 0, sig)
    assert outcome is not None
    return outcome


def failed_point(key: Key, error: str, planned: int, log_tail: str = "") -> SweepPoint:
    """The record of a point that measured nothing (its server never came up): :meth:`SweepPoint.failed`."""
    return SweepPoint.failed(key, error, planned, log_tail)
