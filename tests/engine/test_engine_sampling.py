"""Lossless speculative sampling: spec-decoded tokens follow the target's distribution.

Tolerances: with N samples over a k-way distribution the expected total-variation distance of the empirical
distribution is about sum_i sqrt(p_i (1 - p_i) / (2 pi N)) * 2 / 2 <= sqrt(k / N) / 2; the bounds below are ~3x that
expectation, while the biases the tests guard against (accepting drafts too often, sampling the bonus token from the
wrong position, forgetting to remove the rejected draft) move the distributions by 0.2 or more.
"""

from __future__ import annotations


import torch

from spectune.backends.local.model.attention import AttnMeta
from spectune.backends.local.model.kv_cache import KVCache
from spectune.backends.local.engine.sampling import SamplingTensors, target_probs, verify
from spectune.backends.local.engine.speculative import SpeculativeDecoder
from helpers.tiny_models import tiny_head, tiny_target


def _tv(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return float((counts / counts.sum() - probs).abs().sum() / 2)


def _st(b: int, temp: float, top_k: int = 0, top_p: float = 1.0) -> SamplingTensors:
    return SamplingTensors.build([temp] * b, [top_k] * b, [top_p] * b, torch.device("cpu"))


def test_verify_emits_target_distribution_at_every_position() -> None:
    g = torch.Generator().manual_seed(0)
    n, k, v = 40000, 3, 6
    logits = torch.randn(1, k + 1, v, generator=g).expand(n, k + 1, v).contiguous() * 1.5
    st = _st(n, 1.0)
    p = target_probs(logits[:1], _st(1, 1.0))[0]  # [K+1, V]
    drafts = p[:k].argmax(-1).view(1, k).expand(n, k).contiguous()  # likely drafts: every position gets samples
    accepted, tokens = verify(logits, drafts, st, g)
    # first emitted token ~ p_0
    first = torch.bincount(tokens[:, 0], minlength=v).float()
    assert _tv(first, p[0]) < 0.015
    # given the first j tokens equal the drafts, the next emitted token ~ p_j
    for j in range(1, k + 1):
        prefix = (accepted >= j)
        nxt = torch.bincount(tokens[prefix, j], minlength=v).float()
        assert prefix.sum() > 1000
        assert _tv(nxt, p[j]) < 3 * (v / prefix.sum().item()) ** 0.5 / 2
    # acceptance of draft 1 happens with probability p_0(d_1)
    assert abs((accepted >= 1).float().mean().item() - p[0, drafts[0, 0]].item()) < 0.01


def test_verify_greedy_rows_take_the_longest_matching_prefix() -> None:
    logits = torch.full((2, 4, 5), -5.0)
    for j, t in enumerate([1, 2, 3, 4]):
        logits[:, j, t] = 5.0
    drafts = torch.tensor([[1, 2, 0], [1, 2, 3]])
    accepted, tokens = verify(logits, drafts, _st(2, 0.0))
    assert accepted.tolist() == [2, 3]
    assert tokens[0, :3].tolist() == [1, 2, 3]
    assert tokens[1].tolist() == [1, 2, 3, 4]


def test_top_k_and_top_p_filter_the_distribution() -> None:
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.15, 0.05]]]))
    pk = target_probs(logits, _st(1, 1.0, top_k=2))[0, 0]
    assert torch.allclose(pk, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=1e-5)
    pp = target_probs(logits, _st(1, 1.0, top_p=0.7))[0, 0]  # 0.5 + 0.3 reaches 0.7: keep two
    assert torch.allclose(pp, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=1e-5)


def _exact_next(target: torch.nn.Module, prefix: list[int], temp: float) -> torch.Tensor:
    c = target.cfg
    cache = KVCache(c.num_layers, 1, 64, c.num_kv_heads, c.head_dim, torch.float32)
    hidden, _ = target(torch.tensor([prefix]), AttnMeta.for_prefill(cache, target.rope, 0, len(prefix)))
    return target_probs(target.logits(hidden[:, -1:]), _st(1, temp))[0, 0]


def test_spec_decoding_end_to_end_matches_target_marginals() -> None:
    target = tiny_target(vocab=8, scale=2.0)
    head = tiny_head(target, draft_vocab=6)
    prompt, temp, batch, reps = [1, 2, 3, 4, 5], 1.0, 512, 12
    g = torch.Generator().manual_seed(1)
    decoder = SpeculativeDecoder(target, head, batch, 64, g)
    samples = []
    for _ in range(reps):  # x_n greedy (fixed), the state copied into every slot, then sampled decode rounds
        [first] = decoder.prefill([0], [prompt], _st(1, 0.0), draft=True)
        for s in range(1, batch):
            decoder.move_slot(0, s)
        out: list[list[int]] = [[] for _ in range(batch)]
        while min(len(o) for o in out) < 2:
            _, toks = decoder.decode_round(batch, 2, _st(batch, temp))
            for o, t in zip(out, toks):
                o.extend(t)
        samples.extend(o[:2] for o in out)
    seqs = torch.tensor(samples)  # [N, 2]: the two tokens after x_n
    ctx = prompt + [first]
    p1 = _exact_next(target, ctx, temp)  # exact marginals by enumeration
    p2 = sum(p1[a] * _exact_next(target, ctx + [a], temp) for a in range(8))
    tol = 3 * (8 / len(samples)) ** 0.5 / 2
    assert _tv(torch.bincount(seqs[:, 0], minlength=8).float(), p1) < tol
    assert _tv(torch.bincount(seqs[:, 1], minlength=8).float(), p2) < tol
