"""The draft head's linears on spectune's int4 kernel (``--draft-quant``): Q4_1 weights within half a step, the
native engine's head on the kernel by default and in bf16 when asked, greedy output equal to num_steps 0, acceptance
kept, and the option's errors, on the real default pair."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectune.backends.local import kernels
from spectune.backends.local.build import build_engine
from spectune.backends.local.engine.sampling import SamplingTensors
from spectune.backends.local.options import EngineOptions, parse_server_args
from spectune.backends.local.weights.quant import Int4Linear, quantize_q4_1
from spectune.core.errors import UserError

PROMPTS = ["What is the capital of Japan?", "Write a Python function that returns the n-th Fibonacci number.",
           "List the planets of the solar system in order from the sun.", "Explain how a refrigerator works."]
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def int4_kernel() -> None:
    choice = kernels.load("auto", torch.device("cpu"))
    if not choice.int4:
        pytest.skip(f"spectune::int4_linear needs an AVX-512 BW build here ({choice.reason})")


def _engine(draft_quant: str):
    return build_engine(EngineOptions(num_steps=3, dtype="native", max_num_seqs=4, max_model_len=256, kv_cache_gb=0.5,
                                      native_dense_above="16", draft_quant=draft_quant))


@pytest.fixture(scope="module")
def int4_head(int4_kernel):
    return _engine("auto")


@pytest.fixture(scope="module")
def bf16_head(int4_kernel):
    return _engine("off")


def _head_linears(engine) -> list[torch.nn.Module]:
    head = engine.decoder.head
    return [m for m in head.modules() if m is not head and not list(m.children())
            and hasattr(m, "in_features")]


def _generate(engine, k: int) -> tuple[float, list[list[int]]]:
    """Greedy generation of the four prompts at num_steps ``k`` in one batch: (acceptance length, tokens)."""
    dec, tok = engine.decoder, engine.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    st = SamplingTensors.build([0.0] * 4, [0] * 4, [1.0] * 4, dec.device)
    out = [[t] for t in dec.prefill(list(range(4)), prompts, st, True)]
    accepted = rounds = 0
    while min(len(o) for o in out) < NEW_TOKENS:
        acc, tokens = dec.decode_round(4, k, st)
        accepted, rounds = accepted + sum(acc), rounds + len(acc)
        for o, t in zip(out, tokens):
            o.extend(t)
    return 1 + accepted / rounds, [o[:NEW_TOKENS] for o in out]


def test_q4_1_weights_are_within_half_a_step_of_the_dense_ones() -> None:
    """gguf's Q4_1 quantizer read back by ``unpack``: each weight within half its group's step d, plus the float16
    rounding of d and m (up to 2^-11 of each, d counted 15 times)."""
    w = torch.from_numpy(np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32))
    qt = quantize_q4_1(w)
    d = np.repeat(qt.scale, 32, axis=1)
    m = np.repeat(np.abs(qt.zero - 8 * qt.scale), 32, axis=1)
    assert np.all(np.abs(qt.dequantize() - w.numpy()) <= d / 2 + 2.0**-11 * (m + 15 * d) + 1e-6)


def test_the_native_engine_runs_every_head_linear_on_the_int4_kernel(int4_head) -> None:
    layers = _head_linears(int4_head)
    assert layers and all(isinstance(m, Int4Linear) and m.spectune_kernel for m in layers)


def test_the_engine_records_what_runs_its_head(int4_head) -> None:
    assert int4_head.path.to_json()["draft_head"] == "int4"


def test_draft_quant_off_keeps_the_heads_own_weights(bf16_head) -> None:
    assert not any(isinstance(m, Int4Linear) for m in _head_linears(bf16_head))


def test_draft_quant_off_is_recorded(bf16_head) -> None:
    assert bf16_head.path.to_json()["draft_head"] == "bfloat16"


def test_greedy_output_with_the_int4_head_equals_num_steps_0(int4_head) -> None:
    assert _generate(int4_head, 3)[1] == _generate(int4_head, 0)[1]


def test_the_int4_head_keeps_its_acceptance(int4_head, bf16_head) -> None:
    """At least 90% of the bf16 head's acceptance length (0.997 over 24 Spec-Bench prompts: docs/engine.md)."""
    assert _generate(int4_head, 3)[0] >= 0.9 * _generate(bf16_head, 3)[0]


def test_int4_without_spectunes_kernel_is_a_user_error() -> None:
    with pytest.raises(UserError, match="needs spectune's int4 kernel"):
        build_engine(EngineOptions(num_steps=1, dtype="native", max_num_seqs=1, max_model_len=64, kv_cache_gb=0.1,
                                   cpu_kernels="off", draft_quant="int4"))


def test_a_bad_draft_quant_is_a_user_error() -> None:
    with pytest.raises(UserError, match="use auto, int4 or off"):
        build_engine(EngineOptions(num_steps=1, draft_quant="int8"))


def test_the_sweep_passes_draft_quant_to_the_bundled_server() -> None:
    assert parse_server_args(["--draft-quant", "off"]) == {"draft_quant": "off"}


def test_a_bf16_head_without_onednn_bf16_is_recorded_as_float32(monkeypatch) -> None:
    """Where oneDNN has no bf16 GEMM (AVX2-only CPUs; simulated here) the bf16 head runs float32 weights, and the
    engine's path says so."""
    import spectune.backends.local.model.linear as linear

    monkeypatch.setattr(linear, "packing_supported", lambda dtype, device: False)
    engine = build_engine(EngineOptions(num_steps=1, dtype="bfloat16", max_num_seqs=1, max_model_len=64,
                                        kv_cache_gb=0.1, draft_quant="off"))
    assert engine.path.to_json()["draft_head"] == "float32"
