"""Load strategies: WHEN to send (guidellm's split: strategies time requests, the sending loop sends, constraints stop).

A strategy answers two questions the sending loop asks whenever something changes (a request finished, a timer fired):

- :meth:`Strategy.next_arrival`: the scheduled time of the next request, or None for "as soon as a slot is free"
  (closed loop);
- :meth:`Strategy.limit`: how many requests may be in flight now, or None for no limit.

The sending loop sends the pending arrival once its time has come *and* the in-flight count is below the limit, then
calls :meth:`Strategy.consume` and sends ``prompts[prompt_index(i) % len(prompts)]`` (:meth:`Strategy.prompt_index`).
:meth:`Strategy.next_change` tells it when the answers change by themselves (a phase boundary), so it can sleep until
then.

Open-loop arrivals follow a gamma renewal process as in vLLM's ``benchmarks/serve.py`` (``--burstiness``):
inter-arrival times ~ Gamma(shape = burstiness, scale = 1 / (rate * burstiness)), mean 1 / rate; burstiness 1 is a
Poisson process, < 1 burstier, > 1 more regular. Unlike vLLM, the sampled times are not rescaled to make the total
span exactly num_requests / rate. The first arrival is at the start. :class:`TraceArrivals` replays recorded send
offsets instead (a production arrival trace).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["Strategy", "ClosedLoop", "OpenLoop", "Phase", "Phased", "TraceArrivals"]


class Strategy(ABC):
    """When requests are sent. All times are s on :func:`time.perf_counter`'s clock."""

    @abstractmethod
    def start(self, t0: float) -> None:
        """Reset for a run that starts at ``t0`` (re-seeds random arrivals, so runs are reproducible)."""

    @abstractmethod
    def next_arrival(self, now: float) -> float | None:
        """Scheduled send time of the pending request (may be in the past), or None: send when a slot is free."""

    @abstractmethod
    def consume(self) -> None:
        """The pending request was sent: move on to the next arrival."""

    @abstractmethod
    def limit(self, now: float) -> int | None:
        """Maximum requests in flight at ``now``, or None for no limit."""

    def next_change(self, now: float) -> float | None:
        """Next time after ``now`` when :meth:`limit` or the arrival process changes by itself, or None."""
        return None

    @abstractmethod
    def warmup_concurrency(self) -> int:
        """How many warm-up requests to keep in flight."""

    def prompt_index(self, request_index: int) -> int:
        """The prompt of the request just consumed, the ``request_index``-th of the run (0-based), before cycling
        over the prompt list: by default its own number, so a run walks the list in order."""
        return request_index


@dataclass
class ClosedLoop(Strategy):
    """Exactly ``concurrency`` requests in flight: a new one is sent as soon as one finishes (the sweep's mode)."""

    concurrency: int

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")

    def start(self, t0: float) -> None:
        pass

    def next_arrival(self, now: float) -> float | None:
        return None

    def consume(self) -> None:
        pass

    def limit(self, now: float) -> int | None:
        return self.concurrency

    def warmup_concurrency(self) -> int:
        return self.concurrency


class _GammaArrivals:
    """Seeded gamma renewal process: successive arrival times from a start time, rate in requests/s."""

    def __init__(self, seed: int, burstiness: float) -> None:
        if not burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {burstiness}")
        self.rng, self.shape = np.random.default_rng(seed), burstiness
        self._batch: list[float] = []

    def gap(self, rate: float) -> float:
        """One inter-arrival time, s: Gamma(shape, 1 / (rate * shape)); exactly 1 / rate when shape is inf."""
        if math.isinf(self.shape):
            return 1.0 / rate
        if not self._batch:  # unit-rate gaps, drawn 256 at a time (numpy calls are the cost, not the numbers)
            self._batch = self.rng.gamma(self.shape, 1.0 / self.shape, 256).tolist()[::-1]
        return self._batch.pop() / rate


@dataclass
class OpenLoop(Strategy):
    """Arrivals at ``rate`` requests/s with gamma inter-arrival times; optional cap on requests in flight.

    With ``max_concurrency``, an arrival that finds every slot busy waits for one; its request keeps its scheduled
    arrival time as ``send_time``, so that client-side queueing counts in TTFT and E2E latency (what a user who
    arrived then would see; vLLM instead measures from the actual send, which hides the queueing).
    """

    rate: float
    burstiness: float = 1.0
    seed: int = 0
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        self.start(0.0)

    def start(self, t0: float) -> None:
        self._arrivals = _GammaArrivals(self.seed, self.burstiness)
        self._next = t0

    def next_arrival(self, now: float) -> float | None:
        return self._next

    def consume(self) -> None:
        self._next += self._arrivals.gap(self.rate)

    def limit(self, now: float) -> int | None:
        return self.max_concurrency

    def warmup_concurrency(self) -> int:
        return self.max_concurrency or 1


@dataclass(frozen=True)
class Phase:
    """One phase of a :class:`Phased` load: ``duration_s`` s of either closed-loop ``concurrency`` or open-loop
    ``rate`` (requests/s, gamma arrivals, optionally capped at ``max_concurrency``)."""

    duration_s: float
    concurrency: int | None = None
    rate: float | None = None
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("a phase needs exactly one of concurrency or rate")
        if not self.duration_s > 0:
            raise ValueError(f"phase duration must be > 0 s, got {self.duration_s}")


@dataclass
class Phased(Strategy):
    """A sequence of phases (for ``spectune validate``: load that crosses schedule boundaries).

    The last phase continues until the run's constraints stop it. Open-loop phases share one seeded gamma process;
    at a phase boundary the arrival clock restarts at the boundary with the new phase's rate (exact for Poisson
    arrivals, which are memoryless). When a phase lowers the concurrency, requests in flight finish normally and
    no new one is sent until the count falls below the new limit.

    Every phase walks the prompt list from its start (:meth:`prompt_index`), so phase j of two runs sends the same
    prompts in the same order however fast the runs went before it. Counting on from the run's start instead gave a
    faster run's later phases prompts further down the list: a validation on llama.cpp compared concurrency-8 phases
    whose prompts differed by 9% in mean length (docs/examples/llamacpp-cpu), where prefill is much of a request.
    """

    phases: list[Phase]
    burstiness: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.phases:
            raise ValueError("a phased load needs at least one phase")
        self.start(0.0)

    def start(self, t0: float) -> None:
        self._arrivals = _GammaArrivals(self.seed, self.burstiness)
        self._ends = [t0 + t for t in np.cumsum([p.duration_s for p in self.phases[:-1]]).tolist()]
        self._starts = [t0, *self._ends]
        self._cur = 0  # phase of the last next_arrival() answer
        self._open = -1  # open-loop phase that self._next belongs to
        self._next = t0
        self._sent = [0] * len(self.phases)  # requests consumed per phase

    def _index(self, now: float) -> int:
        return sum(1 for end in self._ends if now >= end)

    def next_arrival(self, now: float) -> float | None:
        self._cur = i = self._index(now)
        if self.phases[i].rate is None:
            return None
        if self._open != i:  # entering an open-loop phase: its arrivals start at the phase start
            self._open, self._next = i, self._starts[i]
        return self._next

    def consume(self) -> None:
        self._sent[self._cur] += 1
        rate = self.phases[self._cur].rate
        if rate is not None:
            # an arrival past the phase end is clamped to the end, where the next phase restarts the clock
            end = self._ends[self._cur] if self._cur < len(self._ends) else math.inf
            self._next = min(self._next + self._arrivals.gap(rate), end)

    def limit(self, now: float) -> int | None:
        phase = self.phases[self._index(now)]
        return phase.concurrency if phase.rate is None else phase.max_concurrency

    def next_change(self, now: float) -> float | None:
        return next((end for end in self._ends if end > now), None)

    def warmup_concurrency(self) -> int:
        first = self.phases[0]
        return first.concurrency or first.max_concurrency or 1

    def prompt_index(self, request_index: int) -> int:
        """The consumed request's number within its phase: each phase starts at the list's first prompt."""
        return self._sent[self._cur] - 1


class TraceArrivals(Strategy):
    """Trace replay: sends at recorded offsets (s after the run's start, ascending), at most ``max_concurrency``
    in flight (None: no cap); an arrival that finds the cap reached waits for a free slot.

    Raises:
        ValueError: no offsets.
    """

    def __init__(self, offsets_s: Sequence[float], max_concurrency: int | None = None) -> None:
        if not offsets_s:
            raise ValueError("an arrival trace needs at least one arrival")
        self.offsets, self.cap = list(offsets_s), max_concurrency
        self.t0, self.i = 0.0, 0

    def start(self, t0: float) -> None:
        self.t0, self.i = t0, 0

    def next_arrival(self, now: float) -> float | None:
        return self.t0 + self.offsets[min(self.i, len(self.offsets) - 1)]

    def consume(self) -> None:
        self.i += 1

    def limit(self, now: float) -> int | None:
        return self.cap

    def warmup_concurrency(self) -> int:
        return min(self.cap or 1, 4)
