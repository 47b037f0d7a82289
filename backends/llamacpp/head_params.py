"""The head's model metadata as the converter writes it (``conversion/base.py`` ``TextModel.set_gguf_parameters``,
``conversion/llama.py`` ``LlamaModel.set_gguf_parameters``): block count, sizes, attention heads, RoPE (base,
scaling keys and the llama3 ``rope_freqs`` factors), norm epsilon, file type and vocabulary size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spectune.backends.head_config import llama3_rope_factors
from spectune.backends.llamacpp.eagle3_names import FILE_TYPE_BF16
from spectune.backends.llamacpp.head_checkpoint import HeadInfo, find_hparam
from spectune.core.json_types import JsonObject

if TYPE_CHECKING:
    import numpy as np
    from gguf import GGUFWriter


def _rope_params(hp: JsonObject) -> JsonObject:
    """``TextModel.__init__``'s ``rope_parameters`` (rope_parameters or rope_scaling, theta and type mirrored)."""
    params = dict(hp.get("rope_parameters", hp.get("rope_scaling")) or {})
    if "full_attention" not in params and "sliding_attention" not in params:
        theta = find_hparam(hp, ("global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta",
                           "rotary_emb_base"))
        if "rope_theta" not in params and theta is not None:
            params["rope_theta"] = theta
        if "rope_type" not in params and params.get("type") is not None:
            params["rope_type"] = params["type"]
        omp = find_hparam(hp, ("original_max_position_embeddings",))
        if "original_max_position_embeddings" not in params and omp is not None:
            params["original_max_position_embeddings"] = omp
    return params.get("full_attention", params)


def llama3_rope_freqs(hp: JsonObject) -> np.ndarray | None:
    """``rope_freqs.weight`` (float32 [head_dim / 2]) for llama3 rope scaling (``conversion/llama.py``
    ``generate_extra_tensors``; :func:`spectune.backends.head_config.llama3_rope_factors`), else None."""
    import numpy as np

    rp = _rope_params(hp)
    if not rp or str(rp.get("rope_type", "")).lower() != "llama3":
        return None
    base = rp.get("rope_theta", 10000.0)
    dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    return llama3_rope_factors(freqs, rp)


def write_model_params(w: GGUFWriter, head: HeadInfo) -> None:
    """``TextModel.set_gguf_parameters`` + ``LlamaModel.set_gguf_parameters`` for a dense Llama-style head."""
    from gguf import RopeScalingType

    hp = head.hparams
    w.add_block_count(int(find_hparam(hp, ("n_layers", "num_hidden_layers", "n_layer", "num_layers"))))
    for key, add in ((("max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length",
                       "model_max_length"), w.add_context_length),
                     (("hidden_size", "n_embd", "dim"), w.add_embedding_length),
                     (("prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size", "n_inner",
                       "hidden_dim"), w.add_feed_forward_length),
                     (("num_attention_heads", "n_head", "n_heads"), w.add_head_count),
                     (("num_key_value_heads", "n_kv_heads"), w.add_head_count_kv)):
        if (val := find_hparam(hp, key)) is not None:
            add(val)
    if hp.get("is_causal") is False:
        w.add_causal_attention(False)
    rp = _rope_params(hp)
    if (rope_type := rp.get("rope_type")) is not None:
        factor = rp.get("factor")
        if rope_type == "linear" and factor is not None:
            w.add_rope_scaling_type(RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(factor)
        elif rope_type == "yarn" and factor is not None:
            w.add_rope_scaling_type(RopeScalingType.YARN)
            w.add_rope_scaling_factor(factor)
            w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
            for k, add in (("extrapolation_factor", w.add_rope_scaling_yarn_ext_factor),
                           ("attention_factor", w.add_rope_scaling_yarn_attn_factor),
                           ("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                           ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
                val = rp.get(k, rp.get("attn_factor")) if k == "attention_factor" else rp.get(k)
                if val is not None:
                    add(val)
        elif rope_type in ("su", "longrope"):
            w.add_rope_scaling_type(RopeScalingType.LONGROPE)
    if (theta := rp.get("rope_theta")) is not None:
        w.add_rope_freq_base(theta)
    if (eps := find_hparam(hp, ("rms_norm_eps", "norm_eps"))) is not None:
        w.add_layer_norm_rms_eps(eps)
    if (eps := find_hparam(hp, ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"))) is not None:
        w.add_layer_norm_eps(eps)
    if (head_dim := hp.get("head_dim")) is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_file_type(FILE_TYPE_BF16)
    w.add_vocab_size(hp["vocab_size"])
    rope_dim = hp.get("head_dim")
    if rope_dim is None:
        rope_dim = hp["hidden_size"] // hp["num_attention_heads"]
    w.add_rope_dimension_count(rope_dim)
