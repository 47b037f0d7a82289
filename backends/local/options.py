"""What an engine is built from: :class:`EngineOptions` (``spectune serve``'s and the ``local`` sweep backend's
settings), the bundled draft head, and the checks on them that need no torch (the sweep process makes them before
it launches a server)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spectune.core.errors import UserError

SWITCH_MODES = ("auto", "on", "off")
"""The values of the engine's build switches: ``--compile`` (``backends/local/engine/compiled.py``) and
``--cpu-kernels`` (``backends/local/kernels/__init__.py``): use the feature when it works here, insist on it, or not."""
COMPILE_MODES = CPU_KERNEL_MODES = SWITCH_MODES
DRAFT_QUANT_MODES = ("auto", "int4", "off")
"""``--draft-quant``: the draft head's linears as Q4_1 on spectune's int4 kernel (``int4``; ``auto``: on the native
path where that kernel runs) or in the head's own dtype (``off``); :func:`spectune.backends.local.weights.quant.
quantize_head`."""


def check_switch(option: str, mode: str, modes: tuple[str, ...] = SWITCH_MODES) -> str:
    """``mode`` if it is one of ``modes`` (:data:`SWITCH_MODES` by default; torch-free, so the sweep process can check
    it early).

    Raises:
        UserError: any other value, naming ``option`` (``--compile``, ``--cpu-kernels``, ``--draft-quant``) and the
            values it takes.
    """
    if mode not in modes:
        raise UserError(f"{option} {mode!r}: use {', '.join(modes[:-1])} or {modes[-1]}")
    return mode


def check_draft_quant(mode: str) -> str:
    """:func:`check_switch` of ``--draft-quant`` against :data:`DRAFT_QUANT_MODES`."""
    return check_switch("--draft-quant", mode, DRAFT_QUANT_MODES)


def check_compile_mode(mode: str) -> str:
    """:func:`check_switch` of ``--compile``."""
    return check_switch("--compile", mode)


def check_cpu_kernels_mode(mode: str) -> str:
    """:func:`check_switch` of ``--cpu-kernels``."""
    return check_switch("--cpu-kernels", mode)


DEFAULT_HEAD = Path(__file__).parent / "heads" / "smollm2-135m-eagle3"
"""The bundled EAGLE-3 head for the embedded default target (SmolLM2-135M-Instruct)."""


@dataclass
class EngineOptions:
    """What ``spectune serve`` and the ``local`` sweep backend configure.

    Attributes:
        model: target GGUF file or HF folder (None: the embedded SmolLM2-135M-Instruct).
        draft: EAGLE head folder; None picks the bundled head when the target is the default one; "none" disables.
        num_steps: static num_steps K.
        num_steps_capacity: the largest K the server may be switched to later (sizes the cache); 0 = num_steps.
        dtype: the compute path (:mod:`spectune.backends.local.weights.compute_paths`): ``auto`` (measured per machine
            at start-up), ``native`` (the GGUF's Q4_0/Q4_1/Q8_0 weights, bf16 activations, CPU), ``bfloat16`` or
            ``float32``.
        device: ``auto`` (cuda when available), ``cpu`` or ``cuda``.
        max_num_seqs: the largest batch size (cache slots).
        max_model_len: tokens per sequence (prompt + output); default min(model max, 4096).
        kv_cache_gb: memory budget for the target + draft KV caches; slots are reduced to fit.
        adaptive_config: an SGLang adaptive JSON or vLLM schedule file (adaptive / per-batch-size num_steps), or a
            ``p_min`` / ``specdec`` config (draft length per row: :mod:`spectune.backends.num_steps.confidence_config`).
        draft_p_min: > 0: each row stops drafting at the first draft token whose confidence is under it, at most
            ``num_steps`` tokens (llama.cpp's ``--spec-draft-p-min``; 0 = off, llama.cpp's default).
        trace_path: where to record a verify trace (JSONL), or None.
        threads: torch CPU threads (0 = torch's default).
        seed: sampling seed.
        cuda_graphs: on CUDA, capture decode-shaped forwards per padded batch size and num_steps.
        native_dense_above: native path: ``auto`` (measured), ``off`` or a row count above which linears use a
            dense copy of the int4 weights (float32 or bf16 through oneDNN, as measured:
            :mod:`spectune.backends.local.weights.quant`).
        native_dense_dtype: native path: the dense copy's dtype, ``auto`` (the faster at many rows, measured),
            ``float32`` or ``bfloat16`` (oneDNN's bf16 GEMM).
        native_lm_head: native path with a Q8_0 lm_head: ``auto`` (measured), ``int4`` (two exact halves) or
            ``int8`` (requantized per row; :func:`spectune.backends.local.weights.compute_paths.lm_head_kernel`).
        cpu_kernels: spectune's own CPU kernels for decode attention, a per-row int8 lm_head and (AVX-512) the int4
            linears (:mod:`spectune.backends.local.kernels`): ``auto`` (built for this CPU when a C++ compiler is
            found, else PyTorch's), ``on`` (an error without them) or ``off`` (PyTorch's SDPA, int8 and int4 kernels).
        compile: the target's batched layers through ``torch.compile`` on CPU
            (:mod:`spectune.backends.local.engine.compiled`): ``auto`` (when a C++ compiler is found), ``on`` (an error
            without one) or ``off``. The library default is ``off`` (no compile for engines built in tests and scripts);
            ``spectune serve`` and the ``local`` sweep backend pass ``auto``.
        draft_quant: the draft head's linears: ``auto`` (Q4_1 on spectune's int4 kernel on the native path where that
            kernel runs, else the head's dtype), ``int4`` (that quantization on any CPU path; an error without the
            kernel) or ``off`` (:func:`spectune.backends.local.weights.quant.quantize_head`).
        draft_upkeep: adaptive mode only: run the head's draft extend on every prefill and num_steps 0 round, as
            SGLang does at num_steps 0 (``_build_trivial_verify_input`` then ``_draft_extend_for_decode`` in
            ``python/sglang/srt/speculative/eagle_worker_v2.py``), instead of lazy drafting (the default, which
            keeps only the head's inputs and catches up when drafting starts). For measuring what that upkeep
            costs (``benchmarks/adaptive_overhead.py``); the engine before lazy drafting behaved this way.
    """

    model: str | None = None
    draft: str | None = None
    num_steps: int = 0
    num_steps_capacity: int = 0
    dtype: str = "auto"
    device: str = "auto"
    max_num_seqs: int = 64
    max_model_len: int | None = None
    kv_cache_gb: float = 2.0
    adaptive_config: str | None = None
    draft_p_min: float = 0.0
    trace_path: str | None = None
    threads: int = 0
    seed: int = 0
    cuda_graphs: bool = True
    native_dense_above: str = "auto"
    native_lm_head: str = "auto"
    native_dense_dtype: str = "auto"
    compile: str = "off"
    cpu_kernels: str = "auto"
    draft_quant: str = "auto"
    draft_upkeep: bool = False


def resolve_draft(draft: str | None, model_is_default: bool) -> Path | None:
    """The head folder to load, or None for no head."""
    if draft is not None and draft.lower() == "none":
        return None
    if draft is None:
        return DEFAULT_HEAD if (model_is_default and (DEFAULT_HEAD / "config.json").is_file()) else None
    path = Path(draft).expanduser()
    if not path.is_dir():
        raise UserError(f"draft head {path} is not a folder: give an EAGLE head folder (config.json + safetensors)")
    return path


#: ``spectune serve`` options a launched bundled server takes from ``--server-args`` -> (EngineOptions field, type,
#: allowed values or None). The others are set by the sweep itself (:data:`SWEEP_SETS`).
SERVER_ARGS: dict[str, tuple[str, type, tuple[str, ...] | None]] = {
    "--dtype": ("dtype", str, ("auto", "native", "bfloat16", "float32", "bf16", "fp32", "q", "gguf")),
    "--device": ("device", str, ("auto", "cpu", "cuda")),
    "--native-dense-above": ("native_dense_above", str, None),
    "--native-dense-dtype": ("native_dense_dtype", str, ("auto", "float32", "bfloat16")),
    "--native-lm-head": ("native_lm_head", str, ("auto", "int4", "int8")),
    "--compile": ("compile", str, COMPILE_MODES),
    "--cpu-kernels": ("cpu_kernels", str, CPU_KERNEL_MODES),
    "--draft-quant": ("draft_quant", str, DRAFT_QUANT_MODES),
    "--threads": ("threads", int, None),
    "--seed": ("seed", int, None),
    "--kv-cache-gb": ("kv_cache_gb", float, None),
    "--max-model-len": ("max_model_len", int, None),
    "--trace": ("trace_path", str, None),
    "--draft-p-min": ("draft_p_min", float, None),
}

#: ``spectune serve`` options that a sweep or validation sets for its servers, and where the user sets them instead.
SWEEP_SETS: dict[str, str] = {
    "--model": "the sweep's --model", "--draft": "the sweep's --draft", "--num-steps": "--steps",
    "--adaptive-config": "--adaptive-config", "--host": "the sweep (loopback)", "--port": "the sweep (a free port)",
    "--max-num-seqs": "the largest --concurrency", "--api-key": "--api-key-env",
    "--metrics-without-key": "the sweep (it reads /metrics with the key)", "--model-name": "--model-name",
}


def parse_server_args(args: list[str]) -> dict[str, str | int | float]:
    """``--server-args`` for a launched bundled server, read as ``spectune serve`` reads its options
    (``--flag value`` or ``--flag=value``; :data:`SERVER_ARGS`), as EngineOptions fields -> values.

    Raises:
        UserError: an option that is not one of ``spectune serve``'s, one the sweep sets itself (:data:`SWEEP_SETS`,
            naming where to set it), a missing or ill-typed value, or a value outside its choices.
    """
    out: dict[str, str | int | float] = {}
    accepted = ", ".join(SERVER_ARGS)
    i = 0
    while i < len(args):
        flag, eq, value = args[i].partition("=")
        if flag in SWEEP_SETS:
            raise UserError(f"--server-args {flag}: the sweep sets it for the bundled engine's servers ({SWEEP_SETS[flag]})"
                            f"; --server-args takes {accepted}")
        if flag not in SERVER_ARGS:
            raise UserError(f"--server-args {args[i]!r}: the bundled engine's server takes {accepted} "
                            "(spectune serve's options)")
        if not eq:
            i += 1
            if i >= len(args) or args[i].startswith("--"):
                raise UserError(f"--server-args {flag} needs a value")
            value = args[i]
        name, kind, choices = SERVER_ARGS[flag]
        if choices is not None and value.lower() not in choices:
            raise UserError(f"--server-args {flag} {value!r}: use one of {', '.join(choices)}")
        try:
            out[name] = kind(value)
        except ValueError:
            raise UserError(f"--server-args {flag} {value!r}: give {'an integer' if kind is int else 'a number'}"
                            ) from None
        i += 1
    return out


def bundled_head(path: str | None) -> Path | None:
    """The folder on this machine of the bundled head that ``path`` names, or None when it names none.

    ``path``: a head as a sweep recorded it (:func:`spectune.backends.draft_head`). It names a bundled head when it is
    one of the folders beside :data:`DEFAULT_HEAD` here, or when it ends in ``backends/local/heads/NAME`` (the package
    path ``spectune.backends.local.heads``, as a checkout or an installed copy on the machine that recorded it spells
    it) and NAME is bundled here. Reads the file system only; raises nothing."""
    if not path:
        return None
    heads = DEFAULT_HEAD.parent
    p = Path(path).expanduser()
    try:
        if p.is_dir() and p.resolve().parent == heads.resolve():
            return p
    except OSError:
        return None
    parts = p.parts
    if len(parts) >= 4 and parts[-4:-1] == ("backends", "local", "heads"):
        here = heads / parts[-1]
        return here if (here / "config.json").is_file() else None
    return None
