"""Tiny random Llama targets and EAGLE heads for fast engine tests (no files, no tokenizer)."""

from __future__ import annotations

import torch

from spectune.backends.local.model.config import ModelConfig
from spectune.backends.local.model.eagle import DraftConfig, DraftHead
from spectune.backends.local.model.target import TargetModel


def tiny_target(vocab: int = 16, hidden: int = 32, layers: int = 2, seed: int = 0, scale: float = 1.0,
                dtype: torch.dtype = torch.float32) -> TargetModel:
    """A random 2-layer GQA Llama (4 heads, 2 KV heads) whose logits are scaled by ``scale``."""
    cfg = ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=hidden // 4, max_position_embeddings=256)
    torch.manual_seed(seed)
    model = TargetModel(cfg, capture_layers=(0, layers - 1, layers - 1))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
        model.lm_head.weight.mul_(scale)
    model = model.to(dtype).eval().requires_grad_(False)
    model.build_rope(256)
    return model


def tiny_head(target: TargetModel, kind: str = "eagle3", draft_vocab: int | None = None, seed: int = 1) -> DraftHead:
    """A random EAGLE head for ``target`` (EAGLE-3 with an optional reduced vocabulary, or EAGLE-1)."""
    c = target.cfg
    dv = draft_vocab or c.vocab_size
    cfg = DraftConfig(kind=kind, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                      num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, vocab_size=c.vocab_size,
                      draft_vocab_size=dv if kind == "eagle3" else c.vocab_size, target_hidden_size=c.hidden_size,
                      aux_layers=target.capture_layers if kind == "eagle3" else ())
    torch.manual_seed(seed)
    head = DraftHead(cfg, target.embed_tokens, target.lm_head)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
        if kind == "eagle3":
            ids = torch.randperm(c.vocab_size)[:dv].sort().values
            head.d2t.copy_(ids - torch.arange(dv))
    head = head.to(target.embed_tokens.weight.dtype).eval().requires_grad_(False)
    if kind != "eagle3":
        target.capture_layers = ()
    head.prepare(256)
    return head


class TinyTokenizer:
    """A word-level tokenizer over ``t0 .. t{vocab-1}`` with the interface the engine uses (EOS = ``eos``)."""

    def __init__(self, vocab: int = 16, eos: int = 0) -> None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        self.backend = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
        self.backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        self.backend.decoder = decoders.WordPiece(prefix="##")
        self.eos_token_ids = [eos]

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text).ids

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.encode(" ".join(m["content"] for m in messages))

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids)


def tiny_engine(num_steps: int = 2, policy=None, slots: int = 4, graphs: bool = False, kind: str = "eagle3",
                eos: int = 0, lazy: bool | None = None, device: str = "cpu"):
    """An Engine over a tiny target + head (float32); ``graphs`` pads through CapturedGraphs (eager on CPU, captured
    CUDA graphs on ``device="cuda"``); ``lazy`` (default: with a policy, as the server builds it) turns on lazy
    drafting."""
    from spectune.backends.local.engine.cuda_graphs import CapturedGraphs
    from spectune.backends.local.engine.loop import Engine, EngineConfig
    from spectune.backends.local.engine.speculative import SpeculativeDecoder

    target = tiny_target(vocab=16, layers=3)
    head = tiny_head(target, kind=kind)
    if device != "cpu":
        target, head = target.to(device), head.to(device)
        target.build_rope(256)
        head.prepare(256)
    decoder = SpeculativeDecoder(target, head, slots, 256, torch.Generator(device=device).manual_seed(0),
                                 CapturedGraphs(slots, 256, capture=device != "cpu") if graphs else None,
                                 lazy_draft=policy is not None if lazy is None else lazy)
    cfg = EngineConfig(num_steps=num_steps, max_num_seqs=slots, max_len=256, policy=policy, steps_capacity=5)
    return Engine(decoder, TinyTokenizer(16, eos), cfg)
