"""Which cell the guided plan measures next: expected improvement per expected second.

After the seed (:mod:`spectune.sweep.guided.seed`), one cell at a time with the model refitted after each: first one
cell at each concurrency with nothing measured (its predicted best num_steps), then the cell of the highest expected
improvement per expected second among those still worth measuring. A concurrency with nothing measured is left to the
model when no other num_steps there is worth measuring against the one ``spectune recommend`` would choose among its
predicted cells (:meth:`Choosing.settled_by_model`: the smallest num_steps within the noise band of the predicted
best; the choice there depends on the ratios between num_steps, which the model predicts with the error of its
leave-one-out misfit, not on the level): recommend then chooses among the predicted cells and says so.
A plan with SLOs opens every concurrency all the same (SLO attainment is measured, never predicted). Where a server
restart costs more than a point, a round is every such cell of the one num_steps with the most to gain (one restart
per round). A concurrency with nothing measured is left to the model too where its measured neighbours settled it
(:meth:`Choosing.settled_by_neighbours`: the best num_steps does not rise with concurrency); the first cell of a
concurrency that a neighbour still settling would leave so waits until every cell of some value was measured
(:meth:`Choosing.awaits_neighbour`). A cell is worth measuring when

1. its optimistic prediction (one-sided quantile of the confidence: "could it still beat the best?") beats the best
   cell measured at its concurrency by more than the noise band, for a smaller num_steps as for a larger one (a
   difference inside the band is a tie to ``spectune recommend``, so missing it costs at most the band); and
2. its expected improvement beyond the band, ``E[max(0, Y - best (1 + band))] / best`` for a normal Y with the
   cell's prediction and standard error, is at least :attr:`Choosing.EI_SHARE_OF_BAND` of the band (0.5% of the
   objective at the default 2% band): a cell whose interval merely brushes the band costs a whole point and almost
   never changes the choice.
3. Where the choice turns, rules 1 and 2 are waived (:meth:`Choosing.rivals_at_turn`): at a concurrency where one
   num_steps was measured, between measured concurrencies that settled on different num_steps, each of those
   num_steps is worth measuring whatever the model predicts for it. The model is smooth in concurrency, and a turn
   can be sharper than its shape (the bundled engine's concurrency 4).

A cell's expected seconds (:meth:`Choosing._duration`) are the output tokens a point at the nearest measured
concurrency produced over the cell's predicted throughput (with a fixed number of prompts low concurrency costs
most; with ``--duration``, at most the cap plus the drain of the requests in flight at it), plus the launch or switch
time measured so far when it needs another num_steps than the running server's.
``why`` records why each cell was proposed (sweep.json ``guided.why``). Why the thresholds are where they are
(what the plan measures at others): docs/sweep.md, "Why each piece is there".
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import ClassVar, Sequence

import numpy as np

from spectune.core.json_types import JsonObject
from spectune.results.point import SweepPoint
from spectune.sweep.guided.acceptance import nearest
from spectune.sweep.guided.model import Cell, Prediction

__all__ = ["Choosing"]


class Choosing:
    """The next round of cells (module docstring); a mixin of :class:`spectune.sweep.guided.GuidedPlanner`, whose
    model (:class:`spectune.sweep.guided.model.StepTimeModel`) and seed (:class:`spectune.sweep.guided.seed.Seeding`)
    it uses."""

    steps: Sequence[int]
    concurrency: Sequence[int]
    objective: str
    noise_band: float
    rounds: list[list[tuple[int, int]]]
    why: list[JsonObject]
    left_to_model: dict[int, JsonObject]
    measure_every_concurrency: bool
    window_cap_s: float | None

    #: a cell is measured only if its expected improvement is at least this share of the noise band (module
    #: docstring)
    EI_SHARE_OF_BAND: ClassVar[float] = 0.25
    #: the value of a cell where the choice turns that the model puts past the band (:meth:`rivals_at_turn`: measured
    #: all the same, after every cell of some value)
    TURN_FLOOR: ClassVar[float] = 1e-9

    def _value(self, p: Prediction) -> tuple[float, float, float]:
        if self.objective == "tpot":
            return p.tpot_ms, p.tpot_low, p.tpot_high
        return p.throughput, p.throughput_low, p.throughput_high

    def next_round(self, points: Sequence[SweepPoint | JsonObject], tried: set[tuple[int, int]],
                   all_threats: bool = False, current: int | None = None,
                   launch_s: float = 0.0, width: int = 1) -> list[tuple[int, int]]:
        """The cells to measure next (module docstring): the seed when nothing was measured yet; then the one cell
        of the highest expected improvement per expected second (``all_threats``, for servers whose restart costs
        more than a point: every cell worth measuring of the one num_steps with the largest summed value, most
        valuable first, so a round costs one restart); [] when the choice is settled everywhere. ``tried``: cells
        already attempted (measured or failed), never proposed again. ``current``: the running server's num_steps;
        ``launch_s``: s a server launch or switch costs (measured so far): a cell of another num_steps costs its
        window plus that, so of two equally informative cells the one on the running server goes first. ``width``:
        servers that measure side by side (a Ray cluster's, ``spectune sweep --plan guided --ray``): a round is the
        ``width`` most valuable cells (``all_threats``: every cell worth measuring of the ``width`` num_steps with
        the most to gain), measured at once, so each server gets one. Each proposed cell's reason is appended to
        ``why`` (sweep.json ``guided.why``)."""
        cells = self.cells(points)
        if not cells:
            seed = [x for x in self.seed() if x not in tried]
            roles = {self.seed()[0]: "seed: per-position acceptance of every smaller num_steps",
                     self.seed()[1]: "seed: num_steps 0 beside num_steps 1 (the draft fixed cost)"}
            for kc in seed:
                self.why.append({"steps": kc[0], "concurrency": kc[1], "reason": roles.get(
                    kc, "seed: draft fixed cost (num_steps 0 and 1 side by side)" if kc[1] == self._pair_concurrency
                    else "seed: batch dependence")})
            self.rounds.append(seed)
            return seed
        if len(self.rounds) == 1:  # the seed was measured: its fifth cell
            fifth = self.seed_followup(cells)
            if fifth is not None and fifth not in tried:
                self.rounds.append([fifth])
                self.why.append({"steps": fifth[0], "concurrency": fifth[1],
                                 "reason": "seed: fifth cell chosen by the num_steps 0/1 pair"})
                return [fifth]
        preds = self.predict(points)
        proposals: list[tuple[float, tuple[int, int]]] = []
        info: dict[tuple[int, int], JsonObject] = {}
        turns: set[tuple[int, int]] = set()
        measured = [x.conc for x in cells.values()]
        for c in self.concurrency:
            open_ = [k for k in self.steps if (k, c) not in tried and (k, c) in preds]
            if not open_:
                continue
            values = self.values(cells, preds, c, open_)
            self.left_to_model.pop(c, None)
            if values is None:  # nothing measured at c yet: its predicted best first, unless the model settles it
                if not self.measure_every_concurrency:
                    inside = min(measured) < c < max(measured)  # the model's own test interpolates only
                    k, by = (self.settled_by_model(preds, c, open_) if inside else None), "model"
                    if k is None:
                        k, by = self.settled_by_neighbours(cells, preds, c, tried), "neighbours"
                    if k is not None:
                        self.left_to_model[c] = {"steps": k, "by": by}
                        continue
                best_k = self._predicted_best(preds, c, open_)
                waits = self.awaits_neighbour(cells, preds, c, tried)
                proposals.append((-1.0 if waits else math.inf, (best_k, c)))
                info[(best_k, c)] = {"reason": "first cell at its concurrency: its predicted best num_steps"
                                     + (" (after every other cell: a neighbour still settling would settle it)"
                                        if waits else "")}
                continue
            for k, ei in self.rivals_at_turn(cells, preds, c, tried, open_).items():
                if k not in values:  # rule 3 of the module docstring: the choice turns at c
                    values[k] = ei
                    turns.add((k, c))
            for k, ei in values.items():
                secs = self._duration(cells, preds[(k, c)])
                switch = launch_s if current is not None and k != current else 0.0
                proposals.append((ei / (secs + switch), (k, c)))
                info[(k, c)] = {"reason": ("the choice turns here: the neighbours settled on different num_steps"
                                           if (k, c) in turns else "highest expected improvement per second"),
                                "expected_improvement": ei,
                                "expected_s": secs, "switch_s": switch}
        proposals.sort(key=lambda x: -x[0])
        out = [cell for _, cell in proposals]
        if not all_threats:
            out = out[:max(width, 1)]
        elif out:  # one launch per round: every open cell of the num_steps with the most to gain
            # a concurrency with nothing measured yet (value inf) counts first: the launch that opens the most of
            # them, then the largest summed value of the rest (a sum of infs would tie and go to the smaller K)
            gain: dict[int, tuple[int, float]] = {}
            for v, (k, _) in proposals:
                n, total = gain.get(k, (0, 0.0))
                gain[k] = (n + 1, total) if math.isinf(v) else (n, total + v)
            top = sorted(gain, key=lambda k: (*gain[k], -k), reverse=True)[:max(width, 1)]
            out = [cell for cell in out if cell[0] in top]
        if out:
            self.rounds.append(out)
            value = dict((cell, v) for v, cell in proposals)
            for kc in out:
                v = value[kc]
                self.why.append({"steps": kc[0], "concurrency": kc[1], **info[kc],
                                 **({"value_per_s": v} if math.isfinite(v) and v >= 0 else {})})
        return out

    def values(self, cells: dict[tuple[int, int], Cell], preds: dict[tuple[int, int], Prediction], c: int,
               open_: Sequence[int]) -> dict[int, float] | None:
        """The unmeasured num_steps at concurrency ``c`` worth measuring, with their expected improvement (a
        fraction of the best measured objective there); None when nothing was measured at ``c``. A cell is worth
        measuring when its optimistic prediction (one-sided ``confidence``) beats the best measured cell at ``c``
        by more than the noise band and its expected improvement beyond the band, E[max(0, Y - best (1 +
        band))] / best for a normal Y of the cell's prediction and standard error, is at least ``EI_SHARE_OF_BAND``
        of the band (module docstring)."""
        best = self._best_measured(cells, c)
        return None if best is None else self._worth_measuring(preds, c, open_, best)

    def _best_measured(self, cells: dict[tuple[int, int], Cell], c: int) -> float | None:
        """The best objective measured at concurrency ``c`` (highest throughput, tokens/s; lowest TPOT, ms), or None
        when nothing was measured there."""
        obj = [x.throughput if self.objective != "tpot" else x.tpot for x in cells.values() if x.conc == c]
        if not obj:
            return None
        return max(obj) if self.objective != "tpot" else min(obj)

    def settled_by_model(self, preds: dict[tuple[int, int], Prediction], c: int, open_: Sequence[int]) -> int | None:
        """At a concurrency with nothing measured: the num_steps recommend would choose among its predicted cells
        (:meth:`_predicted_choice`: the smallest within the noise band of the predicted best), or None when another
        could beat it by more than the band (the test of :meth:`values`, that num_steps' predicted value standing in
        for a measured best's; the predicted best itself is one of the others: on the docs example grid replayed
        (``python benchmarks/guided_vs_grid.py --recorded docs/examples/smollm2-cpu/sweep``) the model put num_steps
        1 at concurrency 16 1.3% above 0, recommend chose 0 by its tie rule, and the grid measured 0 at 0.891 of 1).
        The prediction errors of two num_steps at one concurrency are the shape's, not the level's: the leave-one-out
        misfit in them is measured exactly so, a left-out cell predicted from the others at its concurrency
        (:meth:`spectune.sweep.guided.model.StepTimeModel.fit`)."""
        k = self._predicted_choice(preds, c, open_)
        rest = [kk for kk in open_ if kk != k]
        return None if self._worth_measuring(preds, c, rest, self._value(preds[(k, c)])[0]) else k

    def settled_by_neighbours(self, cells: dict[tuple[int, int], Cell], preds: dict[tuple[int, int], Prediction],
                              c: int, tried: set[tuple[int, int]]) -> int | None:
        """At a concurrency ``c`` with nothing measured: the num_steps K* the measured concurrencies around it have
        settled on, or None. The best num_steps does not rise with concurrency: verifying rejected drafts costs
        compute multiplied by the batch, so the optimum shifts down as the batch grows (SpecServe, Huang et al.,
        arXiv:2503.05096; docs/sweep.md "Guided plan"). So where the nearest measured concurrencies below and above
        ``c`` both settled on K*, so does ``c``; above one settled on the plan's smallest num_steps (0: no
        speculation) or below one settled on its largest, likewise. A concurrency is settled when no unmeasured
        num_steps there is worth measuring (:meth:`values`); its K* is the smallest measured num_steps within the
        noise band of its best (``spectune recommend``'s tie rule). Recommend's choice among the predicted cells at
        ``c`` (:meth:`_predicted_choice`) must be K* too (it chooses among them there). ``cells``: the measured
        cells; ``preds``: the model's predictions of every cell; ``tried``: the cells already attempted."""
        (lo, k_lo), (hi, k_hi) = self._neighbours(cells, preds, c, tried)
        k = self._implied_by_neighbours(lo, k_lo, hi, k_hi)
        open_ = [kk for kk in self.steps if (kk, c) in preds]
        if k is None or not open_ or self._predicted_choice(preds, c, open_) != k:
            return None
        return k

    def _implied_by_neighbours(self, lo: int | None, k_lo: int | None, hi: int | None,
                               k_hi: int | None) -> int | None:
        """The num_steps the rule of :meth:`settled_by_neighbours` gives a concurrency from its nearest measured
        concurrencies below (``lo``) and above (``hi``, None: none measured on that side) and their choices
        (``k_lo``, ``k_hi``, None: none yet): the same num_steps on both sides; with one side only, the plan's
        smallest num_steps below or its largest above; else None."""
        ks = sorted(self.steps)
        if lo is not None and hi is not None:
            return k_lo if k_lo == k_hi else None
        if lo is not None:
            return k_lo if k_lo == ks[0] else None
        if hi is not None:
            return k_hi if k_hi == ks[-1] else None
        return None

    def awaits_neighbour(self, cells: dict[tuple[int, int], Cell], preds: dict[tuple[int, int], Prediction],
                         c: int, tried: set[tuple[int, int]]) -> bool:
        """Whether the first cell at ``c`` (nothing measured there) waits for its neighbours: True where a measured
        neighbour still settling (:meth:`_settled_best` None: a num_steps there still worth measuring) leads with the
        num_steps that, once it settles, leaves ``c`` to :meth:`settled_by_neighbours` (the plan's smallest
        num_steps on a neighbour below with none measured above, its largest on one above with none below, the
        same num_steps on both sides), and the model's predicted choice at ``c`` is that num_steps too. Such a cell
        is proposed after every cell of some value (:meth:`next_round`), not first: on the bundled engine's 5 x 4
        grids, concurrency 32 was opened with a full window (45-48 s, 6-7% of the grid's time) while 16 below it
        had num_steps 0 ahead and num_steps 2 still worth measuring; with the cells of some value measured first
        (at concurrency 1), num_steps 2 at 16 was no longer worth measuring, 16 settled on num_steps 0 and 32 went
        to the model (docs/sweep.md, "On the bundled engine, live", with its command). ``cells``: the measured cells;
        ``preds``: the model's predictions; ``tried``: the cells already attempted."""
        (lo, k_lo), (hi, k_hi) = self._neighbours(cells, preds, c, tried)
        settling = (lo is not None and k_lo is None) or (hi is not None and k_hi is None)
        open_ = [kk for kk in self.steps if (kk, c) in preds]
        if not settling or not open_:
            return False
        # a settled neighbour's choice is its measured choice (_settled_best), so the leads stand for both kinds
        lead_lo = None if lo is None else self._measured_choice(cells, lo)
        lead_hi = None if hi is None else self._measured_choice(cells, hi)
        k = self._implied_by_neighbours(lo, lead_lo, hi, lead_hi)
        return k is not None and k == self._predicted_choice(preds, c, open_)

    def _measured_choice(self, cells: dict[tuple[int, int], Cell], c: int) -> int | None:
        """The smallest measured num_steps at ``c`` within the noise band of the best measured there (``spectune
        recommend``'s tie rule), or None when nothing was measured at ``c``."""
        measured = {x.steps: (x.throughput if self.objective != "tpot" else 1 / x.tpot)
                    for x in cells.values() if x.conc == c}
        if not measured:
            return None
        top = max(measured.values())
        return min(k for k, v in measured.items() if v >= top * (1 - self.noise_band))

    def rivals_at_turn(self, cells: dict[tuple[int, int], Cell], preds: dict[tuple[int, int], Prediction], c: int,
                    tried: set[tuple[int, int]], open_: Sequence[int]) -> dict[int, float]:
        """At a concurrency ``c`` where one num_steps was measured, between measured concurrencies that settled on
        different num_steps (the choice turns at ``c`` or next to it): those num_steps not yet tried at ``c``, with
        their expected improvement (:meth:`values`; at least ``TURN_FLOOR``), whatever the model predicts for them
        (rules 1 and 2 waived). The model is smooth in concurrency; where the choice turns, a dip sharper than its shape
        decides it, and the model's interval there is the one not to trust: on the bundled engine num_steps 1 over 0 at
        concurrency 4 read 0.88-0.94 in every recorded grid, below both neighbours (1.01-1.18 at 2, 0.90-0.99 at 8); a
        guided run that measured only num_steps 1 there chose it at 0.882 of the grid's choice (num_steps 0 past the
        band, under the expected-improvement bar), and a replay of a later grid at 0.919 (num_steps 0's optimistic bound
        short of the band) (docs/sweep.md, "Why each piece is there"). {} elsewhere. ``cells``: the measured
        cells; ``preds``: the model's predictions; ``tried``: the cells already attempted; ``open_``: the num_steps not
        tried at ``c``."""
        here = {x.steps for x in cells.values() if x.conc == c}
        if len(here) != 1:
            return {}
        (_, k_lo), (_, k_hi) = self._neighbours(cells, preds, c, tried)
        if k_lo is None or k_hi is None or k_lo == k_hi:
            return {}
        rivals = [k for k in (k_lo, k_hi) if k not in here and k in open_ and (k, c) in preds]
        best = self._best_measured(cells, c)
        out = {}
        for k in rivals:  # its value orders it among the plan's cells: one the model puts past the band comes last
            got = self._improvement(preds[(k, c)], best)
            out[k] = max(got[1], self.TURN_FLOOR) if got is not None and got[0] > -self.z_one_sided else self.TURN_FLOOR
        return out

    def _neighbours(self, cells: dict[tuple[int, int], Cell], preds: dict[tuple[int, int], Prediction], c: int,
                    tried: set[tuple[int, int]]) -> tuple[tuple[int | None, int | None], tuple[int | None, int | None]]:
        """((the nearest measured concurrency below ``c``, its settled choice), (the nearest above, its settled
        choice)) (:meth:`_settled_best`); None for a side with no measured concurrency or no settled choice."""
        measured = sorted({x.conc for x in cells.values()})
        lo = max((m for m in measured if m < c), default=None)
        hi = min((m for m in measured if m > c), default=None)
        return ((lo, None if lo is None else self._settled_best(cells, preds, lo, tried)),
                (hi, None if hi is None else self._settled_best(cells, preds, hi, tried)))

    def _settled_best(self, cells: dict[tuple[int, int], Cell], preds: dict[tuple[int, int], Prediction], c: int,
                      tried: set[tuple[int, int]]) -> int | None:
        """The settled choice at the measured concurrency ``c`` (:meth:`settled_by_neighbours`), or None while an
        unmeasured num_steps there is still worth measuring."""
        open_ = [k for k in self.steps if (k, c) not in tried and (k, c) in preds]
        if open_ and self.values(cells, preds, c, open_):
            return None
        return self._measured_choice(cells, c)

    def _predicted_choice(self, preds: dict[tuple[int, int], Prediction], c: int, open_: Sequence[int]) -> int:
        """The num_steps ``spectune recommend`` would choose at ``c`` among the predicted cells of ``open_``: the
        smallest whose predicted objective is within the noise band of the predicted best (its tie rule; a predicted
        cell has no paired interval, so the point ratio decides)."""
        value = {k: self._value(preds[(k, c)])[0] for k in open_}
        if self.objective != "tpot":
            best = max(value.values())
            return min(k for k, v in value.items() if v >= best * (1 - self.noise_band))
        best = min(value.values())
        return min(k for k, v in value.items() if v <= best * (1 + self.noise_band))

    def _predicted_best(self, preds: dict[tuple[int, int], Prediction], c: int, open_: Sequence[int]) -> int:
        """The num_steps of ``open_`` whose predicted objective at ``c`` is best (highest throughput, lowest TPOT)."""
        sign = 1 if self.objective != "tpot" else -1
        return max(open_, key=lambda k: sign * self._value(preds[(k, c)])[0])

    def _worth_measuring(self, preds: dict[tuple[int, int], Prediction], c: int, open_: Sequence[int],
               best: float) -> dict[int, float]:
        """The num_steps of ``open_`` at ``c`` worth measuring against the objective value ``best`` (tokens/s or
        ms), with their expected improvement beyond the band as a fraction of ``best`` (:meth:`values`)."""
        out = {}
        for k in open_:
            got = self._improvement(preds[(k, c)], best)
            if got is not None and got[0] > -self.z_one_sided and got[1] >= self.EI_SHARE_OF_BAND * self.noise_band:
                out[k] = got[1]
        return out

    def _improvement(self, p: Prediction, best: float) -> tuple[float, float] | None:
        """(d, the prediction's distance past ``best`` x (1 + band) in its standard errors; the expected improvement
        beyond the band, ``E[max(0, Y - best (1 + band))] / best`` for a normal Y of the prediction and its standard
        error) of the predicted cell ``p`` against the objective value ``best``; None without a standard error."""
        band, maximise = self.noise_band, self.objective != "tpot"
        target = best * (1 + band) if maximise else best / (1 + band)
        v, lo, hi = self._value(p)
        sd = ((hi - v) if maximise else (v - lo)) / self.z
        if not sd > 0:
            return None
        d = (v - target) / sd if maximise else (target - v) / sd
        nd = NormalDist()
        return d, sd * (d * nd.cdf(d) + nd.pdf(d)) / best

    def _duration(self, cells: dict[tuple[int, int], Cell], p: Prediction) -> float:
        """Expected measuring time of the predicted cell ``p``, s: the output tokens a point measured at the nearest
        measured concurrency (log scale) produced (its duration x throughput) over ``p``'s predicted throughput;
        with a window cap (``window_cap_s``, ``--duration``) at most the cap plus the drain, the requests in flight
        at the cap finishing: one request's latency by Little's law, c x output tokens per request / throughput
        (the nearest cells' tokens per request)."""
        timed = [x for x in cells.values() if math.isfinite(x.duration_s) and x.duration_s > 0]
        if not timed or not p.throughput > 0:
            return 1.0
        near = nearest(timed, p.concurrency)
        secs = float(np.mean([x.duration_s * x.throughput for x in near])) / p.throughput
        tpr = [x.tokens_per_request for x in near if math.isfinite(x.tokens_per_request)]
        if self.window_cap_s and tpr:
            secs = min(secs, self.window_cap_s + p.concurrency * float(np.mean(tpr)) / p.throughput)
        return secs

