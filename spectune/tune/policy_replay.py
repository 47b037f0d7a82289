"""Replay draft-length policies on one trace and score them (``spectune simulate --policy``).

Per policy (:mod:`spectune.tune.draft_policies`) every recorded row i of every round gets a draft length L_i and
is credited with accepted drafts min(a_i, L_i), a_i its recorded accepted drafts. For greedy chain drafting that
is exact when L_i <= drafted_i (the first L_i drafts are the same tokens) and whenever a_i < drafted_i (the row's
first rejection, at a_i + 1, is known). Only a row that accepted everything it drafted and is given more
(L_i > drafted_i = a_i) gets a lower bound, counted as ``lower_bound_rows``. Under sampling it is an estimate.

A replayed round has batch size b, draft steps D = the most positions a row's drafter computed (the drafter runs
until every row stopped, and p_min computes the position whose confidence stops it: L_i + 1 up to the cap; with
``draft_to_cap`` a threshold policy runs D = n_max, as an engine that drafts the cap on the device and cuts rows
after), verify width W = max L_i + 1, verified tokens V = sum(L_i + 1), the recorded context, and a round time
T(b, D, W, V, C) from a step-time model (:mod:`spectune.tune.step_time`). Per policy, over all rounds or those of
one batch size:

- acceptance length = 1 + sum(accepted) / rows (accepted drafts + 1 bonus token per row per verify step);
- drafted tokens per accepted token = sum(L_i) / sum(accepted);
- predicted output tok/s = 1000 * sum(accepted + 1) / sum(T) (decode rounds only: prefill is not in a trace);
- predicted TPOT (ms) = sum(b * T) / sum(accepted + 1): each row waits T for the accepted + 1 tokens it gets;
- with a TPOT SLO S (``--slo-tpot-ms``): SLO attainment = the share of rows (row-rounds) whose TPOT in their
  round, T / (accepted + 1), is at most S, and goodput = 1000 * sum(accepted + 1 of those rows) / sum(T), the
  output tok/s of rows within the SLO. A trace does not say which rows are one request, so a request's TPOT (its
  rounds' time over its tokens) cannot be formed; a request whose every round meets S meets it too.

``oracle-capped`` caps each round's rows at M (L_i = min(a_i, M)) with M chosen per round to maximise the tok/s of
the rounds scored (Dinkelbach's method on sum(tokens) / sum(T): per round argmax_M tokens(M) - lambda * T(M), lambda
the ratio so far, repeated until lambda stops rising; exact over the finite choices). With T non-decreasing in D,
at least the static round of its verify width (D = W - 1), and that static round non-decreasing in W (both step-time
models are), no policy's rounds reach a higher tok/s on the same rounds: for a policy round whose longest row is M,
the oracle at M emits at least its tokens in no more time (a row's L_i <= a_i costs V-time only when a token it
verifies is also accepted).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from spectune.backends.num_steps.sglang_config import SGLANG_DEFAULT_CONFIG, load_config_file, \
    parse_sglang_adaptive_config
from spectune.backends.num_steps.confidence_config import ConfidenceConfig
from spectune.backends.num_steps.ema_policy import make_policy
from spectune.backends.num_steps.throughput_policy import CostTable
from spectune.core.errors import UserError
from spectune.tune.draft_policies import THRESHOLD_KINDS, PolicySpec, RowLengths, TraceArrays, threshold_lengths
from spectune.tune.step_time import StepTimeModel


@dataclass(frozen=True)
class PolicyMetrics:
    """A policy's numbers over a set of rounds (formulas: the module docstring).

    Attributes:
        rounds: verify steps scored. rows: row-rounds scored.
        acceptance_length: mean accepted drafts + 1 per row per verify step.
        drafted_per_accepted: drafted tokens per accepted draft token (None when nothing was accepted).
        tok_s: predicted output tokens/s, or None without a step-time model.
        tpot_ms: predicted TPOT (ms), or None without a step-time model.
        round_ms: mean predicted round time (ms), or None.
        mean_draft_steps: mean D per round.
        lower_bound_rows: rows whose accepted drafts are a lower bound (given more than they drafted).
        past_recorded_rows: rows a threshold rule would have drafted past their recorded positions (cut there).
        slo_attainment: share of rows within the TPOT SLO (0..1), or None without an SLO or a step-time model.
        goodput_tok_s: predicted output tokens/s of the rows within the SLO, or None likewise.
    """

    rounds: int
    rows: int
    acceptance_length: float
    drafted_per_accepted: float | None
    tok_s: float | None
    tpot_ms: float | None
    round_ms: float | None
    mean_draft_steps: float
    lower_bound_rows: int
    past_recorded_rows: int
    slo_attainment: float | None = None
    goodput_tok_s: float | None = None


@dataclass
class PolicyResult:
    """One replayed policy: its numbers over the whole trace and per batch size."""

    spec: PolicySpec
    overall: PolicyMetrics
    by_batch: dict[int, PolicyMetrics] = field(default_factory=dict)

    def to_json(self) -> dict:
        """The result for ``--json``."""
        return {"policy": self.spec.label, "kind": self.spec.kind, "value": self.spec.value,
                "overall": asdict(self.overall), "by_batch_size": {str(b): asdict(m) for b, m in self.by_batch.items()}}


@dataclass(frozen=True)
class _Replay:
    lengths: np.ndarray  # [N]
    draft_steps: np.ndarray  # [R]
    past_recorded: np.ndarray  # [N] bool


def _per_round_max(arr: TraceArrays, x: np.ndarray) -> np.ndarray:
    return np.maximum.reduceat(x, arr.start) if len(x) else np.zeros(0, dtype=x.dtype)


def _per_round_sum(arr: TraceArrays, x: np.ndarray) -> np.ndarray:
    return np.add.reduceat(x, arr.start) if len(x) else np.zeros(0, dtype=x.dtype)


def _times(arr: TraceArrays, model: StepTimeModel, lengths: np.ndarray, draft_steps: np.ndarray) -> np.ndarray:
    width = _per_round_max(arr, lengths) + 1
    verified = _per_round_sum(arr, lengths + 1)
    return model.round_ms(arr.batch, draft_steps, width, verified, arr.context)


def round_times(arr: TraceArrays, rep: _Replay, model: StepTimeModel | None) -> np.ndarray | None:
    """[R] the replayed rounds' times (ms) under ``model``, or None without one."""
    return None if model is None else _times(arr, model, rep.lengths, rep.draft_steps)


def score(arr: TraceArrays, rep: _Replay, times: np.ndarray | None, rounds: np.ndarray,
          slo_tpot_ms: float | None = None) -> PolicyMetrics:
    """:class:`PolicyMetrics` of a replay over the rounds where ``rounds`` [R] is True; ``times``: the rounds'
    times (:func:`round_times`); ``slo_tpot_ms``: the TPOT SLO of the SLO attainment and goodput (ms, or None)."""
    rows = rounds[arr.row_round]
    lengths, acc, drafted = rep.lengths[rows], arr.accepted[rows], arr.drafted[rows]
    credited = np.minimum(acc, lengths)
    n_rows = int(rows.sum())
    tokens = float(credited.sum() + n_rows)
    total_acc = float(credited.sum())
    tok_s = tpot = round_ms = attained = goodput = None
    if times is not None:
        t = times[rounds]
        if t.sum() > 0:
            tok_s = 1000.0 * tokens / float(t.sum())
            tpot = float((arr.batch[rounds] * t).sum()) / tokens
            round_ms = float(t.mean())
            if slo_tpot_ms is not None and n_rows:
                within = times[arr.row_round][rows] / (credited + 1) <= slo_tpot_ms  # [rows]
                attained = float(within.mean())
                goodput = 1000.0 * float((credited + 1)[within].sum()) / float(t.sum())
    return PolicyMetrics(
        rounds=int(rounds.sum()), rows=n_rows,
        acceptance_length=1.0 + total_acc / n_rows if n_rows else math.nan,
        drafted_per_accepted=float(lengths.sum()) / total_acc if total_acc > 0 else None,
        tok_s=tok_s, tpot_ms=tpot, round_ms=round_ms,
        mean_draft_steps=float(rep.draft_steps[rounds].mean()) if rounds.any() else math.nan,
        lower_bound_rows=int(((lengths > drafted) & (acc == drafted)).sum()),
        past_recorded_rows=int(rep.past_recorded[rows].sum()), slo_attainment=attained, goodput_tok_s=goodput)


def _config_tiers(arr: TraceArrays, spec: PolicySpec, *, initial_steps: int | None,
                  cuda_graph_bs: Sequence[int] | None, cost_table: CostTable | None, strict: bool) -> np.ndarray:
    """[R] the tier a config policy runs each round at, fed back the credited accepted drafts (as simulate)."""
    cfg = (parse_sglang_adaptive_config(SGLANG_DEFAULT_CONFIG) if spec.kind == "ema"
           else load_config_file(spec.path, strict=strict))  # type: ignore[arg-type]
    policy = make_policy(cfg, initial_steps=initial_steps, cuda_graph_bs=cuda_graph_bs, cost_table=cost_table)
    tiers = np.zeros(arr.rounds, dtype=np.int64)
    for r in range(arr.rounds):
        b = int(arr.batch[r])
        k = policy.steps_for_batch(b)
        tiers[r] = k
        i0 = int(arr.start[r])
        policy.on_verify([min(int(a), k) for a in arr.accepted[i0:i0 + b]], b)
    return tiers


def confidence_kind(cfg: ConfidenceConfig) -> str:
    """The policy kind a ``p_min`` / ``specdec`` / ``specserve`` engine config replays as: ``specdec`` (acceptance
    head) when it names a head, ``specdec-raw`` when it reads the raw confidence."""
    if cfg.strategy in ("p_min", "specserve"):
        return cfg.strategy
    return "specdec" if cfg.acceptance_head else "specdec-raw"


def replay(arr: TraceArrays, spec: PolicySpec, *, n_max: int | None = None, draft_to_cap: bool = False,
           initial_steps: int | None = None, cuda_graph_bs: Sequence[int] | None = None,
           cost_table: CostTable | None = None, strict: bool = True, model: StepTimeModel | None = None) -> _Replay:
    """Row lengths and draft steps of one policy (``oracle-capped`` excluded: :func:`oracle_capped`). A ``config``
    file holding a ``p_min`` / ``specdec`` / ``specserve`` engine config
    (:mod:`spectune.backends.num_steps.confidence_config`) replays as that rule at its threshold (SLO) and n_max.
    ``model``: the step-time model ``specserve`` decides with.

    Raises:
        UserError: ``specserve`` without a step-time model, or a probability rule on a trace without
            ``draft_probs``.
    """
    none = np.zeros(len(arr.accepted), dtype=bool)
    if spec.kind == "static":
        lengths = np.full(len(arr.accepted), int(spec.value or 0), dtype=np.int64)
        return _Replay(lengths, np.full(arr.rounds, int(spec.value or 0)), none)
    if spec.kind == "config":
        cfg = load_config_file(spec.path, strict=strict)  # type: ignore[arg-type]
        if isinstance(cfg, ConfidenceConfig):  # the bundled engine's per-row rule: its threshold at its n_max
            value = cfg.slo_tpot_ms if cfg.strategy == "specserve" else cfg.threshold
            return replay(arr, PolicySpec(confidence_kind(cfg), value), n_max=cfg.n_max,
                          draft_to_cap=draft_to_cap, model=model)
    if spec.kind in ("config", "ema"):
        tiers = _config_tiers(arr, spec, initial_steps=initial_steps, cuda_graph_bs=cuda_graph_bs,
                              cost_table=cost_table, strict=strict)
        return _Replay(tiers[arr.row_round], tiers, none)
    if spec.kind == "oracle":
        return _Replay(arr.accepted.copy(), _per_round_max(arr, arr.accepted), none)
    if spec.kind == "specserve":
        if model is None:
            raise UserError("specserve decides with a step-time model and the trace holds no draft_ms/verify_ms: "
                            "pass --sweep FOLDER (a sweep's cells) or record the trace with this release's engine")
        from spectune.tune.specserve_replay import specserve_lengths

        return _Replay(*specserve_lengths(arr, model, n_max, spec.value))
    if spec.kind in THRESHOLD_KINDS:
        rl: RowLengths = threshold_lengths(arr, spec.kind, float(spec.value or 0.0), n_max)
        steps = (arr.num_steps if n_max is None else np.full(arr.rounds, n_max)) if draft_to_cap \
            else _per_round_max(arr, rl.lengths if rl.examined is None else rl.examined)
        return _Replay(rl.lengths, steps, rl.past_recorded)
    raise ValueError(f"replay: unknown policy kind {spec.kind!r}")


def oracle_capped(arr: TraceArrays, model: StepTimeModel, rounds: np.ndarray) -> _Replay:
    """The ``oracle-capped`` replay for the rounds where ``rounds`` is True (others get the uncapped oracle);
    method: the module docstring."""
    amax = int(arr.accepted.max()) if len(arr.accepted) else 0
    caps = np.arange(amax + 1)
    credited = np.minimum(arr.accepted[:, None], caps[None, :])  # [N, M+1]
    tokens = _per_round_sum(arr, credited) + arr.batch[:, None]  # [R, M+1]
    depth = _per_round_max(arr, credited)  # [R, M+1]: the round's longest row at cap M
    rep = lambda a: np.repeat(a[:, None], amax + 1, axis=1).ravel()  # noqa: E731
    t = model.round_ms(rep(arr.batch), depth.ravel(), depth.ravel() + 1, tokens.ravel(), rep(arr.context))
    t = t.reshape(tokens.shape)
    sel = np.flatnonzero(rounds)
    tok, tim = tokens[sel], t[sel]
    pick = np.full(len(sel), amax)
    lam = tok[np.arange(len(sel)), pick].sum() / max(tim[np.arange(len(sel)), pick].sum(), 1e-12)
    for _ in range(64):
        pick = np.argmax(tok - lam * tim, axis=1)
        new = tok[np.arange(len(sel)), pick].sum() / max(tim[np.arange(len(sel)), pick].sum(), 1e-12)
        if new <= lam * (1 + 1e-12):
            break
        lam = new
    cap = np.full(arr.rounds, amax)
    cap[sel] = pick
    lengths = np.minimum(arr.accepted, cap[arr.row_round])
    return _Replay(lengths, _per_round_max(arr, lengths), np.zeros(len(lengths), dtype=bool))


def evaluate(arr: TraceArrays, specs: Sequence[PolicySpec], model: StepTimeModel | None,
             slo_tpot_ms: float | None = None, **kw) -> list[PolicyResult]:
    """Replay and score every spec over the whole trace and per batch size (``kw``: :func:`replay`'s options;
    ``slo_tpot_ms``: the TPOT SLO of each policy's SLO attainment and goodput, ms). ``oracle-capped`` is solved
    separately for the whole trace and for each batch size, and skipped without a step-time model."""
    batches = sorted({int(b) for b in arr.batch})
    masks = {b: arr.batch == b for b in batches}
    everything = np.ones(arr.rounds, dtype=bool)
    out = []
    for spec in specs:
        if spec.kind == "oracle-capped":
            if model is None:
                continue
            rep = oracle_capped(arr, model, everything)
            res = PolicyResult(spec, score(arr, rep, round_times(arr, rep, model), everything, slo_tpot_ms))
            for b, m in masks.items():
                rep = oracle_capped(arr, model, m)
                res.by_batch[b] = score(arr, rep, round_times(arr, rep, model), m, slo_tpot_ms)
        else:
            rep = replay(arr, spec, model=model, **kw)
            times = round_times(arr, rep, model)
            res = PolicyResult(spec, score(arr, rep, times, everything, slo_tpot_ms))
            res.by_batch = {b: score(arr, rep, times, m, slo_tpot_ms) for b, m in masks.items()}
        out.append(res)
    return out


FAMILIES = ("static", "p_min", "specdec", "specdec-raw")
"""Policy kinds whose values :func:`best_per_batch` picks among."""


def best_per_batch(results: Sequence[PolicyResult]) -> dict[str, dict[int, PolicyResult]]:
    """Per family of :data:`FAMILIES` and per batch size, the value with the highest predicted tok/s (ties: the
    first in order); also ``"any"``: the best non-oracle policy. Empty without a step-time model."""
    out: dict[str, dict[int, PolicyResult]] = {}
    for fam in (*FAMILIES, "any"):
        pool = [r for r in results if (r.spec.kind == fam if fam != "any" else not r.spec.kind.startswith("oracle"))]
        best: dict[int, PolicyResult] = {}
        for r in pool:
            for b, m in r.by_batch.items():
                cur = best.get(b)
                if m.tok_s is not None and (cur is None or m.tok_s > (cur.by_batch[b].tok_s or -1.0)):
                    best[b] = r
        if best:
            out[fam] = best
    return out
