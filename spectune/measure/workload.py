"""Time-varying workloads for ``spectune validate``: load that crosses a per-batch-size config's boundaries.

A :class:`Workload` is a sequence of phases, each ``duration_s`` long, of either closed-loop concurrency (exactly N
requests in flight) or open-loop arrivals (``rate`` requests/s, gamma inter-arrival times with ``burstiness``:
1 = Poisson, < 1 burstier; vLLM's ``--burstiness``), or a replayed arrival trace cut into windows. It runs on
loadgen's :class:`~spectune.loadgen.strategy.Phased` strategy (or
:class:`~spectune.loadgen.strategy.TraceArrivals` for a trace), seeded, so every run
of a validation sees the same arrival schedule and prompt order.

Workloads are built from presets and phase spec strings (:func:`parse_workload`) and from arrival trace files
(:func:`load_arrivals`, with :func:`arrange_prompts` for the prompt of each arrival); the per-phase numbers of a
run are computed by :mod:`spectune.validate.phases`.

Presets (``P`` = ``--phase-seconds``, default 60 s; ``--cycles`` repeats the list):

- ``swing``: concurrency 1, 32 (2 cycles by default): the boundary-crossing load of background §4;
- ``ramp``: concurrency 1, 2, 4, 8, 16, 32, 16, 8, 4, 2, 1 (1 cycle);
- ``burst``: open loop at 1 then 8 requests/s (2 cycles), in-flight requests capped at ``max_concurrency``.

A spec string lists phases separated by commas: ``c8`` (or ``8``) = closed loop at concurrency 8, ``r2.5`` = open
loop at 2.5 requests/s, each optionally followed by ``@S`` for a duration of S seconds instead of ``P``; e.g.
``c1@30,c32@90,r4``.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from spectune.core.json_types import JsonObject
from spectune.loadgen.datasets import Prompt
from spectune.core.errors import UserError
from spectune.loadgen.strategy import Phase, Phased, Strategy, TraceArrivals
from spectune.results.durable import json_object

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

    def strategy(self) -> Strategy:
        """A fresh seeded strategy for one run: :class:`~spectune.loadgen.strategy.Phased`, or
        :class:`~spectune.loadgen.strategy.TraceArrivals` for a replayed trace."""
        if self.arrivals:
            return TraceArrivals([a.t for a in self.arrivals], self.max_concurrency)
        phases = [Phase(p.duration_s, concurrency=p.concurrency, rate=p.rate,
                        max_concurrency=None if p.rate is None else self.max_concurrency) for p in self.phases]
        return Phased(phases, self.burstiness, self.seed)

    def to_json(self) -> JsonObject:
        """What validate.json records about the workload."""
        return {"name": self.name, "total_s": self.total_s, "burstiness": self.burstiness,
                "max_concurrency": self.max_concurrency, "seed": self.seed, "arrivals": len(self.arrivals),
                "phases": [{"phase": i + 1, "label": p.label, "start_s": a, "end_s": b, "concurrency": p.concurrency,
                            "rate": p.rate} for i, (p, (a, b)) in enumerate(zip(self.phases, self.bounds))]}


PRESETS: dict[str, tuple[tuple[str, ...], int]] = {
    "swing": (("c1", "c32"), 2),
    "ramp": (("c1", "c2", "c4", "c8", "c16", "c32", "c16", "c8", "c4", "c2", "c1"), 1),
    "burst": (("r1", "r8"), 2),
}
"""Preset name -> (phase tokens, default cycles)."""
_TOKEN = re.compile(r"^(c|r)?(\d+(?:\.\d+)?)(?:@(\d+(?:\.\d+)?)s?)?$")


def parse_workload(spec: str | None, phase_s: float = DEFAULT_PHASE_S, cycles: int | None = None,
                   burstiness: float = 1.0, max_concurrency: int = DEFAULT_MAX_CONCURRENCY, seed: int = 0) -> Workload:
    """A preset name or a phase spec (module docstring) -> :class:`Workload`; None means ``swing``.

    Args:
        phase_s: s per phase without its own ``@S``. cycles: repeats of the phase list (None: the preset's
            default, 1 for a spec). burstiness, max_concurrency, seed: see :class:`Workload`.

    Raises:
        UserError: an unknown token, a concurrency that is not a whole number >= 1, a rate or duration <= 0,
            cycles < 1, burstiness <= 0 or max_concurrency < 1 (the message names the fix).
    """
    _check_common(phase_s, burstiness, max_concurrency)
    text = (spec or "swing").strip()
    tokens, default_cycles = PRESETS.get(text.lower(), (None, 1))
    if tokens is None:
        tokens = tuple(t.strip() for t in text.split(","))
    cycles = default_cycles if cycles is None else cycles
    if cycles < 1:
        raise UserError(f"--cycles must be >= 1, got {cycles}")
    phases = [_phase(t, phase_s, text) for t in tokens]
    return Workload(text, tuple(phases) * cycles, burstiness, max_concurrency, seed)


def _check_common(phase_s: float, burstiness: float, max_concurrency: int) -> None:
    if not phase_s > 0:
        raise UserError(f"--phase-seconds must be > 0, got {phase_s}")
    if not burstiness > 0:
        raise UserError(f"--burstiness must be > 0 (1 = Poisson, < 1 burstier), got {burstiness}")
    if max_concurrency < 1:
        raise UserError(f"--max-concurrency must be >= 1, got {max_concurrency}")


def _phase(token: str, phase_s: float, spec: str) -> PhaseSpec:
    m = _TOKEN.match(token.lower())
    hint = (f"bad phase {token!r} in --workload {spec!r}: use a preset ({', '.join(PRESETS)}) or phases like "
            "c1@30,c32,r4.5 (cN = concurrency N, rX = X requests/s, @S = S seconds)")
    if not m:
        raise UserError(hint)
    kind, value, dur = m.groups()
    duration = float(dur) if dur is not None else phase_s
    if not duration > 0:
        raise UserError(f"phase {token!r}: the duration must be > 0 s")
    if kind == "r":
        if not float(value) > 0:
            raise UserError(f"phase {token!r}: the rate must be > 0 requests/s")
        return PhaseSpec(duration, rate=float(value))
    if "." in value or int(value) < 1:
        raise UserError(f"phase {token!r}: concurrency must be a whole number >= 1")
    return PhaseSpec(duration, concurrency=int(value))


def load_arrivals(path: str | Path, phase_s: float = DEFAULT_PHASE_S,
                  max_concurrency: int = DEFAULT_MAX_CONCURRENCY) -> Workload:
    """A replayed trace: JSONL of ``{"t": seconds}`` send offsets (optional ``"category"``), cut into windows of
    ``phase_s`` s; the run lasts whole windows up to and past the last arrival.

    Raises:
        UserError: unreadable file, a line that is not a JSON object with a number ``t`` >= 0, or no arrivals.
    """
    _check_common(phase_s, 1.0, max_concurrency)
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read --arrivals {p}: {getattr(err, 'strerror', None) or err}") from None
    arrivals = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        obj = json_object(line)
        t = obj.get("t") if obj is not None else None
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise UserError(f"{p} line {n}: expected {{\"t\": seconds >= 0}} (optional \"category\"), got {line!r}")
        cat = obj.get("category")
        arrivals.append(Arrival(float(t), None if cat is None else str(cat)))
    if not arrivals:
        raise UserError(f"{p} holds no arrivals: write one {{\"t\": seconds}} object per line")
    arrivals.sort(key=lambda a: a.t)
    windows = math.floor(arrivals[-1].t / phase_s) + 1
    phases = tuple(PhaseSpec(phase_s) for _ in range(windows))
    return Workload(f"trace:{p}", phases, 1.0, max_concurrency, 0, tuple(arrivals))


def arrange_prompts(prompts: Sequence[Prompt], arrivals: Sequence[Arrival]) -> list[Prompt]:
    """Prompt of each arrival, in order: the next prompt of its category (cycling through that category in dataset
    order), or the next prompt overall when it has none. Without arrivals, ``prompts`` unchanged.

    Raises:
        UserError: an arrival's category has no prompt in the dataset (the known categories are named).
    """
    if not arrivals:
        return list(prompts)
    by_cat: dict[str, list[Prompt]] = {}
    for pr in prompts:
        by_cat.setdefault(pr.category or "", []).append(pr)
    used: dict[str | None, int] = {}
    out = []
    for a in arrivals:
        pool = list(prompts) if a.category is None else by_cat.get(a.category)
        if not pool:
            known = ", ".join(sorted(c for c in by_cat if c)) or "none"
            raise UserError(f"arrival category {a.category!r} has no prompt in the dataset (categories: {known}); "
                            "fix the trace or pick another --dataset")
        i = used.get(a.category, 0)
        used[a.category] = i + 1
        out.append(pool[i % len(pool)])
    return out
