"""A roofline step time for the guided plan's model: the verify pass is memory-bound (its time set by reading the
weights and KV cache once, ``m0 + m1 * c``) until the tokens it verifies, ``c * (K + 1)``, make it compute-bound
(``v * c * (K + 1)``), and the K draft steps add ``K * (d0 + d1 * c)``:

    tau(c, K) = max(m0 + m1 * c, v * c * (K + 1)) + K * (d0 + d1 * c)      (s per verify step)

This is the roofline of Williams, Waterman and Patterson ("Roofline: an insightful visual performance model for
multicore architectures", CACM 52(4), 2009) applied to one decode step: a GPU decodes a small batch at its memory
bandwidth and a large one at its FLOP rate, so the gain of a draft token changes sign where the batch crosses the
ridge, which a sum of linear terms (:attr:`spectune.sweep.guided.model.StepTimeModel.FEATURE_SETS`) cannot follow.

Given which cells lie on which side of the ridge the model is linear in its five parameters; the fit tries every split
of the cells by ``c * (K + 1)`` (at least two cells on each side), refines it by reassigning each cell to the branch
that is larger under the fitted parameters, and keeps the split of least weighted squared error (relative, over each
cell's relative standard deviation when given) whose parameters are positive.
:meth:`spectune.sweep.guided.model.StepTimeModel.fit` uses it instead of the linear model where its leave-one-out error
is lower.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["RooflineFit", "fit_roofline", "ROOFLINE_PARAMS"]

#: parameter names, in ``RooflineFit.theta``'s order (sweep.json ``guided.fit.features``)
ROOFLINE_PARAMS = ("max(1, c | c*(K+1))", "c (memory)", "c*(K+1) (compute)", "K", "c*K")


def _features(k: int, c: int, compute: bool) -> list[float]:
    """The linear features of one cell on one side of the ridge: memory ``[1, c, 0, K, cK]``, compute ``[0, 0,
    c(K+1), K, cK]``."""
    return [0.0, 0.0, float(c * (k + 1)), float(k), float(c * k)] if compute else \
        [1.0, float(c), 0.0, float(k), float(c * k)]


@dataclass(frozen=True)
class RooflineFit:
    """A fitted roofline step time (module docstring): ``theta`` = (m0, m1, v, d0, d1), seconds."""

    theta: tuple[float, ...]

    def compute_bound(self, k: int, c: int) -> bool:
        """Whether (K, c) lies on the compute side of the ridge."""
        m0, m1, v = self.theta[:3]
        return v * c * (k + 1) > m0 + m1 * c

    def features(self, k: int, c: int) -> list[float]:
        """The cell's features on its side of the ridge (tau = features . theta); the gradient of tau in theta."""
        return _features(k, c, self.compute_bound(k, c))

    def tau(self, k: int, c: int) -> float:
        """Seconds per verify step at num_steps ``k``, concurrency ``c``."""
        return float(np.dot(self.features(k, c), self.theta))


def _solve(ks: Sequence[int], cs: Sequence[int], taus: np.ndarray, compute: Sequence[bool],
           sd: np.ndarray) -> np.ndarray | None:
    X = np.array([_features(k, c, b) for k, c, b in zip(ks, cs, compute)])
    if np.linalg.matrix_rank(X) < X.shape[1]:
        return None
    w = 1.0 / (taus * sd)
    theta, *_ = np.linalg.lstsq(X * w[:, None], taus * w, rcond=None)
    return theta


def fit_roofline(ks: Sequence[int], cs: Sequence[int], taus: Sequence[float],
                 sd: Sequence[float] | None = None) -> RooflineFit | None:
    """The least-squares roofline through the cells (num_steps ``ks``, concurrencies ``cs``, observed step times
    ``taus`` in s, all of one length; ``sd``: each cell's relative standard deviation, the weights' inverse in relative
    units, as :meth:`spectune.sweep.guided.model.StepTimeModel._relative_sd`; None: equal), or None: fewer than seven
    cells (five parameters and two residual degrees of freedom), or no split of the cells with two on each side gives
    full-rank designs and positive ``m0``, ``v``."""
    n = len(taus)
    if n < 7:
        return None
    y = np.asarray(taus, dtype=float)
    sdv = np.ones(n) if sd is None else np.asarray(sd, dtype=float)
    u = [c * (k + 1) for k, c in zip(ks, cs)]
    best: tuple[float, RooflineFit] | None = None
    for thr in sorted(set(u)):
        compute = [x > thr for x in u]
        if sum(compute) < 2 or n - sum(compute) < 2:
            continue
        for _ in range(6):  # refine the split: each cell to the branch that is larger under the fitted parameters
            theta = _solve(ks, cs, y, compute, sdv)
            if theta is None:
                break
            fit = RooflineFit(tuple(float(t) for t in theta))
            again = [fit.compute_bound(k, c) for k, c in zip(ks, cs)]
            if again == compute or sum(again) < 2 or n - sum(again) < 2:
                break
            compute = again
        if theta is None or theta[0] <= 0 or theta[2] <= 0:
            continue
        pred = np.array([fit.tau(k, c) for k, c in zip(ks, cs)])
        if np.any(pred <= 0):
            continue
        sse = float(np.sum(np.square((y / pred - 1) / sdv)))
        if best is None or sse < best[0]:
            best = (sse, fit)
    return None if best is None else best[1]
