"""Attention over the static slot cache, with the per-forward metadata every layer shares.

Two shapes of forward:

- *prefill*: one sequence, tokens at positions start..start+n-1 of its slot; K/V copied into the slot, then causal
  attention over positions 0..start+n-1 (its own keys alone when start is 0: no cache reads). start > 0 is how a
  draft head catches up on positions it skipped
  (:class:`~spectune.backends.local.engine.speculative.SpeculativeDecoder`, lazy drafting).
- *batched*: B sequences in slots 0..B-1, q new tokens each at arbitrary positions (decode q = 1, verify q = K+1,
  draft extend q = K+1); K/V written at (slot, position), then each query attends to cache positions <= its own.

GQA without repeating K/V: the G = heads / kv_heads query heads that share a KV head are folded into the query
length, so SDPA sees [B, kv_heads, G*q, hd] queries against [B, kv_heads, T, hd] keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from spectune.backends.local.model.kv_cache import KVCache


@dataclass
class AttnMeta:
    """Inputs shared by every layer of one forward.

    Attributes:
        cache: the KV cache this model writes (target and draft own separate caches).
        cos_sin: RoPE rows gathered per token, [B, q, 2, head_dim].
        prefill_slot: slot of the sequence for a prefill forward, else None.
        prefill_start: first position a prefill forward writes (0 for a fresh prompt).
        write_index: for batched forwards, index tensors (slot [B,1,1], kv_head [1,H,1], position [B,1,q]).
        mask: for batched forwards, bool [B, 1, G*q, T], True where the query may attend.
        kv_len: T, cache positions visible to this forward.
    """

    cache: KVCache
    cos_sin: torch.Tensor
    prefill_slot: int | None = None
    prefill_start: int = 0
    write_index: tuple[torch.Tensor, ...] | None = None
    mask: torch.Tensor | None = None
    kv_len: int = 0

    @classmethod
    def for_prefill(cls, cache: KVCache, rope: torch.Tensor, slot: int, n: int, start: int = 0) -> "AttnMeta":
        """Metadata to prefill ``n`` tokens at positions start..start+n-1 of ``slot`` (positions < start must
        already hold this sequence's K/V)."""
        positions = torch.arange(start, start + n, device=rope.device)
        return cls(cache=cache, cos_sin=rope[positions].unsqueeze(0), prefill_slot=slot, prefill_start=start)

    @classmethod
    def for_batch(cls, cache: KVCache, rope: torch.Tensor, positions: torch.Tensor, group: int,
                  kv_len: int | None = None) -> "AttnMeta":
        """Metadata for B sequences in slots 0..B-1 with new tokens at ``positions`` [B, q] (long).

        ``group`` is heads // kv_heads. Query j of sequence b sees cache positions <= positions[b, j]. ``kv_len``
        (the visible cache length) defaults to max(positions) + 1; CUDA graphs pass a fixed bucket instead, which
        keeps every shape static and avoids a device-to-host sync.
        """
        batch, q = positions.shape
        kv_len = int(positions.max()) + 1 if kv_len is None else kv_len
        heads = cache.k.shape[2]
        dev = positions.device
        index = (
            torch.arange(batch, device=dev).view(batch, 1, 1),
            torch.arange(heads, device=dev).view(1, heads, 1),
            positions.view(batch, 1, q),
        )
        keys = torch.arange(kv_len, device=dev)
        mask = keys.view(1, 1, kv_len) <= positions.unsqueeze(-1)  # [B, q, T]
        mask = mask.unsqueeze(1).repeat(1, 1, group, 1)  # [B, 1, G*q, T], row g*q + j -> query j
        return cls(cache=cache, cos_sin=rope[positions], write_index=index, mask=mask, kv_len=kv_len)


def attend(
    meta: AttnMeta, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """Store k, v and attend. q [B, s, H, hd], k/v [B, s, Hkv, hd] (RoPE applied) -> [B, s, H*hd]."""
    batch, s, heads, hd = q.shape
    if meta.prefill_slot is not None:
        start = meta.prefill_start
        meta.cache.write_prefix(layer, meta.prefill_slot, k[0], v[0], start)
        if start == 0:
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
            )  # [1, H, s, hd]
        else:  # query i (position start+i) sees cache positions 0..start+i
            kc, vc = meta.cache.slot_view(layer, meta.prefill_slot, start + s)  # [1, Hkv, start+s, hd]
            keys = torch.arange(start + s, device=q.device)
            mask = keys.view(1, -1) <= (start + torch.arange(s, device=q.device)).view(-1, 1)  # [s, start+s]
            out = F.scaled_dot_product_attention(q.transpose(1, 2), kc, vc, attn_mask=mask, enable_gqa=True)
        return out.transpose(1, 2).reshape(batch, s, heads * hd)
    k_cache, v_cache = meta.cache.layer(layer)
    return attend_batched(q, k, v, k_cache, v_cache, meta.write_index, meta.mask)


def attend_batched(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   index: tuple[torch.Tensor, ...], mask: torch.Tensor) -> torch.Tensor:
    """The batched forward's attention as a function of tensors only (what ``torch.compile`` traces:
    :mod:`spectune.backends.local.engine.compiled`).

    Args:
        q: [B, s, H, hd]; k, v: [B, s, Hkv, hd] (RoPE applied).
        k_cache, v_cache: one layer's cache, [slots, Hkv, max_len, hd]; k and v are written at ``index``.
        index: (slot [B,1,1], kv_head [1,Hkv,1], position [B,1,s]) long tensors (:meth:`AttnMeta.for_batch`).
        mask: bool [B, 1, G*s, T]; T, the visible cache length, is its last dimension.

    Returns:
        [B, s, H*hd].
    """
    batch, s, heads, hd = q.shape
    kv_heads = k.shape[2]
    k_cache.index_put_(index, k.transpose(1, 2))
    v_cache.index_put_(index, v.transpose(1, 2))
    kv_len = mask.shape[-1]
    kc, vc = k_cache[:batch, :, :kv_len], v_cache[:batch, :, :kv_len]  # [B, Hkv, T, hd]
    group = heads // kv_heads
    qg = q.reshape(batch, s, kv_heads, group, hd).permute(0, 2, 3, 1, 4).reshape(batch, kv_heads, group * s, hd)
    out = F.scaled_dot_product_attention(qg, kc, vc, attn_mask=mask)  # [B, Hkv, G*s, hd]
    return out.view(batch, kv_heads, group, s, hd).permute(0, 3, 1, 2, 4).reshape(batch, s, heads * hd)
