"""The learning-rate schedule both draft trainers use: linear warm-up, then cosine decay to a floor.

``spectune draft train`` (:mod:`spectune.draft.train`: ``TrainConfig.warmup_steps`` of warm-up, decay to 10% of the
peak) and ``spectune draft accept-train`` (:mod:`spectune.draft.acceptance_train`: 5% of the steps warm-up, decay to
0) differ only in those two numbers.
"""

from __future__ import annotations

import math


def warmup_cosine(step: int, total: int, peak: float, warmup: int, floor: float = 0.0) -> float:
    """The learning rate at optimiser step ``step`` (0-based) of ``total``: ``peak * (step + 1) / warmup`` during the
    first ``warmup`` steps, then ``peak * (floor + (1 - floor) * (1 + cos(pi * f)) / 2)`` with f the fraction of the
    remaining steps taken (held at 1 past ``total``); ``floor`` is the share of ``peak`` it ends at.

    Raises:
        ValueError: ``warmup`` is below 1.
    """
    if warmup < 1:
        raise ValueError(f"warmup must be at least 1 step, got {warmup}")
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
