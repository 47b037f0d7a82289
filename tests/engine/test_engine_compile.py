"""``--compile``: the target's batched layers through torch.compile (backends/local/compiled.py), on the real
SmolLM2-135M-Instruct GGUF with the native int4 path: compiled before serving, as accurate as the eager layers,
no compile while serving, and a fallback to eager when compiling fails."""

from __future__ import annotations

import pytest
import torch

from spectune.backends.local.attention import AttnMeta
from spectune.backends.local.build import EngineOptions, build_engine
from spectune.backends.local.compiled import (CompiledStep, compile_target, compiler_problem, layer_fingerprint,
                                              layers_per_graph)
from spectune.backends.local.model import decoder_steps
from spectune.backends.local.sequence import SamplingParams
from spectune.loadgen.errors import UserError

PROMPTS = ["What is the capital of Japan?", "Write a Python function that returns the n-th Fibonacci number.",
           "List the planets of the solar system in order from the sun."]

needs_compiler = pytest.mark.skipif(compiler_problem() is not None, reason=f"{compiler_problem()}")


def _engine(compile_mode: str, dtype: str = "native"):
    return build_engine(EngineOptions(num_steps=0, num_steps_capacity=3, dtype=dtype, max_num_seqs=4,
                                      max_model_len=256, kv_cache_gb=0.5, compile=compile_mode))


@pytest.fixture(scope="module")
def eager_engine():
    return _engine("off")


@pytest.fixture(scope="module")
def compiled_engine():
    if compiler_problem() is not None:
        pytest.skip(compiler_problem())
    return _engine("on")


def _decode_logits(engine, prompt: list[int], steps: int) -> list[torch.Tensor]:
    """Prefill ``prompt`` into slot 0, then ``steps`` greedy batched decode forwards; float32 logits [V] each."""
    r, t = engine.runner, engine.runner.target
    out = []
    with torch.inference_mode():
        t(torch.tensor([prompt]), AttnMeta.for_prefill(r.target_cache, t.rope, 0, len(prompt)))
        token = prompt[-1]
        for j in range(steps):
            pos = torch.tensor([[len(prompt) + j]])
            hidden, _ = t(torch.tensor([[token]]), AttnMeta.for_batch(r.target_cache, t.rope, pos, r.group))
            logits = t.logits(hidden)[0, 0]
            out.append(logits)
            token = int(logits.argmax())
    return out


@needs_compiler
def test_compiled_engine_reports_compile_in_its_path(compiled_engine) -> None:
    assert compiled_engine.path.to_json()["compile"]["active"] is True


@needs_compiler
def test_compiled_layers_are_as_close_to_float32_as_the_eager_layers(compiled_engine) -> None:
    """Inductor keeps fused intermediates in float32 where eager rounds each op to bf16, so the compiled logits
    differ from the eager ones by bf16 rounding; measured against the float32 path (same GGUF) they are no
    farther off than the eager native layers are (10% slack for one prompt's noise)."""
    ids = compiled_engine.tokenizer.encode(PROMPTS[0])
    reference = _decode_logits(_engine("off", "float32"), ids, 8)
    compiled = _decode_logits(compiled_engine, ids, 8)
    target = compiled_engine.runner.target
    step = target.step
    target.step, n = decoder_steps, target.layers_per_step
    try:
        eager = _decode_logits(compiled_engine, ids, 8)
    finally:
        target.step, target.layers_per_step = step, n
    err = lambda xs: sum(float((a - b).abs().mean()) for a, b in zip(xs, reference)) / len(xs)  # noqa: E731
    assert err(compiled) <= 1.1 * err(eager)


@needs_compiler
def test_serving_batches_and_num_steps_compiles_nothing_after_warm_up(compiled_engine) -> None:
    """Warm-up compiled every shape class, so requests never wait for a compile."""
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    ids = [compiled_engine.tokenizer.encode(p) for p in PROMPTS]
    for k in (0, 3):
        compiled_engine.set_num_steps(k)
        for batch in (1, 3):
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


def test_compile_on_without_a_compiler_is_a_user_error(eager_engine) -> None:
    from torch._inductor import config

    with config.patch({"cpp.cxx": (None, "/nonexistent/c++")}), pytest.raises(UserError, match="--compile off"):
        compile_target(eager_engine.runner.target, "on", torch.device("cpu"))


def test_compile_auto_without_a_compiler_stays_eager(eager_engine) -> None:
    from torch._inductor import config

    with config.patch({"cpp.cxx": (None, "/nonexistent/c++")}):
        choice = compile_target(eager_engine.runner.target, "auto", torch.device("cpu"))
    assert choice.active is False


def test_a_probe_that_cannot_compile_is_a_compiler_problem(monkeypatch) -> None:
    """A machine with g++ but, say, without Python's headers fails inductor's first kernel build: ``auto`` must
    see that before it relies on compiled layers."""
    from spectune.backends.local import compiled

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


def test_unknown_compile_mode_is_a_user_error() -> None:
    with pytest.raises(UserError, match="auto, on or off"):
        compile_target(torch.nn.Module(), "fast", torch.device("cpu"))


@pytest.mark.parametrize(("layers", "per_graph"), [(30, 5), (32, 4), (28, 4), (7, 1)])
def test_layers_per_graph_divides_the_layer_count(layers: int, per_graph: int) -> None:
    assert layers_per_graph(layers) == per_graph


def test_the_default_models_layers_share_one_fingerprint(eager_engine) -> None:
    layers = eager_engine.runner.target.layers
    assert len({layer_fingerprint(layer) for layer in layers}) == 1


def test_a_layer_with_another_quantization_has_another_fingerprint() -> None:
    target = _engine("off").runner.target
    a, b = target.layers[0], target.layers[1]
    b.o_proj = torch.nn.Linear(b.o_proj.in_features, b.o_proj.out_features, bias=False)
    assert layer_fingerprint(a) != layer_fingerprint(b)
