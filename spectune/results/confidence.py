"""Confidence intervals of a cell's objective and paired ratio comparisons between cells, by the bootstrap.

Method (docs/recommend.md, "How sure"): the nonparametric bootstrap (Efron & Tibshirani, *An Introduction to the
Bootstrap*, Chapman & Hall 1993, ch. 6 and 13: percentile intervals), two-level where a cell has repeats:

1. **Within a run, over requests.** The measured requests of one point are resampled by prompt: each bootstrap
   replicate draws the prompts of the sweep with replacement (counts ``M[b, prompt]``, multinomial) and gives every
   request of a drawn prompt that weight (a cluster bootstrap; Davison & Hinkley 1997, sec. 3.8). The objective is
   re-evaluated on the weighted requests: output throughput as the measured throughput times the ratio of
   weighted output tokens to weighted request latency (a ratio estimator: in a closed loop throughput =
   concurrency x tokens per request / latency per request), TPOT p50 as the weighted median of per-request TPOT,
   goodput as the measured goodput times the weighted share of requests meeting the SLOs.
2. **Over repeats.** With R >= 2 repeats, each replicate also draws R repeats with replacement and takes the median
   of their replicate values (the cell's point estimate is the median over repeats, as ``spectune recommend``).
   Without request records (a bare summary.csv) only this level is used; with one repeat and no requests a cell
   has no interval.

**Paired comparisons.** Every cell of one analysis is resampled with the *same* prompt draws ``M`` (the sweep sends
the same prompts to every point), so the ratio of two cells' replicates is a paired bootstrap of their ratio
(Efron & Tibshirani 1993, sec. 13.3 for percentile intervals of any function of the replicates); prompt-to-prompt
variation (output length, difficulty) cancels in the ratio instead of widening it.

**On the prompts both cells measured** (:meth:`Bootstrap.matched_ratio`). Two windows need not cover the same
prompts: a window capped by ``--duration`` ends after fewer requests at a slower num_steps, and an early-stopped
window (:mod:`spectune.sweep.sequential`) covers only the first prompts of the list. The ratio of the two cells'
whole-window figures then compares different prompt sets, and prompts differ in cost (the prompt's length, the
output's). So a comparison restricts both cells to the prompts every run of both measured: each run's figure is
rescaled by its own ratio estimator on those prompts (output tokens over request latency for throughput, the
median TPOT, the share meeting the SLOs) and the paired bootstrap runs on the restricted requests. On the bundled
engine at concurrency 1 (``python benchmarks/guided_vs_grid.py --backend local``, the command in docs/sweep.md): an
early-stopped window of num_steps 0 over 13 prompts read 97.4 tokens/s and the full window of
num_steps 1 over 26 prompts 101.3 (0.961 [0.888, 1.053], a tie); on the 13 prompts both measured num_steps 1 took
1.20x less time, as every grid of that command measures (1.14-1.26x).

What the interval does not cover: the machine changing between points (drift, checked separately by re-measuring
a reference cell, :mod:`spectune.sweep.drift`) and dependence between requests of one batch (requests are treated
as exchangeable within a run).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence, TypedDict, TypeVar

import numpy as np
import pandas as pd

from spectune.results.schema import PointKey

if TYPE_CHECKING:
    from spectune.results.point import MetricValue, RequestLine

__all__ = ["DEFAULT_REPLICATES", "Interval", "RunRequests", "Bootstrap", "CellRuns", "best_by_pairs",
           "percentile_interval", "ratio_interval", "restricted_value"]

DEFAULT_REPLICATES = 2000
DEFAULT_SEED = 20250316

_T = TypeVar("_T")


class IntervalJson(TypedDict):
    """:meth:`Interval.to_json`: the point estimate and its bounds (None when unknown) at ``confidence``."""

    value: float | None
    low: float | None
    high: float | None
    confidence: float


@dataclass(frozen=True)
class Interval:
    """A point estimate with its two-sided percentile interval at ``confidence`` (0..1); bounds NaN when unknown."""

    value: float
    low: float = math.nan
    high: float = math.nan
    confidence: float = 0.95

    @property
    def known(self) -> bool:
        """True when both bounds are finite."""
        return math.isfinite(self.low) and math.isfinite(self.high)

    def holds(self, x: float) -> bool:
        """``low <= x <= high`` (False when unknown)."""
        return self.known and self.low <= x <= self.high

    def text(self, spec: str = ".3g", unit: str = "") -> str:
        """``"1.31x [1.24, 1.38]"``-style text: value, then the bounds when known."""
        v = format(self.value, spec) + unit
        return v + (f" [{format(self.low, spec)}, {format(self.high, spec)}]" if self.known else "")

    def to_json(self) -> IntervalJson:
        """``{"value", "low", "high", "confidence"}`` with None for unknown numbers."""
        def clean(x: float) -> float | None:
            return x if math.isfinite(x) else None
        return {"value": clean(self.value), "low": clean(self.low), "high": clean(self.high),
                "confidence": self.confidence}


def percentile_interval(replicates: np.ndarray | None, value: float, confidence: float = 0.95) -> Interval:
    """The percentile interval (Efron & Tibshirani 1993, eq. 13.5) of ``replicates`` (shape (B,)) around the point
    estimate ``value``: the (1-confidence)/2 and (1+confidence)/2 quantiles of the finite replicates. Unknown bounds
    when there are none (or fewer than 20 finite ones)."""
    if replicates is None:
        return Interval(value, confidence=confidence)
    finite = replicates[np.isfinite(replicates)]
    if len(finite) < 20:
        return Interval(value, confidence=confidence)
    lo, hi = np.quantile(finite, [(1 - confidence) / 2, (1 + confidence) / 2])
    return Interval(value, float(lo), float(hi), confidence)


def ratio_interval(a: np.ndarray | None, b: np.ndarray | None, value: float, confidence: float = 0.95) -> Interval:
    """The paired percentile interval of the ratio a / b from two cells' replicates (shape (B,), drawn with the
    same prompt draws by one :class:`Bootstrap`); ``value`` is the ratio of the point estimates."""
    if a is None or b is None:
        return Interval(value, confidence=confidence)
    with np.errstate(divide="ignore", invalid="ignore"):
        return percentile_interval(a / b, value, confidence)


@dataclass
class RunRequests:
    """The measured requests of one run (one sweep point, or one validate run), for :class:`Bootstrap`.

    Attributes:
        prompt: (n,) prompt labels (any hashable; the resampling unit).
        tokens: (n,) output tokens of each successful request (0 for failed ones).
        latency_ms: (n,) end-to-end latency, ms (NaN for failed ones).
        tpot_ms: (n,) TPOT, ms (NaN where none: failed, or one output token).
        meets: (n,) bool: the request met the SLOs (all False without SLOs).
    """

    prompt: list[Hashable]
    tokens: np.ndarray
    latency_ms: np.ndarray
    tpot_ms: np.ndarray
    meets: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))

    @classmethod
    def from_records(cls, records: Iterable[RequestLine], slo_ttft_ms: float | None = None,
                     slo_tpot_ms: float | None = None) -> "RunRequests":
        """From requests.jsonl objects (``prompt_id``, ``error``, ``completion_tokens``, ``e2e_ms``, ``tpot_ms``,
        ``ttft_ms``); a request meets the SLOs as :func:`spectune.results.reader.summary_with_slos` counts it."""
        prompt, tok, lat, tpot, meets = [], [], [], [], []
        for r in records:
            ok = r.get("error") is None and bool(r.get("chunk_times", True)) and (r.get("completion_tokens") or 0) > 0
            prompt.append(r.get("prompt_id", len(prompt)))
            tok.append(float(r.get("completion_tokens") or 0) if ok else 0.0)
            lat.append(_num(r.get("e2e_ms")) if ok else math.nan)
            tp = _num(r.get("tpot_ms")) if ok else math.nan
            tpot.append(tp)
            ttft = _num(r.get("ttft_ms"))
            m = ok and (slo_ttft_ms is not None or slo_tpot_ms is not None)
            if m and slo_ttft_ms is not None:
                m = math.isfinite(ttft) and ttft <= slo_ttft_ms
            if m and slo_tpot_ms is not None:
                m = not math.isfinite(tp) or tp <= slo_tpot_ms
            meets.append(bool(m))
        return cls(prompt, np.array(tok, float), np.array(lat, float), np.array(tpot, float), np.array(meets, bool))

    def __len__(self) -> int:
        return len(self.prompt)


def _num(x: float | None) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per row of ``weights`` (B, n): the weighted median of ``values`` (n,) (lower median); NaN for an all-zero
    row."""
    order = np.argsort(values)
    v, w = values[order], weights[:, order]
    cum = np.cumsum(w, axis=1)
    total = cum[:, -1:]
    idx = np.argmax(cum >= total / 2.0, axis=1)
    out = v[idx].astype(float)
    out[total[:, 0] <= 0] = math.nan
    return out


class Bootstrap:
    """Paired bootstrap replicates of the objective of many cells (module docstring).

    Args:
        prompts: every prompt label any run uses (the resampling population; labels not listed get weight 1).
        replicates: B, the number of bootstrap replicates (2000 by default: percentile endpoints of a 95% interval
            settle to about 1% of the interval's width; Efron & Tibshirani 1993, sec. 19.3).
        seed: the generator's seed (results are reproducible byte for byte).
    """

    def __init__(self, prompts: Iterable[Hashable], replicates: int = DEFAULT_REPLICATES,
                 seed: int = DEFAULT_SEED) -> None:
        self.labels = {p: i for i, p in enumerate(sorted(set(prompts), key=str))}
        self.B = replicates
        self.rng = np.random.default_rng(seed)
        n = max(len(self.labels), 1)
        self.counts = self.rng.multinomial(n, np.full(n, 1.0 / n), size=self.B).astype(float)  # (B, P)

    def _weights(self, run: RunRequests) -> np.ndarray:
        idx = np.array([self.labels.get(p, -1) for p in run.prompt], int)
        w = np.ones((self.B, len(run)), float)
        known = idx >= 0
        w[:, known] = self.counts[:, idx[known]]
        return w

    def run_replicates(self, run: RunRequests, objective: str, value: float) -> np.ndarray | None:
        """(B,) replicates of one run's objective (``throughput``: tokens/s of a closed loop, ``tokens``: tokens/s
        of an open-loop window, ``tpot``: ms, ``goodput``: req/s) around its measured ``value``; None when the run has no usable requests or ``value`` is not finite.

        Raises:
            ValueError: an unknown objective.
        """
        if not math.isfinite(value) or len(run) == 0:
            return None
        w = self._weights(run)
        if objective == "throughput":
            ok = np.isfinite(run.latency_ms) & (run.tokens > 0)
            if not ok.any():
                return None
            tok, lat = run.tokens[ok], run.latency_ms[ok]
            base = tok.sum() / lat.sum()
            with np.errstate(divide="ignore", invalid="ignore"):
                return value * ((w[:, ok] @ tok) / (w[:, ok] @ lat)) / base
        if objective == "tokens":  # open loop: tokens streamed over a fixed window
            if run.tokens.sum() <= 0:
                return None
            with np.errstate(divide="ignore", invalid="ignore"):
                return value * (w @ run.tokens) / run.tokens.sum()
        if objective == "tpot":
            ok = np.isfinite(run.tpot_ms)
            if not ok.any():
                return None
            return _weighted_median(run.tpot_ms[ok], w[:, ok])
        if objective == "goodput":
            n_meet = run.meets.sum()
            if n_meet == 0:
                return np.full(self.B, value)
            with np.errstate(divide="ignore", invalid="ignore"):
                return value * (w @ run.meets.astype(float)) / n_meet * (len(run) / w.sum(axis=1))
        raise ValueError(f"unknown objective {objective!r}")

    def cell_replicates(self, runs: Sequence[RunRequests | None], values: Sequence[float], objective: str,
                        seed_offset: int = 0) -> np.ndarray | None:
        """(B,) replicates of a cell's objective: the median over resampled repeats of the repeats' replicates
        (``runs[i]`` the requests of repeat i or None, ``values[i]`` its measured objective). A repeat without
        requests contributes its value unchanged; one repeat and no requests -> None.

        ``seed_offset`` seeds the repeat draws (give each cell its own, so cells' repeat draws are independent)."""
        vals = [float(v) for v in values]
        if not vals:
            return None
        reps = []
        for run, v in zip(runs, vals):
            r = self.run_replicates(run, objective, v) if run is not None else None
            reps.append(r if r is not None else np.full(self.B, v))
        known = any(run is not None and len(run) > 0 for run in runs)
        if len(vals) == 1:
            return reps[0] if known else None
        mat = np.stack(reps, axis=1)  # (B, R)
        rng = np.random.default_rng(DEFAULT_SEED + 7919 * (seed_offset + 1))
        pick = rng.integers(0, len(vals), size=(self.B, len(vals)))
        return np.median(np.take_along_axis(mat, pick, axis=1), axis=1)

    def matched_ratio(self, a: "CellRuns", b: "CellRuns", objective: str,
                      confidence: float = 0.95) -> tuple[Interval, int] | None:
        """The paired ratio a / b of two cells' objectives on the prompts every run of both measured (module
        docstring, "On the prompts both cells measured"), with its percentile interval, and the number of those
        prompts; None where the restriction does not apply: a run without requests, an objective other than
        ``throughput``, ``tpot`` or ``goodput``, or fewer than two usable requests of a run on the shared prompts
        (the caller then compares the whole windows).

        Each run's figure is rescaled by :func:`restricted_value`; the cells' replicates are
        :meth:`cell_replicates` of the restricted runs with the cells' own ``seed_offset``."""
        if objective not in ("throughput", "tpot", "goodput"):
            return None
        runs = list(a.runs) + list(b.runs)
        if not runs or any(r is None or len(r) == 0 for r in runs):
            return None
        shared = set.intersection(*(set(r.prompt) for r in runs))
        if not shared:
            return None
        cut = []
        for cell in (a, b):
            got = [restricted_value(run, shared, objective, v) for run, v in zip(cell.runs, cell.values)]
            if any(g is None for g in got):
                return None
            sub = [g[0] for g in got]
            vals = [g[1] for g in got]
            reps = self.cell_replicates(sub, vals, objective, seed_offset=cell.seed_offset)
            cut.append((float(np.median(vals)), reps))
        (va, ra), (vb, rb) = cut
        value = va / vb if vb else math.nan
        return ratio_interval(ra, rb, value, confidence), len(shared)


def best_by_pairs(items: Sequence[_T], value: Callable[[_T], float], ratio: Callable[[_T, _T], float],
                  maximise: bool = True) -> _T:
    """The best of ``items`` (non-empty) when pairs are compared on the prompts both measured (module docstring):
    start from the best ``value`` (the whole windows' figure); while another item beats the current one on their
    ``ratio(other, current)`` (> 1 when ``maximise``, < 1 otherwise), move to the one that beats it by most. Ratios
    on different shared prompts need not be transitive, so the walk stops where it would visit an item twice."""
    pick = max if maximise else min
    best = pick(items, key=value)
    seen = {id(best)}
    while True:
        r = {id(x): ratio(x, best) for x in items if x is not best}
        better = [x for x in items if x is not best and math.isfinite(r[id(x)])
                  and (r[id(x)] > 1 if maximise else r[id(x)] < 1)]
        if not better:
            return best
        nxt = pick(better, key=lambda x: r[id(x)])
        if id(nxt) in seen:
            return best
        best = nxt
        seen.add(id(best))


@dataclass(frozen=True)
class CellRuns:
    """One cell's runs for :meth:`Bootstrap.matched_ratio`: ``runs[i]`` the requests of repeat i (or None),
    ``values[i]`` its measured objective (tokens/s, ms or req/s), ``seed_offset`` the cell's repeat-draw seed (as
    given to :meth:`Bootstrap.cell_replicates`)."""

    runs: Sequence[RunRequests | None]
    values: Sequence[float]
    seed_offset: int = 0


def restricted_value(run: RunRequests, prompts: set[Hashable], objective: str,
                     value: float) -> tuple[RunRequests, float] | None:
    """The run's requests of ``prompts`` and its measured ``value`` rescaled to them: throughput (tokens/s) by the
    ratio estimator (output tokens over request latency on the prompts, over the same on the whole run; a closed
    loop's throughput is concurrency x tokens per request / latency per request), TPOT p50 (ms) by the ratio of the
    medians, goodput (req/s) by the ratio of the shares meeting the SLOs. None when fewer than two usable requests
    are left (or the whole run has none)."""
    keep = np.array([p in prompts for p in run.prompt], bool)
    if not len(keep):
        return None
    sub = RunRequests([p for p, k in zip(run.prompt, keep) if k], run.tokens[keep], run.latency_ms[keep],
                      run.tpot_ms[keep], run.meets[keep] if len(run.meets) == len(run) else run.meets)
    if objective == "throughput":
        ok_all = np.isfinite(run.latency_ms) & (run.tokens > 0)
        ok = ok_all & keep
        if ok.sum() < 2:
            return None
        whole = run.tokens[ok_all].sum() / run.latency_ms[ok_all].sum()
        part = run.tokens[ok].sum() / run.latency_ms[ok].sum()
        return sub, value * part / whole
    if objective == "tpot":
        ok_all = np.isfinite(run.tpot_ms)
        ok = ok_all & keep
        if ok.sum() < 2:
            return None
        whole = float(np.median(run.tpot_ms[ok_all]))
        return (sub, value * float(np.median(run.tpot_ms[ok])) / whole) if whole > 0 else None
    if objective == "goodput":
        if keep.sum() < 2 or len(run.meets) != len(run):
            return None
        whole = run.meets.mean()
        return sub, (value * run.meets[keep].mean() / whole) if whole > 0 else value
    return None


def requests_by_point(requests: pd.DataFrame | Sequence[RequestLine] | None) -> dict[PointKey, list[RequestLine]]:
    """Group requests.jsonl objects by (steps, concurrency, repeat); drift re-measurements (``drift_check`` set) are
    left out."""
    out: dict[PointKey, list[RequestLine]] = {}
    if requests is None:
        return out
    rows = requests.to_dict("records") if isinstance(requests, pd.DataFrame) else requests
    for r in rows:
        if r.get("drift_check") is not None:
            continue
        try:
            key = PointKey(int(r["steps"]), int(r["concurrency"]), int(r.get("repeat", 0) or 0))
        except (KeyError, TypeError, ValueError):
            continue
        out.setdefault(key, []).append(r)
    return out


def prompt_ids(groups: Iterable[Iterable[RequestLine]]) -> set[object]:
    """The ``prompt_id`` of every requests.jsonl object in ``groups`` (None for a line without one): the prompts a
    :class:`Bootstrap` pairs cells by."""
    return {r.get("prompt_id") for rs in groups for r in rs}


def point_intervals(records: Iterable[RequestLine], metrics: Mapping[str, MetricValue], confidence: float = 0.95,
                    replicates: int = 1000) -> dict[str, float | None]:
    """summary.csv's interval columns of one measured point (:data:`spectune.results.schema.INTERVAL_COLUMNS`): the
    percentile-bootstrap bounds of its ``output_throughput_tok_s`` (tokens/s) and ``tpot_p50_ms`` (ms) over its
    request objects (requests.jsonl form); None where the metric or the requests are missing."""
    recs = list(records)
    run = RunRequests.from_records(recs)
    boot = Bootstrap((r.get("prompt_id") for r in recs), replicates=replicates)
    out: dict[str, float | None] = {}
    for objective, metric, prefix in (("throughput", "output_throughput_tok_s", "output_throughput"),
                                      ("tpot", "tpot_p50_ms", "tpot_p50")):
        value = metrics.get(metric)
        iv = Interval(math.nan)
        if isinstance(value, (int, float)) and math.isfinite(value):
            iv = percentile_interval(boot.run_replicates(run, objective, float(value)), float(value), confidence)
        out[f"{prefix}_ci_low"] = iv.low if iv.known else None
        out[f"{prefix}_ci_high"] = iv.high if iv.known else None
    return out
