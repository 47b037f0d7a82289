"""Packed prefill: the requests admitted in one engine iteration run through one target (and head) forward, and must
leave exactly the state that prefilling each alone leaves (KV cache, first token, draft feature, lazy buffers)."""

from __future__ import annotations

import time

import pytest
import torch

from spectune.backends.local.engine.sampling import SamplingTensors
from spectune.backends.local.engine.sequence import SamplingParams
from spectune.backends.local.engine.speculative import SpeculativeDecoder
from spectune.backends.local.model.packed import PAD_LIMIT, Segment, padded_groups
from helpers.tiny_models import tiny_engine, tiny_head, tiny_target

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11, 12], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [7]]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
TOL = {"atol": 1e-4, "rtol": 1e-4}  # float32: a packed GEMM rounds unlike one prompt's (measured up to 3e-5)


def _greedy(n: int) -> SamplingTensors:
    return SamplingTensors.build([0.0] * n, [0] * n, [1.0] * n, torch.device("cpu"), [None] * n)


def _decoders(lazy: bool) -> tuple[SpeculativeDecoder, SpeculativeDecoder]:
    target = tiny_target(vocab=16, layers=3)
    head = tiny_head(target)
    return tuple(SpeculativeDecoder(target, head, 8, 64, lazy_draft=lazy) for _ in range(2))


@pytest.fixture(scope="module")
def eager_pair() -> tuple[SpeculativeDecoder, SpeculativeDecoder, list[int], list[int]]:
    """The same prompts prefilled one by one into slots 0..4 of one decoder and packed into another."""
    alone, packed = _decoders(lazy=False)
    firsts_alone = [alone.prefill([slot], [p], _greedy(1), draft=True)[0] for slot, p in enumerate(PROMPTS)]
    firsts_packed = packed.prefill(list(range(len(PROMPTS))), PROMPTS, _greedy(len(PROMPTS)), draft=True)
    return alone, packed, firsts_alone, firsts_packed


def test_packed_prefill_gives_each_prompt_its_own_first_token(eager_pair) -> None:
    _, _, firsts_alone, firsts_packed = eager_pair
    assert firsts_packed == firsts_alone


def test_packed_prefill_writes_each_slot_the_target_cache_of_a_lone_prefill(eager_pair) -> None:
    alone, packed, _, _ = eager_pair
    for slot, p in enumerate(PROMPTS):
        n = len(p)
        torch.testing.assert_close(packed.target_cache.k[:, slot, :, :n], alone.target_cache.k[:, slot, :, :n], **TOL)
        torch.testing.assert_close(packed.target_cache.v[:, slot, :, :n], alone.target_cache.v[:, slot, :, :n], **TOL)


def test_packed_prefill_leaves_each_slot_the_draft_state_of_a_lone_prefill(eager_pair) -> None:
    alone, packed, _, _ = eager_pair
    n = len(PROMPTS)
    torch.testing.assert_close(packed.draft_feature[:n], alone.draft_feature[:n], **TOL)
    for slot, p in enumerate(PROMPTS):
        n = len(p)
        torch.testing.assert_close(packed.draft_cache.k[:, slot, :, :n], alone.draft_cache.k[:, slot, :, :n], **TOL)


def test_packed_prefill_records_lengths_and_pending_tokens(eager_pair) -> None:
    alone, packed, _, _ = eager_pair
    assert packed.lengths == alone.lengths
    assert packed.seq_len.tolist() == alone.seq_len.tolist()
    assert packed.last_token.tolist() == alone.last_token.tolist()


def test_lazy_packed_prefill_keeps_the_heads_inputs_of_a_lone_prefill() -> None:
    alone, packed = _decoders(lazy=True)
    for slot, p in enumerate(PROMPTS):
        alone.prefill([slot], [p], _greedy(1), draft=True)
    packed.prefill([4, 3, 2, 1, 0], PROMPTS[::-1], _greedy(len(PROMPTS)), draft=True)  # slots in any order
    for slot, p in enumerate(PROMPTS):
        torch.testing.assert_close(packed.feat_buf[slot, :len(p)], alone.feat_buf[slot, :len(p)], **TOL)
        assert packed.tok_buf[slot, :len(p)].tolist() == alone.tok_buf[slot, :len(p)].tolist()


def test_requests_admitted_together_share_one_prefill_forward() -> None:
    engine = tiny_engine(num_steps=2, slots=8)
    engine.generate(PROMPTS, GREEDY)
    assert (engine.stats.num_prefills, engine.stats.num_prefill_forwards) == (len(PROMPTS), 1)


def test_the_prefill_token_budget_splits_an_iterations_prompts() -> None:
    engine = tiny_engine(num_steps=2, slots=8)
    engine.scheduler.max_prefill_tokens = 10  # 3 + 7 tokens; 2 (11 is over); 11 (the first always goes); 1
    engine.generate(PROMPTS, GREEDY)
    assert engine.stats.num_prefill_forwards == 4


def test_a_fault_in_a_packed_prefill_fails_only_its_request() -> None:
    expected = tiny_engine(num_steps=2, slots=8).generate(PROMPTS, GREEDY)
    engine = tiny_engine(num_steps=2, slots=8)
    prefill = engine.decoder.prefill

    def faulty(slots, prompts, st, draft):
        if PROMPTS[2] in prompts:
            raise RuntimeError("injected fault")
        return prefill(slots, prompts, st, draft)

    engine.decoder.prefill = faulty
    outs: dict[str, list] = {}
    for i, p in enumerate(PROMPTS):
        outs[str(i)] = []
        engine.add_request(str(i), p, GREEDY, outs[str(i)].append)
    while engine.num_running or engine.num_waiting:
        engine.step()
    reasons = {rid: out[-1].finish_reason for rid, out in outs.items()}
    assert reasons == {"0": "length", "1": "length", "2": "error", "3": "length", "4": "length"}
    tokens = {rid: [t for o in out for t in o.new_token_ids] for rid, out in outs.items() if rid != "2"}
    assert tokens == {str(i): expected[i] for i in (0, 1, 3, 4)}


@pytest.mark.parametrize("lengths", [[3, 7, 2, 11, 1], [100, 5, 5, 5, 40, 41, 300], [8] * 6])
def test_padded_groups_hold_every_prompt_once_within_the_padding_limit(lengths) -> None:
    groups = padded_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        assert len(g) * max(lengths[i] for i in g) <= PAD_LIMIT * sum(lengths[i] for i in g)


def test_prompts_of_one_length_share_one_padded_group() -> None:
    assert padded_groups([8] * 6) == [list(range(6))]


def test_packed_attention_in_padded_groups_equals_one_sdpa_per_prompt() -> None:
    """The same packed forward's attention with the padded groups and with one SDPA per prompt."""
    from spectune.backends.local.model.attention import AttnMeta
    from spectune.backends.local.model.kv_cache import KVCache
    from spectune.backends.local.model.packed import attend_packed

    lengths = [100, 5, 5, 5, 40, 41, 300, 1]
    torch.manual_seed(0)
    t = sum(lengths)
    q, k, v = torch.randn(1, t, 6, 16), torch.randn(1, t, 2, 16), torch.randn(1, t, 2, 16)  # 6 heads, 2 KV heads
    cache = KVCache(1, len(lengths), 512, 2, 16, torch.float32)
    meta = AttnMeta.for_packed(cache, torch.zeros(512, 2, 16), [Segment(i, 0, n) for i, n in enumerate(lengths)])
    assert len(meta.padded.gathers) > 1  # the lengths make several groups
    grouped = attend_packed(cache, 0, meta.segments, meta.write_index, meta.padded, q, k, v)
    alone = attend_packed(cache, 0, meta.segments, meta.write_index, None, q, k, v)
    torch.testing.assert_close(grouped, alone, **TOL)


def test_the_interval_line_gives_rounds_and_prefills_with_their_time() -> None:
    from spectune.backends.local.engine.loop import EngineStats, interval_line

    before = EngineStats(num_rounds=10, decode_seconds=1.0, batch_total=40, num_prefill_forwards=2,
                         prefill_seconds=0.5, num_prefills=4, prompt_tokens=400)
    after = EngineStats(num_rounds=13, decode_seconds=1.006, batch_total=52, num_prefill_forwards=4,
                        prefill_seconds=0.51, num_prefills=9, prompt_tokens=900, active_num_steps=2)
    line = interval_line(before, after, 0.1)
    assert "3 decode rounds of 2.00 ms, batch 4.0 on average, num_steps 2 last (6% of the time)" in line
    assert "2 prefill forwards of 5.00 ms, 5 prompts, 500 tokens (10% of the time)" in line


def test_no_interval_line_without_work() -> None:
    from spectune.backends.local.engine.loop import EngineStats, interval_line

    assert interval_line(EngineStats(num_rounds=3), EngineStats(num_rounds=3), 10.0) is None


def test_the_serving_loop_logs_its_interval_lines(caplog) -> None:
    import logging
    import threading

    engine = tiny_engine(num_steps=2, slots=8)
    engine.cfg.stats_log_interval_s = 0.02
    done = threading.Event()
    finished: list[str] = []

    def on_output(out) -> None:
        if out.finished:
            finished.append(out.request_id)
            if len(finished) == len(PROMPTS):
                done.set()

    with caplog.at_level(logging.INFO, logger="spectune.engine"):
        engine.start()
        try:
            for i, p in enumerate(PROMPTS):
                engine.add_request(str(i), p, SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True),
                                   on_output)
            assert done.wait(60)
            time.sleep(0.1)
        finally:
            engine.shutdown()
    lines = [r.getMessage() for r in caplog.records if r.name == "spectune.engine"]
    assert any("decode rounds of" in line for line in lines)
