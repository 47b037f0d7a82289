"""Which compute path the engine runs, chosen per machine at start-up (``--dtype auto``) or forced by the flag.

Paths (``--dtype`` values):

- ``native``: the GGUF's own Q4_0/Q4_1/Q8_0 weights through PyTorch's int4 CPU kernel
  (:mod:`spectune.backends.local.weights.quant`), bf16 activations. GGUF targets on CPU only.
- ``bfloat16``: weights dequantized to bf16; on CPUs where oneDNN packs bf16 (AVX-512 BW/VL/DQ or AVX-NE-CONVERT)
  linears use the packed layout (:mod:`spectune.backends.local.model.linear`).
- ``float32``: weights dequantized to float32.

Why not one constant: bf16 dense matmuls need oneDNN's bf16 kernels, which need AVX-512 (BW, VL, DQ) or
AVX-NE-CONVERT. Without them (AVX2-only CPUs) PyTorch falls back to its reference bf16 GEMM, a scalar loop: 7.9 ms
for a [1, 576] x [576, 1536] product on a 2-core AVX2 EPYC (issue #17) where float32 takes 0.12-0.2 ms. The int4
kernel is PyTorch's own vectorised code for both AVX2 and AVX-512 with bf16 activations (its float32 variant is a
scalar loop). Rather than encode those rules, ``auto`` times each available path on the model's own shapes (one
gate|up-shaped linear, an lm_head-shaped one, both with weights streamed from DRAM, and a decode-shaped attention;
about 1-2 s) and estimates a decode
step: layers x (linear time x the layer's weights / gate|up's weights + attention) + lm_head. The cheapest wins.
The probe runs on one thread: with two or more, a kernel whose OpenMP barrier meets another busy process on
the machine waits a whole scheduler slice (about 16 ms, whatever the kernel), which made every path look alike on
a loaded 2-core machine; one thread ranks the kernels the same way on an idle machine and stays meaningful on a
busy one. The estimates are kept per machine (CPU model and flags, torch version, ISA overrides, model shapes) in
``$SPECTUNE_CACHE_DIR/engine-paths.json``, so every process on a machine (a sweep's server, ``draft eval``, the
tests) runs the same path and later starts skip the probe; delete the file to measure again. The choice and the
timings are logged and reported in ``/server_info`` (``engine_path``), which the ``local``
sweep backend copies into sweep.json (``backend.engine.path``). On CUDA ``auto`` is bfloat16.

The native path is itself a path per batch-size range: a second probe (:func:`dense_crossover`) times one gate|up-shaped
layer at 2 to 128 rows three ways (the int4 kernel; a float32 GEMM of the dequantized weights; the same weights in bf16
through oneDNN's GEMM, where oneDNN runs bf16: AMX tiles or AVX512-BF16), keeps whichever dense kind is faster at many
rows as ``dense_dtype``, and finds the row count above which it beats the int4 kernel (``dense_above``). Layers then run
the int4 kernel at up to ``dense_above`` rows (decode of small batches: memory-bound, where 4-bit weights read the
fewest bytes) and the dense copy above (prefill, verify of large batches: compute-bound). On a 2-core Xeon with AMX the
bf16 copy wins from 4-8 rows on and is 6-11x faster than the int4 kernel at 64-128 rows; the float32 copy is
never more than 1.5x faster there (docs/engine.md). The choice, its per-row timings and the ranges are kept
in the same file and reported in ``engine_path`` (``dense_dtype``, ``kernel_ranges``, ``dense_rows_ms``);
``--native-dense-above`` overrides the row count.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, TypedDict, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from spectune.backends.local.weights.loader import cache_dir
from spectune.loadgen.errors import UserError
from spectune.loadgen.json_types import JsonValue

if TYPE_CHECKING:
    from spectune.backends.local.model.config import ModelConfig
    from spectune.backends.local.weights.quant import QuantTensor

PATHS = ("auto", "native", "bfloat16", "float32")
ALIASES = {"bf16": "bfloat16", "fp32": "float32", "q": "native", "gguf": "native"}
log = logging.getLogger("spectune.engine")


class EnginePathJson(TypedDict):
    """:meth:`PathChoice.to_json`: ``/server_info`` ``engine_path`` (keys as :class:`PathChoice`'s attributes)."""

    path: str
    dtype: str
    chosen_by: str
    estimates_ms: dict[str, float]
    cpu_capability: str
    bf16_packed: bool
    dense_above_rows: int | None
    dense_dtype: str | None
    kernel_ranges: list[list[int | str | None]]
    dense_rows_ms: dict[str, dict[str, float]]
    lm_head: str | None
    compile: Mapping[str, object] | None
    dense_whole_step_ms: dict[str, dict[str, float]]


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


_Probe = TypeVar("_Probe", bound=Mapping[str, object])
"""A probe's result as :func:`_measured` keeps it: step estimates per path, a :class:`DenseCrossover` or a
:class:`LmHeadProbe`."""


@dataclass
class PathChoice:
    """The compute path in use.

    Attributes:
        name: ``native``, ``bfloat16`` or ``float32``.
        dtype: the activation (and dense-weight) dtype: bf16 for native and bfloat16, float32 for float32.
        chosen_by: ``flag`` (forced by --dtype), ``measured`` (auto, start-up timings) or ``device`` (auto on CUDA).
        estimates_ms: per candidate, the estimated decode-step milliseconds at batch 1 (auto on CPU only).
        cpu_capability: ``torch.backends.cpu.get_cpu_capability()`` (the ATen kernels' ISA: AVX2, AVX512, ...).
        bf16_packed: whether oneDNN's packed bf16 linears work on this CPU.
        dense_above: native path only: row count above which linears use a dense copy of the int4 weights
            (:func:`dense_crossover`; None: int4 only).
        dense_dtype: native path only: that copy's dtype, ``float32`` or ``bfloat16`` (oneDNN's GEMM), or None.
        dense_rows_ms: native path only: the crossover probe's ms per kernel per row count (``{"int4": {rows: ms},
            "float32": ..., "bfloat16": ...}``), empty when not probed.
        lm_head: native path only: the lm_head's kernel, ``int4`` or ``int8`` (a Q8_0 lm_head requantized per
            row; :func:`lm_head_kernel`); None on other paths.
        whole_step_ms: native path with a measured row count: the whole target forward's ms per kernel per row count
            (:func:`whole_step_crossover`, which set ``dense_above``), empty otherwise.
        compile: whether the batched layers run compiled (:meth:`spectune.backends.local.engine.compiled.CompileChoice.
            to_json`), or None before :func:`~spectune.backends.local.build.build_engine` decided.
    """

    name: str
    dtype: torch.dtype
    chosen_by: str
    estimates_ms: dict[str, float] = field(default_factory=dict)
    cpu_capability: str = ""
    bf16_packed: bool = False
    dense_above: int | None = None
    dense_dtype: str | None = None
    dense_rows_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    lm_head: str | None = None
    compile: Mapping[str, object] | None = None
    whole_step_ms: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def dense_torch_dtype(self) -> torch.dtype:
        """The dense copy's torch dtype (float32 when none is set)."""
        return torch.bfloat16 if self.dense_dtype == "bfloat16" else torch.float32

    def kernel_ranges(self) -> list[list[int | str | None]]:
        """Which kernel runs a linear layer at which row count (rows = batch x query positions per step):
        ``[[first_row, last_row or None, kernel], ...]``; one range on paths other than native."""
        if self.name != "native":
            return [[1, None, self.name]]
        if self.dense_above is None:
            return [[1, None, "int4"]]
        return [[1, self.dense_above, "int4"], [self.dense_above + 1, None, f"{self.dense_dtype or 'float32'} dense"]]

    def to_json(self) -> EnginePathJson:
        """JSON-ready description (``/server_info`` ``engine_path``)."""
        return {"path": self.name, "dtype": str(self.dtype).removeprefix("torch."), "chosen_by": self.chosen_by,
                "estimates_ms": {k: round(v, 3) for k, v in self.estimates_ms.items()},
                "cpu_capability": self.cpu_capability, "bf16_packed": self.bf16_packed,
                "dense_above_rows": self.dense_above, "dense_dtype": self.dense_dtype,
                "kernel_ranges": self.kernel_ranges(), "dense_rows_ms": self.dense_rows_ms,
                "lm_head": self.lm_head, "compile": self.compile, "dense_whole_step_ms": self.whole_step_ms}


def normalise(name: str) -> str:
    """Canonical path name for a ``--dtype`` value.

    Raises:
        UserError: an unknown value.
    """
    key = ALIASES.get(name.lower(), name.lower())
    if key not in PATHS:
        raise UserError(f"unknown --dtype {name!r}: use auto, native (GGUF's quantized weights), bfloat16 or float32")
    return key


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
    (:class:`~spectune.backends.local.weights.quant.Int8RowLinear`)."""
    from spectune.backends.local.model.linear import PackedLinear, packing_supported

    if path in ("native", "native-int8"):
        from spectune.backends.local.weights.quant import Int4Linear, Int8RowLinear

        kind, tensors = ((Int8RowLinear, ("codes", "scale")) if path == "native-int8"
                         else (Int4Linear, ("packed", "scales_zeros")))
        base = kind(_random_quant(n, k, 2 if path == "native-int8" else lm_repeat), torch.bfloat16)
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
DENSE_MEMORY_SHARE = 0.25
"""The dense copy of the native weights is kept only when it fits in this share of the available memory."""
DENSE_KIND_ROWS = 32
"""The dense dtype is the one faster summed over the probed row counts from this one up (many rows: prefill and the
verify of large batches, where the dense copy runs)."""
DENSE_PROBE = "native:dense-kernel:streamed"
"""The crossover probe's name in its cache key (:func:`_probe_key`): a new name when what it measures changes, so a
machine's kept result from an older probe is measured again instead of reused."""

MAX_STREAM_COPIES = 256
"""The most copies of a probe layer one streamed pass runs (SmolLM2's gate|up needs 59 int4 copies for 64 MiB)."""

#: the tensors each kernel of :class:`~spectune.backends.local.weights.quant.Int4Linear` reads
_KERNEL_TENSORS = {"int4": ("packed", "scales_zeros"), "float32": ("dense",), "bfloat16": ("dense",)}


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


def dense_crossover(cfg: ModelConfig, reps: int = 5, stream_rows: int = STREAM_ROWS) -> DenseCrossover:
    """Which dense copy of the native weights to keep and above which row count to use it, from timings of one
    gate|up-shaped layer of ``cfg`` (at most 4096 rows; one thread) at 1 row and each of :data:`DENSE_ROWS`: the int4
    kernel, a float32 GEMM of the dequantized weights, and (where oneDNN runs bf16:
    :func:`spectune.backends.local.model.linear.packing_supported`) the same weights in bf16 through oneDNN's GEMM.
    About 2 s.

    Up to ``stream_rows`` rows (:data:`STREAM_ROWS`; 0 times every count cache-resident, as the probe did before
    issue #71, which ``benchmarks/round_table.py`` compares) each kernel is timed with its weights streamed from DRAM (:func:`_streamed_ms`): a
    decode step of a few rows is memory-bound, and the dense bf16 copy reads four times the int4 bytes (float32 eight
    times). A cache-resident layer hides that: on a 2-core AMD EPYC Zen 4 VM it timed int4 and bf16 alike at 4 rows
    (0.1865 and 0.1857 ms), the engine took the dense copy from 3 rows on, and its batch-1 round at num_steps 2 (3
    rows) cost 55 ms against 28 ms with the int4 kernel (issue #71; docs/engine.md has the round table per path).

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
    kernels = {"int4": Int4Linear(qt, torch.bfloat16),
               "float32": Int4Linear(qt, torch.bfloat16, dense_above=0)}  # dense at any rows
    if packing_supported(torch.bfloat16, torch.device("cpu")):
        kernels["bfloat16"] = Int4Linear(qt, torch.bfloat16, dense_above=0, dense_dtype=torch.bfloat16)
    rows_ms: dict[str, dict[str, float]] = {name: {} for name in kernels}
    for rows in (1, *DENSE_ROWS):
        x = torch.randn(rows, cfg.hidden_size, dtype=torch.bfloat16)
        for name, layer in kernels.items():
            ms = (_streamed_ms(layer, _KERNEL_TENSORS[name], x, reps) if rows <= stream_rows
                  else _best_ms(lambda: layer(x), reps))
            rows_ms[name][str(rows)] = round(ms, 4)
    many = [str(r) for r in DENSE_ROWS if r >= DENSE_KIND_ROWS]
    kind = min((k for k in kernels if k != "int4"), key=lambda k: sum(rows_ms[k][r] for r in many))
    return {"dense_above_rows": crossover(rows_ms, kind), "dense_dtype": kind, "rows_ms": rows_ms}


WHOLE_STEP_ROWS = (2, 4, 8, 16, 32)
"""Row counts at which :func:`whole_step_crossover` times the whole target forward with each kernel."""
WHOLE_STEP_PROBE = "native:dense-whole-step"
""":func:`whole_step_crossover`'s name in its cache key (:func:`_probe_key`)."""


class WholeStepCrossover(TypedDict):
    """:func:`whole_step_crossover`'s result (kept in :func:`probe_cache_file`)."""

    dense_above_rows: int | None
    rows_ms: dict[str, dict[str, float]]


def whole_step_crossover(forward: Callable[[int], Callable[[], object]], layers: list[nn.Module], kind: str,
                         layer_answer: int | None, reps: int = 3) -> WholeStepCrossover:
    """The row count above which the native path's dense copy (``kind``) beats the int4 kernel on the whole target
    forward, timed on the model itself: ``forward(rows)`` gives a call running one target forward (with its logits)
    of one sequence over ``rows`` query tokens, and every layer of ``layers`` (the target's native linears, each holding
    a dense copy) is switched to one kernel for all rows (``dense_above`` very large, or 0) while that forward is timed
    at 1 row and each of :data:`WHOLE_STEP_ROWS` (fastest of ``reps``, eager, one thread as the caller's
    :func:`_measured` runs it; about 2 s for SmolLM2-135M). Every weight is read from memory as in decoding, with the
    model's own shapes and everything between the linears, which one layer's probe leaves out: on a 2-core Zen 5 VM
    the gate|up layer streamed timed int4 and the bf16 copy alike at 16 rows (0.566 and 0.589 ms) while batch-16 decode
    ran 218 tokens/s on the copy and 197 on int4 (``benchmarks/engine_speed.py``).

    The answer is the probed count below the first from which the copy wins at every larger count (1 when it wins from
    2 rows); when it does not win even at the largest count, the layer probe's ``layer_answer`` where that is larger
    (many rows are compute-bound, which the layer probe measures well), else the largest count; None when the layer
    probe found no crossover either. ``layers`` get their ``dense_above`` back afterwards.
    """
    rows_ms: dict[str, dict[str, float]] = {"int4": {}, kind: {}}
    saved = [m.dense_above for m in layers]
    try:
        for rows in (1, *WHOLE_STEP_ROWS):
            run = forward(rows)
            for name, above in (("int4", 1 << 30), (kind, 0)):
                for m in layers:
                    m.dense_above = above
                rows_ms[name][str(rows)] = round(_best_ms(run, reps), 3)
    finally:
        for m, above in zip(layers, saved):
            m.dense_above = above
    wins = [rows_ms["int4"][str(r)] > rows_ms[kind][str(r)] for r in WHOLE_STEP_ROWS]
    first = next((i for i in range(len(wins)) if all(wins[i:])), None)
    if first is None:
        above = None if layer_answer is None else max(layer_answer, WHOLE_STEP_ROWS[-1])
    else:
        above = WHOLE_STEP_ROWS[first - 1] if first > 0 else 1
    return {"dense_above_rows": above, "rows_ms": rows_ms}


def choose_dense_on_whole_step(choice: PathChoice, cfg: ModelConfig, lm_repeat: int, layers: list[nn.Module],
                               forward: Callable[[int], Callable[[], object]]) -> None:
    """Set ``choice.dense_above`` (and every layer of ``layers``) from :func:`whole_step_crossover` on the built model,
    kept per machine like the other probes; a layer whose copy is then never used drops it. Only for the native path
    with a measured (``auto``) row count and a dense copy; does nothing otherwise."""
    if choice.name != "native" or choice.dense_above is None or not layers:
        return
    kind = choice.dense_dtype or "float32"
    layer_answer = choice.dense_above
    key = _probe_key([WHOLE_STEP_PROBE, kind], cfg, lm_repeat)
    probe = _measured(key, lambda: whole_step_crossover(forward, layers, kind, layer_answer))
    choice.dense_above = probe["dense_above_rows"]
    choice.whole_step_ms = probe["rows_ms"]
    for m in layers:
        m.dense_above = choice.dense_above
        if choice.dense_above is None:
            m.dense = m.dense_bias = None
    if choice.dense_above is None:
        choice.dense_dtype = None
    log.info("dense copy above %s rows on the whole step (one layer's probe: above %s; target forward ms, int4 / %s: "
             "%s)", choice.dense_above, layer_answer, kind,
             ", ".join(f"{r} rows {probe['rows_ms']['int4'][r]:.1f}/{probe['rows_ms'][kind][r]:.1f}"
                       for r in probe["rows_ms"]["int4"]))


def kernel_timings(cfg: ModelConfig, lm_repeat: int = 1) -> tuple[DenseCrossover, int]:
    """The crossover probe's result for ``cfg`` on this machine (kept per machine, measured now when absent) and the
    probe layer's weights (rows x inputs), from which a step model takes each kernel's time per weight
    (:mod:`spectune.backends.local.engine.step_model`)."""
    probe = _measured(_probe_key([DENSE_PROBE], cfg, lm_repeat), lambda: dense_crossover(cfg))
    return probe, min(2 * cfg.intermediate_size, 4096) * cfg.hidden_size


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


def lm_head_kernel(cfg: ModelConfig, reps: int = 5) -> LmHeadProbe:
    """Time a Q8_0 lm_head of ``cfg``'s shape (at most 8192 rows, scaled; one row, weights from DRAM) both ways:
    two exact int4 halves (:class:`~spectune.backends.local.weights.quant.Int4Linear`) and per-row int8
    (:class:`~spectune.backends.local.weights.quant.Int8RowLinear`). Returns ``{"int4_ms", "int8_ms", "kernel"}`` with
    the faster kernel's name (int8 only when it saves at least 10%: it is a second quantization). About 0.3 s."""
    rows = min(cfg.vocab_size, 8192)
    scale = cfg.vocab_size / rows
    int4 = _linear_ms("native", rows, cfg.hidden_size, reps, 2) * scale
    int8 = _linear_ms("native-int8", rows, cfg.hidden_size, reps) * scale
    return {"int4_ms": int4, "int8_ms": int8, "kernel": "int8" if int8 < 0.9 * int4 else "int4"}


def dense_fits(cfg: ModelConfig) -> bool:
    """Whether a float32 copy of the target's linear weights (4 bytes per weight, the larger of the two dense kinds)
    fits in :data:`DENSE_MEMORY_SHARE` of the memory available now (``os.sysconf``; True where that is unknown)."""
    h, inter = cfg.hidden_size, cfg.intermediate_size
    q_out = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    weights = cfg.num_layers * (h * q_out + cfg.num_heads * cfg.head_dim * h + 3 * inter * h) + cfg.vocab_size * h
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return True
    return 4 * weights <= DENSE_MEMORY_SHARE * available


def choose_path(requested: str, device: torch.device, cfg: ModelConfig, native_ok: bool, native_reason: str = "",
                lm_repeat: int = 1, dense_above: str = "auto", lm_head: str = "auto",
                dense_dtype: str = "auto") -> PathChoice:
    """Resolve ``--dtype`` into a :class:`PathChoice`.

    Args:
        requested: a ``--dtype`` value (see :data:`PATHS`).
        device: the engine's device.
        cfg: the target's :class:`~backends.local.model.config.ModelConfig` (shapes for the probe).
        native_ok: the target is a GGUF whose linear layers are all Q4_0/Q4_1/Q8_0.
        native_reason: why native is unavailable (for the error message when it is forced).
        lm_repeat: 2 when the GGUF's lm_head is Q8_0 (two int4 halves), else 1.
        dense_above: for the native path, ``auto`` (measured by :func:`dense_crossover` where the dense copy
            fits, kept with the estimates), ``off`` (int4 only) or a row count.
        lm_head: for the native path with a Q8_0 lm_head (``lm_repeat`` 2): ``auto`` (:func:`lm_head_kernel`,
            kept with the estimates), ``int4`` or ``int8``; any other lm_head is int4.
        dense_dtype: for the native path, the dense copy's dtype: ``auto`` (the faster at many rows, measured),
            ``float32`` or ``bfloat16`` (:data:`DENSE_DTYPES`).

    Raises:
        UserError: an unknown value, or ``native`` where it cannot run (CUDA, a non-GGUF model, other types), or a
            ``dense_above`` that is not auto, off or a row count, an ``lm_head`` not in auto, int4, int8, or a
            ``dense_dtype`` not in :data:`DENSE_DTYPES` (bfloat16 where oneDNN has no bf16 GEMM).
    """
    from spectune.backends.local.model.linear import packing_supported

    name = normalise(requested)
    cap = torch.backends.cpu.get_cpu_capability() if device.type == "cpu" else ""
    packed = device.type == "cpu" and packing_supported(torch.bfloat16, device)
    if name == "native":
        if device.type != "cpu":
            raise UserError("--dtype native runs on CPU only: use --dtype bfloat16 on CUDA")
        if not native_ok:
            raise UserError(f"--dtype native needs a GGUF with Q4_0, Q4_1 or Q8_0 linear weights ({native_reason}): "
                            "use --dtype bfloat16 or float32")
    if name != "auto":
        dtype = torch.float32 if name == "float32" else torch.bfloat16
        choice = PathChoice(name, dtype, "flag", cpu_capability=cap, bf16_packed=packed)
        return _with_lm_head(_with_dense(choice, cfg, lm_repeat, dense_above, dense_dtype), cfg, lm_repeat, lm_head)
    if device.type != "cpu":
        return PathChoice("bfloat16", torch.bfloat16, "device")
    candidates = (["native"] if native_ok else []) + ["bfloat16", "float32"]
    key = _probe_key(candidates, cfg, lm_repeat)
    est = _measured(key, lambda: {c: estimate_step_ms(c, cfg, lm_repeat) for c in candidates})
    rows = _measured(_probe_key([DENSE_PROBE], cfg, lm_repeat), lambda: dense_crossover(cfg))
    per_batch = batch_estimates(est, rows["rows_ms"], packed, copies=dense_fits(cfg) and dense_above != "off")
    best = min(candidates, key=lambda c: sum(per_batch[c][b] / min(per_batch[o][b] for o in candidates)
                                             for b in per_batch[c]))
    flat = {**est, **{f"{c}@{b}": v for c, by in per_batch.items() for b, v in by.items() if b != "1"}}
    choice = PathChoice(best, torch.float32 if best == "float32" else torch.bfloat16, "measured", flat, cap, packed)
    choice = _with_lm_head(_with_dense(choice, cfg, lm_repeat, dense_above, dense_dtype), cfg, lm_repeat, lm_head)
    timings = ", ".join(f"{c} ~{'/'.join(f'{v:.1f}' for v in by.values())} ms/step" for c, by in per_batch.items())
    log.info("engine path %s (at batch %s: %s; dense above %s rows; lm_head %s)", best, "/".join(BATCHES), timings,
             choice.dense_above, choice.lm_head)
    return choice


BATCHES = ("1", "4", "16")
"""Batch sizes (decode rows per linear) whose estimated steps choose the path: small batches are memory-bound, where
bytes per weight decide; large ones compute-bound, where the GEMM kernel decides."""


def batch_estimates(step_ms: dict[str, float], rows_ms: dict[str, dict[str, float]],
                    packed: bool, copies: bool = True) -> dict[str, dict[str, float]]:
    """Estimated decode step (ms) per path at each of :data:`BATCHES`, from the batch-1 estimates ``step_ms``
    (:func:`estimate_step_ms`, weights from DRAM) and the per-row timings of one gate|up-shaped layer
    (``rows_ms``: :func:`dense_crossover`'s): a step costs at least its batch-1 time (reading every weight once), and
    at b rows its linears cost the batch-1 step scaled by its kernel's time at b rows over its time at one row, as a
    roofline would (the larger of memory and compute). bfloat16 without oneDNN's bf16 kernels (``packed`` False:
    PyTorch's scalar GEMM) grows with the rows.

    The native path runs its int4 kernel or, where ``copies`` (the dense copy fits in memory), its dense copy, at each
    row count whichever is faster, so at b rows it costs the least of its int4 estimate and each dense kind's own step
    estimate there (the float32 path's; the bfloat16 path's where oneDNN runs bf16). Scaling native's batch-1 step by
    the copy's time over int4's one-row time instead mixed two probes: on a 2-core Zen 5 VM it put native at 2.7x the
    bfloat16 path at batch 16 (44.3 vs 16.4 ms) where both run the same bf16 GEMM, ``auto`` chose the bfloat16 path,
    and the main job ran 0.54x the native path's decode speed at batch 1 and 0.65x at batch 4
    (``benchmarks/engine_speed.py``, docs/engine.md).

    Returns:
        ``{path: {batch: ms}}`` for the paths in ``step_ms``.
    """
    first = str(min(int(r) for r in rows_ms["int4"]))
    kernel = {"native": "int4", "bfloat16": "bfloat16" if packed else None, "float32": "float32"}

    def own(path: str, b: str) -> float:
        """The path's step at b rows on its own kernel."""
        k = kernel[path]
        if k is None or k not in rows_ms or b not in rows_ms[k] or not rows_ms[k].get(first):
            return step_ms[path] * (1.0 if b == "1" else int(b))
        return step_ms[path] * max(1.0, rows_ms[k][b] / rows_ms[k][first])

    out: dict[str, dict[str, float]] = {}
    for path in step_ms:
        out[path] = {}
        for b in BATCHES:
            ms = own(path, b)
            if path == "native" and copies and b != "1":  # one row always runs the int4 kernel (dense_above >= 1)
                dense = [own(k, b) for k in ("float32", "bfloat16") if k in step_ms and kernel[k] is not None]
                ms = min([ms, *dense])
            out[path][b] = ms
    return out


def _with_lm_head(choice: PathChoice, cfg: ModelConfig, lm_repeat: int, lm_head: str) -> PathChoice:
    """``choice`` with its ``lm_head`` kernel set (native only; see :func:`choose_path`)."""
    value = str(lm_head).strip().lower()
    if value not in LM_HEAD_KERNELS:
        raise UserError(f"--native-lm-head {lm_head!r}: use auto, int4 or int8")
    if choice.name != "native":
        return choice
    if lm_repeat != 2:  # a 4-bit lm_head is one int4 pass already
        choice.lm_head = "int4"
    elif value != "auto":
        choice.lm_head = value
    else:
        key = _probe_key(["native:lm-head"], cfg, lm_repeat)
        probe = _measured(key, lambda: lm_head_kernel(cfg))
        choice.lm_head = probe["kernel"]
        choice.estimates_ms.update({"lm_head_int4": probe["int4_ms"], "lm_head_int8": probe["int8_ms"]})
    return choice


def _with_dense(choice: PathChoice, cfg: ModelConfig, lm_repeat: int, dense_above: str,
                dense_dtype: str = "auto") -> PathChoice:
    """``choice`` with its ``dense_above`` and ``dense_dtype`` set (native only; see :func:`choose_path`): the dtype
    from :func:`dense_crossover` for ``auto`` (else as given), the row count its :func:`crossover` for ``auto``
    where the copy fits (:func:`dense_fits`); a forced row count skips the fit check."""
    value = str(dense_above).strip().lower()
    kind = str(dense_dtype).strip().lower()
    if value not in ("auto", "off") and not (value.isdigit() and int(value) >= 1):
        raise UserError(f"--native-dense-above {dense_above!r}: use auto, off or a row count >= 1")
    if kind not in DENSE_DTYPES:
        raise UserError(f"--native-dense-dtype {dense_dtype!r}: use {', '.join(DENSE_DTYPES)}")
    if choice.name != "native" or value == "off":
        return choice
    if value == "auto" and not dense_fits(cfg):
        log.info("no dense copy of the native weights: it would take more than %d%% of the available memory",
                 int(DENSE_MEMORY_SHARE * 100))
        return choice
    key = _probe_key([DENSE_PROBE], cfg, lm_repeat)
    probe = _measured(key, lambda: dense_crossover(cfg))
    if kind == "bfloat16" and "bfloat16" not in probe["rows_ms"]:
        raise UserError("--native-dense-dtype bfloat16: oneDNN has no bf16 GEMM on this CPU (needs AVX-512 BW/VL/DQ "
                        "or AVX-NE-CONVERT): use auto or float32")
    choice.dense_dtype = probe["dense_dtype"] if kind == "auto" else kind
    choice.dense_rows_ms = probe["rows_ms"]
    choice.dense_above = int(value) if value != "auto" else crossover(probe["rows_ms"], choice.dense_dtype)
    if choice.dense_above is None:
        choice.dense_dtype = None
    return choice


DENSE_DTYPES = ("auto", "float32", "bfloat16")
"""``--native-dense-dtype`` values: the dense copy's dtype, measured (``auto``) or forced."""


def _measured(key: str, probe: Callable[[], _Probe]) -> _Probe:
    """The probe's result kept under ``key`` in :func:`probe_cache_file`, else ``probe()`` run now on one thread
    (see the module docstring: one thread ranks kernels even on a busy machine) and stored."""
    result: _Probe | None = _cached_estimates(key)  # the JSON that probe() returned for this key, stored earlier
    if result is None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.inference_mode():
                result = probe()
        finally:
            torch.set_num_threads(threads)
        _store_estimates(key, result)
    return result


def probe_cache_file() -> Path:
    """Where measured estimates are kept per machine: ``$SPECTUNE_CACHE_DIR/engine-paths.json`` (delete it to
    measure again)."""
    return cache_dir() / "engine-paths.json"


def _probe_key(candidates: list[str], cfg: ModelConfig, lm_repeat: int) -> str:
    """What the estimates depend on: the CPU (model name and flags), torch's version and capability, the ISA
    overrides in the environment, and the model's shapes."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f.read().splitlines() if ln.startswith(("model name", "flags"))][:2]
        cpu = "|".join(lines)
    except OSError:
        pass
    parts = {"cpu": cpu, "torch": torch.__version__, "cap": torch.backends.cpu.get_cpu_capability(),
             "env": [os.environ.get(v) for v in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                                 "MKL_ENABLE_INSTRUCTIONS")],
             "shape": [cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers, cfg.num_heads,
                       cfg.num_kv_heads, cfg.head_dim, lm_repeat], "candidates": candidates}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _cached_estimates(key: str) -> JsonValue:
    try:
        return json.loads(probe_cache_file().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None


def _store_estimates(key: str, est: Mapping[str, object]) -> None:
    """Add ``est`` under ``key`` (atomic rename; a failure to write only costs a probe next time)."""
    path = probe_cache_file()
    try:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        data[key] = est
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    except OSError:
        pass
