"""Rotary position embeddings (RoPE, Su et al. 2021) in the "rotate half" layout HF Llama checkpoints use.

Scaling variants: ``linear`` (positions divided by ``factor``) and ``llama3`` (Meta's frequency-dependent scaling
from the Llama 3.1 release: wavelengths longer than ``original_max_position_embeddings / low_freq_factor`` are
divided by ``factor``, shorter than ``.../high_freq_factor`` kept, smooth interpolation between; the same formula as
transformers' ``_compute_llama3_parameters``; :func:`spectune.backends.head_config.llama3_rope_factors`).
"""

from __future__ import annotations


import torch

from spectune.backends.head_config import llama3_rope_factors
from spectune.core.json_types import JsonObject


def inverse_frequencies(head_dim: int, theta: float, scaling: JsonObject | None) -> torch.Tensor:
    """Per-pair inverse frequencies, float64 [head_dim // 2].

    Raises:
        ValueError: an unknown ``rope_type``.
    """
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling.get("factor", 1.0))
    if kind == "linear":
        return inv / factor
    if kind == "llama3":  # the one Llama-3 formula, shared with llama.cpp's rope_freqs.weight
        return inv / llama3_rope_factors(inv, scaling)
    raise ValueError(f"unsupported rope_type {kind!r} (supported: default, linear, llama3)")


def rope_table(
    head_dim: int, theta: float, scaling: JsonObject | None, max_positions: int, dtype: torch.dtype
) -> torch.Tensor:
    """cos and sin for every position, stacked: [max_positions, 2, head_dim] in ``dtype``.

    Row p holds cos(p * f) and sin(p * f), each duplicated over both halves of the head (rotate-half layout).
    """
    inv = inverse_frequencies(head_dim, theta, scaling)
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv)  # [P, hd/2]
    angles = torch.cat([angles, angles], dim=-1)  # [P, hd]
    return torch.stack([angles.cos(), angles.sin()], dim=1).to(dtype)


def apply_rope(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [..., T, heads, head_dim] by ``cos_sin`` [..., T, 2, head_dim] (gathered per position)."""
    cos = cos_sin[..., 0, :].unsqueeze(-2)
    sin = cos_sin[..., 1, :].unsqueeze(-2)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
