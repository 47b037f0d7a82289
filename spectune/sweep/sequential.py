"""Windows that stop when the decision they serve is settled (``spectune sweep --early-stop``; on by default for
``--plan guided``).

A point's window normally runs its planned requests (``--requests-per-point``). Most cells are measured to answer one
question: *is this num_steps better than the best measured at its concurrency?* Once that answer is certain the rest
of the window buys nothing. :class:`EarlyStop` watches the measured requests as they finish and ends the window
(``stop_reason`` ``early_stop``; the requests in flight are cancelled and left out, below) when, after at least
``min_requests`` successful requests and ``min_s`` seconds:

* ``below_best``: the cell's upper bound cannot take the choice from the reference (the best other cell measured at
  the concurrency): ``spectune recommend`` calls differences inside the noise band ties and takes the smaller
  num_steps of a tie, so a larger num_steps than the reference's must beat it by more than the band (upper bound
  below reference x (1 + band) stops it) and a smaller one must come within the band (upper bound below
  reference x (1 - band) stops it);
* ``above_best``: its lower bound takes the choice from the reference by the same rule (above reference x (1 +
  band) for a larger num_steps, above reference x (1 - band) for a smaller one), once half its window is measured:
  the cell becomes the reference of every later comparison at its concurrency and a side of the deciding one, which
  an interval from the early-stop minimum leaves so wide that recommend's interval-tie rule hands the choice to a
  worse smaller num_steps (seen on the held-out quadratic model, 5 x 4: K=2 at concurrency 1 stopped at 11 of 48
  requests, and K=1, 10% below it, was chosen even after both were measured again);
* ``seed_acceptance``: the window was measured for the engine's per-position acceptance counters (the guided
  plan's first cell, :meth:`spectune.sweep.guided.seed.Seeding.window_goal`), which its first requests give: it stops
  as soon as the minimum is reached; its throughput is kept with its wider interval;
* ``futile`` (a num_steps larger than the reference's, or either unknown): the rest of the window could not let the
  cell take the choice: the predictive probability that the full window's estimate would pass the edge
  ``above_best`` uses (reference x (1 + band)) is under ``1 - confidence`` (below). A cell near the best but not
  beyond the band (a near-tie, which no window of its length resolves) stops there instead of running to the end of
  its window for a call that cannot change; the choice stays with the reference, as recommend would leave it. A
  smaller num_steps is never stopped so: cut short, its wide interval would reach the band and recommend's
  interval-tie rule would hand it the choice (seen on the tests' compute-bound model and the held-out quadratic
  one: a choice 0.891 of the grid's);
* ``within_band`` (a num_steps smaller than the reference's): the full window would leave the cell within the band
  of the reference, or above it, where recommend's tie rule gives it the choice: the predictive probability (below,
  as ``futile``) that the full window's estimate ends above reference x (1 - band) is at least ``confidence``. Cut
  short there, the choice is the one the full window would make. A cell whose estimate is above the reference (it
  would become the reference) waits for half its window, as ``above_best``. On the held-out roofline model it took
  the 5 x 6 guided sweep from 26.0% to 23.6% of the grid's time (docs/sweep.md);
* ``precise``: its interval's half-width is at most ``precision`` (a fraction; default half the noise band) and the
  window's two halves agree within it: the estimate is as tight as any comparison needs. The halves guard a cell
  whose requests barely scatter (num_steps 0 on a deterministic server): its interval is narrow at once, and a
  machine slowing down under it would otherwise pass for a precise result (seen on the emulated servers of a loaded
  machine: 10% within one window).

**The interval.** A decision checked after every request is a sequential test: a fixed-n 95% interval looked at
after each of n requests would be wrong far more than 5% of the time. The bounds are an *asymptotic confidence
sequence* (Waudby-Smith, Arbour, Sinha, Kennedy and Ramdas, "Time-uniform central limit theory and asymptotic
confidence sequences", arXiv:2103.06476, 2021, Theorem 2.2: the two-sided boundary of Robbins' normal mixture
applied to the running mean with its running standard deviation): with probability at least ``confidence``
(asymptotically) the true value lies inside the bounds at *every* request count simultaneously, so stopping at the
first request where a rule holds keeps the error rate at most ``1 - confidence`` per cell:

    half-width(t) = sd_t * sqrt(2 (t rho^2 + 1) / (t^2 rho^2) * log(sqrt(t rho^2 + 1) / alpha)),
    rho^2 = (-2 log alpha + log(-2 log alpha + 1)) / t_opt

(``alpha = 1 - confidence``; ``rho^2`` makes the boundary tightest near ``t_opt`` requests, here the planned window;
the authors' R package ``drconfseq``, ``std_conjmix_margin`` and ``best_rho2_approx``). At ``t_opt`` the half-width
is about 1.5 times the fixed-n normal one: the price of looking after every request.

**The statistic.** Throughput objective: a closed loop of c requests delivers ``c * sum(tokens) / sum(latency)``
tokens/s (Little's law, latency counted from when the request's slot freed: ``e2e + dispatch_delay``; the window's
own ``output_throughput_tok_s`` up to its ramp-up and drain, a few % at four waves), a ratio of means
whose standard deviation comes from the delta method (per request ``d_i = tokens_i - R * latency_i``, relative sd
``sd(d) / mean(tokens)``). TPOT objective: the mean of the requests' TPOT (ms), relative sd ``sd / mean``. The
requests of one closed loop share batches, so they are not independent; the minimum of two closed-loop waves
(``min_requests``) keeps the first wave's ramp-up and a slow start of the server from deciding alone. Where the
window's ``--duration`` cap ends it before two waves finish (at its rate so far), the minimum is one wave: the
full window itself is then less than two, and a minimum of two would forbid every stop before the cap (on the
bundled engine, 32 prompts of 128 tokens at concurrency 32 finish about 41 requests in a 30 s window).

**Futility.** ``futile`` is stochastic curtailment by predictive probability (Spiegelhalter, Freedman and
Blackburn, "Monitoring clinical trials: conditional or predictive power?", Controlled Clinical Trials 7(1), 1986):
after n of the window's N requests with estimate m and per-request relative sd s, the full window's estimate is
predicted normal around m with relative sd ``s * sqrt((N - n) / (N n))`` (the mean's own uncertainty and the
requests still to come), and the window stops when the probability that it ends beyond the edge is under ``1 -
confidence``. N is the planned requests, or, for a window capped by ``--duration``, the requests its rate so far
reaches by the cap. It never moves the choice to the cell (only the confidence sequence's ``above_best`` does):
a wrong ``futile`` stop keeps the reference where the full window would have found the cell better than it by
more than the band, with probability at most ``1 - confidence`` under the normal approximation.

**Through the drain.** The rule is asked as each request finishes after the ``--duration`` cap too: the window
waits for its requests in flight, and a stop while they finish cancels the rest
(``Constraints.cancel_on_early_stop``, ``loadgen/send_loop.py``). Those requests take up to one request's
latency to drain, and the first of them often settle the cell: on the bundled engine the seed's K=1 at concurrency
32, whose first wave of 32 finishes near the 30 s cap, stopped ``below_best`` at 32 requests and 32.4 s where it
had drained to 42-43 s (``python benchmarks/guided_vs_grid.py --backend local``, docs/sweep.md's command). A
window that sent all its planned requests runs them to the end: it is then measured in full, every planned prompt in it (the comparisons
pair on prompts, and the end-of-sweep drift check re-measures a full window, ``Sweep._reference``; letting the
rule stop a deterministic emulated server's reference-less window ``precise`` in that last wave left a guided
sweep with no full window at all). The recorded windows of ``benchmarks/guided_vs_grid.py`` feed the rule every
request in order, the drain after the cap included, so replays do not show this difference.

**What an early-stopped window reports.** The statistic itself: its Little's-law throughput over the requests that
finished by the stop (:func:`closed_loop_throughput`; ``metrics.output_throughput_tok_s``, the window's own tokens
over its length kept in its ``early_stop`` record as ``window_output_throughput_tok_s``). The requests still in
flight are cancelled at the stop (``Constraints.cancel_on_early_stop``), not waited for: the statistic needs only
the finished ones, and waiting costs up to one request's latency, the length of a whole closed-loop wave (about 18 s
at concurrency 32 on the bundled engine). A full window's own figure, tokens over its length, counts its ramp-up
(the first wave's prefills share the loop's first steps) and its drain (the last requests finishing with the loop
no longer full); the statistic of a window's first requests weighs the ramp-up more than a full window does and
counts no drain, and on the bundled engine the two roughly offset. Against the full windows' own figures on five
bundled-engine 5 x 6 grids (each full window at concurrency 4-32 cut after its first one or two waves of finished
requests; ``benchmarks/early_stop_estimates.py``), it read 0.956-1.038 of them on average per concurrency and
number of waves, 2.9-5.8% RMS. Letting the window's requests in flight finish too, scaled by the full windows'
ratio of their own figure to the statistic over all their requests, reads 0.907-1.020 and 3.5-9.5% (that ratio
holds their drain only: the first wave weighs more in a window cut short, so at concurrency 8 after one wave it
reads 9% low, and a cell that ties reads as a loss). A scale matched to the same number of first requests of the
full windows is unbiased but scatters more (4.4-9.2% RMS with one full window to scale by), and the guided plan
measures more cells with it (``benchmarks/early_stop_estimates.py``; docs/sweep.md, "Why each piece is there").

**The reference.** The best other cell at the concurrency, compared on the prompts both measured: each check
rescales the reference's figure by its own statistic on the prompts this window has finished over its statistic on
all of its prompts (:func:`prompt_sums`), as ``spectune recommend`` compares two cells
(:meth:`spectune.results.confidence.Bootstrap.matched_ratio`). A window's first requests are its first prompts,
and prompts differ in cost; against the reference's whole figure, a window's first wave on costly prompts reads as
a loss. On the bundled engine (docs/sweep.md's command): num_steps 1 at concurrency 2 and 4 stopped ``futile`` after
8 requests at 0.87 and 0.85 of num_steps 0's whole windows, where on those 8 prompts they were 0.93 [0.80, 1.07]
and 0.92 [0.81, 1.07] of it, and every grid of that command (docs/sweep.md) had num_steps 1 ahead at concurrency 2.

**Paired.** Prompts differ in cost far more than two num_steps differ on one prompt: on the bundled engine's grids a
request's contribution scatters by 0.20-0.26 (relative sd) within a window at concurrency 1-8, while the same
prompt's request in two num_steps' windows differs by 0.10-0.15 (two 5 x 6 grids of that command). The rescaled
reference above moves the reference's level to the prompts measured, but the window's own interval still carries the
prompts' spread. So where the reference's requests are known (``reference_requests``, :func:`request_parts`) a second
test compares the two windows request by request: the i-th request of a prompt in this window against the i-th of
the same prompt in the reference's (the windows send their prompts in the same order). Its statistic is the ratio of
the two windows' statistics over the paired requests, its relative sd per pair the delta method's on the log of that
ratio of ratios (per pair ``a_i / mean(a) - b_i / mean(b) - (a'_i / mean(a') - b'_i / mean(b'))``, ``(a, b)`` the
statistic's parts, primed for the reference), and its bounds the same confidence sequence over the pairs, from
``MIN_REQUESTS`` pairs on. Either test may stop the window (``below_best``, ``above_best``, ``futile`` and
``within_band`` alike, the futility prediction over the pairs still to come), each at half the error rate
(Bonferroni), so the pair together keeps it. Replayed on ten recorded bundled-engine grids
(``benchmarks/guided_vs_grid.py --recorded GRID... --without-slo``) it takes the guided plan from 24.6% to 23.9% of
the grids' time with the same choices; on virtual windows whose prompts differ (``--virtual 6 --prompt-noise 0.3``)
from 28.3% to 26.5%; without prompt effects it costs next to nothing (19.1% and 19.2%). ``early_stop.paired`` in
points.jsonl keeps the paired ratio, its bounds and the pairs.

Error rate, stated: per cell, the reference is treated as known by the unpaired test (the paired test carries the
reference's own scatter per pair); a stop on ``below_best`` or ``above_best`` is wrong with probability at most
``1 - confidence`` (5% at the default) under the asymptotic CS's conditions, the two tests together, and ``precise``
leaves the estimate inside its bounds with the same probability (``tests/sweep/test_early_stop.py`` simulates the
paired pair on a cell as fast as its reference on every prompt). The reference is itself a measurement (its own
interval): the guided plan's settle step compares the two cells again with the paired bootstrap
(:meth:`spectune.sweep.guided.GuidedPlanner.comparisons`) before the choice is final.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING, Iterable, Sequence, Union

from spectune.results.request_figures import FinishedRequest, RequestFigures

if TYPE_CHECKING:
    from spectune.results.point import EarlyStopLook, EarlyStopRecord, RequestLine

__all__ = ["EarlyStop", "cs_half_width", "closed_loop_throughput", "prompt_sums", "request_parts", "MIN_WAVES",
           "MIN_REQUESTS", "MIN_SECONDS", "FinishedRequest", "RequestLike"]

#: closed-loop waves a window runs at least before it may stop early (the first wave ramps up)
MIN_WAVES = 2
#: successful requests a window measures at least before it may stop early
MIN_REQUESTS = 8
#: seconds a sweep's window runs at least before it may stop early (a server's first second after a switch)
MIN_SECONDS = 1.0


RequestLike = Union[FinishedRequest, "RequestLine"]
"""A finished request as a record (:class:`FinishedRequest`) or as a requests.jsonl object."""


def cs_half_width(sd: float, n: int, alpha: float, t_opt: float) -> float:
    """Half-width of the two-sided asymptotic confidence sequence after ``n`` observations of standard deviation
    ``sd`` (same unit as ``sd``; module docstring, Waudby-Smith et al. 2021, Theorem 2.2), tightest near ``t_opt``
    observations; inf for n < 2.

    Raises:
        ValueError: alpha not in (0, 1) or t_opt not positive.
    """
    if not 0 < alpha < 1 or not t_opt > 0:
        raise ValueError(f"alpha must be in (0, 1) and t_opt > 0, got {alpha}, {t_opt}")
    if n < 2:
        return math.inf
    la = -2 * math.log(alpha)
    rho2 = (la + math.log(la + 1)) / t_opt
    return sd * math.sqrt(2 * (n * rho2 + 1) / (n * n * rho2) * math.log(math.sqrt(n * rho2 + 1) / alpha))


@dataclass
class EarlyStop:
    """The stop rule of one window (module docstring). Call :meth:`check` with the finished records (objects with
    ``ok``, ``completion_tokens``, ``e2e_s`` and ``tpot_s``, as :class:`spectune.loadgen.record.RequestRecord`) and
    the seconds since the window began; it returns the reason to stop (``below_best``, ``above_best``, ``futile``,
    ``within_band``, ``precise``, or the ``at_minimum`` reason) or None, and keeps the last estimate for the point's
    ``early_stop`` record (:meth:`describe`).

    Args:
        objective: ``throughput`` (max tokens/s) or ``tpot`` (min ms).
        concurrency: the closed loop's requests in flight (the throughput statistic's c).
        planned: the window's planned requests (the confidence sequence's ``t_opt``).
        reference: the best objective value measured by another cell at this concurrency (tokens/s or ms), or None
            (only ``precise`` can stop the window then). steps, reference_steps: num_steps of this cell and of the
            reference (None: the band counts against the cell both ways, as if the num_steps were unknown).
        noise_band: fraction; differences below it are ties. confidence: of the confidence sequence (0.5..1).
        precision: relative half-width at which the estimate is precise enough (default: half the noise band).
        min_requests: successful requests before any stop (default max(``MIN_WAVES`` x concurrency,
            ``MIN_REQUESTS``); one wave where the cap ``max_s`` ends the window before that many,
            :meth:`_minimum`). min_s: seconds before any stop.
        at_minimum: a reason to stop as soon as the minimum is reached (``seed_acceptance``: the window is measured
            for what its first requests already give), or None.
        max_s: the window's cap in seconds (``--duration``), or None: the futility rule's N is the requests the
            window reaches by then at its rate so far, when fewer than ``planned``.
        reference_prompts: the reference cell's requests summed per prompt (:func:`prompt_sums`), or None: each
            check compares the cell with the reference on the prompts both measured (module docstring, "The
            reference"); without it, or with fewer than two shared prompts, with the reference's whole figure.
        reference_requests: the reference cell's requests keyed by (prompt, occurrence) (:func:`request_parts`), or
            None: the paired test (module docstring, "Paired") runs beside the unpaired one, each at half the error
            rate.
    """

    objective: str
    concurrency: int
    planned: int
    reference: float | None = None
    noise_band: float = 0.02
    confidence: float = 0.95
    precision: float | None = None
    min_requests: int | None = None
    min_s: float = 0.0
    steps: int | None = None
    reference_steps: int | None = None
    at_minimum: str | None = None
    max_s: float | None = None
    reference_prompts: dict[str, tuple[float, float]] | None = None
    reference_requests: dict[tuple[str, int], tuple[float, float]] | None = None
    last: EarlyStopLook = field(default_factory=dict)
    reason: str | None = None
    _seen: int = -1

    def __post_init__(self) -> None:
        if self.precision is None:
            self.precision = self.noise_band / 2
        if self.min_requests is None:
            self.min_requests = max(MIN_WAVES * self.concurrency, MIN_REQUESTS)

    def estimate(self, records: Sequence[FinishedRequest]) -> tuple[float, float, int] | None:
        """(estimate, relative sd of one request's contribution, n) of the objective from the successful
        ``records``; None when fewer than two are usable."""
        if self.objective == "tpot":
            xs = [r.tpot_s * 1e3 for r in records if r.ok and r.tpot_s is not None]
            if len(xs) < 2:
                return None
            m = sum(xs) / len(xs)
            sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
            return m, sd / m if m > 0 else math.inf, len(xs)
        pairs = _throughput_parts(records)
        n = len(pairs)
        if n < 2:
            return None
        tok, lat = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
        ratio = tok / lat
        d = [t - ratio * s for t, s in pairs]
        md = sum(d) / n
        sd = math.sqrt(sum((x - md) ** 2 for x in d) / (n - 1))
        return self.concurrency * ratio, sd / (tok / n), n

    def check(self, records: Sequence[FinishedRequest], elapsed_s: float) -> str | None:
        """Why the window may stop now, or None (module docstring). Evaluated once per new finished record."""
        if self.reason is not None:
            return self.reason
        if len(records) == self._seen:
            return None
        self._seen = len(records)
        got = self.estimate(records)
        if got is None:
            return None
        value, rel_sd, n = got
        alpha = 1 - self.confidence
        r = cs_half_width(rel_sd, n, alpha, max(self.planned, n))
        lo, hi = value * (1 - r), value * (1 + r)
        minimum = self._minimum(n, elapsed_s)
        self.last = {"estimate": value, "low": lo, "high": hi, "requests": n, "elapsed_s": elapsed_s,
                     "reference": self.reference, "minimum": minimum}
        if n < minimum or elapsed_s < self.min_s:
            return None
        if self.at_minimum:
            self.reason = self.at_minimum
            return self.reason
        band, ref = self.noise_band, self._matched_reference(records)
        self.last["reference"] = ref
        reason = None
        if ref is not None and ref > 0:
            known = self.steps is not None and self.reference_steps is not None
            larger = known and self.steps > self.reference_steps  # type: ignore[operator]
            smaller = known and self.steps < self.reference_steps  # type: ignore[operator]
            below_edge, above_edge = (1 + band if larger else 1 - band), (1 - band if smaller else 1 + band)
            paired = self._paired(records)
            # the cell over the reference, "better" up, by each test: (ratio, its relative sd per request, requests)
            tests = [(value / ref if self.objective != "tpot" else ref / value, rel_sd, n)]
            if paired is not None:
                tests.append(paired)
            each = alpha / len(tests)  # Bonferroni: either test may stop the window, each at alpha / 2
            bounds = [self._ratio_bounds(ratio, sd, m, each) for ratio, sd, m in tests]
            if paired is not None:
                self.last["paired"] = {"ratio": paired[0], "low": bounds[1][0], "high": bounds[1][1],
                                       "pairs": paired[2]}
            if any(high < below_edge for _, high in bounds):
                reason = "below_best"
            elif any(low > above_edge for low, _ in bounds):
                reason = "above_best" if 2 * n >= self._total(n, elapsed_s) else None
            else:
                for i, (ratio, sd, m) in enumerate(tests):
                    total = self._total(n, elapsed_s) if i == 0 else self._paired_total(n, m, elapsed_s)
                    reason = (self._futile(ratio, sd, m, total, each) if not smaller
                              else self._within_band(ratio, sd, m, total, each))
                    if reason:
                        break
        if reason is None and r <= (self.precision or 0):
            half = len(records) // 2
            a, b = self.estimate(records[:half]), self.estimate(records[half:])
            if a is not None and b is not None and abs(a[0] - b[0]) <= r * value:
                reason = "precise"
        self.reason = reason
        return reason

    def _ratio_bounds(self, ratio: float, rel_sd: float, n: int, alpha: float) -> tuple[float, float]:
        """The confidence-sequence bounds (low, high) at ``1 - alpha`` of the cell's objective over the reference's,
        "better" up, from ``ratio`` after ``n`` requests of relative sd ``rel_sd`` (TPOT: the reference's over the
        cell's, whose own bounds are its TPOT x (1 -+ half-width))."""
        w = cs_half_width(rel_sd, n, alpha, max(self.planned, n))
        if self.objective != "tpot":
            return ratio * (1 - w), ratio * (1 + w)
        return ratio / (1 + w), (ratio / (1 - w) if w < 1 else math.inf)

    def _paired(self, records: Sequence[FinishedRequest]) -> tuple[float, float, int] | None:
        """The paired test's (ratio of the cell to the reference on the requests both measured, "better" up;
        relative sd of one pair's contribution to its log, delta method; pairs), or None without
        ``reference_requests`` or with fewer than ``MIN_REQUESTS`` pairs (module docstring, "Paired")."""
        ref = self.reference_requests
        if not ref:
            return None
        mine = request_parts(records, self.objective)
        keys = [k for k in mine if k in ref]
        m = len(keys)
        if m < MIN_REQUESTS:
            return None
        a, b = [mine[k][0] for k in keys], [mine[k][1] for k in keys]
        ra, rb = [ref[k][0] for k in keys], [ref[k][1] for k in keys]
        ma, mb, mra, mrb = sum(a) / m, sum(b) / m, sum(ra) / m, sum(rb) / m
        if min(ma, mb, mra, mrb) <= 0:
            return None
        u = [x / ma - y / mb - (xr / mra - yr / mrb) for x, y, xr, yr in zip(a, b, ra, rb)]
        mu = sum(u) / m
        sd = math.sqrt(sum((x - mu) ** 2 for x in u) / (m - 1))
        cell_over_ref = (ma / mb) / (mra / mrb)
        return (cell_over_ref if self.objective != "tpot" else 1 / cell_over_ref), sd, m

    def _paired_total(self, n: int, m: int, elapsed_s: float) -> float:
        """The pairs the window will have at its end: its requests at the end (:meth:`_total`) less those it
        measured so far with no counterpart in the reference (``n - m``), at most the reference's requests."""
        return min(self._total(n, elapsed_s) - (n - m), float(len(self.reference_requests or {})))

    def _matched_reference(self, records: Sequence[FinishedRequest]) -> float | None:
        """The reference on the prompts of ``records`` it measured too (module docstring, "The reference"): its
        figure times its statistic on those prompts over its statistic on all of its own (:func:`prompt_sums`); the
        whole figure without ``reference_prompts`` or with fewer than two shared prompts."""
        ref, sums = self.reference, self.reference_prompts
        if ref is None or not sums:
            return ref
        mine = {RequestFigures.of(r).prompt_id for r in records}
        shared = [sums[p] for p in mine if p in sums]
        whole_b = sum(b for _, b in sums.values())
        part_b = sum(b for _, b in shared)
        if len(shared) < 2 or whole_b <= 0 or part_b <= 0:
            return ref
        whole = sum(a for a, _ in sums.values()) / whole_b
        return ref * (sum(a for a, _ in shared) / part_b) / whole if whole > 0 else ref

    def _minimum(self, n: int, elapsed_s: float) -> int:
        """Successful requests before any stop: ``min_requests``, or one closed-loop wave (at least
        ``MIN_REQUESTS``) where the window's cap ends it before that many (:meth:`_total`): a window the cap holds
        to fewer than two waves would otherwise never stop before it."""
        mn = self.min_requests or 0
        if self.max_s and elapsed_s > 0 and mn > self._total(n, elapsed_s):
            return min(mn, max(self.concurrency, MIN_REQUESTS))
        return mn

    def _total(self, n: int, elapsed_s: float) -> float:
        """The requests the window will have measured at its end: ``planned``, or, for a window capped by ``max_s``
        seconds, the ``n`` measured in ``elapsed_s`` extrapolated to the cap, whichever is fewer."""
        if self.max_s and elapsed_s > 0:
            return min(float(self.planned), n * self.max_s / elapsed_s)
        return float(self.planned)

    def _predicted(self, ratio: float, rel_sd: float, n: int, total: float,
                   alpha: float) -> tuple[float, float] | None:
        """The full window's ratio to the reference as predicted after ``n`` of its ``total`` requests (module
        docstring, "Futility"): (``ratio``, the cell over the reference now, "better" up; z x the predictive sd of
        that ratio at the window's end, z the one-sided ``1 - alpha`` quantile), or None when no request is left
        to come or the requests do not scatter."""
        if total <= n or not rel_sd > 0:
            return None
        sd = rel_sd * ratio * math.sqrt((total - n) / (total * n))
        return ratio, NormalDist().inv_cdf(1 - alpha) * sd

    def _futile(self, ratio: float, rel_sd: float, n: int, total: float, alpha: float) -> str | None:
        """``futile`` (a larger num_steps than the reference's, or either unknown) when the rest of the window would
        let the cell pass the reference x (1 + band) edge with predictive probability under ``alpha`` (module
        docstring), else None."""
        got = self._predicted(ratio, rel_sd, n, total, alpha)
        return "futile" if got is not None and 1 + self.noise_band - got[0] > got[1] else None

    def _within_band(self, ratio: float, rel_sd: float, n: int, total: float, alpha: float) -> str | None:
        """``within_band`` (a smaller num_steps than the reference's) when the full window's ratio would end above
        1 - band with predictive probability at least ``1 - alpha`` (module docstring), else None."""
        got = self._predicted(ratio, rel_sd, n, total, alpha)
        if got is None:
            return None
        ratio, margin = got
        if ratio > 1 and 2 * n < total:
            return None  # it would become its concurrency's reference: as above_best, not before half its window
        return "within_band" if ratio - (1 - self.noise_band) > margin else None

    def describe(self) -> EarlyStopRecord:
        """points.jsonl's ``early_stop``: the rule's settings, its ``reason`` (None: ran the full window) and the
        last estimate with its confidence-sequence bounds (``estimate``, ``low``, ``high``, ``requests``,
        ``elapsed_s``, ``reference``) and the minimum in force then (``minimum``: ``min_requests``, or one wave where
        the cap binds, :meth:`_minimum`), and with the paired test the cell over the reference by it (``paired``:
        ``ratio``, ``low``, ``high``, "better" up at half the error rate, and ``pairs``)."""
        return {"reason": self.reason, "objective": self.objective, "confidence": self.confidence,
                "noise_band": self.noise_band, "precision": self.precision, "min_requests": self.min_requests,
                "min_s": self.min_s, "method": "asymptotic confidence sequence (Waudby-Smith et al. 2021)",
                **self.last}


def closed_loop_throughput(records: Iterable[RequestLine], concurrency: int) -> float | None:
    """Little's-law output throughput (tokens/s) of a closed loop of ``concurrency`` requests from requests.jsonl
    objects (``error``, ``completion_tokens``, ``e2e_ms``, ``dispatch_delay_s``): ``c * sum(tokens) / sum(latency)``,
    latency counted from when the request's slot freed (the rule's statistic, module docstring; Little, "A proof for
    the queuing formula L = lambda W", Operations Research 9(3), 1961), and an early-stopped window's reported
    throughput. It has neither the ramp-up nor the drain that a window's own ``output_throughput_tok_s`` (tokens over
    the window's length) counts. None without usable requests."""
    pairs = _throughput_parts(records)
    lat = sum(x for _, x in pairs)
    return concurrency * sum(t for t, _ in pairs) / lat if lat > 0 else None


def prompt_sums(records: Iterable[RequestLine], objective: str) -> dict[str, tuple[float, float]]:
    """A reference cell's requests (requests.jsonl objects, every repeat) summed per ``prompt_id`` as the parts of
    the rule's statistic, ``(a, b)`` with statistic ``sum(a) / sum(b)``: throughput (output tokens, latency s from
    when the slot freed), TPOT (TPOT ms, 1); the sums over each prompt's requests of :func:`request_parts`.
    :meth:`EarlyStop._matched_reference` rescales the reference by them."""
    out: dict[str, tuple[float, float]] = {}
    for (p, _), (x, y) in request_parts(records, objective).items():
        a, b = out.get(p, (0.0, 0.0))
        out[p] = (a + x, b + y)
    return out


def request_parts(records: Iterable[RequestLike], objective: str) -> dict[tuple[str, int], tuple[float, float]]:
    """The parts of the rule's statistic, ``(a, b)`` with statistic ``sum(a) / sum(b)`` (as :func:`prompt_sums`), of
    each successful request keyed by (``prompt_id``, its occurrence among the requests of that prompt, in order):
    the pairs of the paired test (:meth:`EarlyStop._paired`; a window's i-th request of a prompt against the
    reference's i-th). ``records``: RequestRecord-like objects or requests.jsonl objects."""
    out: dict[tuple[str, int], tuple[float, float]] = {}
    seen: dict[str, int] = {}
    for r in map(RequestFigures.of, records):
        p = r.prompt_id
        if p is None:
            continue
        if objective == "tpot":
            part = (float(r.tpot_ms), 1.0) if r.ok and r.tpot_ms is not None else None
        else:
            part = _tokens_and_latency(r)
        if part is not None:
            i = seen.get(p, 0)
            seen[p] = i + 1
            out[(p, i)] = part
    return out


def _throughput_parts(records: Iterable[RequestLike]) -> list[tuple[float, float]]:
    """:func:`_tokens_and_latency` of each successful request of ``records`` that has both."""
    return [part for r in map(RequestFigures.of, records) if (part := _tokens_and_latency(r)) is not None]


def _tokens_and_latency(r: RequestFigures) -> tuple[float, float] | None:
    """(output tokens, latency s from when the request's slot freed: end-to-end + dispatch delay) of a successful
    request with both, the throughput statistic's parts (module docstring); None otherwise."""
    tok, e2e = r.completion_tokens, r.e2e_s
    if r.ok and tok and e2e and e2e > 0:
        return float(tok), e2e + (r.dispatch_delay_s or 0.0)
    return None
