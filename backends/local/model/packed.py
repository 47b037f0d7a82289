"""Packed forwards: several sequences' tokens concatenated into one row [1, T], as a prefill batches them.

Segment i holds n_i tokens at positions start_i..start_i+n_i-1 of its cache slot. The projections and MLP run once
over all T tokens (the caller's model does that); here every token's K/V is written at its (slot, position) with one
indexed write per layer, and each segment attends causally over its slot's positions 0..start_i+n_i-1, never to
another segment's tokens. That is what vLLM's and SGLang's varlen prefill does with ``cu_seqlens``; PyTorch has no
varlen kernel on every device, so attention runs on padded groups instead:

- fresh prompts (every start 0, more than one): the segments, sorted by length, are cut into groups whose padding
  stays within ``PAD_LIMIT`` times their tokens (:func:`padded_groups`); each group is gathered into [N_g, L_g] with
  its shorter prompts padded on the right, and runs one causal SDPA (a real query at j sees keys 0..j, all its
  own; the pads' outputs are dropped). A few SDPA calls per layer instead of one per prompt: on a GPU a forward
  costs its kernel launches.
- one segment, or a segment that continues a sequence (start > 0: lazy drafting's catch-up reads the slot's earlier
  keys from the cache): one SDPA per segment.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from spectune.backends.local.model.kv_cache import KVCache

PAD_LIMIT = 1.5
"""A padded group's query rows (prompts x its longest prompt) may be at most this many times its tokens."""


class Segment(NamedTuple):
    """One sequence's tokens in a packed forward: ``n`` tokens at positions start..start+n-1 of cache ``slot``."""

    slot: int
    start: int
    n: int


@dataclass(frozen=True)
class PaddedGroups:
    """Fresh prompts of a packed forward laid out for padded attention (:func:`pad_groups`).

    Attributes:
        gathers: per group a long tensor [N_g, L_g]: the packed row's index of each (prompt, position); a shorter
            prompt's pad positions repeat its last token.
        order: long [T]: for packed token t, its row in the groups' outputs flattened ([N_g * L_g] each) and
            concatenated in group order.
    """

    gathers: tuple[torch.Tensor, ...]
    order: torch.Tensor


def packed_index(segments: list[Segment], device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """The (slot, position) of every token of a packed forward, in token order: two long tensors [T], which index
    a cache layer [slots, Hkv, max_len, hd] as ``[slot, :, position]`` or per-position buffers [slots, max_len, ...]
    as ``[slot, position]``."""
    slots = torch.tensor([seg.slot for seg in segments for _ in range(seg.n)])
    positions = torch.cat([torch.arange(seg.start, seg.start + seg.n) for seg in segments])
    return slots.to(device), positions.to(device)


def packed_ends(segments: list[Segment], device: torch.device | str) -> torch.Tensor:
    """Each segment's last token in the packed row: long [N] (where its next token's logits or the head's feature
    for its next draft are read)."""
    return torch.tensor(list(itertools.accumulate(seg.n for seg in segments)), device=device) - 1


def padded_groups(lengths: list[int], limit: float = PAD_LIMIT) -> list[list[int]]:
    """Cut prompts into groups for padded attention: indices into ``lengths`` (tokens per prompt), shortest first;
    a group takes the next longer prompt while (its prompts + 1) x that prompt's length stays within ``limit`` x
    its tokens, so padding never exceeds ``limit - 1`` of a group's rows."""
    groups: list[list[int]] = [[]]
    tokens = 0
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        n = lengths[i]
        if groups[-1] and (len(groups[-1]) + 1) * n > limit * (tokens + n):
            groups.append([])
            tokens = 0
        groups[-1].append(i)
        tokens += n
    return groups


def pad_groups(segments: list[Segment], device: torch.device | str) -> PaddedGroups:
    """The :class:`PaddedGroups` of fresh prompts (each segment's start 0), built once per forward."""
    lengths = [seg.n for seg in segments]
    offsets = [0]
    for n in lengths[:-1]:
        offsets.append(offsets[-1] + n)
    order = [0] * sum(lengths)
    gathers, base = [], 0
    for group in padded_groups(lengths):
        width = max(lengths[i] for i in group)
        rows = []
        for local, i in enumerate(group):
            rows.append([offsets[i] + min(j, lengths[i] - 1) for j in range(width)])
            for j in range(lengths[i]):
                order[offsets[i] + j] = base + local * width + j
        gathers.append(torch.tensor(rows, device=device))
        base += len(group) * width
    return PaddedGroups(tuple(gathers), torch.tensor(order, device=device))


def attend_packed(cache: KVCache, layer: int, segments: tuple[Segment, ...], index: tuple[torch.Tensor, ...],
                  padded: PaddedGroups | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A packed forward's attention: every token's K/V stored at its (slot, position), then causal attention per
    segment (module docstring).

    Args:
        cache: the model's KV cache; layer: the layer index.
        segments: the sequences, in token order (their n sum to T).
        index: (slot [T], position [T]) of each token (:func:`packed_index`).
        padded: the fresh prompts' padded groups (:func:`pad_groups`), or None for one SDPA per segment.
        q: [1, T, H, hd]; k, v: [1, T, Hkv, hd] (RoPE applied).

    Returns:
        [1, T, H*hd].
    """
    _, total, heads, hd = q.shape
    k_cache, v_cache = cache.layer(layer)  # [slots, Hkv, max_len, hd]
    k_cache[index[0], :, index[1]] = k[0]  # one write for all segments
    v_cache[index[0], :, index[1]] = v[0]
    outs: list[torch.Tensor] = []
    if padded is not None:
        for gather in padded.gathers:  # [N_g, L_g]
            qg, kg, vg = (x[0][gather].transpose(1, 2) for x in (q, k, v))  # [N_g, H or Hkv, L_g, hd]
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, enable_gqa=True)  # [N_g, H, L_g, hd]
            outs.append(out.transpose(1, 2).reshape(-1, heads * hd))  # [N_g * L_g, H*hd]
        return torch.cat(outs)[padded.order].view(1, total, heads * hd)
    offset = 0
    for slot, start, n in segments:
        qs = q[0, offset:offset + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, hd]
        if start == 0:  # a fresh prompt: its own keys, causal
            ks, vs = (x[0, offset:offset + n].transpose(0, 1).unsqueeze(0) for x in (k, v))  # [1, Hkv, n, hd]
            out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)  # [1, H, n, hd]
        else:  # query i (position start+i) sees cache positions 0..start+i
            kc, vc = cache.slot_view(layer, slot, start + n)  # [1, Hkv, start+n, hd]
            keys = torch.arange(start + n, device=q.device)
            mask = keys.view(1, -1) <= (start + torch.arange(n, device=q.device)).view(-1, 1)  # [n, start+n]
            out = F.scaled_dot_product_attention(qs, kc, vc, attn_mask=mask, enable_gqa=True)
        outs.append(out[0].transpose(0, 1).reshape(n, heads * hd))
        offset += n
    return (outs[0] if len(outs) == 1 else torch.cat(outs)).view(1, total, heads * hd)
