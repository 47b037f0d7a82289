"""What ``spectune sweep`` measures and what it reports: :class:`SweepPlan` (the points, the prompts, the request
settings and their defaults, recorded as ``plan`` in sweep.json), the comma-list parser of ``--steps`` and
``--concurrency``, the progress events a sweep emits (:class:`SweepListener`) and what a run leaves
(:class:`SweepOutcome`). The run itself is :mod:`spectune.sweep.run`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spectune.loadgen.errors import UserError
from spectune.loadgen.record import RequestRecord
from spectune.results.schema import Key

__all__ = ["SweepPlan", "SweepListener", "SweepOutcome", "ClientTimeouts"]

DEFAULT_STEPS = (0, 1, 2, 3, 5)
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16)
DEFAULT_NUM_PROMPTS = 80  # MT-Bench's size
REQUEST_CAP = 1024  # the default requests per point stop growing with concurrency here (unless num_prompts is larger)
DEFAULT_WARMUP_CAP = 4


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep measures; recorded as ``plan`` in sweep.json and compared by ``--resume``.

    Attributes:
        steps: num_steps K values (0 = no speculation), ascending. concurrency: closed-loop concurrencies
            (requests in flight), ascending. repeats: runs of every (K, concurrency) cell.
        dataset, num_prompts, seed: the prompt sample (:func:`spectune.loadgen.load_dataset`).
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

    def strategy(self, concurrency: int) -> Any:
        """When a point sends: a closed loop holding ``concurrency`` requests in flight
        (:class:`~spectune.loadgen.strategy.ClosedLoop`)."""
        from spectune.loadgen.strategy import ClosedLoop

        return ClosedLoop(concurrency)

    def constraints(self, requests: int) -> Any:
        """Stop rules of a point of ``requests`` requests: that many, the duration cap, and an early stop once
        failures exceed ``max_failure_rate`` of them (floor(rate * requests) + 1 failures: the point is failed
        whatever happens next)."""
        from spectune.loadgen.constraints import Constraints

        return Constraints(max_requests=requests, max_duration_s=self.duration_per_point_s,
                           max_failures=math.floor(self.max_failure_rate * requests) + 1)


@dataclass(frozen=True)
class ClientTimeouts:
    """Time limits of the load generator (``--request-timeout``, ``--warmup-timeout``), shared by ``spectune sweep``
    and ``spectune validate``. Not part of the sweep plan (they bound how long a broken server is waited for, not
    what is measured), so changing them does not stop ``--resume``; sweep.json records them as ``client``.

    Attributes:
        request_timeout_s: s; one request (connect + whole stream) fails after this long.
        warmup_timeout_s: s; the warm-up before a point (or run) must finish within this long, else the point fails
            at once (a server that answers /health but never streams costs this much per point, not the whole
            request budget).
    """

    request_timeout_s: float = 600.0
    warmup_timeout_s: float = 300.0

    def validate(self) -> None:
        """Raises UserError when a limit is not a positive number of seconds."""
        for flag, value in (("--request-timeout", self.request_timeout_s), ("--warmup-timeout", self.warmup_timeout_s)):
            if not (value > 0 and math.isfinite(value)):
                raise UserError(f"{flag} must be a positive number of seconds, got {value}")

    def to_json(self) -> dict[str, float]:
        """``{"request_timeout_s", "warmup_timeout_s"}``."""
        return asdict(self)


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
