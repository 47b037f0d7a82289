"""One reading of a draft head's config for every backend (backends/head_config.py): the flattened
hyperparameters, the EAGLE version, and Llama-3 RoPE factors checked against transformers' own llama3 RoPE."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectune.backends.head_config import flat_head_config, head_eagle_version, llama3_rope_factors

SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 64}


def _transformers_llama3(head_dim: int, theta: float, scaling: dict) -> np.ndarray:
    """transformers' scaled inverse frequencies (``ROPE_INIT_FUNCTIONS['llama3']``) for a Llama config."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, rope_theta=theta,
                      rope_scaling=dict(scaling), max_position_embeddings=256)
    inv, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    return inv.double().numpy()


@pytest.mark.parametrize("head_dim, theta", [(64, 500000.0), (16, 10000.0)])
def test_llama3_factors_give_transformers_frequencies(head_dim, theta):
    expected = _transformers_llama3(head_dim, theta, SCALING)
    base32 = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factors32 = llama3_rope_factors(base32, SCALING)
    assert factors32.dtype == np.float32
    np.testing.assert_allclose(base32 / factors32, expected, rtol=1e-6)
    base64 = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    factors64 = llama3_rope_factors(base64, SCALING)
    assert factors64.dtype == torch.float64
    np.testing.assert_allclose((base64 / factors64).numpy(), expected, rtol=1e-6)


def test_llama3_factors_span_the_three_bands():
    theta, head_dim = 500000.0, 64
    base = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factors = llama3_rope_factors(base, SCALING)
    assert factors[0] == 1  # shortest wavelength: kept
    assert factors[-1] == SCALING["factor"]  # longest: divided by factor
    assert ((factors > 1) & (factors < SCALING["factor"])).any()  # the smooth band between


def test_nested_layer_config_and_eagle_config_override_the_top_level():
    raw = {"hidden_size": 1, "architectures": ["Eagle3Speculator"], "transformer_layer_config": {"hidden_size": 64},
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}
    flat = flat_head_config(raw)
    assert flat["hidden_size"] == 64
    assert flat["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert raw["hidden_size"] == 1  # not modified


@pytest.mark.parametrize("config, version", [
    ({"architectures": ["LlamaForCausalLMEagle3"]}, "eagle3"),
    ({"architectures": ["Eagle3LlamaForCausalLM"]}, "eagle3"),
    ({"architectures": ["LlamaForCausalLM"], "draft_vocab_size": 32000}, "eagle3"),
    ({"architectures": ["Eagle3Speculator"], "transformer_layer_config": {"hidden_size": 64}}, "eagle3"),
    ({"transformer_layer_config": {"draft_vocab_size": 32000}}, "eagle3"),
    ({"architectures": ["LlamaForCausalLMEagle"]}, "eagle"),
    ({"architectures": ["LlamaForCausalLM"]}, "eagle"),
])
def test_eagle_version_from_config(config, version):
    assert head_eagle_version(config) == version


def test_eagle_version_from_the_tensors_of_a_config_without_markers():
    q3 = torch.empty(32, 2 * 16)
    q1 = torch.empty(32, 16)
    assert head_eagle_version({}, {"layers.0.self_attn.q_proj.weight": q3}, 16) == "eagle3"
    assert head_eagle_version({}, {"layers.0.self_attn.q_proj.weight": q1, "d2t": torch.zeros(4)}, 16) == "eagle3"
    assert head_eagle_version({"hidden_size": 16}, {"layers.0.self_attn.q_proj.weight": q1}) == "eagle"
