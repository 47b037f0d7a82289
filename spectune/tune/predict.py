"""What ``spectune validate`` should measure, predicted from a sweep's cells: per phase of a time-varying workload,
the output throughput (tokens/s) of every static num_steps and of a per-batch-size config, with intervals.

The model is a fluid closed/open loop over the sweep's measured throughput T(K, n) (tokens/s of num_steps K with n
requests in flight: the cell medians, linear in log2(n) between swept concurrencies, flat beyond them; 0 at n = 0).
All n requests in flight progress at T(K, n) / n tokens/s each; a request needs ``max_tokens`` tokens (the
workload's requests are capped there; the sweep's at the same cap). Closed-loop phases keep ``concurrency`` requests
in flight: after a drop, the requests already running finish first (a c=1 phase after c=32 drains 32 requests for
its first seconds, as validate's loop does); open-loop phases and traces start requests at their arrival times
(evenly spaced at the phase's rate; a trace's own offsets), at most ``max_concurrency`` at once. A config runs, at n
requests in flight, the num_steps its batch-size slot routes n to (SGLang: the largest slot lower bound <= n; a
ladder with several candidates is taken to rest on the one the sweep measured best at the nearest concurrency;
vLLM: its schedule's K for n), at the cells of the engine's schedule server where the sweep measured it (the server
a config runs: ``spectune sweep --schedule-server``), else at the static cells. Phase throughput = tokens produced inside the phase's window / its length, as
validate counts it (:mod:`spectune.validate.phases`).

The interval: the same model run on the cells' lower and upper bounds of their bootstrap intervals
(``ci_low``/``ci_high`` of recommendation.json's cells when the objective was throughput), so it carries the sweep's
uncertainty about each cell, not the validate run's own noise or the machine's drift between the two.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence, Union

from spectune.results.cell import Cell
from spectune.results.validate_doc import PredictedRun, RecordedPhase, RecordedWorkload

if TYPE_CHECKING:
    from spectune.backends.num_steps.sglang_config import AdaptiveConfig
    from spectune.backends.num_steps.vllm_schedule import VllmSchedule

Rate = Callable[[int], float]  # requests in flight -> output tokens/s of the whole server


MODEL = "fluid closed/open loop over the sweep's cells (spectune.tune.predict)"
"""How :func:`predict_validate` predicts (validate.json's ``prediction.model``)."""


def throughput_table(cells: Sequence[Cell], which: str = "point", objective: str = "") -> dict[int, dict[int, float]]:
    """{num_steps: {concurrency: tokens/s}} from recommendation.json ``cells`` (``status`` ok, not predicted, metric
    ``output_throughput_tok_s``; ``which`` ``low``/``high``: the cell's ``ci_low``/``ci_high`` when the
    recommendation's ``objective`` was throughput and they are known, else the median)."""
    out: dict[int, dict[int, float]] = {}
    for c in cells:
        if c.status != "ok" or c.predicted:
            continue
        v = c.metric("output_throughput_tok_s")
        if which != "point":
            b = c.ci_low if which == "low" else c.ci_high
            v = b if isinstance(b, (int, float)) and math.isfinite(b) and objective == "throughput" else v
        if isinstance(v, (int, float)) and math.isfinite(v):
            out.setdefault(int(c.steps), {})[int(c.concurrency)] = float(v)
    return out


def rate_of(table: Mapping[int, float]) -> Rate:
    """T(n) from {concurrency: tokens/s}: linear in log2(n) between measured concurrencies, flat outside them."""
    xs = sorted(table)
    ys = [table[x] for x in xs]

    def rate(n: int) -> float:
        if n <= 0 or not xs:
            return 0.0
        if n <= xs[0]:
            return ys[0] * (n / xs[0] if xs[0] > 1 else 1.0)
        if n >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, n)
        a, b = xs[i - 1], xs[i]
        f = (math.log2(n) - math.log2(a)) / (math.log2(b) - math.log2(a))
        return ys[i - 1] + f * (ys[i] - ys[i - 1])

    return rate


@dataclass(frozen=True)
class StaticSteps:
    """A config that runs one num_steps at every batch size (a static config file): ``steps``."""

    steps: int

    def k_for_batch_size(self, batch_size: int) -> int:
        """num_steps at ``batch_size`` requests: always ``steps``."""
        return self.steps


Config = Union["AdaptiveConfig", "VllmSchedule", StaticSteps]
"""A parsed config the prediction runs: an SGLang adaptive config, a vLLM schedule or one static num_steps."""


def config_steps(config: Config, table: Mapping[int, Mapping[int, float]]) -> Callable[[int], int]:
    """n requests in flight -> num_steps a config runs there (module docstring). ``config``: a parsed
    :class:`~spectune.backends.num_steps.sglang_config.AdaptiveConfig`,
    :class:`~spectune.backends.num_steps.vllm_schedule.VllmSchedule` or :class:`StaticSteps`."""
    if hasattr(config, "k_for_batch_size"):
        return lambda n: int(config.k_for_batch_size(max(1, n)))
    bounds = [s.lower_bound for s in config.slots]

    def steps(n: int) -> int:
        slot = config.slots[max(0, bisect.bisect_right(bounds, max(1, n)) - 1)]
        cand = list(slot.candidate_steps)
        if len(cand) == 1:
            return cand[0]

        def measured(k: int) -> float:
            row = table.get(k) or {}
            if not row:
                return -math.inf
            c = min(row, key=lambda x: abs(math.log2(x) - math.log2(max(1, n))))
            return row[c]
        return max(cand, key=lambda k: (measured(k), -k))

    return steps


def simulate(phases: Sequence[RecordedPhase], rate: Callable[[int], float], max_tokens: int,
             max_concurrency: int = 64, arrivals: Sequence[float] = ()) -> list[float]:
    """Output tokens/s inside each phase (``phases``: validate.json's workload phases, ``start_s``, ``end_s``,
    ``concurrency`` or ``rate``) of the fluid model in the module docstring; ``rate``: requests in flight ->
    server tokens/s; ``arrivals``: a trace's send offsets (s) instead of the phases' own load."""
    total = phases[-1].end_s
    bounds = [(p.start_s, p.end_s) for p in phases]
    tokens = [0.0] * len(phases)
    remaining: list[float] = []  # tokens left per request in flight (min-heap)
    done = 0.0  # tokens each in-flight request has received, as an offset (all progress alike)
    waiting = 0
    if arrivals:
        pending = sorted(arrivals)
    else:
        pending = []
        for p in phases:
            r = p.rate
            if p.concurrency is None and r:
                pending += [p.start_s + (i + 0.5) / r for i in range(int((p.end_s - p.start_s) * r))]
        pending.sort()
    pi = 0
    t = 0.0

    def phase_at(x: float) -> int:
        return min(max(bisect.bisect_right([a for a, _ in bounds], x) - 1, 0), len(bounds) - 1)

    def top_up(x: float) -> None:
        nonlocal waiting
        c = phases[phase_at(x)].concurrency
        if c is not None and not arrivals:
            first = not remaining and x == 0.0
            while len(remaining) < c:
                # the first requests of a run are staggered (in steady state their lengths differ)
                extra = length() * (len(remaining) + 1) / c if first else length()
                heapq.heappush(remaining, done + extra)
        while waiting and len(remaining) < max_concurrency:
            waiting -= 1
            heapq.heappush(remaining, done + max_tokens)

    count = [0]

    def length() -> float:
        """Tokens of the next request: ``max_tokens`` x 0.75..1.25 in a fixed low-discrepancy order (mean
        ``max_tokens``), so requests started together do not all finish together (real lengths differ)."""
        count[0] += 1
        return max_tokens * (0.75 + 0.5 * ((count[0] * 0.6180339887) % 1.0))

    top_up(0.0)
    while t < total - 1e-9:
        while pi < len(pending) and pending[pi] <= t + 1e-12:
            waiting += 1
            pi += 1
        top_up(t)
        n = len(remaining)
        per = rate(n) / n if n else 0.0
        nxt = min([b for a, b in bounds if b > t + 1e-12] + ([pending[pi]] if pi < len(pending) else [math.inf]))
        if n and per > 0:
            nxt = min(nxt, t + (remaining[0] - done) / per)
        nxt = min(max(nxt, t + 1e-9), total)
        i = phase_at(t)
        tokens[i] += per * n * (nxt - t)
        done += per * (nxt - t)
        t = nxt
        while remaining and remaining[0] - done <= 1e-9:
            heapq.heappop(remaining)
    return [tk / (b - a) for tk, (a, b) in zip(tokens, bounds)]


def predict_validate(cells: Sequence[Cell], objective: str, workload: RecordedWorkload, steps: Sequence[int],
                     config: Config | None, max_tokens: int, arrivals: Sequence[float] = (),
                     config_cells: Sequence[Cell] = ()) -> dict[str, PredictedRun]:
    """Predicted output tokens/s per run and phase of a validation.

    Args:
        cells: recommendation.json ``cells``. objective: its ``options.objective`` (the intervals are throughput
            intervals only when it is ``throughput``). workload: validate.json ``plan.workload`` (``phases``,
            ``max_concurrency``). steps: the static num_steps runs. config: the parsed config (or None).
        max_tokens: the requests' cap. arrivals: a trace's send offsets (s), or ().
        config_cells: recommendation.json ``schedule_cells``: the engine's schedule server pinned to each num_steps
            (the server the config runs); the config's run is predicted from them, a num_steps they lack from
            ``cells``. Empty: from ``cells`` (the static servers).

    Returns:
        run name -> its prediction (:class:`~spectune.results.validate_doc.PredictedRun`: [point, low, high]
        tokens/s per phase and overall; a run whose num_steps the sweep did not measure is left out).
    """
    tables = {w: throughput_table(cells, w, objective) for w in ("point", "low", "high")}
    phases = list(workload.phases)
    cap = int(workload.max_concurrency or 64)
    total = phases[-1].end_s - phases[0].start_s if phases else 0.0
    runs: dict[str, PredictedRun] = {}

    def run(name: str, rate_for: Callable[[str], Callable[[int], float]]) -> None:
        sims = [simulate(phases, rate_for(w), max_tokens, cap, arrivals) for w in ("point", "low", "high")]
        per_phase = [sorted([s[i] for s in sims[1:]]) for i in range(len(phases))]
        overall = [sum(s[i] * (p.end_s - p.start_s) for i, p in enumerate(phases)) / total for s in sims]
        runs[name] = PredictedRun([[sims[0][i], min(lo, sims[0][i]), max(hi, sims[0][i])]
                                   for i, (lo, hi) in enumerate(per_phase)],
                                  [overall[0], min(overall[1:] + [overall[0]]), max(overall[1:] + [overall[0]])])

    # a bound's table has every (num_steps, concurrency) the medians' has (a cell's bound falls back to its median)
    for k in steps:
        if k in tables["point"]:
            run(f"static:{k}", lambda w, k=k: rate_of({**tables["point"][k], **tables[w][k]}))
    if config is not None:
        served = {w: {**tables[w], **throughput_table(config_cells, w, objective)} for w in ("point", "low", "high")}
        pick = config_steps(config, served["point"])
        if all(k in served["point"] for k in {pick(n) for n in range(1, cap + 1)}):
            def rate_for(w: str) -> Callable[[int], float]:
                rates = {k: rate_of({**served["point"][k], **served[w][k]}) for k in served["point"]}
                return lambda n: rates[pick(n)](n)
            run("config", rate_for)
    return runs
