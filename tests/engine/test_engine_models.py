"""Target model families load from Hugging Face folders and match transformers' logits (fp32): Llama with llama3
RoPE scaling and GQA, Qwen2 with q/k/v biases, tied embeddings, sharded safetensors; and GGUF conversion is cached."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spectune.backends.local.model.attention import AttnMeta
from spectune.backends.local.model.kv_cache import KVCache
from spectune.backends.local.weights.loader import load_target
from spectune.core.errors import UserError


def _hf_model(kind: str, tied: bool):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=8,
                  num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=tied, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    if kind == "llama3":
        cfg = LlamaConfig(**common, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                          rope_theta=500000.0)
        return LlamaForCausalLM(cfg)
    return Qwen2ForCausalLM(Qwen2Config(**common, rope_theta=10000.0))


def _ours_vs_hf(folder: Path, hf) -> float:
    target, _ = load_target(folder, torch.float32, "cpu")
    target.build_rope(256)
    ids = torch.randint(0, 96, (1, 40), generator=torch.Generator().manual_seed(1))
    c = target.cfg
    cache = KVCache(c.num_layers, 2, 256, c.num_kv_heads, c.head_dim, torch.float32)
    with torch.inference_mode():
        ref = hf(ids).logits[0]
        hidden, _ = target(ids[:, :30], AttnMeta.for_prefill(cache, target.rope, 0, 30))
        prefill = target.logits(hidden)[0]
        # the remaining 10 tokens as one batched verify-shaped forward over the cache
        pos = torch.arange(30, 40).view(1, 10)
        hidden, _ = target(ids[:, 30:], AttnMeta.for_batch(cache, target.rope, pos, c.num_heads // c.num_kv_heads))
        rest = target.logits(hidden)[0]
    return float((torch.cat([prefill, rest]) - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("kind, tied", [("llama3", False), ("llama3", True), ("qwen2", False)])
def test_hf_folder_matches_transformers(tmp_path: Path, kind: str, tied: bool) -> None:
    hf = _hf_model(kind, tied).eval()
    hf.save_pretrained(tmp_path, max_shard_size="100KB")  # several shards + model.safetensors.index.json
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert _ours_vs_hf(tmp_path, hf) < 1e-5


def test_qwen2_biases_are_loaded(tmp_path: Path) -> None:
    hf = _hf_model("qwen2", False).eval()
    hf.save_pretrained(tmp_path)
    target, _ = load_target(tmp_path, torch.float32, "cpu")
    q_bias = hf.model.layers[0].self_attn.q_proj.bias
    assert target.cfg.attention_bias
    assert torch.equal(target.layers[0].qkv.bias[: q_bias.numel()], q_bias)


def test_missing_tensor_and_bad_paths_are_user_errors(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    hf = _hf_model("llama3", False)
    hf.save_pretrained(tmp_path / "m")
    tensors = load_file(str(tmp_path / "m" / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(tmp_path / "m" / "model.safetensors"))
    with pytest.raises(UserError, match="layers.1.mlp.up_proj.weight"):
        load_target(tmp_path / "m", torch.float32, "cpu")
    with pytest.raises(UserError, match="does not exist"):
        load_target(tmp_path / "nothing-here", torch.float32, "cpu")


def test_gguf_conversion_is_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    from spectune.backends.local.weights.loader import convert_gguf, default_model_path

    folder = convert_gguf(default_model_path())  # converts once per machine (the shared cache)

    def must_not_run(*args, **kwargs):
        raise AssertionError("the GGUF file was converted again")

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", must_not_run)
    assert convert_gguf(default_model_path()) == folder  # second start: read from the cache
    assert (folder / "model.safetensors").is_file()
    assert (folder / "tokenizer_config.json").is_file()
