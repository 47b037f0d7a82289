"""The bundled engine on a CUDA device (skipped without one: the ``gpu`` hook in tests/conftest.py). Each test names
its device; the CPU twins run in the default command (test_engine_greedy.py, test_serve_process.py)."""

from __future__ import annotations

import pytest

from helpers.engine import bundled_head_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not bundled_head_available(), reason="the bundled SmolLM2 head is not installed")]

PROMPTS = [[{"role": "user", "content": "Name three rivers in Europe."}],
           [{"role": "user", "content": "Write a Python function that reverses a string."}]]


@pytest.mark.parametrize("k", [1, 3])
def test_cuda_speculative_greedy_equals_plain_greedy(k: int) -> None:
    """Speculation is lossless: with the bundled head at num_steps K (CUDA graphs, float32) greedy decoding emits
    the same tokens as the target alone on the same device, and drafts were accepted."""
    from spectune.backends.local.build import build_engine
    from spectune.backends.local.options import EngineOptions
    from spectune.backends.local.engine.sequence import SamplingParams

    opts = dict(dtype="float32", device="cuda", max_num_seqs=4, max_model_len=512, kv_cache_gb=1.0)
    spec = build_engine(EngineOptions(num_steps=k, **opts))
    plain = build_engine(EngineOptions(draft="none", num_steps=0, **opts))
    assert spec.decoder.device.type == "cuda"
    ids = [spec.tokenizer.encode_chat(m) for m in PROMPTS]
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    assert spec.generate(ids, params) == plain.generate(ids, params)
    assert spec.stats.avg_accept_length > 1.0
