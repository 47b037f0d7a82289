"""CPU fast path for linear layers: oneDNN pre-packed bf16 weights.

On a 2-core AVX512-BF16 CPU ``F.linear`` on bf16 reaches about 7-15 GB/s of weight reads
for the skinny matrices of decode (1-8 rows), while oneDNN with weights reordered once into its blocked layout
(what torch inductor's CPU freezing pass uses: ``torch.ops.mkldnn._reorder_linear_weight`` and
``torch.ops.mkldnn._linear_pointwise``) reaches about 30 GB/s, the DRAM bandwidth: a 2-4x faster decode step.
``benchmarks/engine_speed.py`` measures the effect end to end.

The ops are private PyTorch API; :func:`pack_linears` checks they work and leaves the model unchanged otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class PackedLinear(nn.Module):
    """Inference-only replacement for ``nn.Linear`` holding a oneDNN-packed bf16 weight.

    Args:
        linear: the layer to replace (bf16 weight on CPU).
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]."""
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features), self.packed, self.bias, "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)


def packing_supported(dtype: torch.dtype, device: torch.device) -> bool:
    """True when packed linears work here (CPU, bf16, oneDNN with bf16 support)."""
    if device.type != "cpu" or dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    try:
        lin = nn.Linear(8, 8, bias=True).to(dtype)
        x = torch.randn(3, 8, dtype=dtype)
        return torch.allclose(PackedLinear(lin)(x).float(), lin(x).float(), atol=1e-2, rtol=1e-2)
    except (RuntimeError, AttributeError):
        return False


def pack_linears(module: nn.Module) -> int:
    """Replace every bf16 CPU ``nn.Linear`` inside ``module`` by a :class:`PackedLinear`; returns how many.

    Does nothing (returns 0) where packing is unsupported. The module becomes inference-only.
    """
    first = next(module.parameters(), None)
    if first is None or not packing_supported(first.dtype, first.device):
        return 0
    return replace_linears(module, PackedLinear)


def replace_linears(module: nn.Module, make: Callable[[nn.Linear], nn.Module | None]) -> int:
    """Replace every ``nn.Linear`` inside ``module`` by ``make(linear)`` where that returns a module (None keeps the
    linear); returns how many were replaced. What :func:`pack_linears`, :func:`unpack_bf16_linears` and the draft
    head's int4 quantization (``weights/quant.py`` ``quantize_head``) share."""
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and (new := make(child)) is not None:
                setattr(parent, name, new)
                count += 1
    return count


class Float32Linear(nn.Module):
    """A linear layer with float32 weights for bf16 activations: casts in, computes in float32, casts back.

    Used where oneDNN's bf16 kernels are unavailable (AVX2-only CPUs): PyTorch's reference bf16 GEMM is a scalar
    loop there (7.9 ms for [1, 576] x [576, 1536] on a 2-core AVX2 CPU, issue #17; float32 0.12-0.2 ms).

    Args:
        linear: the layer to replace.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight.detach().float()
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] (any float dtype) -> [..., out] in x's dtype."""
        return torch.nn.functional.linear(x.float(), self.weight, self.bias).to(x.dtype)


def unpack_bf16_linears(module: nn.Module) -> int:
    """Replace every bf16 ``nn.Linear`` inside ``module`` by a :class:`Float32Linear`; returns how many."""
    return replace_linears(module, lambda lin: Float32Linear(lin) if lin.weight.dtype == torch.bfloat16 else None)
