"""The guided plan's seed: the first cells measured, before the model can say anything.

Four cells: the largest num_steps at the smallest concurrency (the per-position acceptance of every smaller
num_steps), num_steps 0 and 1 side by side at the second largest concurrency (the largest on a grid of three or
fewer; the jump in step time from no speculation to one draft token, the draft's fixed cost, is measured rather than
guessed), num_steps 0 at the lower middle concurrency (the batch dependence; the middle of three, left out without
one). Then a fifth chosen by what the pair showed: where num_steps 1 beats 0 there by more than the noise band, the
middle num_steps at the pair's concurrency (how far K goes); otherwise num_steps 1 at the lower middle concurrency
(where speculation stops paying).

The pair sits below the largest concurrency so that, where no speculation wins there, the largest concurrency is
left to the model (:meth:`spectune.sweep.guided.choose.Choosing.settled_by_neighbours`: the best num_steps does not
rise with concurrency) instead of measured: with a ``--duration`` cap its windows are the grid's longest (on the
bundled engine 45-48 s at concurrency 32 against 35-39 s at 16: the cap plus the drain of a wave of requests in
flight). On the bundled engine's recorded grids the guided plan takes 23.8% of six 5 x 4 grids' time and 21.1% of
twenty 5 x 6 grids' with the pair below the largest concurrency, 31.7% and 24.1% with the pair at the largest, the
same choices (``python benchmarks/guided_vs_grid.py --recorded GRID... --without-slo``; docs/sweep.md, "On the
bundled engine, live").

What the other seeds cost (a fixed fifth cell, a three-cell seed on small grids): docs/sweep.md, "Why each piece is
there".
"""

from __future__ import annotations

from typing import Sequence

from spectune.results.schema import PointKey
from spectune.sweep.guided.model import Cell

__all__ = ["Seeding"]


class Seeding:
    """The seed cells (module docstring); a mixin of :class:`spectune.sweep.guided.GuidedPlanner`."""

    steps: Sequence[int]
    concurrency: Sequence[int]
    objective: str
    noise_band: float

    def seed(self) -> list[tuple[int, int]]:
        """The first round (duplicates dropped), four cells:

        * (largest K, smallest c): the per-position acceptance of every smaller K;
        * (smallest K, pair's c), (second K, pair's c): num_steps 0 and 1 at the same concurrency, the second
          largest (:attr:`_pair_concurrency`), so the jump in step time from no speculation to one draft token (the
          draft model's fixed per-step cost, ``K>0``) is identified instead of being spread over the per-draft-token
          slope;
        * (smallest K, lower middle c, :attr:`_probe_concurrency`): the batch dependence; left out on a grid of fewer
          than three concurrencies (there is no middle one: the other end is opened by its predicted best num_steps
          right after the seed).

        A fifth cell follows once these are measured (:meth:`seed_followup`)."""
        ks, cs = sorted(self.steps), sorted(self.concurrency)
        cp = self._pair_concurrency
        cells = [(ks[-1], cs[0]), (ks[0], cp), (ks[1] if len(ks) > 1 else ks[0], cp)]
        if len(cs) >= 3:
            cells.append((ks[0], self._probe_concurrency))
        out: list[tuple[int, int]] = []
        for cell in cells:
            if cell not in out:
                out.append(cell)
        return out

    def window_goal(self, key: PointKey) -> str | None:
        """``seed_acceptance`` for the first run of the seed's first cell (the largest num_steps at the smallest
        concurrency), else None: that cell is measured for the per-position acceptance of every smaller num_steps,
        which the engine's counters give from the window's first requests, so its window stops at the early-stop
        minimum (:class:`spectune.sweep.sequential.EarlyStop` ``at_minimum``). At the smallest concurrency it is
        the grid's most expensive kind of cell: a full window of it was 6% of a 5 x 6 grid's time and 7% of a 5 x 4
        one's on the compute-bound emulated server, where it is 22-31% below the best. Its throughput is kept with
        its wider interval: a later cell at its concurrency stops early against it, and the settle step measures it
        again where a deciding comparison rests on that width."""
        key = PointKey(*key)
        return "seed_acceptance" if key.repeat == 0 and key.cell == self.seed()[0] else None

    @property
    def _pair_concurrency(self) -> int:
        """The concurrency of the seed's num_steps 0/1 pair: the second largest on a grid of four or more
        concurrencies (module docstring), else the largest."""
        cs = sorted(self.concurrency)
        return cs[-2] if len(cs) >= 4 else cs[-1]

    @property
    def _probe_concurrency(self) -> int:
        """The concurrency of the seed's batch-dependence cell: the lower middle one (below the pair's on a grid of
        four or more concurrencies), the middle of three, else the smallest."""
        cs = sorted(self.concurrency)
        return cs[(len(cs) - 1) // 2] if len(cs) > 2 else cs[0]

    def seed_followup(self, cells: dict[tuple[int, int], Cell]) -> tuple[int, int] | None:
        """The seed's fifth cell, chosen by what the pair (:attr:`_pair_concurrency`) showed (module docstring): where
        num_steps 1 beats 0 there by more than the noise band, speculation pays at the pair's batch and the open
        question is how far K goes, so the middle num_steps at the pair's concurrency (the per-draft-token cost at a
        large batch); otherwise the open question is where speculation stops paying, so num_steps 1 at the lower middle
        concurrency (how the draft's fixed cost scales with the batch). None when the
        pair was not measured (failed cells) or the plan has fewer than three num_steps."""
        ks = sorted(self.steps)
        if len(ks) < 3:
            return None
        k0, k1 = cells.get((ks[0], self._pair_concurrency)), cells.get((ks[1], self._pair_concurrency))
        if k0 is None or k1 is None:
            return None
        if self.objective == "tpot":
            pays = k1.tpot * (1 + self.noise_band) < k0.tpot
        else:
            pays = k1.throughput > k0.throughput * (1 + self.noise_band)
        return (ks[len(ks) // 2], self._pair_concurrency) if pays else (ks[1], self._probe_concurrency)

