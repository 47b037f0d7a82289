"""Engine mechanics on a tiny random model: continuous batching, slot reuse, stops, aborts, adaptive num_steps,
per-batch-size schedules and the padded (CUDA-graph-shaped) forward path. Greedy outputs must never depend on how
requests were batched or which num_steps verified them."""

from __future__ import annotations

import pytest

from spectune.backends.num_steps import make_policy, parse_sglang_adaptive_config, parse_vllm_speculative_config
from spectune.backends.local.engine.sequence import SamplingParams
from helpers.tiny_models import tiny_engine

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11, 12], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [7], [2, 9, 4, 1, 8]]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def alone(k: int, prompt: list[int], params: SamplingParams = GREEDY) -> list[int]:
    return tiny_engine(num_steps=0 if k == 0 else k).generate([prompt], params)[0]


@pytest.fixture(scope="module")
def expected() -> list[list[int]]:
    engine = tiny_engine(num_steps=0)
    return [engine.generate([p], GREEDY)[0] for p in PROMPTS]


@pytest.mark.parametrize("k", [1, 3])
def test_batched_spec_decoding_equals_plain_decoding(expected, k: int) -> None:
    engine = tiny_engine(num_steps=k, slots=4)  # 6 prompts, 4 slots: two wait, then reuse finished slots
    assert engine.generate(PROMPTS, GREEDY) == expected
    assert engine.stats.spec.verify_steps > 0
    assert engine.stats.spec.draft_tokens == k * engine.stats.spec.verify_steps


def test_padded_graph_shapes_give_identical_outputs(expected) -> None:
    engine = tiny_engine(num_steps=3, slots=8, graphs=True)  # batch 6 padded to 8, cache length bucketed to 256
    assert engine.generate(PROMPTS, GREEDY) == expected
    assert engine.decoder.graphs.padded_batch(6) == 8
    assert engine.decoder.graphs.kv_bucket(40) == 256


def test_requests_joining_mid_decode_and_leaving_early(expected) -> None:
    engine = tiny_engine(num_steps=2, slots=4)
    outs: dict[str, list[int]] = {}
    short = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)

    def add(i: int, params: SamplingParams) -> None:
        outs[str(i)] = []
        engine.add_request(str(i), PROMPTS[i], params, lambda o: outs[o.request_id].extend(o.new_token_ids))

    add(0, GREEDY)
    add(1, short)
    for _ in range(3):
        engine.step()
    add(2, GREEDY)  # joins while 0 decodes; 1 has finished and left its slot
    add(3, GREEDY)
    while engine.num_running or engine.num_waiting:
        engine.step()
    assert outs["0"] == expected[0]
    assert outs["2"] == expected[2]
    assert outs["3"] == expected[3]
    assert outs["1"] == expected[1][:5]


def test_eos_stop_tokens_max_tokens_and_abort() -> None:
    engine = tiny_engine(num_steps=2)
    free = alone(2, PROMPTS[0])
    stop_at = free[4]
    out = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=[stop_at]))
    assert out[0] == free[: free.index(stop_at) + 1]
    eos_engine = tiny_engine(num_steps=2, eos=stop_at)
    assert eos_engine.generate([PROMPTS[0]], SamplingParams(max_tokens=24, temperature=0.0))[0] == out[0]
    got: list = []
    engine.add_request("a", PROMPTS[1], GREEDY, got.append)
    engine.step()
    engine.abort("a")
    engine.step()
    assert got[-1].finished
    assert got[-1].finish_reason == "abort"
    assert engine.num_running == 0


def test_adaptive_policy_switches_tiers_and_stays_lossless(expected) -> None:
    cfg = parse_sglang_adaptive_config({"1": {"candidate_steps": [0, 1, 3]}, "warmup_batches": 2,
                                        "update_interval": 2})
    engine = tiny_engine(num_steps=3, policy=make_policy(cfg, initial_steps=3))
    assert engine.generate(PROMPTS, GREEDY) == expected
    assert engine.stats.num_steps_switches >= 1  # random drafts are rarely accepted: it steps down, probes up
    assert engine.stats.spec.verify_steps > 0


def test_vllm_schedule_picks_num_steps_by_batch_size(expected) -> None:
    sched = parse_vllm_speculative_config({"num_speculative_tokens": 3,
                                           "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 8, 1]]})

    class Trace:
        rows: list[tuple[int, int]] = []

        def record(self, bs, accepted, k, **fields):  # fields: TraceWriter.record's optional per-row ones
            self.rows.append((bs, k))

    engine = tiny_engine(num_steps=0, policy=make_policy(sched))
    engine.cfg.trace = Trace()
    assert engine.generate(PROMPTS[:3], GREEDY) == expected[:3]
    assert {k for bs, k in Trace.rows if bs == 1} == {3}
    assert {k for bs, k in Trace.rows if bs >= 2} == {1}


def test_trace_rows_carry_their_request_ids() -> None:
    rows: list[tuple[str, ...]] = []

    class Trace:
        def record(self, bs, accepted, k, **fields):  # fields: TraceWriter.record's optional per-row ones
            rows.append(tuple(fields["request_ids"]))

    engine = tiny_engine(num_steps=2)
    engine.cfg.trace = Trace()
    for rid, prompt in (("a", PROMPTS[0]), ("b", PROMPTS[1])):
        engine.add_request(rid, prompt, GREEDY, lambda out: None)
    while engine.num_running or engine.num_waiting:
        engine.step()
    assert ("a", "b") in rows  # a round of both requests names both, in row order


@pytest.mark.parametrize("catch_up_tokens", [8192, 4])
def test_lazy_drafting_catches_up_to_the_head_state_of_an_always_current_head(monkeypatch, catch_up_tokens) -> None:
    """Adaptive mode skips the head in prefills and K=0 rounds; the first drafting round after them must draft from
    the same head state (draft KV and feature) as a head that ran every round, also after slot moves, and also when
    the lagging slots' catch-up is split over several packed head forwards (a cap of 4 entries each)."""
    import torch

    from spectune.backends.local.engine import speculative

    monkeypatch.setattr(speculative, "CATCH_UP_TOKENS", catch_up_tokens)

    sched = parse_vllm_speculative_config({"num_speculative_tokens": 2,
                                           "num_speculative_tokens_per_batch_size": [[1, 1, 2], [2, 2, 1], [3, 8, 0]]})
    engines = [tiny_engine(num_steps=0, policy=make_policy(sched), lazy=lazy) for lazy in (False, True)]
    assert not engines[0].decoder.lazy
    assert engines[1].decoder.lazy
    outs: list[dict[str, list[int]]] = [{}, {}]
    requests = [("a", PROMPTS[1], 30), ("b", PROMPTS[3], 5), ("c", PROMPTS[0], 60)]
    caught_up, steps = 0, 0
    while steps == 0 or any(e.num_running or e.num_waiting for e in engines):
        for e, out in zip(engines, outs):
            for rid, prompt, n in requests[:1] if steps == 0 else requests[1:] if steps == 2 else []:
                out[rid] = []
                e.add_request(rid, prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
                              lambda o, out=out: out[o.request_id].extend(o.new_token_ids))
            e.step()
        steps += 1
        eager, lazy = (e.decoder for e in engines)
        assert eager.lengths == lazy.lengths
        for slot in range(engines[1].num_running):
            if lazy.draft_len[slot] == lazy.lengths[slot]:  # current: drafts from here must be the eager head's
                caught_up += 1
                torch.testing.assert_close(lazy.draft_feature[slot], eager.draft_feature[slot], atol=1e-4, rtol=1e-4)
                n = lazy.lengths[slot]
                torch.testing.assert_close(lazy.draft_cache.k[:, slot, :, :n], eager.draft_cache.k[:, slot, :, :n],
                                           atol=1e-4, rtol=1e-4)
    assert outs[0] == outs[1]
    assert set(outs[0]) == {"a", "b", "c"}
    assert caught_up > 10
    assert engines[0].stats.spec.accepted_per_pos == engines[1].stats.spec.accepted_per_pos


def test_per_request_spec_counters() -> None:
    engine = tiny_engine(num_steps=3)
    outs = []
    engine.add_request("x", PROMPTS[1], GREEDY, lambda o: outs.append(o) if o.finished else None)
    while engine.num_running or engine.num_waiting:
        engine.step()
    spec = outs[0].spec
    assert spec.draft_tokens == 3 * spec.verify_steps
    # the prefill emits 1 token, each round a+1; the last round may be cut by max_tokens (by at most K tokens)
    surplus = 1 + spec.verify_steps + spec.accepted_tokens - outs[0].num_output_tokens
    assert 0 <= surplus <= 3
    assert spec.verify_steps >= spec.accepted_per_pos[0] >= spec.accepted_per_pos[1] >= spec.accepted_per_pos[2]
    assert sum(spec.accepted_per_pos) == spec.accepted_tokens
    assert spec.to_json()["acceptance_length"] == pytest.approx(1 + spec.accepted_tokens / spec.verify_steps)
