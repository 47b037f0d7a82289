"""Acceptance length of every num_steps from the per-position acceptance of one run (chain drafting).

For chain drafting the draft of num_steps K is the first K tokens of the draft of any larger num_steps, so the
per-position acceptance ``p_i`` (share of verify steps whose first i+1 drafts were all accepted;
``acceptance.per_position`` of a point) measured at the largest num_steps gives ``AL(K) = 1 + sum_{i<K} p_i`` for
every smaller K (vLLM's "mean acceptance length" identity). Acceptance may depend on the batch
(spectune.results.batch_acceptance), so each ``p_i`` is the draft-weighted mean over the measured cells at the
nearest measured concurrency (log scale) that drafted at least i+1 tokens (:func:`per_position`). Without
per-position counters a geometric acceptance ``p_i = a^(i+1)`` is fitted to a measured acceptance length
(:func:`geometric_rate`).
"""

from __future__ import annotations

import math
from typing import Protocol, Sequence, TypeVar

__all__ = ["acceptance_lengths", "geometric_rate", "nearest", "per_position"]


class AtConcurrency(Protocol):
    """A measured cell as :func:`nearest` reads it: its concurrency ``conc``."""

    @property
    def conc(self) -> int: ...


class DraftedCell(AtConcurrency, Protocol):
    """A measured cell as :func:`per_position` reads it: ``conc``, ``per_position`` (acceptance rate per draft
    position) and ``num_drafts`` (verify steps with drafting, its weight)."""

    @property
    def per_position(self) -> list[float]: ...

    @property
    def num_drafts(self) -> float: ...


CellT = TypeVar("CellT", bound=AtConcurrency)


def acceptance_lengths(per_position: Sequence[float], steps: Sequence[int]) -> dict[int, float]:
    """AL(K) = 1 + sum of the first K per-position acceptance rates, for each K in ``steps`` (K larger than the
    vector: the last rate repeated geometrically with the ratio of the last two, or the last rate)."""
    p = [float(x) for x in per_position]
    out = {}
    for k in steps:
        vals = list(p[:k])
        while len(vals) < k:
            last = vals[-1] if vals else 0.0
            ratio = (p[-1] / p[-2]) if len(p) >= 2 and p[-2] > 0 else 1.0
            vals.append(last * min(ratio, 1.0))
        out[k] = 1.0 + sum(vals)
    return out


def nearest(cells: Sequence[CellT], c: int) -> list[CellT]:
    """The cells (anything with ``conc``) at the measured concurrency nearest ``c`` on a log scale (non-empty
    ``cells``)."""
    d = min(abs(math.log(x.conc) - math.log(c)) for x in cells)
    return [x for x in cells if abs(math.log(x.conc) - math.log(c)) == d]


def geometric_rate(al: float, k: int) -> float:
    """The per-token acceptance a with 1 + a + ... + a^k = ``al`` (bisection; 0..1)."""
    if k <= 0 or al <= 1.0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if 1 + sum(mid ** i for i in range(1, k + 1)) < al:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def per_position(with_pp: Sequence[DraftedCell], k: int, c: int) -> list[float]:
    """Per-position acceptance for positions 0..k-1 at concurrency c: for each position, the draft-weighted mean
    over the measured cells (anything with ``conc``, ``per_position``, ``num_drafts``) that drafted that far at the
    nearest measured concurrency (log scale)."""
    out = []
    for i in range(k):
        pool = [x for x in with_pp if len(x.per_position) > i]
        if not pool:
            break
        near = nearest(pool, c)
        out.append(sum(x.per_position[i] * x.num_drafts for x in near) / sum(x.num_drafts for x in near))
    return out
