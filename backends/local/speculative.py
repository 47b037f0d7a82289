"""The speculative decoding step: chain drafting with an EAGLE head, one target verify, draft extend.

State per running sequence (slot b): the target KV covers positions 0..m-1, ``last_token`` x_m is committed but not
yet run through the target, and (when drafting) the head has run its entry (x_m, f_{m-1}), whose output feature is
``draft_feature``. A round with K drafts:

1. draft d_1 = argmax of the head's logits on ``draft_feature``, then d_2..d_K: the head's entry at position m+j-1
   reads (d_j, its previous output feature);
2. verify: the target runs [x_m, d_1..d_K] at positions m..m+K -> K+1 distributions; accept a prefix of a drafts and
   emit a+1 tokens x_{m+1..m+a+1} (:func:`~backends.local.sampling.verify`);
3. draft extend: the head re-runs entries m..m+K on (x_{p+1}, f_p) with the target's real features; the entry at
   m+a yields the feature for the next round's d_1 (EAGLE's draft extend fused with the next round's first step).
   d_1 is taken from that feature only when a round drafts, so K = 0 rounds that keep the head current never pay for
   the draft lm_head.

KV entries past the accepted prefix are stale but never visible: the next round overwrites them before any query
at a later position reads them (the static cache is addressed by position). K = 0 is plain decoding with no draft
work at all.
"""

from __future__ import annotations

import torch

from backends.local.attention import AttnMeta
from backends.local.cuda_graphs import GraphRunner
from backends.local.eagle import DraftHead
from backends.local.kv_cache import KVCache
from backends.local.model import TargetModel
from backends.local.sampling import SamplingTensors, verify


class SpecRunner:
    """Runs prefill and decode rounds for sequences living in cache slots 0..B-1.

    Args:
        target: the target model (RoPE built).
        head: the draft head, or None for plain decoding only.
        num_slots, max_len: cache geometry (slots = the most sequences at once; tokens per slot).
        generator: random source for sampling.
        graphs: a :class:`GraphRunner` to run decode-shaped forwards on padded, captured shapes (CUDA graphs), or
            None for plain eager forwards.
    """

    def __init__(
        self,
        target: TargetModel,
        head: DraftHead | None,
        num_slots: int,
        max_len: int,
        generator: torch.Generator | None = None,
        graphs: GraphRunner | None = None,
    ) -> None:
        c = target.cfg
        dev, dt = target.embed_tokens.weight.device, target.embed_tokens.weight.dtype
        self.target, self.head, self.device = target, head, dev
        self.generator, self.graphs = generator, graphs
        self.group = c.num_heads // c.num_kv_heads
        self.target_cache = KVCache(c.num_layers, num_slots, max_len, c.num_kv_heads, c.head_dim, dt, dev)
        self.last_token = torch.zeros(num_slots, dtype=torch.long, device=dev)
        self.seq_len = torch.zeros(num_slots, dtype=torch.long, device=dev)
        if head is not None:
            d = head.cfg
            self.draft_group = d.num_heads // d.num_kv_heads
            self.draft_cache = KVCache(d.num_layers, num_slots, max_len, d.num_kv_heads, d.head_dim, dt, dev)
            self.draft_feature = torch.zeros(num_slots, d.hidden_size, dtype=dt, device=dev)

    def _features(self, hidden: torch.Tensor, aux: torch.Tensor | None) -> torch.Tensor:
        return aux if self.head is not None and self.head.cfg.kind == "eagle3" else hidden

    def _target_fwd(self, tokens: torch.Tensor, pos: torch.Tensor, _: object = None, kv: int | None = None) -> tuple:
        return self.target(tokens, AttnMeta.for_batch(self.target_cache, self.target.rope, pos, self.group, kv))

    def _draft_fwd(self, tokens: torch.Tensor, pos: torch.Tensor, feats: torch.Tensor, kv: int | None = None
                   ) -> torch.Tensor:
        return self.head(tokens, feats, AttnMeta.for_batch(self.draft_cache, self.head.rope, pos, self.draft_group, kv))

    def _run(self, name: str, fwd, tokens: torch.Tensor, pos: torch.Tensor, feats: torch.Tensor | None = None):
        if self.graphs is None:
            return fwd(tokens, pos, feats)
        return self.graphs.run(name, fwd, tokens, pos, feats)

    @torch.inference_mode()
    def prefill(self, slot: int, prompt: list[int], st: SamplingTensors, draft: bool) -> int:
        """Run a fresh prompt x_0..x_{n-1} into ``slot``; returns the first output token x_n.

        With ``draft`` the head also runs its entries 0..n-1 on (x_{p+1}, f_p), leaving the feature for d_1.
        """
        n = len(prompt)
        tokens = torch.tensor([prompt], dtype=torch.long, device=self.device)  # [1, n]
        hidden, aux = self.target(tokens, AttnMeta.for_prefill(self.target_cache, self.target.rope, slot, n))
        logits = self.target.logits(hidden[:, -1:])  # [1, 1, V]
        _, first = verify(logits, tokens[:, :0], st, self.generator)  # [1, 1]
        self.last_token[slot], self.seq_len[slot] = first[0, 0], n
        if draft:
            shifted = torch.cat([tokens[:, 1:], first], dim=1)  # [1, n]: x_1..x_n
            feats = self._features(hidden, aux)  # [1, n, F]
            out = self.head(shifted, feats, AttnMeta.for_prefill(self.draft_cache, self.head.rope, slot, n))
            self.draft_feature[slot] = out[0, -1]
        return int(first[0, 0])

    @torch.inference_mode()
    def decode_round(self, batch: int, k: int, st: SamplingTensors, keep_draft: bool = False) -> tuple[list[int], list[list[int]]]:
        """One round for slots 0..batch-1 with ``k`` drafts each (0 = plain decoding).

        ``keep_draft`` (K = 0 only) still runs the one-entry draft extend so the head stays current, for adaptive
        mode where later rounds draft again.

        Returns:
            accepted drafts per sequence, and per sequence the a+1 emitted tokens.
        """
        b, dev = batch, self.device
        m = self.seq_len[:b]  # [B]
        drafts = [self.head.draft_tokens(self.draft_feature[:b])] if k > 0 else []  # list of [B]: d_1
        if k > 1:
            feat = self.draft_feature[:b].unsqueeze(1)  # [B, 1, H]
            for j in range(1, k):  # entry (d_j, feature) at position m + j - 1
                pos = (m + (j - 1)).view(b, 1)
                out = self._run("draft", self._draft_fwd, drafts[-1].view(b, 1), pos, feat)  # [B, 1, H]
                feat = out
                drafts.append(self.head.draft_tokens(out[:, 0]))
        d = torch.stack(drafts, dim=1) if k > 0 else torch.zeros(b, 0, dtype=torch.long, device=dev)  # [B, K]
        inputs = torch.cat([self.last_token[:b].unsqueeze(1), d], dim=1)  # [B, K+1]
        pos = m.unsqueeze(1) + torch.arange(k + 1, device=dev)  # [B, K+1]
        hidden, aux = self._run("target", self._target_fwd, inputs, pos)
        accepted, tokens = verify(self.target.logits(hidden), d, st, self.generator)  # [B], [B, K+1]
        rows = torch.arange(b, device=dev)
        if k > 0 or keep_draft:  # draft extend on (x_{p+1}, f_p), p = m..m+K; entry m+a feeds the next d_1
            out = self._run("extend", self._draft_fwd, tokens, pos, self._features(hidden, aux))  # [B, K+1, H]
            self.draft_feature[:b] = out[rows, accepted]  # [B, H]
        self.last_token[:b] = tokens[rows, accepted]
        self.seq_len[:b] = m + accepted + 1
        acc = accepted.tolist()
        toks = tokens.tolist()
        return acc, [row[: a + 1] for row, a in zip(toks, acc)]

    def move_slot(self, src: int, dst: int) -> None:
        """Move a running sequence from slot ``src`` to ``dst`` (cache rows and state)."""
        length = min(int(self.seq_len[src]) + 1, self.target_cache.max_len)
        self.target_cache.move_slot(src, dst, length)
        self.last_token[dst], self.seq_len[dst] = self.last_token[src], self.seq_len[src]
        if self.head is not None:
            self.draft_cache.move_slot(src, dst, length)
            self.draft_feature[dst] = self.draft_feature[src]
