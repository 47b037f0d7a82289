"""spectune's own CPU kernels for the decode step (``cpu_kernels.cpp``), built for this machine at start-up.

Where PyTorch's CPU kernels cost more than their work in a small model's decode step (measured in
docs/engine.md, "spectune's CPU kernels"):

- ``spectune::decode_attention(q [B, Hkv, R, hd], k_cache, v_cache [slots, Hkv, L, hd], mask [B, 1, R, T]) ->
  [B, Hkv, R, hd]``: attention of a few query rows (GQA heads folded into R, as
  :func:`spectune.backends.local.model.attention.attend_batched` lays them out) over the first T cache positions.
  PyTorch's CPU SDPA (the flash kernel, ``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``) blocks queries and
  keys for long prompts; with 3 query rows it spends most of its time outside the arithmetic.
- ``spectune::int8_linear(x [M, K], codes int8 [N, K], scale [N]) -> [M, N]``: ``(x @ codes^T) * scale`` for a
  Q8_0 lm_head requantized per row (:class:`spectune.backends.local.weights.quant.Int8RowLinear`), the same math as
  ``torch.ops.aten._weight_int8pack_mm`` with each weight row read once for up to 8 input rows.

- ``spectune::int4_linear(x [M, K], blocks uint8 [N/32, K/32, 640]) -> [M, N]`` (AVX-512 BW builds): the native
  path's int4 linears (:class:`spectune.backends.local.weights.quant.Int4Linear`, layout
  :func:`~spectune.backends.local.weights.quant.pack_int4_blocks`). Each input row is quantized to int16 per group of
  32 (an error under bf16's own) and multiplied by the 4-bit codes in exact int32 (``vpdpwssd`` with AVX512-VNNI),
  up to 8 input rows per pass over the weights, as llama.cpp's CPU backend multiplies Q4_1 weights by quantized
  (int8) activations (``ggml/src/ggml-cpu/arch/x86/quants.c``, ``ggml_vec_dot_q4_1_q8_1``). PyTorch's int4 kernel
  (``torch.ops.aten._weight_int4pack_mm_for_cpu``) dequantizes every weight to float for every 4 input rows and
  spends one FMA per weight and row.

All accumulate in float32 and compute each row independently of the rows beside it, so a prompt's output does not
depend on its batch.

Build: ``$CXX`` (else g++ / clang++) compiles the source against torch's headers and libraries with ``-O3`` and the
machine's vector ISA (``-march=native``; ``-march=x86-64-v3`` when ``ATEN_CPU_CAPABILITY=avx2``, ``-march=x86-64``
when ``default``, so the AVX2 emulation of ``benchmarks/engine_speed.py`` runs AVX2 code), about 8 s once; the library
is kept in ``$SPECTUNE_CACHE_DIR/kernels/`` under a key of the source, torch's version, the compiler, the flags and
the CPU, so later starts load it in milliseconds. Without a compiler, or if the build fails, :func:`load` says why in
one line and the engine keeps PyTorch's kernels.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from spectune.core.json_types import JsonObject

log = logging.getLogger("spectune.engine")

SOURCE = Path(__file__).with_name("cpu_kernels.cpp")
_MARCH = {"": "native", "avx512": "native", "avx2": "x86-64-v3", "default": "x86-64"}


@dataclass(frozen=True)
class KernelChoice:
    """Whether spectune's CPU kernels run in this process.

    Attributes:
        mode: the requested mode (``auto``, ``on``, ``off``).
        active: the ops are registered and the engine calls them.
        reason: why (or why not), one line.
        vector_width: float lanes of the build (16 AVX-512, 8 AVX2, 1 scalar); 0 when not active.
        int4: ``spectune::int4_linear`` runs the native path's int4 linears (an active AVX-512 BW build).
    """

    mode: str
    active: bool
    reason: str
    vector_width: int = 0
    int4: bool = False

    @property
    def probe_tag(self) -> str:
        """The kernel set's name in the cache keys of probes that time whole forwards (its forwards cost
        differently): ``spectune-q4i16-<source hash>`` (with the int4 linear), ``spectune-<source hash>``, or ``""``
        for PyTorch's kernels. The hash of ``cpu_kernels.cpp`` makes a changed kernel re-probe instead of reusing
        timings of the one before."""
        if not self.active:
            return ""
        return ("spectune-q4i16-" if self.int4 else "spectune-") + _source_hash()

    def to_json(self) -> JsonObject:
        """JSON-ready description (``/server_info`` ``engine_path.cpu_kernels``)."""
        return {"mode": self.mode, "active": self.active, "reason": self.reason, "vector_width": self.vector_width,
                "int4_linear": self.int4}


@functools.cache
def _source_hash() -> str:
    """The first 12 hex digits of the SHA-256 of ``cpu_kernels.cpp``."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]


def _compiler() -> str | None:
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx) or (cxx if os.path.isfile(cxx) else None)
    return shutil.which("g++") or shutil.which("clang++")


def _command(cxx: str, out: Path) -> list[str]:
    from torch.utils import cpp_extension

    march = _MARCH.get(os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower(), "native")
    lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [cxx, "-O3", f"-march={march}", "-std=c++20", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *(f"-I{p}" for p in cpp_extension.include_paths()), str(SOURCE), "-o", str(out), f"-L{lib_dir}", "-lc10",
            "-ltorch_cpu", f"-Wl,-rpath,{lib_dir}"]


def _library_path(cxx: str) -> Path:
    """Where the build for this source, torch, compiler, flags (:func:`_command`) and CPU lives."""
    from spectune.backends.local.weights.compute_paths import cpu_signature
    from spectune.backends.local.weights.loader import cache_dir

    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    flags = " ".join(_command(cxx, Path("OUT")))
    key = hashlib.sha256("\0".join([SOURCE.read_text(), torch.__version__, version, flags,
                                    cpu_signature()]).encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"cpu_kernels-{key}.so"


@functools.lru_cache(maxsize=1)
def _build_and_register() -> tuple[int, bool, str]:
    """(vector width, has the int4 linear, '') once the ops are registered, else (0, False, why not)."""
    if platform.system() != "Linux":
        return 0, False, f"spectune's CPU kernels are built on Linux only (this is {platform.system()})"
    cxx = _compiler()
    if cxx is None:
        return 0, False, "no C++ compiler ($CXX, g++ or clang++) for spectune's CPU kernels"
    try:
        path = _library_path(cxx)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:  # build aside, then rename: no torn library
                tmp_out = Path(tmp) / path.name
                done = subprocess.run(_command(cxx, tmp_out), capture_output=True, text=True, timeout=600)
                if done.returncode != 0:
                    first = (done.stderr.strip().splitlines() or ["(no output)"])[0][:200]
                    return 0, False, f"building spectune's CPU kernels failed: {first}"
                os.replace(tmp_out, path)
        torch.ops.load_library(str(path))
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        return 0, False, f"spectune's CPU kernels could not be built or loaded ({type(exc).__name__}: {str(exc)[:160]})"
    _register_fakes()
    return int(torch.ops.spectune.vector_width()), bool(torch.ops.spectune.has_int4_linear()), ""


def _register_fakes() -> None:
    """Shapes for torch.compile's tracing (the ops allocate their outputs like these). Called once per process
    (:func:`_build_and_register` is cached)."""

    @torch.library.register_fake("spectune::decode_attention")
    def _attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    @torch.library.register_fake("spectune::int8_linear")
    def _int8(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[0], codes.shape[0])

    @torch.library.register_fake("spectune::int4_linear")
    def _int4(x: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[0], blocks.shape[0] * 32)


def load(mode: str, device: torch.device) -> KernelChoice:
    """Build (once per machine) and register the kernels when ``mode`` and ``device`` call for them.

    Args:
        mode: ``auto`` (use them when they build), ``on`` (an error when they cannot) or ``off`` (PyTorch's kernels).
        device: the engine's device; the kernels are CPU-only.

    Raises:
        UserError: ``mode`` is ``on`` and the kernels cannot be built or loaded, or ``mode`` is not a mode.
    """
    from spectune.backends.local.options import check_cpu_kernels_mode
    from spectune.core.errors import UserError

    check_cpu_kernels_mode(mode)
    if mode == "off":
        return KernelChoice(mode, False, "--cpu-kernels off: PyTorch's SDPA, int8 and int4 kernels")
    if device.type != "cpu":
        return KernelChoice(mode, False, f"spectune's kernels are CPU-only (device {device.type})")
    width, int4, why = _build_and_register()
    if not width:
        if mode == "on":
            raise UserError(f"--cpu-kernels on: {why}; install a C++ compiler or use --cpu-kernels off")
        log.warning("%s; using PyTorch's kernels", why)
        return KernelChoice(mode, False, why)
    return KernelChoice(mode, True, f"built for this CPU ({width} float lanes)", width, int4)
