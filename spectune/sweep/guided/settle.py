"""Settling the guided plan's choice by more runs, where a tie rests only on a wide interval.

When no unmeasured cell is worth measuring, each concurrency's choice is made from the measured cells as ``spectune
recommend`` makes it: a smaller num_steps that ties with the best wins, a tie being a ratio to the best within the
noise band or a paired interval of that ratio that reaches the band. The second kind can rest on the interval's width
alone. Such a comparison is *unsettled* (:meth:`Settling.comparisons`: the ratio is beyond the band, its interval
reaches it, and one more run is worth its seconds: the probability that the run turns the tie into a loss
(:meth:`Settling.switch_probability`, preposterior analysis) times what the best gains beyond the band is at least
``EI_SHARE_OF_BAND`` of the band, the bar a new cell passes, per mean window: the run's window over the mean of the
plan's full windows); :meth:`Settling.settle` measures one more run of one cell of each
unsettled pair (the one with fewer runs, else the smaller num_steps: recommend widens its tie band to the best cell's
own run-to-run spread, so a second run of the best on a drifting engine can turn a clear loss into a tie; on the
bundled engine (docs/sweep.md, "Why each piece is there") two runs of K=1 at concurrency 8, 195.6 and 208.0 tok/s,
made K=0 at 0.926 [0.868, 0.974] of it a tie by a 4.5% band), at most :attr:`Settling.SETTLE_REPEATS`
beyond ``--repeats`` per cell, until every deciding comparison is a tie, a clear loss, or out of runs. A settle run
measures its whole window (no early stop, ``Sweep._early_stop``): recommend compares on the prompts every run of
the two cells measured, and a run cut short would narrow them. The comparisons are recommend's: paired bootstrap over prompts and repeats
(:class:`spectune.results.confidence.Bootstrap`).

Why the value per window: without it, a settle pair at the bundled engine's largest concurrency (two windows of
37-40 s, 4% of a 5 x 6 grid each) was measured whenever its interval reached the band, though one more run could
not take its upper end out of the band (switch probability 0.03 on a recorded grid); it was 8% of the grid's time
in a quiet live run (``python benchmarks/guided_vs_grid.py --backend local``, docs/sweep.md's command) and
left the choice as it was. On the emulated servers a
pair a run can resolve (ratio 0.947 [0.911, 0.981] at concurrency 16 on the held-out quadratic model, 5 x 4, 1.2%
of the grid) is still measured again; without it one sweep chose 0.927 of the grid's choice (``python
benchmarks/guided_vs_grid.py --virtual 6 --emulated held-out-2``, docs/sweep.md).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import ClassVar, Mapping, Sequence, TypedDict

import numpy as np

from spectune.core.json_types import JsonObject
from spectune.results.confidence import Bootstrap, CellRuns, Interval, RunRequests, best_by_pairs, ratio_interval
from spectune.results.point import PointObject, RequestLine, SweepPoint, as_points
from spectune.results.schema import PointKey

__all__ = ["Settling", "Comparison", "SettleWorth"]


class SettleWorth(TypedDict, total=False):
    """What one more run of a comparison whose interval alone makes the tie is worth (:meth:`Settling.comparisons`):
    ``switch_probability`` (that it turns the tie into a loss), ``settle_value`` (that times what the best gains
    beyond the band, a fraction of the objective) and ``settle_cost`` (the run's window over the mean full window)."""

    switch_probability: float
    settle_value: float
    settle_cost: float


class Comparison(SettleWorth):
    """One deciding comparison (:meth:`Settling.comparisons`; sweep.json ``guided.comparisons``): at
    ``concurrency``, num_steps ``steps`` against the ``best``: ``ratio`` small / best with its interval ``low``/
    ``high``, the ``verdict`` (``tie``, ``loses`` or ``unsettled``), the ``widths`` of the two cells' own intervals
    and, where the interval alone makes the tie, what one more run is worth (:class:`SettleWorth`)."""

    concurrency: int
    steps: int
    best: int
    ratio: float
    low: float
    high: float
    verdict: str
    widths: list[float]


class Settling:
    """The deciding comparisons and the runs that settle them (module docstring); a mixin of
    :class:`spectune.sweep.guided.GuidedPlanner`."""

    concurrency: Sequence[int]
    repeats: int
    objective: str
    confidence: float
    noise_band: float
    rounds: list[list[tuple[int, int]]]
    why: list[JsonObject]
    #: the deciding comparisons the settle step last saw (:meth:`comparisons`), for sweep.json
    decisions: list[Comparison]
    EI_SHARE_OF_BAND: ClassVar[float]

    #: runs the settle step may add to one cell beyond the plan's ``repeats`` (module docstring): one, so a pair
    #: gets at most two. With two per cell, on virtual 5 x 6 sweeps of the compute-bound emulated server (48
    #: prompts x 48 tokens, 10% noise per request) the pair K=0/K=1 at concurrency 8 (true ratio 0.946) took all
    #: four runs and was still unsettled, 6.8% of the grid's time in one sweep, 1.7% on average over six; in none
    #: of the 24 virtual sweeps of both test cost models (5 x 6 and 5 x 4) did the worst choice, against the grid's
    #: or the noise-free model's, change without the second run
    SETTLE_REPEATS: ClassVar[int] = 1

    def comparisons(self, points: Sequence[SweepPoint | PointObject],
                    records: Mapping[PointKey, Sequence[RequestLine]]) -> list[Comparison]:
        """The comparisons that decide each concurrency's choice, as ``spectune recommend`` makes them: every
        measured num_steps smaller than the best measured one, against the best, in ascending num_steps, up to the
        first that does not lose (recommend takes the smallest that ties); each ratio on the prompts both cells
        measured (:meth:`spectune.results.confidence.Bootstrap.matched_ratio`).

        Each cell's bootstrap replicates come from its requests (``records``: requests.jsonl objects keyed
        (steps, concurrency, repeat)), paired across cells by prompt and resampled over its repeats
        (:class:`spectune.results.confidence.Bootstrap`, as recommend's); the ratio small / best has its percentile
        interval at ``confidence``. Returns ``{"concurrency", "steps", "best", "ratio", "low", "high", "verdict",
        "widths"}`` per comparison (``widths``: the relative widths of the two cells' own intervals), ``verdict`` one of ``tie`` (recommend prefers the smaller num_steps: the ratio is within the
        noise band of 1, or its interval reaches the band and one more run is not worth it, below), ``loses`` (the
        whole interval is beyond the band) or ``unsettled`` (recommend calls a tie only because the interval is
        wide, and one more run is worth it: its ``switch_probability`` (:meth:`switch_probability`) times what the
        best gains beyond the band (``settle_value``, a fraction of the objective) is at least ``EI_SHARE_OF_BAND``
        of the band, the bar a new cell passes, times ``settle_cost``, the run's seconds (the longest window of the
        cell :meth:`settle` would measure) over the mean window of the measured cells that ran in full (1.0 without
        one); the three go with the comparison); a comparison without an interval (no requests) is decided by the
        ratio and never unsettled."""
        maximise = self.objective != "tpot"
        runs: dict[tuple[int, int], list[tuple[int, float]]] = {}
        secs: dict[tuple[int, int], float] = {}  # the longest window of each cell, s
        full: list[float] = []  # the lengths of the windows that ran in full, s
        for p in as_points(points):
            n = p.numbers
            v = n.output_throughput_tok_s if maximise else n.tpot_p50_ms
            if p.status == "ok" and not p.predicted and v is not None and v > 0:
                kc = p.key.cell
                runs.setdefault(kc, []).append((p.repeat, v))
                d = float(n.duration_s or 0.0)
                secs[kc] = max(secs.get(kc, 0.0), d)
                if d > 0 and not p.stopped_early:
                    full.append(d)
        mean_s = float(np.mean(full)) if full else 0.0
        by_point = {key: RunRequests.from_records(rs) for key, rs in records.items() if rs}
        boot = Bootstrap({prompt for run in by_point.values() for prompt in run.prompt})
        value, reps, cell_runs = {}, {}, {}
        for i, (k, c) in enumerate(sorted(runs)):
            value[(k, c)] = float(np.median([v for _, v in runs[(k, c)]]))
            reqs = [by_point.get((k, c, r)) for r, _ in runs[(k, c)]]
            reps[(k, c)] = boot.cell_replicates(reqs, [v for _, v in runs[(k, c)]], self.objective, seed_offset=i)
            cell_runs[(k, c)] = CellRuns(reqs, [v for _, v in runs[(k, c)]], seed_offset=i)
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
            def paired(k: int, b: int, c: int = c) -> Interval:  # k / b on the prompts both cells measured
                got = boot.matched_ratio(cell_runs[(k, c)], cell_runs[(b, c)], self.objective, self.confidence)
                return got[0] if got is not None else ratio_interval(
                    reps[(k, c)], reps[(b, c)], value[(k, c)] / value[(b, c)], self.confidence)

            best = best_by_pairs(here, lambda k: value[(k, c)], lambda a, b: paired(a, b).value, maximise)
            for k in (k for k in here if k < best):
                iv = paired(k, best)
                ratio = iv.value
                lo, hi = (iv.low, iv.high) if iv.known else (ratio, ratio)
                edge = 1 - band if maximise else 1 + band  # a smaller num_steps ties when its ratio reaches the edge
                within = ratio >= edge if maximise else ratio <= edge
                reaches = hi >= edge if maximise else lo <= edge
                gain = (1 / ratio if maximise else ratio) - (1 + band)  # what the best gains over the band
                settles = within or gain < self.EI_SHARE_OF_BAND * band  # more runs could win too little
                widths = [width(k, c), width(best, c)]
                extra: SettleWorth = {}
                if reaches and not settles:  # is one more run worth its seconds?
                    runs_of = [len(runs[(k, c)]), len(runs[(best, c)])]
                    pick = self._rerun(runs_of)  # the cell settle() would run again
                    p_switch = self.switch_probability(ratio, lo, hi, widths, runs_of, pick)
                    cost = secs[((k, best)[pick], c)] / mean_s if mean_s > 0 else 1.0
                    extra = {"switch_probability": p_switch, "settle_value": p_switch * gain, "settle_cost": cost}
                    settles = p_switch * gain < self.EI_SHARE_OF_BAND * band * cost
                verdict = "tie" if settles and reaches else "unsettled" if reaches else "loses"
                out.append({"concurrency": c, "steps": k, "best": best, "ratio": ratio, "low": lo, "high": hi,
                            "verdict": verdict, "widths": widths, **extra})
                if verdict != "loses":
                    break
        return out

    def switch_probability(self, ratio: float, low: float, high: float, widths: Sequence[float],
                           runs: Sequence[int], pick: int) -> float:
        """The probability that one more run of cell ``pick`` (0: the smaller num_steps, 1: the best) turns a tie
        that rests on its interval's width into a loss (recommend then takes the best): preposterior analysis
        (Raiffa and Schlaifer, "Applied Statistical Decision Theory", 1961, ch. 5), under the normal approximation
        of the ratio's interval ``[low, high]`` around ``ratio`` (small / best).

        The ratio's variance is the two cells' own (``widths``: their relative interval widths, from ``runs`` runs
        each); one more run of cell ``pick`` scales its share by ``runs / (runs + 1)``, so the interval's half-width
        towards the band shrinks by ``f = sqrt(v' / v)``. The ratio after the run is normal around today's with the
        preposterior sd ``sd * sqrt(1 - f^2)`` (``sd``: the interval's half-width over z), and the tie turns when its
        edge, ``ratio' +- f * half-width``, passes the band's edge (1 - band for throughput, 1 + band for TPOT)."""
        maximise = self.objective != "tpot"
        var = [w * w for w in widths]
        total = var[0] + var[1]
        f = math.sqrt((total - var[pick] / (runs[pick] + 1)) / total) if total > 0 else 1.0
        pre = (high - low) / (2 * self.z) * math.sqrt(max(1 - f * f, 0.0))
        half = (high - ratio) if maximise else (ratio - low)
        edge = 1 - self.noise_band if maximise else 1 + self.noise_band
        margin = (edge - (ratio + f * half)) if maximise else ((ratio - f * half) - edge)
        if pre <= 0:
            return 1.0 if margin > 0 else 0.0
        return NormalDist().cdf(margin / pre)

    @property
    def _run_cap(self) -> int:
        """Runs a cell may have at most: ``repeats`` plus the settle step's ``SETTLE_REPEATS``."""
        return self.repeats + self.SETTLE_REPEATS

    def _rerun(self, runs: Sequence[int]) -> int:
        """Which of a comparison's two cells (0: the smaller num_steps, 1: the best; ``runs`` each) one more run
        goes to (module docstring): the one with fewer runs, of two with as many the smaller num_steps, unless it
        has its ``repeats + SETTLE_REPEATS`` runs already, then the other (which :meth:`settle` runs only if it has
        fewer)."""
        i = 0 if runs[0] <= runs[1] else 1
        return 1 - i if runs[i] >= self._run_cap else i

    def settle(self, points: Sequence[SweepPoint | PointObject],
               records: Mapping[PointKey, Sequence[RequestLine]]) -> list[PointKey]:
        """The runs to add so that every concurrency's choice is settled at the requested confidence (module
        docstring): for each ``unsettled`` comparison (:meth:`comparisons`), one more run (key
        (steps, concurrency, repeat)) of one of its two cells with fewer than ``repeats + SETTLE_REPEATS`` runs: the
        one with fewer runs, of two with as many the smaller num_steps (module docstring: a second run of the best
        can widen recommend's band); [] when everything is settled or nothing may be repeated."""
        done: dict[tuple[int, int], int] = {}
        points = as_points(points)
        for p in points:
            if not p.predicted:
                done[p.key.cell] = max(done.get(p.key.cell, 0), p.repeat + 1)
        out: list[PointKey] = []
        self.decisions = self.comparisons(points, records)
        for cmp in self.decisions:
            if cmp["verdict"] != "unsettled":
                continue
            c = cmp["concurrency"]
            pair = [(cmp["steps"], c), (cmp["best"], c)]
            k, c = pair[self._rerun([done[kc] for kc in pair])]
            if done[(k, c)] < self._run_cap:
                out.append(PointKey(k, c, done[(k, c)]))
                self.why.append({"steps": k, "concurrency": c, "repeat": done[(k, c)],
                                 "reason": f"settle: num_steps {cmp['steps']} vs {cmp['best']} at ratio "
                                           f"{cmp['ratio']:.3f} [{cmp['low']:.3f}, {cmp['high']:.3f}] reaches the band"})
        if out:
            self.rounds.append([key.cell for key in out])
        return out
