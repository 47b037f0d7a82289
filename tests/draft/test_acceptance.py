"""The acceptance-prediction head (SpecDec++): its module and folder format, the conditional labels and draft chains
its training data is built from, the weighted loss's output correction, the calibration metrics, and the bundled
head on real draft features."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from spectune.backends.local.model.acceptance import (BUNDLED_ACCEPTANCE_HEAD, AcceptanceConfig, AcceptanceHead,
                                                      load_acceptance_head, new_acceptance_head, save_acceptance_head)
from spectune.core.errors import UserError
from spectune.draft.acceptance_data import chain_samples, conditional_labels
from spectune.draft.acceptance_train import AcceptanceTrainConfig, train_acceptance, weighted_bce
from spectune.draft.calibration import auroc, brier, ece
from helpers.tiny_models import tiny_head, tiny_target

CPU = torch.device("cpu")


def test_forward_gives_one_probability_per_feature_row() -> None:
    head = new_acceptance_head(32, width=16, num_layers=2, w_rej=3.0, n_max=4, seed=0)
    feature = torch.randn(3, 5, 32) * 50  # pre-norm features are large
    prob = torch.rand(3, 5) * 0.9 + 0.1
    p = head(feature, prob)
    assert p.shape == (3, 5)
    assert p.dtype == torch.float32
    assert bool(((p > 0) & (p < 1)).all())


def test_bfloat16_head_returns_float32_close_to_the_float32_head(tmp_path: Path) -> None:
    save_acceptance_head(new_acceptance_head(32, 16, 2, 3.0, 4, seed=0), tmp_path)
    f32 = load_acceptance_head(tmp_path, CPU, torch.float32)
    bf16 = load_acceptance_head(tmp_path, CPU, torch.bfloat16)
    feature, prob = torch.randn(64, 32), torch.rand(64)
    out = bf16(feature.to(torch.bfloat16), prob)
    assert out.dtype == torch.float32
    assert (out - f32(feature, prob)).abs().max() < 0.03


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    head = new_acceptance_head(24, width=8, num_layers=3, w_rej=6.0, n_max=5, seed=1)
    save_acceptance_head(head, tmp_path / "acc")
    loaded = load_acceptance_head(tmp_path / "acc", CPU, torch.float32)
    assert loaded.cfg == head.cfg
    feature, prob = torch.randn(10, 24), torch.rand(10)
    torch.testing.assert_close(loaded(feature, prob), head(feature, prob))
    assert not any(p.requires_grad for p in loaded.parameters())


def test_load_rejects_bad_folders(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="needs config.json and model.safetensors"):
        load_acceptance_head(tmp_path / "nowhere", CPU, torch.float32)
    save_acceptance_head(new_acceptance_head(16, 8, 1, 1.0, 4, seed=0), tmp_path / "a")
    (tmp_path / "a" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    with pytest.raises(UserError, match="is not an acceptance head's config"):
        load_acceptance_head(tmp_path / "a", CPU, torch.float32)
    (tmp_path / "a" / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="not readable JSON"):
        load_acceptance_head(tmp_path / "a", CPU, torch.float32)
    save_acceptance_head(AcceptanceHead(AcceptanceConfig(feature_size=16, width=8, num_layers=1)), tmp_path / "b")
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    (tmp_path / "b" / "config.json").write_text(json.dumps({**cfg, "num_layers": 2}))  # one block's weights absent
    with pytest.raises(UserError, match="lacks tensor 'blocks.1.linear.weight'"):
        load_acceptance_head(tmp_path / "b", CPU, torch.float32)


def test_labels_keep_only_steps_whose_earlier_drafts_all_matched() -> None:
    matches = torch.tensor([[1, 1, 0, 1],    # rejected at step 2: step 3 is past the round's end
                            [0, 1, 1, 1],    # rejected at once: only step 0 counts
                            [1, 1, 1, 1],
                            [1, 1, 0, 0]], dtype=torch.bool)
    valid = torch.ones_like(matches)
    valid[3, 2:] = False  # row 3's last two labels lie past the sequence's end
    labels, keep = conditional_labels(matches, valid)
    assert keep.tolist() == [[True, True, True, False],
                             [True, False, False, False],
                             [True, True, True, True],
                             [True, True, False, False]]
    assert torch.equal(labels, matches)


def test_draft_chain_is_the_engines_step_by_step_drafting() -> None:
    """chain_samples' features and confidences at kept steps equal the head run as the engine runs it: a prefill
    over (x_{p+1}, f_p) into its KV cache, then one-token draft forwards reading the previous output feature."""
    from spectune.backends.local.model.attention import AttnMeta
    from spectune.backends.local.model.kv_cache import KVCache
    from spectune.backends.local.model.rope import rope_table

    target = tiny_target(vocab=16, hidden=32, seed=3)
    head = tiny_head(target, draft_vocab=16, seed=4)
    tokens = torch.tensor([1, 5, 3, 7, 2, 9, 4, 4, 11, 6, 8, 12, 3, 5])
    prompt_len, n_max = 4, 3
    c = target.cfg
    with torch.inference_mode():
        tcache = KVCache(c.num_layers, 1, 64, c.num_kv_heads, c.head_dim, torch.float32)
        _, feats = target(tokens.view(1, -1), AttnMeta.for_prefill(tcache, target.rope, 0, len(tokens)))
    feats = feats[0]
    d = head.cfg
    rope = rope_table(d.head_dim, d.rope_theta, d.rope_scaling, 64, torch.float32)
    samples = chain_samples(head, target.embed_tokens.weight, tokens, feats, prompt_len, n_max, rope)
    with torch.inference_mode():
        for t in range(prompt_len - 1, len(tokens) - 2):
            cache = KVCache(d.num_layers, 1, 64, d.num_kv_heads, d.head_dim, torch.float32)
            out = head(tokens[1 : t + 2].view(1, -1), feats[None, : t + 1],
                       AttnMeta.for_prefill(cache, head.rope, 0, t + 1))[0, -1]  # entry (x_{t+1}, f_t)
            for j in range(n_max):
                if t + j + 2 >= len(tokens):
                    break
                draft, prob = head.draft_with_prob(out)
                mine = (samples["pos"] == t) & (samples["step"] == j)
                if mine.any():  # kept: every earlier draft was x_{t+i+2}, so the engine's inputs were the same
                    torch.testing.assert_close(samples["feature"][mine][0], out, atol=1e-4, rtol=1e-4)
                    assert float(samples["prob"][mine][0]) == pytest.approx(float(prob), abs=1e-5)
                    assert bool(samples["label"][mine][0]) == bool(draft == tokens[t + j + 2])
                if draft != tokens[t + j + 2]:
                    assert not ((samples["pos"] == t) & (samples["step"] > j)).any()  # later steps dropped
                    break
                pos = torch.tensor([[t + j + 1]])
                out = head(draft.view(1, 1), out.view(1, 1, -1),
                           AttnMeta.for_batch(cache, head.rope, pos, d.num_heads // d.num_kv_heads))[0, 0]
    assert int((samples["step"] == 0).sum()) == len(tokens) - 2 - (prompt_len - 1)


def test_weighted_bce_weighs_rejections() -> None:
    logit = torch.tensor([0.3, -1.2, 2.0])
    label = torch.tensor([True, False, False])
    bce = [math.log(1 + math.exp(-0.3)), math.log(1 + math.exp(-1.2)), math.log(1 + math.exp(2.0))]
    expected = (bce[0] + 4 * bce[1] + 4 * bce[2]) / 9
    assert float(weighted_bce(logit, label, 4.0)) == pytest.approx(expected, rel=1e-6)


def test_output_offset_undoes_the_rejection_weight() -> None:
    """Labels that ignore the features: the weighted loss alone would push p towards q / (q + w (1 - q)); the head's
    log(w_rej) offset brings its output back to the acceptance rate q."""
    gen = torch.Generator().manual_seed(0)
    n, q, w = 4000, 0.7, 4.0
    samples = {"feature": torch.randn(n, 8, generator=gen), "prob": torch.rand(n, generator=gen),
               "label": torch.rand(n, generator=gen) < q, "seq": torch.arange(n) // 20}
    cfg = AcceptanceTrainConfig(width=8, num_layers=1, w_rej=w, epochs=4, lr=3e-3, batch_size=200, seed=0)
    head = train_acceptance(samples, cfg)
    rate = float(samples["label"].float().mean())
    with torch.no_grad():
        p = head(samples["feature"], samples["prob"])
        raw = torch.sigmoid(head.logit(samples["feature"], samples["prob"]))
    assert float(p.mean()) == pytest.approx(rate, abs=0.04)
    assert float(raw.mean()) == pytest.approx(rate / (rate + w * (1 - rate)), abs=0.04)


def test_ece_brier_and_auroc_by_their_formulas() -> None:
    rng = np.random.default_rng(0)
    p = np.round(rng.uniform(0, 1, 200), 2)  # rounded: ties for the AUROC's half counts
    y = (rng.uniform(0, 1, 200) < p ** 2).astype(float)
    expected_ece = 0.0
    for b in range(10):
        lo, hi = b / 10, (b + 1) / 10
        sel = (p >= lo) & (p < hi)
        if sel.any():
            expected_ece += sel.sum() / len(p) * abs(y[sel].mean() - p[sel].mean())
    assert ece(p, y, 10) == pytest.approx(expected_ece, rel=1e-9)
    assert brier(p, y) == pytest.approx(sum((pi - yi) ** 2 for pi, yi in zip(p, y)) / len(p), rel=1e-9)
    pos, neg = p[y == 1], p[y == 0]
    pairs = sum(float(a > b) + 0.5 * float(a == b) for a in pos for b in neg)
    assert auroc(p, y) == pytest.approx(pairs / (len(pos) * len(neg)), rel=1e-9)


def test_ece_puts_a_prediction_of_one_in_the_last_bin() -> None:
    # two predictions of 1.0 (accepted, rejected) and one of 0.05 (rejected): bins 9 and 0
    assert ece(np.array([1.0, 1.0, 0.05]), np.array([1.0, 0.0, 0.0]), 10) == pytest.approx(
        2 / 3 * abs(0.5 - 1.0) + 1 / 3 * abs(0.0 - 0.05))


def test_bundled_head_on_real_draft_features() -> None:
    """The shipped head loads and gives probabilities in (0, 1) for the bundled EAGLE-3 head's output features."""
    from spectune.backends.local.options import DEFAULT_HEAD
    from spectune.backends.local.weights.heads import load_head
    from spectune.backends.local.weights.loader import load_target
    from spectune.backends.local.model.attention import AttnMeta
    from spectune.backends.local.model.kv_cache import KVCache

    from tokenizers import Tokenizer

    acc = load_acceptance_head(BUNDLED_ACCEPTANCE_HEAD, CPU, torch.bfloat16)
    target, folder = load_target(None, torch.bfloat16, "cpu")
    head = load_head(DEFAULT_HEAD, target, torch.bfloat16, CPU)
    target.capture_layers = head.cfg.aux_layers
    target.build_rope(64)
    head.prepare(64)
    text = "Speculative decoding lets a small draft model propose tokens that the large model then checks at once."
    tokens = torch.tensor([Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids])
    n = tokens.shape[1]
    c, d = target.cfg, head.cfg
    with torch.inference_mode():
        _, aux = target(tokens, AttnMeta.for_prefill(KVCache(c.num_layers, 1, 64, c.num_kv_heads, c.head_dim,
                                                             torch.bfloat16), target.rope, 0, n))
        out = head(tokens[:, 1:], aux[:, :-1], AttnMeta.for_prefill(
            KVCache(d.num_layers, 1, 64, d.num_kv_heads, d.head_dim, torch.bfloat16), head.rope, 0, n - 1))[0]
        _, prob = head.draft_with_prob(out)
        p = acc(out, prob)
    assert n > 10
    assert p.shape == (n - 1,) and p.dtype == torch.float32
    assert bool(((p > 0) & (p < 1)).all())
    assert acc.cfg.feature_size == d.hidden_size


def test_commands_reject_a_bad_stage_and_a_missing_acceptance_head(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from spectune.cli import app

    res = CliRunner().invoke(app, ["draft", "accept-train", "--output", str(tmp_path / "o"), "--stage", "fit"])
    assert isinstance(res.exception, UserError)
    assert "unknown --stage 'fit'" in str(res.exception)
    res = CliRunner().invoke(app, ["draft", "accept-eval", "--dataset", "mt-bench", "--acceptance-head",
                                   str(tmp_path / "missing")])
    assert isinstance(res.exception, UserError)
    assert "needs config.json and model.safetensors" in str(res.exception)
