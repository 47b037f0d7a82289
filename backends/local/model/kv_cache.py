"""A static KV cache addressed by (slot, position), as gpt-fast's: rejected draft tokens need no rollback.

Every running sequence owns one slot. The engine keeps running sequences in slots ``0..B-1`` (a finished sequence's
slot is refilled by moving the last one down), so a batch's cache is the view ``k[layer, :B, :, :T]``: no gather.
Verify writes K/V for all K+1 positions; positions past the accepted prefix hold stale values that the next round
overwrites before any query can see them (attention is masked by each sequence's length).
"""

from __future__ import annotations

import torch


def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Cache bytes one token occupies across all layers (K and V)."""
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


class KVCache:
    """K and V tensors [layers, slots, kv_heads, max_len, head_dim].

    Args:
        num_layers, num_kv_heads, head_dim: model shape.
        num_slots: sequences that can run at once.
        max_len: tokens per slot (prompt + output + speculative slack).
        dtype, device: storage.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (num_layers, num_slots, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots = num_slots
        self.max_len = max_len
        self.k_layers = tuple(self.k[i] for i in range(num_layers))  # per-layer views, made once
        self.v_layers = tuple(self.v[i] for i in range(num_layers))

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V views [slots, kv_heads, max_len, head_dim] of one layer (no copy; batched forwards write them with
        ``index_put_``: :func:`spectune.backends.local.model.attention.attend_batched`)."""
        return self.k_layers[layer], self.v_layers[layer]

    def slot_view(self, layer: int, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V views [1, kv_heads, length, head_dim] of one slot (no copy)."""
        return self.k[layer, slot:slot + 1, :, :length], self.v[layer, slot:slot + 1, :, :length]

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst`` (all layers)."""
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]
