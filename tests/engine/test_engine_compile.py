"""``--compile``: the target's batched layers through torch.compile (backends/local/engine/compiled.py), on the real
SmolLM2-135M-Instruct GGUF with the native int4 path: compiled before serving, as accurate as the eager layers,
no compile while serving, and a fallback to eager when compiling fails."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from spectune.backends.local.model.attention import AttnMeta
from spectune.backends.local.build import build_engine
from spectune.backends.local.options import EngineOptions
from spectune.backends.local.engine.compiled import (CompiledStep, compile_target, compiler_problem, layer_fingerprint,
                                              layers_per_graph)
from spectune.backends.local.model.target import decoder_steps
from spectune.backends.local.engine.sequence import SamplingParams
from spectune.core.errors import UserError

PROMPTS = ["What is the capital of Japan?", "Write a Python function that returns the n-th Fibonacci number.",
           "List the planets of the solar system in order from the sun."]

needs_compiler = pytest.mark.skipif(compiler_problem() is not None, reason=f"{compiler_problem()}")


def _engine(compile_mode: str, dtype: str = "native", dense_above: str = "auto"):
    return build_engine(EngineOptions(num_steps=0, num_steps_capacity=3, dtype=dtype, max_num_seqs=4,
                                      max_model_len=256, kv_cache_gb=0.5, compile=compile_mode,
                                      native_dense_above=dense_above))


@pytest.fixture(scope="module")
def eager_engine():
    return _engine("off")


@pytest.fixture(scope="module")
def compiled_engine():
    if compiler_problem() is not None:
        pytest.skip(compiler_problem())
    return _engine("on", dense_above="2")  # a kernel switch above 2 rows: graphs of their own (warm_up_shapes)


def _decode_logits(engine, prompt: list[int], steps: int, forced: list[int] | None = None) -> list[torch.Tensor]:
    """Prefill ``prompt`` into slot 0, then ``steps`` batched decode forwards, each fed its own greedy token or, given
    ``forced``, the next of those; float32 logits [V] each."""
    r, t = engine.decoder, engine.decoder.target
    out = []
    with torch.inference_mode():
        t(torch.tensor([prompt]), AttnMeta.for_prefill(r.target_cache, t.rope, 0, len(prompt)))
        token = prompt[-1]
        for j in range(steps):
            pos = torch.tensor([[len(prompt) + j]])
            hidden, _ = t(torch.tensor([[token]]), AttnMeta.for_batch(r.target_cache, t.rope, pos, r.group))
            logits = t.logits(hidden)[0, 0]
            out.append(logits)
            token = int(logits.argmax()) if forced is None else forced[j]
    return out


@needs_compiler
def test_compiled_engine_reports_compile_in_its_path(compiled_engine) -> None:
    assert compiled_engine.path.to_json()["compile"]["active"] is True


@needs_compiler
def test_compiled_layers_are_as_close_to_float32_as_the_eager_layers(compiled_engine) -> None:
    """Inductor keeps fused intermediates in float32 where eager rounds each op to bf16, so the compiled logits
    differ from the eager ones by bf16 rounding; measured against the float32 path (same GGUF) they are no
    farther off than the eager native layers are (10% slack), over every prompt's 8 decode steps, each fed the
    float32 path's greedy tokens (a run's own greedy tokens would let one near-tie flip decide the comparison)."""
    float32 = _engine("off", "float32")
    target = compiled_engine.decoder.target
    reference, compiled, eager = [], [], []
    for prompt in PROMPTS:
        ids = compiled_engine.tokenizer.encode(prompt)
        ref = _decode_logits(float32, ids, 8)
        forced = [int(x.argmax()) for x in ref]
        reference += ref
        compiled += _decode_logits(compiled_engine, ids, 8, forced)
        step = target.step
        target.step, n = decoder_steps, target.layers_per_step
        try:
            eager += _decode_logits(compiled_engine, ids, 8, forced)
        finally:
            target.step, target.layers_per_step = step, n
    err = lambda xs: sum(float((a - b).abs().mean()) for a, b in zip(xs, reference)) / len(xs)  # noqa: E731
    assert err(compiled) <= 1.1 * err(eager)


@needs_compiler
def test_a_batch_equal_to_its_query_length_compiles_nothing_after_warm_up() -> None:
    """With dense_above 4, batch 2 at num_steps 1 (query length 2, 4 rows) is the only shape of its class (more than
    one sequence and query position, at most 4 rows); warm-up compiles it too (warm_up_shapes)."""
    from torch._dynamo.utils import counters

    engine = _engine("on", dense_above="4")
    before = counters["stats"]["unique_graphs"]
    engine.set_num_steps(1)
    engine.generate([engine.tokenizer.encode(p) for p in PROMPTS[:2]],
                    SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    assert counters["stats"]["unique_graphs"] == before


@needs_compiler
def test_serving_batches_and_num_steps_compiles_nothing_after_warm_up(compiled_engine) -> None:
    """Warm-up compiled every shape class, so requests never wait for a compile: batch 3 at num_steps 0 and every
    batch at num_steps 3 have more rows than the engine's dense_above (2), a class of graphs of their own."""
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    ids = [compiled_engine.tokenizer.encode(p) for p in PROMPTS]
    for k, batches in ((0, (1, 3)), (3, (1, 3)), (1, (2,))):  # batch 2 at K=1: batch == query length (2)
        compiled_engine.set_num_steps(k)
        for batch in batches:
            compiled_engine.generate(ids[:batch], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    compiled_engine.set_num_steps(0)
    assert counters["stats"]["unique_graphs"] == before


def test_a_step_that_cannot_compile_falls_back_to_eager() -> None:
    def breaks(x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()  # fullgraph=True refuses this
        return x + 1

    step = CompiledStep(breaks, uniform=False)
    x = torch.arange(4.0)
    assert torch.equal(step(x), x + 1)
    assert step.error is not None


@needs_compiler
def test_a_compiled_step_runs_without_the_wrappers_size_checks() -> None:
    from torch._inductor.utils import run_and_get_code

    def mm_relu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, w).relu()  # an extern call: inductor checks its result's size and stride by default

    _, codes = run_and_get_code(CompiledStep(mm_relu, uniform=False), torch.randn(4, 8), torch.randn(8, 16))
    assert "assert_size_stride(" not in "".join(codes)


def test_compile_on_without_a_compiler_is_a_user_error(eager_engine) -> None:
    from torch._inductor import config

    with config.patch({"cpp.cxx": (None, "/nonexistent/c++")}), pytest.raises(UserError, match="--compile off"):
        compile_target(eager_engine.decoder.target, "on", torch.device("cpu"))


def test_compile_auto_without_a_compiler_stays_eager(eager_engine) -> None:
    from torch._inductor import config

    with config.patch({"cpp.cxx": (None, "/nonexistent/c++")}):
        choice = compile_target(eager_engine.decoder.target, "auto", torch.device("cpu"))
    assert choice.active is False


def test_a_probe_that_cannot_compile_is_a_compiler_problem(monkeypatch) -> None:
    """A machine with g++ but, say, without Python's headers fails inductor's first kernel build: ``auto`` must
    see that before it relies on compiled layers."""
    from spectune.backends.local.engine import compiled

    def breaks(x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return x

    monkeypatch.setattr(compiled, "_probe", breaks)
    compiled._problem.cache_clear()
    try:
        problem = compiled.compiler_problem()
    finally:
        compiled._problem.cache_clear()
    assert problem is not None and "cannot build CPU kernels" in problem


_PROBE = "from spectune.backends.local.engine.compiled import compiler_problem; print(compiler_problem())"


@needs_compiler
@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512",
                    reason="ATEN_CPU_CAPABILITY=avx2 changes inductor's ISA only on an AVX-512 CPU")
def test_an_isa_override_compiles_right_after_a_run_without_it(tmp_path) -> None:
    """Inductor's FX-graph cache does not key on ``ATEN_CPU_CAPABILITY``: without a cache folder of its own
    (``compiled.isa_cache_dir``) the AVX2-emulated probe reuses the AVX-512 kernel of the run before it and
    computes garbage. Two fresh processes sharing one temp folder, as two runs on one machine do."""
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "ATEN_CPU_CAPABILITY")}
    env["TMPDIR"] = str(tmp_path)
    plain = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    emulated = subprocess.run([sys.executable, "-c", _PROBE], env={**env, "ATEN_CPU_CAPABILITY": "avx2"},
                              capture_output=True, text=True, timeout=300)
    assert (plain.stdout.strip(), emulated.stdout.strip()) == ("None", "None"), emulated.stderr[-2000:]


def test_an_isa_override_names_its_own_cache_folder(monkeypatch) -> None:
    from spectune.backends.local.engine import compiled

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "AVX2")
    assert compiled.isa_cache_dir().endswith("-avx2")


def test_an_isa_override_replaces_the_default_cache_folder(monkeypatch) -> None:
    """Importing dynamo writes inductor's default folder into the variable; that is not a user's choice."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from spectune.backends.local.engine import compiled

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert compiled.isa_cache_dir() == default_cache_dir() + "-avx2"


def test_a_chosen_cache_folder_is_kept(monkeypatch, tmp_path) -> None:
    from spectune.backends.local.engine import compiled

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert compiled.isa_cache_dir() is None


def _packed_target() -> torch.nn.Module:
    from spectune.backends.local.model.linear import PackedLinear

    target = torch.nn.Module()
    target.layers = torch.nn.ModuleList([PackedLinear(torch.nn.Linear(16, 16).to(torch.bfloat16))])
    return target


def _packing() -> bool:
    from spectune.backends.local.model.linear import packing_supported

    return packing_supported(torch.bfloat16, torch.device("cpu"))


@needs_compiler
@pytest.mark.skipif(not _packing(), reason="no oneDNN bf16 packing on this CPU")
def test_packed_bf16_layers_stay_eager_under_auto() -> None:
    choice = compile_target(_packed_target(), "auto", torch.device("cpu"))
    assert (choice.active, "oneDNN" in choice.reason) == (False, True)


@needs_compiler
@pytest.mark.skipif(not _packing(), reason="no oneDNN bf16 packing on this CPU")
def test_packed_bf16_layers_are_an_error_under_on() -> None:
    with pytest.raises(UserError, match="--dtype native or float32"):
        compile_target(_packed_target(), "on", torch.device("cpu"))


def test_unknown_compile_mode_is_a_user_error() -> None:
    with pytest.raises(UserError, match="auto, on or off"):
        compile_target(torch.nn.Module(), "fast", torch.device("cpu"))


@pytest.mark.parametrize(("layers", "per_graph"), [(30, 5), (32, 4), (28, 4), (7, 1)])
def test_layers_per_graph_divides_the_layer_count(layers: int, per_graph: int) -> None:
    assert layers_per_graph(layers) == per_graph


def test_the_default_models_layers_share_one_fingerprint(eager_engine) -> None:
    layers = eager_engine.decoder.target.layers
    assert len({layer_fingerprint(layer) for layer in layers}) == 1


def test_a_layer_with_another_quantization_has_another_fingerprint() -> None:
    target = _engine("off").decoder.target
    a, b = target.layers[0], target.layers[1]
    b.o_proj = torch.nn.Linear(b.o_proj.in_features, b.o_proj.out_features, bias=False)
    assert layer_fingerprint(a) != layer_fingerprint(b)
