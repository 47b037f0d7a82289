"""Acceptance that depends on the batch: a finding, for every backend.

Under greedy decoding the drafts a request accepts should not depend on which other requests share its batch: the
target's argmax and the draft's proposals are the same tokens whether a sequence runs alone or beside others (up
to rounding in batched kernels). So at each num_steps K the acceptance length at concurrency c should stay within
noise of its concurrency-1 value on the same prompts. When it does not, the engine's drafting or verification
loses acceptance in batches (llama.cpp 11434 with EAGLE-3: 1.651 at concurrency 1, 1.217 at 4 on the same
prompts and outputs), and that, not the cost of verification, may be what makes speculation lose at high
concurrency.

Noise of one acceptance length ``A = 1 + mean accepted drafts per verify step`` over ``D`` verify steps, from the
per-position acceptance ``p_i`` (share of steps accepting more than i drafts): the accepted count n per step has
E[n] = sum p_i and E[n^2] = sum (2i + 1) p_i, so SE(A) = sqrt((E[n^2] - E[n]^2) / D). Steps of one request are
correlated, so this SE is a lower bound; the test therefore also requires a relative difference of at least
:data:`REL_FLOOR`. A point is flagged when ``|A_c - A_1| > max(REL_FLOOR * A_1, Z * sqrt(SE_1^2 + SE_c^2))``.
Without per-position data only the relative floor applies. Repeats are reduced to their median first.

The comparison needs the same prompts on both sides: request i of a point sends prompt i mod the sample size, so
a point covers every prompt when it finished all its planned requests. A concurrency-1 point cut short (by
``--duration``) measured only the first prompts, and so does a higher-concurrency point that finished fewer
requests than the concurrency-1 point planned: acceptance then differs by prompt mix, and such pairs are not
compared.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

from spectune.core.json_types import JsonObject
from spectune.results.point import SweepPoint, as_points

REL_FLOOR = 0.02
Z = 3.0


@dataclass(frozen=True)
class BatchAcceptanceFinding:
    """One num_steps x concurrency point whose acceptance length left the noise of its concurrency-1 value.

    Attributes:
        steps: num_steps K. concurrency: the concurrency c (> 1).
        acceptance_c1, acceptance: acceptance lengths (tokens per verify step) at concurrency 1 and at c.
        ratio: acceptance / acceptance_c1. threshold: the allowed absolute difference (tokens per verify step).
    """

    steps: int
    concurrency: int
    acceptance_c1: float
    acceptance: float
    ratio: float
    threshold: float

    def sentence(self) -> str:
        """One plain line with the figures."""
        change = "fell" if self.acceptance < self.acceptance_c1 else "rose"
        return (f"K={self.steps}: acceptance length {change} from {self.acceptance_c1:.3f} at concurrency 1 to "
                f"{self.acceptance:.3f} at concurrency {self.concurrency} ({self.ratio - 1:+.1%}, noise "
                f"+/-{self.threshold:.3f}): the engine's acceptance depends on the batch")

    def to_json(self) -> JsonObject:
        return asdict(self)


def acceptance_se(per_position: Sequence[float] | None, num_drafts: float | None) -> float | None:
    """Standard error (tokens per verify step) of an acceptance length from its per-position acceptance rates and
    its number of verify steps (formula in the module docstring); None when either is missing."""
    if not per_position or not num_drafts or num_drafts <= 0:
        return None
    mean = sum(per_position)
    second = sum((2 * i + 1) * p for i, p in enumerate(per_position))
    return math.sqrt(max(second - mean * mean, 0.0) / num_drafts)


def _coverage(points: Iterable[SweepPoint]) -> dict[tuple[int, int], tuple[int, int]]:
    """(K, c) -> (fewest finished requests over the cell's ok repeats, requests planned)."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for p in points:
        if p.status != "ok":
            continue
        done = int(p.metrics.get("num_requests") or 0)
        planned = int(p.requests_planned or done)
        key = p.key.cell
        prev = out.get(key)
        out[key] = (done, planned) if prev is None else (min(prev[0], done), planned)
    return out


def _same_prompts(coverage: dict[tuple[int, int], tuple[int, int]], k: int, c: int) -> bool:
    """Both (K, 1) and (K, c) measured every prompt of the sample (see the module docstring)."""
    done1, planned1 = coverage.get((k, 1), (0, 1))
    done_c, _ = coverage.get((k, c), (0, 1))
    return done1 >= planned1 and done_c >= planned1


def _cells(points: Iterable[SweepPoint]) -> dict[tuple[int, int], tuple[float, float | None]]:
    """(K, c) -> (median acceptance length, SE of the median repeat or None) over ok points with speculation."""
    groups: dict[tuple[int, int], list[tuple[float, float | None]]] = {}
    for p in points:
        a = p.metrics.get("acceptance_length")
        if p.status != "ok" or not isinstance(a, (int, float)) or not math.isfinite(a):
            continue
        if str(p.metrics.get("acceptance_length_source") or "").startswith(("proxy", "config", "none")):
            continue  # a proxy or a constant says nothing about drafting
        se = acceptance_se(p.acceptance.get("per_position"), p.acceptance.get("num_drafts"))
        groups.setdefault(p.key.cell, []).append((float(a), se))
    out = {}
    for key, vals in groups.items():
        med = statistics.median(v for v, _ in vals)
        ses = [s for _, s in vals if s is not None]
        out[key] = (med, statistics.median(ses) if ses else None)
    return out


def batch_dependent_acceptance(points: Iterable[SweepPoint | JsonObject]) -> list[BatchAcceptanceFinding]:
    """Points (records, or points.jsonl objects) whose acceptance length at concurrency c > 1 is outside the noise of the
    same num_steps' concurrency-1 value on the same prompts (module docstring), sorted by num_steps then
    concurrency. Points at num_steps 0, failed points, proxy acceptance and pairs over different prompt sets are
    ignored; a num_steps without a concurrency-1 point gives nothing.

    Raises:
        KeyError: a points.jsonl object lacks ``steps`` or ``concurrency``.
    """
    points = as_points(points)
    cells, coverage = _cells(points), _coverage(points)
    found = []
    for (k, c), (a, se) in sorted(cells.items()):
        if k == 0 or c <= 1 or (k, 1) not in cells or not _same_prompts(coverage, k, c):
            continue
        a1, se1 = cells[(k, 1)]
        threshold = REL_FLOOR * a1
        if se is not None and se1 is not None:
            threshold = max(threshold, Z * math.hypot(se, se1))
        if abs(a - a1) > threshold:
            found.append(BatchAcceptanceFinding(k, c, a1, a, a / a1, threshold))
    return found


def acceptance_vs_c1(points: Iterable[SweepPoint | JsonObject]) -> dict[tuple[int, int], float]:
    """(K, c) -> acceptance length / the same K's concurrency-1 acceptance length (medians over repeats), for every
    K > 0 with a concurrency-1 point over the same prompts (records, or points.jsonl objects): the
    ``acceptance_vs_c1`` column of summary.csv.

    Raises:
        KeyError: a points.jsonl object lacks ``steps`` or ``concurrency``.
    """
    points = as_points(points)
    cells, coverage = _cells(points), _coverage(points)
    return {(k, c): a / cells[(k, 1)][0] for (k, c), (a, _) in cells.items()
            if k > 0 and (k, 1) in cells and cells[(k, 1)][0] > 0 and _same_prompts(coverage, k, c)}
