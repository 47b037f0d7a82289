"""Which compute path the engine runs, chosen per machine at start-up (``--dtype auto``) or forced by the flag.

Paths (``--dtype`` values):

- ``native``: the GGUF's own Q4_0/Q4_1/Q8_0 weights through PyTorch's int4 CPU kernel
  (:mod:`spectune.backends.local.weights.quant`), bf16 activations. GGUF targets on CPU only.
- ``bfloat16``: weights dequantized to bf16; on CPUs where oneDNN packs bf16 (AVX-512 BW/VL/DQ or AVX-NE-CONVERT)
  linears use the packed layout (:mod:`spectune.backends.local.model.linear`).
- ``float32``: weights dequantized to float32.

Why not one constant: bf16 dense matmuls need oneDNN's bf16 kernels, which need AVX-512 (BW, VL, DQ) or
AVX-NE-CONVERT. Without them (AVX2-only CPUs) PyTorch falls back to its reference bf16 GEMM, a scalar loop: 7.9 ms
for a [1, 576] x [576, 1536] product on an AVX2 CPU where float32 takes 0.12-0.2 ms (issue #17, docs/engine.md).
The int4 kernel is PyTorch's own vectorised code for both AVX2 and AVX-512 with bf16 activations (its float32
variant is a scalar loop). Rather than encode those rules, ``auto`` times each available path on the model's own
shapes (one gate|up-shaped linear, an lm_head-shaped one, both with weights streamed from DRAM, and a decode-shaped
attention; about 1-2 s) and estimates a decode step: layers x (linear time x the layer's weights / gate|up's
weights + attention) + lm_head. The cheapest wins.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, TypedDict, TypeVar

import torch

from spectune.backends.local.weights.kernel_probes import (
    LM_HEAD_KERNELS, DenseCrossover, crossover, dense_crossover, estimate_step_ms, lm_head_kernel,
)
from spectune.backends.local.weights.loader import cache_dir
from spectune.core.errors import UserError
from spectune.core.json_types import JsonValue

if TYPE_CHECKING:
    from spectune.backends.local.model.config import ModelConfig

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
    cpu_kernels: Mapping[str, object] | None
    dense_whole_step_ms: dict[str, dict[str, float]]
    draft_head: str | None


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
        cpu_kernels: whether spectune's CPU kernels run (:meth:`spectune.backends.local.kernels.KernelChoice.to_json`),
            or None before :func:`~spectune.backends.local.build.build_engine` decided.
        draft_head: what runs the draft head's linears: ``int4`` (Q4_1 on spectune's kernel, ``--draft-quant``;
            :func:`spectune.backends.local.build.quantize_draft`) or the dtype its weights run in (``float32`` for
            a bf16 head where oneDNN has no bf16 GEMM); None without a head.
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
    cpu_kernels: Mapping[str, object] | None = None
    whole_step_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    draft_head: str | None = None

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
                "lm_head": self.lm_head, "compile": self.compile, "cpu_kernels": self.cpu_kernels,
                "dense_whole_step_ms": self.whole_step_ms, "draft_head": self.draft_head}


def normalise(name: str) -> str:
    """Canonical path name for a ``--dtype`` value.

    Raises:
        UserError: an unknown value.
    """
    key = ALIASES.get(name.lower(), name.lower())
    if key not in PATHS:
        raise UserError(f"unknown --dtype {name!r}: use auto, native (GGUF's quantized weights), bfloat16 or float32")
    return key


DENSE_MEMORY_SHARE = 0.25
"""The dense copy of the native weights is kept only when it fits in this share of the available memory."""
DENSE_PROBE = "native:dense-kernel:streamed"
"""The crossover probe's name in its cache key (:func:`_probe_key`): a new name when what it measures changes, so a
machine's kept result from an older probe is measured again instead of reused."""

def _dense_probe(cfg: ModelConfig, lm_repeat: int, int4_kernel: str) -> DenseCrossover:
    """:func:`dense_crossover` for ``cfg``, kept per machine and per int4 kernel (``int4_kernel``: the probe tag of
    spectune's kernel set, :attr:`spectune.backends.local.kernels.KernelChoice.probe_tag`, when it runs the int4
    linears; ``""`` for PyTorch's), measured now when absent."""
    key = _probe_key([DENSE_PROBE + (f"+{int4_kernel}" if int4_kernel else "")], cfg, lm_repeat)
    return _measured(key, lambda: dense_crossover(cfg, spectune_int4=bool(int4_kernel)))


def kernel_timings(cfg: ModelConfig, lm_repeat: int = 1, int4_kernel: str = "") -> tuple[DenseCrossover, int]:
    """The crossover probe's result for ``cfg`` on this machine (:func:`_dense_probe`: of the int4 kernel the engine
    runs, spectune's when ``int4_kernel`` names it) and the probe layer's weights (rows x inputs), from which a step
    model takes each kernel's time per weight (:mod:`spectune.backends.local.engine.step_model`)."""
    return _dense_probe(cfg, lm_repeat, int4_kernel), min(2 * cfg.intermediate_size, 4096) * cfg.hidden_size


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
                dense_dtype: str = "auto", spectune_int8: bool = False, int4_kernel: str = "") -> PathChoice:
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
        spectune_int8: an int8 lm_head would run ``spectune::int8_linear`` (the ops are loaded), so ``auto``
            times that kernel against the int4 halves (a probe of its own, kept apart from PyTorch's).
        int4_kernel: the probe tag of spectune's kernel set when the native int4 linears would run
            ``spectune::int4_linear`` (``""``: PyTorch's kernel), so :func:`dense_crossover` times that kernel, in a
            probe of its own: its rows cost differently from PyTorch's.

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
        return _with_lm_head(_with_dense(choice, cfg, lm_repeat, dense_above, dense_dtype, int4_kernel), cfg,
                             lm_repeat, lm_head, spectune_int8)
    if device.type != "cpu":
        return PathChoice("bfloat16", torch.bfloat16, "device")
    candidates = (["native"] if native_ok else []) + ["bfloat16", "float32"]
    key = _probe_key(candidates, cfg, lm_repeat)
    est = _measured(key, lambda: {c: estimate_step_ms(c, cfg, lm_repeat) for c in candidates})
    rows = _dense_probe(cfg, lm_repeat, int4_kernel)
    per_batch = batch_estimates(est, rows["rows_ms"], packed, copies=dense_fits(cfg) and dense_above != "off")
    best = min(candidates, key=lambda c: sum(per_batch[c][b] / min(per_batch[o][b] for o in candidates)
                                             for b in per_batch[c]))
    flat = {**est, **{f"{c}@{b}": v for c, by in per_batch.items() for b, v in by.items() if b != "1"}}
    choice = PathChoice(best, torch.float32 if best == "float32" else torch.bfloat16, "measured", flat, cap, packed)
    choice = _with_lm_head(_with_dense(choice, cfg, lm_repeat, dense_above, dense_dtype, int4_kernel), cfg,
                           lm_repeat, lm_head, spectune_int8)
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
    the copy's time over int4's one-row time instead mixed two probes: on the machine docs/engine.md names, it put
    native at 2.7x the bfloat16 path at batch 16 (44.3 vs 16.4 ms) where both run the same bf16 GEMM, ``auto`` chose
    the bfloat16 path, and the main job ran 0.54x the native path's decode speed at batch 1 and 0.65x at batch 4
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


def _with_lm_head(choice: PathChoice, cfg: ModelConfig, lm_repeat: int, lm_head: str,
                  spectune_int8: bool = False) -> PathChoice:
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
        key = _probe_key(["native:lm-head" + ("+spectune-int8" if spectune_int8 else "")], cfg, lm_repeat)
        probe = _measured(key, lambda: lm_head_kernel(cfg, spectune_int8=spectune_int8))
        choice.lm_head = probe["kernel"]
        choice.estimates_ms.update({"lm_head_int4": probe["int4_ms"], "lm_head_int8": probe["int8_ms"]})
    return choice


def _with_dense(choice: PathChoice, cfg: ModelConfig, lm_repeat: int, dense_above: str,
                dense_dtype: str = "auto", int4_kernel: str = "") -> PathChoice:
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
    probe = _dense_probe(cfg, lm_repeat, int4_kernel)
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


def cpu_signature() -> str:
    """The CPU's model name and flags as ``/proc/cpuinfo`` gives them (its first lines of each), or
    ``platform.processor()`` where there is no such file: what a timing or a ``-march=native`` build depends on."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f.read().splitlines() if ln.startswith(("model name", "flags"))][:2]
        return "|".join(lines)
    except OSError:
        return platform.processor()


def _probe_key(candidates: list[str], cfg: ModelConfig, lm_repeat: int) -> str:
    """What the estimates depend on: the CPU (:func:`cpu_signature`), torch's version and capability, the ISA
    overrides in the environment, and the model's shapes."""
    parts = {"cpu": cpu_signature(), "torch": torch.__version__, "cap": torch.backends.cpu.get_cpu_capability(),
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
