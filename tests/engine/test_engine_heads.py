"""EAGLE-1 and EAGLE-3 loaders on synthetic checkpoints with the published key names and shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from spectune.backends.local.model.attention import AttnMeta
from spectune.backends.local.weights.heads import load_head, save_head
from spectune.backends.local.model.kv_cache import KVCache
from spectune.core.errors import UserError
from helpers.tiny_models import tiny_head, tiny_target

H, I, NH, NKV, HD, V = 32, 64, 4, 2, 8, 16  # tiny_target's shape


def _layer(prefix: str, in_dim: int, eagle3: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(len(prefix))
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    t = {
        f"{prefix}self_attn.q_proj.weight": r(NH * HD, in_dim),
        f"{prefix}self_attn.k_proj.weight": r(NKV * HD, in_dim),
        f"{prefix}self_attn.v_proj.weight": r(NKV * HD, in_dim),
        f"{prefix}self_attn.o_proj.weight": r(H, NH * HD),
        f"{prefix}mlp.gate_proj.weight": r(I, H),
        f"{prefix}mlp.up_proj.weight": r(I, H),
        f"{prefix}mlp.down_proj.weight": r(H, I),
        f"{prefix}post_attention_layernorm.weight": r(H),
    }
    if eagle3:
        t[f"{prefix}input_layernorm.weight"] = r(H)
        t[f"{prefix}hidden_norm.weight"] = r(H)
    return t


def _write(folder: Path, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


LLAMA_FIELDS = {"hidden_size": H, "intermediate_size": I, "num_attention_heads": NH, "num_key_value_heads": NKV,
                "rms_norm_eps": 1e-6, "vocab_size": V, "num_hidden_layers": 1}


def eagle3_repo_checkpoint(folder: Path) -> dict[str, torch.Tensor]:
    t = _layer("midlayer.", 2 * H, eagle3=True)
    t.update({"fc.weight": torch.randn(H, 3 * H), "norm.weight": torch.randn(H), "lm_head.weight": torch.randn(8, H),
              "d2t": torch.tensor([0, 1, 1, 2, 3, 5, 6, 8]), "t2d": torch.zeros(V, dtype=torch.bool)})
    _write(folder, t, {**LLAMA_FIELDS, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 8,
                       "rope_theta": 50000.0})
    return t


def test_eagle3_repo_layout_loads_with_fused_weights(tmp_path: Path) -> None:
    target = tiny_target(layers=8)
    t = eagle3_repo_checkpoint(tmp_path / "e3")
    head = load_head(tmp_path / "e3", target, torch.float32, "cpu")
    assert head.cfg.kind == "eagle3"
    assert head.cfg.draft_vocab_size == 8
    assert head.cfg.rope_theta == 50000.0
    assert head.cfg.aux_layers == (1, 3, 4)  # SGLang's default for L=8: outputs of layers 1, L//2-1, L-4
    qkv = head.layers[0].qkv.weight
    assert torch.equal(qkv[: NH * HD], t["midlayer.self_attn.q_proj.weight"])
    assert torch.equal(qkv[NH * HD : (NH + NKV) * HD], t["midlayer.self_attn.k_proj.weight"])
    assert torch.equal(head.layers[0].gate_up.weight[I:], t["midlayer.mlp.up_proj.weight"])
    assert torch.equal(head.layers[0].hidden_norm, t["midlayer.hidden_norm.weight"])
    assert head.draft_to_target is None  # set by prepare()
    head.prepare(64)
    assert head.draft_to_target.tolist() == [0, 2, 3, 5, 7, 10, 12, 15]  # draft id + d2t


def test_speculators_layout_reads_nested_config_and_aux_ids(tmp_path: Path) -> None:
    target = tiny_target(layers=3)
    t = _layer("layers.0.", 2 * H, eagle3=True)
    t.update({"fc.weight": torch.randn(H, 3 * H), "norm.weight": torch.randn(H), "lm_head.weight": torch.randn(V, H),
              "d2t": torch.zeros(V, dtype=torch.long)})
    _write(tmp_path / "spec", t, {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
                                  "transformer_layer_config": LLAMA_FIELDS, "draft_vocab_size": V,
                                  "target_hidden_size": H, "eagle_aux_hidden_state_layer_ids": [0, 1, 2]})
    head = load_head(tmp_path / "spec", target, torch.float32, "cpu")
    assert head.cfg.kind == "eagle3"
    assert head.cfg.aux_layers == (0, 1, 2)
    assert torch.equal(head.fc.weight, t["fc.weight"])


def test_eagle1_layout_with_fc_bias_and_shared_lm_head_runs(tmp_path: Path) -> None:
    target = tiny_target(layers=2)
    t = _layer("layers.0.", H, eagle3=False)
    t.update({"fc.weight": torch.randn(H, 2 * H), "fc.bias": torch.randn(H), "embed_tokens.weight": torch.randn(V, H)})
    _write(tmp_path / "e1", t, {**LLAMA_FIELDS, "architectures": ["LlamaForCausalLM"]})
    head = load_head(tmp_path / "e1", target, torch.float32, "cpu")
    assert head.cfg.kind == "eagle1"
    assert head.cfg.fc_bias
    assert head.cfg.aux_layers == ()
    assert torch.equal(head.fc.bias, t["fc.bias"])
    head.prepare(64)
    cache = KVCache(1, 1, 64, NKV, HD, torch.float32)
    out = head(torch.tensor([[1, 2, 3]]), torch.randn(1, 3, H), AttnMeta.for_prefill(cache, head.rope, 0, 3))
    assert out.shape == (1, 3, H)
    assert head.draft_tokens(out[0, -1]).item() == int(target.logits(out[0, -1]).argmax())  # target lm_head


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    target = tiny_target(layers=3)
    t = eagle3_repo_checkpoint(tmp_path / "full")
    del t["midlayer.mlp.down_proj.weight"]
    _write(tmp_path / "broken", t, json.loads((tmp_path / "full" / "config.json").read_text()))
    with pytest.raises(UserError, match="layers.0.down_proj.weight|mlp.down_proj"):
        load_head(tmp_path / "broken", target, torch.float32, "cpu")


def test_misshaped_tensor_is_named_with_both_shapes(tmp_path: Path) -> None:
    target = tiny_target(layers=3)
    t = eagle3_repo_checkpoint(tmp_path / "full")
    t["midlayer.self_attn.o_proj.weight"] = torch.randn(H, H + 4)
    _write(tmp_path / "broken", t, json.loads((tmp_path / "full" / "config.json").read_text()))
    with pytest.raises(UserError, match=r"o_proj.weight.*\(32, 36\).*\(32, 32\)"):
        load_head(tmp_path / "broken", target, torch.float32, "cpu")


def test_save_then_load_round_trips_outputs(tmp_path: Path) -> None:
    target = tiny_target(layers=3)
    head = tiny_head(target, draft_vocab=12)
    save_head(head, tmp_path / "saved")
    keys = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert keys["draft_vocab_size"] == 12
    assert keys["architectures"] == ["LlamaForCausalLMEagle3"]
    loaded = load_head(tmp_path / "saved", target, torch.float32, "cpu")
    loaded.prepare(256)
    feats, toks = torch.randn(1, 4, 3 * H), torch.tensor([[3, 1, 4, 1]])
    outs = []
    for h in (head, loaded):
        cache = KVCache(1, 1, 64, NKV, HD, torch.float32)
        outs.append(h(toks, feats, AttnMeta.for_prefill(cache, h.rope, 0, 4)))
    assert torch.allclose(outs[0], outs[1], atol=1e-6)
    assert torch.equal(head.draft_to_target, loaded.draft_to_target)
