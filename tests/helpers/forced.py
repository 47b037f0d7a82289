"""Teacher-forced acceptance: the bundled engine's drafts scored against fixed reference continuations.

Free-running greedy decoding on two devices drifts apart: a near-tie that rounds the other way sends a whole
trajectory elsewhere, and the acceptance length moves with it (2.1% between an H200 and a CPU on MT-Bench). Forcing
every row onto one reference continuation leaves only the drafting to compare: the target still runs every verify
and feeds the head its real features, the head drafts K tokens as the engine does, but the tokens a round commits
are the reference's (its first a + 1, a = how many leading drafts equal the reference) instead of the target's
argmax. With the target's own greedy output as the reference this is exactly free-running greedy decoding.
"""

from __future__ import annotations

import torch

from spectune.backends.local.engine import speculative
from spectune.backends.local.engine.sampling import SamplingTensors


class ForcedVerify:
    """A stand-in for :func:`~spectune.backends.local.engine.sampling.verify` that commits reference tokens.

    Args:
        references: per prompt, the continuation to commit (at least ``tokens + K`` tokens).
        tokens: a prompt's rounds count while fewer than this many of its tokens are committed.

    Attributes:
        rows: the prompt in each running row (slot) of the next call; the caller keeps it in step with slot moves.
        committed: tokens committed per prompt.
    """

    def __init__(self, references: list[list[int]], tokens: int) -> None:
        self.references, self.tokens = references, tokens
        self.rows = list(range(len(references)))
        self.committed = [0] * len(references)
        self.rounds = self.accepted = 0

    def __call__(self, logits: torch.Tensor, drafts: torch.Tensor, st: SamplingTensors,
                 generator: torch.Generator | None = None, lengths: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        assert lengths is None, "forced verification runs static num_steps only"
        b, k = drafts.shape
        ref = torch.tensor([self.references[p][self.committed[p]:self.committed[p] + k + 1] for p in self.rows[:b]],
                           device=drafts.device)  # [B, K+1]
        accepted = (drafts == ref[:, :k]).long().cumprod(dim=1).sum(dim=1)  # [B]
        for p, a in zip(self.rows[:b], accepted.tolist()):
            if k > 0:
                self.rounds += 1
                self.accepted += a
            self.committed[p] += a + 1
        return accepted, ref

    @property
    def acceptance_length(self) -> float:
        """1 + accepted drafts / drafting rounds (the engine's count: every round of a request, its last included)."""
        return 1.0 + self.accepted / max(self.rounds, 1)


def forced_acceptance(decoder: speculative.SpeculativeDecoder, prompts: list[list[int]],
                      references: list[list[int]], k: int, tokens: int) -> float:
    """The acceptance length of ``decoder`` at num_steps ``k``, greedy, every prompt forced onto its reference
    continuation until ``tokens`` of its tokens are committed. All prompts are prefilled together into slots
    0..N-1 and leave as they finish, the last row moving into the freed slot, as the engine runs them.

    Raises:
        ValueError: a reference shorter than ``tokens + k``.
    """
    if any(len(r) < tokens + k for r in references):
        raise ValueError(f"references must hold tokens + k = {tokens + k} tokens")
    forced = ForcedVerify(references, tokens)

    def greedy(n: int) -> SamplingTensors:
        return SamplingTensors.build([0.0] * n, [0] * n, [1.0] * n, decoder.device)

    real, speculative.verify = speculative.verify, forced
    try:
        batch = len(prompts)
        decoder.prefill(list(range(batch)), prompts, greedy(batch), draft=True)
        while batch:
            decoder.decode_round(batch, k, greedy(batch))
            slot = 0
            while slot < batch:
                if forced.committed[forced.rows[slot]] < tokens:
                    slot += 1
                    continue
                batch -= 1
                if slot < batch:  # the last row fills the hole
                    decoder.move_slot(batch, slot)
                    forced.rows[slot] = forced.rows[batch]
    finally:
        speculative.verify = real
    return forced.acceptance_length
