"""The step-time model of the guided plan: what each measured cell says, and a prediction with its interval for every
cell of the plan.

* **Step time.** ``tau(c, K)``, the time of one verify step seen per sequence, is derived from each measured cell: ``tau
  = c * AL_eff / throughput`` (a closed loop of c sequences emits c * AL_eff tokens per step; ``AL_eff = L / (1 + (L -
  1) / AL)`` for requests of L output tokens whose first token takes a prefill step) or ``tau = TPOT * AL`` (TPOT
  objective). It is fitted by weighted least squares (relative errors, each cell weighted by the inverse of its relative
  variance, its window's own from its interval plus ``MIN_REL_ERROR`` squared, :meth:`StepTimeModel._relative_sd`) on
  the features ``[1, c, K, c*K]`` (fixed cost, batch-proportional verify cost, per-draft-token cost, verify cost of K
  extra tokens per sequence) plus ``[K>0, c*(K>0)]`` (the draft model's fixed per-step cost). Which terms are fitted is
  decided by identifiability: the richest of :attr:`StepTimeModel.FEATURE_SETS` whose design matrix on the measured
  cells has full column rank with a residual degree of freedom to spare and whose fitted step time does not fall as
  num_steps grows (no engine's step costs less with more draft tokens; a fit that falls anyway keeps the fall as a floor
  on its relative error). Each concurrency's predictions are anchored on the cells measured there (geometric mean ratio
  of measured to fitted ``tau``, weighted as the fit): the model gives the shape in K, the measurements the level. From
  seven cells on, a roofline step time (:mod:`spectune.sweep.guided.roofline`: the verify pass memory-bound below a
  ridge in ``c * (K + 1)``, compute-bound above it) replaces the linear terms where its leave-one-out error is lower.
* **Prediction.** ``throughput = c * AL_eff / tau``, ``TPOT = tau / AL`` (scaled by the measured TPOT / (tau / AL) of
  the concurrency when tau was fitted on throughput), AL from :mod:`spectune.sweep.guided.acceptance`. The interval is
  ``pred * (1 +- z * e)``, z the normal quantile of the confidence, ``e^2 = s^2 + g' V g``: ``s`` the largest of the
  anchored fit's relative residual spread, its leave-one-out misfit (the relative RMS error of each cell predicted from
  the others, less what a correct model would miss by too: the cell's and its anchors' measurement noise and the reduced
  fit's at the cell's leverage; what is left is what an unmeasured cell's prediction can be off by where the model's
  shape is wrong, which the residuals of the cells it was fitted to hide), the measurements' own relative half-width,
  the fit's fall in num_steps where it has one (:meth:`StepTimeModel._shape_error`) and ``MIN_REL_ERROR``; ``g' V g``
  the cell's leverage (the parameter covariance ``V = s^2 (Z'Z)^-1``, ``Z`` the features over tau, on the difference
  between the cell's features and the mean of those measured at its concurrency), so an extrapolation in K or c gets the
  width the data give it. SpecServe (Huang et al., arXiv 2503.05096, sec. 4) models the same quantities.

Why each piece is there (what the plan measures without it): docs/sweep.md, "Why each piece is there".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Callable, ClassVar, Sequence

import numpy as np

from spectune.core.json_types import JsonObject
from spectune.results.point import SweepPoint, as_points
from spectune.results.point_numbers import PointNumbers
from spectune.sweep.guided.acceptance import acceptance_lengths, geometric_rate, per_position
from spectune.sweep.guided.roofline import ROOFLINE_PARAMS, fit_roofline

__all__ = ["Cell", "MIN_REL_ERROR", "Prediction", "StepTimeModel"]

#: the model's relative standard error is never taken below this (its structure is never trusted more)
MIN_REL_ERROR = 0.02


def _covariance(feat: Callable[[int, int], list[float]], obs: Sequence[tuple[Cell, float]], var: float | np.ndarray,
                sd: Sequence[float] | None = None) -> np.ndarray:
    """The parameter covariance of the weighted least-squares fit of ``obs`` ((cell, tau s) pairs) with features
    ``feat(k, c)``, in relative units (rows ``z = x / tau``), each cell weighted by ``1 / sd^2`` (``sd``: its relative
    standard deviation, :meth:`StepTimeModel._relative_sd`; None: equal weights), when each cell's relative error has
    variance ``var`` (a float: every cell's; an array: each cell's): the sandwich ``A^-1 Z'W S W Z A^-1``, ``W = diag(1
    / sd^2)``, ``S = diag(var)``, ``A = Z'WZ`` (Huber, "The behavior of maximum likelihood estimates under nonstandard
    conditions", Proc. Fifth Berkeley Symposium 1, 1967); with equal weights and one ``var`` it is ``var *
    (Z'Z)^-1``."""
    Z = np.array([feat(x.steps, x.conc) for x, _ in obs]) / np.array([t for _, t in obs])[:, None]
    w = np.ones(len(obs)) if sd is None else 1.0 / np.square(np.asarray(sd, dtype=float))
    v = np.broadcast_to(np.asarray(var, dtype=float), w.shape)
    a_inv = np.linalg.pinv(Z.T @ (Z * w[:, None]))
    return a_inv @ (Z.T @ (Z * (w * w * v)[:, None])) @ a_inv


def _gradient(feat: Callable[[int, int], list[float]], raw: Callable[[int, int], float], k: int, c: int,
              here: Sequence[Cell]) -> np.ndarray:
    """The relative gradient of tau(k, c) in the parameters (``feat / raw``; zeros where the fit is not positive),
    less its mean over the cells ``here`` measured at c, which anchor the level there (only the shape between them
    and (k, c) is uncertain; with none, the level is too)."""
    def rel(kk: int) -> np.ndarray:
        r = raw(kk, c)
        f = np.array(feat(kk, c), dtype=float)
        return f / r if math.isfinite(r) else np.zeros(len(f))

    g = rel(k)
    return g - np.mean([rel(x.steps) for x in here], axis=0) if here else g


@dataclass
class Prediction:
    """A predicted cell: objective value and its interval, throughput (tokens/s), TPOT p50 (ms) and acceptance
    length with theirs (``*_low``/``*_high``)."""

    steps: int
    concurrency: int
    acceptance_length: float
    throughput: float
    throughput_low: float
    throughput_high: float
    tpot_ms: float
    tpot_low: float
    tpot_high: float

    def row(self) -> JsonObject:
        """A points.jsonl-like object for summary.csv (``predicted`` True, ``status`` ok)."""
        return {"steps": self.steps, "concurrency": self.concurrency, "repeat": 0, "status": "ok", "error": "",
                "predicted": True,
                "metrics": {"output_throughput_tok_s": self.throughput, "tpot_p50_ms": self.tpot_ms,
                            "acceptance_length": self.acceptance_length, "acceptance_length_source": "predicted",
                            "output_throughput_ci_low": self.throughput_low,
                            "output_throughput_ci_high": self.throughput_high,
                            "tpot_p50_ci_low": self.tpot_low, "tpot_p50_ci_high": self.tpot_high}}


@dataclass
class Cell:
    """A measured cell (median over its ok repeats): throughput (tokens/s), TPOT p50 (ms), acceptance length,
    per-position acceptance, relative half-width of its throughput interval, output tokens per request, drafts
    counted and window length (s)."""

    steps: int
    conc: int
    throughput: float
    tpot: float
    al: float
    per_position: list[float]
    rel_halfwidth: float
    tokens_per_request: float = math.nan
    num_drafts: float = 1.0
    duration_s: float = math.nan


class StepTimeModel:
    """The measured cells and the fitted step-time model (module docstring); a mixin of
    :class:`spectune.sweep.guided.GuidedPlanner`, which holds the attributes below."""

    steps: Sequence[int]
    concurrency: Sequence[int]
    objective: str
    confidence: float
    #: the last fit, for sweep.json (features, parameters, anchors, relative error, cells)
    fit_info: JsonObject

    @property
    def z(self) -> float:
        """The two-sided normal quantile of ``confidence`` (prediction intervals)."""
        return NormalDist().inv_cdf((1 + self.confidence) / 2)

    @property
    def z_one_sided(self) -> float:
        """The one-sided normal quantile of ``confidence``: "could this cell still beat the best?" is a one-sided
        question, asked of each unmeasured cell."""
        return NormalDist().inv_cdf(self.confidence)

    # -- what was measured -----------------------------------------------------------------------------------
    def cells(self, points: Sequence[SweepPoint | JsonObject]) -> dict[tuple[int, int], Cell]:
        """Measured ok cells (median over repeats) keyed (steps, concurrency). ``points``: records, or points.jsonl
        objects (:func:`spectune.results.point.as_points`)."""
        groups: dict[tuple[int, int], list[SweepPoint]] = {}
        for p in as_points(points):
            if p.status == "ok" and not p.predicted:
                groups.setdefault(p.key.cell, []).append(p)
        out = {}
        for (k, c), ps in groups.items():
            numbers = [p.numbers for p in ps]

            def med(value: Callable[[PointNumbers], float | None]) -> float:
                vals = [float(v) for n in numbers if (v := value(n)) is not None]
                return float(np.median(vals)) if vals else math.nan
            tput, tpot = med(lambda n: n.output_throughput_tok_s), med(lambda n: n.tpot_p50_ms)
            al = med(lambda n: n.acceptance_length)
            if k == 0:
                al = 1.0
            # a cell at num_steps k drafted positions 0..k-1 only: a server whose counters cover more positions (the
            # bundled engine sized for the largest num_steps, switched between points) reports 0 for the others
            pp = next((list(p.acceptance.get("per_position") or [])[:k] for p in ps
                       if p.acceptance.get("per_position")), [])
            lo, hi = med(lambda n: n.output_throughput_ci_low), med(lambda n: n.output_throughput_ci_high)
            half = (hi - lo) / 2 / tput if all(map(math.isfinite, (lo, hi, tput))) and tput > 0 else math.nan
            toks = [float(n.total_output_tokens) / float(n.num_requests) for n in numbers
                    if n.num_requests and n.total_output_tokens is not None]
            drafts = sum(float(p.acceptance.get("num_drafts") or 0) for p in ps) or 1.0
            if math.isfinite(tput) and tput > 0 and math.isfinite(al):
                out[(k, c)] = Cell(k, c, tput, tpot, al, pp, half, float(np.median(toks)) if toks else math.nan,
                                    drafts, med(lambda n: n.duration_s))
        return out

    # -- the model ---------------------------------------------------------------------------------------------
    def _acceptance_length(self, cells: dict[tuple[int, int], Cell], k: int, c: int) -> float:
        if (k, c) in cells:
            return cells[(k, c)].al
        if k == 0:
            return 1.0
        with_pp = [x for x in cells.values() if x.per_position and x.steps >= 1]
        if with_pp:
            return acceptance_lengths(per_position(with_pp, k, c), [k])[k]
        spec = [x for x in cells.values() if x.steps >= 1 and x.al > 1]
        if not spec:
            return 1.0
        near = min(spec, key=lambda x: (abs(math.log(x.conc) - math.log(c)), -x.steps))
        a = geometric_rate(near.al, near.steps)
        return 1 + sum(a ** i for i in range(1, k + 1))

    @staticmethod
    def _effective(al: float, tokens: float) -> float:
        """Output tokens per step of a request of ``tokens`` tokens: its first token takes a step of its own (the
        prefill), the other tokens - 1 come AL per step: tokens / (1 + (tokens - 1) / AL)."""
        if not (math.isfinite(tokens) and tokens > 1):
            return al
        return tokens / (1 + (tokens - 1) / al)

    def _tokens(self, cells: dict[tuple[int, int], Cell]) -> float:
        vals = [x.tokens_per_request for x in cells.values() if math.isfinite(x.tokens_per_request)]
        return float(np.median(vals)) if vals else math.nan

    def _tau_obs(self, x: Cell, tokens: float = math.nan) -> float:
        if self.objective == "tpot":
            return x.tpot * x.al if math.isfinite(x.tpot) else math.nan
        return x.conc * self._effective(x.al, x.tokens_per_request) / x.throughput

    #: candidate feature sets of tau(c, K), richest first (names in fit_info): the fit uses the first one the
    #: measured cells identify with a residual degree of freedom to spare (module docstring)
    FEATURE_SETS: ClassVar[tuple[tuple[str, ...], ...]] = (
        ("1", "c", "K", "c*K", "K>0", "c*(K>0)"),
        ("1", "c", "K", "c*K", "K>0"),
        ("1", "c", "K", "c*K"),
        ("1", "c", "K"),
        ("1", "c"),
        ("1",),
    )

    @staticmethod
    def _features(k: int, c: int, names: Sequence[str]) -> list[float]:
        """The values of the named features at num_steps ``k``, concurrency ``c`` (FEATURE_SETS)."""
        vals = {"1": 1.0, "c": float(c), "K": float(k), "c*K": float(c * k), "K>0": float(k > 0),
                "c*(K>0)": float(c * (k > 0))}
        return [vals[n] for n in names]

    def _identifies(self, cells: Sequence[Cell], names: Sequence[str]) -> bool:
        """Whether ``cells`` identify the feature set ``names`` with a residual degree of freedom to spare: more cells
        than features and a design matrix of full column rank."""
        X = np.array([self._features(x.steps, x.conc, names) for x in cells])
        return len(cells) > len(names) and np.linalg.matrix_rank(X) == len(names)

    def _feature_set(self, cells: Sequence[Cell]) -> tuple[str, ...]:
        """The richest FEATURE_SETS entry whose design matrix on ``cells`` has full column rank with at least one
        residual degree of freedom (an exactly determined fit would pass through the noise), else the richest with
        full rank."""
        full_rank = []
        for names in self.FEATURE_SETS:
            X = np.array([self._features(x.steps, x.conc, names) for x in cells])
            if np.linalg.matrix_rank(X) == len(names):
                if len(cells) > len(names):
                    return names
                full_rank.append(names)
        return full_rank[0] if full_rank else ("1",)

    def _fit_core(self, obs: Sequence[tuple[Cell, float]], family: str = "linear",
                  names: Sequence[str] | None = None) -> \
            tuple[str, Callable[[int, int], list[float]], np.ndarray, Callable[[int, int], float], dict[int, float]] | None:
        """The weighted least-squares fit of ``obs`` ((cell, observed tau) pairs) in one model family, ``linear`` (the
        richest identifiable :attr:`FEATURE_SETS` entry) or ``roofline``
        (:func:`spectune.sweep.guided.roofline.fit_roofline`): (the features' names, features(k, c), parameters, raw
        tau(k, c) in s (nan where the fit is not positive), anchor per measured concurrency: the geometric mean ratio of
        observed to raw tau there, each cell weighted by ``1 / sd^2`` (:meth:`_relative_sd`)); None where the roofline
        cannot be fitted to these cells. ``names``: the linear family's feature set (default: the richest
        :meth:`_feature_set` identifies)."""
        if family == "roofline":
            rf = fit_roofline([x.steps for x, _ in obs], [x.conc for x, _ in obs], [t for _, t in obs],
                              [self._relative_sd(x) for x, _ in obs])
            if rf is None:
                return None
            label, feat, theta = "roofline: " + ", ".join(ROOFLINE_PARAMS), rf.features, np.array(rf.theta)
        else:
            names = tuple(names) if names is not None else self._feature_set([x for x, _ in obs])
            label = ", ".join(names)
            feat = lambda k, c: self._features(k, c, names)  # noqa: E731
            X = np.array([feat(x.steps, x.conc) for x, _ in obs])
            y = np.array([t for _, t in obs])
            # relative units, inverse-variance weighted
            w = 1.0 / (y * np.array([self._relative_sd(x) for x, _ in obs]))
            theta, *_ = np.linalg.lstsq(X * w[:, None], y * w, rcond=None)

        def raw(k: int, c: int) -> float:
            v = float(np.dot(feat(k, c), theta))
            return v if v > 0 else math.nan

        anchor: dict[int, float] = {}
        for c in {x.conc for x, _ in obs}:
            here = [(t / raw(x.steps, x.conc), self._relative_sd(x) ** -2) for x, t in obs
                    if x.conc == c and math.isfinite(raw(x.steps, x.conc))]
            if here:
                anchor[c] = float(np.exp(np.average(np.log([r for r, _ in here]), weights=[u for _, u in here])))
        return label, feat, theta, raw, anchor

    def _relative_sd(self, x: Cell) -> float:
        """Cell ``x``'s relative standard deviation as the fit weighs it: ``sqrt(noise + MIN_REL_ERROR^2)``, its own
        measurement's variance (:meth:`_noise`) and what no window removes (the model's structure). The fit, the
        roofline's and the anchors weigh each cell by ``1 / sd^2`` (inverse-variance weighting, Aitken, "On least
        squares and linear combination of observations", Proc. R. Soc. Edinburgh 55, 1935): on the bundled engine a
        window stopped early after eight requests at concurrency 1 reads +-10-16%, a full window at concurrency 32
        +-2%, and equal weights let the first pull the fit as hard as the second."""
        return math.sqrt(self._noise(x) + MIN_REL_ERROR ** 2)

    def _noise(self, x: Cell) -> float:
        """The relative variance of cell ``x``'s own measurement (its interval's half-width over z, squared; 0 when
        the point has no interval)."""
        return float((x.rel_halfwidth / self.z) ** 2) if math.isfinite(x.rel_halfwidth) else 0.0

    def _loo_error(self, obs: Sequence[tuple[Cell, float]], family: str = "linear",
                   names: Sequence[str] | None = None) -> tuple[float, int, float]:
        """(relative RMS error, cells, the mean squared error a correct model would show) of leave-one-out
        predictions: each cell measured at a concurrency with another measured cell is predicted by the fit of every
        other cell (the same model: ``names``, the linear family's feature set, skipping a cell without which the
        others no longer identify it with a degree of freedom to spare), anchored on the others at its concurrency,
        as an unmeasured num_steps there is predicted. The in-sample residuals cannot show a step time whose shape
        in K changes with the batch (a roofline's kink between memory- and compute-bound steps, which no candidate
        feature set has): the fit follows the cells it was given, and only a cell it was not given shows the misfit
        (Allen's PRESS, Technometrics 16(1), 1974).

        A left-out prediction errs even where the model's shape is right: by the cell's own measurement noise, its
        anchors' noise, and the reduced fit's parameter noise at the cell (its leverage: with few cells a left-out one
        is an extrapolation, and PRESS residuals grow as ``1 / (1 - h_ii)``). The third value is that expected squared
        error, summed per cell from the cells' measured noise (``_noise``) and the reduced fit's parameter covariance
        under that noise (the weighted fit's sandwich, :func:`_covariance`); the misfit is what the RMS error shows
        beyond it. (nan, 0, 0) with fewer than two such cells."""
        errs, expected = [], []
        for i, (x, t) in enumerate(obs):
            rest = [o for j, o in enumerate(obs) if j != i]
            here = [y for y, _ in rest if y.conc == x.conc]
            if not here or len(rest) < 2:
                continue
            if names is not None and not self._identifies([y for y, _ in rest], names):
                continue  # the same feature set, identified by the others with a degree of freedom to spare
            core = self._fit_core(rest, family, names)
            if core is None:
                continue
            _, feat, _, raw, anchor = core
            pred = raw(x.steps, x.conc) * anchor.get(x.conc, math.nan)
            if not (math.isfinite(pred) and pred > 0) or not all(math.isfinite(raw(y.steps, y.conc)) for y in here):
                continue
            errs.append(t / pred - 1)
            cov = _covariance(feat, rest, np.array([self._noise(y) for y, _ in rest]),
                              [self._relative_sd(y) for y, _ in rest])
            g = _gradient(feat, raw, x.steps, x.conc, here)
            expected.append(self._noise(x) + float(np.mean([self._noise(y) for y in here])) / len(here)
                            + max(float(g @ cov @ g), 0.0))
        if len(errs) < 2:
            return math.nan, len(errs), 0.0
        return math.sqrt(float(np.mean(np.square(errs)))), len(errs), float(np.mean(expected))

    def _physical_linear_fit(self, obs: Sequence[tuple[Cell, float]]) -> tuple[
            tuple[str, ...], tuple[str, Callable[[int, int], list[float]], np.ndarray, Callable[[int, int], float],
                                   dict[int, float]]]:
        """The linear family's feature set and fit (:meth:`_fit_core`) for ``obs``: the richest :attr:`FEATURE_SETS`
        entry the cells identify with a residual degree of freedom to spare whose fitted step time does not fall as
        num_steps grows at any of the plan's concurrencies (:meth:`_shape_error` 0), else the richest
        :meth:`_feature_set` identifies. With few cells the richest set can follow the noise into a shape no engine
        has (on a recorded 5 x 4 grid of the bundled engine, six cells fitted a step at concurrency 1 that fell by a
        fifth from num_steps 1 to 4, and the plan settled concurrency 1 on it at 0.63 of the grid's best); a smaller
        set with the right shape predicts the unmeasured cells better (``python benchmarks/guided_vs_grid.py
        --recorded GRID --without-slo``; docs/sweep.md, "On the bundled engine, live")."""
        cells = [x for x, _ in obs]
        richest = self._feature_set(cells)
        first = None
        for names in self.FEATURE_SETS[self.FEATURE_SETS.index(richest):]:
            if not self._identifies(cells, names):
                continue
            core = self._fit_core(obs, "linear", names)
            assert core is not None  # only the roofline family can fail to fit
            if names == richest:
                first = core
            if self._shape_error(core[3]) <= 0.0:
                return names, core
        if first is None:  # the richest set is identified only without a degree of freedom to spare
            first = self._fit_core(obs, "linear", richest)
            assert first is not None
        return richest, first

    def fit(self, cells: dict[tuple[int, int], Cell]) -> tuple[Callable[[int, int], float],
                                                              Callable[[int, int], float]]:
        """Fit the step-time model; returns (tau(k, c) -> s, err(k, c) -> relative standard error of that cell's
        prediction: the larger of the residual spread and the leave-one-out error, combined with the cell's
        leverage, module docstring)."""
        obs = [(x, self._tau_obs(x)) for x in cells.values()]
        obs = [(x, t) for x, t in obs if math.isfinite(t) and t > 0]
        if not obs:
            raise ValueError("no measured cell to fit")
        # the model family: the linear sum of terms, or the roofline where it predicts left-out cells better
        names, core = self._physical_linear_fit(obs)
        loo, loo_cells, loo_noise = self._loo_error(obs, "linear", names)
        roof = self._fit_core(obs, "roofline")
        if roof is not None:
            roof_loo, roof_cells, roof_noise = self._loo_error(obs, "roofline")
            if math.isfinite(roof_loo) and (not math.isfinite(loo) or roof_loo < loo):
                core, loo, loo_cells, loo_noise = roof, roof_loo, roof_cells, roof_noise
        label, feat, theta, raw, anchor = core
        # anchors between measured concurrencies: interpolate in log c
        known = sorted(anchor)

        def anchor_at(c: int) -> float:
            if not known:
                return 1.0
            if c in anchor:
                return anchor[c]
            lo = max((a for a in known if a < c), default=None)
            hi = min((a for a in known if a > c), default=None)
            if lo is None or hi is None:
                return anchor[lo if hi is None else hi]  # type: ignore[index]
            t = (math.log(c) - math.log(lo)) / (math.log(hi) - math.log(lo))
            return math.exp((1 - t) * math.log(anchor[lo]) + t * math.log(anchor[hi]))

        resid = []
        for c in known:
            here = [(x, t) for x, t in obs if x.conc == c]
            if len(here) >= 2:
                resid += [t / (raw(x.steps, c) * anchor[c]) - 1 for x, t in here if math.isfinite(raw(x.steps, c))]
        s = 0.0
        if resid:  # each anchored concurrency spends one residual degree of freedom on its anchor
            dof = max(len(resid) - sum(1 for c in known if sum(x.conc == c for x, _ in obs) >= 2), 1)
            s = math.sqrt(float(np.sum(np.square(resid))) / dof)
        halves = [x.rel_halfwidth for x, _ in obs if math.isfinite(x.rel_halfwidth)]
        meas = float(np.median(halves)) / self.z if halves else 0.0
        # a left-out cell's error a correct model would show too (its noise, its anchors', the reduced fit's at its
        # leverage); what is left is the model's
        misfit = math.sqrt(max(loo * loo - loo_noise, 0.0)) if math.isfinite(loo) else 0.0
        shape = self._shape_error(raw)
        s = max(s, misfit, meas, shape, MIN_REL_ERROR)
        self.fit_info = {"features": label,
                         "theta": [float(v) for v in theta], "anchors": {str(c): anchor[c] for c in known},
                         "relative_error": s, "loo_error": None if math.isnan(loo) else loo, "loo_cells": loo_cells,
                         "shape_error": shape,
                         "cells": len(obs)}
        # the parameters' own uncertainty from the model's error s, which is the structure's and the same at every
        # cell however precise its window (so the equal-weight design's, s^2 (Z'Z)^-1): a cell the measured ones pin
        # down poorly (an extrapolation in K or c) gets a wider interval than the residual spread alone
        cov = _covariance(feat, obs, s * s)

        def err(k: int, c: int) -> float:
            g = _gradient(feat, raw, k, c, [x for x, _ in obs if x.conc == c])
            return math.sqrt(s * s + max(float(g @ cov @ g), 0.0))

        return (lambda k, c: raw(k, c) * anchor_at(c)), err

    def _shape_error(self, raw: Callable[[int, int], float]) -> float:
        """The largest relative fall of the fitted step time ``raw(k, c)`` as num_steps grows at one of the plan's
        concurrencies: ``max tau(k, c) / tau(k', c) - 1`` over ``k < k'`` (0 where it never falls). No engine's step
        costs less with more draft tokens to draft and verify (each adds a draft pass and a verified position), so a
        fit that falls in K is wrong in shape by at least that much in the plan's range, whatever its residuals say:
        with few cells and nothing left out to check it, its relative error is at least this."""
        worst = 0.0
        for c in self.concurrency:
            taus = [raw(k, c) for k in sorted(self.steps)]
            for i, t in enumerate(taus):
                later = [u for u in taus[i + 1:] if math.isfinite(u) and u > 0]
                if math.isfinite(t) and later:
                    worst = max(worst, t / min(later) - 1)
        return worst

    def predict(self, points: Sequence[SweepPoint | JsonObject]) -> dict[tuple[int, int], Prediction]:
        """Predictions for every cell of the plan (measured ones too), keyed (steps, concurrency); {} when nothing
        usable was measured."""
        cells = self.cells(points)
        if not cells:
            return {}
        tau, err = self.fit(cells)
        z = self.z
        tokens = self._tokens(cells)
        out = {}
        for c in self.concurrency:
            for k in self.steps:
                t = tau(k, c)
                al = self._acceptance_length(cells, k, c)
                if not (math.isfinite(t) and t > 0):
                    continue
                tput = c * (self._effective(al, tokens) if self.objective != "tpot" else al) / t
                tpot = t / al * self._tpot_scale(cells, c)
                e = err(k, c)
                out[(k, c)] = Prediction(k, c, al, tput, tput * (1 - z * e), tput * (1 + z * e), tpot,
                                         tpot * (1 - z * e), tpot * (1 + z * e))
        return out

    def _tpot_scale(self, cells: dict[tuple[int, int], Cell], c: int) -> float:
        """TPOT from a throughput-fitted tau: the ratio of measured TPOT to tau/AL at this concurrency (1 if none)."""
        if self.objective == "tpot":
            return 1.0
        here = [x for x in cells.values() if x.conc == c and math.isfinite(x.tpot)]
        if not here:
            near = sorted(cells.values(), key=lambda x: abs(math.log(x.conc) - math.log(c)))
            here = [x for x in near[:2] if math.isfinite(x.tpot)]
        ratios = [x.tpot / (self._tau_obs(x) / x.al) for x in here if self._tau_obs(x) > 0]  # tau per token vs TPOT
        return float(np.median(ratios)) if ratios else 1.0

