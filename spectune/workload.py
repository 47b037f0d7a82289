"""Time-varying workloads for ``spectune validate``: load that crosses a per-batch-size config's boundaries.

A :class:`Workload` is a sequence of phases, each ``duration_s`` long, of either closed-loop concurrency (exactly N
requests in flight) or open-loop arrivals (``rate`` requests/s, gamma inter-arrival times with ``burstiness``:
1 = Poisson, < 1 burstier; vLLM's ``--burstiness``), or a replayed arrival trace cut into windows. It runs on
loadgen's :class:`~loadgen.strategy.Phased` strategy (or :class:`TraceArrivals` for a trace), seeded, so every run
of a validation sees the same arrival schedule and prompt order.

Presets (``P`` = ``--phase-seconds``, default 60 s; ``--cycles`` repeats the list):

- ``swing``: concurrency 1, 32 (2 cycles by default): the boundary-crossing load of background §4;
- ``ramp``: concurrency 1, 2, 4, 8, 16, 32, 16, 8, 4, 2, 1 (1 cycle);
- ``burst``: open loop at 1 then 8 requests/s (2 cycles), in-flight requests capped at ``max_concurrency``.

A spec string lists phases separated by commas: ``c8`` (or ``8``) = closed loop at concurrency 8, ``r2.5`` = open
loop at 2.5 requests/s, each optionally followed by ``@S`` for a duration of S seconds instead of ``P``; e.g.
``c1@30,c32@90,r4``. Records are assigned to phases by send time (:func:`phase_index`); output throughput per
phase counts the tokens streamed inside the phase (:func:`tokens_between`).
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from loadgen.datasets import Prompt
from loadgen.errors import UserError
from loadgen.record import RequestRecord
from loadgen.strategy import Phase, Phased, Strategy

PRESETS: dict[str, tuple[tuple[str, ...], int]] = {
    "swing": (("c1", "c32"), 2),
    "ramp": (("c1", "c2", "c4", "c8", "c16", "c32", "c16", "c8", "c4", "c2", "c1"), 1),
    "burst": (("r1", "r8"), 2),
}
"""Preset name -> (phase tokens, default cycles)."""
DEFAULT_PHASE_S = 60.0
DEFAULT_MAX_CONCURRENCY = 64
_TOKEN = re.compile(r"^(c|r)?(\d+(?:\.\d+)?)(?:@(\d+(?:\.\d+)?)s?)?$")


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
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        t = obj.get("t") if isinstance(obj, dict) else None
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


def phase_index(offset_s: float, bounds: Sequence[tuple[float, float]]) -> int:
    """0-based phase of a request sent ``offset_s`` s after the run's start: the phase whose [start, end) holds it
    (before the start: the first; past the end: the last)."""
    i = bisect.bisect_right([a for a, _ in bounds], offset_s) - 1
    return min(max(i, 0), len(bounds) - 1)


def tokens_between(records: Sequence[RequestRecord], start: float, end: float) -> int:
    """Output tokens of successful records whose chunk arrived in [start, end) (s, the records' clock)."""
    total = 0
    for r in records:
        if r.ok:
            lo, hi = bisect.bisect_left(r.chunk_times, start), bisect.bisect_left(r.chunk_times, end)
            total += sum(r.chunk_tokens[lo:hi])
    return total


def inflight_average(records: Sequence[RequestRecord], start: float, end: float) -> float | None:
    """Time-average of requests in flight over [start, end), from each record's [send_time, end_time] (requests);
    an open-loop arrival waiting at the client counts from its scheduled arrival. None for an empty window."""
    if not end > start:
        return None
    busy = sum(max(0.0, min(r.end_time, end) - max(r.send_time, start)) for r in records if r.end_time is not None)
    return busy / (end - start)


def split_by_phase(records: Sequence[RequestRecord], t0: float,
                   bounds: Sequence[tuple[float, float]]) -> list[list[RequestRecord]]:
    """Records grouped by the phase they were sent in (:func:`phase_index` of ``send_time - t0``), in order."""
    groups: list[list[RequestRecord]] = [[] for _ in bounds]
    for r in records:
        groups[phase_index(r.send_time - t0, bounds)].append(r)
    return groups


def summarize_run(records: Sequence[RequestRecord], t0: float, bounds: Sequence[tuple[float, float]],
                  slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None
                  ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-phase and overall numbers of one run from its records.

    Args:
        records: measured requests (times in s on the perf_counter clock). t0: s, the measured run's start.
        bounds: (start_s, end_s) per phase, s from ``t0``. slo_ttft_ms, slo_tpot_ms: SLOs in ms, or None.

    Returns:
        (one dict per phase, the overall dict over [first start, last end)), each with ``phase`` (1-based, or
        ``"all"``), ``start_s``, ``end_s``, ``num_requests`` and ``num_failed`` (requests sent in the window),
        and, over every request (whenever sent), ``achieved_concurrency`` (:func:`inflight_average`),
        ``output_tokens`` and ``output_throughput_tok_s`` (tokens streamed inside the window / its length, s); over
        the requests sent in the window
        ``ttft_p50_ms``, ``ttft_p99_ms``, ``tpot_p50_ms``, ``tpot_p99_ms`` and ``slo_attainment``
        (:func:`loadgen.compute_metrics` definitions; None without SLOs).
    """
    from loadgen.metrics import compute_metrics

    def window(recs: Sequence[RequestRecord], a: float, b: float) -> dict[str, Any]:
        m = compute_metrics(recs, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms)
        tokens = tokens_between(records, t0 + a, t0 + b)  # every request streaming in the window counts
        return {"start_s": a, "end_s": b, "num_requests": m["num_requests"], "num_failed": m["num_failed"],
                "achieved_concurrency": inflight_average(records, t0 + a, t0 + b), "output_tokens": tokens,
                "output_throughput_tok_s": tokens / (b - a),
                **{k: m[k] for k in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "slo_attainment")}}

    phases = [{"phase": i + 1, **window(recs, a, b)}
              for i, (recs, (a, b)) in enumerate(zip(split_by_phase(records, t0, bounds), bounds))]
    return phases, {"phase": "all", **window(records, bounds[0][0], bounds[-1][1])}
