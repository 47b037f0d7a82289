"""The GGUF's own quantized weights (Q4_0, Q4_1, Q8_0), run natively on CPU with PyTorch's int4 weight-only kernel.

GGML block formats (32 weights along the input dimension per block; ``ggml-common.h`` in llama.cpp, and
``gguf.quants`` in the ``gguf`` package):

- Q4_0, 18 bytes: ``d`` (fp16), 16 bytes of nibbles; weight j is ``qs[j] & 15`` (j < 16) or ``qs[j-16] >> 4``;
  ``x = d * (q - 8)``.
- Q4_1, 20 bytes: ``d``, ``m`` (fp16), 16 bytes of nibbles (same order); ``x = d * q + m``.
- Q8_0, 34 bytes: ``d`` (fp16), 32 int8 ``q``; ``x = d * q``.

PyTorch's ``torch.ops.aten._weight_int4pack_mm_for_cpu`` (aten/src/ATen/native/cpu/int4mm_kernel.cpp) computes
``y = x @ W^T`` with ``W[n, k] = (code[n, k] - 8) * scale[g, n] + zero[g, n]`` over groups g of ``group_size``
inputs, unsigned 4-bit codes, scales and zeros in the activation dtype, fp32 accumulation. With group size 32:

- Q4_0 is ``scale = d, zero = 0``; Q4_1 is ``scale = d, zero = m + 8 d`` (exactly the same weights up to rounding
  d and m + 8d to the activation dtype);
- Q8_0 has 8-bit codes. Each ``q`` in [-128, 127] is split into ``q = 16 * hi + lo`` with ``hi`` in [-8, 7] and
  ``lo`` in [0, 15]: two 4-bit matrices over the same input, ``hi`` with ``scale = 16 d, zero = 0`` and ``lo``
  with ``scale = d, zero = 8 d``, run as one int4 matmul over the input repeated twice (K' = 2K). The integer
  codes are the GGUF's exactly; only d is rounded to the activation dtype. Bytes read per weight: 2 x 4 bits +
  scales, the same as Q8_0 itself.

The kernel is vectorised for bf16 activations on AVX2 and AVX-512 (the fp32 variant is a scalar loop, about 20x
slower: ``benchmarks/engine_speed.py``), so native weights run with bf16 activations. The rounding of d (and m + 8d)
to bf16 is the one difference from the GGUF's exact weights; :meth:`QuantTensor.rounded` gives the weights the
kernel really uses (``QuantTensor.rounded(torch.bfloat16).dequantize()``), which is what the greedy-equivalence test
compares against.

With spectune's CPU kernels (AVX-512 BW builds), :class:`Int4Linear` runs ``spectune::int4_linear`` instead: the
same codes in its own layout (:func:`pack_int4_blocks`, float16 scales: GGUF's exact d and m), the inputs quantized to
int16 per group of 32 and multiplied in exact integers (``backends/local/kernels/cpu_kernels.cpp``). The timings
below are PyTorch's kernel's.

Many rows at once (prefill, verify of a large batch): the kernel dequantizes a block of weights for every few rows of
the input, so its time grows linearly with the rows (SmolLM2's gate|up [576 -> 3072], one thread, AVX-512: 0.13 ms at 1
row, 0.85 ms at 16, 6.8 ms at 128; emulated AVX2: 0.22, 1.5, 12.7 ms), while a dense GEMM of the dequantized weights
starts slower and grows far less (float32: 0.28, 0.89, 3.2 ms: memory-bound at few rows, then at the CPU's FLOP rate).
So a layer may also keep those weights dense (:class:`Int4Linear` ``dense``: the kernel's weights,
``rounded(bf16).dequantize()``) and use them above a row count measured at start-up (``dense_above``), in the dense
dtype the same probe found faster at many rows (``dense_dtype``;
:func:`spectune.backends.local.weights.compute_paths.dense_crossover`):

- ``float32``: exactly the kernel's weights; bf16 inputs cast up, the output cast back like the kernel's. 4 bytes per
  weight.
- ``bfloat16``: the same weights rounded to bf16 (a second rounding of Q4_1's ``d * q + m``); PyTorch sends a bf16
  matmul on CPU to oneDNN, whose GEMM runs on AMX tiles or AVX512-BF16 where the CPU has them. 2 bytes per weight.
  Not pre-packed (:class:`spectune.backends.local.model.linear.PackedLinear`): dynamo cannot trace packed weights,
  and the decode layers are compiled (:mod:`spectune.backends.local.engine.compiled`); unpacked it costs 0.65 ms
  against 0.47 ms packed at 32 rows, the same at 128. On a 2-core CPU with AMX (one thread,
  gate|up): 0.7 ms at 32 rows and 0.9 ms at 128, against 2.1 and 6.5 ms for float32 and 2.4 and 9.4 ms for the int4
  kernel (docs/engine.md).

llama.cpp does the same for large batches with a BLAS backend (``ggml/src/ggml-blas/ggml-blas.cpp``: a matmul with at
least 32 rows, columns and inputs is dequantized to float and sent to sgemm). The dense copy is used only where it
fits in a quarter of the available memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from spectune.backends.local.weights.loader import gguf_reader
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject

QK = 32  # weights per GGML block
NATIVE_TYPES = ("Q4_0", "Q4_1", "Q8_0")
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


@dataclass
class QuantTensor:
    """One GGUF matrix as 4-bit codes with per-group affine parameters (see the module docstring).

    Attributes:
        codes: uint8 [N, K * repeat], values 0..15.
        scale: float32 [N, K * repeat / 32].
        zero: float32 [N, K * repeat / 32]; ``W = (codes - 8) * scale + zero`` per group of 32 inputs.
        repeat: 1 for Q4_0/Q4_1; 2 for Q8_0 (the input is repeated twice: hi nibbles, then lo nibbles).
        qtype: the GGUF type name (``Q4_0``, ``Q4_1``, ``Q8_0``).
    """

    codes: np.ndarray
    scale: np.ndarray
    zero: np.ndarray
    repeat: int
    qtype: str

    @property
    def shape(self) -> tuple[int, int]:
        """(out_features N, in_features K) of the matrix it represents."""
        return self.codes.shape[0], self.codes.shape[1] // self.repeat

    def rows(self, index: np.ndarray) -> "QuantTensor":
        """The same matrix with its rows reordered by ``index`` (whole rows: blocks stay intact)."""
        return QuantTensor(self.codes[index], self.scale[index], self.zero[index], self.repeat, self.qtype)

    def rounded(self, dtype: torch.dtype) -> "QuantTensor":
        """The same codes with scale and zero rounded to ``dtype`` (what :class:`Int4Linear` stores)."""
        r = lambda a: torch.from_numpy(a).to(dtype).float().numpy()  # noqa: E731
        return QuantTensor(self.codes, r(self.scale), r(self.zero), self.repeat, self.qtype)

    def dequantize(self) -> np.ndarray:
        """float32 [N, K]: the weights in float32 arithmetic (exact GGUF values)."""
        n, k2 = self.codes.shape
        g = k2 // QK
        w = (self.codes.reshape(n, g, QK).astype(np.float32) - 8) * self.scale[..., None] + self.zero[..., None]
        w = w.reshape(n, k2)
        return w if self.repeat == 1 else w.reshape(n, self.repeat, k2 // self.repeat).sum(1)


def concat_rows(parts: list[QuantTensor]) -> QuantTensor:
    """Stack matrices with the same input size and layout along the output dimension (fused q|k|v, gate|up).

    Raises:
        ValueError: the parts have different input sizes or layouts (Q8_0 next to Q4_1).
    """
    if len({(p.codes.shape[1], p.repeat) for p in parts}) != 1:
        raise ValueError("fused matrices need the same input size and quantization layout")
    return QuantTensor(np.concatenate([p.codes for p in parts]), np.concatenate([p.scale for p in parts]),
                       np.concatenate([p.zero for p in parts]), parts[0].repeat, "+".join(p.qtype for p in parts))


def unpack(raw: np.ndarray, qtype: str, in_features: int) -> QuantTensor:
    """Decode GGML blocks into 4-bit codes and affine parameters.

    Args:
        raw: uint8 [N, K / 32 * block_bytes], one row per output feature (``GGUFReader`` tensor data).
        qtype: ``Q4_0``, ``Q4_1`` or ``Q8_0``.
        in_features: K (a multiple of 32).

    Raises:
        ValueError: another type, or a row length that does not match K.
    """
    if qtype not in _BLOCK_BYTES:
        raise ValueError(f"{qtype} is not a natively supported type ({', '.join(NATIVE_TYPES)})")
    n = raw.shape[0]
    g = in_features // QK
    if in_features % QK or raw.reshape(n, -1).shape[1] != g * _BLOCK_BYTES[qtype]:
        raise ValueError(f"{qtype} rows of {raw.shape} bytes do not hold {in_features} weights")
    blocks = np.ascontiguousarray(raw.reshape(n, g, _BLOCK_BYTES[qtype]))
    d = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)  # [N, G]
    if qtype == "Q8_0":
        q = blocks[..., 2:].copy().view(np.int8).astype(np.int16)  # [N, G, 32]
        hi, lo = q >> 4, q & 15  # q = 16 hi + lo, hi in [-8, 7], lo in [0, 15]
        codes = np.concatenate([(hi + 8).reshape(n, -1), lo.reshape(n, -1)], axis=1).astype(np.uint8)
        scale = np.concatenate([16 * d, d], axis=1)
        zero = np.concatenate([np.zeros_like(d), 8 * d], axis=1)
        return QuantTensor(codes, scale, zero, 2, qtype)
    qs = blocks[..., -16:]
    codes = np.concatenate([qs & 15, qs >> 4], axis=-1).reshape(n, -1)  # [N, K]
    if qtype == "Q4_0":
        return QuantTensor(codes, d, np.zeros_like(d), 1, qtype)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    return QuantTensor(codes, d, m + 8 * d, 1, qtype)


class _QuantLinear(nn.Module):
    """What the native layers share: an optional bias in the activation dtype, and the dense copy of the kernel's
    own weights used above ``dense_above`` rows (float32 or bf16; see the module docstring).
    Subclasses set ``in_features``, ``out_features`` and their kernel's tensors, call :meth:`_finish`, and implement
    :meth:`_kernel`."""

    def _finish(self, dtype: torch.dtype, bias: torch.Tensor | None, dense_above: int | None,
                weights: Callable[[], torch.Tensor], dense_dtype: torch.dtype = torch.float32) -> None:
        """Store the bias and, when ``dense_above`` is set, ``weights()`` (float32 [N, K]) as the dense copy in
        ``dense_dtype`` (float32 as is, or rounded to bfloat16), with the bias in the same dtype.

        Raises:
            ValueError: ``dense_dtype`` is neither float32 nor bfloat16.
        """
        if dense_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"dense copy in {dense_dtype}: use torch.float32 or torch.bfloat16")
        self.bias = None if bias is None else bias.to(dtype)
        self.dense_above = dense_above
        self.dense_dtype = dense_dtype
        self.dense = None if dense_above is None else weights().to(dense_dtype)
        self.dense_bias = None if self.bias is None or dense_above is None else self.bias.to(dense_dtype)

    def _kernel(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 [M, K] (the activation dtype) -> [M, N] through the quantized kernel."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] (the activation dtype) -> [..., out_features]."""
        x2 = x.reshape(-1, self.in_features)  # [M, K]
        if self.dense is not None and x2.shape[0] > self.dense_above:  # many rows: dense GEMM, same weights
            y = torch.nn.functional.linear(x2.to(self.dense_dtype), self.dense, self.dense_bias).to(x.dtype)
            return y.view(*x.shape[:-1], self.out_features)
        y = self._kernel(x2)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


def int4_block_scales(qt: QuantTensor) -> tuple[np.ndarray, np.ndarray]:
    """(scale, m), float16 [N, K/32] each: the affine parameters ``spectune::int4_linear`` keeps
    (:func:`pack_int4_blocks`), ``W = scale * code + m`` with ``m = zero - 8 * scale`` (Q4_1's own ``m``)."""
    m = qt.zero.astype(np.float64) - 8 * qt.scale.astype(np.float64)
    return qt.scale.astype(np.float16), m.astype(np.float16)


def int4_block_weights(qt: QuantTensor) -> np.ndarray:
    """float32 [N, K]: the weights ``spectune::int4_linear`` multiplies by (:func:`int4_block_scales`), a Q8_0
    matrix's two halves summed as in :meth:`QuantTensor.dequantize`."""
    n, k2 = qt.codes.shape
    s, m = (a.astype(np.float32)[..., None] for a in int4_block_scales(qt))
    w = (qt.codes.reshape(n, k2 // QK, QK) * s + m).reshape(n, k2)
    return w if qt.repeat == 1 else w.reshape(n, qt.repeat, k2 // qt.repeat).sum(1)


def pack_int4_blocks(qt: QuantTensor) -> torch.Tensor:
    """``spectune::int4_linear``'s layout of ``qt`` (``backends/local/kernels/cpu_kernels.cpp``): uint8
    [N/32, K/32, 640], one 640-byte record per block of 32 output columns and group of 32 inputs. Bytes 0-511: 8 chunks
    of 64; byte 32h + 2n + b of chunk j (h, b in {0, 1}, n < 16) holds input 4j + 2h + b of column n in its low nibble
    and of column 16 + n in its high one; bytes 512-575: the group's ``scale`` of columns 0-31 as float16; 576-639:
    ``zero - 8 * scale`` (the weight at code 0, Q4_1's ``m``) as float16, so that ``W = scale * code + m``. GGUF's d
    and m are float16, so the weights of Q4_0, Q4_1 and Q8_0 (``16 d``, ``-128 d``, ``8 d``) are kept exactly. K is
    the codes' width (twice the input for a Q8_0 matrix).

    Raises:
        ValueError: N or K not a multiple of 32.
    """
    n, k = qt.codes.shape
    if n % 32 or k % 32:
        raise ValueError(f"int4_linear needs N and K multiples of 32, got {n} x {k}")
    g = k // 32
    c = qt.codes.reshape(n // 32, 2, 16, g, 8, 2, 2)  # [block, nibble, column n, group, chunk j, pair h, input b]
    c = c.transpose(0, 3, 4, 5, 2, 6, 1)  # [block, group, j, h, n, b, nibble]
    nibbles = (c[..., 0] | (c[..., 1] << 4)).astype(np.uint8).reshape(n // 32, g, 512)

    def half(a: np.ndarray) -> np.ndarray:  # float16 [N, G] -> its bytes [N/32, G, 64]
        return np.ascontiguousarray(a.reshape(n // 32, 32, g).transpose(0, 2, 1)).view(np.uint8)

    scale, m = int4_block_scales(qt)
    return torch.from_numpy(np.ascontiguousarray(np.concatenate([nibbles, half(scale), half(m)], axis=-1)))


def int4_blocks_reference(qt: QuantTensor, x: torch.Tensor) -> torch.Tensor:
    """What ``spectune::int4_linear`` computes, in float64 (tests): x [M, K] quantized per row and group of 32 to
    int16 as the kernel does (``d = max|a| / 32767``, ``q = rint(a * (32767 / max|a|))`` in float32), times the
    weights it keeps (:func:`int4_block_scales`): exactly ``W . (d q)``. Returns float64 [M, N]."""
    n, k = qt.codes.shape
    a = x.float().numpy().reshape(x.shape[0], k // 32, 32)
    amax = np.abs(a).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(32767) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(a * inv).astype(np.float64)  # float32 product, then round half to even, as cvtps_epi32
    d = (amax / np.float32(32767)).astype(np.float32).astype(np.float64)
    s, m = (h.astype(np.float64)[..., None] for h in int4_block_scales(qt))  # [N, G, 1]
    w = qt.codes.reshape(n, k // 32, 32) * s + m  # [N, G, 32]
    return torch.from_numpy(np.einsum("mgk,ngk->mn", q * d, w))


class Int4Linear(_QuantLinear):
    """Inference-only linear layer over 4-bit codes with per-32 affine groups (PyTorch's CPU int4 kernel).

    Args:
        qt: the weights (:class:`QuantTensor`).
        dtype: activation dtype (bf16 for the vectorised kernel; scales and zeros are stored in it too).
        bias: optional [N] bias.
        dense_above: also keep the kernel's weights as a dense [N, K] matrix and use a dense GEMM for inputs of
            more than this many rows (see the module docstring); None: int4 only.
        dense_dtype: the dense copy's dtype: ``torch.float32`` (the kernel's exact weights) or ``torch.bfloat16``
            (rounded to bf16, run by oneDNN's bf16 GEMM).
        spectune_kernel: run ``spectune::int4_linear`` (the inputs quantized to int16 per group of 32, exact
            integer dot products, up to 8 rows per pass; :mod:`spectune.backends.local.kernels`, which must be
            loaded with an AVX-512 BW build) where both dimensions are multiples of 32, in its own layout
            (:func:`pack_int4_blocks`); PyTorch's kernel otherwise.

    Raises:
        RuntimeError: from PyTorch when the kernel cannot take this shape (out_features not a multiple of 16).
    """

    def __init__(self, qt: QuantTensor, dtype: torch.dtype = torch.bfloat16, bias: torch.Tensor | None = None,
                 dense_above: int | None = None, dense_dtype: torch.dtype = torch.float32,
                 spectune_kernel: bool = False) -> None:
        super().__init__()
        self.out_features, self.in_features = qt.shape
        self.repeat, self.qtype = qt.repeat, qt.qtype
        n, k = qt.codes.shape
        self.spectune_kernel = spectune_kernel and n % 32 == 0 and k % 32 == 0
        if self.spectune_kernel:
            self.packed = pack_int4_blocks(qt)
            self.kernel_tensors: tuple[str, ...] = ("packed",)  # what the int4 kernel reads (the probes stream them)
            weights = lambda: torch.from_numpy(int4_block_weights(qt))  # noqa: E731
        else:
            codes = torch.from_numpy(np.ascontiguousarray(qt.codes)).to(torch.int32)
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
            sz = torch.stack([torch.from_numpy(qt.scale), torch.from_numpy(qt.zero)], dim=-1)  # [N, G, 2]
            self.scales_zeros = sz.transpose(0, 1).contiguous().to(dtype)  # [G, N, 2]
            self.kernel_tensors = ("packed", "scales_zeros")
            weights = lambda: torch.from_numpy(qt.rounded(dtype).dequantize())  # noqa: E731
        self._finish(dtype, bias, dense_above, weights, dense_dtype)

    def _kernel(self, x2: torch.Tensor) -> torch.Tensor:
        if self.repeat > 1:
            x2 = x2.repeat(1, self.repeat)
        if self.spectune_kernel:
            return torch.ops.spectune.int4_linear(x2, self.packed)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, QK, self.scales_zeros)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, qtype={self.qtype}, "
                f"dense_above={self.dense_above}, dense_dtype={str(self.dense_dtype).removeprefix('torch.')}")


def quantize_q4_1(weight: torch.Tensor) -> QuantTensor:
    """A dense matrix [N, K] (K a multiple of 32) as Q4_1 blocks: per group of 32 inputs ``x = d * q + m`` with
    ``d = (max - min) / 15`` and ``m = min`` as float16 and codes 0..15, quantized by the ``gguf`` package
    (``gguf.quants.quantize``, llama.cpp's ``quantize_row_q4_1_ref`` in ``ggml/src/ggml-quants.c``) and read back by
    :func:`unpack`.

    Raises:
        ValueError: K not a multiple of 32.
    """
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    n, k = weight.shape
    if k % QK:
        raise ValueError(f"Q4_1 needs in_features a multiple of {QK}, got {k}")
    raw = quantize(weight.detach().float().cpu().numpy(), GGMLQuantizationType.Q4_1)  # uint8 [N, K/32 * 20]
    return unpack(raw, "Q4_1", k)


def quantize_head(head: nn.Module, dtype: torch.dtype, dense_above: int | None = None,
                  dense_dtype: torch.dtype = torch.float32) -> int:
    """Replace every ``nn.Linear`` of a draft head whose sizes are multiples of 32 by an :class:`Int4Linear` over its
    weights quantized to Q4_1 (:func:`quantize_q4_1`), run by ``spectune::int4_linear`` as the native target's linears
    are; returns how many. Above ``dense_above`` rows (a catch-up or prompt through the head) each uses a dense copy
    of the same int4 weights in ``dense_dtype``, as the target's do.

    Why: in a decode round the target's weights stream through the caches, so the head's bf16 weights (19.6 MB for
    the bundled SmolLM2 head) come from DRAM each round; Q4_1 reads about a quarter of those bytes. The drafts move
    little (docs/engine.md "The draft head on the int4 kernel", ``benchmarks/draft_quant.py``), and drafts never
    change what is emitted: verification keeps greedy output equal to num_steps 0.
    """
    from spectune.backends.local.model.linear import replace_linears

    def int4(lin: nn.Linear) -> Int4Linear | None:
        if lin.in_features % QK or lin.out_features % QK:
            return None
        bias = None if lin.bias is None else lin.bias.detach()
        return Int4Linear(quantize_q4_1(lin.weight), dtype, bias, dense_above, dense_dtype, spectune_kernel=True)

    return replace_linears(head, int4)


INT8_MAX = 127


def requantize_rows(qt: QuantTensor, dtype: torch.dtype = torch.bfloat16) -> tuple[np.ndarray, np.ndarray]:
    """Per-row symmetric int8 of a matrix's exact GGUF weights, for PyTorch's per-channel int8 kernel.

    ``scale[n] = max_k |W[n, k]| / 127`` rounded to ``dtype`` (what the kernel multiplies by), then
    ``code[n, k] = round(W[n, k] / scale[n])`` clipped to [-127, 127]. Unlike the int4 halves this is a second
    quantization: each weight moves by at most half a step, ``scale[n] / 2`` = 1/254 of the row's largest weight
    (a Q8_0 block whose own ``d`` is the row's largest loses nothing; one with a smaller ``d`` keeps fewer levels).
    llama.cpp's own Q8_0 matmul is not exact either: it quantizes the activations to Q8_0 blocks
    (``ggml/src/ggml-cpu/ggml-cpu.c``, ``vec_dot_type`` of Q8_0 is Q8_0).

    Args:
        qt: any :class:`QuantTensor` (used for Q8_0 lm_heads: :func:`quantize_target` ``lm_head="int8"``).
        dtype: the activation dtype the scales are stored in.

    Returns:
        (codes int8 [N, K], scale float32 [N], already rounded to ``dtype``); ``codes * scale[:, None]`` are the
        weights the kernel computes with.
    """
    w = qt.dequantize()  # [N, K] float32, exact
    amax = np.abs(w).max(axis=1)
    scale = torch.from_numpy(np.where(amax > 0, amax / INT8_MAX, 1.0).astype(np.float32)).to(dtype).float().numpy()
    codes = np.clip(np.rint(w / scale[:, None]), -INT8_MAX, INT8_MAX).astype(np.int8)
    return codes, scale


class Int8RowLinear(_QuantLinear):
    """Inference-only linear layer over per-row int8 weights (PyTorch's ``_weight_int8pack_mm``,
    aten/src/ATen/native/cpu/int8mm_kernel.cpp: ``y = (x @ codes^T) * scale``, vectorised for AVX2 and AVX-512).

    Used for a Q8_0 lm_head where it is faster than two int4 halves (:func:`spectune.backends.local.weights.
    compute_paths.lm_head_kernel`): SmolLM2 decode, one thread, with AVX2 emulated on an AVX-512 CPU: +7% tokens/s at
    batch 1, +13% at batch 8; on the AVX-512 CPU itself +1% / +5%, so the probe keeps int4 there (docs/engine.md). The
    weights are :func:`requantize_rows` of the GGUF's (not bit-exact Q8_0).

    Args:
        qt: the weights (:class:`QuantTensor`, any type).
        dtype: activation dtype (bf16; the scales are stored in it).
        bias: optional [N] bias.
        dense_above, dense_dtype: as :class:`Int4Linear`: above this many rows a dense GEMM of :meth:`weights`.
        spectune_kernel: run ``spectune::int8_linear`` (:mod:`spectune.backends.local.kernels`: the same product,
            each weight row read once, the inputs as int16) instead of PyTorch's kernel; the ops must be loaded.
    """

    def __init__(self, qt: QuantTensor, dtype: torch.dtype = torch.bfloat16, bias: torch.Tensor | None = None,
                 dense_above: int | None = None, dense_dtype: torch.dtype = torch.float32,
                 spectune_kernel: bool = False) -> None:
        super().__init__()
        self.out_features, self.in_features = qt.shape
        self.qtype = qt.qtype
        self.spectune_kernel = spectune_kernel
        codes, scale = requantize_rows(qt, dtype)
        self.codes = torch.from_numpy(codes)  # [N, K] int8
        self.scale = torch.from_numpy(scale).to(dtype)  # [N]
        self._finish(dtype, bias, dense_above, self.weights, dense_dtype)

    def weights(self) -> torch.Tensor:
        """float32 [N, K]: the weights the kernel computes with (``codes * scale``)."""
        return self.codes.float() * self.scale.float()[:, None]

    def _kernel(self, x2: torch.Tensor) -> torch.Tensor:
        if self.spectune_kernel:
            return torch.ops.spectune.int8_linear(x2, self.codes, self.scale)
        return torch.ops.aten._weight_int8pack_mm(x2, self.codes, self.scale)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, qtype={self.qtype} as per-row "
                f"int8, dense_above={self.dense_above}, dense_dtype={str(self.dense_dtype).removeprefix('torch.')}")


def _permutation(rows: int, n_head: int) -> np.ndarray:
    """Row order that transformers' GGUF loader applies to llama.cpp's Q/K matrices (``_reverse_permute_weights``
    in transformers/modeling_gguf_pytorch_utils.py: per head, rows (dim, 2) -> (2, dim))."""
    dim = rows // n_head // 2
    return np.arange(rows).reshape(n_head, dim, 2).swapaxes(2, 1).reshape(rows)


def read_gguf_linears(path: str | Path, num_layers: int, num_heads: int, num_kv_heads: int,
                      tied: bool) -> tuple[dict[str, QuantTensor], dict[str, str]]:
    """The GGUF's linear layers in the engine's fused layout, as 4-bit codes.

    Args:
        path: a GGUF file of a Llama-family model.
        num_layers, num_heads, num_kv_heads: the model's shape (for the Q/K row order).
        tied: the model ties lm_head to the token embedding (lm_head is then ``token_embd``).

    Returns:
        (quantized, unsupported): quantized maps ``layers.{i}.qkv``, ``layers.{i}.o_proj``, ``layers.{i}.gate_up``,
        ``layers.{i}.down_proj`` and ``lm_head`` to :class:`QuantTensor`; unsupported maps the engine names whose
        GGUF tensors have another type (F16, Q6_K, ...) to that type name.

    Raises:
        UserError: a tensor the model needs is missing from the file.
    """
    reader = gguf_reader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    arch_field = reader.fields.get("general.architecture")
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode() if arch_field is not None else "llama"

    def get(name: str, perm_heads: int | None = None) -> QuantTensor | str:
        t = tensors.get(name)
        if t is None:
            raise UserError(f"{Path(path).name} lacks tensor {name!r}: is this a Llama-family GGUF?")
        qtype = t.tensor_type.name
        if qtype not in NATIVE_TYPES:
            return qtype
        qt = unpack(np.asarray(t.data), qtype, int(t.shape[0]))
        if perm_heads is not None and arch == "llama":
            qt = qt.rows(_permutation(qt.codes.shape[0], perm_heads))
        return qt

    def fused(engine_name: str, parts: list[QuantTensor | str], out: dict, bad: dict) -> None:
        strs = [p for p in parts if isinstance(p, str)]
        if strs:
            bad[engine_name] = strs[0]
        elif len({(p.codes.shape[1], p.repeat) for p in parts}) != 1:  # e.g. Q8_0 v next to Q4_1 q, k
            bad[engine_name] = "+".join(p.qtype for p in parts)
        else:
            out[engine_name] = parts[0] if len(parts) == 1 else concat_rows(parts)

    out: dict[str, QuantTensor] = {}
    bad: dict[str, str] = {}
    for i in range(num_layers):
        b = f"blk.{i}."
        p = f"layers.{i}."
        fused(p + "qkv", [get(b + "attn_q.weight", num_heads), get(b + "attn_k.weight", num_kv_heads),
                          get(b + "attn_v.weight")], out, bad)
        fused(p + "o_proj", [get(b + "attn_output.weight")], out, bad)
        fused(p + "gate_up", [get(b + "ffn_gate.weight"), get(b + "ffn_up.weight")], out, bad)
        fused(p + "down_proj", [get(b + "ffn_down.weight")], out, bad)
    head = "token_embd.weight" if tied or "output.weight" not in tensors else "output.weight"
    fused("lm_head", [get(head)], out, bad)
    return out, bad


def quantize_target(target: nn.Module, path: str | Path, dtype: torch.dtype = torch.bfloat16,
                    dense_above: int | None = None, lm_head: str = "int4",
                    dense_dtype: torch.dtype = torch.float32, spectune_int8: bool = False,
                    spectune_int4: bool = False) -> JsonObject:
    """Replace the target's linear layers by :class:`Int4Linear` over the GGUF's own quantized weights (and a Q8_0
    lm_head by :class:`Int8RowLinear` when ``lm_head`` is ``int8``).

    The model must have been loaded from the same GGUF (by :func:`spectune.backends.local.weights.loader.load_target`):
    its dense weights check the Q/K row order (layer 0's q rows must match the dequantized GGUF rows, else the GGUF's
    layout is not the one transformers assumes) and supply biases. The token embedding stays dense (a lookup reads
    one row per token).

    Args:
        target: a :class:`~backends.local.model.target.TargetModel` on CPU.
        path: its GGUF file.
        dtype: activation dtype (bf16: the kernel's vectorised variant).
        dense_above: row count above which every layer uses a dense copy of its weights (:class:`Int4Linear`);
            None: int4 only.
        dense_dtype: that copy's dtype, ``torch.float32`` or ``torch.bfloat16`` (oneDNN's bf16 GEMM).
        lm_head: ``int4`` (every type as int4 codes; Q8_0 as two exact halves) or ``int8`` (a Q8_0 lm_head
            requantized per row, :func:`requantize_rows`; other types stay int4).
        spectune_int8: an int8 lm_head runs ``spectune::int8_linear`` (:class:`Int8RowLinear`; the ops must be
            loaded) instead of PyTorch's kernel.
        spectune_int4: the int4 layers run ``spectune::int4_linear`` (:class:`Int4Linear`; an AVX-512 build of the
            ops must be loaded).

    Returns:
        ``{"replaced": number of layers, "types": {qtype: count}}``.

    Raises:
        UserError: a linear layer's GGUF type is not Q4_0, Q4_1 or Q8_0 (the message names it and the fix), the
            Q/K check fails, or PyTorch's int4 kernel refuses a layer (its RuntimeError, in one line).
    """
    cfg = target.cfg
    quant, bad = read_gguf_linears(path, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.tie_word_embeddings)
    if bad:
        name, qtype = next(iter(bad.items()))
        raise UserError(f"{Path(path).name}: {name} is {qtype}, not one of {', '.join(NATIVE_TYPES)} (or mixed): use "
                        "--dtype bfloat16 or float32 (dequantized weights)")
    q0 = quant["layers.0.qkv"]
    ref = target.layers[0].qkv.weight.detach().float()[: cfg.num_heads * cfg.head_dim]
    mine = torch.from_numpy(q0.dequantize()[: cfg.num_heads * cfg.head_dim])
    if not torch.allclose(mine, ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max())):
        raise UserError(f"{Path(path).name}: the quantized q rows do not match the dequantized model (unknown Q/K "
                        "layout): use --dtype bfloat16 or float32")
    types: dict[str, int] = {}
    for name, qt in quant.items():
        parent = target
        *path_parts, leaf = name.split(".")
        for part in path_parts:
            parent = getattr(parent, part)
        old = getattr(parent, leaf)
        bias = None if getattr(old, "bias", None) is None else old.bias.detach()
        kind = Int8RowLinear if name == "lm_head" and lm_head == "int8" and qt.qtype == "Q8_0" else Int4Linear
        spectune = spectune_int8 if kind is Int8RowLinear else spectune_int4
        try:
            layer = kind(qt, dtype, bias, dense_above, dense_dtype, spectune)
        except RuntimeError as err:  # this PyTorch's int4 (int8) kernel refuses the shape or lacks the op
            kernel = "int8" if kind is Int8RowLinear else "int4"
            raise UserError(f"{Path(path).name}: PyTorch's {kernel} CPU kernel cannot take {name} "
                            f"({' '.join(str(err).split())[:160]}): use --dtype bfloat16 or float32") from None
        setattr(parent, leaf, layer)
        for t in qt.qtype.split("+"):
            types[t] = types.get(t, 0) + 1
    return {"replaced": len(quant), "types": types}


def native_support(path: str | Path) -> tuple[bool, str, int]:
    """Whether every linear layer of a GGUF can run natively (types and shapes only: no tensor data is read).

    Returns:
        (ok, reason, lm_repeat): reason names the first tensor that cannot ("" when ok); lm_repeat is 2
        when lm_head is Q8_0 (two int4 halves), else 1.
    """
    reader = gguf_reader(str(path))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    linear_suffixes = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight",
                       "ffn_up.weight", "ffn_down.weight")
    head = "output.weight" if "output.weight" in types else "token_embd.weight"
    for t in reader.tensors:
        if t.name.endswith(linear_suffixes) or t.name == head:
            if t.tensor_type.name not in NATIVE_TYPES:
                return False, f"{t.name} is {t.tensor_type.name}", 1
            if int(t.shape[1]) % 16:  # the kernel's packing needs out_features % 16 == 0 (ggml shape: [in, out])
                return False, f"{t.name} has {int(t.shape[1])} outputs, not a multiple of 16", 1
    for i in range(max((int(n.split(".")[1]) for n in types if n.startswith("blk.")), default=-1) + 1):
        for group in (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up")):
            kinds = {types.get(f"blk.{i}.{g}.weight") == "Q8_0" for g in group}
            if len(kinds) > 1:
                return False, f"blk.{i}.{group[0]} mixes Q8_0 with 4-bit types", 1
    return True, "", 2 if types.get(head) == "Q8_0" else 1
