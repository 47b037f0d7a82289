"""Greedy speculative decoding is lossless: token-identical to the engine's K = 0 output and to HF transformers'
``generate`` (fp32), on SmolLM2-135M-Instruct with the bundled EAGLE head, one request at a time and 8 at once.
"""

from __future__ import annotations

import pytest
import torch

from spectune.backends.local.build import build_engine
from spectune.backends.local.options import EngineOptions
from spectune.backends.local.engine.sequence import SamplingParams
from helpers.engine import bundled_head_available, watch_rounds

PROMPTS = [
    "Hi!",
    "What is the capital of Japan?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give me three tips for staying focused while studying, with one sentence each.",
    "Explain, in a short paragraph, why the sky is blue. Mention Rayleigh scattering and the role of the wavelength "
    "of light, and say why sunsets look red.",
    "Translate to French: The weather is nice today and we are going to the beach with our friends.",
    "List the planets of the solar system in order from the sun.",
    "Summarize the following: Speculative decoding uses a small draft model to propose several tokens that a large "
    "target model then verifies in a single forward pass, keeping the longest prefix that matches its own choices. "
    "Because verification of several tokens costs about as much as generating one, accepted drafts are nearly free.",
]
MAX_TOKENS = 40

pytestmark = pytest.mark.skipif(not bundled_head_available(), reason="the bundled SmolLM2 head is not installed")


@pytest.fixture(scope="module")
def reference() -> tuple[list[list[int]], list[list[int]]]:
    """Prompt ids and HF transformers greedy outputs (fp32, one prompt at a time)."""
    from transformers import AutoModelForCausalLM

    from spectune.backends.local.engine.tokenizer import Tokenizer
    from spectune.backends.local.weights.loader import convert_gguf, default_model_path

    folder = convert_gguf(default_model_path())
    tok = Tokenizer(folder)
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            gen = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                              eos_token_id=tok.eos_token_ids, pad_token_id=tok.eos_token_ids[0])
            outs.append(gen[0, len(ids):].tolist())
    return prompts, outs


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_greedy_output_matches_hf_at_batch_1_and_8(reference, k: int) -> None:
    prompts, expected = reference
    engine = build_engine(EngineOptions(num_steps=k, dtype="float32", device="cpu", max_num_seqs=8, max_model_len=512,
                                        kv_cache_gb=1.0))
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    batched = engine.generate(prompts, params)  # 8 concurrent requests of mixed prompt lengths
    singles = [engine.generate([p], params)[0] for p in prompts]
    assert batched == expected
    assert singles == expected
    if k > 0:  # drafts were really accepted: the check covered the accept path, not only corrections
        assert engine.stats.avg_accept_length > 1.3


@pytest.mark.parametrize("upkeep", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_adaptive_schedule_matches_hf_with_lazy_drafting_or_draft_upkeep(reference, tmp_path, upkeep: bool) -> None:
    """An adaptive engine (vLLM schedule: K=0 at batch 4, K=2 below) is lossless both ways it keeps the head
    current: lazy drafting (the default) and SGLang's draft extend on every num_steps 0 round
    (``EngineOptions.draft_upkeep``, what benchmarks/adaptive_overhead.py prices)."""
    import json

    prompts, expected = reference
    cfg = tmp_path / "schedule.json"
    cfg.write_text(json.dumps({"num_speculative_tokens": 2,
                               "num_speculative_tokens_per_batch_size": [[1, 3, 2], [4, 8, 0]]}))
    engine = build_engine(EngineOptions(num_steps=0, dtype="float32", device="cpu", max_num_seqs=4,
                                        max_model_len=512, kv_cache_gb=1.0, adaptive_config=str(cfg),
                                        draft_upkeep=upkeep))
    assert engine.decoder.lazy is not upkeep
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    assert engine.generate(prompts[:4], params) == expected[:4]  # batch 4 -> K=0; from the first finish on -> K=2
    assert engine.stats.num_steps_switches >= 1


def test_an_engine_sharing_weights_is_lossless_and_owns_its_caches(reference, tmp_path) -> None:
    """``build_engine(..., weights_of=engine)`` (what benchmarks/adaptive_overhead.py compares on): the same target
    module, its own KV cache, and an adaptive schedule on the shared weights still matches HF greedy output."""
    import json

    prompts, expected = reference
    source = build_engine(EngineOptions(num_steps=0, dtype="float32", device="cpu", max_num_seqs=4, max_model_len=512,
                                        kv_cache_gb=1.0, num_steps_capacity=2))
    cfg = tmp_path / "schedule.json"
    cfg.write_text(json.dumps({"num_speculative_tokens": 2,
                               "num_speculative_tokens_per_batch_size": [[1, 1, 2], [2, 8, 0]]}))
    shared = build_engine(EngineOptions(num_steps=0, dtype="float32", device="cpu", max_num_seqs=4,
                                        max_model_len=512, kv_cache_gb=1.0, adaptive_config=str(cfg)),
                          weights_of=source)
    assert shared.decoder.target is source.decoder.target
    assert shared.decoder.target_cache.k.data_ptr() != source.decoder.target_cache.k.data_ptr()
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    assert shared.generate(prompts[:2], params) == expected[:2]  # batch 2 -> K=0, then K=2 after the first finish
    assert shared.stats.spec.verify_steps > 0


def test_sharing_weights_needs_the_same_cache_length() -> None:
    source = build_engine(EngineOptions(num_steps=0, dtype="float32", device="cpu", max_num_seqs=2, max_model_len=256,
                                        kv_cache_gb=0.5))
    with pytest.raises(ValueError, match="cache length"):
        build_engine(EngineOptions(num_steps=0, dtype="float32", device="cpu", max_num_seqs=2, max_model_len=512,
                                   kv_cache_gb=0.5), weights_of=source)


def test_per_row_draft_length_matches_hf_with_rows_of_different_lengths_in_one_verify(reference, tmp_path) -> None:
    """Draft-length rules (llama.cpp's p_min; SpecDec++ on the raw draft confidence) are lossless at batch 8 with the
    target verifying padded or packed rows, and their rounds really verify rows of different draft lengths in one
    target forward. One engine (built from a p_min config), its rule and layout swapped between runs, the cutoff
    also as ``POST /spectune/num_steps`` switches it (``Engine.set_num_steps(k, p_min)``: 0 = off)."""
    import json

    from spectune.backends.local.engine.draft_length import DraftRule

    prompts, expected = reference
    cfg = tmp_path / "rule.json"
    cfg.write_text(json.dumps({"strategy": "p_min", "p_min": 0.5, "n_max": 4}))
    engine = build_engine(EngineOptions(num_steps=0, dtype="float32", device="cpu", max_num_seqs=8, max_model_len=512,
                                        kv_cache_gb=1.0, adaptive_config=str(cfg)))
    assert engine.decoder.rule is not None and engine.cfg.num_steps == 4
    rounds = watch_rounds(engine)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    assert engine.generate(prompts, params) == expected  # p_min, padded
    assert any(len(set(r)) > 1 for r in rounds)  # rows of one round verified different draft lengths
    assert max(max(r) for r in rounds) == 4  # n_max reached by some row
    assert engine.stats.spec.draft_tokens == sum(map(sum, rounds))  # counters count what each row drafted
    engine.decoder.verify_layout = "packed"
    assert engine.generate(prompts, params) == expected  # p_min, packed
    engine.decoder.verify_layout = "padded"
    engine.set_num_steps(4, 0.0)  # POST /spectune/num_steps with draft_p_min 0: per-row drafting off in place
    rounds.clear()
    assert engine.generate(prompts[:2], params) == expected[:2]
    assert {n for r in rounds for n in r} == {4}  # every row drafts num_steps
    engine.set_num_steps(4, 0.7)  # and a cutoff switched on in place
    rounds.clear()
    assert engine.generate(prompts[:4], params) == expected[:4]
    assert any(len(set(r)) > 1 for r in rounds)
    engine.decoder.rule = DraftRule("specdec", 0.5, 4)
    rounds.clear()
    assert engine.generate(prompts, params) == expected  # specdec on the raw confidence
    assert any(len(set(r)) > 1 for r in rounds)
    with pytest.raises(ValueError, match="cannot replace this server's specdec"):
        engine.set_num_steps(4, 0.5)  # a config file's other rule is never replaced by a cutoff


@pytest.mark.parametrize("layout", ["packed"])
def test_specserve_matches_hf_with_the_step_time_model_calibrated_at_start_up(reference, tmp_path, layout: str) -> None:
    """SpecServe (its adaptive drafter and confidence-prior verifier on this machine's step-time model, fitted at
    start-up) is lossless at batch 8, its verifier dropping tokens per row (the packed layout)."""
    import json

    from spectune.backends.local.engine.specserve import SpecServeRule

    prompts, expected = reference
    cfg = tmp_path / "specserve.json"
    cfg.write_text(json.dumps({"strategy": "specserve", "n_max": 4}))
    engine = build_engine(EngineOptions(num_steps=0, dtype="float32", device="cpu", max_num_seqs=8, max_model_len=512,
                                        kv_cache_gb=1.0, adaptive_config=str(cfg)))
    rule = engine.decoder.rule
    assert isinstance(rule, SpecServeRule) and engine.cfg.num_steps == 4
    assert rule.model.target.delta_ms > 0  # a fitted model: a target forward costs something
    engine.decoder.verify_layout = layout
    rounds = watch_rounds(engine)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    assert engine.generate(prompts, params) == expected
    assert engine.stats.spec.draft_tokens == sum(map(sum, rounds)) > 0  # drafts verified, and counted per row
