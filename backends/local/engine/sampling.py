"""Verification of chain drafts: greedy, and lossless speculative sampling for a greedy (point-mass) drafter.

Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) with a deterministic draft d_j: accept d_j with
probability p_j(d_j) under the target's (temperature / top-k / top-p adjusted) distribution p_j; at the first
rejection sample from p_j with d_j removed and renormalised; if all K drafts are accepted sample the bonus token from
p_K. Each emitted token is then distributed exactly as p. Greedy verification accepts d_j iff it equals argmax p_j.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplingTensors:
    """Per-row sampling parameters of a batch.

    Attributes:
        temperature: [B, 1, 1] float32; 0 means greedy.
        top_k: [B] long; 0 disables.
        top_p: [B] float32; 1.0 disables.
        any_sampling, any_filter: whether any row samples / uses top-k or top-p (to skip work).
        generators: per row, the request's own :class:`torch.Generator` (a seeded request) or None (the shared
            one); None when no row has its own.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    any_sampling: bool
    any_filter: bool
    generators: list[torch.Generator | None] | None = None

    @classmethod
    def build(cls, temps: list[float], top_ks: list[int], top_ps: list[float], device: torch.device,
              generators: list[torch.Generator | None] | None = None) -> "SamplingTensors":
        """From per-sequence Python values."""
        return cls(
            temperature=torch.tensor(temps, dtype=torch.float32, device=device).view(-1, 1, 1),
            top_k=torch.tensor(top_ks, dtype=torch.long, device=device),
            top_p=torch.tensor(top_ps, dtype=torch.float32, device=device),
            any_sampling=any(t > 0 for t in temps),
            any_filter=any(k > 0 for k in top_ks) or any(p < 1.0 for p in top_ps),
            generators=generators if generators and any(g is not None for g in generators) else None,
        )

    def own_generators(self) -> list[tuple[int, torch.Generator]]:
        """(row, generator) of the rows that draw from their own generator."""
        return [(i, g) for i, g in enumerate(self.generators or []) if g is not None]


def target_probs(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """Target distributions after temperature, top-k and top-p: logits [B, S, V] -> probs [B, S, V] (float32).

    Rows with temperature 0 get a one-hot distribution on the argmax.
    """
    temp = st.temperature.clamp_min(1e-5)
    scaled = logits / temp
    if st.any_filter:
        b, s, v = scaled.shape
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        ranks = torch.arange(v, device=logits.device).view(1, 1, v)
        k = torch.where(st.top_k > 0, st.top_k, torch.full_like(st.top_k, v)).view(b, 1, 1)
        drop = ranks >= k
        sorted_probs = sorted_logits.softmax(dim=-1)
        drop |= (sorted_probs.cumsum(dim=-1) - sorted_probs) > st.top_p.view(b, 1, 1)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        scaled = torch.empty_like(scaled).scatter_(-1, order, sorted_logits)
    probs = scaled.softmax(dim=-1)
    greedy = (st.temperature.view(-1) <= 0)
    if bool(greedy.any()):
        onehot = torch.zeros_like(probs).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy.view(-1, 1, 1), onehot, probs)
    return probs


def verify(
    logits: torch.Tensor, drafts: torch.Tensor, st: SamplingTensors, generator: torch.Generator | None = None,
    lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept a prefix of each row's drafts and append one target token.

    Args:
        logits: target logits at the K+1 verified positions, [B, K+1, V] float32 (position j predicts the token
            after input j; input 0 is the last committed token, inputs 1..K the drafts).
        drafts: [B, K] draft tokens (K may be 0).
        st: sampling parameters.
        generator: random source for sampling rows (rows with their own generator in ``st`` draw from it).
        lengths: [B] long, row b's own draft length L_b <= K (per-row drafting; positions past L_b are padding and
            never accepted: the bonus token comes from p_{L_b}), or None: every row drafted K.

    Returns:
        accepted [B] long: number of accepted drafts a (0..L_b); tokens [B, K+1] long: the emitted tokens are
        tokens[b, :a+1] (the accepted drafts, then the bonus/correction token).
    """
    b, k1, _ = logits.shape
    k = k1 - 1
    greedy_tokens = logits.argmax(dim=-1)  # [B, K+1]
    valid = None if lengths is None else \
        torch.arange(k, device=logits.device).unsqueeze(0) < lengths.unsqueeze(1)  # [B, K]
    if not st.any_sampling:
        match = drafts == greedy_tokens[:, :k]  # [B, K]
        accepted = (match if valid is None else match & valid).long().cumprod(dim=1).sum(dim=1)
        return accepted, greedy_tokens
    probs = target_probs(logits, st)  # [B, K+1, V]
    if k > 0:
        p_draft = probs[:, :k].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)  # [B, K]
        u = torch.rand(p_draft.shape, generator=generator, device=logits.device)
        for i, g in st.own_generators():
            u[i] = torch.rand(k, generator=g, device=logits.device)
        hit = u < p_draft
        accepted = (hit if valid is None else hit & valid).long().cumprod(dim=1).sum(dim=1)  # [B]
    else:
        accepted = torch.zeros(b, dtype=torch.long, device=logits.device)
    rows = torch.arange(b, device=logits.device)
    final = probs[rows, accepted].clone()  # [B, V]: p at the first rejected position, or p_{L_b}
    rejected = accepted < (k if lengths is None else lengths)  # a real rejection, not the end of a row's drafts
    if k > 0 and bool(rejected.any()):
        bad = drafts[rows, accepted.clamp_max(k - 1)]
        final[rows[rejected], bad[rejected]] = 0.0
        final = final / final.sum(dim=-1, keepdim=True).clamp_min(1e-30)
    sampled = torch.multinomial(final, 1, generator=generator)  # [B, 1]
    for i, g in st.own_generators():
        sampled[i] = torch.multinomial(final[i], 1, generator=g)
    if k == 0:
        return accepted, sampled
    tokens = torch.cat([drafts, sampled], dim=1)  # [B, K+1]
    tokens[rows, accepted] = sampled[:, 0]  # greedy rows have one-hot probs, so they follow the greedy rule exactly
    return accepted, tokens
