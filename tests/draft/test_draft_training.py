"""`spectune draft train` machinery on a tiny random target: self-distilled sequences from the engine, stored
features, EAGLE-3 training with the training-time test, resume after an interruption, and the held-out ShareGPT
split of `spectune draft eval`."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from spectune.backends.local.engine.sequence import SamplingParams
from spectune.loadgen.datasets import user_prompt
from spectune.draft import data
from spectune.draft.features import FeatureStore, extract_features
from spectune.draft.train import TrainConfig, train
from helpers.tiny_models import tiny_engine


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[object, FeatureStore]:
    """40 self-distilled sequences (greedy, 20 new tokens) of a tiny target whose layers add nothing to the
    residual stream, so its next token is a fixed function of the current one (a bigram model a head can learn
    from a few hundred tokens), and their stored features."""
    engine = tiny_engine(num_steps=0, slots=8)
    with torch.no_grad():
        for layer in engine.decoder.target.layers:
            layer.o_proj.weight.zero_()
            layer.down_proj.weight.zero_()
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 16) for _ in range(rng.randrange(2, 8))] for _ in range(40)]
    outputs = engine.generate(prompts, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    rows = [{"prompt_ids": p, "output_ids": o} for p, o in zip(prompts, outputs)]
    folder = tmp_path_factory.mktemp("features")
    target = engine.decoder.target
    index = extract_features(target, rows, folder, max_len=64)
    assert len(index["sequences"]) == 40
    assert index["feature_dim"] == 3 * target.cfg.hidden_size
    return target, FeatureStore(folder)


CFG = TrainConfig(draft_vocab_size=16, ttt_steps=2, epochs=4, lr=1e-2, warmup_steps=4, batch_tokens=256, max_len=64,
                  val_fraction=0.25, seed=0)


def acceptance_length(target, head, k: int = 2) -> float:
    """Mean acceptance length of ``head`` drafting for ``target`` in the engine, greedy, 8 fresh prompts."""
    from spectune.backends.local.engine.loop import Engine, EngineConfig
    from spectune.backends.local.engine.speculative import SpeculativeDecoder
    from helpers.tiny_models import TinyTokenizer

    head = head.float().eval().requires_grad_(False)
    head.prepare(256)
    engine = Engine(SpeculativeDecoder(target, head, 8, 256, torch.Generator().manual_seed(0)), TinyTokenizer(16, 0),
                    EngineConfig(num_steps=k, max_num_seqs=8, max_len=256))
    rng = random.Random(99)
    prompts = [[rng.randrange(1, 16) for _ in range(5)] for _ in range(8)]
    engine.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    return engine.stats.spec.acceptance_length


def test_stored_features_are_the_targets(store) -> None:
    target, fs = store
    toks, feats, prompt_len = fs[3]
    from spectune.backends.local.model.attention import AttnMeta
    from spectune.backends.local.model.kv_cache import KVCache

    c = target.cfg
    cache = KVCache(c.num_layers, 1, 64, c.num_kv_heads, c.head_dim, torch.float32)
    with torch.inference_mode():
        _, aux = target(toks.view(1, -1), AttnMeta.for_prefill(cache, target.rope, 0, len(toks)))
    torch.testing.assert_close(feats.float(), aux[0].to(torch.bfloat16).float())
    assert 2 <= prompt_len < len(toks)


def test_training_learns_the_targets_next_tokens(store, tmp_path: Path) -> None:
    target, fs = store
    logs: list[dict] = []
    train(target, fs, CFG, tmp_path / "ckpt.pt", logs.append)
    val = [r["val_acc"] for r in logs if "val_acc" in r]
    assert len(val) == CFG.epochs
    # the first draft step agrees with the target on held-out sequences far above chance (1/16), and improves
    assert val[-1][0] > 0.8
    assert val[-1][0] > val[0][0] + 0.1
    losses = [r["loss"] for r in logs if "loss" in r]
    assert sum(losses[-3:]) < sum(losses[:3])


def test_trained_head_drafts_what_the_engine_accepts(store, tmp_path: Path) -> None:
    """Training's token/feature/label alignment is the engine's: the trained head's drafts get accepted."""
    from spectune.draft.train import draft_vocab, new_head

    target, fs = store
    head = train(target, fs, CFG, tmp_path / "ckpt.pt")
    untrained = new_head(target, draft_vocab(fs, 16, 16), target.capture_layers, 0)
    trained_al, untrained_al = acceptance_length(target, head), acceptance_length(target, untrained)
    assert trained_al > 2.5 and trained_al > untrained_al + 1.0, (trained_al, untrained_al)


def test_resume_after_an_interruption_gives_the_same_head(store, tmp_path: Path) -> None:
    target, fs = store
    straight = train(target, fs, CFG, tmp_path / "a.pt").state_dict()

    def stop_after_epoch_two(record: dict) -> None:
        if record.get("epoch") == 1 and "val_acc" in record:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(target, fs, CFG, tmp_path / "b.pt", stop_after_epoch_two)
    epochs_run: list[int] = []
    resumed = train(target, fs, CFG, tmp_path / "b.pt",
                    lambda r: epochs_run.append(r["epoch"]) if "val_acc" in r else None).state_dict()
    assert epochs_run == [2, 3]  # epochs 0 and 1 came from the checkpoint
    for name, tensor in straight.items():
        torch.testing.assert_close(resumed[name], tensor, msg=name)


def test_heldout_sharegpt_leaves_out_training_ids_and_texts(tmp_path: Path, monkeypatch) -> None:
    records = [user_prompt(f"id{i}", "sharegpt", f"question number {i % 30}") for i in range(60)]
    monkeypatch.setattr("spectune.loadgen.datasets.read_sharegpt", lambda path, limit: records)
    (tmp_path / data.TRAINING_IDS_FILE).write_text("".join(f"id{i}\n" for i in range(10)))
    picked = data.heldout_sharegpt(tmp_path, 100, seed=0)
    # ids 0-9 were trained on; ids 30-39 repeat their texts, so they are out too
    assert sorted(int(p.id[2:]) for p in picked) == [i for i in range(10, 60) if not 30 <= i < 40]
    assert data.heldout_sharegpt(tmp_path, 5, seed=1) == data.heldout_sharegpt(tmp_path, 5, seed=1)
    with pytest.raises(Exception, match="training-prompt-ids.txt is missing"):
        data.heldout_sharegpt(tmp_path / "nowhere", 5, seed=0)
