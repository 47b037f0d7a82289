"""``spectune validate``: does a per-batch-size num_steps config beat every static num_steps under changing load?

The same time-varying workload (:mod:`spectune.workload`: same seeded prompts, same arrival schedule) runs once per
static num_steps K (``run`` ``static:K``, one backend, a server per K or one switched server) and once against the
config (``run`` ``config``: a second backend launched with ``BackendOptions.adaptive_config``, started at the
config's largest candidate step, which SGLang and the bundled engine take as the initial tier and vLLM as
``num_speculative_tokens``). Per run and per phase it reports output throughput, TPOT p50/p99, SLO attainment,
acceptance length and, where the server exposes them, num_steps switches; :func:`verdict` rules on the overall
numbers.

Per phase: requests belong to the phase they were sent in (latency, SLO attainment, request counts); output
throughput counts the tokens streamed inside the phase's window / its length; acceptance and switches are counter
deltas between snapshots taken at the phase boundaries (per-request data where the backend has it: SGLang).
Overall: the same over the scheduled window [0, total) (the drain after it is not counted in throughput).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Sequence

from backends.base import Acceptance, Backend, BackendOptions, BackendStartError
from loadgen.datasets import Prompt
from loadgen.errors import UserError
from loadgen.record import RequestRecord
from spectune.results import atomic_write, now_iso, point_status
from spectune.workload import Workload, phase_index, split_by_phase, summarize_run

FAILURE_STOP = 100
"""A run stops sending after this many failed requests (a broken server would otherwise spin until the end)."""
SWITCH_LOG_LINE = "Adaptive spec params updated"
"""What SGLang logs on every tier change (``adaptive_spec_params.py``, ``_apply_target_steps``)."""


def config_candidates(path: str) -> tuple[str, tuple[int, ...]]:
    """(format, candidate num_steps) of a config file: ``sglang-adaptive`` (union of the slots' candidate steps)
    or ``vllm-schedule`` (every K of the schedule).

    Raises:
        UserError: the file is missing or not a valid SGLang adaptive config / vLLM schedule
            (:func:`backends.adaptive.load_config_file`).
    """
    from backends.adaptive import AdaptiveConfig, load_config_file

    cfg = load_config_file(path)
    if isinstance(cfg, AdaptiveConfig):
        return "sglang-adaptive", cfg.candidate_steps
    return "vllm-schedule", tuple(sorted({r.k for r in cfg.ranges}))


@dataclass(frozen=True)
class ValidatePlan:
    """What a validation runs; recorded as ``plan`` in validate.json.

    Attributes:
        config: path of the SGLang adaptive config or vLLM schedule. steps: static num_steps to compare with.
        workload: the time-varying load. dataset, num_prompts, seed: the prompt sample. max_tokens, temperature,
            ignore_eos, api: every request. slo_ttft_ms, slo_tpot_ms: SLOs (ms) or None.
        warmup_requests: unrecorded requests before each run (None: min(first phase's concurrency, 4)).
        tolerance: the config passes at >= (1 - tolerance) x the best static's throughput (0..1).
        max_failure_rate: a run with a larger share of failed requests is ``failed``.
    """

    config: str
    steps: tuple[int, ...]
    workload: Workload
    dataset: str = "mt-bench"
    num_prompts: int = 80
    max_tokens: int = 256
    temperature: float = 0.0
    seed: int = 0
    ignore_eos: bool = False
    api: str = "chat"
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    warmup_requests: int | None = None
    tolerance: float = 0.0
    max_failure_rate: float = 0.1

    def validate(self) -> None:
        """Raises UserError naming the first bad value."""
        from spectune.sweep import SweepPlan

        SweepPlan(steps=self.steps or (0,), dataset=self.dataset, num_prompts=self.num_prompts,
                  max_tokens=self.max_tokens, temperature=self.temperature, api=self.api, slo_ttft_ms=self.slo_ttft_ms,
                  slo_tpot_ms=self.slo_tpot_ms, warmup_requests=self.warmup_requests,
                  max_failure_rate=self.max_failure_rate).validate()
        if not self.steps:
            raise UserError("no static num_steps to compare with: pass --steps, e.g. --steps 0,1,3")
        if not 0.0 <= self.tolerance < 1.0:
            raise UserError(f"--tolerance must be in 0..1 (0.02 = 2%), got {self.tolerance}")

    @property
    def warmup(self) -> int:
        """Warm-up requests before each run."""
        return self.warmup_requests if self.warmup_requests is not None else min(self.workload.first_concurrency(), 4)

    def to_json(self) -> dict[str, Any]:
        """The plan as a JSON object (the workload as :meth:`Workload.to_json`, without the trace itself)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["steps"], d["workload"] = list(self.steps), self.workload.to_json()
        return d


class ValidateListener:
    """Progress events of a validation (the CLI renders them). No-ops here."""

    def started(self, plan: ValidatePlan, runs: list[str]) -> None:
        """Before the first run: the run names in order."""

    def warning(self, message: str) -> None:
        """Something the user should know."""

    def server_starting(self, run: str) -> None:
        """The server of ``run`` is being started (or switched)."""

    def run_started(self, run: str, t0: float, total_s: float) -> None:
        """The measured load of ``run`` starts at ``t0`` (perf_counter s) for ``total_s`` s."""

    def request_finished(self, run: str, record: RequestRecord, phase: int) -> None:
        """A measured request of ``run`` finished; ``phase`` is 1-based."""

    def run_finished(self, result: dict[str, Any]) -> None:
        """A run is finished (its validate.json entry)."""


@dataclass
class ValidateOutcome:
    """What a validation left: the folder, the run results in order, the verdict (None when interrupted)."""

    folder: Path
    plan: ValidatePlan
    runs: list[dict[str, Any]] = field(default_factory=list)
    verdict: Verdict | None = None


class ValidateFolder:
    """``requests.jsonl`` (one flushed line per request), ``validate.json`` and ``validate.md`` (atomic), ``logs/``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.requests, self.json_path, self.md_path = (self.path / n for n in ("requests.jsonl", "validate.json",
                                                                               "validate.md"))
        self.logs = self.path / "logs"
        self._fh: Any = None

    def check(self) -> None:
        """Raises UserError when the folder already holds a validation (nothing measured is overwritten)."""
        if self.json_path.exists() or (self.requests.exists() and self.requests.stat().st_size > 0):
            raise UserError(f"{self.path} already holds a validation: pass a new --output-dir")

    def open(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.requests, "ab")

    def append_request(self, obj: dict[str, Any]) -> None:
        self._fh.write(json.dumps(obj).encode() + b"\n")
        self._fh.flush()

    def write(self, meta: dict[str, Any]) -> None:
        """Make the request records durable (fsync), then rewrite validate.json and validate.md atomically."""
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
        atomic_write(self.json_path, lambda fh: fh.write(json.dumps(meta, indent=2, default=str) + "\n"))
        atomic_write(self.md_path, lambda fh: fh.write(render_markdown(meta)))

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


@dataclass
class _Sample:
    snap: Any = None
    switches: float | None = None
    switches_source: str | None = None


async def read_switches(backend: Backend) -> tuple[float | None, str | None]:
    """Cumulative num_steps switches of the running server and where they came from, or (None, None).

    The bundled engine (and any server exposing it): the ``spectune:spec_num_steps_switches_total`` counter on
    /metrics. SGLang launched by spectune: the ``Adaptive spec params updated`` lines in its log (SGLang has no
    such metric). vLLM exposes none.
    """
    from backends.http import get
    from backends.prometheus import parse_metrics, sum_counter

    url = getattr(backend, "base_url", None)
    if url:
        reply = await get(url + "/metrics", 5.0, getattr(backend, "headers", None))
        if reply.status == 200:
            try:
                value = sum_counter(parse_metrics(reply.text), "spectune:spec_num_steps_switches")
            except ValueError:
                value = None
            if value is not None:
                return float(value), "spectune:spec_num_steps_switches_total"
    server = getattr(backend, "server", None)
    if backend.name == "sglang" and server is not None and Path(server.log_path).is_file():
        text = Path(server.log_path).read_text(encoding="utf-8", errors="replace")
        return float(text.count(SWITCH_LOG_LINE)), "sglang:server log"
    return None, None


class Validation:
    """Runs the static runs on ``static`` and the config run on ``adaptive`` (both preflighted), writing ``folder``."""

    def __init__(self, plan: ValidatePlan, static: Backend, adaptive: Backend, folder: ValidateFolder,
                 prompts: list[Prompt], meta: dict[str, Any], listener: ValidateListener, model: str | None,
                 api_key_env: str | None, initial_steps: int) -> None:
        self.plan, self.static, self.adaptive, self.folder, self.prompts = plan, static, adaptive, folder, prompts
        self.meta, self.listener, self.model, self.api_key_env = meta, listener, model, api_key_env
        self.initial_steps = initial_steps
        self.runs: list[dict[str, Any]] = meta["runs"]

    async def run_all(self) -> None:
        try:
            for k in self.plan.steps:
                await self._run(self.static, k, f"static:{k}")
        finally:
            await self.static.close()
        try:
            await self._run(self.adaptive, self.initial_steps, "config")
        finally:
            await self.adaptive.close()

    async def _sample(self, backend: Backend) -> _Sample:
        try:
            snap = await backend.snapshot()
        except Exception as err:  # noqa: BLE001 - a metrics page problem must not lose the run
            self.listener.warning(f"snapshot failed: {type(err).__name__}: {err}")
            snap = None
        return _Sample(snap, *await read_switches(backend))

    async def _boundaries(self, backend: Backend, started: asyncio.Event, t0: list[float],
                          samples: list[_Sample]) -> None:
        await started.wait()
        for _, end in self.plan.workload.bounds:
            await asyncio.sleep(max(0.0, t0[0] + end - time.perf_counter()))
            samples.append(await self._sample(backend))

    async def _run(self, backend: Backend, steps: int, name: str) -> None:
        from backends.http import auth_headers
        from loadgen import ClosedLoop, Constraints, StreamingClient, run_point
        from loadgen.runner import warmup_prompt
        from spectune.sweep import client_config, resolve_model

        plan, workload = self.plan, self.plan.workload
        base = {"run": name, "steps": steps, "started": now_iso()}
        self.listener.server_starting(name)
        try:
            endpoint = await backend.start(steps)
            model = endpoint.model or await resolve_model(endpoint.base_url, self.model,
                                                          auth_headers(self.api_key_env))
        except (BackendStartError, UserError) as err:
            lines = str(err).strip().splitlines() or [type(err).__name__]
            self._finish({**base, "status": "failed", "error": lines[0], "phases": [], "overall": {},
                          "log_tail": getattr(err, "log_tail", "")})
            return
        config = client_config(plan, backend, endpoint.base_url, model, self.api_key_env)
        t0: list[float] = []
        started = asyncio.Event()

        def on_start(t: float) -> None:
            t0.append(t)
            started.set()
            self.listener.run_started(name, t, workload.total_s)

        def on_record(rec: RequestRecord) -> None:
            phase = phase_index(rec.send_time - t0[0], workload.bounds) + 1
            self.folder.append_request({"run": name, "steps": steps, "phase": phase, **rec.to_json()})
            self.listener.request_finished(name, rec, phase)

        constraints = Constraints(max_requests=workload.max_requests(), max_duration_s=workload.total_s,
                                  max_failures=FAILURE_STOP)
        async with StreamingClient(config) as client:
            warm = [warmup_prompt(self.prompts[i % len(self.prompts)], i) for i in range(plan.warmup)]
            warmup = (await run_point(client, warm, ClosedLoop(min(len(warm), workload.first_concurrency())),
                                      Constraints(max_requests=len(warm)))).records if warm else []
            samples = [await self._sample(backend)]
            sampler = asyncio.ensure_future(self._boundaries(backend, started, t0, samples))
            try:
                result = await run_point(client, self.prompts, workload.strategy(on_start), constraints,
                                         on_record=on_record)
                if result.stop_reason != "max_failures":  # a broken run does not wait for its schedule's end
                    remaining = t0[0] + workload.total_s - time.perf_counter() + 5.0
                    await asyncio.wait([sampler], timeout=max(remaining, 0.1))
            finally:
                sampler.cancel()
        phases, overall = summarize_run(result.records, result.start_time, workload.bounds, plan.slo_ttft_ms,
                                        plan.slo_tpot_ms)
        groups = split_by_phase(result.records, result.start_time, workload.bounds)
        for i, d in enumerate(phases):
            self._annotate(d, backend, samples, i, groups[i], workload.phases[i].label)
        self._annotate(overall, backend, samples, None, result.records, "all")
        status, error = point_status(result.records, plan.max_failure_rate)
        self._finish({**base, "status": status, "error": error, "phases": phases, "overall": overall,
                      "switches_source": samples[0].switches_source, "model": model,
                      "base_url": endpoint.base_url, "stop_reason": result.stop_reason,
                      "t0": result.start_time,  # perf_counter s: requests.jsonl send_time - t0 gives the phase
                      "warmup": {"requests": len(warmup), "failed": sum(not r.ok for r in warmup)}})

    def _annotate(self, d: dict[str, Any], backend: Backend, samples: list[_Sample], phase: int | None,
                  records: list[RequestRecord], label: str) -> None:
        """Add label, acceptance and switches of phase ``phase`` (0-based; None = the whole run) to ``d``, from the
        boundary samples (``samples[i]`` is taken at the start of phase i; a run cut short has fewer)."""
        first, last = (0, len(self.plan.workload.phases)) if phase is None else (phase, phase + 1)
        before = samples[first] if first < len(samples) else None
        after = samples[last] if last < len(samples) else None
        try:
            acc = backend.acceptance(before.snap if before else None, after.snap if after else None, records)
        except Exception as err:  # noqa: BLE001 - an odd metrics page must not lose the run
            acc = Acceptance(None, source="none", warning=f"acceptance failed: {type(err).__name__}: {err}")
        switches = None
        if before is not None and after is not None and before.switches is not None and after.switches is not None:
            switches = after.switches - before.switches
        d.update(label=label, acceptance_length=acc.acceptance_length, acceptance_length_source=acc.source,
                 num_steps_switches=switches)

    def _finish(self, result: dict[str, Any]) -> None:
        result["finished"] = now_iso()
        self.runs.append(result)
        self.meta["backend"] = {"static": self.static.describe(), "config": self.adaptive.describe()}
        self.folder.write(self.meta)
        self.listener.run_finished(result)


async def execute(plan: ValidatePlan, backend_name: str, options: BackendOptions, output_dir: Path,
                  listener: ValidateListener | None = None, config_launch: str | None = None) -> ValidateOutcome:
    """Check everything, then run every static num_steps and the config under the workload, and rule.

    Checks, in order, each a one-line UserError before anything runs or is written: the config file, the plan,
    the output folder, both backends' options (the config backend gets ``adaptive_config`` and, for ``launch``,
    ``config_launch`` as its template when given), the dataset (and the trace's categories), both preflights.

    Raises:
        UserError: see above. asyncio.CancelledError: cancelled (validate.json then says ``interrupted``).
    """
    import warnings

    import spectune
    from backends import make_backend
    from loadgen.datasets import load_dataset
    from spectune.sweep import environment
    from spectune.workload import arrange_prompts

    listener = listener or ValidateListener()
    fmt, candidates = config_candidates(plan.config)
    plan.validate()
    folder = ValidateFolder(output_dir)
    folder.check()
    options = replace(options, max_concurrency=plan.workload.server_concurrency(), max_tokens=plan.max_tokens,
                      log_dir=folder.logs, adaptive_config=None)
    initial = max(candidates)
    adaptive_options = replace(options, adaptive_config=str(Path(plan.config).resolve()),
                               log_dir=folder.logs / "config", launch=config_launch or options.launch)
    static, adaptive = make_backend(backend_name, options), make_backend(backend_name, adaptive_options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prompts = arrange_prompts(load_dataset(plan.dataset, plan.num_prompts, plan.seed), plan.workload.arrivals)
    for w in caught:
        listener.warning(str(w.message))
    for message in [*await static.preflight(list(plan.steps)), *await adaptive.preflight([initial])]:
        listener.warning(message)
    meta = {"spectune_version": spectune.__version__, "created": now_iso(), "status": "running",
            "plan": plan.to_json(), "config": {"path": plan.config, "format": fmt, "candidate_steps": list(candidates),
                                               "initial_steps": initial},
            "backend": {"static": static.describe(), "config": adaptive.describe()}, "runs": [], "verdict": None,
            **environment()}
    folder.open()
    outcome = ValidateOutcome(folder.path, plan, meta["runs"])
    listener.started(plan, [*(f"static:{k}" for k in plan.steps), "config"])
    try:
        folder.write(meta)
        await Validation(plan, static, adaptive, folder, prompts, meta, listener, options.model,
                         options.api_key_env, initial).run_all()
        outcome.verdict = verdict(meta["runs"], plan.slo_ttft_ms is not None or plan.slo_tpot_ms is not None,
                                  plan.tolerance)
        meta.update(status="done", finished=now_iso(), verdict=asdict(outcome.verdict))
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
        finally:
            folder.write(meta)
            folder.close()
    return outcome


@dataclass
class Verdict:
    """The ruling on a validation.

    Attributes:
        passed: the config's overall output throughput >= (1 - tolerance) x the best static's and, with SLOs, its
            SLO attainment is no lower than that static's nor than any static at least as fast as the config
            (within the tolerance).
        line: one line starting with ``PASS`` or ``FAIL`` that says why.
        best_static: K of the static run the line names: the best static (highest overall output throughput;
            ties: smaller K), or the static that meets the SLOs more often.
        margin_pct: (config - that static) / that static x 100, overall output throughput (%); None if unknown.
    """

    passed: bool
    line: str
    best_static: int | None = None
    margin_pct: float | None = None


def verdict(runs: Sequence[dict[str, Any]], with_slo: bool, tolerance: float = 0.0) -> Verdict:
    """Rule on finished runs (validate.json ``runs`` entries: ``run``, ``steps``, ``status``, ``error`` and
    ``overall`` with ``output_throughput_tok_s`` and ``slo_attainment``); see :class:`Verdict`.

    A failed config run, or no successful static run, is a FAIL (nothing shows the config is safe).
    """
    config = next((r for r in runs if r.get("run") == "config"), None)
    if config is None or config.get("status") != "ok":
        why = (config or {}).get("error") or "it did not run"
        return Verdict(False, f"FAIL: the config run failed ({why})")
    statics = sorted((r for r in runs if r.get("run", "").startswith("static:") and r.get("status") == "ok"
                      and r["overall"].get("output_throughput_tok_s") is not None), key=lambda r: r["steps"])
    if not statics:
        return Verdict(False, "FAIL: no static num_steps run succeeded, so there is nothing to compare the config "
                              "with")
    best = max(statics, key=lambda r: r["overall"]["output_throughput_tok_s"])  # first max: the smaller K
    k, bt = best["steps"], best["overall"]["output_throughput_tok_s"]
    ct = config["overall"].get("output_throughput_tok_s") or 0.0
    margin = (ct - bt) / bt * 100.0 if bt > 0 else 0.0
    if ct < bt * (1.0 - tolerance):
        return Verdict(False, f"FAIL: static K={k} beats the config by {-margin:.1f}% in output throughput "
                              f"({bt:,.1f} vs {ct:,.1f} tok/s)", k, margin)
    ca, slo_note = config["overall"].get("slo_attainment"), ""
    if with_slo and ca is not None:
        # the best static, and every static at least as fast as the config (throughput ties are common in open loop)
        rivals = [r for r in statics if r is best or r["overall"]["output_throughput_tok_s"] >= ct * (1.0 - tolerance)]
        rivals = [r for r in rivals if r["overall"].get("slo_attainment") is not None]
        if rivals:
            top = max(rivals, key=lambda r: r["overall"]["slo_attainment"])  # first max: the smaller K
            ta = top["overall"]["slo_attainment"]
            if ca < ta:
                tm = (ct - top["overall"]["output_throughput_tok_s"]) / top["overall"]["output_throughput_tok_s"] * 100
                return Verdict(False, f"FAIL: static K={top['steps']} meets the SLOs more often than the config "
                                      f"({ta:.1%} vs {ca:.1%}, {(ta - ca) * 100:.1f} points) at {tm:+.1f}% "
                                      "throughput", top["steps"], tm)
            slo_note = f"; SLO attainment {ca:.1%} vs {ta:.1%} (K={top['steps']})"
    return Verdict(True, f"PASS: the config delivers {ct:,.1f} tok/s, {margin:+.1f}% vs the best static num_steps "
                         f"K={k} ({bt:,.1f} tok/s){slo_note}", k, margin)


def _f(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def row_cells(d: dict[str, Any]) -> list[str]:
    """Table cells of one run in one window: output tok/s, TPOT p50/p99 (ms), SLO attainment, acceptance length,
    num_steps switches, achieved concurrency, requests (failed)."""
    slo = d.get("slo_attainment")
    return [_f(d.get("output_throughput_tok_s"), ",.1f"), _f(d.get("tpot_p50_ms"), ".2f"),
            _f(d.get("tpot_p99_ms"), ".2f"), "-" if slo is None else f"{slo:.1%}",
            _f(d.get("acceptance_length"), ".2f"), _f(d.get("num_steps_switches"), ".0f"),
            _f(d.get("achieved_concurrency"), ".1f"), f"{d.get('num_requests', 0)} ({d.get('num_failed', 0)})"]


ROW_HEADERS = ("output tok/s", "TPOT p50 ms", "TPOT p99 ms", "SLO attainment", "acceptance length",
               "num_steps switches", "achieved concurrency", "requests (failed)")


def render_markdown(meta: dict[str, Any]) -> str:
    """validate.md: the verdict, an overall table and a table per phase (a row per run; ``*`` = best tok/s)."""
    plan, cfg, runs = meta.get("plan") or {}, meta.get("config") or {}, meta.get("runs") or []
    wl = plan.get("workload") or {}
    lines = ["# spectune validate", "",
             f"Config `{cfg.get('path')}` ({cfg.get('format')}, candidate steps "
             f"{', '.join(map(str, cfg.get('candidate_steps') or []))}) against static num_steps "
             f"{', '.join(map(str, plan.get('steps') or []))}; workload `{wl.get('name')}` "
             f"({len(wl.get('phases') or [])} phases, {_f(wl.get('total_s'), 'g')} s); dataset {plan.get('dataset')}, "
             f"max_tokens {plan.get('max_tokens')}, temperature {plan.get('temperature')}; "
             f"SLOs TTFT {plan.get('slo_ttft_ms') or '-'} ms, TPOT {plan.get('slo_tpot_ms') or '-'} ms.", ""]
    v = meta.get("verdict")
    lines += [f"**{v['line']}**" if v else f"Status: {meta.get('status')} (no verdict yet)", ""]

    def table(title: str, pick: Any) -> None:
        rows = [(r, pick(r)) for r in runs]
        best = max((d.get("output_throughput_tok_s") or 0.0 for r, d in rows if d and r.get("status") == "ok"),
                   default=None)
        lines.extend([f"## {title}", "", "| run | " + " | ".join(ROW_HEADERS) + " |",
                      "|" + " --- |" * (len(ROW_HEADERS) + 1)])
        for r, d in rows:
            if r.get("status") != "ok" and not d:
                lines.append(f"| {r['run']} | failed: {r.get('error') or ''} |" + " |" * (len(ROW_HEADERS) - 1))
                continue
            cells = row_cells(d or {})
            if best and d and d.get("output_throughput_tok_s") == best:
                cells[0] += " *"
            status = "" if r.get("status") == "ok" else " (failed)"
            lines.append(f"| {r['run']}{status} | " + " | ".join(cells) + " |")
        lines.append("")

    table("Overall", lambda r: r.get("overall"))
    for i, ph in enumerate(wl.get("phases") or []):
        title = f"Phase {ph['phase']}: {ph['label']} ({ph['start_s']:g}-{ph['end_s']:g} s)"
        table(title, lambda r, i=i: (r.get("phases") or [None] * (i + 1))[i] if len(r.get("phases") or []) > i
              else None)
    lines += ["Output tok/s counts the tokens streamed inside each window; TPOT, SLO attainment and requests are "
              "over the requests sent in it; acceptance length and switches are counter deltas over the window.", ""]
    return "\n".join(lines)
