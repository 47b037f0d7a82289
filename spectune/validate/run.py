"""``spectune validate``: does a per-batch-size num_steps config beat every static num_steps under changing load?

The same time-varying workload (:mod:`spectune.measure.workload`: same seeded prompts, same arrival schedule) runs
once per static num_steps K (``run`` ``static:K``, one backend, a server per K or one switched server) and once
against the config (``run`` ``config``: a second backend launched with ``BackendOptions.adaptive_config``, started
at the config's largest candidate step, which SGLang and the bundled engine take as the initial tier and vLLM as
``num_speculative_tokens``); with ``plan.repeats`` > 1 all of that repeats in alternating order
(:meth:`~spectune.validate.plan.ValidatePlan.run_order`) and the tables and the verdict use the means
(:func:`~spectune.validate.repeats.combine_repeats`); the servers are up one at a time, or all at once with
``plan.servers`` ``together``/``kept`` (:meth:`Validation.run_all`); with one repeat an A/A run (``aa:K``, static K
on a second fresh server) follows, to measure how far two servers of the same num_steps differ. A config that runs
the same rounds as a static num_steps K (:func:`~spectune.validate.plan.static_equivalent`) is not run again: static
K stands for it. Per run and per phase it reports output throughput, TPOT p50/p99, SLO attainment, acceptance length
and, where the server exposes them, num_steps switches (``Backend.switches``, read at the phase boundaries);
:func:`~spectune.validate.verdict.verdict` rules on the overall numbers, every interval with the server-to-server
spread in it (:mod:`spectune.validate.repeats`).

Per phase: requests belong to the phase they were sent in (latency, SLO attainment, request counts); output
throughput counts the tokens streamed inside the phase's window / its length; acceptance and switches are counter
deltas between snapshots taken at the phase boundaries (per-request data where the backend has it: SGLang).
Overall: the same over the scheduled window [0, total) (the drain after it is not counted in throughput).

This module runs a validation (:class:`Validation`, :func:`execute`). The plan, listener and outcome are in
:mod:`spectune.validate.plan`; the verdict and validate.md in :mod:`spectune.validate.verdict`; the folder in
:class:`spectune.results.folder.ValidateFolder`;
the per-phase numbers in :mod:`spectune.validate.phases`.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

from spectune.backends import make_backend
from spectune.backends.base import Backend, BackendStartError
from spectune.backends.options import BackendOptions
from spectune.backends.snapshots import Acceptance
from spectune.backends.num_steps.sglang_config import VllmSchedule, load_config_file
from spectune.loadgen.datasets import Prompt, load_dataset
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject
from spectune.loadgen.record import RequestRecord
from spectune.measure.acceptance import window_acceptance
from spectune.measure.environment import environment
from spectune.measure.load_settings import ClientTimeouts
from spectune.measure.schedule_check import check_schedule
from spectune.measure.window import Sample, Window, client_config, measure_window, resolve_model
from spectune.results.folder import ValidateFolder
from spectune.results.primary import Primary
from spectune.results.reader import request_objects
from spectune.results.recommendation_doc import RecordedRecommendation
from spectune.results.schema import now_iso
from spectune.results.validate_doc import RecordedPrediction, ValidateDoc
from spectune.results.validate_run import RunWindow, ValidateRun
from spectune.validate.bakeoff import rule_bakeoff
from spectune.validate.distributed import ClusterOptions, RayValidation
from spectune.validate.held_memory import available_gib, check_held_memory
from spectune.validate.phase_check import STEADY, phase_check, to_json as phase_check_json
from spectune.validate.phases import phase_index, split_by_phase, summarize_run
from spectune.validate.phase_check import phase_spreads
from spectune.validate.config_formats import STATIC_FORMATS
from spectune.validate.plan import (ValidateListener, ValidateOutcome, ValidatePlan, config_candidates,
                                    static_equivalent)
from spectune.validate.prediction import (compare as compare_prediction, find_recommendation, load_notes,
                                         predict_for, usable_prediction)
from spectune.validate.repeats import AA_PREFIX, combine_repeats, overall_spread, throughput_ratio
from spectune.validate.verdict import Verdict, render_markdown, verdict

FAILURE_STOP = 100
"""A run stops sending after this many failed requests (a broken server would otherwise spin until the end)."""


class Validation:
    """Runs the static runs on ``static`` and the config run on ``adaptive`` (both preflighted), writing ``folder``;
    in a bake-off, each config run on its own backend (``configs``: run name -> (backend, config path))."""

    def __init__(self, plan: ValidatePlan, static: Backend, adaptive: Backend, folder: ValidateFolder,
                 prompts: list[Prompt], meta: JsonObject, listener: ValidateListener, model: str | None,
                 api_key_env: str | None, initial_steps: int, timeouts: ClientTimeouts | None = None,
                 another_static: Callable[[str], Backend] | None = None,
                 configs: dict[str, tuple[Backend, str]] | None = None) -> None:
        self.plan, self.static, self.adaptive, self.folder, self.prompts = plan, static, adaptive, folder, prompts
        self.meta, self.listener, self.model, self.api_key_env = meta, listener, model, api_key_env
        self.initial_steps = initial_steps
        self.timeouts = timeouts or ClientTimeouts()
        self.runs: list[JsonObject] = meta["runs"]
        self.another_static = another_static  # run name -> a static backend of its own (servers held together)
        self.held: dict[str, Backend] = {}  # run name -> its backend, when the servers are held together
        # run name -> (its backend, its config file): the config run, or each config run of a bake-off
        self.configs = configs if configs is not None else {"config": (adaptive, plan.config)}

    async def run_all(self) -> None:
        """Every run of :meth:`ValidatePlan.run_order`, its servers held as ``plan.servers`` says
        (:data:`spectune.validate.plan.SERVERS`).

        ``one``: only one of the two backends' servers is up at a time (a GPU may hold only one), and every repeat
        starts its servers afresh: a server process's own speed is a constant of that process (two engines with
        their own copies of the weights ran 2.4-3.8% apart at batch 1, docs/engine.md), so a
        config server kept for two repeats in a row would carry one draw of it into both; restarted, it varies
        between repeats, where the intervals see it. The A/A run (``aa:K``) always starts its server afresh: it is
        the second server of the pair.

        ``together`` and ``kept``: every run name gets a backend of its own (the config's, the static one for the
        first static run, ``another_static`` for the others) so that all servers can be up at once; they start
        together (:meth:`_start_together`) before a repeat's first run, and the runs go back to back. ``together``
        stops them all at the end of each repeat; ``kept`` keeps them to the end."""
        if self.plan.servers != "one":
            await self._run_held()
            return
        active: Backend | None = None
        last_repeat = None
        try:
            for name, k, repeat in self.plan.run_order(self.initial_steps):
                backend = self.configs[name][0] if name in self.configs else self.static
                fresh = name.startswith(AA_PREFIX)
                if active is not None and (active is not backend or repeat != last_repeat or fresh):
                    await active.close()
                active, last_repeat = backend, repeat
                await self.run_one(backend, k, name, repeat)
        finally:
            await self.static.close()
            await self.adaptive.close()
            for backend, _ in self.configs.values():
                await backend.close()

    def _held_backend(self, name: str) -> Backend:
        """The backend of run ``name`` when the servers are held together (one per run name, made once)."""
        if name not in self.held:
            if name in self.configs:
                self.held[name] = self.configs[name][0]
            elif not any(n not in self.configs for n in self.held):
                self.held[name] = self.static
            elif self.another_static is None:
                raise UserError(f"--servers {self.plan.servers} needs a backend per run: use --servers one")
            else:
                self.held[name] = self.another_static(name)
        return self.held[name]

    async def _run_held(self) -> None:
        """The runs with their servers held together (``plan.servers`` ``together`` or ``kept``)."""
        order = self.plan.run_order(self.initial_steps)
        repeats = list(dict.fromkeys(r for _, _, r in order))
        if repeats:  # before anything starts: the first repeat's servers must fit in memory together
            check_held_memory([(self._held_backend(name), k) for name, k, r in order if r == repeats[0]],
                              self.plan.servers, available_gib())
        try:
            for repeat in repeats:
                runs = [(name, k) for name, k, r in order if r == repeat]
                errors = await self._start_together(runs, repeat)
                for name, k in runs:
                    await self.run_one(self._held_backend(name), k, name, repeat, errors.get(name))
                if self.plan.servers == "together":
                    await asyncio.gather(*(b.close() for b in self.held.values()))
        finally:
            await asyncio.gather(*(b.close() for b in {id(b): b for b in (
                *self.held.values(), self.static, self.adaptive, *(b for b, _ in self.configs.values()))}.values()))

    async def _start_together(self, runs: list[tuple[str, int]], repeat: int) -> dict[str, BaseException]:
        """Start the servers of ``runs`` (run name, num_steps) at once (those already up at that num_steps stay as
        they are); returns the start errors by run name (:meth:`run_one` records each as its run's failure)."""
        backends = [self._held_backend(name) for name, _ in runs]
        labels = ", ".join(name if self.plan.repeats == 1 else f"{name} #{repeat}" for name, _ in runs)
        self.listener.server_starting(labels)
        results = await asyncio.gather(*(b.start(k) for b, (_, k) in zip(backends, runs)), return_exceptions=True)
        errors: dict[str, BaseException] = {}
        for (name, _), result in zip(runs, results):
            if isinstance(result, (BackendStartError, UserError)):
                errors[name] = result
            elif isinstance(result, BaseException):
                raise result
        return errors

    def _describe(self) -> JsonObject:
        """validate.json's ``backend``: the static and config backends' descriptions; with servers held together,
        the static one carries the launches of every static run's backend, in start order. A bake-off has
        ``configs`` (run name -> its backend's description) instead of ``config``."""
        static = self.static.describe()
        statics = [b for n, b in self.held.items() if n not in self.configs and b is not self.static]
        if statics and "launches" in static:
            launches = [x for b in (self.static, *statics) for x in b.describe().get("launches") or []]
            static["launches"] = sorted(launches, key=lambda x: x.get("started") or 0.0)
        if self.plan.bakeoff:
            return {"static": static, "configs": {n: b.describe() for n, (b, _) in self.configs.items()}}
        return {"static": static, "config": self.adaptive.describe()}

    async def run_one(self, backend: Backend, steps: int, name: str, repeat: int = 1,
                      start_error: BaseException | None = None) -> None:
        """One run: ``backend``'s server started at ``steps`` (or the running one), the workload sent, the run's
        numbers per phase and overall written as run ``name`` (repeat ``repeat``); ``start_error``: the server
        already failed to start (:meth:`_start_together`), recorded as this run's failure. Also the body of one Ray
        task of a distributed validation (:mod:`spectune.validate.distributed`)."""
        from spectune.loadgen import Constraints

        plan, workload = self.plan, self.plan.workload
        started = now_iso()
        label = name if plan.repeats == 1 else f"{name} #{repeat}"
        if start_error is None:
            self.listener.server_starting(label)
        try:
            if start_error is not None:
                raise start_error
            endpoint = await backend.start(steps)
            model = endpoint.model or await resolve_model(endpoint.base_url, self.model, self.api_key_env)
        except (BackendStartError, UserError) as err:
            lines = str(err).strip().splitlines() or [type(err).__name__]
            self._finish(ValidateRun(name, steps, repeat, started, "failed", lines[0],
                                     log_tail=getattr(err, "log_tail", "")))
            return
        config = client_config(plan, backend, endpoint.base_url, model, self.api_key_env,
                               self.timeouts.request_timeout_s)
        t0: list[float] = []

        def on_start(t: float) -> None:
            t0.append(t)
            self.listener.run_started(label, t, workload.total_s)

        def on_record(rec: RequestRecord) -> None:
            phase = phase_index(rec.send_time - t0[0], workload.bounds) + 1
            self.folder.append_request({"run": name, "steps": steps, "repeat": repeat, "phase": phase,
                                        **rec.to_json()})
            self.listener.request_finished(label, rec, phase)

        constraints = Constraints(max_requests=workload.max_requests(), max_duration_s=workload.total_s,
                                  max_failures=FAILURE_STOP)
        w = await measure_window(
            backend, config, self.prompts, workload.strategy(), constraints, warmup_requests=plan.warmup,
            warmup_concurrency=workload.first_concurrency(), warmup_timeout_s=self.timeouts.warmup_timeout_s,
            max_failure_rate=plan.max_failure_rate, on_record=on_record, on_start=on_start,
            boundaries_s=[end for _, end in workload.bounds], switches=True, batch_size_interval_s=None,
            warn=self.listener.warning)
        if w.stuck is not None:
            self._finish(ValidateRun(name, steps, repeat, started, "failed", w.stuck, stop_reason="warmup_timeout"))
            return
        result = w.result
        phases, overall = summarize_run(result.records, result.start_time, workload.bounds, plan.slo_ttft_ms,
                                        plan.slo_tpot_ms, [p.concurrency for p in workload.phases])
        groups = split_by_phase(result.records, result.start_time, workload.bounds)
        for i, d in enumerate(phases):
            self._annotate(d, backend, w.samples, i, groups[i], workload.phases[i].label)
        self._annotate(overall, backend, w.samples, None, result.records, "all", w.acceptance)
        if name in self.configs:
            self._check_schedule(backend, w.samples, phases, label, self.configs[name][1])
        self._client_load(overall, w, label)
        self._finish(ValidateRun(
            name, steps, repeat, started, w.status, w.error, phases, overall,
            switches_source=w.samples[0].switches_source, model=model, base_url=endpoint.base_url,
            stop_reason=result.stop_reason,
            t0=result.start_time,  # perf_counter s: requests.jsonl send_time - t0 gives the phase
            warmup={"requests": len(w.warmup), "failed": sum(not r.ok for r in w.warmup)}))

    def _check_schedule(self, backend: Backend, samples: list[Sample], phases: list[RunWindow],
                        label: str, config: str) -> None:
        """Per phase, whether the server followed the per-batch-size schedule of the config file ``config``
        (:func:`spectune.measure.schedule_check.check_schedule` at the phase's achieved concurrency): each phase's
        ``schedule_check`` (None when not checkable), and a warning naming the backend's remedy when it did not.
        Only a static per-batch-size schedule (vLLM's format) is checked: an adaptive policy's K varies by design."""
        try:
            schedule = load_config_file(config, strict=False) if config else None
        except UserError:
            schedule = None
        if not isinstance(schedule, VllmSchedule):
            return
        for i, d in enumerate(phases):
            before = samples[i].snap if i < len(samples) else None
            after = samples[i + 1].snap if i + 1 < len(samples) else None
            check = check_schedule(schedule, before, after, d.achieved_concurrency, d.output_tokens)
            d.schedule_check = check.to_json() if check is not None else None
            if check is not None and not check.followed:
                self.listener.warning(check.message(f"{label} phase {i + 1}", backend.schedule_setting()))

    def _client_load(self, overall: RunWindow, w: Window, label: str) -> None:
        """Add the load generator's own figures to the run's ``overall`` (``dispatch_delay_p90_ms``,
        ``client_cpu_share``, ``client_limited``) and warn when it limited the run."""
        overall.dispatch_delay_p90_ms = w.metrics["dispatch_delay_p90_ms"]
        overall.client_cpu_share = w.metrics["client_cpu_share"]
        overall.client_limited = w.client_limit is not None
        if w.client_limit is not None:
            self.listener.warning(f"{label}: {w.client_limit}; its latencies include the client's own queueing")

    def _annotate(self, d: RunWindow, backend: Backend, samples: list[Sample], phase: int | None,
                  records: list[RequestRecord], label: str, acc: Acceptance | None = None) -> None:
        """Add label, acceptance and switches of phase ``phase`` (0-based; None = the whole run, whose acceptance
        ``acc`` the window measured) to ``d``, from the boundary samples (``samples[i]`` is taken at the start of
        phase i; a run cut short has fewer)."""
        first, last = (0, len(self.plan.workload.phases)) if phase is None else (phase, phase + 1)
        before = samples[first] if first < len(samples) else None
        after = samples[last] if last < len(samples) else None
        if acc is None:
            acc = window_acceptance(backend, before.snap if before else None, after.snap if after else None, records)
        switches = None
        if before is not None and after is not None and before.switches is not None and after.switches is not None:
            switches = after.switches - before.switches
        d.label, d.acceptance_length, d.acceptance_length_source = label, acc.acceptance_length, acc.source
        d.num_steps_switches = switches

    def _finish(self, run: ValidateRun) -> None:
        run.finished = now_iso()
        self.runs.append(run.to_dict())
        self.meta["backend"] = self._describe()
        self.folder.write(self.meta)
        self.listener.run_finished(run)


async def execute(plan: ValidatePlan, backend_name: str, options: BackendOptions, output_dir: Path,
                  listener: ValidateListener | None = None, config_launch: str | None = None,
                  timeouts: ClientTimeouts | None = None, ray: ClusterOptions | None = None) -> ValidateOutcome:
    """Check everything, then run every static num_steps and the config under the workload, and rule.

    A config that runs the same rounds as a static num_steps K (:func:`spectune.validate.plan.static_equivalent`)
    is not run as a run of its own: K joins the static runs (``plan.config_static``) and the verdict asks whether
    another static beats it.

    A bake-off (``plan.bakeoff``: several configs) runs the same static runs once per repeat and each config as a
    run of its own (``config:NAME``, on a backend of its own made as the one config's is, logs under
    ``logs/config-NAME/``; a static config is stood for by its static run), then rules every config against the
    shared best static (:func:`spectune.validate.bakeoff.rule_bakeoff`). Not with ``ray``.

    Checks, in order, each a one-line UserError before anything runs or is written: the config file, the plan,
    ``--servers`` other than ``one`` with ``--port`` or Ray, the output folder, both backends' options (the config
    backend gets ``adaptive_config`` and, for ``launch``, ``config_launch`` as its template when given), Ray and a
    backend that launches its servers (with ``ray``), the dataset (and the trace's categories), both preflights
    (with ``ray``: inside each task, on its node).

    ``ray``: a :class:`spectune.sweep.distributed.RayOptions` to run every run as a Ray task, in parallel
    (:mod:`spectune.validate.distributed`; docs/distributed.md), or None.

    Raises:
        UserError: see above. asyncio.CancelledError: cancelled (validate.json then says ``interrupted``).
    """
    import spectune
    from spectune.measure.workload import arrange_prompts

    listener = listener or ValidateListener()
    timeouts = timeouts or ClientTimeouts()
    bakeoff = plan.bakeoff
    fmt, candidates = config_candidates(plan.config or bakeoff[0].path)
    same = None if bakeoff else static_equivalent(plan.config)
    if bakeoff:  # every static config's K joins the shared static runs
        plan = replace(plan, steps=tuple(sorted({*plan.steps, *(c.static[0] for c in bakeoff if c.static)})))
    elif same is not None:
        plan = replace(plan, config_static=same[0], steps=tuple(sorted({*plan.steps, same[0]})))
    plan.validate()
    timeouts.validate()
    if bakeoff and ray is not None:
        raise UserError("--ray validates one config at a time: drop --ray for a bake-off of several --config, or "
                        "validate each config on its own")
    if plan.servers != "one" and options.port is not None:
        raise UserError(f"--servers {plan.servers} holds several servers at once, each on a port of its own: omit "
                        "--port (free ports are picked)")
    if ray is not None and plan.servers != "one":
        raise UserError(f"--servers {plan.servers} holds every server on this machine, --ray runs each on a node of "
                        "its own: drop one of the two")
    folder = ValidateFolder(output_dir, render_markdown)
    folder.check()
    options = replace(options, max_concurrency=plan.workload.server_concurrency(), max_tokens=plan.max_tokens,
                      log_dir=folder.logs, adaptive_config=None)
    initial = max(candidates)
    # one static num_steps: the config run is a static server at K (llama.cpp settings with a draft-confidence cutoff
    # are not: their server reads the cutoff from the file, spectune.backends.llamacpp.backend)
    static_config = fmt in STATIC_FORMATS and same is not None
    adaptive_options = replace(options, adaptive_config=None if static_config or bakeoff else
                               str(Path(plan.config).resolve()),
                               log_dir=folder.logs / "config", launch=config_launch or options.launch)
    static, adaptive = make_backend(backend_name, options), make_backend(backend_name, adaptive_options)
    configs = {c.run: (make_backend(backend_name, replace(
        adaptive_options, adaptive_config=str(Path(c.path).resolve()), log_dir=folder.logs / c.run.replace(":", "-"))),
        c.path) for c in bakeoff if c.static is None}  # a bake-off's config runs, each as the one config's would be
    if ray is not None:
        ray.check_backend(static)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prompts = arrange_prompts(load_dataset(plan.dataset, plan.num_prompts, plan.seed), plan.workload.arrivals)
    for w in caught:
        listener.warning(str(w.message))
    preflight = [*await static.preflight(list(plan.steps)),
                 *(await adaptive.preflight([initial]) if same is None and not bakeoff else [])] if ray is None else []
    for c in bakeoff:
        if c.static is None:
            preflight += await configs[c.run][0].preflight([c.initial_steps])
    for message in preflight:
        listener.warning(message)
    meta = {"spectune_version": spectune.__version__, "created": now_iso(), "status": "running",
            "warnings": list(dict.fromkeys(preflight)),
            "plan": plan.to_json(), "config": {"path": plan.config, "format": fmt, "candidate_steps": list(candidates),
                                               "initial_steps": initial,
                                               "static_equivalent": None if same is None else
                                               {"steps": same[0], "reason": same[1]}},
            "backend": {"static": static.describe(), "config": adaptive.describe()}, "runs": [], "verdict": None,
            "client": timeouts.to_json(), **environment()}
    if bakeoff:  # the configs in the one config's place, each config run's backend in the config's
        meta = {("configs" if k == "config" else k): [c.to_json() for c in bakeoff] if k == "config" else v
                for k, v in meta.items()}
        meta["backend"] = {"static": static.describe(), "configs": {n: b.describe() for n, (b, _) in configs.items()}}

    prediction = None if bakeoff else (
        predict_for(plan, fmt, candidates) if static_config or fmt not in STATIC_FORMATS else None)
    if prediction is not None:
        meta["prediction"] = prediction
    folder.open()
    outcome = ValidateOutcome(folder.path, plan, meta["runs"])
    listener.started(plan, [n if plan.repeats == 1 else f"{n} #{r}" for n, _, r in plan.run_order(initial)])
    try:
        folder.write(meta)
        if ray is None:
            def another_static(name: str) -> Backend:  # servers held together: one backend per static run
                return make_backend(backend_name, replace(options, log_dir=folder.logs / name.replace(":", "-")))

            await Validation(plan, static, adaptive, folder, prompts, meta, listener, options.model,
                             options.api_key_env, initial, timeouts, another_static,
                             configs if bakeoff else None).run_all()
        else:
            await RayValidation(plan, backend_name, options, adaptive_options, folder, prompts, meta, listener,
                                initial, timeouts, ray, Validation).run_all()
        if bakeoff:
            outcome.verdict = rule_bakeoff(meta, request_objects(folder.path) or [])
            outcome.bakeoff = meta["bakeoff"]  # type: ignore[assignment]  # rule_bakeoff wrote it
        else:
            recorded = RecordedPrediction.from_json(prediction)
            outcome.verdict = rule(meta, request_objects(folder.path) or [],
                                   recorded.recommended if recorded is not None else None)
        ruled = ValidateDoc.from_json(meta)
        outcome.prediction = usable_prediction(meta)
        outcome.phase_check, outcome.instance_spread = ruled.phase_check, ruled.instance_spread
        meta.update(status="done", finished=now_iso())
    except asyncio.CancelledError:
        meta.update(status="interrupted", finished=now_iso())
        raise
    except Exception as err:
        meta.update(status="error", error=f"{type(err).__name__}: {err}", finished=now_iso())
        raise
    finally:
        try:
            await static.close()
            await adaptive.close()
            for backend, _ in configs.values():
                await backend.close()
        finally:
            folder.write(meta)
            folder.close()
    return outcome


def rule_again(output_dir: Path, config: str) -> tuple[Verdict, JsonObject | None, JsonObject | None,
                                                       JsonObject | None]:
    """Rule again on a finished validation without measuring: re-read ``validate.json`` and ``requests.jsonl`` in
    ``output_dir``, apply this version's verdict (with recommendation.json's primary recommendation beside
    ``config``, and whether ``config`` is a static num_steps: :func:`spectune.validate.plan.static_equivalent`),
    phase check and prediction comparison, and rewrite validate.json and validate.md (requests.jsonl untouched).

    Runs measured before the steady per-phase numbers existed get them from requests.jsonl first. A validation from
    before the A/A run, with one repeat, has no measured server-to-server spread: its intervals are widened by
    :data:`spectune.validate.repeats.DEFAULT_INSTANCE_BAND` and the verdict says so.

    Returns:
        the verdict, the prediction (with its comparison; None where validate.json has none), the phase check
        (validate.json's ``phase_check``) and the server-to-server spread (``instance_spread``).

    Raises:
        UserError: no finished validation in ``output_dir``; ``config`` is not a valid config file.
    """
    folder, meta = _read_validation(output_dir)
    doc = ValidateDoc.from_json(meta)
    if doc.configs:
        names = ", ".join(str(c.name) for c in doc.configs)
        raise UserError(f"{output_dir} holds a bake-off of configs {names}: pass each as --config NAME=PATH")
    stands_in = doc.plan.config_static is not None and any(r.run.startswith("static:") for r in doc.runs)
    if not stands_in and not doc.ran("config"):
        raise UserError(f"{output_dir}/validate.json has no config run: rule again only on a finished validation")
    same = static_equivalent(config)
    meta.setdefault("config", {})["static_equivalent"] = None if same is None else {"steps": same[0],
                                                                                     "reason": same[1]}
    requests = request_objects(folder.path) or []
    _resummarize(meta, requests)
    path = find_recommendation(config)
    recommendation = RecordedRecommendation.read(path) if path is not None else RecordedRecommendation()
    prediction = usable_prediction(meta)
    if prediction is not None:
        prediction["primary"] = recommendation.primary
        prediction.update(load_notes(recommendation.cells, doc.plan.workload))
    v = rule(meta, requests, recommendation.recommended)
    meta.update(ruled_again=now_iso())
    folder.write(meta)
    ruled = ValidateDoc.from_json(meta)
    return v, prediction, ruled.phase_check, ruled.instance_spread


def rule_again_bakeoff(output_dir: Path, names: list[str]) -> tuple[Verdict, JsonObject]:
    """:func:`rule_again` for a bake-off (validate.json with ``configs``): every config ruled again
    (:func:`spectune.validate.bakeoff.rule_bakeoff`) from the config files validate.json names, validate.json and
    validate.md rewritten. ``names``: the ``--config`` names given, which must be the bake-off's.

    Returns:
        the overall verdict and the rewritten validate.json (``bakeoff``, ``instance_spread``, ``plan``...).

    Raises:
        UserError: no finished validation in ``output_dir``; it is not a bake-off; ``names`` are not its configs'.
    """
    folder, meta = _read_validation(output_dir)
    recorded = [str(c.name) for c in ValidateDoc.from_json(meta).configs]
    if not recorded:
        raise UserError(f"{output_dir}/validate.json validated one config, not a bake-off: pass that one --config")
    if sorted(names) != sorted(recorded):
        raise UserError(f"{output_dir} holds a bake-off of configs {', '.join(recorded)}, not "
                        f"{', '.join(names)}: pass the same --config NAME=PATH values")
    requests = request_objects(folder.path) or []
    _resummarize(meta, requests)
    v = rule_bakeoff(meta, requests)
    meta.update(ruled_again=now_iso())
    folder.write(meta)
    return v, meta


def _read_validation(output_dir: Path) -> tuple[ValidateFolder, JsonObject]:
    """The folder and parsed validate.json of a finished validation. Raises UserError when there is none."""
    folder = ValidateFolder(Path(output_dir), render_markdown)
    try:
        meta = json.loads(folder.json_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"no validation to rule on in {output_dir} ({type(err).__name__}): pass the --output-dir "
                        "of a finished spectune validate") from None
    return folder, meta


def rule(meta: JsonObject, requests: list[JsonObject], primary: Primary | None) -> Verdict:
    """Rule on the finished runs in ``meta`` (validate.json), in place: the server-to-server spread of the overall
    throughput (``meta["instance_spread"]``, :func:`spectune.validate.repeats.overall_spread`), the verdict
    (``meta["verdict"]``, every interval with that spread in it; with ``meta["config"]["static_equivalent"]``
    the config is ruled as that static num_steps), each phase against its best static num_steps
    (``meta["phase_check"]``, :func:`spectune.validate.phase_check.phase_check`, each phase with its own spread)
    and, where validate.json has a prediction, measured beside predicted with the same spreads
    (``meta["prediction"]["comparison"]``). ``requests``: requests.jsonl objects (with chunk times); ``primary``:
    recommendation.json's primary recommendation beside the config, or None. Returns the verdict."""
    doc = ValidateDoc.from_json(meta)
    runs, plan = doc.runs, doc.plan
    combined = combine_repeats(runs)
    config_static = doc.config.static
    spread = overall_spread(runs, requests)
    if plan.servers == "kept":
        spread = replace(spread, kept=True)
    meta["instance_spread"] = spread.to_json()
    v = verdict(combined, plan.with_slo, plan.tolerance or 0.0,
                ratio=lambda a, b: throughput_ratio(runs, requests, a, b, spread=spread),
                recommended=primary, config_static=config_static,
                interval_source=spread.source(within=bool(requests)))
    meta["verdict"] = asdict(v)
    concurrencies = plan.workload.concurrencies
    spreads = phase_spreads(runs, requests, concurrencies)
    has_config = doc.ran("config")
    stand_in = "config" if has_config or config_static is None else f"static:{config_static[0]}"
    meta["phase_check"] = phase_check_json(phase_check(runs, requests, concurrencies=concurrencies,
                                                       config_run=stand_in, spreads=spreads))
    prediction = usable_prediction(meta)
    if prediction is not None and doc.prediction is not None:
        prediction["comparison"] = compare_prediction(
            doc.prediction, combined, spreads={"overall": spread, **{i + 1: sp for i, sp in enumerate(spreads)}})
    return v


def _resummarize(meta: JsonObject, requests: list[JsonObject]) -> None:
    """Add the steady per-phase numbers (``settle_s``, ``steady_output_throughput_tok_s``) to runs measured before
    they existed, from requests.jsonl (with chunk times) and each run's ``t0``; other numbers stay as measured."""
    doc = ValidateDoc.from_json(meta)
    bounds, concurrencies, runs = doc.plan.workload.bounds, doc.plan.workload.concurrencies, doc.runs
    for run in runs:
        if not run.ok or run.t0 is None or not bounds:
            continue
        records = [RequestRecord.from_json(q) for q in requests
                   if q.get("run") == run.run and q.get("repeat", 1) == run.repeat]
        fresh, _ = summarize_run(records, run.t0, bounds, concurrencies=concurrencies)
        for have, new in zip(run.phases, fresh):
            if not have.has("settle_s"):
                have.settle_s = new.settle_s
            if not have.has(STEADY):
                have.steady_output_throughput_tok_s = new.steady_output_throughput_tok_s
    meta["runs"] = [r.to_dict() for r in runs]
