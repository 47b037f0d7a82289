"""Synthetic verify-step traces in the full format (per-row draft probabilities, context, draft and verify times)
for the ``simulate --policy`` tests: what an engine recording at the configured maximum writes, with acceptance
that follows the draft probabilities (a calibrated drafter) and round times from a known linear step-time model."""

from __future__ import annotations

import numpy as np

from spectune.backends.num_steps.trace import TraceStep

# ms: draft = D * (D_STEP + D_ROW * b); verify = V_FIXED + V_PADDED * b * W + V_CTX * W * C / 1000
D_STEP, D_ROW, V_FIXED, V_PADDED, V_CTX = 0.6, 0.05, 9.0, 0.25, 0.02


def synthetic_trace(seed: int = 0, rounds: int = 120, num_steps: int = 5, batch_sizes=(1, 2, 4, 8),
                    with_accept_probs: bool = False, noise: float = 0.0) -> list[TraceStep]:
    """``rounds`` rounds cycling through ``batch_sizes``; every row drafts ``num_steps`` tokens; a row's draft token
    at position j is accepted with its draft probability (independent draws, first rejection ends the row); the
    acceptance head, when asked for, reports the probability with a little noise; times from the model above with
    relative Gaussian ``noise``."""
    rng = np.random.default_rng(seed)
    steps = []
    for r in range(rounds):
        b = batch_sizes[r % len(batch_sizes)]
        probs = np.round(rng.beta(4.0, 1.5, size=(b, num_steps)), 4)
        accepted = []
        for row in probs:
            a = 0
            while a < num_steps and rng.random() < row[a]:
                a += 1
            accepted.append(a)
        head = np.round(np.clip(probs + rng.normal(0, 0.05, probs.shape), 0, 1), 4) if with_accept_probs else None
        ctx = rng.integers(20, 900, size=b)
        w = num_steps + 1
        draft = num_steps * (D_STEP + D_ROW * b)
        verify = V_FIXED + V_PADDED * b * w + V_CTX * w * ctx.sum() / 1000
        if noise:
            draft *= 1 + rng.normal(0, noise)
            verify *= 1 + rng.normal(0, noise)
        steps.append(TraceStep(b, tuple(accepted), num_steps, None, None,
                               tuple(tuple(map(float, row)) for row in probs),
                               None if head is None else tuple(tuple(map(float, row)) for row in head),
                               tuple(int(c) for c in ctx), round(float(draft), 4), round(float(verify), 4)))
    return steps
