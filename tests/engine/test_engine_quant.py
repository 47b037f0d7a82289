"""The native quantized path (``--dtype native``): GGML blocks decoded exactly, Q/K rows in transformers' order,
the int4 kernel computing with the decoded weights, and greedy decoding equal to a reference model that runs the
same dequantized weights with float32 matmuls, on the real SmolLM2-135M-Instruct Q4_1 GGUF (Q8_0 embedding)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectune.backends.local.build import build_engine
from spectune.backends.local.options import EngineOptions
from spectune.backends.local.model.linear import Float32Linear, packing_supported
from spectune.backends.local.weights.compute_paths import choose_path
from spectune.backends.local.weights.quant import (Int4Linear, Int8RowLinear, int4_block_weights, native_support,
                                           read_gguf_linears, requantize_rows, unpack)
from spectune.backends.local.engine.sequence import SamplingParams
from spectune.backends.local.weights.loader import default_model_path, load_target
from spectune.core.errors import UserError

PROMPTS = ["What is the capital of Japan?", "Write a Python function that returns the n-th Fibonacci number.",
           "List the planets of the solar system in order from the sun.", "Hi!"]


@pytest.fixture(scope="module")
def gguf_tensors() -> dict:
    from gguf import GGUFReader

    return {t.name: t for t in GGUFReader(str(default_model_path())).tensors}


@pytest.mark.parametrize("name", ["blk.0.ffn_down.weight", "blk.7.attn_q.weight", "token_embd.weight"])
def test_unpack_equals_gguf_dequantize(gguf_tensors, name: str) -> None:
    from gguf.quants import dequantize

    t = gguf_tensors[name]
    qt = unpack(np.asarray(t.data), t.tensor_type.name, int(t.shape[0]))
    assert np.array_equal(qt.dequantize(), dequantize(t.data, t.tensor_type))


def test_q4_0_unpack_equals_gguf_dequantize() -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    w = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    raw = quantize(w, GGMLQuantizationType.Q4_0)
    qt = unpack(raw, "Q4_0", 128)
    assert np.array_equal(qt.dequantize(), dequantize(raw, GGMLQuantizationType.Q4_0))


def test_unsupported_type_is_refused() -> None:
    with pytest.raises(ValueError, match="Q6_K"):
        unpack(np.zeros((4, 210), np.uint8), "Q6_K", 256)


@pytest.fixture(scope="module")
def quant_and_dense():
    target, _ = load_target(None, torch.float32, "cpu")
    c = target.cfg
    quant, bad = read_gguf_linears(default_model_path(), c.num_layers, c.num_heads, c.num_kv_heads, True)
    return quant, bad, target


def test_a_layer_the_int4_kernel_refuses_is_a_user_error(monkeypatch) -> None:
    """PyTorch's packing refuses out_features that are not a multiple of 16 (a RuntimeError); quantize_target turns
    that into a one-line UserError naming the layer and the fallback."""
    from spectune.backends.local.weights import quant as Q

    real = Q.read_gguf_linears

    def with_an_odd_layer(*args, **kwargs):
        out, bad = real(*args, **kwargs)
        out["layers.3.down_proj"] = out["layers.3.down_proj"].rows(np.arange(8))  # 8 rows: not a multiple of 16
        return out, bad

    monkeypatch.setattr(Q, "read_gguf_linears", with_an_odd_layer)
    target, _ = load_target(None, torch.bfloat16, "cpu")
    with pytest.raises(UserError, match=r"layers\.3\.down_proj .*--dtype bfloat16"):
        Q.quantize_target(target, default_model_path())


def test_every_linear_of_the_default_target_is_native(quant_and_dense) -> None:
    quant, bad, target = quant_and_dense
    assert (bad, len(quant)) == ({}, 4 * target.cfg.num_layers + 1)


@pytest.mark.parametrize("name", ["layers.0.qkv", "layers.29.qkv", "layers.3.gate_up", "layers.11.down_proj"])
def test_fused_rows_match_transformers_dequantized_layout(quant_and_dense, name: str) -> None:
    """Q and K rows permuted like transformers' GGUF loader; q|k|v and gate|up fused in the engine's order."""
    quant, _, target = quant_and_dense
    dense = dict(target.named_parameters())[name + ".weight"]
    assert torch.equal(torch.from_numpy(quant[name].dequantize()), dense)


def test_q8_0_lm_head_split_into_two_int4_halves_is_exact(quant_and_dense) -> None:
    quant, _, target = quant_and_dense
    assert torch.equal(torch.from_numpy(quant["lm_head"].dequantize()), target.embed_tokens.weight)


@pytest.mark.parametrize("name", ["layers.5.gate_up", "lm_head"])
def test_int4_kernel_computes_with_the_rounded_weights(quant_and_dense, name: str) -> None:
    """Output = x @ W^T with W the codes and bf16-rounded scales, up to the kernel's bf16 output rounding."""
    quant, _, _ = quant_and_dense
    qt = quant[name]
    x = torch.randn(3, qt.shape[1], generator=torch.Generator().manual_seed(0)).bfloat16()
    ref = x.float() @ torch.from_numpy(qt.rounded(torch.bfloat16).dequantize()).t()
    out = Int4Linear(qt, torch.bfloat16)(x).float()
    assert float((out - ref).abs().max()) <= 2**-7 * float(ref.abs().max())


def test_requantized_rows_move_each_weight_at_most_half_a_step(quant_and_dense) -> None:
    """Per-row int8 of the Q8_0 lm_head: every weight within half of its row's step (the scale) of the GGUF's."""
    quant, _, _ = quant_and_dense
    qt = quant["lm_head"]
    codes, scale = requantize_rows(qt)
    err = np.abs(codes.astype(np.float32) * scale[:, None] - qt.dequantize())
    assert bool((err <= 0.5 * scale[:, None] * (1 + 2**-7)).all())


def test_int8_row_kernel_computes_with_its_weights(quant_and_dense) -> None:
    """Output = x @ W^T with W = codes x bf16 scale (``weights()``), up to the kernel's bf16 output rounding."""
    quant, _, _ = quant_and_dense
    layer = Int8RowLinear(quant["lm_head"], torch.bfloat16)
    x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(0)).bfloat16()
    ref = x.float() @ layer.weights().t()
    assert float((layer(x).float() - ref).abs().max()) <= 2**-7 * float(ref.abs().max())


def test_int8_rows_above_the_threshold_use_the_float32_copy(quant_and_dense) -> None:
    quant, _, _ = quant_and_dense
    layer = Int8RowLinear(quant["lm_head"], torch.bfloat16, dense_above=8)
    x = torch.randn(9, layer.in_features, dtype=torch.bfloat16)
    assert torch.equal(layer(x), torch.nn.functional.linear(x.float(), layer.weights()).to(torch.bfloat16))


@pytest.fixture(scope="module")
def native_engine():
    """int4 everywhere; the dense copy (the probe's dtype) above 16 rows (fixed, not measured: batch-4 decode stays on
    int4 on every machine, prefill goes to the copy)."""
    return build_engine(EngineOptions(num_steps=0, draft="none", dtype="native", max_num_seqs=4, max_model_len=256,
                                      kv_cache_gb=0.5, native_lm_head="int4", native_dense_above="16"))


@pytest.fixture(scope="module")
def native_engine_int8():
    return build_engine(EngineOptions(num_steps=0, draft="none", dtype="native", max_num_seqs=4, max_model_len=256,
                                      kv_cache_gb=0.5, native_lm_head="int8", native_dense_above="16"))


def test_native_engine_uses_int4_linears(native_engine) -> None:
    mods = list(native_engine.decoder.target.modules())
    assert sum(isinstance(m, Int4Linear) for m in mods) == 4 * native_engine.decoder.target.cfg.num_layers + 1


def test_native_engine_records_its_path(native_engine) -> None:
    assert native_engine.path.to_json()["path"] == "native"


def test_int8_lm_head_is_used_when_asked(native_engine_int8) -> None:
    assert isinstance(native_engine_int8.decoder.target.lm_head, Int8RowLinear)


def test_the_engine_records_its_lm_head_kernel(native_engine_int8) -> None:
    assert native_engine_int8.path.to_json()["lm_head"] == "int8"


def test_a_bad_lm_head_kernel_is_a_user_error() -> None:
    with pytest.raises(UserError, match="use auto, int4 or int8"):
        build_engine(EngineOptions(num_steps=0, draft="none", dtype="native", native_lm_head="int3"))


def test_auto_lm_head_takes_the_faster_kernel(tmp_path, monkeypatch) -> None:
    """A Q8_0 lm_head (lm_repeat 2): both kernels timed, int8 only when it saves at least 10%."""
    from spectune.backends.local.model.config import ModelConfig

    monkeypatch.setenv("SPECTUNE_CACHE_DIR", str(tmp_path))
    cfg = ModelConfig(model_type="llama", vocab_size=4096, hidden_size=64, intermediate_size=128, num_layers=2,
                      num_heads=2, num_kv_heads=1, head_dim=32, rope_theta=1e4, max_position_embeddings=128)
    choice = choose_path("native", torch.device("cpu"), cfg, True, lm_repeat=2)
    est = choice.estimates_ms
    assert choice.lm_head == ("int8" if est["lm_head_int8"] < 0.9 * est["lm_head_int4"] else "int4")


def _float32_linear(weights: torch.Tensor) -> Float32Linear:
    lin = torch.nn.Linear(weights.shape[1], weights.shape[0], bias=False)
    lin.weight = torch.nn.Parameter(weights, False)
    return Float32Linear(lin)


def _reference_engine(native) -> object:
    """A bf16 engine whose linear layers are float32 matmuls over exactly the weights ``native`` (an engine without a
    dense copy) computes with: codes times the scales (plus zeros) as the int4 kernel keeps them (bf16 in PyTorch's,
    :func:`int4_block_weights` in spectune's), ``weights()`` for an int8 lm_head."""
    ref = build_engine(EngineOptions(num_steps=0, draft="none", dtype="bfloat16", max_num_seqs=4, max_model_len=256,
                                     kv_cache_gb=0.5))
    c = ref.decoder.target.cfg
    quant, _ = read_gguf_linears(default_model_path(), c.num_layers, c.num_heads, c.num_kv_heads, True)
    for name, qt in quant.items():
        *parents, leaf = name.split(".")
        parent, mine = ref.decoder.target, native.decoder.target
        for p in parents:
            parent, mine = getattr(parent, p), getattr(mine, p)
        kernel = getattr(mine, leaf)
        if isinstance(kernel, Int8RowLinear):
            weights = kernel.weights()
        else:
            weights = torch.from_numpy(int4_block_weights(qt) if kernel.spectune_kernel else
                                       qt.rounded(torch.bfloat16).dequantize())
        setattr(parent, leaf, _float32_linear(weights))
    return ref


def _teacher_forced_logits(engine, ids: list[int], start: int) -> torch.Tensor:
    """float32 [len(ids) - start, vocab]: the logits after ids[:start] (one prefill), then after each further id fed
    one at a time as a batch-1 decode step (so every linear runs at one row: the int4/int8 kernels, not the float32
    copy)."""
    from spectune.backends.local.model.attention import AttnMeta

    r, t = engine.decoder, engine.decoder.target
    group = t.cfg.num_heads // t.cfg.num_kv_heads
    with torch.inference_mode():
        hidden, _ = t(torch.tensor([ids[:start]]), AttnMeta.for_prefill(r.target_cache, t.rope, 0, start))
        out = [t.logits(hidden[:, -1])]
        for pos in range(start, len(ids) - 1):
            meta = AttnMeta.for_batch(r.target_cache, t.rope, torch.tensor([[pos]]), group)
            hidden, _ = t(torch.tensor([[ids[pos]]]), meta)
            out.append(t.logits(hidden[:, -1]))
    return torch.cat(out)


@pytest.mark.parametrize("engine_name", ["native_engine_int4_only", "native_engine_int8_only"])
def test_native_logits_match_reference_with_same_dequantized_weights(request, engine_name: str) -> None:
    """The reference replaces each native layer by a float32 matmul over the same weights (codes x the scales as the
    int4 kernel keeps them; the int8 lm_head's ``weights()``) with bf16 inputs and outputs, like the kernels, at every
    row count (the engines keep no dense copy: a bf16 one rounds the weights again, checked per layer above); only the
    summation order differs (fp32 accumulation in both, then bf16 rounding of every layer's output, 30 times over;
    spectune's int4 kernel also rounds its inputs to int16 per group of 32, far below bf16's step). Fed the
    reference's greedy continuation of each prompt (up to 40 tokens), every step's logits lie within 2^-4 of the
    largest logit (measured 1.6-3.4%: about 4 bf16 steps at |logit| 32-64). Greedy ids are not compared: the
    reference's own logits hold exact bf16 ties (the planets prompt, 26th token: top two equal), where any
    last-bit difference picks the other token."""
    native = request.getfixturevalue(engine_name)
    ref = _reference_engine(native)
    params = SamplingParams(max_tokens=40, temperature=0.0)
    worst = 0.0
    for p in PROMPTS:
        ids = ref.tokenizer.encode_chat([{"role": "user", "content": p}])
        out = ref.generate([ids], params)[0]
        mine, theirs = _teacher_forced_logits(native, ids + out, len(ids)), _teacher_forced_logits(ref, ids + out,
                                                                                                     len(ids))
        worst = max(worst, float(((mine - theirs).abs().amax(-1) / theirs.abs().amax(-1)).max()))
    assert worst <= 2**-4


@pytest.fixture(scope="module")
def native_engine_int8_only():
    """The int8 lm_head, and int8/int4 kernels at every row count (no dense copy)."""
    return build_engine(EngineOptions(num_steps=0, draft="none", dtype="native", max_num_seqs=4, max_model_len=256,
                                      kv_cache_gb=0.5, native_lm_head="int8", native_dense_above="off"))


@pytest.fixture(scope="module")
def native_engine_int4_only():
    """int4 at every row count (no float32 copy)."""
    return build_engine(EngineOptions(num_steps=0, draft="none", dtype="native", max_num_seqs=4, max_model_len=256,
                                      kv_cache_gb=0.5, native_lm_head="int4", native_dense_above="off"))


def test_int4_kernel_computes_a_row_the_same_beside_any_rows(quant_and_dense) -> None:
    """PyTorch's int4 CPU kernel (aten/src/ATen/native/cpu/int4mm_kernel.cpp) runs each row's dot products in the
    same order whatever the row count: a row computed in a block of 156 equals that row alone, on every ISA."""
    quant, _, _ = quant_and_dense
    layer = Int4Linear(quant["layers.5.gate_up"], torch.bfloat16)
    x = torch.randn(156, layer.in_features, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert torch.equal(layer(x), torch.cat([layer(x[i : i + 1]) for i in range(len(x))]))


TIE_GAP = 2**-4
"""Two logits this close (relative to the largest) are a tie under a change of summation order: the native path and a
float32 reference over the same weights differ by up to 3.4% of the largest logit
(test_native_logits_match_reference_with_same_dequantized_weights)."""


def test_native_engine_batched_differs_from_alone_only_after_a_near_tie(native_engine_int4_only) -> None:
    """Four requests at once give the ids each gives alone up to a near-tie. The int4 linears compute a row the same
    beside any rows (above), but attention over a batch reduces over the longest sequence's cache length, and its
    summation order then depends on the rows beside it: on an AMX CPU the planets prompt's 26th token, an exact
    bf16 tie of the top two logits, flips in a batch of four; on an AVX-512 one without AMX it did not. So where a
    prompt's batched ids first differ from its ids alone, the alone run's two best logits there lie within :data:`TIE_GAP`
    of each other (a promise that holds on every CPU); everywhere else the ids agree."""
    engine = native_engine_int4_only
    prompts = [engine.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    params = SamplingParams(max_tokens=40, temperature=0.0)
    batched = engine.generate(prompts, params)
    gaps = []
    for ids, together in zip(prompts, batched):
        alone = engine.generate([ids], params)[0]
        first = next((i for i, (a, b) in enumerate(zip(alone, together)) if a != b), None)
        if first is None:
            continue
        logits = _teacher_forced_logits(engine, ids + alone[: first + 1], len(ids))[first]
        top2 = logits.topk(2).values
        gaps.append(float((top2[0] - top2[1]) / logits.abs().max()))
    assert all(g <= TIE_GAP for g in gaps), gaps


def test_many_rows_use_the_float32_copy_of_the_same_weights(quant_and_dense) -> None:
    """Above dense_above rows the layer is a float32 GEMM over exactly the kernel's weights (bf16-rounded scales)."""
    quant, _, _ = quant_and_dense
    qt = quant["layers.5.gate_up"]
    x = torch.randn(9, qt.shape[1], dtype=torch.bfloat16)
    ref = torch.nn.functional.linear(x.float(), torch.from_numpy(qt.rounded(torch.bfloat16).dequantize()))
    assert torch.equal(Int4Linear(qt, torch.bfloat16, dense_above=8)(x), ref.to(torch.bfloat16))


@pytest.mark.skipif(not packing_supported(torch.bfloat16, torch.device("cpu")),
                    reason="oneDNN has no bf16 GEMM on this CPU (needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT)")
def test_many_rows_can_use_a_bf16_copy_of_the_same_weights(quant_and_dense) -> None:
    """With ``dense_dtype`` bf16, above dense_above rows the layer is a bf16 GEMM (oneDNN, float32 accumulation) over
    the kernel's weights rounded to bf16: within a bf16 rounding (2^-7 of the largest output) of the float32 product
    over the same bf16 weights."""
    quant, _, _ = quant_and_dense
    qt = quant["layers.5.gate_up"]
    x = torch.randn(9, qt.shape[1], generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    w = torch.from_numpy(qt.rounded(torch.bfloat16).dequantize()).to(torch.bfloat16).float()
    ref = torch.nn.functional.linear(x.float(), w)
    got = Int4Linear(qt, torch.bfloat16, dense_above=8, dense_dtype=torch.bfloat16)(x).float()
    assert float((got - ref).abs().max()) <= 2**-7 * float(ref.abs().max())


def test_the_engine_runs_the_dense_kind_its_path_records(native_engine) -> None:
    kinds = {m.dense_dtype for m in native_engine.decoder.target.modules() if isinstance(m, Int4Linear)}
    assert kinds == {native_engine.path.dense_torch_dtype}


def test_the_native_path_records_its_kernel_per_row_range(native_engine) -> None:
    dense = f"{native_engine.path.dense_dtype} dense"
    assert native_engine.path.to_json()["kernel_ranges"] == [[1, 16, "int4"], [17, None, dense]]


def test_few_rows_stay_on_the_int4_kernel(quant_and_dense) -> None:
    quant, _, _ = quant_and_dense
    qt = quant["layers.5.gate_up"]
    x = torch.randn(8, qt.shape[1], dtype=torch.bfloat16)
    assert torch.equal(Int4Linear(qt, torch.bfloat16, dense_above=8)(x), Int4Linear(qt, torch.bfloat16)(x))


def test_native_engine_records_its_dense_crossover(native_engine) -> None:
    assert native_engine.path.to_json()["dense_above_rows"] == 16


def test_a_bad_dense_threshold_is_a_user_error() -> None:
    with pytest.raises(UserError, match="use auto, off or a row count"):
        build_engine(EngineOptions(num_steps=0, draft="none", dtype="native", native_dense_above="many"))


def test_dense_copy_is_refused_when_it_cannot_fit() -> None:
    from spectune.backends.local.model.config import ModelConfig
    from spectune.backends.local.weights.compute_paths import dense_fits

    huge = ModelConfig(model_type="llama", vocab_size=10**6, hidden_size=10**5, intermediate_size=10**6,
                       num_layers=100, num_heads=64, num_kv_heads=8, head_dim=128, rope_theta=1e4,
                       max_position_embeddings=128)
    assert not dense_fits(huge)


def test_native_is_refused_for_a_hf_folder(tmp_path) -> None:
    from spectune.backends.local.model.config import ModelConfig

    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=32, rope_theta=1e4, max_position_embeddings=128)
    with pytest.raises(UserError, match="--dtype bfloat16 or float32"):
        choose_path("native", torch.device("cpu"), cfg, False, "not a GGUF file")


def test_unknown_dtype_names_the_choices() -> None:
    with pytest.raises(UserError, match="use auto, native"):
        build_engine(EngineOptions(dtype="int3"))


def test_auto_picks_a_measured_path() -> None:
    from spectune.backends.local.model.config import ModelConfig

    cfg = ModelConfig(model_type="llama", vocab_size=1024, hidden_size=64, intermediate_size=128, num_layers=2,
                      num_heads=2, num_kv_heads=1, head_dim=32, rope_theta=1e4, max_position_embeddings=128)
    choice = choose_path("auto", torch.device("cpu"), cfg, True)
    paths = ("native", "bfloat16", "float32")
    batches = ("", "@4", "@16")
    assert (choice.chosen_by, set(choice.estimates_ms)) == ("measured", {p + b for p in paths for b in batches})


ROWS = {"int4": {"1": 1.0, "4": 2.0, "16": 8.0}, "float32": {"1": 2.0, "4": 2.0, "16": 3.0},
        "bfloat16": {"1": 4.0, "4": 4.0, "16": 4.0}}
STEPS = {"native": 10.0, "float32": 12.0, "bfloat16": 20.0}


def test_batch_estimates_grow_a_step_with_its_kernels_compute_time() -> None:
    """A step costs its batch-1 time until its kernel's time at b rows passes its time at one row, then grows with
    it."""
    from spectune.backends.local.weights.compute_paths import batch_estimates

    est = batch_estimates(STEPS, ROWS, packed=True)
    assert (est["float32"], est["bfloat16"]) == ({"1": 12.0, "4": 12.0, "16": 18.0}, {"1": 20.0, "4": 20.0, "16": 20.0})


def test_native_costs_the_least_of_its_int4_step_and_each_dense_kinds_step() -> None:
    """Native runs int4 at one row (10), then the cheaper of int4 (10 x 2, 10 x 8) and the copies, each priced as
    its own path's step there (float32 12 and 18, bfloat16 20)."""
    from spectune.backends.local.weights.compute_paths import batch_estimates

    assert batch_estimates(STEPS, ROWS, packed=True)["native"] == {"1": 10.0, "4": 12.0, "16": 18.0}


def test_native_without_a_dense_copy_runs_int4_at_every_batch() -> None:
    from spectune.backends.local.weights.compute_paths import batch_estimates

    assert batch_estimates(STEPS, ROWS, packed=True, copies=False)["native"] == {"1": 10.0, "4": 20.0, "16": 80.0}


def test_default_gguf_is_fully_native() -> None:
    assert native_support(default_model_path()) == (True, "", 2)


async def test_local_sweep_backend_records_the_servers_path() -> None:
    """sweep.json's ``backend`` comes from ``describe()`` after each start: the server's chosen path is in it."""
    from spectune.backends import make_backend
    from spectune.backends.options import BackendOptions, BundledEngineOptions

    backend = make_backend("local", BackendOptions(max_concurrency=1, draft="none",
                                                   local=BundledEngineOptions(dtype="native", compile="off")))
    await backend.preflight([0])
    try:
        await backend.start(0)
        assert backend.describe()["engine"]["path"]["path"] == "native"
    finally:
        await backend.close()
