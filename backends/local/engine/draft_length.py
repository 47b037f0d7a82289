"""Draft length per row from the drafter's confidence: the engine side of the ``p_min`` and ``specdec`` strategies.

Every row of a round drafts until its own rule says stop, at most ``n_max`` tokens; the round's draft loop runs
until every row stopped (on CPU, where reading a flag costs nothing) or ``n_max`` steps (on CUDA, so no host read per
draft step), and the target verifies each row's own length in one forward padded to the longest row
(:meth:`~spectune.backends.local.engine.speculative.SpeculativeDecoder.decode_round`; the verifier accepts at most a
row's length: :func:`~spectune.backends.local.engine.sampling.verify`).

- ``p_min`` (llama.cpp ``--spec-draft-p-min``, ``common/speculative.cpp``, ``common_speculative_impl_draft_eagle3``,
  release 11434: ``if (cur_p->data[0].p < params.p_min) { drafting[seq_id] = false; ... continue; }``): a row stops
  at the first draft token whose confidence is under ``p_min``; that token is not drafted.
- ``specdec`` (SpecDec++, Huang et al. 2024, section 4: stop once P(at least one rejection) = 1 - prod_{i<=t} p_i
  exceeds the threshold h): after drafting token t a row stops when ``1 - prod_{i<=t} p_i > h``; token t is kept.
  ``p_i`` is the acceptance head's prediction (:mod:`spectune.backends.local.model.acceptance`) or, without one,
  the draft confidence.

The confidence is :meth:`~spectune.backends.local.model.eagle.DraftHead.draft_with_prob` (softmax over the 10 largest
draft logits, as llama.cpp's drafter reads it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from spectune.backends.num_steps.confidence_config import ConfidenceConfig


class DraftRule:
    """The per-row stopping rule of one round (state lives on the engine's device).

    Args:
        strategy: ``"p_min"`` or ``"specdec"``.
        threshold: p_min, or SpecDec++'s h, in [0, 1].
        n_max: the most draft tokens per row and round (>= 1).
        acceptance: an acceptance-prediction head ``(feature [B, H], prob [B]) -> p_hat [B]`` (specdec), or None.

    Use per round: :meth:`begin`, then :meth:`observe` once per draft step; :attr:`lengths` [B] long holds each
    row's draft length, :attr:`active` [B] bool the rows still drafting; :meth:`verify_lengths` gives the lengths to
    verify (the same; :class:`~spectune.backends.local.engine.specserve.SpecServeRule` drops tokens there).
    """

    def __init__(self, strategy: str, threshold: float, n_max: int, acceptance: torch.nn.Module | None = None) -> None:
        if strategy not in ("p_min", "specdec"):
            raise ValueError(f"unknown draft-length strategy {strategy!r}: use p_min or specdec")
        self.strategy, self.threshold, self.n_max, self.acceptance = strategy, float(threshold), int(n_max), acceptance
        self.active = self.lengths = self.survive = torch.zeros(0)

    @classmethod
    def from_config(cls, cfg: ConfidenceConfig, acceptance: torch.nn.Module | None = None) -> DraftRule:
        """The rule a parsed ``p_min`` / ``specdec`` config asks for (the acceptance head loaded by the caller)."""
        return cls(cfg.strategy, cfg.threshold, cfg.n_max, acceptance)

    def describe(self) -> str:
        """One line, e.g. ``p_min 0.6, n_max 4``."""
        name = "p_min" if self.strategy == "p_min" else "specdec threshold"
        head = "" if self.strategy == "p_min" else (", acceptance head" if self.acceptance is not None
                                                    else ", raw draft confidence")
        return f"{name} {self.threshold:g}, n_max {self.n_max}{head}"

    def to_json(self) -> dict[str, object]:
        """``/server_info`` ``draft_length``: the strategy, its threshold, n_max, whether an acceptance head is read."""
        return {"strategy": self.strategy, "threshold": self.threshold, "n_max": self.n_max,
                "acceptance_head": self.acceptance is not None}

    def begin(self, batch: int, device: torch.device, context: torch.Tensor | None = None) -> None:
        """Start a round for ``batch`` rows: all drafting, lengths 0, survival probability 1 (``context``, the rows'
        cached tokens, is not read by these rules)."""
        self.active = torch.ones(batch, dtype=torch.bool, device=device)  # [B]
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # [B]
        self.survive = torch.ones(batch, dtype=torch.float32, device=device)  # [B]: prod p_i so far

    def observe(self, feature: torch.Tensor, prob: torch.Tensor) -> torch.Tensor | None:
        """Account one draft step: ``feature`` [B, H] the head output that drafted the token, ``prob`` [B] its
        confidence. Updates :attr:`lengths` and :attr:`active`; returns the acceptance head's p_hat [B] (float32)
        when one is loaded, else None."""
        p_hat = self.acceptance(feature, prob).float() if self.acceptance is not None else None
        if self.strategy == "p_min":
            self.active &= prob >= self.threshold  # the token under p_min is not drafted
            self.lengths += self.active
        else:
            self.lengths += self.active  # the token is drafted, then the row may stop
            self.survive *= p_hat if p_hat is not None else prob.float()
            self.active &= (1.0 - self.survive) <= self.threshold
        return p_hat

    def verify_lengths(self, layout: str = "padded") -> torch.Tensor:
        """Each row's length to verify [B] long: its drafted length, whatever the target's ``layout``."""
        return self.lengths.clone()
