"""What ``spectune sweep`` measures and what it reports: :class:`SweepPlan` (the points, the prompts, the request
settings and their defaults, recorded as ``plan`` in sweep.json), the comma-list parser of ``--steps`` and
``--concurrency``, the progress events a sweep emits (:class:`SweepListener`) and what a run leaves
(:class:`SweepOutcome`). The run itself is :mod:`spectune.sweep.run`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from spectune.core.json_types import JsonObject
from spectune.loadgen.constraints import Constraints
from spectune.core.errors import UserError
from spectune.loadgen.record import RequestRecord
from spectune.loadgen.strategy import ClosedLoop
from spectune.measure.load_settings import LoadSpec, failure_rate_check, steps_check
from spectune.measure.node_progress import NodeTask
from spectune.results.point import SweepPoint
from spectune.results.schema import Key, PointKey

if TYPE_CHECKING:
    from spectune.sweep.drift import DriftCheck

__all__ = ["SweepPlan", "SweepListener", "SweepOutcome"]

DEFAULT_STEPS = (0, 1, 2, 3, 5)
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16)
REQUEST_CAP = 1024  # the default requests per point stop growing with concurrency here (unless num_prompts is larger)
DEFAULT_WARMUP_CAP = 4


@dataclass(frozen=True)
class SweepPlan(LoadSpec):
    """What a sweep measures; recorded as ``plan`` in sweep.json and compared by ``--resume``.

    The prompts and request settings are :class:`~spectune.measure.load_settings.LoadSpec`'s (keyword-only):
    ``dataset``, ``num_prompts``, ``seed``, ``max_tokens``, ``temperature``, ``ignore_eos``, ``api``, ``slo_ttft_ms``,
    ``slo_tpot_ms`` and ``warmup_requests`` (None = min(concurrency, 4) warm-up requests before each point).

    Attributes:
        steps: num_steps K values (0 = no speculation), ascending. concurrency: closed-loop concurrencies
            (requests in flight), ascending. repeats: runs of every (K, concurrency) cell.
        requests_per_point: measured requests per point; None = max(num_prompts, 4 * concurrency), at most
            max(num_prompts, 1024).
        duration_per_point_s: s; optional cap on a point's sending time.
        max_failure_rate: a point whose failed share exceeds this is ``failed`` (0..1).
        design: ``grid`` (every point) or ``guided`` (measure only the cells that could still be the best,
            predict the rest: :mod:`spectune.sweep.guided`).
        order: ``auto`` (interleaved on backends that switch num_steps cheaply, ``Backend.cheap_switch``, else
            blocks), ``interleaved`` (every num_steps in turn at each concurrency, the order reversed every other
            repeat) or ``blocks`` (one num_steps after another, as a server restart per num_steps needs).
        drift_check: re-measure a reference cell at the end (and, in blocks, each block's first cell at its end)
            and record whether it moved more than its interval (:mod:`spectune.sweep.drift`).
        objective: what the guided plan settles: ``throughput`` (max output tokens/s) or ``tpot`` (min TPOT p50).
        budget_points, budget_s: the guided plan's budget: at most this many measured points / this many seconds
            of measuring (server starts and switches included); None = until the choice is settled.
        confidence: confidence of the guided plan's intervals (0..1). noise_band: differences below this fraction
            are ties (the guided plan's settling rule, as ``spectune recommend --noise-band``).
        early_stop: end a point's window once the decision it serves is settled (:mod:`spectune.sweep.sequential`);
            None = on for the guided plan, off for the grid (``--early-stop/--no-early-stop``).
    """

    steps: tuple[int, ...] = DEFAULT_STEPS
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    repeats: int = 1
    requests_per_point: int | None = None
    duration_per_point_s: float | None = None
    max_failure_rate: float = 0.1
    design: str = "grid"
    order: str = "auto"
    drift_check: bool = True
    objective: str = "throughput"
    budget_points: int | None = None
    budget_s: float | None = None
    confidence: float = 0.95
    noise_band: float = 0.02
    early_stop: bool | None = None

    @property
    def stops_early(self) -> bool:
        """Whether windows stop early (``early_stop``, or by default for the guided plan only)."""
        return self.design == "guided" if self.early_stop is None else bool(self.early_stop)

    def validate(self) -> None:
        """Raises UserError naming the first bad value (and how to fix it)."""
        checks = [
            steps_check(self.steps),
            (bool(self.concurrency) and min(self.concurrency) >= 1, "--concurrency needs values >= 1, e.g. 1,4,16"),
            (self.repeats >= 1, f"--repeats must be >= 1, got {self.repeats}"),
            *self.load_checks(),
            (self.requests_per_point is None or self.requests_per_point >= 1,
             f"--requests-per-point must be >= 1, got {self.requests_per_point}"),
            (self.duration_per_point_s is None or self.duration_per_point_s > 0,
             f"--duration must be > 0 s, got {self.duration_per_point_s}"),
            failure_rate_check(self.max_failure_rate),
            (self.design in ("grid", "guided"), f"--plan must be grid or guided, got {self.design!r}"),
            (self.order in ("auto", "interleaved", "blocks"),
             f"--order must be auto, interleaved or blocks, got {self.order!r}"),
            (self.objective in ("throughput", "tpot"),
             f"--objective must be throughput or tpot for a sweep plan, got {self.objective!r} (goodput: sweep with "
             "--plan grid and choose with spectune recommend --objective goodput)"),
            (self.budget_points is None or self.budget_points >= 1,
             f"--budget must be at least 1 point, got {self.budget_points}"),
            (self.budget_s is None or self.budget_s > 0, f"--budget must be a positive time, got {self.budget_s} s"),
            ((self.budget_points is None and self.budget_s is None) or self.design == "guided",
             "--budget works with --plan guided only (a grid measures every point)"),
            (0.5 <= self.confidence < 1.0, f"--confidence must be in 0.5..0.999, got {self.confidence}"),
            (0.0 <= self.noise_band < 0.5, f"--noise-band must be in 0..50 %, got {self.noise_band * 100:g}"),
            (self.design != "guided" or len(self.steps) >= 2, "--plan guided needs at least two --steps values"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)

    def to_json(self) -> JsonObject:
        """The plan as a JSON object (lists for the tuples). A plan of an older spectune lacks the newer keys: those
        are read as their defaults (:data:`NEW_KEYS`)."""
        d = asdict(self)
        d["steps"], d["concurrency"] = list(self.steps), list(self.concurrency)
        return self.plan_json(("steps", "concurrency", "repeats"), d)

    def points(self) -> list[Key]:
        """Every (steps, concurrency, repeat) of the grid, blocks order: for K, for concurrency, for repeat."""
        return [PointKey(k, c, r) for k in self.steps for c in self.concurrency for r in range(self.repeats)]

    def order_for(self, cheap_switch: bool) -> str:
        """``interleaved`` or ``blocks``: ``order``, or for ``auto`` interleaved when the backend switches num_steps
        cheaply (``Backend.cheap_switch``)."""
        if self.order != "auto":
            return self.order
        return "interleaved" if cheap_switch else "blocks"

    def ordered(self, todo: list[Key], order: str) -> list[Key]:
        """``todo`` in run order. ``blocks``: for K, for concurrency, for repeat (one server start per K).
        ``interleaved``: for repeat, for concurrency, every K in turn, ascending in even repeats and descending in
        odd ones, so num_steps is not confounded with time (the cells compared at one concurrency run minutes
        apart at most, and a trend over the sweep hits every K alike)."""
        if order == "blocks":
            return sorted(todo, key=lambda k: (k.steps, k.concurrency, k.repeat))
        return sorted(todo, key=lambda k: (k.repeat, k.concurrency, k.steps if k.repeat % 2 == 0 else -k.steps))

    def requests_for(self, concurrency: int) -> int:
        """Measured requests of a point: ``requests_per_point``, else max(num_prompts, 4 * concurrency) capped at
        max(num_prompts, 1024) (four closed-loop waves, so ramp-up and drain are a small part of the window)."""
        if self.requests_per_point is not None:
            return self.requests_per_point
        return min(max(self.num_prompts, 4 * concurrency), max(self.num_prompts, REQUEST_CAP))

    def warmup_for(self, concurrency: int) -> int:
        """Warm-up requests before a point: ``warmup_requests``, else min(concurrency, 4)."""
        return self.warmup_requests if self.warmup_requests is not None else min(concurrency, DEFAULT_WARMUP_CAP)

    def strategy(self, concurrency: int) -> ClosedLoop:
        """When a point sends: a closed loop holding ``concurrency`` requests in flight
        (:class:`~spectune.loadgen.strategy.ClosedLoop`)."""
        return ClosedLoop(concurrency)

    def constraints(self, requests: int,
                    stop_when: Callable[[Sequence[RequestRecord], float], str | None] | None = None) -> Constraints:
        """Stop rules of a point of ``requests`` requests: that many, the duration cap, an early stop once
        failures exceed ``max_failure_rate`` of them (floor(rate * requests) + 1 failures: the point is failed
        whatever happens next), and ``stop_when`` (the sequential rule of :mod:`spectune.sweep.sequential`, or
        None), whose stop cancels the requests in flight (its statistic needs only the finished ones)."""
        return Constraints(max_requests=requests, max_duration_s=self.duration_per_point_s,
                           max_failures=math.floor(self.max_failure_rate * requests) + 1, stop_when=stop_when,
                           cancel_on_early_stop=True)


NEW_KEYS = {"design": "grid", "order": "auto", "drift_check": True, "objective": "throughput", "budget_points": None,
            "budget_s": None, "confidence": 0.95, "noise_band": 0.02, "early_stop": None}
"""Plan keys added after the first release, with the value an older sweep.json means by leaving them out (``--resume``
of an older sweep compares with these)."""


def parse_budget(text: str | None) -> tuple[int | None, float | None]:
    """``--budget``: ``N`` (measured points) or a time ``Ns``, ``Nm``, ``Nh`` -> (points, seconds); (None, None) for
    None.

    Raises:
        UserError: anything else (named, with an example).
    """
    if text is None or not str(text).strip():
        return None, None
    t = str(text).strip().lower()
    try:
        if t[-1] in "smh":
            seconds = float(t[:-1]) * {"s": 1, "m": 60, "h": 3600}[t[-1]]
            if not (seconds > 0 and math.isfinite(seconds)):
                raise ValueError
            return None, seconds
        points = int(t)
        if points < 1:
            raise ValueError
        return points, None
    except ValueError:
        raise UserError(f"bad --budget {text!r}: give points (e.g. 12) or a time (e.g. 600s, 10m, 1h)") from None


class SweepListener:
    """Receives the sweep's progress events (the display renders them; tests record them). No-ops here."""

    def sweep_started(self, plan: SweepPlan, todo: list[Key], kept: list[SweepPoint]) -> None:
        """Before the first point: the points to run now and the finished points kept from before (records)."""

    def warning(self, message: str) -> None:
        """Something the user should know (preflight warnings, a failed warm-up)."""

    def note(self, message: str) -> None:
        """Progress that is not a problem: a distributed sweep's blocks starting on their nodes, calibrations."""

    def server_starting(self, steps: int) -> None:
        """``backend.start(steps)`` is about to be called for the first point of num_steps ``steps``."""

    def server_failed(self, steps: int, message: str, log_tail: str) -> None:
        """The server for ``steps`` did not come up: its remaining points fail."""

    def point_started(self, key: Key, planned: int) -> None:
        """Measurement of ``key`` (steps, concurrency, repeat) begins; ``planned`` requests at most."""

    def request_finished(self, key: Key, record: RequestRecord, done: int, planned: int) -> None:
        """A measured request of ``key`` finished (``done`` of ``planned``)."""

    def point_finished(self, point: SweepPoint) -> None:
        """A point is durable in points.jsonl (its record is passed)."""

    def drift_checked(self, check: DriftCheck) -> None:
        """A drift check finished (:func:`spectune.sweep.drift.drift_check`)."""

    def node_progress(self, task: NodeTask) -> None:
        """A distributed sweep's task changed on its node (a :class:`spectune.measure.node_progress.NodeTask`:
        started, a point started or finished, ended)."""


@dataclass
class SweepOutcome:
    """What a sweep run left: every finished point (kept + new, as records), how many ran now, and the signal that
    stopped it (``signal.SIGINT``/``SIGTERM`` value) or None when it ran to the end."""

    folder: Path
    plan: SweepPlan
    points: list[SweepPoint] = field(default_factory=list)
    ran: int = 0
    interrupted: int | None = None
    predicted: list[JsonObject] = field(default_factory=list)  # a guided sweep's predicted cells
    cost: dict[str, float] = field(default_factory=dict)  # sweep.json ``cost`` of this run
    drift: JsonObject | None = None  # sweep.json ``drift``
    guided: JsonObject | None = None  # sweep.json ``guided``
