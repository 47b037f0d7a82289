"""Step-time models for ``spectune simulate --policy``: a decode round's time (ms) from its shape, so that a
replayed draft-length policy gets a predicted tok/s and TPOT.

A round of batch size b (rows) is described by:

- D, its draft steps: draft positions computed (the engine drafts until every row stopped, so D = the longest row's
  draft length, or one more where a p_min row computed the position that stopped it; a recorded round's D is the
  positions it holds draft probabilities for);
- W, its verify width: the longest row's drafted tokens + 1 (every row is padded to W in the verify forward);
- V, its verified tokens: sum over rows of (drafted_i + 1) (= b * W when every row drafts the same length);
- C, its context tokens: sum over rows of the tokens in the row's KV cache before the round (0 when unknown).

:class:`LinearStepTime` (fitted from a trace's own ``draft_ms`` / ``verify_ms``, :func:`fit_trace_step_time`)::

    draft_ms  = D * (d_step + d_row * b)
    verify_ms = v_fixed + v_padded * b * W + v_ctx * W * C / 1000 + v_row * b + v_tokens * V
    round_ms  = draft_ms + verify_ms

Each part is a non-negative least-squares fit (``scipy.optimize.nnls``) over the rounds that carry both times.
Non-negative coefficients make the round time non-decreasing in D and W, which the replay's oracle bound relies
on (:class:`CellStepTime` gives what the bound needs too: non-decreasing in D, at least the static round of its
verify width, and that static round non-decreasing in W). A term the trace cannot tell apart from the terms
before it (in the order above: no context, one verify width for every round, which makes b * W and b the same
column, every row verifying the same length) is left out and listed in ``dropped``; its cost is then carried by the
kept terms. From a trace that verified one width only, the verify time at other widths is thus extrapolated as
growing with the padded tokens b * W: a sweep's cells (:class:`CellStepTime`) measure it instead.

:class:`CellStepTime` (a sweep's measured cells, :func:`cells_step_time`): per swept num_steps K the mean decode
round ``engine_round_ms`` (summary.csv, :mod:`spectune.measure.engine_time`; the median over repeats) against the
rows its rounds ran, ``engine_round_rows`` (the engine's own count; where a folder lacks it, the mean batch size
``batch_size_mean``, whose gauge also counts requests waiting for or in prefill; the concurrency when unmeasured),
linear in b between measured batch sizes and flat beyond them. Made non-decreasing in K (a running maximum: drafting
more never takes less time, noise aside), linear in K between swept num_steps and extended beyond the largest by the
last step's slope. Without ``engine_round_ms`` (engines that do not count it) a cell's round is TPOT p50 x acceptance
length, as :func:`spectune.tune.strategy.cost_table_from_cells` derives it.

A static cell's round at num_steps K computes K draft positions and verifies width K + 1. A round with per-row
lengths does not have that shape: the bundled engine's draft loop (``backends/local/engine/speculative.py``,
``SpeculativeDecoder._draft``) runs until every row stopped, and a ``p_min`` row stops at the position whose
confidence is under the cutoff, so it computes that position without verifying it (D = W when the longest row
stopped before the cap); ``decode_round`` then cuts the drafts to the longest row and verifies and extends the
padded width W = max L_i + 1 only. Each position computed beyond W - 1 costs one more draft step (the head's
layer over b rows and its lm_head with the confidence, ``DraftHead.draft_with_prob``), on top of the static round
that verifies the same width. So a round is charged

    round_ms = cells(b, K = W - 1) + max(D - (W - 1), 0) * (d_step + d_row * b)

with the draft step's cost ``d_step + d_row * b`` from the trace's own ``draft_ms`` (:attr:`CellStepTime.draft_step`,
the fit of :class:`LinearStepTime`'s draft part; recorded rounds compute the draft confidence at every position, as
a ``p_min`` round does). Without it (a trace with no timings) the round is charged the static round of
K = max(D, W - 1), which also charges the verify one position wider than the engine runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from spectune.backends.num_steps.trace import TraceStep
from spectune.core.errors import UserError

DRAFT_TERMS = ("d_step", "d_row")
"""Coefficients of the draft part, ms per head forward and ms per head forward per row."""
VERIFY_TERMS = ("v_fixed", "v_padded", "v_ctx", "v_row", "v_tokens")
"""Coefficients of the verify part: ms per round, per padded verify token (b * W), per verify position per 1000
context tokens, per row, per verified token (V)."""
MIN_FIT_ROUNDS = 8
"""Rounds with ``draft_ms`` and ``verify_ms`` a fit needs."""


class StepTimeModel(Protocol):
    """What the replay needs: a round's time (ms) for arrays of round shapes (all the same length)."""

    description: str

    def round_ms(self, batch: np.ndarray, draft_steps: np.ndarray, width: np.ndarray, verified: np.ndarray,
                 context: np.ndarray) -> np.ndarray: ...

    def to_json(self) -> dict: ...


@dataclass(frozen=True)
class RoundShape:
    """Shapes of rounds as arrays of length R (see the module docstring): batch b, draft steps D, verify width W,
    verified tokens V, context tokens C (0 where unknown)."""

    batch: np.ndarray
    draft_steps: np.ndarray
    width: np.ndarray
    verified: np.ndarray
    context: np.ndarray


def recorded_shapes(steps: Sequence[TraceStep]) -> RoundShape:
    """The recorded rounds' shapes: D = the most positions a row holds draft probabilities for (else the longest
    drafted row), W = longest drafted row + 1, V = sum(drafted + 1), C = sum(context_tokens) or 0."""
    b, d, w, v, c = [], [], [], [], []
    for s in steps:
        drafted = s.drafted_per_row
        b.append(s.batch_size)
        d.append(max(len(r) for r in s.draft_probs) if s.draft_probs is not None else max(drafted))
        w.append(max(drafted) + 1)
        v.append(sum(drafted) + s.batch_size)
        c.append(sum(s.context_tokens) if s.context_tokens is not None else 0)
    return RoundShape(*(np.asarray(x, dtype=float) for x in (b, d, w, v, c)))


def _draft_columns(sh: RoundShape) -> list[np.ndarray]:
    return [sh.draft_steps, sh.draft_steps * sh.batch]


def _verify_columns(sh: RoundShape) -> list[np.ndarray]:
    return [np.ones_like(sh.batch), sh.batch * sh.width, sh.width * sh.context / 1000.0, sh.batch, sh.verified]


def _nnls(columns: list[np.ndarray], y: np.ndarray, names: Sequence[str]) -> tuple[dict[str, float], list[str]]:
    """Non-negative least squares over the columns that add rank, in order; the rest get 0 and are returned."""
    from scipy.optimize import nnls

    kept: list[int] = []
    dropped: list[str] = []
    for j, col in enumerate(columns):
        trial = np.column_stack([columns[i] for i in kept] + [col])
        scale = np.linalg.norm(trial, axis=0)
        if not np.any(col) or np.linalg.matrix_rank(trial / np.where(scale > 0, scale, 1.0), tol=1e-9) <= len(kept):
            dropped.append(names[j])
            continue
        kept.append(j)
    coef = dict.fromkeys(names, 0.0)
    if kept:
        a = np.column_stack([columns[i] for i in kept])
        scale = np.linalg.norm(a, axis=0)
        x, _ = nnls(a / scale, y)
        for i, xi in zip(kept, x / scale):
            coef[names[i]] = float(xi)
    return coef, dropped


@dataclass(frozen=True)
class LinearStepTime:
    """The linear round-time model of the module docstring.

    Attributes:
        coef: coefficient name (:data:`DRAFT_TERMS`, :data:`VERIFY_TERMS`) -> value (ms per unit), all >= 0.
        dropped: terms the fit could not identify (held at 0).
        rounds: rounds fitted.
        rel_rmse: root mean square of (predicted - recorded) round time over the mean recorded round time.
        widths: the verify widths W the fitted rounds ran.
        description: one line for the output.
    """

    coef: dict[str, float]
    dropped: tuple[str, ...] = ()
    rounds: int = 0
    rel_rmse: float = math.nan
    widths: tuple[int, ...] = ()
    description: str = "fitted from the trace's draft_ms and verify_ms"

    def draft_ms(self, sh: RoundShape) -> np.ndarray:
        """Draft time (ms) per round."""
        return sum(self.coef[n] * col for n, col in zip(DRAFT_TERMS, _draft_columns(sh)))  # type: ignore[return-value]

    def verify_ms(self, sh: RoundShape) -> np.ndarray:
        """Verify time (ms) per round."""
        return sum(self.coef[n] * col for n, col in zip(VERIFY_TERMS, _verify_columns(sh)))  # type: ignore

    def round_ms(self, batch: np.ndarray, draft_steps: np.ndarray, width: np.ndarray, verified: np.ndarray,
                 context: np.ndarray) -> np.ndarray:
        """Round time (ms) per round: draft + verify (arrays of length R -> [R])."""
        sh = RoundShape(*(np.asarray(x, dtype=float) for x in (batch, draft_steps, width, verified, context)))
        return self.draft_ms(sh) + self.verify_ms(sh)

    def to_json(self) -> dict:
        """The model for ``--json``."""
        return {"kind": "trace", "description": self.description, "coef_ms": self.coef, "dropped": list(self.dropped),
                "rounds": self.rounds, "rel_rmse": None if math.isnan(self.rel_rmse) else self.rel_rmse,
                "verify_widths": list(self.widths)}


def fit_step_time(shapes: RoundShape, draft_ms: np.ndarray, verify_ms: np.ndarray) -> LinearStepTime:
    """Fit :class:`LinearStepTime` to rounds of known shape and times (ms arrays of length R).

    Raises:
        UserError: fewer than :data:`MIN_FIT_ROUNDS` rounds.
    """
    n = len(draft_ms)
    if n < MIN_FIT_ROUNDS:
        raise UserError(f"the trace has {n} rounds with draft_ms and verify_ms, too few to fit a step-time model "
                        f"(need {MIN_FIT_ROUNDS}); record a longer trace or pass --sweep FOLDER")
    d_coef, d_drop = _nnls(_draft_columns(shapes), np.asarray(draft_ms, float), DRAFT_TERMS)
    v_coef, v_drop = _nnls(_verify_columns(shapes), np.asarray(verify_ms, float), VERIFY_TERMS)
    model = LinearStepTime({**d_coef, **v_coef}, tuple(d_drop + v_drop), n)
    total = np.asarray(draft_ms, float) + np.asarray(verify_ms, float)
    pred = model.round_ms(shapes.batch, shapes.draft_steps, shapes.width, shapes.verified, shapes.context)
    mean = float(np.mean(total))
    rel = float(np.sqrt(np.mean((pred - total) ** 2)) / mean) if mean > 0 else math.nan
    return LinearStepTime(model.coef, model.dropped, n, rel, tuple(sorted({int(w) for w in shapes.width})))


def fit_trace_step_time(steps: Sequence[TraceStep]) -> LinearStepTime | None:
    """:func:`fit_step_time` over the trace's rounds that carry ``draft_ms`` and ``verify_ms``; None when none
    does (a trace in the older format).

    Raises:
        UserError: some rounds carry times but fewer than :data:`MIN_FIT_ROUNDS`.
    """
    timed = [s for s in steps if s.draft_ms is not None and s.verify_ms is not None]
    if not timed:
        return None
    return fit_step_time(recorded_shapes(timed), np.array([s.draft_ms for s in timed]),
                         np.array([s.verify_ms for s in timed]))


@dataclass(frozen=True)
class CellStepTime:
    """Round time from a sweep's cells (the module docstring).

    Attributes:
        table: num_steps K -> (batch sizes ascending, round ms at each), already non-decreasing in K.
        source: what the cells were read from, and which column.
        description: one line for the output.
        draft_step: (d_step, d_row): one draft step's ms at b rows is d_step + d_row * b (the trace's fit), charged
            per position a round computes beyond its verify width - 1; None: the round is charged at
            K = max(D, W - 1).
    """

    table: dict[int, tuple[tuple[float, ...], tuple[float, ...]]]
    source: str = ""
    description: str = field(default="")
    draft_step: tuple[float, float] | None = None

    def _at_k(self, k: int, b: np.ndarray) -> np.ndarray:
        xs, ys = self.table[k]
        return np.interp(b, xs, ys)

    def static_ms(self, batch: np.ndarray, k: np.ndarray) -> np.ndarray:
        """The interpolated static round (ms) at batch sizes ``batch`` and num_steps ``k`` (arrays of length R)."""
        b = np.asarray(batch, float)
        k = np.asarray(k, float)
        ks = sorted(self.table)
        grid = np.vstack([self._at_k(kk, b) for kk in ks])  # [len(ks), R]
        grid = np.maximum.accumulate(grid, axis=0)  # non-decreasing in K at every b
        if len(ks) == 1:
            return grid[0]
        kv = np.asarray(ks, float)
        i = np.clip(np.searchsorted(kv, k, side="right") - 1, 0, len(ks) - 2)
        t = np.maximum((k - kv[i]) / (kv[i + 1] - kv[i]), 0.0)  # flat below the smallest K, linear beyond the largest
        cols = np.arange(len(b))
        return grid[i, cols] + t * (grid[i + 1, cols] - grid[i, cols])

    def round_ms(self, batch: np.ndarray, draft_steps: np.ndarray, width: np.ndarray, verified: np.ndarray,
                 context: np.ndarray) -> np.ndarray:
        """Round time (ms) per round (arrays of length R -> [R]): the static round verifying width W plus the draft
        steps beyond W - 1 (:attr:`draft_step`), or without it the static round at K = max(D, W - 1)."""
        d = np.asarray(draft_steps, float)
        k = np.asarray(width, float) - 1
        if self.draft_step is None:
            return self.static_ms(batch, np.maximum(d, k))
        d_step, d_row = self.draft_step
        return self.static_ms(batch, k) + np.maximum(d - k, 0.0) * (d_step + d_row * np.asarray(batch, float))

    def to_json(self) -> dict:
        """The model for ``--json``."""
        out = {"kind": "sweep", "description": self.description, "source": self.source,
               "round_ms": {str(k): {f"{b:g}": ms for b, ms in zip(*v)} for k, v in sorted(self.table.items())}}
        if self.draft_step is not None:
            out["draft_step_ms"] = {"d_step": self.draft_step[0], "d_row": self.draft_step[1]}
        return out


def trace_draft_step(steps: Sequence[TraceStep]) -> tuple[float, float] | None:
    """(d_step, d_row): one draft step's ms at b rows, d_step + d_row * b, from the draft part of
    :func:`fit_trace_step_time` (``draft_ms = D * (d_step + d_row * b)``); None when fewer than
    :data:`MIN_FIT_ROUNDS` rounds carry ``draft_ms`` and ``verify_ms``."""
    if sum(s.draft_ms is not None and s.verify_ms is not None for s in steps) < MIN_FIT_ROUNDS:
        return None
    fit = fit_trace_step_time(steps)
    return None if fit is None else (fit.coef["d_step"], fit.coef["d_row"])


def cells_step_time(folder: str | Path, draft_step: tuple[float, float] | None = None,
                    repeat: int | None = None) -> CellStepTime:
    """:class:`CellStepTime` from a sweep results folder (or its summary.csv); ``draft_step``: (d_step, d_row), the
    cost of a draft position computed beyond a round's verify width (:func:`trace_draft_step`), or None. ``repeat``:
    only the cells of that repeat (a sweep with ``--repeats``: the table measured in the same minutes as what it is to
    time), else the median of each cell's repeats.

    Raises:
        UserError: the folder cannot be read (:func:`spectune.results.reader.load_results`) or holds no ok cell
            with a round time.
    """
    import pandas as pd

    from spectune.results.reader import load_results

    res = load_results(folder)
    df = res.summary
    df = df[df["status"] == "ok"]
    if "predicted" in df.columns:
        df = df[~df["predicted"].astype(bool)]
    if repeat is not None and "repeat" in df.columns:
        df = df[pd.to_numeric(df["repeat"], errors="coerce") == repeat]

    def col(name: str) -> pd.Series:
        return pd.to_numeric(df[name], errors="coerce") if name in df.columns else pd.Series(math.nan, df.index)

    round_ms, column = col("engine_round_ms"), "engine_round_ms"
    if not round_ms.notna().any():
        round_ms, column = col("tpot_p50_ms") * col("acceptance_length"), "tpot_p50_ms x acceptance_length"
    bs = col("batch_size_mean").where(col("batch_size_mean") > 0, df["concurrency"].astype(float))
    bs = col("engine_round_rows").where(col("engine_round_rows") > 0, bs)
    cells = pd.DataFrame({"k": df["steps"], "c": df["concurrency"], "b": bs, "ms": round_ms}).dropna()
    cells = cells[cells["ms"] > 0]
    if cells.empty:
        raise UserError(f"{res.source}: no finished cell with a round time (engine_round_ms, or TPOT p50 and "
                        "acceptance length); pass a sweep of the bundled engine or leave --sweep out")
    med = cells.groupby(["k", "c"]).median().reset_index()
    table: dict[int, tuple[tuple[float, ...], tuple[float, ...]]] = {}
    for k, grp in med.groupby("k"):
        grp = grp.sort_values("b")
        table[int(k)] = (tuple(map(float, grp["b"])), tuple(map(float, grp["ms"])))
    extra = "" if draft_step is None else (f"; a draft position beyond the verify width "
                                           f"{draft_step[0]:.3g} + {draft_step[1]:.3g} x batch ms (trace draft_ms)")
    which = "" if repeat is None else f" of repeat {repeat}"
    return CellStepTime(table, f"{res.source} ({column})",
                        f"interpolated from {len(med)} sweep cells{which} ({column}){extra}", draft_step)
