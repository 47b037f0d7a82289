"""``spectune sweep``: measure every (num_steps, concurrency, repeat) point against a backend (docs/sweep.md).

Order: for each num_steps K (ascending) the backend starts a server once (``start(K)``), then every concurrency
(ascending) and, innermost, every repeat runs on it; ``stop()`` after the last point of K. One point:

1. ``start(K)`` again (returns the running server, or relaunches one that died);
2. warm-up: ``warmup_requests`` closed-loop requests on tagged prompts, not recorded;
3. ``snapshot()``, the measured requests (``ClosedLoop(concurrency)``, each record appended to requests.jsonl
   as it finishes), ``snapshot()``: acceptance is scoped to the measurement window;
4. metrics (:func:`loadgen.compute_metrics`), acceptance (``backend.acceptance``), per-category numbers and a
   status; the point is appended to points.jsonl and summary.csv is rewritten.

A point is ``failed`` when its server never came up (``BackendStartError``: every remaining point of that K),
when more than ``max_failure_rate`` of its requests failed, or when none produced output; it is never averaged.
Cancelling the sweep (Ctrl-C) drops the current point's partial records; finished points stay.
"""

from __future__ import annotations

import asyncio
import math
import os
import platform
import socket
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence, TypeVar

from backends import make_backend
from backends.base import Acceptance, Backend, BackendOptions, BackendStartError
from loadgen.datasets import Prompt
from loadgen.errors import UserError
from loadgen.record import RequestRecord
from loadgen.runner import warmup_prompt
from spectune.results import Key, ResultsFolder, failed_point, now_iso, per_category_points, point_status

__all__ = ["SweepPlan", "SweepListener", "SweepOutcome", "Sweep", "client_config", "execute", "parse_int_list",
           "resolve_model", "run_with_signals"]

T = TypeVar("T")


DEFAULT_STEPS = (0, 1, 2, 3, 5)
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16)
DEFAULT_NUM_PROMPTS = 80  # MT-Bench's size
REQUEST_CAP = 1024  # the default requests per point stop growing with concurrency here (unless num_prompts is larger)
DEFAULT_WARMUP_CAP = 4


def parse_int_list(text: str, what: str, minimum: int) -> list[int]:
    """Parse a comma list such as ``"0,1,2,3,5"`` into sorted, de-duplicated ints >= ``minimum``.

    Raises:
        UserError: an empty list or item, a non-integer, or a value below ``minimum`` (named, with the fix).
    """
    items = [t.strip() for t in (text or "").split(",")]
    example = "0,1,2,3,5" if minimum == 0 else "1,2,4,8,16"
    if not any(items) or not all(items):
        raise UserError(f"bad --{what} list {text!r}: write comma-separated integers, e.g. --{what} {example}")
    values = []
    for t in items:
        try:
            values.append(int(t))
        except ValueError:
            raise UserError(f"bad --{what} value {t!r} in {text!r}: use whole numbers, e.g. --{what} {example}"
                            ) from None
    for v in values:
        if v < minimum:
            kind = "negative" if minimum == 0 else "not positive"
            raise UserError(f"--{what} {v} is {kind}: every value must be >= {minimum} (e.g. --{what} {example})")
    return sorted(set(values))


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep measures; recorded as ``plan`` in sweep.json and compared by ``--resume``.

    Attributes:
        steps: num_steps K values (0 = no speculation), ascending. concurrency: closed-loop concurrencies
            (requests in flight), ascending. repeats: runs of every (K, concurrency) cell.
        dataset, num_prompts, seed: the prompt sample (:func:`loadgen.load_dataset`).
        max_tokens: output tokens per request. temperature: sampling temperature. ignore_eos: ask for max_tokens
            every time. api: ``chat`` or ``completions``.
        slo_ttft_ms, slo_tpot_ms: SLOs in ms for slo_attainment/goodput, or None.
        warmup_requests: unrecorded requests before each point; None = min(concurrency, 4).
        requests_per_point: measured requests per point; None = max(num_prompts, 4 * concurrency), at most
            max(num_prompts, 1024).
        duration_per_point_s: s; optional cap on a point's sending time.
        max_failure_rate: a point whose failed share exceeds this is ``failed`` (0..1).
    """

    steps: tuple[int, ...] = DEFAULT_STEPS
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    repeats: int = 1
    dataset: str = "mt-bench"
    num_prompts: int = DEFAULT_NUM_PROMPTS
    max_tokens: int = 256
    temperature: float = 0.0
    seed: int = 0
    ignore_eos: bool = False
    api: str = "chat"
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    warmup_requests: int | None = None
    requests_per_point: int | None = None
    duration_per_point_s: float | None = None
    max_failure_rate: float = 0.1

    def validate(self) -> None:
        """Raises UserError naming the first bad value (and how to fix it)."""
        checks = [
            (bool(self.steps) and min(self.steps) >= 0, "--steps needs num_steps values >= 0, e.g. 0,1,2,3,5"),
            (bool(self.concurrency) and min(self.concurrency) >= 1, "--concurrency needs values >= 1, e.g. 1,4,16"),
            (self.repeats >= 1, f"--repeats must be >= 1, got {self.repeats}"),
            (self.num_prompts >= 1, f"--num-prompts must be >= 1, got {self.num_prompts}"),
            (self.max_tokens >= 1, f"--max-tokens must be >= 1, got {self.max_tokens}"),
            (self.temperature >= 0, f"--temperature must be >= 0, got {self.temperature}"),
            (self.api in ("chat", "completions"), f"--api must be chat or completions, got {self.api!r}"),
            (self.slo_ttft_ms is None or self.slo_ttft_ms > 0, f"--slo-ttft-ms must be > 0, got {self.slo_ttft_ms}"),
            (self.slo_tpot_ms is None or self.slo_tpot_ms > 0, f"--slo-tpot-ms must be > 0, got {self.slo_tpot_ms}"),
            (self.warmup_requests is None or self.warmup_requests >= 0,
             f"--warmup must be >= 0, got {self.warmup_requests}"),
            (self.requests_per_point is None or self.requests_per_point >= 1,
             f"--requests-per-point must be >= 1, got {self.requests_per_point}"),
            (self.duration_per_point_s is None or self.duration_per_point_s > 0,
             f"--duration must be > 0 s, got {self.duration_per_point_s}"),
            (0.0 <= self.max_failure_rate <= 1.0, f"--max-failure-rate must be in 0..1, got {self.max_failure_rate}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)

    def to_json(self) -> dict[str, Any]:
        """The plan as a JSON object (lists for the tuples)."""
        d = asdict(self)
        d["steps"], d["concurrency"] = list(self.steps), list(self.concurrency)
        return d

    def points(self) -> list[Key]:
        """Every (steps, concurrency, repeat) in run order: for K, for concurrency, for repeat."""
        return [(k, c, r) for k in self.steps for c in self.concurrency for r in range(self.repeats)]

    def requests_for(self, concurrency: int) -> int:
        """Measured requests of a point: ``requests_per_point``, else max(num_prompts, 4 * concurrency) capped at
        max(num_prompts, 1024) (four closed-loop waves, so ramp-up and drain are a small part of the window)."""
        if self.requests_per_point is not None:
            return self.requests_per_point
        return min(max(self.num_prompts, 4 * concurrency), max(self.num_prompts, REQUEST_CAP))

    def warmup_for(self, concurrency: int) -> int:
        """Warm-up requests before a point: ``warmup_requests``, else min(concurrency, 4)."""
        return self.warmup_requests if self.warmup_requests is not None else min(concurrency, DEFAULT_WARMUP_CAP)

    def constraints(self, requests: int) -> Any:
        """Stop rules of a point of ``requests`` requests: that many, the duration cap, and an early stop once
        failures exceed ``max_failure_rate`` of them (floor(rate * requests) + 1 failures: the point is failed
        whatever happens next)."""
        from loadgen.constraints import Constraints

        return Constraints(max_requests=requests, max_duration_s=self.duration_per_point_s,
                           max_failures=math.floor(self.max_failure_rate * requests) + 1)


def environment() -> dict[str, Any]:
    """``host`` and ``versions`` for sweep.json (package versions read from metadata: nothing is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    versions = {n: ver(n) for n in ("spectune", "aiohttp", "numpy", "torch", "transformers")}
    versions["python"] = platform.python_version()
    host = {"hostname": socket.gethostname(), "platform": platform.platform(), "python": sys.version.split()[0],
            "cpus": os.cpu_count()}
    return {"host": host, "versions": versions}



class SweepListener:
    """Receives the sweep's progress events (the display renders them; tests record them). No-ops here."""

    def sweep_started(self, plan: SweepPlan, todo: list[Key], kept: list[dict[str, Any]]) -> None:
        """Before the first point: the points to run now and the finished points kept from before."""

    def warning(self, message: str) -> None:
        """Something the user should know (preflight warnings, a failed warm-up)."""

    def server_starting(self, steps: int) -> None:
        """``backend.start(steps)`` is about to be called for the first point of num_steps ``steps``."""

    def server_failed(self, steps: int, message: str, log_tail: str) -> None:
        """The server for ``steps`` did not come up: its remaining points fail."""

    def point_started(self, key: Key, planned: int) -> None:
        """Measurement of ``key`` (steps, concurrency, repeat) begins; ``planned`` requests at most."""

    def request_finished(self, key: Key, record: RequestRecord, done: int, planned: int) -> None:
        """A measured request of ``key`` finished (``done`` of ``planned``)."""

    def point_finished(self, point: dict[str, Any]) -> None:
        """A point is durable in points.jsonl (its object is passed)."""


@dataclass
class SweepOutcome:
    """What a sweep run left: every finished point (kept + new), how many ran now, and the signal that stopped it
    (``signal.SIGINT``/``SIGTERM`` value) or None when it ran to the end."""

    folder: Path
    plan: SweepPlan
    points: list[dict[str, Any]] = field(default_factory=list)
    ran: int = 0
    interrupted: int | None = None


async def resolve_model(base_url: str, preferred: str | None, headers: dict[str, str]) -> str:
    """The model name to send: ``preferred`` when ``GET /v1/models`` lists it (or lists nothing), else the only
    listed id (a server started with another served name), else ``preferred``, else the first listed id.

    Raises:
        UserError: no model list and no ``preferred`` name (the point fails with this message).
    """
    from backends.http import get

    reply = await get(base_url + "/v1/models", 10.0, headers)
    data = reply.json() if reply.status == 200 else None
    ids = [m.get("id") for m in (data.get("data") or [])] if isinstance(data, dict) else []
    ids = [i for i in ids if isinstance(i, str)]
    if preferred and (preferred in ids or len(ids) != 1):
        return preferred
    if ids:
        return ids[0]
    why = reply.error or f"HTTP {reply.status}"
    raise UserError(f"cannot read the model name from {base_url}/v1/models ({why}); pass --model")


class Sweep:
    """Runs the points of one sweep on an already-checked backend and an opened :class:`ResultsFolder`.

    Args:
        plan: what to measure. backend: the target (preflight done). folder: opened results folder.
        prompts: the dataset sample (request i of every point sends ``prompts[i % len]``).
        meta: the sweep.json object (its ``backend`` entry is refreshed after each start and point).
        listener: progress events. model: preferred model name (``--model``). api_key_env: API key variable.
    """

    def __init__(self, plan: SweepPlan, backend: Backend, folder: ResultsFolder, prompts: list[Prompt],
                 meta: dict[str, Any], listener: SweepListener | None = None, model: str | None = None,
                 api_key_env: str | None = "OPENAI_API_KEY") -> None:
        self.plan, self.backend, self.folder, self.prompts, self.meta = plan, backend, folder, prompts, meta
        self.listener = listener or SweepListener()
        self.model, self.api_key_env = model, api_key_env
        self.ran = 0

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
        from loadgen import ClosedLoop, Constraints, StreamingClient, compute_metrics, run_point

        steps, conc, rep = key
        plan, planned = self.plan, self.plan.requests_for(conc)
        started = now_iso()
        try:
            model = model or await resolve_model(base_url, self.model, auth_headers(self.api_key_env))
        except UserError as err:
            self._finish(failed_point(key, str(err), planned) | {"stop_reason": "no_model"})
            return
        config = client_config(plan, self.backend, base_url, model, self.api_key_env)
        done = 0

        def on_record(rec: RequestRecord) -> None:
            nonlocal done
            done += 1
            self.folder.append_request({"steps": steps, "concurrency": conc, "repeat": rep, **rec.to_json()})
            self.listener.request_finished(key, rec, done, planned)

        mark = self.folder.request_mark()
        try:
            async with StreamingClient(config) as client:
                warm = plan.warmup_for(conc)
                warmup = []
                if warm:
                    warm_prompts = [warmup_prompt(self.prompts[i % len(self.prompts)], i) for i in range(warm)]
                    warmup = (await run_point(client, warm_prompts, ClosedLoop(min(warm, conc)),
                                              Constraints(max_requests=warm))).records
                before = await self._snapshot()
                self.listener.point_started(key, planned)
                result = await run_point(client, self.prompts, ClosedLoop(conc), plan.constraints(planned),
                                         on_record=on_record)
                after = await self._snapshot()
        except BaseException:
            self.folder.truncate_requests(mark)  # an unfinished point leaves no records behind
            raise
        records = result.records
        acc = self._acceptance(before, after, records)
        metrics = compute_metrics(records, result.window_start, result.window_end, result.achieved_concurrency,
                                  plan.slo_ttft_ms, plan.slo_tpot_ms)
        metrics.update(acceptance_length=acc.acceptance_length, acceptance_rate=acc.acceptance_rate,
                       acceptance_length_source=acc.source)
        status, error = point_status(records, plan.max_failure_rate)
        warm_failed = sum(not r.ok for r in warmup)
        if warmup and warm_failed == len(warmup):
            self.listener.warning(f"K={steps} c={conc}: every warm-up request failed ({warmup[0].error})")
        self._finish({
            "steps": steps, "concurrency": conc, "repeat": rep, "status": status, "error": error,
            "metrics": metrics,
            "acceptance": {"per_position": acc.per_position, "num_drafts": acc.num_drafts, "warning": acc.warning},
            "per_category": per_category_points(records, result.duration_s, steps, self._ask_acceptance),
            "window": {"start_s": result.window_start, "end_s": result.window_end},
            "requests_planned": planned, "stop_reason": result.stop_reason,
            "warmup": {"requests": len(warmup), "failed": warm_failed},
            "model": model, "base_url": base_url, "started": started, "finished": now_iso(),
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


def client_config(plan: Any, backend: Backend, base_url: str, model: str | None, api_key_env: str | None) -> Any:
    """The :class:`loadgen.ClientConfig` of a measured run: ``plan``'s ``api``, ``max_tokens``, ``temperature`` and
    ``ignore_eos`` (a :class:`SweepPlan`, or any object with those fields) plus the backend's extra request fields."""
    from loadgen import ClientConfig

    extra = backend.request_extra()
    return ClientConfig(base_url, model=model, api=plan.api, max_tokens=plan.max_tokens,
                        temperature=plan.temperature, ignore_eos=plan.ignore_eos, extra_body=extra or None,
                        api_key_env=api_key_env)


async def execute(plan: SweepPlan, backend_name: str, options: BackendOptions, output_dir: Path,
                  resume: bool = False, retry_failed: bool = False,
                  listener: SweepListener | None = None) -> SweepOutcome:
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
    plan.validate()
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
        folder.open(meta, kept)
        listener.sweep_started(plan, todo, kept)
        sweep = Sweep(plan, backend, folder, prompts, meta, listener, options.model, options.api_key_env)
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


def run_with_signals(make: Callable[[], Awaitable[T]]) -> tuple[T | None, int | None]:
    """Run the coroutine ``make()`` in a new event loop (main thread); SIGINT/SIGTERM cancel it cleanly.

    Returns ``(result, None)`` when it finished, or ``(None, signal number)`` when a signal cancelled it. A second
    signal raises KeyboardInterrupt at once (launched servers are then killed at interpreter exit by
    ``backends.process``).
    """
    import signal

    async def main() -> tuple[T | None, int | None]:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(make())
        got: list[int] = []

        def on_signal(signum: int) -> None:
            if got:
                raise KeyboardInterrupt
            got.append(signum)
            task.cancel()

        handled = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, on_signal, sig)
                handled.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signal support
                pass
        try:
            return await task, None
        except asyncio.CancelledError:
            if not got:
                raise
            return None, got[0]
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)

    return asyncio.run(main())


def run_blocking(plan: SweepPlan, backend_name: str, options: BackendOptions, output_dir: Path,
                 resume: bool = False, retry_failed: bool = False,
                 listener: SweepListener | None = None) -> SweepOutcome:
    """Run :func:`execute` under :func:`run_with_signals`: SIGINT/SIGTERM cancel it cleanly (the current point is
    dropped, finished points stay, servers are stopped) and the outcome's ``interrupted`` holds the signal number.

    Raises:
        UserError: from :func:`execute`.
    """
    outcome, sig = run_with_signals(
        lambda: execute(plan, backend_name, options, output_dir, resume, retry_failed, listener))
    if sig is not None:
        return SweepOutcome(Path(output_dir), plan, ResultsFolder(output_dir).read_points(), 0, sig)
    assert outcome is not None
    return outcome
