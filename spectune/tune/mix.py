"""The load a config will serve (``spectune recommend --mix``): rank the answers by the tokens that load streams.

Without a mix, recommend ranks one static num_steps by the geometric mean over the swept concurrencies of its
objective relative to the best there (:func:`spectune.tune.recommend.best_static`): every concurrency weighs the
same, whatever it streams. A load that spends equal time at concurrency 1 and 32 streams most of its tokens at 32,
and ``spectune validate`` rules on the overall output tokens/s of such a load (:mod:`spectune.validate.verdict`).
Where no answer wins at every concurrency the two disagree: on vLLM's CPU build, static K=1 led every
concurrency up to 8 and lost 21-29% to no drafter at 32; the geometric mean chose K=1 and validate's swing (1 and
32) measured K=0 1.138x faster (docs/examples/vllm-cpu).

With a mix ``{concurrency: time share}`` each answer is priced as the output tokens/s that load streams,
sum over c of share(c) x tokens/s(answer, c), which is what a closed loop spending those shares of its time at
those concurrencies measures overall. The answers, simplest first: each static num_steps in ascending order
(K=0 is no drafter), then the per-batch-size schedule priced where it runs
(:meth:`spectune.tune.recommend.Recommendation.slot_cell`: the schedule server's cells when the sweep measured
them). The primary is the simplest answer the best one does not beat beyond the noise band: the paired bootstrap
interval of its ratio to the best (every cell's replicates share the analysis's prompt resampling,
:class:`spectune.results.confidence.Bootstrap`, so the sums pair too) reaches within the band of 1, the tie rule
recommend applies at one concurrency (:func:`spectune.tune.compare._ties`).
"""

from __future__ import annotations

import math
import re
import dataclasses
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from spectune.core.errors import UserError
from spectune.results.cell import Cell
from spectune.results.confidence import Interval, ratio_interval
from spectune.results.primary import MixPricing, PricedAnswer, Primary
from spectune.tune.gain import RecommendationLike, use_static


def parse_mix(text: str) -> dict[int, float]:
    """``"1:1,32:1"`` (concurrency:time share) or ``"1,32"`` (equal shares) -> {concurrency: share}, shares
    summing to 1.

    Raises:
        UserError: an empty or malformed mix, a concurrency below 1, a share not above 0, or a concurrency twice.
    """
    out: dict[int, float] = {}
    fix = "give concurrency:share pairs, e.g. --mix 1:1,32:1 (equal time at 1 and 32) or --mix 1,32"
    for part in [p.strip() for p in text.split(",")]:
        m = re.fullmatch(r"(\d+)(?::([0-9]*\.?[0-9]+))?", part)
        if not m:
            raise UserError(f"--mix: cannot read '{part}': {fix}")
        conc, share = int(m.group(1)), float(m.group(2)) if m.group(2) else 1.0
        if conc < 1 or share <= 0:
            raise UserError(f"--mix: '{part}' needs a concurrency of at least 1 and a share above 0: {fix}")
        if conc in out:
            raise UserError(f"--mix: concurrency {conc} is named twice: {fix}")
        out[conc] = share
    total = sum(out.values())
    return {c: s / total for c, s in sorted(out.items())}


def mix_text(mix: Mapping[int, float] | Mapping[str, float]) -> str:
    """``"1: 50%, 32: 50%"`` (keys as given: recommendation.json's ``primary.mix.shares`` has them as text)."""
    return ", ".join(f"{c}: {s:.0%}" for c, s in mix.items())


@dataclass
class Answer(PricedAnswer):
    """One answer priced on a mix (:class:`~spectune.results.primary.PricedAnswer`: ``answer``, ``num_steps``,
    ``output_tok_s`` the mix streams and, after ranking, ``ratio`` to the best with ``low``/``high``, NaN without
    replicates) with its bootstrap ``replicates`` ((B,) or None)."""

    replicates: np.ndarray | None = None

    def priced(self) -> PricedAnswer:
        """The answer as recommendation.json keeps it (without its replicates)."""
        return PricedAnswer(self.answer, self.num_steps, self.output_tok_s, self.ratio, self.low, self.high)


def _price(name: str, steps: int | None, cells: list[Cell | None], mix: dict[int, float]) -> Answer | None:
    """The answer whose cell at each mix concurrency is ``cells[i]``; None when one is missing or not ok."""
    if any(c is None or c.status != "ok" or c.predicted or not math.isfinite(c.objective) for c in cells):
        return None
    shares = list(mix.values())
    value = float(sum(s * c.objective for s, c in zip(shares, cells)))
    reps = None
    if all(c.replicates is not None for c in cells):
        reps = sum(s * np.asarray(c.replicates, float) for s, c in zip(shares, cells))
    return Answer(name, steps, value, replicates=reps)


def mix_answers(rec: RecommendationLike, mix: dict[int, float]) -> list[Answer]:
    """Each static num_steps measured at every mix concurrency (ascending), then the per-batch-size schedule
    (``rec.slots`` as built, priced at :meth:`slot_cell`) unless it is one static num_steps on the static server;
    every answer with ``ratio``/``low``/``high`` against the one streaming the most."""
    concs = list(mix)
    answers = [a for k in rec.steps if (a := _price(f"static K={k}", k, [rec.cell(k, c) for c in concs], mix))]
    slot_of = {c: s.steps for s in rec.slots for c in s.concurrencies}
    if all(c in slot_of for c in concs):
        cells = [rec.slot_cell(slot_of[c], c) for c in concs]
        static = any(all(cell is rec.cell(k, c) for cell, c in zip(cells, concs)) for k in rec.steps)
        sched = None if static else _price("schedule", None, cells, mix)  # one static K on its own server: no new answer
        if sched is not None:
            answers.append(sched)
    if not answers:
        return []
    top = max(answers, key=lambda a: a.output_tok_s)
    for a in answers:
        iv = ratio_interval(a.replicates, top.replicates, a.output_tok_s / top.output_tok_s,
                            rec.options.confidence) if a is not top else Interval(1.0, 1.0, 1.0)
        a.ratio, a.low, a.high = iv.value, iv.low, iv.high
    return answers


def mix_band(rec: RecommendationLike, mix: dict[int, float]) -> float:
    """The noise band of the mix's comparisons: the largest band of the choices at its concurrencies (each the
    larger of ``noise_band``, the best cell's spread and the sweep's drift share), at least ``noise_band``."""
    bands = [ch.band for ch in rec.choices if ch.concurrency in mix]
    return max([rec.options.noise_band, *bands])


def _ties_best(a: Answer, band: float) -> bool:
    if a.ratio >= 1 - band:
        return True
    return math.isfinite(a.high) and a.high >= 1 - band


def apply_mix_primary(rec: RecommendationLike, mix: dict[int, float]) -> None:
    """Set ``rec.primary``, ``rec.best_static``, ``rec.static_scores`` and the slots from the answers' prices on
    ``mix`` (module docstring); ``rec.primary.mix`` records the mix, the band and every answer.

    Raises:
        UserError: a mix concurrency the sweep did not measure, or an objective other than throughput.
    """
    if rec.options.objective != "throughput":
        raise UserError("--mix prices answers by the tokens/s a load streams: use it with --objective throughput")
    swept = sorted({c.concurrency for c in rec.cells if c.status == "ok" and not c.predicted})
    lost = [c for c in mix if c not in swept]
    if lost:
        raise UserError(f"--mix: concurrency {', '.join(map(str, lost))} was not measured by the sweep (measured: "
                        f"{', '.join(map(str, swept))}): sweep it, or name measured concurrencies")
    answers = mix_answers(rec, mix)
    statics = [a for a in answers if a.num_steps is not None]
    if not statics:
        raise UserError("--mix: no num_steps was measured ok at every concurrency of the mix; sweep them all there")
    band = mix_band(rec, mix)
    pick = next(a for a in answers if _ties_best(a, band))
    top = max(answers, key=lambda a: a.output_tok_s)
    best_static = max(statics, key=lambda a: a.output_tok_s)
    best_tok_s = best_static.output_tok_s
    rec.best_static = next(a for a in statics if a.output_tok_s >= best_tok_s * (1 - band)).num_steps \
        if pick.num_steps is None else pick.num_steps
    rec.static_scores = {int(a.num_steps): a.output_tok_s / best_tok_s for a in statics}  # type: ignore[arg-type]
    vs = "" if pick is top else (f": {pick.ratio:.3f}x" + (f" [{pick.low:.3f}, {pick.high:.3f}]"
                                                          if math.isfinite(pick.low) else ""))
    why = (f"on the load {mix_text(mix)} (time shares), {pick.answer} ({pick.output_tok_s:.4g} tok/s) is the simplest "
           "answer " + ("and streams the most" if pick is top else
                        f"the best ({top.answer}, {top.output_tok_s:.4g} tok/s) does not beat beyond the noise band "
                        f"({band:.1%}){vs}"))
    record = MixPricing({str(c): s for c, s in mix.items()}, band, rec.options.confidence,
                        [a.priced() for a in answers])
    rec.schedule_slots = list(rec.slots)
    if pick.num_steps is None:
        rec.primary = Primary("schedule", None, why, record)
        return
    use_static(rec, pick.num_steps, why)
    rec.primary = dataclasses.replace(rec.primary, mix=record)  # type: ignore[arg-type]
