"""Attention over the static slot cache, with the per-forward metadata every layer shares.

Two shapes of forward:

- *packed* (prefill): one or more sequences' tokens concatenated into one row [1, T]; segment i holds n_i tokens at
  positions start_i..start_i+n_i-1 of its slot and attends causally over its slot's positions 0..start_i+n_i-1
  (:mod:`spectune.backends.local.model.packed`). start > 0 is how a draft head catches up on positions it skipped
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
from spectune.backends.local.model.packed import PaddedGroups, Segment, attend_packed, pad_groups, packed_index


@dataclass
class AttnMeta:
    """Inputs shared by every layer of one forward.

    Attributes:
        cache: the KV cache this model writes (target and draft own separate caches).
        cos_sin: RoPE rows gathered per token, [B, q, 2, head_dim] ([1, T, 2, head_dim] for a packed forward).
        segments: for a packed forward, one :class:`~spectune.backends.local.model.packed.Segment` per sequence in
            token order, else None.
        padded: for a packed forward of several fresh prompts, their padded attention groups, else None.
        write_index: where K/V are written: for batched forwards index tensors (slot [B,1,1], kv_head [1,H,1],
            position [B,1,q]); for a packed forward (slot [T], position [T]) (:func:`packed_index`).
        mask: for batched forwards, bool [B, 1, G*q, T], True where the query may attend.
        kv_len: T, cache positions visible to this forward.
    """

    cache: KVCache
    cos_sin: torch.Tensor
    segments: tuple[Segment, ...] | None = None
    padded: PaddedGroups | None = None
    write_index: tuple[torch.Tensor, ...] | None = None
    mask: torch.Tensor | None = None
    kv_len: int = 0

    @classmethod
    def for_prefill(cls, cache: KVCache, rope: torch.Tensor, slot: int, n: int, start: int = 0) -> "AttnMeta":
        """Metadata to prefill ``n`` tokens at positions start..start+n-1 of ``slot`` (positions < start must
        already hold this sequence's K/V): a packed forward of one segment."""
        return cls.for_packed(cache, rope, [Segment(slot, start, n)])

    @classmethod
    def for_packed(cls, cache: KVCache, rope: torch.Tensor, segments: list[Segment]) -> "AttnMeta":
        """Metadata for a packed forward: the tokens of ``segments`` concatenated in order, [1, sum(n)] (positions
        < start of each segment must already hold that sequence's K/V).

        Raises:
            ValueError: no segment, or a segment with no token.
        """
        if not segments or any(seg.n < 1 for seg in segments):
            raise ValueError(f"a packed forward needs segments of at least one token, got {segments}")
        index = packed_index(segments, rope.device)
        padded = pad_groups(segments, rope.device) if len(segments) > 1 and all(s.start == 0 for s in segments) \
            else None
        return cls(cache=cache, cos_sin=rope[index[1]].unsqueeze(0), segments=tuple(segments), write_index=index,
                   padded=padded)

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
    meta: AttnMeta, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: bool = False
) -> torch.Tensor:
    """Store k, v and attend. q [B, s, H, hd], k/v [B, s, Hkv, hd] (RoPE applied) -> [B, s, H*hd]. ``kernel``: a
    batched forward's attention through ``spectune::decode_attention`` (see :func:`attend_batched`)."""
    if meta.segments is not None:
        return attend_packed(meta.cache, layer, meta.segments, meta.write_index, meta.padded, q, k, v)
    k_cache, v_cache = meta.cache.layer(layer)
    return attend_batched(q, k, v, k_cache, v_cache, meta.write_index, meta.mask, kernel)


def attend_batched(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   index: tuple[torch.Tensor, ...], mask: torch.Tensor, kernel: bool = False) -> torch.Tensor:
    """The batched forward's attention as a function of tensors only (what ``torch.compile`` traces:
    :mod:`spectune.backends.local.engine.compiled`).

    Args:
        q: [B, s, H, hd]; k, v: [B, s, Hkv, hd] (RoPE applied).
        k_cache, v_cache: one layer's cache, [slots, Hkv, max_len, hd]; k and v are written at ``index``.
        index: (slot [B,1,1], kv_head [1,Hkv,1], position [B,1,s]) long tensors (:meth:`AttnMeta.for_batch`).
        mask: bool [B, 1, G*s, T]; T, the visible cache length, is its last dimension.
        kernel: attend through ``spectune::decode_attention`` (:mod:`spectune.backends.local.kernels`, CPU; it
            reads the caches in place) instead of PyTorch's SDPA over cache slices.

    Returns:
        [B, s, H*hd].
    """
    batch, s, heads, hd = q.shape
    kv_heads = k.shape[2]
    k_cache.index_put_(index, k.transpose(1, 2))
    v_cache.index_put_(index, v.transpose(1, 2))
    kv_len = mask.shape[-1]
    group = heads // kv_heads
    qg = q.reshape(batch, s, kv_heads, group, hd).permute(0, 2, 3, 1, 4).reshape(batch, kv_heads, group * s, hd)
    if kernel:
        out = torch.ops.spectune.decode_attention(qg, k_cache, v_cache, mask)  # [B, Hkv, G*s, hd]
    else:
        kc, vc = k_cache[:batch, :, :kv_len], v_cache[:batch, :, :kv_len]  # [B, Hkv, T, hd]
        out = F.scaled_dot_product_attention(qg, kc, vc, attn_mask=mask)  # [B, Hkv, G*s, hd]
    return out.view(batch, kv_heads, group, s, hd).permute(0, 3, 1, 2, 4).reshape(batch, s, heads * hd)
