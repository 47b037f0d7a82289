"""The model-guided sweep (``spectune sweep --plan guided``): measure only the cells that could still be the best,
predict the others from what the engine already reports.

The model (docs/sweep.md, "Guided plan"), in the quantities SpecServe (Huang et al., arXiv 2503.05096, sec. 4)
models for the same decision:

* **Acceptance length of every num_steps from one run.** For chain drafting the draft of num_steps K is the first K
  tokens of the draft of any larger num_steps, so the per-position acceptance ``p_i`` (share of verify steps whose
  first i+1 drafts were all accepted; ``acceptance.per_position`` of a point) measured at the largest num_steps
  gives ``AL(K) = 1 + sum_{i<K} p_i`` for every smaller K (vLLM's "mean acceptance length" identity). Acceptance may
  depend on the batch (spectune.results.batch_acceptance), so each ``p_i`` is the draft-weighted mean over the
  measured cells at the nearest measured concurrency (log scale) that drafted at least i+1 tokens. Without
  per-position counters a geometric acceptance ``p_i = a^(i+1)`` is fitted to the measured acceptance lengths.
* **Step time.** ``tau(c, K)``, the time of one verify step seen per sequence, is derived from each measured cell:
  ``tau = c * AL_eff / throughput`` (throughput objective: a closed loop of c sequences emits c * AL_eff tokens per
  step, ``AL_eff = L / (1 + (L - 1) / AL)`` for requests of L output tokens whose first token takes a prefill step)
  or ``tau = TPOT * AL`` (TPOT objective). It is fitted by weighted least squares (relative errors) on the
  features ``[1, c, K, c*K]`` (a fixed cost, batch-proportional verify cost, per-draft-token cost, and the verify
  cost of K extra tokens per sequence), plus ``[K>0, c*(K>0)]`` (the draft model's own fixed per-step cost: the
  jump in step time from no speculation to one draft token, large on a CPU or for a draft with its own KV cache).
  Which of these terms are fitted is decided by identifiability, not by a cell count: the richest of
  ``GuidedPlanner.FEATURE_SETS`` whose design matrix on the measured cells has full column rank with at least one
  residual degree of freedom to spare (an exactly determined fit passes through the noise and reports no residual
  spread). So ``K>0`` enters as soon as K=0 and two num_steps >= 1 are measured at one concurrency (the seed round
  plus one cell), instead of after eight cells with three spec levels, which left the seed's fit unable to tell the
  draft's fixed cost from its per-token cost: it then predicted K=1 beating K=0 at every concurrency and the first
  round went to K=1 everywhere. Each concurrency's predictions are then anchored on the cells measured there (the
  mean ratio of measured to fitted ``tau``), so the model supplies the shape in K and the measurements the level.
* **Prediction.** ``throughput = c * AL_eff / tau``, ``TPOT = tau / AL`` (scaled by the measured TPOT / (tau / AL) of
  the concurrency when tau was fitted on throughput). The prediction interval is ``pred * (1 +- z * e)``, z the
  normal quantile of the confidence and ``e`` the cell's relative standard error: ``e^2 = s^2 + g' V g``. ``s`` is
  the larger of the relative residual spread of the anchored fit (over concurrencies with two or more measured
  cells, one degree of freedom per anchor), the measurements' own relative half-width and 2% (``MIN_REL_ERROR``:
  the model's structure is never trusted more). ``g' V g`` is the cell's leverage, the ordinary least-squares
  prediction variance of the fitted parameters (``V = s^2 (X'WX)^-1``, relative units), taken on the difference
  between the cell's features and the mean of the cells measured at its concurrency (the anchor cancels the level
  there; at a concurrency with nothing measured the whole level is uncertain). Without it a fit identified by few
  cells reads as certain far from them: on a noisy compute-bound server a seed that saw K=1 tie K=0 at c=32 then
  ruled out K=1 at c=1 (where it was 18% better) at the 2% floor; with it, extrapolations in K or c get the width
  the data give them, and cells between measured ones stay narrow.

**The loop.** A seed round (:meth:`GuidedPlanner.seed`: the largest num_steps at the smallest concurrency, num_steps 0
and 1 at the largest, num_steps 0 at the middle concurrency; K=0 and K=1 side by side at one concurrency identify the
draft's fixed cost), then a fifth cell chosen by what that pair showed (:meth:`GuidedPlanner.seed_fifth`: where K=1
beats K=0 at the largest concurrency by more than the noise band, speculation pays at the largest batch and the middle
num_steps there measures the per-draft-token cost; otherwise num_steps 1 at the middle concurrency shows how the draft's
fixed cost scales with the batch, where speculation stops paying). A fixed fifth cell wasted a point either way: always
the middle num_steps at the largest concurrency, the replay of the bundled engine's 2026-11-23 grid
(docs/examples/smollm2-cpu/sweep at that date, where K=0 wins from concurrency 2 up) measured 13 points, 41.1% of the
grid's time (now 12, 37.3%, the same choices), and virtual compute-bound sweeps 36.1% (now 29.6%); always K=1 at the
middle concurrency, virtual memory-bound sweeps (K=2 best everywhere) measured 38.3% instead of 34.6%, 16 of 48 over 40%
(now unchanged: 34.6%, 1 of 48). The grid's choice within 3% at every concurrency: 33 and 37 of 48 virtual sweeps
(compute- and memory-bound: 2% and 4% noise, four closed-loop waves per point), against 34 and 37 with the fixed cell.
Then, one cell at a time with the model refitted after each (:meth:`GuidedPlanner.next_round`; where a server restart
costs more than a point, a round of every such cell of the one num_steps with the largest summed expected improvement:
one restart per round): first one cell at each concurrency with nothing measured (its predicted best num_steps), then
the cell of the highest expected improvement per expected second among those still worth measuring
(:meth:`GuidedPlanner.values`). A cell is worth measuring when

1. its optimistic prediction (one-sided quantile of the confidence: "could it still beat the best?" is a one-sided
   question) beats the best cell measured at its concurrency by more than the noise band, for a smaller num_steps
   as for a larger one. A difference inside the band is not called (``spectune recommend`` calls it a tie and
   takes the smaller num_steps), so an unmeasured cell inside the band can cost at most the band, less than the 3%
   a choice may be off; and
2. its expected improvement beyond the band, ``E[max(0, Y - best (1 + band))] / best`` for a normal Y with the
   cell's prediction and standard error, is at least a quarter of the band (``EI_SHARE_OF_BAND``; 0.5% of the
   objective at the default 2% band). Condition 1 alone keeps measuring a cell whose interval merely brushes the
   band (optimistic 2.3% above the best, expected gain 0.06%); measuring it costs a whole point and it almost never
   changes the choice. The threshold scales with ``--noise-band``: a user who calls smaller differences gets a
   finer search.

The windows themselves stop once the decision they serve is settled (:mod:`spectune.sweep.sequential`, on by default
for this plan), and a cell of another num_steps than the running server's costs its window plus the launch or switch
time measured so far; ``why`` records, per measured cell, why it was chosen (sweep.json ``guided.why``).

The expected duration of a cell (:meth:`GuidedPlanner._duration`) is the output tokens a point at the nearest
measured concurrency produced (duration x throughput) over the cell's predicted throughput: with a fixed number of
prompts a c=1 cell takes several times as long as a c=32 one, with a duration cap they cost the same, and the ratio
of value to seconds prefers the cheap cell of two equally informative ones. One cell at a time matters because one
cell moves the model everywhere: after the seed the fit cannot yet tell how the draft's fixed cost scales with the
batch, and a round of one cell per concurrency spent four cells on K=1 where one would have shown it losing. The
plan stops when no cell is worth measuring (the choice is settled at the requested confidence), or at the budget
(``--budget`` points or seconds). Every unmeasured cell is then predicted and written to summary.csv with
``predicted`` True.

**Settling.** When no unmeasured cell is worth measuring, each concurrency's choice is made from measured cells, and
``spectune recommend`` prefers a smaller num_steps that ties with the best: its ratio to the best is within the noise
band, or the paired interval of that ratio reaches the band. The second kind of tie can rest on the interval's width
alone: on the bundled engine a guided run measured K=1 over K=0 at concurrency 1 at 1.058x [1.017, 1.099] (a tie:
K=0 chosen) where the grid's run of the same cells had 1.107x [1.072, 1.143]. Such a comparison is *unsettled*
(:meth:`GuidedPlanner.comparisons`: the ratio is beyond the band, its interval reaches it; more runs would narrow it
around the ratio and make the larger num_steps win), and :meth:`GuidedPlanner.settle` measures one more run of one
cell of the pair (the one with fewer runs, else the one with the wider interval: one point per unsettled pair per
round, then the comparisons again), at most ``SETTLE_REPEATS`` (2) beyond ``--repeats`` per cell, until
every deciding comparison is a tie by its ratio, a clear loss, or out of runs. The comparisons are recommend's
(paired bootstrap over prompts and repeats, :class:`spectune.results.confidence.Bootstrap`); a ratio within the band
is settled however wide its interval (recommend calls it a tie whatever more runs show, unless the ratio itself
moves), and so is one whose ratio beats the band by less than ``EI_SHARE_OF_BAND`` of it (the threshold a new cell's
expected improvement must pass: on the compute-bound emulated server a pair at 0.979 took two more points to end as a
tie), so a pair whose true difference sits at the band's edge does not take every run it is allowed. The last
comparisons are in sweep.json (``guided.comparisons``).

Checked on measured 5x6 grids of the bundled engine on CPU (docs/examples/smollm2-cpu/sweep and its earlier versions in
git, replayed by benchmarks/guided_vs_grid.py: bf16 path 10 of 30 points, 33% of the grid's measuring time, the grid's
choice at every concurrency; native path on a Xeon 13 points, 41%, the same choices; run live: 12 points, 37%, 5 of 6;
with the settle step 13 points, 40.7%, 6 of 6; with the chosen fifth seed cell on a Zen 5 VM, live after its grid, 12
points, 37.4%, 6 of 6, and replayed on that grid 10 points, 32.1%, 5 of 6, docs/sweep.md) and on the two emulated
servers (tests/helpers/cost_model.py; virtual points with 2% and 4% noise, 96 sweeps: the grid's choice within 3% in 82,
the noise-free model's in 79, against 86 and 74 for the plan this replaced (a four-cell seed, then rounds of one cell
per concurrency), at 32% of the grid's time on average instead of 34%, 4 sweeps over 40% instead of 13). Without the
leverage term the replay is unchanged but agreement drops to 74 of 96, the worst choice 17% below the best instead of
6%; with the expected-improvement threshold at a tenth of the band the replay measures 16 points instead of 10; at three
quarters of the band it misses the best num_steps at one concurrency of the replay and agreement drops to 69 of 96. A
live server departs from any smooth step-time model cell by cell (the in-process emulated compute-bound server, 64
prompts: K=1 at c=1 predicted 267 [247, 287] tok/s, measured 306 by the grid, so never measured and the choice 10% off):
the in-sample residual spread does not see that. A leave-one-out prediction error as the floor of ``s`` does (replays of
40 grids of the two emulated servers: every concurrency agreed in 21 of 21 compute-bound sweeps instead of 16, 15 of 19
memory-bound instead of 14) but measures 46% and 54% of the grids' time instead of 39% and 40%; not used.
Where a restart costs more than a point the saving is smaller: the seed alone launches three or four num_steps (the
replay of the 2026-11-23 grid with a nominal 60 s per launch: 12 of 30 points, 5 launches, 50.5% of the grid's time with
its 5 launches, the grid's choice at every concurrency). A round there goes to the num_steps that opens the most
concurrencies with nothing measured yet, then the largest summed value: when that count was summed as infinities, every
such tie went to the smaller num_steps, the replay never measured K=1 at concurrency 1 and chose K=0 there, 9.7% below
the grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, ClassVar, Sequence

import numpy as np

from spectune.results.confidence import Bootstrap, RunRequests, ratio_interval

__all__ = ["GuidedPlanner", "Prediction", "acceptance_lengths"]

MIN_REL_ERROR = 0.02


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


def _nearest(cells: Sequence[Any], c: int) -> list[Any]:
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

    def row(self) -> dict[str, Any]:
        """A points.jsonl-like object for summary.csv (``predicted`` True, ``status`` ok)."""
        return {"steps": self.steps, "concurrency": self.concurrency, "repeat": 0, "status": "ok", "error": "",
                "predicted": True,
                "metrics": {"output_throughput_tok_s": self.throughput, "tpot_p50_ms": self.tpot_ms,
                            "acceptance_length": self.acceptance_length, "acceptance_length_source": "predicted",
                            "output_throughput_ci_low": self.throughput_low,
                            "output_throughput_ci_high": self.throughput_high,
                            "tpot_p50_ci_low": self.tpot_low, "tpot_p50_ci_high": self.tpot_high}}


@dataclass
class _Cell:
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


@dataclass
class GuidedPlanner:
    """Chooses what a guided sweep measures next and predicts the rest (module docstring).

    Args:
        steps, concurrency: the plan's num_steps and concurrencies (ascending). repeats: runs per measured cell.
        objective: ``throughput`` or ``tpot``. confidence: of the prediction intervals (0..1).
        noise_band: fraction; differences below it are ties (the smaller num_steps wins).
    """

    steps: Sequence[int]
    concurrency: Sequence[int]
    repeats: int = 1
    objective: str = "throughput"
    confidence: float = 0.95
    noise_band: float = 0.02
    rounds: list[list[tuple[int, int]]] = field(default_factory=list)
    fit_info: dict[str, Any] = field(default_factory=dict)
    #: the deciding comparisons the settle step last saw (:meth:`comparisons`), for sweep.json
    decisions: list[dict[str, Any]] = field(default_factory=list)
    #: why each proposed cell was measured, in order (sweep.json ``guided.why``)
    why: list[dict[str, Any]] = field(default_factory=list)

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
    def cells(self, points: Sequence[dict[str, Any]]) -> dict[tuple[int, int], _Cell]:
        """Measured ok cells (median over repeats) keyed (steps, concurrency)."""
        groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for p in points:
            if p.get("status") == "ok" and not p.get("predicted"):
                groups.setdefault((int(p["steps"]), int(p["concurrency"])), []).append(p)
        out = {}
        for (k, c), ps in groups.items():
            def med(name: str) -> float:
                vals = [float(p["metrics"][name]) for p in ps if isinstance((p.get("metrics") or {}).get(name),
                                                                            (int, float))]
                return float(np.median(vals)) if vals else math.nan
            tput, tpot, al = med("output_throughput_tok_s"), med("tpot_p50_ms"), med("acceptance_length")
            if k == 0:
                al = 1.0
            # a cell at num_steps k drafted positions 0..k-1 only: a server whose counters cover more positions (the
            # bundled engine sized for the largest num_steps, switched between points) reports 0 for the others
            pp = next((list((p.get("acceptance") or {}).get("per_position") or [])[:k] for p in ps
                       if (p.get("acceptance") or {}).get("per_position")), [])
            lo, hi = med("output_throughput_ci_low"), med("output_throughput_ci_high")
            half = (hi - lo) / 2 / tput if all(map(math.isfinite, (lo, hi, tput))) and tput > 0 else math.nan
            toks = [float(p["metrics"]["total_output_tokens"]) / float(p["metrics"]["num_requests"]) for p in ps
                    if (p.get("metrics") or {}).get("num_requests") and
                    isinstance(p["metrics"].get("total_output_tokens"), (int, float))]
            drafts = sum(float((p.get("acceptance") or {}).get("num_drafts") or 0) for p in ps) or 1.0
            if math.isfinite(tput) and tput > 0 and math.isfinite(al):
                out[(k, c)] = _Cell(k, c, tput, tpot, al, pp, half, float(np.median(toks)) if toks else math.nan,
                                    drafts, med("duration_s"))
        return out

    # -- the model ---------------------------------------------------------------------------------------------
    def _al(self, cells: dict[tuple[int, int], _Cell], k: int, c: int) -> float:
        if (k, c) in cells:
            return cells[(k, c)].al
        if k == 0:
            return 1.0
        with_pp = [x for x in cells.values() if x.per_position and x.steps >= 1]
        if with_pp:
            return acceptance_lengths(self._per_position(with_pp, k, c), [k])[k]
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

    def _tokens(self, cells: dict[tuple[int, int], _Cell]) -> float:
        vals = [x.tokens_per_request for x in cells.values() if math.isfinite(x.tokens_per_request)]
        return float(np.median(vals)) if vals else math.nan

    @staticmethod
    def _per_position(with_pp: list[_Cell], k: int, c: int) -> list[float]:
        """Per-position acceptance for positions 0..k-1 at concurrency c: for each position, the draft-weighted mean
        over the measured cells that drafted that far at the nearest measured concurrency (log scale)."""
        out = []
        for i in range(k):
            pool = [x for x in with_pp if len(x.per_position) > i]
            if not pool:
                break
            near = _nearest(pool, c)
            out.append(sum(x.per_position[i] * x.num_drafts for x in near) / sum(x.num_drafts for x in near))
        return out

    def _tau_obs(self, x: _Cell, tokens: float = math.nan) -> float:
        if self.objective == "tpot":
            return x.tpot * x.al if math.isfinite(x.tpot) else math.nan
        return x.conc * self._effective(x.al, x.tokens_per_request) / x.throughput

    #: a cell is measured only if its expected improvement is at least this share of the noise band (module
    #: docstring)
    EI_SHARE_OF_BAND: ClassVar[float] = 0.25

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

    def _feature_set(self, cells: Sequence[_Cell]) -> tuple[str, ...]:
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

    def fit(self, cells: dict[tuple[int, int], _Cell]) -> tuple[Any, Any]:
        """Fit the step-time model; returns (tau(k, c) -> s, err(k, c) -> relative standard error of that cell's
        prediction: the residual spread s combined with the cell's leverage, module docstring)."""
        obs = [(x, self._tau_obs(x)) for x in cells.values()]
        obs = [(x, t) for x, t in obs if math.isfinite(t) and t > 0]
        if not obs:
            raise ValueError("no measured cell to fit")
        names = self._feature_set([x for x, _ in obs])
        X = np.array([self._features(x.steps, x.conc, names) for x, _ in obs])
        y = np.array([t for _, t in obs])
        w = 1.0 / y
        theta, *_ = np.linalg.lstsq(X * w[:, None], y * w, rcond=None)

        def raw(k: int, c: int) -> float:
            v = float(np.dot(self._features(k, c, names), theta))
            return v if v > 0 else math.nan

        anchor: dict[int, float] = {}
        for c in {x.conc for x, _ in obs}:
            ratios = [t / raw(x.steps, x.conc) for x, t in obs if x.conc == c and math.isfinite(raw(x.steps, x.conc))]
            if ratios:
                anchor[c] = float(np.exp(np.mean(np.log(ratios))))
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
        s = max(s, meas, MIN_REL_ERROR)
        self.fit_info = {"features": ", ".join(names),
                         "theta": [float(v) for v in theta], "anchors": {str(c): anchor[c] for c in known},
                         "relative_error": s, "cells": len(obs)}
        # the parameters' own uncertainty (relative units: the fit is weighted by 1/tau): a cell the measured ones
        # pin down poorly (an extrapolation in K or c) gets a wider interval than the residual spread alone
        Xw = X * w[:, None]
        cov = np.linalg.pinv(Xw.T @ Xw) * s * s

        def rel(k: int, c: int) -> np.ndarray:
            r = raw(k, c)
            return np.array(self._features(k, c, names)) / r if math.isfinite(r) else np.zeros(len(names))

        def err(k: int, c: int) -> float:
            g = rel(k, c)
            here = [x for x, _ in obs if x.conc == c]
            if here:  # anchored on the cells measured at c: only the shape between them and (k, c) is uncertain
                g = g - np.mean([rel(x.steps, c) for x in here], axis=0)
            return math.sqrt(s * s + max(float(g @ cov @ g), 0.0))

        return (lambda k, c: raw(k, c) * anchor_at(c)), err

    def predict(self, points: Sequence[dict[str, Any]]) -> dict[tuple[int, int], Prediction]:
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
                al = self._al(cells, k, c)
                if not (math.isfinite(t) and t > 0):
                    continue
                tput = c * (self._effective(al, tokens) if self.objective != "tpot" else al) / t
                tpot = t / al * self._tpot_scale(cells, c)
                e = err(k, c)
                out[(k, c)] = Prediction(k, c, al, tput, tput * (1 - z * e), tput * (1 + z * e), tpot,
                                         tpot * (1 - z * e), tpot * (1 + z * e))
        return out

    def _tpot_scale(self, cells: dict[tuple[int, int], _Cell], c: int) -> float:
        """TPOT from a throughput-fitted tau: the ratio of measured TPOT to tau/AL at this concurrency (1 if none)."""
        if self.objective == "tpot":
            return 1.0
        here = [x for x in cells.values() if x.conc == c and math.isfinite(x.tpot)]
        if not here:
            near = sorted(cells.values(), key=lambda x: abs(math.log(x.conc) - math.log(c)))
            here = [x for x in near[:2] if math.isfinite(x.tpot)]
        ratios = [x.tpot / (self._tau_obs(x) / x.al) for x in here if self._tau_obs(x) > 0]  # tau per token vs TPOT
        return float(np.median(ratios)) if ratios else 1.0

    # -- what to measure next ------------------------------------------------------------------------------------
    def seed(self) -> list[tuple[int, int]]:
        """The first round (duplicates dropped), four cells:

        * (largest K, smallest c): the per-position acceptance of every smaller K;
        * (smallest K, largest c), (second K, largest c): num_steps 0 and 1 at the same concurrency, so the jump in
          step time from no speculation to one draft token (the draft model's fixed per-step cost, ``K>0``) is
          identified instead of being spread over the per-draft-token slope;
        * (smallest K, middle c): the batch dependence; left out on a grid of fewer than three concurrencies (there
          is no middle one: the other end is opened by its predicted best num_steps right after the seed). A
          three-cell seed on every grid of at most 20 cells was tried and dropped: on replays of virtual 5 x 4
          sweeps (concurrency 1, 4, 16, 64; 3% noise; 8 seeds per cost model) it saved no time (39% and 38% of the
          grid's against 36% and 37%) and on the compute-bound model it once chose a num_steps 46% below the
          grid's (worst 5.8% with the fourth cell): without K=0 measured between the ends, the draft's fixed cost
          is extrapolated across the batch.

        A fifth cell follows once these are measured (:meth:`seed_fifth`)."""
        ks, cs = sorted(self.steps), sorted(self.concurrency)
        cells = [(ks[-1], cs[0]), (ks[0], cs[-1]), (ks[1] if len(ks) > 1 else ks[0], cs[-1])]
        if len(cs) >= 3:
            cells.append((ks[0], self._cmid))
        out: list[tuple[int, int]] = []
        for cell in cells:
            if cell not in out:
                out.append(cell)
        return out

    @property
    def _cmid(self) -> int:
        cs = sorted(self.concurrency)
        return cs[len(cs) // 2] if len(cs) > 2 else cs[0]

    def seed_fifth(self, cells: dict[tuple[int, int], _Cell]) -> tuple[int, int] | None:
        """The seed's fifth cell, chosen by what the pair at the largest concurrency showed (module docstring,
        "The loop"): where num_steps 1 beats 0 there by more than the noise band, speculation pays at the largest
        batch and the open question is how far K goes, so the middle num_steps at the largest concurrency (the
        per-draft-token cost at the largest batch); otherwise the open question is where speculation stops paying,
        so num_steps 1 at the middle concurrency (how the draft's fixed cost scales with the batch). None when the
        pair was not measured (failed cells) or the plan has fewer than three num_steps."""
        ks, cs = sorted(self.steps), sorted(self.concurrency)
        if len(ks) < 3:
            return None
        k0, k1 = cells.get((ks[0], cs[-1])), cells.get((ks[1], cs[-1]))
        if k0 is None or k1 is None:
            return None
        if self.objective == "tpot":
            pays = k1.tpot * (1 + self.noise_band) < k0.tpot
        else:
            pays = k1.throughput > k0.throughput * (1 + self.noise_band)
        return (ks[len(ks) // 2], cs[-1]) if pays else (ks[1], self._cmid)

    def _value(self, p: Prediction) -> tuple[float, float, float]:
        if self.objective == "tpot":
            return p.tpot_ms, p.tpot_low, p.tpot_high
        return p.throughput, p.throughput_low, p.throughput_high

    def next_round(self, points: Sequence[dict[str, Any]], tried: set[tuple[int, int]],
                   all_threats: bool = False, current: int | None = None,
                   launch_s: float = 0.0) -> list[tuple[int, int]]:
        """The cells to measure next (module docstring): the seed when nothing was measured yet; then the one cell
        of the highest expected improvement per expected second (``all_threats``, for servers whose restart costs
        more than a point: every cell worth measuring of the one num_steps with the largest summed value, most
        valuable first, so a round costs one restart); [] when the choice is settled everywhere. ``tried``: cells
        already attempted (measured or failed), never proposed again. ``current``: the running server's num_steps;
        ``launch_s``: s a server launch or switch costs (measured so far): a cell of another num_steps costs its
        window plus that, so of two equally informative cells the one on the running server goes first. Each
        proposed cell's reason is appended to ``why`` (sweep.json ``guided.why``)."""
        cells = self.cells(points)
        if not cells:
            seed = [x for x in self.seed() if x not in tried]
            roles = {self.seed()[0]: "seed: per-position acceptance of every smaller num_steps",
                     self.seed()[1]: "seed: num_steps 0 at the largest concurrency"}
            for kc in seed:
                self.why.append({"steps": kc[0], "concurrency": kc[1], "reason": roles.get(
                    kc, "seed: draft fixed cost (num_steps 0 and 1 side by side)" if kc[1] == max(self.concurrency)
                    else "seed: batch dependence")})
            self.rounds.append(seed)
            return seed
        if len(self.rounds) == 1:  # the seed was measured: its fifth cell
            fifth = self.seed_fifth(cells)
            if fifth is not None and fifth not in tried:
                self.rounds.append([fifth])
                self.why.append({"steps": fifth[0], "concurrency": fifth[1],
                                 "reason": "seed: fifth cell chosen by the num_steps 0/1 pair"})
                return [fifth]
        preds = self.predict(points)
        proposals: list[tuple[float, tuple[int, int]]] = []
        info: dict[tuple[int, int], dict[str, Any]] = {}
        for c in self.concurrency:
            open_ = [k for k in self.steps if (k, c) not in tried and (k, c) in preds]
            if not open_:
                continue
            values = self.values(cells, preds, c, open_)
            if values is None:  # nothing measured at c yet: its predicted best first
                maximise = self.objective != "tpot"
                best_k = max(open_, key=lambda k: self._value(preds[(k, c)])[0] * (1 if maximise else -1))
                proposals.append((math.inf, (best_k, c)))
                info[(best_k, c)] = {"reason": "first cell at its concurrency: its predicted best num_steps"}
                continue
            for k, ei in values.items():
                secs = self._duration(cells, preds[(k, c)])
                switch = launch_s if current is not None and k != current else 0.0
                proposals.append((ei / (secs + switch), (k, c)))
                info[(k, c)] = {"reason": "highest expected improvement per second", "expected_improvement": ei,
                                "expected_s": secs, "switch_s": switch}
        proposals.sort(key=lambda x: -x[0])
        out = [cell for _, cell in proposals]
        if not all_threats:
            out = out[:1]
        elif out:  # one launch per round: every open cell of the num_steps with the most to gain
            # a concurrency with nothing measured yet (value inf) counts first: the launch that opens the most of
            # them, then the largest summed value of the rest (a sum of infs would tie and go to the smaller K)
            gain: dict[int, tuple[int, float]] = {}
            for v, (k, _) in proposals:
                n, total = gain.get(k, (0, 0.0))
                gain[k] = (n + 1, total) if math.isinf(v) else (n, total + v)
            top = max(gain, key=lambda k: (*gain[k], -k))
            out = [cell for cell in out if cell[0] == top]
        if out:
            self.rounds.append(out)
            value = dict((cell, v) for v, cell in proposals)
            for kc in out:
                v = value[kc]
                self.why.append({"steps": kc[0], "concurrency": kc[1], **info[kc],
                                 **({"value_per_s": v} if math.isfinite(v) else {})})
        return out

    def values(self, cells: dict[tuple[int, int], _Cell], preds: dict[tuple[int, int], Prediction], c: int,
               open_: Sequence[int]) -> dict[int, float] | None:
        """The unmeasured num_steps at concurrency ``c`` worth measuring, with their expected improvement (a
        fraction of the best measured objective there); None when nothing was measured at ``c``. A cell is worth
        measuring when its optimistic prediction (one-sided ``confidence``) beats the best measured cell at ``c``
        by more than the noise band and its expected improvement beyond the band, E[max(0, Y - best (1 +
        band))] / best for a normal Y of the cell's prediction and standard error, is at least ``EI_SHARE_OF_BAND``
        of the band (module docstring)."""
        measured = [x for x in cells.values() if x.conc == c]
        if not measured:
            return None
        band, maximise = self.noise_band, self.objective != "tpot"
        obj = {x.steps: (x.throughput if maximise else x.tpot) for x in measured}
        best = max(obj.values()) if maximise else min(obj.values())
        target = best * (1 + band) if maximise else best / (1 + band)
        nd = NormalDist()
        out = {}
        for k in open_:
            v, lo, hi = self._value(preds[(k, c)])
            sd = ((hi - v) if maximise else (v - lo)) / self.z
            if not sd > 0:
                continue
            d = (v - target) / sd if maximise else (target - v) / sd
            ei = sd * (d * nd.cdf(d) + nd.pdf(d)) / best
            if d > -self.z_one_sided and ei >= self.EI_SHARE_OF_BAND * band:
                out[k] = ei
        return out

    @staticmethod
    def _duration(cells: dict[tuple[int, int], _Cell], p: Prediction) -> float:
        """Expected measuring time of the predicted cell ``p``, s: the output tokens a point measured at the nearest
        measured concurrency (log scale) produced (its duration x throughput) over ``p``'s predicted throughput."""
        timed = [x for x in cells.values() if math.isfinite(x.duration_s) and x.duration_s > 0]
        if not timed or not p.throughput > 0:
            return 1.0
        near = _nearest(timed, p.concurrency)
        return float(np.mean([x.duration_s * x.throughput for x in near])) / p.throughput

    # -- settling the choice by repeats ----------------------------------------------------------------------------
    #: runs the settle step may add to one cell beyond the plan's ``repeats`` (module docstring, "Settling")
    SETTLE_REPEATS: ClassVar[int] = 2

    def comparisons(self, points: Sequence[dict[str, Any]],
                    records: dict[tuple[int, int, int], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """The comparisons that decide each concurrency's choice, as ``spectune recommend`` makes them: every
        measured num_steps smaller than the best measured one, against the best, in ascending num_steps, up to the
        first that does not lose (recommend takes the smallest that ties).

        Each cell's bootstrap replicates come from its requests (``records``: requests.jsonl objects keyed
        (steps, concurrency, repeat)), paired across cells by prompt and resampled over its repeats
        (:class:`spectune.results.confidence.Bootstrap`, as recommend's); the ratio small / best has its percentile
        interval at ``confidence``. Returns ``{"concurrency", "steps", "best", "ratio", "low", "high", "verdict",
        "widths"}`` per comparison (``widths``: the relative widths of the two cells' own intervals), ``verdict`` one of ``tie`` (recommend prefers the smaller num_steps: the ratio is within the
        noise band of 1, or its interval reaches the band and more runs could gain less than ``EI_SHARE_OF_BAND`` of
        the band beyond it), ``loses`` (the whole interval is beyond the band) or ``unsettled`` (recommend calls a
        tie only because the interval is wide, and more runs, narrowing it around the ratio, would make the larger
        num_steps win by at least ``EI_SHARE_OF_BAND`` of the band beyond it: the threshold a new cell must pass); a
        comparison without an interval (no requests) is decided by the ratio and never unsettled."""
        maximise = self.objective != "tpot"
        col = "output_throughput_tok_s" if maximise else "tpot_p50_ms"
        runs: dict[tuple[int, int], list[tuple[int, float]]] = {}
        for p in points:
            v = (p.get("metrics") or {}).get(col)
            if p.get("status") == "ok" and not p.get("predicted") and isinstance(v, (int, float)) and v > 0:
                runs.setdefault((int(p["steps"]), int(p["concurrency"])), []).append((int(p.get("repeat", 0)), v))
        boot = Bootstrap({r.get("prompt_id") for rs in records.values() for r in rs})
        value, reps = {}, {}
        for i, (k, c) in enumerate(sorted(runs)):
            value[(k, c)] = float(np.median([v for _, v in runs[(k, c)]]))
            reqs = [RunRequests.from_records(records[(k, c, r)]) if records.get((k, c, r)) else None
                    for r, _ in runs[(k, c)]]
            reps[(k, c)] = boot.cell_replicates(reqs, [v for _, v in runs[(k, c)]], self.objective, seed_offset=i)
        band, out = self.noise_band, []

        def width(k: int, c: int) -> float:  # relative width of the cell's own interval (0 without replicates)
            r = reps[(k, c)]
            if r is None or not np.isfinite(r).any():
                return 0.0
            lo, hi = np.nanpercentile(r, [50 * (1 - self.confidence), 50 * (1 + self.confidence)])
            return float((hi - lo) / value[(k, c)])

        for c in self.concurrency:
            here = sorted(k for k, cc in runs if cc == c)
            if len(here) < 2:
                continue
            best = (max if maximise else min)(here, key=lambda k: value[(k, c)])
            for k in (k for k in here if k < best):
                ratio = value[(k, c)] / value[(best, c)]
                iv = ratio_interval(reps[(k, c)], reps[(best, c)], ratio, self.confidence)
                lo, hi = (iv.low, iv.high) if iv.known else (ratio, ratio)
                edge = 1 - band if maximise else 1 + band  # a smaller num_steps ties when its ratio reaches the edge
                within = ratio >= edge if maximise else ratio <= edge
                reaches = hi >= edge if maximise else lo <= edge
                gain = (1 / ratio if maximise else ratio) - (1 + band)  # what the best gains over the band
                settles = within or gain < self.EI_SHARE_OF_BAND * band  # more runs could win too little
                verdict = "tie" if settles and reaches else "unsettled" if reaches else "loses"
                out.append({"concurrency": c, "steps": k, "best": best, "ratio": ratio, "low": lo, "high": hi,
                            "verdict": verdict, "widths": [width(k, c), width(best, c)]})
                if verdict != "loses":
                    break
        return out

    def settle(self, points: Sequence[dict[str, Any]],
               records: dict[tuple[int, int, int], list[dict[str, Any]]]) -> list[tuple[int, int, int]]:
        """The runs to add so that every concurrency's choice is settled at the requested confidence (module
        docstring, "Settling"): for each ``unsettled`` comparison (:meth:`comparisons`), one more run (key
        (steps, concurrency, repeat)) of one of its two cells with fewer than ``repeats + SETTLE_REPEATS`` runs: the
        one with fewer runs, of two with as many the one whose own interval is wider (it adds more to the ratio's
        uncertainty); [] when everything is settled or nothing may be repeated."""
        done: dict[tuple[int, int], int] = {}
        for p in points:
            if not p.get("predicted"):
                kc = (int(p["steps"]), int(p["concurrency"]))
                done[kc] = max(done.get(kc, 0), int(p.get("repeat", 0)) + 1)
        cap = self.repeats + self.SETTLE_REPEATS
        out: list[tuple[int, int, int]] = []
        self.decisions = self.comparisons(points, records)
        for cmp in self.decisions:
            if cmp["verdict"] != "unsettled":
                continue
            c = cmp["concurrency"]
            pair = [((cmp["steps"], c), cmp["widths"][0]), ((cmp["best"], c), cmp["widths"][1])]
            open_ = [(done[kc], -w, kc) for kc, w in pair if done[kc] < cap]
            if open_:
                k, c = min(open_)[2]
                out.append((k, c, done[(k, c)]))
                self.why.append({"steps": k, "concurrency": c, "repeat": done[(k, c)],
                                 "reason": f"settle: num_steps {cmp['steps']} vs {cmp['best']} at ratio "
                                           f"{cmp['ratio']:.3f} [{cmp['low']:.3f}, {cmp['high']:.3f}] reaches the band"})
        if out:
            self.rounds.append([(k, c) for k, c, _ in out])
        return out

    def describe(self) -> dict[str, Any]:
        """sweep.json's ``guided``: the rounds measured and the last fit."""
        return {"objective": self.objective, "confidence": self.confidence, "noise_band": self.noise_band,
                "rounds": [[list(x) for x in r] for r in self.rounds], "fit": self.fit_info,
                "comparisons": self.decisions, "why": self.why}
