"""Time-varying workloads for ``spectune validate``: load that crosses a per-batch-size config's boundaries.

A :class:`Workload` is a sequence of phases, each ``duration_s`` long, of either closed-loop concurrency (exactly N
requests in flight) or open-loop arrivals (``rate`` requests/s, gamma inter-arrival times with ``burstiness``:
1 = Poisson, < 1 burstier; vLLM's ``--burstiness``), or a replayed arrival trace cut into windows. It runs on
loadgen's :class:`~loadgen.strategy.Phased` strategy (or :class:`TraceArrivals` for a trace), seeded, so every run
of a validation sees the same arrival schedule and prompt order.

Workloads are built from presets, phase spec strings and trace files by :mod:`spectune.workload_spec`; the
per-phase numbers of a run are computed by :mod:`spectune.phase_metrics`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from loadgen.strategy import Phase, Phased, Strategy

DEFAULT_PHASE_S = 60.0
DEFAULT_MAX_CONCURRENCY = 64


@dataclass(frozen=True)
class PhaseSpec:
    """One phase: ``duration_s`` s of closed-loop ``concurrency`` or open-loop ``rate`` (requests/s); both None
    for a window of a replayed trace."""

    duration_s: float
    concurrency: int | None = None
    rate: float | None = None

    @property
    def label(self) -> str:
        """``c=32``, ``r=8/s`` or ``trace``."""
        if self.concurrency is not None:
            return f"c={self.concurrency}"
        return f"r={self.rate:g}/s" if self.rate is not None else "trace"


@dataclass(frozen=True)
class Arrival:
    """One replayed request: send offset ``t`` (s from the start) and an optional prompt ``category``."""

    t: float
    category: str | None = None


@dataclass(frozen=True)
class Workload:
    """A validated time-varying load (see module docstring).

    Attributes:
        name: preset name, the spec string, or ``trace:PATH``.
        phases: in order; the run lasts ``sum(duration_s)``.
        burstiness: gamma shape of open-loop inter-arrival times (1 = Poisson).
        max_concurrency: cap on requests in flight in open-loop phases and traces (arrivals beyond it wait at the
            client and their wait counts in TTFT).
        seed: seed of the open-loop arrival process.
        arrivals: the replayed trace, sorted by ``t`` (empty unless a trace).
    """

    name: str
    phases: tuple[PhaseSpec, ...]
    burstiness: float = 1.0
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    seed: int = 0
    arrivals: tuple[Arrival, ...] = ()

    @property
    def bounds(self) -> list[tuple[float, float]]:
        """(start_s, end_s) of every phase, s from the start of the measured run."""
        ends = [float(t) for t in itertools.accumulate(p.duration_s for p in self.phases)]
        return list(zip([0.0, *ends[:-1]], ends))

    @property
    def total_s(self) -> float:
        """Scheduled length of a run, s (the throughput window)."""
        return self.bounds[-1][1]

    def server_concurrency(self) -> int:
        """The most requests a server must hold at once: the largest closed-loop concurrency, or the open-loop cap."""
        closed = [p.concurrency for p in self.phases if p.concurrency is not None]
        opened = any(p.concurrency is None for p in self.phases)
        return max(closed + ([self.max_concurrency] if opened else []))

    def first_concurrency(self) -> int:
        """Requests in flight at the start (warm-up runs at most this many at once)."""
        return self.phases[0].concurrency or 1

    def max_requests(self) -> int | None:
        """Requests a run sends at most: the trace's length, else None (phases end by time)."""
        return len(self.arrivals) or None

    def strategy(self, on_start: Callable[[float], None] | None = None) -> Strategy:
        """A fresh seeded strategy for one run; ``on_start(t0)`` is called when the measured run starts."""
        if self.arrivals:
            return TraceArrivals([a.t for a in self.arrivals], self.max_concurrency, on_start)
        phases = [Phase(p.duration_s, concurrency=p.concurrency, rate=p.rate,
                        max_concurrency=None if p.rate is None else self.max_concurrency) for p in self.phases]
        return NotifyingPhased(phases, self.burstiness, self.seed, on_start=on_start)

    def to_json(self) -> dict[str, Any]:
        """What validate.json records about the workload."""
        return {"name": self.name, "total_s": self.total_s, "burstiness": self.burstiness,
                "max_concurrency": self.max_concurrency, "seed": self.seed, "arrivals": len(self.arrivals),
                "phases": [{"phase": i + 1, "label": p.label, "start_s": a, "end_s": b, "concurrency": p.concurrency,
                            "rate": p.rate} for i, (p, (a, b)) in enumerate(zip(self.phases, self.bounds))]}


class NotifyingPhased(Phased):
    """loadgen's :class:`Phased` that reports the measured run's start time ``t0`` (phase boundaries count from it)."""

    def __init__(self, phases: list[Phase], burstiness: float, seed: int,
                 on_start: Callable[[float], None] | None = None) -> None:
        self.on_start = None  # Phased.__post_init__ calls start(0.0): not a run
        super().__init__(phases, burstiness, seed)
        self.on_start = on_start

    def start(self, t0: float) -> None:
        super().start(t0)
        if self.on_start is not None:
            self.on_start(t0)


class TraceArrivals(Strategy):
    """Replays send offsets (s, ascending) from the run's start, at most ``max_concurrency`` in flight."""

    def __init__(self, offsets_s: Sequence[float], max_concurrency: int | None = None,
                 on_start: Callable[[float], None] | None = None) -> None:
        if not offsets_s:
            raise ValueError("an arrival trace needs at least one arrival")
        self.offsets, self.cap, self.on_start = list(offsets_s), max_concurrency, on_start
        self.t0, self.i = 0.0, 0

    def start(self, t0: float) -> None:
        self.t0, self.i = t0, 0
        if self.on_start is not None:
            self.on_start(t0)

    def next_arrival(self, now: float) -> float | None:
        return self.t0 + self.offsets[min(self.i, len(self.offsets) - 1)]

    def consume(self) -> None:
        self.i += 1

    def limit(self, now: float) -> int | None:
        return self.cap

    def warmup_concurrency(self) -> int:
        return min(self.cap or 1, 4)
