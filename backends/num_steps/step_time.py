"""SpecServe's step-time model of a speculative round, for the drafter and the target separately.

Source: Huang et al., "SpecServe: Efficient and SLO-Aware Large Language Model Serving with Adaptive Speculative
Decoding", section 4.1. A forward over a batch costs

    T_fwd(N_c, N_b) = alpha * N_c + gamma * N_b + delta                                        (Eq. 2)

where N_b is the batch tokens (query tokens of the forward, all rows) and N_c the context tokens (summed over the
query tokens: the cached tokens each one attends over); a round of SL drafts costs T_sd = T_d + T_v (Eq. 1), the
drafter's SL forwards (Eq. 3-4) and one target forward over every row's SL + 1 tokens (Eq. 5-6).

How a round of the bundled engine maps onto it (:meth:`~spectune.backends.local.engine.speculative.
SpeculativeDecoder.decode_round`): EAGLE takes d_1 from the previous round's draft extend, so a round of SL drafts runs
SL - 1 draft steps of ``batch`` rows, then the target verify and the draft extend, a head forward over the verified
tokens (the same N_c and N_b as the verify), whose lm_head at each row's last position is the next round's d_1. The
drafter's coefficients cost both kinds of head forward (:mod:`spectune.backends.local.engine.step_time_probe` times
each with its lm_head over ``batch`` rows). The round's own work outside the forwards (verification, host reads) is
not modelled: the paper's model has no such term, and ``delta`` absorbs what is per forward.

The functions take plain numbers or tensors alike (arithmetic only), so the engine evaluates them on the device with no
host read. Pure Python with numpy for the fit: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence, Union

import numpy as np

if TYPE_CHECKING:
    import torch

Amount = Union[float, "np.ndarray", "torch.Tensor"]
"""A token count or a time in ms: a number, or an array or tensor of them (elementwise arithmetic)."""


@dataclass(frozen=True)
class ForwardCost:
    """One model's forward time, Eq. 2: ``alpha_ms * N_c + gamma_ms * N_b + delta_ms`` (ms).

    Attributes:
        alpha_ms: ms per context token (a query token times a cached token it attends over).
        gamma_ms: ms per batch token (a query token of the forward).
        delta_ms: ms per forward.
    """

    alpha_ms: float
    gamma_ms: float
    delta_ms: float

    def ms(self, context_tokens: Amount, batch_tokens: Amount) -> Amount:
        """The forward's time in ms (numbers or tensors of the same shape)."""
        return self.alpha_ms * context_tokens + self.gamma_ms * batch_tokens + self.delta_ms

    @classmethod
    def fit(cls, samples: Sequence[tuple[float, float, float]]) -> ForwardCost:
        """Least squares over timed forwards ``(N_c, N_b, ms)``; a coefficient the fit makes negative (noise on a
        term too small to measure) is set to 0 and the others refitted without it.

        Raises:
            ValueError: fewer than 3 samples, or samples that do not vary N_c and N_b independently (rank < 3).
        """
        data = np.asarray(samples, dtype=np.float64).reshape(-1, 3)
        design = np.column_stack([data[:, 0], data[:, 1], np.ones(len(data))])
        if len(data) < 3 or np.linalg.matrix_rank(design) < 3:
            raise ValueError(f"the step-time fit needs forwards that vary context and batch tokens independently "
                             f"(3 unknowns), got {len(data)} sample(s) of rank {np.linalg.matrix_rank(design)}")
        keep = [0, 1, 2]
        coef = np.zeros(3)
        while True:
            sol, *_ = np.linalg.lstsq(design[:, keep], data[:, 2], rcond=None)
            coef[:] = 0.0
            coef[keep] = sol
            negative = [i for i in keep if coef[i] < 0]
            if not negative:
                break
            keep.remove(min(negative, key=lambda i: coef[i]))
            if not keep:
                break
        return cls(float(coef[0]), float(coef[1]), float(coef[2]))

    def to_json(self) -> dict[str, float]:
        """``{"alpha_ms", "gamma_ms", "delta_ms"}``."""
        return {"alpha_ms": self.alpha_ms, "gamma_ms": self.gamma_ms, "delta_ms": self.delta_ms}

    @classmethod
    def from_json(cls, obj: dict[str, float]) -> ForwardCost:
        """The inverse of :meth:`to_json` (KeyError / TypeError on a malformed object)."""
        return cls(float(obj["alpha_ms"]), float(obj["gamma_ms"]), float(obj["delta_ms"]))


def verify_tokens(context: Amount, batch: Amount, width: Amount) -> tuple[Amount, Amount]:
    """(N_c, N_b) of a forward over ``width`` query tokens per row for ``batch`` rows whose cached tokens sum to
    ``context``: query token q (0-based) of a row attends over its cached tokens plus q (Eq. 6 written per row)."""
    return width * context + batch * width * (width - 1) / 2, batch * width


@dataclass(frozen=True)
class StepTimeModel:
    """The round time of the bundled engine in SpecServe's model (see the module docstring).

    Attributes:
        draft: the draft head's forward (a draft step, or the draft extend), Eq. 3.
        target: the target's verify forward, Eq. 5.
    """

    draft: ForwardCost
    target: ForwardCost

    def draft_ms(self, context: Amount, batch: Amount, drafts: int) -> Amount:
        """ms of the draft steps a round of ``drafts`` drafts per row runs: ``drafts - 1`` head forwards of
        ``batch`` rows (d_1 comes with the previous round's draft extend), the i-th attending over ``context`` +
        ``batch * i`` cached tokens (Eq. 4); 0 for 0 or 1 drafts."""
        n = max(int(drafts) - 1, 0)
        d = self.draft
        return n * (d.gamma_ms * batch + d.delta_ms) + d.alpha_ms * (n * context + batch * n * (n + 1) / 2)

    def verify_ms(self, context_tokens: Amount, batch_tokens: Amount) -> Amount:
        """ms of the target verify and the draft extend over the same tokens (Eq. 5 plus EAGLE's extend)."""
        return self.target.ms(context_tokens, batch_tokens) + self.draft.ms(context_tokens, batch_tokens)

    def round_ms(self, context: Amount, batch: Amount, drafts: int) -> Amount:
        """T_sd (Eq. 1) of a round where each of ``batch`` rows, their cached tokens summing to ``context``, drafts
        and verifies ``drafts`` tokens."""
        n_c, n_b = verify_tokens(context, batch, int(drafts) + 1)
        return self.draft_ms(context, batch, drafts) + self.verify_ms(n_c, n_b)

    def to_json(self) -> dict[str, dict[str, float]]:
        """``{"draft": {...}, "target": {...}}`` (:meth:`ForwardCost.to_json` each)."""
        return {"draft": self.draft.to_json(), "target": self.target.to_json()}

    @classmethod
    def from_json(cls, obj: dict[str, dict[str, float]]) -> StepTimeModel:
        """The inverse of :meth:`to_json` (KeyError / TypeError on a malformed object)."""
        return cls(ForwardCost.from_json(obj["draft"]), ForwardCost.from_json(obj["target"]))
