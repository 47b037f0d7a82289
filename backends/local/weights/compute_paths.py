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

On the native path a second probe (:func:`dense_crossover`) finds the row count above which a float32 GEMM of the
dequantized weights beats the int4 kernel (prefill, large verify batches; :mod:`spectune.backends.local.weights.quant`),
kept in the same file; ``--native-dense-above`` overrides it.
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
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from spectune.backends.local.weights.loader import cache_dir
from spectune.loadgen.errors import UserError

if TYPE_CHECKING:
    from spectune.backends.local.model.config import ModelConfig
    from spectune.backends.local.weights.quant import QuantTensor

PATHS = ("auto", "native", "bfloat16", "float32")
ALIASES = {"bf16": "bfloat16", "fp32": "float32", "q": "native", "gguf": "native"}
log = logging.getLogger("spectune.engine")


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
        dense_above: native path only: row count above which linears use a float32 copy of the int4 weights
            (:func:`dense_crossover`; None: int4 only).
        lm_head: native path only: the lm_head's kernel, ``int4`` or ``int8`` (a Q8_0 lm_head requantized per
            row; :func:`lm_head_kernel`); None on other paths.
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
    lm_head: str | None = None
    compile: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON-ready description (``/server_info`` ``engine_path``)."""
        return {"path": self.name, "dtype": str(self.dtype).removeprefix("torch."), "chosen_by": self.chosen_by,
                "estimates_ms": {k: round(v, 3) for k, v in self.estimates_ms.items()},
                "cpu_capability": self.cpu_capability, "bf16_packed": self.bf16_packed,
                "dense_above_rows": self.dense_above, "lm_head": self.lm_head, "compile": self.compile}


def normalise(name: str) -> str:
    """Canonical path name for a ``--dtype`` value.

    Raises:
        UserError: an unknown value.
    """
    key = ALIASES.get(name.lower(), name.lower())
    if key not in PATHS:
        raise UserError(f"unknown --dtype {name!r}: use auto, native (GGUF's quantized weights), bfloat16 or float32")
    return key


def _best_ms(fn: Callable[[], Any], reps: int) -> float:
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
"""Row counts the crossover probe times (int4 kernel vs float32 GEMM)."""
DENSE_MEMORY_SHARE = 0.25
"""The float32 copy of the native weights is kept only when it fits in this share of the available memory."""


def dense_crossover(cfg: ModelConfig, reps: int = 5) -> int | None:
    """The smallest row count above which a float32 GEMM of the dequantized weights beats the int4 kernel on
    SmolLM2-style shapes of ``cfg`` (one gate|up-shaped layer, at most 4096 rows; one thread, cache-resident: the
    many-row case is compute-bound). Rows r qualify when float32 wins at r and at every larger probed count
    (:data:`DENSE_ROWS`); the answer is the probed count below the first qualifying one (so "dense above 16" when it
    wins from 32 up), or None when it never wins. About 0.5 s.
    """
    from spectune.backends.local.weights.quant import Int4Linear

    qt = _random_quant(min(2 * cfg.intermediate_size, 4096), cfg.hidden_size)
    int4, dense = Int4Linear(qt, torch.bfloat16), Int4Linear(qt, torch.bfloat16, dense_above=0)  # dense at any rows
    wins = []
    for rows in DENSE_ROWS:
        x = torch.randn(rows, cfg.hidden_size, dtype=torch.bfloat16)
        wins.append(_best_ms(lambda: int4(x), reps) > _best_ms(lambda: dense(x), reps))  # float32 faster
    first = next((i for i in range(len(wins)) if all(wins[i:])), None)
    if first is None:
        return None
    return DENSE_ROWS[first - 1] if first > 0 else 1


LM_HEAD_KERNELS = ("auto", "int4", "int8")


def lm_head_kernel(cfg: ModelConfig, reps: int = 5) -> dict[str, Any]:
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
    """Whether a float32 copy of the target's linear weights (4 bytes per weight) fits in
    :data:`DENSE_MEMORY_SHARE` of the memory available now (``os.sysconf``; True where that is unknown)."""
    h, inter = cfg.hidden_size, cfg.intermediate_size
    q_out = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    weights = cfg.num_layers * (h * q_out + cfg.num_heads * cfg.head_dim * h + 3 * inter * h) + cfg.vocab_size * h
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return True
    return 4 * weights <= DENSE_MEMORY_SHARE * available


def choose_path(requested: str, device: torch.device, cfg: ModelConfig, native_ok: bool, native_reason: str = "",
                lm_repeat: int = 1, dense_above: str = "auto", lm_head: str = "auto") -> PathChoice:
    """Resolve ``--dtype`` into a :class:`PathChoice`.

    Args:
        requested: a ``--dtype`` value (see :data:`PATHS`).
        device: the engine's device.
        cfg: the target's :class:`~backends.local.model.config.ModelConfig` (shapes for the probe).
        native_ok: the target is a GGUF whose linear layers are all Q4_0/Q4_1/Q8_0.
        native_reason: why native is unavailable (for the error message when it is forced).
        lm_repeat: 2 when the GGUF's lm_head is Q8_0 (two int4 halves), else 1.
        dense_above: for the native path, ``auto`` (measured by :func:`dense_crossover` where the float32 copy
            fits, kept with the estimates), ``off`` (int4 only) or a row count.
        lm_head: for the native path with a Q8_0 lm_head (``lm_repeat`` 2): ``auto`` (:func:`lm_head_kernel`,
            kept with the estimates), ``int4`` or ``int8``; any other lm_head is int4.

    Raises:
        UserError: an unknown value, or ``native`` where it cannot run (CUDA, a non-GGUF model, other types), or a
            ``dense_above`` that is not auto, off or a row count, or an ``lm_head`` not in auto, int4, int8.
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
        return _with_lm_head(_with_dense(choice, cfg, lm_repeat, dense_above), cfg, lm_repeat, lm_head)
    if device.type != "cpu":
        return PathChoice("bfloat16", torch.bfloat16, "device")
    candidates = (["native"] if native_ok else []) + ["bfloat16", "float32"]
    key = _probe_key(candidates, cfg, lm_repeat)
    est = _measured(key, lambda: {c: estimate_step_ms(c, cfg, lm_repeat) for c in candidates})
    best = min(est, key=est.get)
    choice = PathChoice(best, torch.float32 if best == "float32" else torch.bfloat16, "measured", est, cap, packed)
    choice = _with_lm_head(_with_dense(choice, cfg, lm_repeat, dense_above), cfg, lm_repeat, lm_head)
    timings = ", ".join(f"{k} ~{v:.1f} ms/step" for k, v in est.items())
    log.info("engine path %s (%s; dense above %s rows; lm_head %s)", best, timings, choice.dense_above,
             choice.lm_head)
    return choice


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


def _with_dense(choice: PathChoice, cfg: ModelConfig, lm_repeat: int, dense_above: str) -> PathChoice:
    """``choice`` with its ``dense_above`` set (native only; see :func:`choose_path`)."""
    value = str(dense_above).strip().lower()
    if value not in ("auto", "off") and not (value.isdigit() and int(value) >= 1):
        raise UserError(f"--native-dense-above {dense_above!r}: use auto, off or a row count >= 1")
    if choice.name != "native" or value == "off":
        return choice
    if value != "auto":
        choice.dense_above = int(value)
        return choice
    if not dense_fits(cfg):
        log.info("no float32 copy of the native weights: it would take more than %d%% of the available memory",
                 int(DENSE_MEMORY_SHARE * 100))
        return choice
    key = _probe_key(["native:dense-crossover"], cfg, lm_repeat)
    choice.dense_above = _measured(key, lambda: {"dense_above_rows": dense_crossover(cfg)})["dense_above_rows"]
    return choice


def _measured(key: str, probe: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The probe's result kept under ``key`` in :func:`probe_cache_file`, else ``probe()`` run now on one thread
    (see the module docstring: one thread ranks kernels even on a busy machine) and stored."""
    result = _cached_estimates(key)
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


def _cached_estimates(key: str) -> dict[str, float] | None:
    try:
        return json.loads(probe_cache_file().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None


def _store_estimates(key: str, est: dict[str, float]) -> None:
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
