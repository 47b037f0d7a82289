"""Comparing two cells of a sweep at one concurrency (``spectune recommend``, docs/recommend.md section 3): the
objectives, the paired ratio of two cells' objectives with its bootstrap interval on the prompts both measured, the
verdict against the noise band, and the tie rule, on :class:`spectune.results.cell.Cell` records."""

from __future__ import annotations

import math
from typing import Callable, TypedDict

from spectune.results.cell import Cell
from spectune.results.confidence import Interval, ratio_interval
from spectune.tune.options import RecommendOptions

#: objective name -> (summary column, direction, unit)
OBJECTIVES = {"throughput": ("output_throughput_tok_s", "max", "tokens/s"),
              "tpot": ("tpot_p50_ms", "min", "ms"),
              "goodput": ("goodput_req_s", "max", "req/s")}


class Comparison(TypedDict):
    """:func:`compare`'s result (recommendation.json ``choices[].comparisons``): num_steps ``a`` against ``b`` at
    ``concurrency``, the objective ``ratio`` a / b with its ``confidence`` interval ``low``/``high`` (NaN without
    replicates), the ``verdict`` (``beats``, ``loses``, ``ties``), the shared ``prompts`` it rests on (None: whole
    windows) and the sentence (``text``)."""

    a: int
    b: int
    concurrency: int
    ratio: float
    low: float
    high: float
    confidence: float
    verdict: str
    prompts: int | None
    text: str


def ratio(a: Cell, b: Cell, objective: str, confidence: float) -> tuple[Interval, int | None]:
    """The ratio a / b of two cells' objectives at one concurrency with its paired bootstrap interval, and the
    number of prompts it rests on: on the prompts every run of both cells measured where both have requests
    (:meth:`spectune.results.confidence.Bootstrap.matched_ratio`), else the whole windows' figures
    (:func:`spectune.results.confidence.ratio_interval`; prompts None). Bounds NaN without replicates."""
    if a.runs is not None and b.runs is not None and a.bootstrap is not None and a.bootstrap is b.bootstrap:
        got = a.bootstrap.matched_ratio(a.runs, b.runs, objective, confidence)
        if got is not None:
            return got
    value = a.objective / b.objective if b.objective else math.nan
    return ratio_interval(a.replicates, b.replicates, value, confidence), None


def compare(a: Cell, b: Cell, opts: RecommendOptions, band: float) -> Comparison:
    """The paired comparison of cell ``a`` with cell ``b`` (same concurrency): ratio of their objectives a / b
    on the prompts both measured, with its paired bootstrap interval (:func:`ratio`), and a verdict:
    ``"beats"`` (the whole interval is better than 1 by more than ``band``), ``"loses"`` (the whole interval is worse
    by more than ``band``) or ``"ties"``; without an interval the point ratio decides against the band. For a
    minimised objective (TPOT) a ratio below 1 is better. Returns ``{"a", "b", "concurrency", "ratio", "low",
    "high", "confidence", "verdict", "prompts", "text"}`` (``prompts``: the shared prompts the ratio rests on, None
    for whole windows)."""
    col, direction, _ = OBJECTIVES[opts.objective]
    iv, prompts = ratio(a, b, opts.objective, opts.confidence)
    value = iv.value
    lo, hi = (iv.low, iv.high) if iv.known else (value, value)
    if direction == "max":
        verdict = "beats" if lo > 1 + band else "loses" if hi < 1 - band else "ties"
    else:
        verdict = "beats" if hi < 1 - band else "loses" if lo > 1 + band else "ties"
    text = (f"num_steps {a.steps} {verdict} {b.steps} at concurrency {a.concurrency}: {opts.objective} "
            f"{iv.text('.3f')}x" + (f", {opts.confidence:.0%}" if iv.known else " (no interval)")
            + (f", on the {prompts} prompts both measured" if prompts is not None else ""))
    return {"a": a.steps, "b": b.steps, "concurrency": a.concurrency, "ratio": value, "low": iv.low,
            "high": iv.high, "confidence": opts.confidence, "verdict": verdict, "prompts": prompts, "text": text}


def clear_wins(noisy: list[Cell], best: Cell, opts: RecommendOptions,
               drift_band: Callable[[Cell], float]) -> list[Cell]:
    """The ``noisy`` cells (spread above ``max_spread``) that beat ``best``, the best quiet cell at their concurrency,
    beyond their own noise: :func:`compare` says ``beats`` at a band of the larger of ``noise_band``, the cell's spread
    and ``drift_band(cell)``. Noise of that size cannot have made the win, so setting such a cell aside would throw a
    measured result away (a guided sweep on a loaded 2-core CI machine chose K=0 at concurrency 8 over a noisy K=1
    measured 1.346x [1.301, 1.388] faster)."""
    return [c for c in noisy
            if compare(c, best, opts, max(opts.noise_band, c.spread, drift_band(c)))["verdict"] == "beats"]


def _ties(c: Cell, best: Cell, band: float, direction: str, opts: RecommendOptions) -> bool:
    """``c`` ties with ``best``: its ratio to the best (:func:`ratio`, on the prompts both measured) is within
    ``band`` of 1, or (with replicates) the paired interval of that ratio reaches within the band of 1."""
    if c is best:
        return True
    iv, _ = ratio(c, best, opts.objective, opts.confidence)
    if _within(iv.value, 1.0, band, direction):
        return True
    if not iv.known:
        return False
    return iv.high >= 1 - band if direction == "max" else iv.low <= 1 + band


def _better(a: float, b: float, direction: str) -> bool:
    return a > b if direction == "max" else a < b


def _within(value: float, best: float, band: float, direction: str) -> bool:
    return value >= best * (1 - band) if direction == "max" else value <= best * (1 + band)
