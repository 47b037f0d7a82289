"""Runs over repeats and the paired ratios validate rules on.

- :func:`combine_repeats`: one entry per run name from its repeats (means).
- :func:`paired_ratio` (any window) and :func:`throughput_ratio` (the whole run): the interval of one run's output
  tokens/s over another's, from two independent parts:

  1. **within runs**: the paired percentile bootstrap over requests (:class:`spectune.results.confidence.Bootstrap`:
     requests resampled by prompt, the same draws for both runs); with repeats, each replicate is the mean of the
     repeats' replicates, as the point estimate is the mean of the repeats (:func:`combine_repeats`);
  2. **between servers** (:class:`InstanceSpread`, :func:`instance_spread`): a server process's own speed is a
     constant of that process (two engines with their own copies of the weights ran 2.4-3.8% apart at batch 1,
     docs/engine.md), so a ratio of two runs carries the difference of two draws of it, which
     no resampling of one run's requests sees. With repeats (every repeat starts its servers afresh) it is the
     pooled spread of each run's repeats; with one repeat, the A/A pair (a second fresh server of one static
     num_steps, run ``aa:K``) bounds it; failing both, :data:`DEFAULT_INSTANCE_BAND`.

Why not a bootstrap over repeats (a hierarchical bootstrap): with 2-3 repeats it cannot reach beyond the repeats'
own range (the percentile interval of the mean of two resampled repeats is their [min, max]), so it understates the
spread a rerun meets; a Student t term with the pooled degrees of freedom carries the uncertainty of a spread
estimated from few servers.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence, TypedDict

from spectune.core.json_types import JsonObject, JsonValue
from spectune.results.validate_run import RunWindow, ValidateRun

if TYPE_CHECKING:
    import numpy as np

    from spectune.results.confidence import RunRequests

AA_PREFIX = "aa:"
"""Run name prefix of the A/A run: ``aa:K`` is static num_steps K on a second fresh server, measured beside
``static:K`` when every run is measured once (:meth:`spectune.validate.plan.ValidatePlan.run_order`)."""

DEFAULT_INSTANCE_BAND = 0.04
"""The server-to-server band (fraction) a ratio is widened by when this validation measured no spread (one repeat
and no A/A pair: a validation from before the A/A pair, or its A/A run failed): two engines with their own weights
ran 2.4% (num_steps 1) and 3.8% (num_steps 0) apart at batch 1 (docs/engine.md), rounded up."""

_SPREAD_SEED = 20250317  # the Student t draws of the between-server term (reproducible byte for byte)

WindowValue = Callable[[ValidateRun], float | None]
"""A repeat's output tokens/s in one window, from its validate.json ``runs`` entry (None: not measured)."""

WindowRequests = Callable[[ValidateRun, list[JsonObject]], "RunRequests | None"]
"""The requests that made a repeat's :data:`WindowValue`, from its ``runs`` entry and its requests.jsonl objects,
as the bootstrap resamples them (None: none)."""


@dataclass(frozen=True)
class AAPair:
    """:attr:`InstanceSpread.aa`: the A/A pair ``aa:K`` / ``static:K``: K (``steps``), the ``ratio`` of their
    tokens/s and its within-run interval (``low``, ``high``; None without requests)."""

    steps: int | None = None
    ratio: float = math.nan
    low: float | None = None
    high: float | None = None

    def to_json(self) -> AAPairJson:
        """The pair as validate.json keeps it (``steps``, ``ratio``, ``low``, ``high``)."""
        return {"steps": self.steps, "ratio": self.ratio, "low": self.low, "high": self.high}

    @property
    def interval(self) -> str:
        """`` [low, high]`` of the ratio, or "" without one."""
        return f" [{self.low:.3f}, {self.high:.3f}]" if self.low is not None else ""


class AAPairJson(TypedDict):
    """:meth:`AAPair.to_json`."""

    steps: int | None
    ratio: float
    low: float | None
    high: float | None


class InstanceSpreadJson(TypedDict):
    """:meth:`InstanceSpread.to_json`: validate.json's ``instance_spread`` (and each phase's ``spread``)."""

    kind: str
    repeats: int
    sd: float
    df: int
    band: float
    aa: AAPairJson | None
    blocked: bool
    kept: bool


def t_quantile(confidence: float, df: int) -> float:
    """The two-sided ``confidence`` quantile of Student's t with ``df`` degrees of freedom (12.71 for 0.95 and
    df = 1, 2.45 for df = 6): ``scipy.stats.t.ppf((1 + confidence) / 2, df)``.

    Raises:
        ValueError: ``df`` < 1 or ``confidence`` outside (0, 1).
    """
    from scipy.stats import t

    if df < 1 or not 0.0 < confidence < 1.0:
        raise ValueError(f"t_quantile needs df >= 1 and 0 < confidence < 1, got df={df}, confidence={confidence}")
    return float(t.ppf((1.0 + confidence) / 2.0, df))


@dataclass(frozen=True)
class InstanceSpread:
    """How much two fresh servers that run the same thing differ in one window's output tokens/s, as a paired ratio
    of two runs carries it (module docstring).

    Attributes:
        kind: ``repeats`` (measured from the repeats), ``aa`` (the A/A pair), ``default``
            (:data:`DEFAULT_INSTANCE_BAND`, measured nowhere here) or ``none`` (left out: within-run intervals only).
        repeats: the repeats of the validation (most of any run).
        sd: ``repeats``: the standard deviation of log tokens/s of one server, y = ln(tokens/s). With two or more
            runs measured in the same two or more repeats (``blocked``) it is the residual of a two-way layout, runs x
            repeats: s^2 = sum (y[m, r] - mean of run m - mean of repeat r + grand mean)^2 / df (the residual mean
            square of a randomized complete block design; Montgomery, *Design and Analysis of Experiments*, ch. 4),
            so a drift of the machine's speed that moves every run of a repeat alike is taken out, as it is from the
            ratio of two runs' means over the same repeats; drift within a repeat stays in it. Otherwise the pooled
            spread of each run's repeats around the run's mean (the within-group mean square of a one-way layout,
            ch. 3), where such drift lands too, which makes it wider, never narrower. Measured
            (docs/validate.md): a validation whose repeats ran 55 and 85 tok/s alike had a one-way sd of 20.6%
            and a two-way one of 8.9%.
        df: its degrees of freedom: (runs - 1) x (repeats - 1) blocked, else sum over runs of (repeats - 1).
        blocked: the sd is the two-way residual (above).
        band: ``aa`` / ``default``: the fraction by which a ratio's within-run interval is widened on both sides.
            ``aa``: the far end of the A/A pair's own within-run interval from 1 (the largest difference between
            two fresh servers of one num_steps that the pair allows), at least its point's distance from 1.
        aa: ``aa``: ``{"steps", "ratio", "low", "high"}``: the A/A pair ``aa:K`` / ``static:K``.
        kept: the servers were kept up through all repeats (``--servers kept``): ``sd`` is then the run-to-run
            spread of the same server processes; how far two processes of one server differ is not in it.
    """

    kind: str
    repeats: int = 1
    sd: float = 0.0
    df: int = 0
    band: float = 0.0
    aa: AAPair | None = None
    blocked: bool = False
    kept: bool = False

    def half_width(self, ra: int, rb: int, confidence: float = 0.95) -> float:
        """The half-width (natural log of the ratio) this spread alone gives the ratio of a run measured over
        ``ra`` repeats to one over ``rb``: t(confidence, df) x sd x sqrt(1/ra + 1/rb) (``repeats``),
        ln(1 + band) (``aa``, ``default``), 0 (``none``)."""
        if self.kind == "repeats":
            return t_quantile(confidence, self.df) * self.sd * math.sqrt(1.0 / max(ra, 1) + 1.0 / max(rb, 1))
        if self.kind in ("aa", "default"):
            return math.log1p(self.band)
        return 0.0

    def interval(self, log_ratio: "np.ndarray", ra: int, rb: int,
                 confidence: float = 0.95) -> tuple[float, float] | None:
        """The interval of a ratio from its (B,) within-run bootstrap replicates of ln(ratio) and this spread.

        ``repeats``: the percentile interval of ln(ratio) replicate + sd x sqrt(1/ra + 1/rb) x T, T drawn from
        Student's t with ``df`` (the two parts are independent: a convolution). ``aa``/``default``: the within-run
        percentile interval widened by the band on both sides (a band bounds the spread; it is no variance).
        None when fewer than 20 replicates are finite."""
        import numpy as np

        from spectune.results.confidence import percentile_interval

        x = np.asarray(log_ratio, float)
        if self.kind == "repeats" and self.sd > 0:
            rng = np.random.default_rng(_SPREAD_SEED)
            x = x + self.sd * math.sqrt(1.0 / max(ra, 1) + 1.0 / max(rb, 1)) * rng.standard_t(self.df, size=x.shape)
        iv = percentile_interval(x, 0.0, confidence)
        if not iv.known:
            return None
        w = 0.0 if self.kind == "repeats" else self.half_width(ra, rb, confidence)
        return math.exp(iv.low - w), math.exp(iv.high + w)

    def source(self, within: bool = True) -> str:
        """Where a ratio's interval comes from, for the verdict line (``within``: the runs had requests, so the
        within-run bootstrap is part of it)."""
        if self.kind == "repeats":
            servers = ("servers kept up, so how far two processes of one server differ is not in it; run-to-run "
                       if self.kept else "fresh servers; server-to-server ")
            return (f"interval over {self.repeats} repeats ({servers}spread {self.sd:.1%}, "
                    f"{self.df} df" + (", each repeat's common drift taken out" if self.blocked else "")
                    + ("" if within else "; no requests, so no within-run part") + ")")
        if self.kind == "aa":
            a = self.aa or AAPair()
            band = (f"the A/A instance band {self.band:.1%} (static K={a.steps} on two fresh servers: "
                    f"{a.ratio:.3f}x{a.interval})")
            return f"within-run bootstrap widened by {band}" if within else f"{band} alone (no requests)"
        if self.kind == "default":
            band = (f"the default instance band {self.band:.1%} (no repeats or A/A pair measured the "
                    "server-to-server spread here)")
            return f"within-run bootstrap widened by {band}" if within else f"{band} alone (no requests)"
        return "within-run bootstrap" if within else "no interval"

    def short(self) -> str:
        """A table cell: ``sd 2.1%, 6 df``, ``A/A +-3.8%``, ``default +-4.0%`` or ``-``."""
        if self.kind == "repeats":
            return f"sd {self.sd:.1%}, {self.df} df"
        if self.kind == "aa":
            return f"A/A +-{self.band:.1%}"
        if self.kind == "default":
            return f"default +-{self.band:.1%}"
        return "-"

    def to_json(self) -> InstanceSpreadJson:
        """The spread as validate.json keeps it (``kind``, ``repeats``, ``sd``, ``df``, ``band``, ``aa``,
        ``blocked``, ``kept``)."""
        return {"kind": self.kind, "repeats": self.repeats, "sd": self.sd, "df": self.df, "band": self.band,
                "aa": self.aa.to_json() if self.aa is not None else None, "blocked": self.blocked, "kept": self.kept}

    @classmethod
    def from_json(cls, d: JsonValue | InstanceSpreadJson) -> "InstanceSpread | None":
        """The spread from :meth:`to_json` (a key it lacks, or null: the attribute's default); None for None or a
        foreign object (no known ``kind``)."""
        if not isinstance(d, dict) or d.get("kind") not in ("repeats", "aa", "default", "none"):
            return None
        given = {f.name: d[f.name] for f in dataclasses.fields(cls) if d.get(f.name) is not None}
        aa = given.pop("aa", None)
        spread = cls(**given)  # type: ignore[arg-type]
        pair = AAPair(**{f.name: aa[f.name] for f in dataclasses.fields(AAPair) if f.name in aa}) \
            if isinstance(aa, dict) else None
        return dataclasses.replace(spread, repeats=int(spread.repeats), sd=float(spread.sd), df=int(spread.df),
                                   band=float(spread.band), aa=pair, blocked=bool(spread.blocked),
                                   kept=bool(spread.kept))


WITHIN_ONLY = InstanceSpread("none")
"""No server-to-server term: the within-run bootstrap alone (what the A/A band itself is computed with)."""


def instance_spread(runs: Sequence[ValidateRun], requests: Sequence[JsonObject], value: WindowValue,
                    select: WindowRequests, objective: str = "tokens", confidence: float = 0.95) -> InstanceSpread:
    """The server-to-server spread of the window ``value`` reads (:class:`InstanceSpread`), from validate.json
    ``runs`` (one entry per repeat) and requests.jsonl objects:

    1. ``repeats`` when some run has two or more successful repeats with a value: the sd of ln(value), the two-way
       residual over the runs and repeats that form a complete block of at least 2 x 2, else the one-way pooled
       spread (:attr:`InstanceSpread.sd`);
    2. else ``aa`` when the A/A pair (``aa:K`` and ``static:K``, :data:`AA_PREFIX`) both succeeded: the far end of
       the pair's paired within-run interval (``select``, ``objective``: as :func:`paired_ratio`) from 1, at least
       |ratio - 1| (the ratio alone when there are no requests);
    3. else ``default``: :data:`DEFAULT_INSTANCE_BAND`.
    """
    ok = [r for r in runs if r.ok and _positive(value(r))]
    groups: dict[str, list[float]] = {}
    cells: dict[str, dict[int | None, float]] = {}
    for r in ok:
        y = math.log(float(value(r)))  # type: ignore[arg-type]
        groups.setdefault(r.run, []).append(y)
        cells.setdefault(r.run, {})[r.repeat] = y
    repeats = max((len(ys) for ys in groups.values()), default=1)
    blocked = _two_way(cells)
    if blocked is not None:
        return InstanceSpread("repeats", repeats, blocked[0], blocked[1], blocked=True)
    ss = sum(sum((y - sum(ys) / len(ys)) ** 2 for y in ys) for ys in groups.values() if len(ys) >= 2)
    df = sum(len(ys) - 1 for ys in groups.values() if len(ys) >= 2)
    if df > 0:
        return InstanceSpread("repeats", repeats, math.sqrt(ss / df), df)
    aa = next((r for r in ok if r.run.startswith(AA_PREFIX)), None)
    base = next((r for r in ok if aa is not None and r.run == f"static:{aa.steps}"), None)
    if aa is not None and base is not None:
        point = float(value(aa)) / float(value(base))  # type: ignore[arg-type]
        iv = paired_ratio(runs, requests, aa.run, base.run, value, select, confidence, objective,
                          spread=WITHIN_ONLY)
        band = max((abs(point - 1.0), *((iv[1] - 1.0, 1.0 - iv[0]) if iv else ())))
        return InstanceSpread("aa", 1, band=band, aa=AAPair(aa.steps, point, iv[0] if iv else None,
                                                            iv[1] if iv else None))
    return InstanceSpread("default", 1, band=DEFAULT_INSTANCE_BAND)


def _two_way(cells: dict[str, dict[int | None, float]]) -> tuple[float, int] | None:
    """(residual sd, df) of the two-way layout runs x repeats (:attr:`InstanceSpread.sd`) over the repeats every
    run with two or more of them has (``cells``: run -> repeat -> ln value); None when that leaves fewer than two
    runs or two repeats, or no residual spread to estimate (df 0)."""
    names = [n for n, c in cells.items() if len(c) >= 2]
    common = set.intersection(*(set(cells[n]) for n in names)) if names else set()
    blocks = sorted(common, key=str)
    if len(names) < 2 or len(blocks) < 2:
        return None
    y = [[cells[n][b] for b in blocks] for n in names]
    m, k = len(names), len(blocks)
    grand = sum(map(sum, y)) / (m * k)
    rows = [sum(row) / k for row in y]
    cols = [sum(y[i][j] for i in range(m)) / m for j in range(k)]
    ss = sum((y[i][j] - rows[i] - cols[j] + grand) ** 2 for i in range(m) for j in range(k))
    df = (m - 1) * (k - 1)
    return math.sqrt(ss / df), df


def _positive(v: float | None) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _overall(r: ValidateRun) -> float | None:
    return r.throughput


def _all_requests(r: ValidateRun, qs: list[JsonObject]) -> "RunRequests | None":
    from spectune.results.confidence import RunRequests

    return RunRequests.from_records(qs) if qs else None


def overall_spread(runs: Sequence[ValidateRun], requests: Sequence[JsonObject],
                   confidence: float = 0.95) -> InstanceSpread:
    """:func:`instance_spread` of the whole run's output throughput (what :func:`throughput_ratio` adds)."""
    return instance_spread(runs, requests, _overall, _all_requests, "tokens", confidence)


def throughput_ratio(runs: Sequence[ValidateRun], requests: Sequence[JsonObject], a: str, b: str,
                     confidence: float = 0.95, spread: InstanceSpread | None = None) -> tuple[float, float] | None:
    """The interval of overall output throughput run ``a`` / run ``b`` (run names such as ``config`` and
    ``static:2``; ``runs``: validate.json ``runs`` entries, one per repeat; ``requests``: the requests.jsonl objects
    with ``run`` and ``repeat``): :func:`paired_ratio` with tokens over the fixed window (objective ``tokens``) and
    the server-to-server ``spread`` (None: :func:`overall_spread` of these runs). Returns (low, high) of the ratio
    itself, or None (see :func:`paired_ratio`)."""
    return paired_ratio(runs, requests, a, b, _overall, _all_requests, confidence, "tokens",
                        spread=spread if spread is not None else overall_spread(runs, requests, confidence))


def paired_ratio(runs: Sequence[ValidateRun], requests: Sequence[JsonObject], a: str, b: str,
                 value: WindowValue, select: WindowRequests, confidence: float = 0.95, objective: str = "tokens",
                 spread: InstanceSpread | None = None) -> tuple[float, float] | None:
    """The interval of run a / run b's tokens/s in any window (module docstring): ``value(run entry)`` is a
    repeat's tokens/s in the window and ``select(run entry, its requests)`` the requests that made it, as the
    bootstrap resamples them (e.g. only the tokens and time each request spent inside one phase). ``objective``: how
    a resample moves the value (:meth:`spectune.results.confidence.Bootstrap.run_replicates`): ``tokens`` (tokens
    streamed over a fixed window: open loop) or ``throughput`` (tokens over the requests' times: a closed loop,
    where a request with fewer tokens also took less time).

    Within runs: each side's replicate is the mean over its successful repeats of the repeat's bootstrap replicate
    (a repeat without requests contributes its value unchanged). Between servers: ``spread``
    (:meth:`InstanceSpread.interval`; None: :func:`instance_spread` of these runs and this window).

    Returns:
        (low, high) of the ratio a / b; None when either run has no successful repeat with a value, or when
        neither has requests and ``spread`` is :data:`WITHIN_ONLY` (nothing to build an interval from).
    """
    import numpy as np

    from spectune.results.confidence import Bootstrap

    if spread is None:
        spread = instance_spread(runs, requests, value, select, objective, confidence)
    boot = Bootstrap(r.get("prompt_id") for r in requests)
    sides, any_requests = [], False
    for name in (a, b):
        mine = [r for r in runs if r.run == name and r.ok]
        values = [value(r) for r in mine]
        if not mine or any(not _positive(v) for v in values):
            return None
        reps = []
        for r, v in zip(mine, values):
            cell = select(r, [q for q in requests if q.get("run") == name and q.get("repeat") == r.repeat])
            rep = boot.run_replicates(cell, objective, float(v)) if cell is not None and len(cell) else None
            any_requests = any_requests or rep is not None
            reps.append(rep if rep is not None else np.full(boot.B, float(v)))
        sides.append((np.mean(np.stack(reps), axis=0), len(mine)))
    if not any_requests and spread.kind == "none":
        return None
    (ra, na), (rb, nb) = sides
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratio = np.log(ra / rb)
    return spread.interval(log_ratio, na, nb, confidence)


_SUMMED = ("num_requests", "num_failed", "output_tokens")


def _mean_window(windows: Sequence[RunWindow]) -> RunWindow:
    """One window's numbers over repeats: request and token counts summed, other numbers averaged (over the
    repeats that have them), anything else (labels, bounds, sources) from the first."""
    out = copy.deepcopy(windows[0])
    for key, first in windows[0].numbers().items():
        values = [getattr(w, key) for w in windows]
        nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if key in ("phase", "start_s", "end_s") or not nums:
            continue
        setattr(out, key, sum(nums) if key in _SUMMED else sum(nums) / len(nums))
    return out


def combine_repeats(runs: Sequence[ValidateRun]) -> list[ValidateRun]:
    """One entry per run name (``static:K``, ``config``) in first-seen order: the mean of its repeats.

    Overall and per phase: output throughput (tok/s), TPOT/TTFT percentiles (ms), SLO attainment, acceptance
    length, switches and achieved concurrency are means over the repeats; request and token counts are sums. The
    entry gains ``repeats`` and ``throughput_by_repeat`` (overall output tok/s of each repeat, in order) and has no
    ``started`` or ``finished``. A run with a failed repeat is failed (its error names the repeat). A run measured
    once is returned unchanged.
    """
    groups: dict[str, list[ValidateRun]] = {}
    for r in runs:
        groups.setdefault(r.run, []).append(r)
    out: list[ValidateRun] = []
    for rs in groups.values():
        if len(rs) == 1:
            out.append(rs[0])
            continue
        base = dataclasses.replace(rs[0], started="", finished=None, repeats=len(rs),
                                   throughput_by_repeat=[r.throughput for r in rs])
        bad = next((r for r in rs if not r.ok), None)
        if bad is not None:
            out.append(dataclasses.replace(base, status=bad.status, phases=[], overall=RunWindow.empty(),
                                           error=f"repeat {bad.repeat}: {bad.error}"))
            continue
        phases = [_mean_window(list(ps)) for ps in zip(*(r.phases for r in rs))]
        out.append(dataclasses.replace(base, status="ok", overall=_mean_window([r.overall for r in rs]),
                                       phases=phases))
    return out
