"""``spectune validate --ray ADDRESS|auto`` (docs/distributed.md): every run of a validation (each static num_steps
and the config, each repeat) as one Ray task, all submitted at once.

A run is what a serial validation does for it (:meth:`spectune.validate.run.Validation.run_one`): a server started
afresh (as every repeat of a serial validation starts its servers afresh), the workload sent by the load generator
running in the same task, beside its server (requests to loopback, never across the network), the run's numbers,
the server stopped. Each task lands on a node with the resources of one server (``--ray-resources``), so as many
runs go on at once as the cluster has room for, and Ray queues the rest.

The task side (:func:`run_events`, a Ray streaming generator through
:func:`spectune.measure.ray_cluster.task_events`) yields:

- ``{"kind": "node", ...}`` first (where it runs);
- ``{"kind": "server_starting"}``, ``{"kind": "run_started", "total_s"}``, ``{"kind": "progress", "done_s",
  "phase"}`` (at most every :data:`PROGRESS_EVERY_S` s), ``{"kind": "warning", "message"}``: progress;
- ``{"kind": "run", "run", "requests"}``: the run's validate.json entry with its request objects (requests.jsonl
  form); a run cut short sends nothing;
- ``{"kind": "log", "name", "text"}``: each server log; ``{"kind": "done", "backend"}``: the backend's description
  (its launches), last.

The driver (:class:`RayValidation`) writes the one validate folder as runs arrive: requests.jsonl, validate.json
with its ``runs`` in the serial run order (:meth:`~spectune.validate.plan.ValidatePlan.run_order`) whatever order
they finish in, each with the ``node`` it ran on, and the servers' logs (``logs/<name>@<node>.log``, the config's
under ``logs/config/``). The verdict is then ruled exactly as for a serial validation. A lost task (its node died)
is submitted again, up to ``max_attempts`` times, then the run is written as failed (``stop_reason``
``node_lost``); a :class:`UserError` on a node stops the validation naming the node; cancelling (Ctrl-C) cancels
every task and waits for its server to stop (:func:`spectune.measure.ray_cluster.stream_task`).

The config file is sent with each config run and written into the task's own temporary folder (a node need not
share the driver's files), so the config run's launch command names that copy.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Callable, Iterator, Protocol, TypedDict

from spectune.backends.base import Backend
from spectune.backends.options import BackendOptions
from spectune.loadgen.datasets import Prompt
from spectune.core.json_types import JsonObject
from spectune.loadgen.record import RequestRecord
from spectune.measure.load_settings import ClientTimeouts
from spectune.measure.node_progress import NodeBoard, NodeTask
from spectune.measure.ray_cluster import (Event, LostTask, NodeRef, TaskSubmitter, append_node_log, connect, hosts,
                                          import_ray, run_together, stream_task, task_events, task_options, where)
from spectune.results.folder import ValidateFolder
from spectune.results.schema import now_iso
from spectune.results.validate_run import ValidateRun
from spectune.validate.plan import ValidateListener, ValidatePlan

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["RayValidation", "run_events", "PROGRESS_EVERY_S"]

#: s between two progress events of a run (the per-node bars)
PROGRESS_EVERY_S = 1.0


class ClusterOptions(Protocol):
    """What a distributed validation reads of ``--ray``'s options (:class:`spectune.sweep.distributed.RayOptions`;
    the sweep package sits above this one, so a protocol)."""

    address: str
    resources: dict[str, float]
    max_attempts: int


class RunMeasurer(Protocol):
    """What a task uses of the serial validation (:class:`spectune.validate.run.Validation`, whose module imports
    this one: a protocol keeps the import one way): its constructor, called as ``runner(plan, static, adaptive,
    folder, prompts, meta, listener, model, api_key_env, initial, timeouts)``, and one run."""

    async def run_one(self, backend: Backend, steps: int, name: str, repeat: int) -> None: ...


class RunPayload(TypedDict):
    """What a run's task is given (:func:`run_events` describes each key; built by :meth:`RayValidation._payload`)."""

    plan: ValidatePlan
    backend: str
    options: BackendOptions
    run: tuple[str, int, int]  # (name, num_steps, repeat)
    prompts: list[Prompt]
    timeouts: ClientTimeouts
    config_text: str | None  # the config file (config runs of an adaptive config), else None
    config_name: str | None
    runner: Callable[..., RunMeasurer]


class RunEvent(Event, total=False):
    """One event of a run's task (module docstring): the shared kinds (:class:`Event`) and a run's own."""

    total_s: float  # run_started
    done_s: float  # progress
    phase: int  # progress (1-based)
    run: JsonObject  # run: its validate.json entry
    requests: list[JsonObject]  # run: its request objects (requests.jsonl form)
    backend: JsonObject  # done: the backend's description


class _BarUpdate(TypedDict, total=False):
    """What a run's event changes in its row of the per-node progress (:meth:`NodeBoard.update`)."""

    done: float
    current: str


# -- the task side ---------------------------------------------------------------------------------------------------
class _RunFolder:
    """What :class:`spectune.validate.run.Validation` writes into, inside a task: the run's request objects (kept
    for the ``run`` event); validate.json is the driver's."""

    def __init__(self) -> None:
        self.requests: list[JsonObject] = []

    def append_request(self, obj: JsonObject) -> None:
        """Keep one measured request object."""
        self.requests.append(obj)

    def write(self, meta: JsonObject) -> None:
        """Nothing to write inside a task."""


class _Events(ValidateListener):
    """The run's progress as event dicts (requests as at most one progress event per :data:`PROGRESS_EVERY_S`)."""

    def __init__(self, emit: Callable[[RunEvent], None], folder: _RunFolder) -> None:
        self.emit, self.folder = emit, folder
        self.t0 = self.last = 0.0

    def warning(self, message: str) -> None:
        self.emit({"kind": "warning", "message": message})

    def server_starting(self, run: str) -> None:
        self.emit({"kind": "server_starting"})

    def run_started(self, run: str, t0: float, total_s: float) -> None:
        self.t0 = self.last = t0
        self.emit({"kind": "run_started", "total_s": total_s})

    def request_finished(self, run: str, record: RequestRecord, phase: int) -> None:
        now = time.perf_counter()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            self.emit({"kind": "progress", "done_s": now - self.t0, "phase": phase})

    def run_finished(self, result: ValidateRun) -> None:
        self.emit({"kind": "run", "run": result.to_dict(), "requests": self.folder.requests})


async def _measure(payload: RunPayload, emit: Callable[[RunEvent], None]) -> None:
    """Build the run's backend on this node, check it, measure the run, stop its server; emit events on the way."""
    from spectune.backends import make_backend

    runner = payload["runner"]  # spectune.validate.run.Validation
    name, steps, repeat = payload["run"]
    plan: ValidatePlan = payload["plan"]
    folder = _RunFolder()
    events = _Events(emit, folder)
    with tempfile.TemporaryDirectory(prefix="spectune-run-") as tmp:
        options: BackendOptions = replace(payload["options"], log_dir=Path(tmp) / "logs")
        if payload.get("config_text") is not None:  # the config file travels with the task
            copy = Path(tmp) / payload["config_name"]
            copy.write_text(payload["config_text"], encoding="utf-8")
            options = replace(options, adaptive_config=str(copy))
            plan = replace(plan, config=str(copy))  # the config run's schedule check reads it
        backend = make_backend(payload["backend"], options)
        validation = runner(plan, backend, backend, folder, payload["prompts"],  # type: ignore[arg-type]
                            {"runs": []}, events, options.model, options.api_key_env, steps, payload["timeouts"])
        try:
            for warning in await backend.preflight([steps]):
                events.warning(warning)
            await validation.run_one(backend, steps, name, repeat)
        finally:
            try:
                await backend.stop()
            finally:
                await backend.close()
                for log in sorted((Path(tmp) / "logs").glob("*.log")):
                    emit({"kind": "log", "name": log.name, "text": log.read_text(encoding="utf-8", errors="replace")})
        emit({"kind": "done", "backend": backend.describe()})


def run_events(payload: RunPayload) -> Iterator[Event]:
    """Measure one validate run on this node and yield its events (module docstring).

    Args:
        payload: a :class:`RunPayload`, ``{"plan": ValidatePlan, "backend": name, "options": BackendOptions (the
            config run's carry ``adaptive_config``), "run": (name, num_steps, repeat), "prompts": [Prompt] (arranged
            for the workload), "timeouts": ClientTimeouts, "config_text", "config_name": the config file (config
            runs of an adaptive config) or None, "runner": the serial validation's class
            (:class:`spectune.validate.run.Validation`, which imports this module)}``.

    Raises:
        UserError: a configuration problem (from ``make_backend`` or ``preflight``).
        KeyboardInterrupt: the task was cancelled (after its server was stopped).
    """
    yield from task_events(lambda emit: _measure(payload, emit))


# -- the driver ------------------------------------------------------------------------------------------------------
class RayValidation:
    """Runs every run of a validation as a Ray task (module docstring); the same surface as
    :class:`spectune.validate.run.Validation` for :func:`spectune.validate.run.execute` (``run_all``).

    Args:
        plan, folder, prompts, meta, listener, timeouts: as for the serial validation (``meta["runs"]`` is filled
            in place, in run order).
        backend_name: the backend, built inside each task from ``static_options`` (static runs) or
            ``config_options`` (the config run). initial: the config run's num_steps.
        ray_options: the cluster and the resources of one server (``address``, ``resources``, ``max_attempts``:
            :class:`spectune.sweep.distributed.RayOptions`).
        runner: the serial validation's class (:class:`spectune.validate.run.Validation`), whose ``run_one`` each
            task runs; passed in by :func:`spectune.validate.run.execute`, so this module does not import it back.
    """

    def __init__(self, plan: ValidatePlan, backend_name: str, static_options: BackendOptions,
                 config_options: BackendOptions, folder: ValidateFolder, prompts: list[Prompt],
                 meta: JsonObject, listener: ValidateListener, initial: int, timeouts: ClientTimeouts,
                 ray_options: ClusterOptions, runner: Callable[..., RunMeasurer]) -> None:
        self.plan, self.backend_name, self.folder, self.prompts = plan, backend_name, folder, prompts
        self.runner = runner
        self.static_options, self.config_options = static_options, config_options
        self.meta, self.listener, self.initial, self.timeouts = meta, listener, initial, timeouts
        self.ray_options = ray_options
        self.runs: list[JsonObject] = meta["runs"]
        self.order = plan.run_order(initial)
        self.finished: dict[int, JsonObject] = {}  # position in the run order -> its validate.json entry
        self.board = NodeBoard()
        self._ray: ModuleType | None = None
        self._remote: TaskSubmitter | None = None

    async def run_all(self) -> None:
        """Every run of the plan's run order, one task each, all submitted at once (Ray queues what the cluster
        cannot place yet).

        Raises:
            UserError: no node has the resources of one server; a task's configuration problem (named with its
                node). asyncio.CancelledError: cancelled (every task cancelled and waited for first).
        """
        ray = self._ray = import_ray()
        self.meta["ray"] = {"address": self.ray_options.address, "resources": self.ray_options.resources}
        connected = connect(ray, self.ray_options.address)
        t0 = time.perf_counter()
        try:
            self._remote = ray.remote(run_events).options(num_returns="streaming", max_retries=0,
                                                           **task_options(self.ray_options.resources))
            self.meta["ray"]["nodes_available"] = len(hosts(ray, self.ray_options.resources))
            self.folder.write(self.meta)
            await run_together([self._run(i) for i in range(len(self.order))])
        finally:
            self.meta["ray"]["wall_s"] = time.perf_counter() - t0
            if connected:
                ray.shutdown()

    def _label(self, i: int) -> str:
        name, _, repeat = self.order[i]
        return name if self.plan.repeats == 1 else f"{name} #{repeat}"

    def _payload(self, i: int) -> RunPayload:
        name, steps, repeat = self.order[i]
        options = self.config_options if name == "config" else self.static_options
        payload = {"plan": self.plan, "backend": self.backend_name, "options": replace(options),
                   "run": (name, steps, repeat), "prompts": self.prompts, "timeouts": self.timeouts,
                   "config_text": None, "config_name": None, "runner": self.runner}
        if options.adaptive_config:
            path = Path(options.adaptive_config)
            payload.update(config_text=path.read_text(encoding="utf-8"), config_name=path.name)
        return payload

    async def _run(self, i: int) -> None:
        """One run, submitted again when its task is lost; a failed run after ``max_attempts`` losses."""
        name, steps, repeat = self.order[i]
        started = now_iso()
        lost: LostTask | None = None
        attempts = self.ray_options.max_attempts
        for attempt in range(1, attempts + 1):
            lost = await self._stream(i)
            if lost is None:
                return
            again = attempt < attempts
            self.listener.warning(f"{self._label(i)} lost on {lost['where']} ({lost['error']}); "
                                  + ("running it again on another node" if again else
                                     f"failed after {attempt} attempts"))
            self.meta.setdefault("lost_runs", []).append({"run": name, "repeat": repeat, "node": lost["node"],
                                                          "error": lost["error"]})
        run = ValidateRun(name, steps, repeat, started, "failed", f"its node was lost ({lost['error']})"
                          if lost else "its node was lost", stop_reason="node_lost")
        run.finished = now_iso()
        self._finish(i, run.to_dict() | {"node": lost.get("node") if lost else None}, [])

    async def _stream(self, i: int) -> LostTask | None:
        """Submit run ``i``'s task and handle its events until it ends; what was lost, or None."""
        name = self.order[i][0]
        label = self._label(i)
        phases = len(self.plan.workload.phases)
        bar: list[NodeTask] = []

        def progress(**kw: Unpack[_BarUpdate]) -> None:
            if bar:
                self.listener.node_progress(self.board.update(bar[0], **kw))

        def on_event(event: RunEvent, node: NodeRef | None) -> None:
            kind = event.get("kind")
            if kind == "node":
                bar.append(self.board.start(node or {}, label, self.plan.workload.total_s, "s"))
                self.listener.node_progress(bar[0])
            elif kind == "server_starting":
                progress(done=0.0, current="starting the server")
            elif kind == "run_started":
                progress(done=0.0, current=f"phase 1/{phases}")
            elif kind == "progress":
                progress(done=float(event["done_s"]), current=f"phase {event['phase']}/{phases}")
            elif kind == "warning":
                message = f"{where(node)}: {event['message']}"
                warnings = self.meta.setdefault("warnings", [])
                if event["message"] not in warnings:
                    warnings.append(event["message"])
                self.listener.warning(message)
            elif kind == "run":
                self._finish(i, {**event["run"], "node": node}, event.get("requests") or [])
            elif kind == "log":
                self._log(event, node, name == "config")
            elif kind == "done":
                self._backend(event.get("backend"), "config" if name == "config" else "static")

        try:
            return await stream_task(self._ray, self._remote, self._payload(i), on_event, label)
        finally:
            if bar:
                self.listener.node_progress(self.board.end(bar[0]))

    def _finish(self, i: int, result: JsonObject, requests: list[JsonObject]) -> None:
        """A finished run: its requests appended to requests.jsonl, its entry put in run order into validate.json
        (rewritten), the listener told."""
        for obj in requests:
            self.folder.append_request(obj)
        self.finished[i] = result
        self.runs[:] = [self.finished[j] for j in sorted(self.finished)]
        self.folder.write(self.meta)
        self.listener.run_finished(ValidateRun.from_dict(result))

    def _backend(self, desc: JsonObject | None, side: str) -> None:
        """validate.json ``backend.<side>``: the task's description, every task's launches together."""
        if not isinstance(desc, dict):
            return
        backends = self.meta.setdefault("backend", {})
        before = list((backends.get(side) or {}).get("launches") or [])
        backends[side] = {**desc, "launches": before + list(desc.get("launches") or [])}

    def _log(self, event: RunEvent, node: NodeRef | None, config: bool) -> None:
        """A server's log from a task, appended to logs/ (the config run's to logs/config/;
        :func:`spectune.measure.ray_cluster.append_node_log`)."""
        append_node_log(self.folder.logs / "config" if config else self.folder.logs, event, node)
