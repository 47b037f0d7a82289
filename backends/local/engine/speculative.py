"""The speculative decoding step: chain drafting with an EAGLE head, one target verify, draft extend.

State per running sequence (slot b): the target KV covers positions 0..m-1, ``last_token`` x_m is committed but not
yet run through the target, and (when drafting) the head has run its entry (x_m, f_{m-1}), whose output feature is
``draft_feature``. A round with K drafts:

1. draft d_1 = argmax of the head's logits on ``draft_feature``, then d_2..d_K: the head's entry at position m+j-1
   reads (d_j, its previous output feature);
2. verify: the target runs [x_m, d_1..d_K] at positions m..m+K -> K+1 distributions; accept a prefix of a drafts and
   emit a+1 tokens x_{m+1..m+a+1} (:func:`~spectune.backends.local.engine.sampling.verify`);
3. draft extend: the head re-runs entries m..m+K on (x_{p+1}, f_p) with the target's real features; the entry at
   m+a yields the feature for the next round's d_1 (EAGLE's draft extend fused with the next round's first step).
   d_1 is taken from that feature only when a round drafts, so K = 0 rounds that keep the head current never pay for
   the draft lm_head.

KV entries past the accepted prefix are stale but never visible: the next round overwrites them before any query
at a later position reads them (the static cache is addressed by position). K = 0 is plain decoding with no draft
work at all.

Lazy drafting (``lazy_draft``, for adaptive num_steps): prefills and K = 0 rounds run no head at all; they only keep
the head's inputs (x_{p+1}, f_p) per position in ``feat_buf``/``tok_buf``. The first drafting round of a sequence
catches the head up on the positions it skipped (from ``draft_len`` to the sequence length, all lagging slots
packed into prefill-shaped head forwards), so a batch that stays at K = 0 costs what static K = 0 costs.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch

from spectune.backends.local.model.attention import AttnMeta
from spectune.backends.local.model.packed import Segment, packed_ends, packed_index
from spectune.backends.local.engine.cuda_graphs import CapturedGraphs
from spectune.backends.local.model.eagle import DraftHead
from spectune.backends.local.model.kv_cache import KVCache
from spectune.backends.local.model.target import TargetModel
from spectune.backends.local.engine.draft_length import DraftRule
from spectune.backends.local.engine.specserve import SpecServeRule
from spectune.backends.local.engine.sampling import SamplingTensors, verify


CATCH_UP_TOKENS = 8192
"""The most head entries one catch-up forward runs (packed over lagging slots); bounds its activations."""


@dataclass
class RoundInfo:
    """What the last decode round did, per row (read by the engine loop for counters and traces).

    Attributes:
        drafted: draft tokens each row submitted for verification.
        draft_steps: draft positions the round computed (>= max(drafted): with a per-row rule the loop runs until
            every row stopped, so a row that stops at position j still cost the batch j positions).
        draft_probs: per row, each drafted position's confidence (``DraftHead.draft_with_prob``), when recording.
        accept_probs: per row, the acceptance head's p_hat per position, when recording with a head loaded.
        draft_ms: ms spent drafting d_1..d_K (recording only, else 0).
        verify_ms: ms for the rest of the round: target verify forward, acceptance, draft extend (recording only).
    """

    drafted: list[int]
    draft_steps: int = 0
    draft_probs: list[list[float]] | None = None
    accept_probs: list[list[float]] | None = None
    draft_ms: float = 0.0
    verify_ms: float = 0.0


class SpeculativeDecoder:
    """Runs prefill and decode rounds for sequences living in cache slots 0..B-1.

    Args:
        target: the target model (RoPE built).
        head: the draft head, or None for plain decoding only.
        num_slots, max_len: cache geometry (slots = the most sequences at once; tokens per slot).
        generator: random source for sampling.
        graphs: a :class:`CapturedGraphs` to run decode-shaped forwards on padded, captured shapes (CUDA graphs), or
            None for plain eager forwards.
        lazy_draft: keep the head's inputs instead of running it in prefills and K = 0 rounds (see the module
            docstring); costs ``num_slots * max_len * feature_dim`` more cache elements.
        rule: a per-row draft-length rule (``p_min`` / ``specdec``: :class:`DraftRule`; ``specserve``:
            :class:`SpecServeRule`), or None: every row drafts the round's K.
        acceptance: an acceptance-prediction head whose p_hat a recorded round keeps (a rule brings its own).

    Attributes:
        record: when True each round drafts all K positions and times its parts (the engine's ``--trace``).
        verify_layout: how a round with per-row lengths runs the target: ``"padded"`` (every row to the longest
            row's width, one batched forward: the compiled decode path on CPU, captured graphs on CUDA) or
            ``"packed"`` (each row's own tokens only, one packed forward, eager); ``benchmarks/ragged_verify.py``
            compares them.
        last_round: :class:`RoundInfo` of the last decode round.
    """

    def __init__(
        self,
        target: TargetModel,
        head: DraftHead | None,
        num_slots: int,
        max_len: int,
        generator: torch.Generator | None = None,
        graphs: CapturedGraphs | None = None,
        lazy_draft: bool = False,
        rule: DraftRule | SpecServeRule | None = None,
        acceptance: torch.nn.Module | None = None,
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
        self.lazy = head is not None and lazy_draft
        self.rule = rule
        self.acceptance = rule.acceptance if rule is not None else acceptance
        self.record = False
        self.last_round = RoundInfo([])
        self.verify_layout = "padded"
        self.lengths = [0] * num_slots  # host copy of seq_len
        self.draft_len = [0] * num_slots  # lazy: head KV entries 0..draft_len-1 are current
        if self.lazy:
            self.feat_buf = torch.zeros(num_slots, max_len, head.feature_dim, dtype=dt, device=dev)  # f_p
            self.tok_buf = torch.zeros(num_slots, max_len, dtype=torch.long, device=dev)  # x_{p+1}

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
    def prefill(self, slots: list[int], prompts: list[list[int]], st: SamplingTensors, draft: bool) -> list[int]:
        """Run fresh prompts into their slots in one packed forward; returns each prompt's first output token.

        Prompt i, x_0..x_{n_i-1}, fills positions 0..n_i-1 of ``slots[i]``; its first output token is x_{n_i},
        sampled with row i of ``st``. The target (and with ``draft`` the head) runs once over all prompts' tokens
        concatenated, [1, sum(n_i)], attention per prompt (:mod:`spectune.backends.local.model.packed`), as
        production engines batch prefills instead of running one forward per request. With
        ``draft`` the head also runs its entries 0..n_i-1 on (x_{p+1}, f_p), leaving the feature for d_1.
        """
        lens = [len(p) for p in prompts]
        segments = [Segment(slot, 0, n) for slot, n in zip(slots, lens)]
        tokens = torch.tensor([list(itertools.chain.from_iterable(prompts))], dtype=torch.long,
                              device=self.device)  # [1, T]
        ends = packed_ends(segments, self.device)  # [N]: each prompt's last token
        rows = torch.tensor(slots, device=self.device)  # [N]
        hidden, aux = self.target(tokens, AttnMeta.for_packed(self.target_cache, self.target.rope, segments))
        logits = self.target.logits(hidden[0, ends].unsqueeze(1))  # [N, 1, V]
        _, first = verify(logits, tokens.new_zeros(len(slots), 0), st, self.generator)  # [N, 1]
        self.last_token[rows], self.seq_len[rows] = first[:, 0], torch.tensor(lens, device=self.device)
        for slot, n in zip(slots, lens):
            self.lengths[slot] = n
        if draft:
            shifted = torch.roll(tokens, -1, dims=1)  # [1, T]: x_1..x_{n-1} of each prompt ...
            shifted[0, ends] = first[:, 0]  # ... then its x_n
            feats = self._features(hidden, aux)  # [1, T, F]
            if self.lazy:
                at = packed_index(segments, self.device)
                self.feat_buf[at], self.tok_buf[at] = feats[0], shifted[0]
                for slot in slots:
                    self.draft_len[slot] = 0
            else:
                out = self.head(shifted, feats, AttnMeta.for_packed(self.draft_cache, self.head.rope, segments))
                self.draft_feature[rows] = out[0, ends]  # [N, H]
        return first[:, 0].tolist()

    def _catch_up(self, batch: int) -> None:
        """Lazy drafting: run the head over the entries draft_len..length-1 it skipped, for slots 0..batch-1.

        The lagging slots run packed, at most ``CATCH_UP_TOKENS`` entries per head forward (a slot's lag is never
        split), so a switch into drafting at a large batch costs a few forwards, not one per sequence.
        """
        lagging = [Segment(slot, self.draft_len[slot], self.lengths[slot] - self.draft_len[slot])
                   for slot in range(batch) if self.draft_len[slot] < self.lengths[slot]]
        groups: list[list[Segment]] = [[]]
        for seg in lagging:
            if groups[-1] and sum(s.n for s in groups[-1]) + seg.n > CATCH_UP_TOKENS:
                groups.append([])
            groups[-1].append(seg)
        for group in groups:
            if not group:
                continue
            rows = torch.tensor([s.slot for s in group], device=self.device)  # [N]
            at = packed_index(group, self.device)
            tokens, feats = self.tok_buf[at].unsqueeze(0), self.feat_buf[at].unsqueeze(0)  # [1, T], [1, T, F]
            out = self.head(tokens, feats, AttnMeta.for_packed(self.draft_cache, self.head.rope, group))  # [1, T, H]
            self.draft_feature[rows] = out[0, packed_ends(group, self.device)]
            for s in group:
                self.draft_len[s.slot] = s.start + s.n

    @torch.inference_mode()
    def decode_round(self, batch: int, k: int, st: SamplingTensors, keep_draft: bool = False
                     ) -> tuple[list[int], list[list[int]]]:
        """One round for slots 0..batch-1 with ``k`` drafts each (0 = plain decoding).

        With a :attr:`rule` (per-row draft length) ``k`` is its n_max and each row drafts until the rule stops it
        (SpecServe's rule then drops low-estimate tail tokens); the target verifies every row's own length in one
        forward (padded to the longest row, or packed: :attr:`verify_layout`). ``keep_draft`` (K = 0
        only) keeps the head usable for later drafting rounds (adaptive mode): a one-entry draft extend, or with lazy
        drafting only a copy of the head's inputs. With :attr:`record` set the round drafts all ``k`` positions for
        every row (the trace holds each position's confidence) and times its parts; :attr:`last_round` tells.

        Returns:
            accepted drafts per sequence, and per sequence the a+1 emitted tokens.
        """
        b, dev = batch, self.device
        m = self.seq_len[:b]  # [B]
        if k > 0 and self.lazy:
            self._catch_up(b)
        start = time.perf_counter() if self.record else 0.0
        d, lengths, probs, p_hats = self._draft(b, k)  # [B, K'], [B] or None, [B, K'] or None
        steps = d.shape[1]  # draft positions computed
        drafted = lengths.tolist() if lengths is not None else None  # the one host read of per-row lengths
        if drafted is not None:
            d = d[:, : max(drafted)]
        k_v = d.shape[1]  # verify width - 1
        drafted_at = self._sync_time(start)
        inputs = torch.cat([self.last_token[:b].unsqueeze(1), d], dim=1)  # [B, K'+1]
        pos = m.unsqueeze(1) + torch.arange(k_v + 1, device=dev)  # [B, K'+1]
        if lengths is not None and self.verify_layout == "packed" and b > 1:
            hidden, aux = self._packed_verify(inputs, lengths, drafted)
        else:
            hidden, aux = self._run("target", self._target_fwd, inputs, pos)
        accepted, tokens = verify(self.target.logits(hidden), d, st, self.generator, lengths)  # [B], [B, K'+1]
        rows = torch.arange(b, device=dev)
        if k > 0 or (keep_draft and not self.lazy):  # draft extend on (x_{p+1}, f_p), p = m..m+K'; entry m+a: d_1
            out = self._run("extend", self._draft_fwd, tokens, pos, self._features(hidden, aux))  # [B, K'+1, H]
            self.draft_feature[:b] = out[rows, accepted]  # [B, H]
        elif keep_draft:  # lazy K = 0: keep the entry (x_{m+1}, f_m) for a later catch-up
            self.feat_buf[rows, m] = self._features(hidden, aux)[:, 0]
            self.tok_buf[rows, m] = tokens[:, 0]
        self.last_token[:b] = tokens[rows, accepted]
        self.seq_len[:b] = m + accepted + 1
        acc = accepted.tolist()
        toks = tokens.tolist()
        drafted = drafted if drafted is not None else [k_v] * b
        for slot, a in enumerate(acc):
            self.lengths[slot] += a + 1
            if k > 0:
                self.draft_len[slot] = self.lengths[slot]
        if self.record:
            done = self._sync_time(start)
            self.last_round = RoundInfo(drafted, steps, None if probs is None else probs.tolist(),
                                        None if p_hats is None else p_hats.tolist(), drafted_at * 1e3,
                                        (done - drafted_at) * 1e3)
        else:
            self.last_round = RoundInfo(drafted, steps)
        return acc, [row[: a + 1] for row, a in zip(toks, acc)]

    def _packed_verify(self, inputs: torch.Tensor, lengths: torch.Tensor, drafted: list[int]
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The target over each row's own L_b + 1 inputs only, packed into one row [1, sum(L_b + 1)]
        (:mod:`spectune.backends.local.model.packed`), its outputs laid back out as [B, K'+1, ...] with zeros at the
        padding (never accepted: :func:`verify` gets the lengths). ``lengths`` [B] on the device, ``drafted`` the
        same on the host."""
        b, width = inputs.shape
        segments = [Segment(slot, self.lengths[slot], n + 1) for slot, n in enumerate(drafted)]
        keep = torch.arange(width, device=self.device).unsqueeze(0) < (lengths + 1).unsqueeze(1)  # [B, K'+1]
        hidden, aux = self.target(inputs[keep].unsqueeze(0),
                                  AttnMeta.for_packed(self.target_cache, self.target.rope, segments))  # [1, T, .]

        def spread(x: torch.Tensor | None) -> torch.Tensor | None:
            if x is None:
                return None
            out = x.new_zeros(b, width, x.shape[-1])
            out[keep] = x[0]
            return out

        return spread(hidden), spread(aux)

    def _sync_time(self, start: float) -> float:
        """Seconds since ``start`` after the device finished (0 when not recording)."""
        if not self.record:
            return 0.0
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def _draft(self, b: int, k: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None,
                                              torch.Tensor | None]:
        """Draft up to ``k`` tokens for slots 0..b-1 (chain drafting, greedy).

        Returns:
            drafts [B, K'] long (K' <= k: a rule stops the loop once every row stopped, on CPU); per-row lengths [B]
            long to verify (a :attr:`rule`'s ``verify_lengths``) or None (every row drafted K'); the drafts'
            confidences [B, K'] float32 and the acceptance head's p_hat [B, K'] when recording or a rule needs them,
            else None.
        """
        if k == 0:
            return torch.zeros(b, 0, dtype=torch.long, device=self.device), None, None, None
        rule, confident = self.rule, self.rule is not None or self.record
        if rule is not None:
            rule.begin(b, self.device, self.seq_len[:b])
        drafts: list[torch.Tensor] = []  # each [B]
        probs: list[torch.Tensor] = []
        p_hats: list[torch.Tensor] = []
        feat = self.draft_feature[:b]  # [B, H]: the head output that drafts d_1
        for j in range(k):
            if j > 0:  # entry (d_j, feature) at position m + j - 1
                pos = (self.seq_len[:b] + (j - 1)).view(b, 1)
                feat = self._run("draft", self._draft_fwd, drafts[-1].view(b, 1), pos, feat.unsqueeze(1))[:, 0]
            if not confident:
                drafts.append(self.head.draft_tokens(feat))
                continue
            token, prob = self.head.draft_with_prob(feat)  # [B], [B]
            drafts.append(token)
            probs.append(prob)
            if rule is not None:
                p_hat = rule.observe(feat, prob)
                if p_hat is not None:
                    p_hats.append(p_hat)
                if not self.record and self.device.type != "cuda" and not bool(rule.active.any()):
                    break  # every row stopped (a free read on CPU; CUDA drafts n_max with no host read)
            elif self.acceptance is not None:
                p_hats.append(self.acceptance(feat, prob).float())
        d = torch.stack(drafts, dim=1)  # [B, K']
        lengths = rule.verify_lengths(self.verify_layout) if rule is not None else None  # on the device
        return d, lengths, torch.stack(probs, dim=1) if probs else None, torch.stack(p_hats, dim=1) if p_hats else None

    def move_slot(self, src: int, dst: int) -> None:
        """Move a running sequence from slot ``src`` to ``dst`` (cache rows and state)."""
        length = min(self.lengths[src] + 1, self.target_cache.max_len)  # host copy: no device sync
        self.target_cache.move_slot(src, dst, length)
        self.last_token[dst], self.seq_len[dst] = self.last_token[src], self.seq_len[src]
        self.lengths[dst], self.draft_len[dst] = self.lengths[src], self.draft_len[src]
        if self.head is not None:
            self.draft_cache.move_slot(src, dst, self.draft_len[src] if self.lazy else length)
            self.draft_feature[dst] = self.draft_feature[src]
        if self.lazy:
            lo, hi = self.draft_len[src], self.lengths[src]
            self.feat_buf[dst, lo:hi], self.tok_buf[dst, lo:hi] = self.feat_buf[src, lo:hi], self.tok_buf[src, lo:hi]
