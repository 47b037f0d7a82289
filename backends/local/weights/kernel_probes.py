"""Timing probes behind the compute path (:mod:`spectune.backends.local.weights.compute_paths`): one kernel call at a
time, one thread, each weight streamed from DRAM where a decode step would stream it.

- :func:`estimate_step_ms`: a batch-1 decode step per path from one gate|up-shaped and one lm_head-shaped linear and a
  decode-shaped attention.
- :func:`dense_crossover`: the native path's int4 kernel against its dense copies at 1-128 rows (streamed up to
  :data:`STREAM_ROWS`), and :func:`crossover`, the row count above which a copy keeps winning.
- :func:`lm_head_kernel`: a Q8_0 lm_head as two int4 halves or per-row int8.

compute_paths keeps their results per machine and decides from them; docs/engine.md has the timings per CPU.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, TypedDict

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from spectune.backends.local.model.config import ModelConfig
    from spectune.backends.local.weights.quant import QuantTensor


class DenseCrossover(TypedDict):
    """:func:`dense_crossover`'s result (kept in :func:`probe_cache_file`)."""

    dense_above_rows: int | None
    dense_dtype: str
    rows_ms: dict[str, dict[str, float]]


class LmHeadProbe(TypedDict):
    """:func:`lm_head_kernel`'s result (kept in :func:`probe_cache_file`)."""

    int4_ms: float
    int8_ms: float
    kernel: str


def _best_ms(fn: Callable[[], object], reps: int) -> float:
    """Fastest of ``reps`` timed calls after a warm-up, in ms (the minimum: another busy process on the machine
    only ever adds time, and a preempted OpenMP barrier adds a whole scheduler slice)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


STREAM_BYTES = 64 * 2**20  # weights streamed per timed pass: more than a server CPU's last-level cache


def _random_quant(n: int, k: int, repeat: int = 1) -> QuantTensor:
    """A random [n, k] :class:`~spectune.backends.local.weights.quant.QuantTensor` (codes 0..15, scale 0.01, zero 0;
    ``repeat`` 2 for a Q8_0-shaped one): probe weights."""
    import numpy as np

    from spectune.backends.local.weights.quant import QK, QuantTensor

    g = k * repeat // QK
    codes = np.random.default_rng(0).integers(0, 16, (n, k * repeat), dtype=np.uint8)
    return QuantTensor(codes, np.full((n, g), 0.01, np.float32), np.zeros((n, g), np.float32), repeat, "Q4_1")


def _linear_ms(path: str, n: int, k: int, reps: int, lm_repeat: int = 1) -> float:
    """Milliseconds of one [1, k] x [k, n] product as ``path`` computes it, weights read from DRAM as in a decode
    step (each timed pass runs copies of the layer whose weights add up to :data:`STREAM_BYTES`; random weights).
    ``path`` is a ``--dtype`` value, or ``native-int8`` for a Q8_0-shaped matrix as per-row int8
    (:class:`~spectune.backends.local.weights.quant.Int8RowLinear`; ``native-int8-spectune``: through
    ``spectune::int8_linear``)."""
    from spectune.backends.local.model.linear import PackedLinear, packing_supported

    if path in ("native", "native-int8", "native-int8-spectune"):
        from spectune.backends.local.weights.quant import Int4Linear, Int8RowLinear

        int8 = path != "native"
        kind = Int8RowLinear if int8 else Int4Linear
        base = kind(_random_quant(n, k, 2 if int8 else lm_repeat), torch.bfloat16,
                    spectune_kernel=path == "native-int8-spectune")
        tensors = ("codes", "scale") if int8 else base.kernel_tensors
        copies = max(1, -(-STREAM_BYTES // sum(getattr(base, t).nbytes for t in tensors)))
        mods: list[nn.Module] = []
        for _ in range(copies):
            m = kind.__new__(kind)
            m.__dict__.update(base.__dict__)
            for t in tensors:
                setattr(m, t, getattr(base, t).clone())
            mods.append(m)
        x = torch.randn(1, k, dtype=torch.bfloat16)
    else:
        dtype = torch.bfloat16 if path == "bfloat16" else torch.float32
        base = nn.Linear(k, n, bias=False).to(dtype).requires_grad_(False)
        copies = max(1, -(-STREAM_BYTES // base.weight.nbytes))
        pack = dtype == torch.bfloat16 and packing_supported(dtype, torch.device("cpu"))
        mods = []
        for _ in range(copies):
            m = nn.Linear(k, n, bias=False, dtype=dtype).requires_grad_(False)
            m.weight.copy_(base.weight)
            mods.append(PackedLinear(m) if pack else m)
        x = torch.randn(1, k, dtype=dtype)

    def run() -> None:
        for m in mods:
            m(x)

    return _best_ms(run, reps) / copies


def _attention_fn(dtype: torch.dtype, kv_heads: int, group: int, head_dim: int, length: int = 256) -> Callable:
    q = torch.randn(1, kv_heads, group, head_dim, dtype=dtype)
    k = torch.randn(1, kv_heads, length, head_dim, dtype=dtype)
    v = torch.randn_like(k)
    mask = torch.ones(1, 1, group, length, dtype=torch.bool)
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def estimate_step_ms(path: str, cfg: ModelConfig, lm_repeat: int = 1, reps: int = 5) -> float:
    """Estimated batch-1 decode step of ``path`` for a model of shape ``cfg`` (:class:`ModelConfig`), in ms.

    Large matrices are timed on at most 4096 rows (gate|up) and 8192 rows (lm_head) and scaled by rows, so the
    probe stays around a second for 8B-class shapes. Weights stream from DRAM (:func:`_linear_ms`): a decode step
    reads every weight once, so bytes per weight decide, which a cache-resident probe would hide.
    """
    h, inter = cfg.hidden_size, cfg.intermediate_size
    rows_gu = min(2 * inter, 4096)
    rows_lm = min(cfg.vocab_size, 8192)
    t_gu = _linear_ms(path, rows_gu, h, reps) * (2 * inter / rows_gu)
    t_lm = _linear_ms(path, rows_lm, h, reps, lm_repeat) * (cfg.vocab_size / rows_lm)
    dtype = torch.float32 if path == "float32" else torch.bfloat16
    t_att = _best_ms(_attention_fn(dtype, cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim), reps)
    q_out = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    layer_weights = h * q_out + cfg.num_heads * cfg.head_dim * h + 3 * inter * h
    return cfg.num_layers * (t_gu * layer_weights / (2 * inter * h) + t_att) + t_lm


DENSE_ROWS = (2, 4, 8, 16, 32, 64, 128)
"""Row counts the crossover probe times (int4 kernel vs the dense copies)."""
STREAM_ROWS = 16
"""The crossover probe times row counts up to this one with the weights streamed from DRAM (:func:`_streamed_ms`), as a
decode step of a few rows reads every weight once and is memory-bound; larger counts are compute-bound and timed on one
cache-resident layer (streaming would multiply the probe's time for little change)."""
DENSE_KIND_ROWS = 32
"""The dense dtype is the one faster summed over the probed row counts from this one up (many rows: prefill and the
verify of large batches, where the dense copy runs)."""
MAX_STREAM_COPIES = 256
"""The most copies of a probe layer one streamed pass runs (SmolLM2's gate|up needs 59 int4 copies for 64 MiB)."""

#: the tensors each dense kernel of :class:`~spectune.backends.local.weights.quant.Int4Linear` reads (the int4 kernel's:
#: its ``kernel_tensors``)
_KERNEL_TENSORS = {"float32": ("dense",), "bfloat16": ("dense",)}


def _streamed_ms(layer: nn.Module, tensors: tuple[str, ...], x: torch.Tensor, reps: int) -> float:
    """Milliseconds of ``layer(x)`` with its weights read from DRAM, as a whole decode step reads them: each timed pass
    runs copies of ``layer`` whose ``tensors`` (the ones its kernel reads at these rows) add up to
    :data:`STREAM_BYTES`, more than a server CPU's last-level cache (at most :data:`MAX_STREAM_COPIES`: a tiny
    test model's layers stay in cache whatever the probe does)."""
    copies = min(MAX_STREAM_COPIES, max(1, -(-STREAM_BYTES // sum(getattr(layer, t).nbytes for t in tensors))))
    mods: list[nn.Module] = []
    for _ in range(copies):
        m = layer.__class__.__new__(layer.__class__)
        m.__dict__.update(layer.__dict__)
        m.__dict__["_parameters"], m.__dict__["_buffers"] = dict(layer._parameters), dict(layer._buffers)
        for t in tensors:
            setattr(m, t, getattr(layer, t).clone())
        mods.append(m)

    def run() -> None:
        for m in mods:
            m(x)

    return _best_ms(run, reps) / copies


def dense_crossover(cfg: ModelConfig, reps: int = 5, stream_rows: int = STREAM_ROWS,
                    spectune_int4: bool = False) -> DenseCrossover:
    """Which dense copy of the native weights to keep and above which row count to use it, from timings of one
    gate|up-shaped layer of ``cfg`` (at most 4096 rows; one thread) at 1 row and each of :data:`DENSE_ROWS`: the int4
    kernel (spectune's ``spectune::int4_linear`` with ``spectune_int4``, the ops loaded; else PyTorch's), a float32
    GEMM of the dequantized weights, and (where oneDNN runs bf16:
    :func:`spectune.backends.local.model.linear.packing_supported`) the same weights in bf16 through oneDNN's GEMM.
    About 2 s.

    Up to ``stream_rows`` rows (:data:`STREAM_ROWS`; 0 times every count cache-resident, as the probe did before issue
    #71, which ``benchmarks/round_table.py`` compares) each kernel is timed with its weights streamed from DRAM
    (:func:`_streamed_ms`): a decode step of a few rows is memory-bound, and the dense bf16 copy reads four times the
    int4 bytes (float32 eight times). A cache-resident layer hides that: on the machine of issue #71 it timed int4 and
    bf16 alike at 4 rows (0.1865 and 0.1857 ms), the engine took the dense copy from 3 rows on, and its batch-1 round at
    num_steps 2 (3 rows) cost 55 ms against 28 ms with the int4 kernel (issue #71; docs/engine.md has the round table
    per path).

    The dense dtype is the kind with the smaller time summed over row counts >= :data:`DENSE_KIND_ROWS`. Rows r
    qualify when that kind beats the int4 kernel at r and at every larger probed count; ``dense_above_rows`` is the
    probed count below the first qualifying one (so "dense above 16" when it wins from 32 up; 1 when it wins at 2
    rows already), or None when it never wins.

    Returns:
        ``{"dense_above_rows": int | None, "dense_dtype": "float32" | "bfloat16", "rows_ms": {kernel: {rows: ms}}}``.
    """
    from spectune.backends.local.model.linear import packing_supported
    from spectune.backends.local.weights.quant import Int4Linear

    qt = _random_quant(min(2 * cfg.intermediate_size, 4096), cfg.hidden_size)
    kernels = {"int4": Int4Linear(qt, torch.bfloat16, spectune_kernel=spectune_int4),
               "float32": Int4Linear(qt, torch.bfloat16, dense_above=0)}  # dense at any rows
    if packing_supported(torch.bfloat16, torch.device("cpu")):
        kernels["bfloat16"] = Int4Linear(qt, torch.bfloat16, dense_above=0, dense_dtype=torch.bfloat16)
    rows_ms: dict[str, dict[str, float]] = {name: {} for name in kernels}
    for rows in (1, *DENSE_ROWS):
        x = torch.randn(rows, cfg.hidden_size, dtype=torch.bfloat16)
        for name, layer in kernels.items():
            ms = (_streamed_ms(layer, _KERNEL_TENSORS.get(name, layer.kernel_tensors), x, reps) if rows <= stream_rows
                  else _best_ms(lambda: layer(x), reps))
            rows_ms[name][str(rows)] = round(ms, 4)
    many = [str(r) for r in DENSE_ROWS if r >= DENSE_KIND_ROWS]
    kind = min((k for k in kernels if k != "int4"), key=lambda k: sum(rows_ms[k][r] for r in many))
    return {"dense_above_rows": crossover(rows_ms, kind), "dense_dtype": kind, "rows_ms": rows_ms}


def crossover(rows_ms: dict[str, dict[str, float]], kind: str) -> int | None:
    """The row count above which the dense ``kind`` (``float32`` or ``bfloat16``) keeps beating the int4 kernel in
    :func:`dense_crossover`'s timings ``rows_ms``: the probed count below the first of :data:`DENSE_ROWS` from which
    it wins at every larger count (1 when it wins from 2 rows), or None when it never does (or was not timed)."""
    if kind not in rows_ms:
        return None
    wins = [rows_ms["int4"][str(r)] > rows_ms[kind][str(r)] for r in DENSE_ROWS]
    first = next((i for i in range(len(wins)) if all(wins[i:])), None)
    return None if first is None else (DENSE_ROWS[first - 1] if first > 0 else 1)


LM_HEAD_KERNELS = ("auto", "int4", "int8")


def lm_head_kernel(cfg: ModelConfig, reps: int = 5, spectune_int8: bool = False) -> LmHeadProbe:
    """Time a Q8_0 lm_head of ``cfg``'s shape (at most 8192 rows, scaled; one row, weights from DRAM) both ways:
    two exact int4 halves (:class:`~spectune.backends.local.weights.quant.Int4Linear`) and per-row int8
    (:class:`~spectune.backends.local.weights.quant.Int8RowLinear`; with ``spectune_int8``, through
    ``spectune::int8_linear``, which must be loaded). Returns ``{"int4_ms", "int8_ms", "kernel"}`` with the faster
    kernel's name (int8 only when it saves at least 10%: it is a second quantization). About 0.3 s."""
    rows = min(cfg.vocab_size, 8192)
    scale = cfg.vocab_size / rows
    int4 = _linear_ms("native", rows, cfg.hidden_size, reps, 2) * scale
    int8 = _linear_ms("native-int8-spectune" if spectune_int8 else "native-int8", rows, cfg.hidden_size, reps) * scale
    return {"int4_ms": int4, "int8_ms": int8, "kernel": "int8" if int8 < 0.9 * int4 else "int4"}
