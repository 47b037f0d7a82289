"""SpecServe replayed on a trace (``spectune simulate --policy specserve``): the bundled engine's own drafter,
verifier and SLO check, with the replay's round times.

Source: Huang et al., "SpecServe: Efficient and SLO-Aware Large Language Model Serving with Adaptive Speculative
Decoding", sections 4-5; the engine's implementation is :class:`~spectune.backends.local.engine.specserve.
SpecServeRule` (Alg. 1 adaptive drafter, Alg. 2 confidence-prior verifier, Alg. 3 SLO check), which this module
runs unchanged round by round. Only its two time queries are answered from the replay's step-time model
(:mod:`spectune.tune.step_time`, the model every replayed policy is timed with) instead of the engine's start-up
calibration:

- the drafter's round of j drafts for every row (:meth:`ReplaySpecServe.uniform_ms`) is a round of D = j draft
  steps, width W = j + 1, V = b (j + 1) verified tokens and the round's recorded context C;
- a verifier candidate (:meth:`ReplaySpecServe.candidates_ms`) is a round of the D draft steps already run, width
  max L_i + 1 and V = sum(L_i + 1).

So the SLO check bounds the very round time the replay scores: with ``slo_tpot_ms`` no replayed round is predicted
over it, unless even the shortest candidate (one draft step run, nothing verified but the bonus token) is.

Per recorded round of batch b the rule is fed, step by step, every row's recorded ``draft_probs`` at that position
(the drafted token's confidence, Eq. 8), at most n_max steps (``--n-max``, else the round's recorded num_steps) and
at most the positions every row of the round recorded: where the rule would draft on past them, the round is cut
there and its rows counted as ``past_recorded``. The verifier drops whole columns (the engine's default ``padded``
verify layout, :attr:`~spectune.backends.local.engine.speculative.SpeculativeDecoder.verify_layout`). The rule reads
the rows' summed context only (padded layout), so each row is given the round's mean.
"""

from __future__ import annotations

import numpy as np
import torch

from spectune.backends.local.engine.specserve import SpecServeRule
from spectune.tune.draft_policies import TraceArrays, require_draft_probs
from spectune.tune.step_time import StepTimeModel

LAYOUT = "padded"
"""The verify layout the replay's verifier drops tokens for (the bundled engine's default)."""


class ReplaySpecServe(SpecServeRule):
    """:class:`SpecServeRule` whose round times come from a replay step-time model (``model``: ms per round
    shape, :class:`spectune.tune.step_time.StepTimeModel`); everything else is the engine's."""

    def __init__(self, model: StepTimeModel, n_max: int, slo_tpot_ms: float | None = None) -> None:
        super().__init__(model, n_max, slo_tpot_ms)  # type: ignore[arg-type]  # only the two methods below read it
        self.replay_model = model

    def _round_ms(self, draft_steps: np.ndarray, width: np.ndarray, verified: np.ndarray) -> torch.Tensor:
        n = len(width)
        ms = self.replay_model.round_ms(np.full(n, float(self.batch)), draft_steps, width, verified,
                                        np.full(n, float(self.context.sum())))
        return torch.as_tensor(np.asarray(ms, dtype=np.float64))

    def uniform_ms(self, drafts: int) -> torch.Tensor:
        """Predicted round time (ms, 0-d) when every row drafts and verifies ``drafts`` tokens."""
        d = float(drafts)
        return self._round_ms(np.array([d]), np.array([d + 1]), np.array([self.batch * (d + 1)]))[0]

    def candidates_ms(self, steps: int, cand: torch.Tensor, layout: str) -> torch.Tensor:
        """Predicted round time (ms) [R+1] of each candidate ``cand`` [R+1, B] after ``steps`` draft steps
        (``layout`` is the replay's :data:`LAYOUT`: W = the longest row + 1, V = sum of rows + 1)."""
        c = cand.numpy().astype(np.float64)
        return self._round_ms(np.full(len(c), float(steps)), c.max(axis=1) + 1, (c + 1).sum(axis=1))


def specserve_lengths(arr: TraceArrays, model: StepTimeModel, n_max: int | None,
                      slo_tpot_ms: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Replay SpecServe on every round of ``arr`` (the module docstring).

    Returns:
        (L_i per row [N] int64, draft steps D per round [R] int64, past_recorded per row [N] bool).

    Raises:
        UserError: the trace lacks ``draft_probs`` for a round that drafted.
    """
    require_draft_probs(arr, "specserve")
    lengths = np.zeros(len(arr.accepted), dtype=np.int64)
    steps = np.zeros(arr.rounds, dtype=np.int64)
    past = np.zeros(len(arr.accepted), dtype=bool)
    probs = torch.from_numpy(np.nan_to_num(arr.draft_probs, nan=0.0).astype(np.float32))  # [N, P]
    cpu = torch.device("cpu")
    with torch.no_grad():
        for r in range(arr.rounds):
            b, i0 = int(arr.batch[r]), int(arr.start[r])
            cap = int(arr.num_steps[r]) if n_max is None else int(n_max)
            recorded = int(arr.positions[i0:i0 + b].min())
            if cap < 1 or recorded < 1:
                continue
            rule = ReplaySpecServe(model, cap, slo_tpot_ms)
            rule.begin(b, cpu, torch.full((b,), float(arr.context[r]) / b))
            j = 0
            while j < min(cap, recorded):
                rule.observe(probs[i0:i0 + b, j], probs[i0:i0 + b, j])
                j += 1
                if not bool(rule.active.any()):
                    break
            lengths[i0:i0 + b] = rule.verify_lengths(LAYOUT).numpy()
            steps[r] = j
            past[i0:i0 + b] = j == recorded < cap and bool(rule.active.any())
    return lengths, steps, past
