"""The worker side of a distributed sweep (docs/distributed.md): one num_steps block measured inside one Ray task.

:func:`block_events` is the body of the Ray task that :mod:`spectune.sweep.distributed` submits (a Ray streaming
generator: every ``yield`` reaches the driver before the task ends). It builds the backend on the node the task
landed on, checks it (``preflight``), then runs :meth:`spectune.sweep.run.Sweep.measure_block`: the server for the
block's num_steps is started on this node, the load generator runs here beside it (requests go to loopback, never
across the network, so a point is measured exactly as on one machine), and the server is stopped at the end. What
the sweep would write into the results folder is yielded instead, one event (a plain dict) at a time:

- ``{"kind": "node", "node_id", "ip", "hostname", "pid"}``: first, where the block runs;
- ``{"kind": "server_starting", "steps"}``, ``{"kind": "server_failed", "steps", "message", "log_tail"}``,
  ``{"kind": "warning", "message"}``, ``{"kind": "point_started", "key", "planned"}``: progress;
- ``{"kind": "point", "point", "requests"}``: a finished point (its points.jsonl object) with its request objects
  (requests.jsonl form), yielded once the point is complete (a point cut short leaves nothing);
- ``{"kind": "drift", "check", "requests"}``: the block's drift check with the re-measurement's requests;
- ``{"kind": "log", "name", "text"}``: each launched server's log file (from a folder local to the task);
- ``{"kind": "done", "cost", "backend"}``: last; the block's measuring cost and the backend's description.

The sweep runs on an event loop in a thread of the task; the task's own thread hands its events on
(:func:`spectune.measure.ray_cluster.task_events`). A cancelled task (``ray.cancel``: KeyboardInterrupt in the
task) or a closed generator cancels the sweep, whose ``finally`` stops the server, and waits for that before it
returns. A :class:`UserError` (a configuration problem: a missing
program, a bad template) ends the task with that error, which the driver re-raises.

Ray is not imported here: the driver wraps :func:`block_events` with ``ray.remote``.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence, TypedDict

from spectune.core.json_types import JsonObject
from spectune.loadgen.record import RequestRecord
from spectune.measure.ray_cluster import Event, task_events
from spectune.results.point import SweepPoint, as_points
from spectune.results.schema import Key, PointKey
from spectune.results.sweep_meta import SweepMeta
from spectune.sweep.plan import SweepListener, SweepPlan

if TYPE_CHECKING:
    from typing_extensions import NotRequired

    from spectune.backends.options import BackendOptions
    from spectune.loadgen.datasets import Prompt
    from spectune.measure.load_settings import ClientTimeouts
    from spectune.sweep.drift import DriftCheck

__all__ = ["block_events", "BlockFolder"]


class BlockPayload(TypedDict):
    """What a block task is given (:func:`block_events` describes each key; built by
    :meth:`spectune.sweep.distributed.RaySweep._payload`)."""

    plan: SweepPlan
    backend: str
    options: BackendOptions
    keys: list[list[int]]  # (steps, concurrency, repeat) of one num_steps
    prompts: list[Prompt]
    timeouts: ClientTimeouts
    points: list[SweepPoint]  # the finished points known to the driver
    goals: NotRequired[dict[Key, str]]  # a guided round's keys -> their window goal


class BlockEvent(Event, total=False):
    """One event of a block task (module docstring): the shared kinds (:class:`Event`) and a block's own."""

    steps: int  # server_starting, server_failed
    log_tail: str  # server_failed
    key: list[int]  # point_started: (steps, concurrency, repeat)
    planned: int  # point_started
    point: JsonObject  # point: its points.jsonl object
    requests: list[JsonObject]  # point, drift: request objects (requests.jsonl form)
    check: DriftCheck  # drift: the drift check (spectune.sweep.drift.drift_check)
    cost: dict[str, float]  # done: the block's measuring cost
    backend: JsonObject  # done: the backend's description


class BlockFolder:
    """What :class:`spectune.sweep.run.Sweep` writes into, inside a task: the same methods as
    :class:`spectune.results.folder.SweepFolder` that a block uses, holding the block's points (for the drift
    reference and the early-stop rule) and handing each finished point, with its request objects, to ``emit``.

    Args:
        emit: called with each event dict (thread-safe; see :func:`block_events`).
        points: finished points known before the block (a resumed sweep's, the early-stop rule's references).
    """

    def __init__(self, emit: Callable[[BlockEvent], None],
                 points: Sequence[SweepPoint | JsonObject] | None = None) -> None:
        self.emit = emit
        self.points: list[SweepPoint] = as_points(points or [])
        self.predicted: list[JsonObject] = []
        self._requests: list[JsonObject] = []  # the current point's request objects
        self._done: list[JsonObject] = []  # request objects of this block's finished points
        self._drift: list[JsonObject] = []
        self.meta = SweepMeta()  # sweep.json's record, which the block's Sweep keeps up to date

    def request_mark(self) -> int:
        """Where the current point's request objects start (see :meth:`truncate_requests`)."""
        return len(self._requests)

    def truncate_requests(self, mark: int) -> None:
        """Drop the request objects after ``mark`` (a point that did not finish)."""
        del self._requests[mark:]

    def append_request(self, obj: JsonObject) -> None:
        """Hold one measured request object until its point finishes."""
        self._requests.append(obj)

    def append_drift_request(self, obj: JsonObject) -> None:
        """Hold one request object of the drift re-measurement (sent with the drift check)."""
        self._drift.append(obj)

    def take_drift_requests(self) -> list[JsonObject]:
        """The drift re-measurement's request objects held so far (and forget them)."""
        out, self._drift = self._drift, []
        return out

    def append_point(self, point: SweepPoint | JsonObject) -> None:
        """A finished point: kept as a record, emitted as its points.jsonl object with its request objects."""
        record = as_points([point])[0]
        self.points.append(record)
        self._done += self._requests
        self.emit({"kind": "point", "point": record.to_dict(), "requests": self._requests})
        self._requests = []

    def read_requests(self) -> list[JsonObject]:
        """The request objects of this block's finished points."""
        return list(self._done)

    def write_meta(self, meta: SweepMeta) -> None:
        """Keep the sweep's meta (its ``backend`` and ``cost`` are sent with the ``done`` event)."""
        self.meta = meta

    def write_summary(self, points: object = None) -> None:
        """Nothing to write inside a task (the driver writes summary.csv)."""


class _Events(SweepListener):
    """The sweep's progress events as event dicts (request-level events stay in the task)."""

    def __init__(self, emit: Callable[[BlockEvent], None], folder: BlockFolder) -> None:
        self.emit, self.folder = emit, folder

    def warning(self, message: str) -> None:
        self.emit({"kind": "warning", "message": message})

    def server_starting(self, steps: int) -> None:
        self.emit({"kind": "server_starting", "steps": steps})

    def server_failed(self, steps: int, message: str, log_tail: str) -> None:
        self.emit({"kind": "server_failed", "steps": steps, "message": message, "log_tail": log_tail})

    def point_started(self, key: Key, planned: int) -> None:
        self.emit({"kind": "point_started", "key": list(key), "planned": planned})

    def request_finished(self, key: Key, record: RequestRecord, done: int, planned: int) -> None:
        pass

    def drift_checked(self, check: DriftCheck) -> None:
        self.emit({"kind": "drift", "check": check, "requests": self.folder.take_drift_requests()})


class _Goals:
    """The one part of the guided planner a block's early-stop rule asks (``window_goal``), from the goals the
    driver's planner gave the block's keys (:meth:`spectune.sweep.guided.seed.Seeding.window_goal`)."""

    def __init__(self, goals: dict[Key, str]) -> None:
        self.goals = {tuple(k): v for k, v in goals.items()}

    def window_goal(self, key: Key) -> str | None:
        return self.goals.get(PointKey(*key))


async def _measure(payload: BlockPayload, emit: Callable[[BlockEvent], None]) -> None:
    """Build the backend on this node, check it, measure the block, stop the server; emit events on the way."""
    from spectune.backends import make_backend
    from spectune.sweep.run import Sweep

    plan, options, keys = payload["plan"], payload["options"], [PointKey(*k) for k in payload["keys"]]
    folder = BlockFolder(emit, payload["points"])
    events = _Events(emit, folder)
    with tempfile.TemporaryDirectory(prefix="spectune-block-") as logs:
        options = replace(options, log_dir=Path(logs))
        backend = make_backend(payload["backend"], options)
        sweep = Sweep(plan, backend, folder, payload["prompts"], SweepMeta(), events, options.model, options.api_key_env,
                      payload["timeouts"])
        sweep.order = "blocks"
        if payload.get("goals"):  # a guided round's block: the planner's window goals of its keys
            sweep.planner = _Goals(payload["goals"])  # type: ignore[assignment]
        try:
            for warning in await backend.preflight(sorted({k.steps for k in keys})):
                events.warning(warning)
            await sweep.measure_block(keys)
        finally:
            try:
                await backend.stop()
            finally:
                await backend.close()
                for log in sorted(Path(logs).glob("*.log")):
                    emit({"kind": "log", "name": log.name, "text": log.read_text(encoding="utf-8", errors="replace")})
        c = sweep.cost
        emit({"kind": "done", "cost": {**c, "total_s": c["measure_s"] + c["drift_s"] + c["switch_s"]},
              "backend": backend.describe()})


def block_events(payload: BlockPayload) -> Iterator[Event]:
    """Measure one num_steps block on this node and yield its events (module docstring).

    Args:
        payload: a :class:`BlockPayload`, ``{"plan": SweepPlan, "backend": name, "options": BackendOptions,
            "keys": [(steps, concurrency, repeat), ...] of one num_steps, "prompts": [Prompt], "timeouts":
            ClientTimeouts, "points": the finished points known to the driver, "goals": {key: window goal} of a
            guided round's keys (optional)}``.

    Raises:
        UserError: a configuration problem (from ``make_backend``, ``preflight`` or ``start``).
        KeyboardInterrupt: the task was cancelled (after the server was stopped).
    """
    yield from task_events(lambda emit: _measure(payload, emit))
