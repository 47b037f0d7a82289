"""The target's batched forwards (decode, verify) with their layers compiled by ``torch.compile`` (inductor, CPU).

Why: at batch 1 a 135M model's decode step is mostly eager per-op overhead, not arithmetic. On 2 AVX-512 CPU threads
(issue #17) each of SmolLM2's 30 layers costs about 160 us in eager mode, of which the four int4 matmuls take 80 us and
SDPA 12 us; the rest is some 40 small ops (two RMSNorms of 8 ops each, RoPE's slices, cat and multiplies, the cache
writes, views) and the Python between them. Inductor fuses those into a few C++ loops around the same int4 and SDPA
calls.

What is compiled: :func:`spectune.backends.local.model.target.decoder_steps`, a group of consecutive layers of a batched
forward as a function of modules and tensors only, so one compiled graph serves every group. Each call through
dynamo costs some 30 us (guard checks, wrappers), so larger groups run faster at batch 1 but take longer to compile.
Measured there, 2 threads (``python benchmarks/engine_speed.py --paths native+compile1,native+compile2,
native+compile5,native+compile10,native --skip-llamacpp --skip-spec``, decode tokens/s at batch 1 / batch 8, median
of 3 interleaved): eager 127.8 / 475.8; 1 layer per graph 134.1 / 499.8, 2 layers 143.2 / 519.3, 5 layers 159.2 /
512.8, 10 layers 164.1 / 488.3. Compiling the four shape classes took about 20 s (1 layer) to 70 s (10 layers) from
scratch, and 1.7, 2.1, 4.4 and 15.2 s from inductor's cache. On a 2-core AMX CPU, a
server's six classes (num_steps capacity 3, 16 slots, ``dense_above`` 4) took 63 s from an empty cache at 1 layer per
graph and 175 s at 5 (one core busy: inductor compiles one graph at a time), and decode tokens/s at batch 1 / 4 / 16
(``--paths native+compile1,native+compile2,native+compile5 --skip-llamacpp --skip-spec --threads 2 --batches
1,4,16``, median of 3) were 39.6 / 137.3 / 267.5 at 1 layer, 41.9 / 137.8 / 228.4 at 2, 45.9 / 154.3 / 263.6 at 5.
:func:`layers_per_graph` takes the largest divisor of the layer count up to 5 (:data:`MAX_LAYERS_PER_GRAPH`).
Prefill and the draft head stay eager: prefill's matmuls dwarf its per-op overhead, and the head is one layer.

Shapes: ``dynamic=True``, so one graph covers every batch size, query length and cache length, except that dynamo
specialises sizes 0 and 1: batch 1 and query length 1 (plain decode) are graphs of their own, and so are inputs of
more rows than a native layer's ``dense_above`` (its kernel switch). :func:`warm_up` compiles every class
(:func:`warm_up_shapes`: four for a server with speculation, six with a ``dense_above`` as well) before the server
takes requests, so no measured request waits for a compile; inductor's on-disk cache (``$TORCHINDUCTOR_CACHE_DIR``,
by default under ``/tmp``) makes later starts take seconds.

Guards: dynamo checks every attribute of the layer modules on each call (15 us a layer here). When all layers have
the same structure (module types, quantization layouts, shapes; :func:`layer_fingerprint`), those checks are skipped
(``torch.compiler.skip_guard_on_all_nn_modules_unsafe``): any group of this model's layers may run any of its
graphs. The compiled function gets its own code object per model (:func:`_private_copy`), because dynamo keeps its
cache on the code object: another model in the same process (tests build many) never reuses these graphs.

Failure: no C++ compiler, or inductor failing on this machine, falls back to the eager layers with one logged line;
``--compile on`` makes it an error instead. :func:`compiler_problem` compiles and checks a probe kernel first, and
that check has caught a real fault: on an AVX-512 CPU with ``ATEN_CPU_CAPABILITY=avx2`` (the AVX2 emulation of
``benchmarks/engine_speed.py``) torch 2.13's inductor returned garbage past the first 8 floats of
``(x * 2 - 3).relu()``. The cause was inductor's cache, which reused kernels built without the override; an
override now gets a cache folder of its own (:func:`isa_cache_dir`), and the probe stays as the check. The choice
and its reason are in ``/server_info`` (``engine_path.compile``) and so in sweep.json's environment.
"""

from __future__ import annotations

import functools
import logging
import os
import time
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from spectune.backends.local.options import check_compile_mode
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject

if TYPE_CHECKING:
    from spectune.backends.local.engine.speculative import SpeculativeDecoder

log = logging.getLogger("spectune.engine")

MAX_LAYERS_PER_GRAPH = 5

# Inductor's Python wrapper checks every input's and extern result's size and stride on each call (some 25
# ``assert_size_stride`` lines a layer). Dynamo's guards already check the inputs, and the externs are PyTorch's own
# int4 and SDPA kernels, so the wrapper runs without them (``torch/_inductor/config.py``: size_asserts,
# alignment_asserts, scalar_asserts). Measured on an AVX-512 CPU, 2 threads, num_steps 0 decode tokens/s without vs
# with the checks (``python benchmarks/engine_speed.py --paths native+compile,native+compile+asserts --skip-llamacpp
# --skip-spec --repeats 5``, median of 5 interleaved): batch 1 174.7 vs 166.1 (+5%), batch 8 475.1 vs 462.5 (+3%);
# the same greedy ids. With the AVX2 emulation (7 repeats, one process): batch 1 101.3 vs 99.1, batch 8 368.3 vs 355.1.
NO_WRAPPER_ASSERTS = {"size_asserts": False, "alignment_asserts": False, "scalar_asserts": False}


@dataclass
class CompileChoice:
    """Whether the target's batched layers run compiled.

    Attributes:
        mode: the requested mode (``auto``, ``on``, ``off``).
        active: compiled graphs are in use.
        reason: why (or why not), one line.
        uniform: all layers share one structure, so nn-module guards are skipped (see the module docstring).
        warm_up_s: seconds :func:`warm_up` spent compiling before serving (0 when not compiled).
    """

    mode: str
    active: bool
    reason: str
    uniform: bool = False
    warm_up_s: float = 0.0

    def to_json(self) -> JsonObject:
        """JSON-ready description (``/server_info`` ``engine_path.compile``)."""
        return {"mode": self.mode, "active": self.active, "reason": self.reason, "uniform_layers": self.uniform,
                "warm_up_s": round(self.warm_up_s, 2)}


def compiler_problem() -> str | None:
    """Why inductor cannot compile CPU code here (one line), or None when it can.

    Finds a C++ compiler (``torch._inductor.cpp_builder.get_cpp_compiler``: ``$CXX``, else g++ / clang++ on the
    PATH), then compiles and runs a one-kernel probe, which also needs Python's headers (inductor's kernels are
    Python extensions). The answer is kept per compiler setting: the probe costs a C++ build the first time on a
    machine (about 3 s), then inductor's cache.
    """
    from torch._inductor import config

    isa_cache_dir()
    return _problem(tuple(config.cpp.cxx))


def isa_cache_dir() -> str | None:
    """Give inductor a cache folder of its own when ``ATEN_CPU_CAPABILITY`` overrides the CPU's vector ISA; returns
    it (None: no override, or ``$TORCHINDUCTOR_CACHE_DIR`` names another folder than inductor's default).

    Why: inductor generates its C++ for the ISA that ``ATEN_CPU_CAPABILITY`` names (``torch/_inductor/
    cpu_vec_isa.py`` ``pick_vec_isa``), but its FX-graph cache does not key on that choice, so graphs compiled
    without the override are reused under it, and the other way round. Measured with torch 2.13 on an AVX-512
    CPU: after an unmodified run had filled the cache, ``ATEN_CPU_CAPABILITY=avx2`` (the AVX2 emulation of
    ``benchmarks/engine_speed.py``) computed garbage past the first 8 floats of :func:`_probe`, and the reverse order
    aborted the process (``free(): invalid pointer``); with a fresh cache both were right. The folder is
    ``default_cache_dir()`` (``/tmp/torchinductor_$USER``) plus ``-<capability>``. Importing dynamo already writes
    the default into ``$TORCHINDUCTOR_CACHE_DIR`` (``torch/_inductor/runtime/cache_dir_utils.py`` ``cache_dir``,
    called by ``torch/_dynamo/package.py``), so the default counts as not chosen; inductor's caches read the variable
    on every use, and :func:`compiler_problem` calls this before the first compile.
    """
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if not capability:
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen and os.path.abspath(chosen) != os.path.abspath(default_cache_dir()):
        return None
    path = f"{default_cache_dir()}-{capability}"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    log.info("ATEN_CPU_CAPABILITY=%s: inductor cache in %s", capability, path)
    return path


@functools.lru_cache(maxsize=8)
def _problem(cxx: tuple) -> str | None:
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot compile here"
        return f"no working C++ compiler for torch.compile ({_first_line(exc)})"
    try:
        x = torch.arange(37.0)  # not a multiple of any vector width: the tail loop runs too
        if not torch.equal(torch.compile(_probe, fullgraph=True, dynamic=False)(x), _probe(x)):
            return "torch.compile's probe kernel computed a wrong result"
    except Exception as exc:  # noqa: BLE001
        return f"torch.compile cannot build CPU kernels here ({_first_line(exc)})"
    return None


def _probe(x: torch.Tensor) -> torch.Tensor:
    return (x * 2 - 3).relu()


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:160] if text else ''}"


def layer_fingerprint(layer: torch.nn.Module) -> tuple:
    """What must be equal for two layers to share a compiled graph without guards on their attributes: every
    submodule's type and ``extra_repr`` (sizes, quantization type, dense_above), every tensor attribute's shape and
    dtype, and the layer's scalar attributes (heads, head_dim, eps)."""
    parts: list[tuple[object, ...]] = []
    for name, mod in layer.named_modules():
        parts.append((name, type(mod).__name__, mod.extra_repr()))
        for key, val in sorted(vars(mod).items()):
            if isinstance(val, torch.Tensor):
                parts.append((name, key, tuple(val.shape), val.dtype))
            elif isinstance(val, (int, float, str, bool)) or val is None:
                parts.append((name, key, val))
        for key, val in list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False)):
            parts.append((name, key, tuple(val.shape), val.dtype))
    return tuple(parts)


def _private_copy(fn: Callable) -> Callable:
    """``fn`` with a code object of its own: dynamo's compiled graphs and guards live on the code object, so graphs
    compiled through the copy are never looked up for another copy (another model)."""
    code = fn.__code__.replace(co_name=fn.__name__)
    return types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


class CompiledStep:
    """Callable with :func:`~spectune.backends.local.model.target.decoder_steps`'s signature that runs the compiled
    graph, or the eager function once compiling or running the graph has failed (the error is kept in ``error``).

    Args:
        eager: the layers function to compile (``decoder_steps``).
        uniform: skip dynamo's guards on nn-module attributes (all layers share one structure).

    The wrapper inductor generates skips its size and stride checks (:data:`NO_WRAPPER_ASSERTS`).
    """

    def __init__(self, eager: Callable, uniform: bool) -> None:
        options: JsonObject = dict(NO_WRAPPER_ASSERTS)
        if uniform:
            options["guard_filter_fn"] = torch.compiler.skip_guard_on_all_nn_modules_unsafe
        self.eager = eager
        self.compiled = torch.compile(_private_copy(eager), dynamic=True, fullgraph=True, options=options)
        self.error: str | None = None

    def __call__(self, *args: object) -> torch.Tensor:
        if self.error is None:
            try:
                return self.compiled(*args)
            except Exception as exc:  # noqa: BLE001 - fall back to eager on any compile/runtime failure
                self.error = _first_line(exc)
                log.warning("torch.compile failed, running the eager layers: %s", self.error)
        return self.eager(*args)


def compile_target(target: torch.nn.Module, mode: str, device: torch.device) -> CompileChoice:
    """Replace ``target.step`` (the batched forwards' layer function) by a :class:`CompiledStep` as ``mode`` says.

    ``auto``: compile on CPU when a C++ compiler is found; ``on``: the same, but no compiler is an error; ``off``:
    eager. On CUDA the engine captures CUDA graphs instead, so nothing is compiled. Layers holding oneDNN-packed
    bf16 weights (:class:`~spectune.backends.local.model.linear.PackedLinear`, the ``bfloat16`` path on AVX-512) stay
    eager: dynamo cannot trace ``mkldnn._linear_pointwise`` on an opaque packed tensor (inductor's lowering failed
    after 3.7 s of warm-up on an AVX-512 CPU before this check).

    Raises:
        UserError: an unknown mode, or ``on`` without a working C++ compiler or with packed layers.
    """
    if check_compile_mode(mode) == "off":
        return CompileChoice(mode, False, "--compile off")
    if device.type != "cpu":
        return CompileChoice(mode, False, "not on CPU (CUDA runs captured CUDA graphs)")
    problem = compiler_problem()
    if problem is not None:
        if mode == "on":
            raise UserError(f"--compile on: {problem}; install g++ or pass --compile off")
        return CompileChoice(mode, False, problem)
    from spectune.backends.local.model.linear import PackedLinear

    if any(isinstance(m, PackedLinear) for m in target.layers.modules()):
        if mode == "on":
            raise UserError("--compile on: the bfloat16 path's oneDNN-packed layers cannot be compiled; pass --dtype "
                            "native or float32, or --compile auto")
        return CompileChoice(mode, False, "oneDNN-packed bf16 layers: dynamo cannot trace their opaque weights")
    uniform = len({layer_fingerprint(layer) for layer in target.layers}) == 1
    target.step = CompiledStep(target.step, uniform)
    target.layers_per_step = layers_per_graph(len(target.layers))
    how = "nn-module guards skipped" if uniform else "layers differ: full guards"
    return CompileChoice(mode, True, f"inductor, {target.layers_per_step} layers per graph ({how})", uniform)


def layers_per_graph(num_layers: int) -> int:
    """Layers per compiled call: the largest divisor of ``num_layers`` up to :data:`MAX_LAYERS_PER_GRAPH` (a divisor,
    so that no shorter last group needs graphs of its own)."""
    return max(d for d in range(1, MAX_LAYERS_PER_GRAPH + 1) if num_layers % d == 0)


def warm_up_shapes(slots: int, max_query: int, row_limits: tuple[int, ...] = ()) -> list[tuple[int, int]]:
    """(batch, query length) pairs that reach every graph a server with ``slots`` cache slots can meet, one each.

    Dynamo specialises sizes 1 (batch 1, query length 1), and a layer that switches kernels above a row count
    (``dense_above`` of the native linears: ``spectune.backends.local.weights.quant``) adds a guard on batch x query
    length there, so the graphs are told apart by (batch == 1, query == 1, rows > limit for each limit). Query length 3
    is tried first, then 2 and the others up to ``max_query``, each with the smallest batch first; a batch never
    equals its query length (batch 1 excepted), so dynamo does not tie the two sizes together, except for a class
    that only such a shape reaches: with ``dense_above`` 4, batch 2 at query length 2 (num_steps 1) is the one shape of
    more than one row per batch and query at up to 4 rows; unwarmed, it compiled while serving (a sweep's num_steps 1
    point at concurrency 4 took 57 s against its neighbours' 29-30 s on a 2-core AMX CPU).
    Measured with the AVX2 emulation (``dense_above`` 8): without the limit's shapes, the first
    batch of 9 at num_steps 0 waited 5 s for a compile from inductor's warm cache, inside a sweep's window.

    Args:
        slots: cache slots (the largest batch).
        max_query: the largest query length verify will use (num_steps capacity + 1).
        row_limits: the row counts above which some layer switches kernels.
    """
    queries = [1] + ([3] + [q for q in range(2, max_query + 1) if q != 3] if max_query > 1 else [])
    def graph_class(batch: int, q: int) -> tuple:
        return batch == 1, q == 1, tuple(batch * q > limit for limit in row_limits)

    shapes: dict[tuple, tuple[int, int]] = {}
    for q in queries:
        for batch in range(1, slots + 1):
            if batch == q and batch > 1:
                continue
            shapes.setdefault(graph_class(batch, q), (batch, q))
    for q in queries[1:]:  # a class only a batch equal to its query length reaches: warm it with that shape
        if q <= slots:
            shapes.setdefault(graph_class(q, q), (q, q))
    return list(shapes.values())


def warm_up(decoder: SpeculativeDecoder, choice: CompileChoice, max_query: int) -> None:
    """Compile the shape classes a server will meet before it takes requests (:func:`warm_up_shapes`), on cache
    slots 0.. at positions 5.. (they are empty at start-up). Updates ``choice`` (``warm_up_s``; ``active`` False with
    the error as reason when compiling failed).

    The layers' RMSNorm epsilon (``DecoderLayer.eps``, a Python float) is compiled in as a constant
    (``torch._dynamo.config.specialize_float``): by default dynamo traces it as a symbolic float, finds that
    ``F.rms_norm`` needs a real one, and traces every graph a second time (``Restarting analysis due to
    _tensorify_python_scalars``, ``TORCH_LOGS=+dynamo``). On a 2-core AVX512-BF16 CPU the six
    classes of a server with num_steps capacity 3 and 16 slots compiled in 62.7 s instead of 68.9 s from an empty
    inductor cache (``torch._dynamo.utils.compile_times``: no second ``compile_attempt``). All layers share one epsilon
    (:func:`layer_fingerprint` compares it), so one graph still serves every group.

    Args:
        decoder: the :class:`~spectune.backends.local.engine.speculative.SpeculativeDecoder` whose target was compiled.
        choice: what :func:`compile_target` returned.
        max_query: the largest query length verify will use (num_steps capacity + 1).
    """
    step = getattr(decoder.target, "step", None)
    if not choice.active or not isinstance(step, CompiledStep):
        return
    start = time.perf_counter()
    layers = decoder.target.layers.modules()  # the lm_head's own dense_above is outside the compiled layers
    limits = sorted({m.dense_above for m in layers if getattr(m, "dense_above", None) is not None})
    with torch.inference_mode(), torch._dynamo.config.patch(specialize_float=True):
        for batch, q in warm_up_shapes(decoder.target_cache.num_slots, max_query, tuple(limits)):
            pos = 5 + torch.arange(q, device=decoder.device).repeat(batch, 1)  # [B, q]
            tokens = torch.zeros(batch, q, dtype=torch.long, device=decoder.device)
            decoder._target_fwd(tokens, pos)
    choice.warm_up_s = time.perf_counter() - start
    if step.error is not None:
        choice.active, choice.reason = False, f"torch.compile failed, eager layers: {step.error}"
