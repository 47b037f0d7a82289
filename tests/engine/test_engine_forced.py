"""Teacher-forced acceptance (tests/helpers/forced.py), what the GPU test compares across devices: forced onto the
target's own greedy output it must be free-running greedy decoding, round for round."""

from __future__ import annotations

import pytest

from spectune.backends.local.build import build_engine
from spectune.backends.local.engine.sequence import SamplingParams
from spectune.backends.local.options import EngineOptions
from helpers.engine import bundled_head_available
from helpers.forced import forced_acceptance

pytestmark = pytest.mark.skipif(not bundled_head_available(), reason="the bundled SmolLM2 head is not installed")

K, TOKENS = 3, 32
MESSAGES = [[{"role": "user", "content": text}] for text in (
    "Write a Python function that reverses a string.", "Name three rivers in Europe.",
    "Explain why the sky is blue in two sentences.", "List the planets of the solar system in order.")]


def _engine(num_steps: int):
    return build_engine(EngineOptions(num_steps=num_steps, num_steps_capacity=K, dtype="float32", device="cpu",
                                      compile="off", max_num_seqs=len(MESSAGES), max_model_len=256, kv_cache_gb=0.5))


@pytest.fixture(scope="module")
def runs() -> dict:
    plain = _engine(0)
    prompts = [plain.tokenizer.encode_chat(m) for m in MESSAGES]
    references = plain.generate(prompts, SamplingParams(max_tokens=TOKENS + K, temperature=0.0, ignore_eos=True))
    free = _engine(K)
    free.generate(prompts, SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True))
    forced = forced_acceptance(_engine(K).decoder, prompts, references, K, TOKENS)
    return {"free": free.stats.avg_accept_length, "forced": forced}


def test_forced_onto_the_targets_greedy_output_accepts_as_free_running_greedy(runs) -> None:
    assert runs["forced"] == pytest.approx(runs["free"], rel=1e-9)


def test_the_head_drafts_acceptable_tokens_there(runs) -> None:
    assert runs["forced"] > 1.3


def test_a_reference_too_short_for_the_drafts_is_refused() -> None:
    with pytest.raises(ValueError, match="tokens \\+ k"):
        forced_acceptance(None, [[1]], [[1] * (TOKENS + K - 1)], K, TOKENS)
