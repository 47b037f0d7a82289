"""Per-row draft-length policies replayed on a trace (``spectune simulate --policy``): which policies there are, how
a ``--policy`` argument names them, and the draft length each gives every row of every recorded round.

Rules (L_i: the draft tokens row i submits for verification in a round; n_max: the cap, ``--n-max`` or the round's
recorded num_steps; p_j: row i's value at draft position j = 1, 2, ...):

- ``static:K``: L_i = K for every row.
- ``p_min:P`` (llama.cpp ``--spec-draft-p-min``): L_i = (index of the first position whose draft probability is
  under P) - 1, that token not drafted, capped at n_max; no such position: n_max. Source: llama.cpp release 11434,
  ``common/speculative.cpp``, ``common_speculative_impl_draft_eagle3::draft`` (``if (cur_p->data[0].p <
  params.p_min)`` stops the row before ``result.push_back(id)``; ``params.n_max <= result.size()`` stops it after).
  Its ``n_min`` (default 0: a draft shorter than n_min is dropped) is not modelled.
- ``specdec:H`` (SpecDec++, Huang et al. 2024, Section 4: stop the round when the predicted probability that at
  least one candidate is rejected exceeds the threshold): L_i = the first t with 1 - prod_{j<=t} p_j > H, that token
  included, capped at n_max; p_j is the acceptance head's ``accept_probs`` where the round recorded them, else the
  raw ``draft_probs``. ``specdec-raw:H`` always reads ``draft_probs``.
- ``config:FILE``: an SGLang adaptive config (EMA or throughput-aware strategy) or a vLLM schedule, replayed round by
  round as ``spectune simulate --config`` does (:mod:`spectune.tune.simulate`); L_i = the tier for the batch.
- ``ema``: SGLang's default adaptive config (:data:`SGLANG_DEFAULT_CONFIG`).
- ``specserve[:S]`` (SpecServe, Huang et al., sections 4-5): the bundled engine's adaptive drafter, confidence-prior
  verifier and SLO check run on the recorded ``draft_probs`` with the replay's round times, at most n_max drafts
  (:mod:`spectune.tune.specserve_replay`); S is the TPOT SLO in ms no predicted round may exceed (bare
  ``specserve``: ``--slo-tpot-ms``, else none). A ``config:FILE`` holding a specserve engine config replays as this
  at its n_max and SLO.
- ``oracle``: every row drafts exactly the tokens it had accepted, L_i = a_i (SpecDec++ Section 3: with hindsight
  the best round stops so that its last candidate is accepted; the target's bonus token replaces the rejected one).
  Its acceptance length is the trace's own, at or above every policy's.
- ``oracle-capped``: the oracle with each round's length capped at the M that maximises the trace's tok/s under the
  step-time model (:mod:`spectune.tune.policy_replay`); at or above every policy's tok/s.

A row's recorded positions are the entries of its ``draft_probs`` (else its drafted tokens). A threshold rule that
would draft past them (every recorded probability passes and the cap is higher) is cut there and counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from spectune.backends.num_steps.trace import TraceStep
from spectune.core.errors import UserError

THRESHOLD_KINDS = ("p_min", "specdec", "specdec-raw")
"""Policies with a probability threshold."""
KINDS = ("static", *THRESHOLD_KINDS, "config", "ema", "specserve", "oracle", "oracle-capped")
"""Every policy kind, in output order."""
DEFAULT_GRID: dict[str, tuple[float, ...]] = {
    "p_min": (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
    "specdec": (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
    "specdec-raw": (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
}
"""Thresholds a threshold kind named without values replays."""
POLICY_HELP = ("static:K[,K..] | p_min:P[,P..] | specdec:H[,H..] | specdec-raw:H[,H..] | config:FILE | ema "
               "| specserve[:SLO_MS,..] | oracle | all")


@dataclass(frozen=True)
class PolicySpec:
    """One policy to replay.

    Attributes:
        kind: one of :data:`KINDS`.
        value: K for ``static``, the threshold for the threshold kinds, the TPOT SLO (ms) of ``specserve`` (None:
            none), else None.
        path: the config file of ``config``.
    """

    kind: str
    value: float | None = None
    path: Path | None = None

    @property
    def label(self) -> str:
        """How the output names it: ``static:3``, ``p_min:0.3``, ``config:adaptive.json``, ``oracle``."""
        if self.kind == "static":
            return f"static:{int(self.value or 0)}"
        if self.kind in THRESHOLD_KINDS:
            return f"{self.kind}:{self.value:g}"
        if self.kind == "config":
            return f"config:{self.path.name if self.path else '?'}"
        if self.kind == "specserve" and self.value is not None:
            return f"specserve:{self.value:g}"
        return self.kind


@dataclass(frozen=True)
class TraceArrays:
    """A trace as flat arrays: R rounds, N rows (row-rounds), P = the most recorded positions of any row.

    Attributes:
        batch: [R] batch size. num_steps: [R] the round's num_steps. start: [R] index of the round's first row.
        row_round: [N] the round of each row. accepted: [N] accepted drafts a_i. drafted: [N] drafted tokens.
        positions: [N] recorded positions (``draft_probs`` entries, else drafted).
        draft_probs: [N, P] float, NaN past a row's positions; None when no round holds ``draft_probs``.
        accept_probs: [N, P] float, NaN where a round has no ``accept_probs``; None when none does.
        context: [R] sum of the rows' ``context_tokens`` (0 where unknown).
        missing_probs: rounds with num_steps > 0 that hold no ``draft_probs``.
    """

    batch: np.ndarray
    num_steps: np.ndarray
    start: np.ndarray
    row_round: np.ndarray
    accepted: np.ndarray
    drafted: np.ndarray
    positions: np.ndarray
    draft_probs: np.ndarray | None
    accept_probs: np.ndarray | None
    context: np.ndarray
    missing_probs: int

    @property
    def rounds(self) -> int:
        return len(self.batch)

    @property
    def max_positions(self) -> int:
        """The most positions any row recorded (its drafted tokens where no probabilities were kept)."""
        return int(self.positions.max()) if len(self.positions) else 0


def trace_arrays(steps: Sequence[TraceStep]) -> TraceArrays:
    """Flatten a trace into :class:`TraceArrays`."""
    batch = np.array([s.batch_size for s in steps], dtype=np.int64)
    start = np.concatenate(([0], np.cumsum(batch)[:-1])).astype(np.int64)
    row_round = np.repeat(np.arange(len(steps)), batch)
    accepted = np.fromiter((a for s in steps for a in s.accepted_drafts), dtype=np.int64, count=int(batch.sum()))
    drafted = np.fromiter((d for s in steps for d in s.drafted_per_row), dtype=np.int64, count=int(batch.sum()))
    positions = drafted.copy()
    has_dp = any(s.draft_probs is not None for s in steps)
    has_ap = any(s.accept_probs is not None for s in steps)
    width = max([len(r) for s in steps for r in (s.draft_probs or s.accept_probs or ())] + [1])
    dp = np.full((len(accepted), width), np.nan) if has_dp else None
    ap = np.full((len(accepted), width), np.nan) if has_ap else None
    missing = 0
    for r, s in enumerate(steps):
        i0 = int(start[r])
        if s.draft_probs is None and s.num_steps > 0:
            missing += 1
        for key, out in (("draft_probs", dp), ("accept_probs", ap)):
            rows = getattr(s, key)
            if rows is None or out is None:
                continue
            for j, row in enumerate(rows):
                out[i0 + j, :len(row)] = row
                positions[i0 + j] = len(row)
    context = np.array([sum(s.context_tokens) if s.context_tokens is not None else 0 for s in steps], dtype=float)
    return TraceArrays(batch, np.array([s.num_steps for s in steps], dtype=np.int64), start, row_round, accepted,
                       drafted, positions, dp, ap, context, missing)


def _first_true(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``mask`` [N, P]: (whether any entry is True [N], the index of the first True [N], 0 if none)."""
    return mask.any(axis=1), mask.argmax(axis=1)


@dataclass(frozen=True)
class RowLengths:
    """What a policy drafts.

    Attributes:
        lengths: [N] L_i per row.
        past_recorded: [N] bool, the rule would have drafted beyond the row's recorded positions.
        examined: [N] positions the drafter computed for the row: p_min computes the position whose confidence
            stops it (L_i + 1, at most the cap), specdec keeps the token that stops it (L_i); None: == lengths.
    """

    lengths: np.ndarray
    past_recorded: np.ndarray
    examined: np.ndarray | None = None


def require_draft_probs(arr: TraceArrays, policy: str) -> None:
    """Check that every drafting round of ``arr`` holds ``draft_probs`` (what ``policy`` replays from).

    Raises:
        UserError: some do not; names how many and what to do.
    """
    if arr.draft_probs is None or arr.missing_probs:
        n = arr.rounds if arr.draft_probs is None else arr.missing_probs
        raise UserError(f"{policy} needs per-position draft probabilities, and {n} drafting rounds of the trace hold "
                        "no 'draft_probs'; record the trace with this release's engine (--trace) or replay static, "
                        "ema, config and oracle policies only")


def threshold_lengths(arr: TraceArrays, kind: str, threshold: float, n_max: int | None) -> RowLengths:
    """Row lengths of ``p_min``, ``specdec`` or ``specdec-raw`` at ``threshold`` (rules: the module docstring).

    Raises:
        UserError: the trace lacks ``draft_probs`` for a round that drafted.
    """
    require_draft_probs(arr, kind)
    cap = arr.num_steps[arr.row_round] if n_max is None else np.full(len(arr.accepted), n_max)
    pos = arr.positions
    if kind == "p_min":
        found, first = _first_true(arr.draft_probs < threshold)  # NaN compares False
        stop = np.where(found, first, pos)  # the low token is not drafted: the tokens before it
        examined = np.minimum(np.where(found, first + 1, pos), cap)  # ... but its confidence was computed
        return RowLengths(np.minimum(stop, cap), ~found & (pos < cap), examined)
    else:
        p = arr.draft_probs
        if kind == "specdec" and arr.accept_probs is not None:
            p = np.where(np.isnan(arr.accept_probs), p, arr.accept_probs)
        surv = np.cumprod(np.where(np.isnan(p), 1.0, p), axis=1)
        found, first = _first_true((1.0 - surv > threshold) & ~np.isnan(p))
        stop = np.where(found, first + 1, pos)  # that token included
    return RowLengths(np.minimum(stop, cap), ~found & (pos < cap))


def parse_policy(text: str, has_probs: bool, max_positions: int) -> list[PolicySpec]:
    """The specs one ``--policy`` argument names (grammar: :data:`POLICY_HELP`). A threshold kind without values
    takes :data:`DEFAULT_GRID`, ``static`` without values 0..max_positions, ``all`` every kind the trace supports.

    Raises:
        UserError: an unknown kind, a bad value, or a missing config file.
    """
    raw, _, rest = text.strip().partition(":")
    raw = raw.strip().lower()
    kind = "p_min" if raw in ("p_min", "p-min", "pmin") else raw.replace("_", "-")
    example = "--policy static:2 --policy p_min:0.3,0.5 --policy specdec:0.5 --policy oracle"
    if kind == "all":
        out = [PolicySpec("static", float(k)) for k in range(max_positions + 1)]
        if has_probs:
            out += [PolicySpec(k, v) for k in ("p_min", "specdec") for v in DEFAULT_GRID[k]]
            out.append(PolicySpec("specserve"))
        return out + [PolicySpec("ema"), PolicySpec("oracle"), PolicySpec("oracle-capped")]
    if kind in ("ema", "oracle"):
        if rest:
            raise UserError(f"--policy {text!r}: {kind} takes no value; write --policy {kind}")
        return [PolicySpec(kind)] + ([PolicySpec("oracle-capped")] if kind == "oracle" else [])
    if kind == "config":
        path = Path(rest.strip())
        if not rest.strip() or not path.is_file():
            raise UserError(f"--policy {text!r}: no such config file; write --policy config:PATH to an SGLang "
                            "adaptive config or a vLLM schedule")
        return [PolicySpec("config", path=path)]
    if kind == "specserve":
        return [PolicySpec("specserve", _slo(text, item)) for item in rest.split(",")] if rest.strip() \
            else [PolicySpec("specserve")]
    if kind not in ("static", *THRESHOLD_KINDS):
        raise UserError(f"--policy {text!r}: unknown policy {kind!r}; use {POLICY_HELP} (e.g. {example})")
    if not rest.strip():
        if kind == "static":
            return [PolicySpec("static", float(k)) for k in range(max_positions + 1)]
        return [PolicySpec(kind, v) for v in DEFAULT_GRID[kind]]
    out = []
    for item in rest.split(","):
        try:
            v = float(item)
        except ValueError:
            raise UserError(f"--policy {text!r}: {item.strip()!r} is not a number; e.g. {example}") from None
        if kind == "static" and (v < 0 or v != int(v)):
            raise UserError(f"--policy {text!r}: static K must be a whole number >= 0, got {item.strip()!r}")
        if kind in THRESHOLD_KINDS and not (0.0 <= v <= 1.0 and math.isfinite(v)):
            raise UserError(f"--policy {text!r}: {kind} thresholds are probabilities in [0, 1], got {item.strip()!r}")
        out.append(PolicySpec(kind, v))
    return out


def _slo(text: str, item: str) -> float:
    """A ``specserve:S`` SLO: a number of ms > 0. Raises UserError otherwise."""
    try:
        v = float(item)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise UserError(f"--policy {text!r}: specserve's value is its TPOT SLO, a number of ms > 0, got "
                        f"{item.strip()!r}; e.g. --policy specserve:50")
    return v


def parse_policies(texts: Sequence[str], has_probs: bool, max_positions: int) -> list[PolicySpec]:
    """Every spec of the ``--policy`` arguments, de-duplicated, in :data:`KINDS` order then by value."""
    seen: dict[tuple, PolicySpec] = {}
    for t in texts:
        for spec in parse_policy(t, has_probs, max_positions):
            seen.setdefault((spec.kind, spec.value, spec.path), spec)
    return sorted(seen.values(), key=lambda s: (KINDS.index(s.kind), s.value or 0.0, str(s.path or "")))
