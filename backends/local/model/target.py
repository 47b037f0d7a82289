"""The target model: a Llama-family decoder (Llama 2/3.x, Qwen2/2.5, Mistral, SmolLM2) written for the engine.

Fused projections (q|k|v in one matrix, gate|up in one) keep the number of kernel launches per layer small, which
matters on CPU where eager per-op overhead is a few microseconds. Weights use Hugging Face names after fusion
(``layers.{i}.qkv.weight`` ...); :mod:`spectune.backends.local.weights.loader` converts checkpoints into this layout.

Besides logits the forward returns the features an EAGLE head needs: the final hidden state after the last norm
(EAGLE-1/2, Li et al. 2024) and, for EAGLE-3 (Li et al. 2025), the outputs of selected layers concatenated.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from spectune.backends.local.model.attention import AttnMeta, attend, attend_batched
from spectune.backends.local.model.config import ModelConfig
from spectune.backends.local.model.rope import apply_rope, rope_table


class DecoderLayer(nn.Module):
    """Pre-norm attention + SwiGLU MLP block."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, hd
        self.eps = cfg.rms_norm_eps
        self.input_layernorm = nn.Parameter(torch.ones(h))
        self.qkv = nn.Linear(h, (cfg.num_heads + 2 * cfg.num_kv_heads) * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.num_heads * hd, h, bias=False)
        self.post_attention_layernorm = nn.Parameter(torch.ones(h))
        self.gate_up = nn.Linear(h, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.attention_kernel = False  # batched attention through spectune::decode_attention (build_engine sets it)

    def forward(self, x: torch.Tensor, meta: AttnMeta, index: int) -> torch.Tensor:
        """x [B, s, hidden] -> [B, s, hidden], any forward shape (:class:`TargetModel` runs batched forwards through
        :func:`decoder_steps`, which does the same math)."""
        q, k, v = self.qkv_rope(x, meta.cos_sin)
        return self.output(x, attend(meta, index, q, k, v, self.attention_kernel))

    def qkv_rope(self, x: torch.Tensor, cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, s, hidden] -> q [B, s, heads, hd], k and v [B, s, kv_heads, hd]: input norm, the fused q|k|v
        projection, RoPE on q and k with ``cos_sin`` [B or 1, s, 2, hd] (:func:`split_qkv_rope`)."""
        y = F.rms_norm(x, (x.shape[-1],), self.input_layernorm, self.eps)
        return split_qkv_rope(self.qkv(y), self.num_heads, self.num_kv_heads, self.head_dim, cos_sin)

    def output(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """x [B, s, hidden] + o_proj(attn [B, s, heads * hd]), then the SwiGLU MLP block -> [B, s, hidden]
        (:func:`output_block`)."""
        return output_block(self, x, attn, self.eps)


def split_qkv_rope(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, cos_sin: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fused projection's output qkv [B, s, (heads + 2 kv_heads) * hd] -> q [B, s, heads, hd], k and v [B, s,
    kv_heads, hd], RoPE applied to q and k with ``cos_sin`` [B or 1, s, 2, hd]. Shared by the target's
    :class:`DecoderLayer` and the draft head's layers (:mod:`spectune.backends.local.model.eagle`)."""
    b, s, _ = qkv.shape
    n_qk = (num_heads + num_kv_heads) * head_dim
    qk = apply_rope(qkv[..., :n_qk].view(b, s, -1, head_dim), cos_sin)
    return qk[:, :, :num_heads], qk[:, :, num_heads:], qkv[..., n_qk:].view(b, s, num_kv_heads, head_dim)


def output_block(layer: nn.Module, x: torch.Tensor, attn: torch.Tensor, eps: float) -> torch.Tensor:
    """The second half of a Llama layer: x [B, s, H] + ``layer.o_proj``(attn [B, s, heads * hd]), then the RMS-normed
    (``layer.post_attention_layernorm``, ``eps``) SwiGLU MLP (``layer.gate_up``, ``layer.down_proj``) with its
    residual -> [B, s, H]. Shared by :class:`DecoderLayer` and the draft head's layers."""
    x = x + layer.o_proj(attn)
    y = F.rms_norm(x, (x.shape[-1],), layer.post_attention_layernorm, eps)
    gate, up = layer.gate_up(y).chunk(2, dim=-1)
    return x + layer.down_proj(F.silu(gate) * up)


def decoder_steps(layers: tuple[DecoderLayer, ...], x: torch.Tensor, k_caches: tuple[torch.Tensor, ...],
                  v_caches: tuple[torch.Tensor, ...], cos_sin: torch.Tensor, index: tuple[torch.Tensor, ...],
                  mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Consecutive layers of a batched forward (decode, verify, draft extend) as a function of modules and tensors
    only, which is what :mod:`spectune.backends.local.engine.compiled` hands to ``torch.compile``: one compiled graph
    serves every group of that many layers.

    Args:
        layers: the layers to run, in order.
        x: [B, s, hidden], the input of the first.
        k_caches, v_caches: each layer's cache, [slots, Hkv, max_len, hd] (:meth:`KVCache.layer`).
        cos_sin, index, mask: as :func:`~spectune.backends.local.model.attention.attend_batched`.

    Returns:
        every layer's output, [B, s, hidden] each (EAGLE-3 reads some of them).
    """
    outs = []
    for layer, k_cache, v_cache in zip(layers, k_caches, v_caches):
        q, k, v = layer.qkv_rope(x, cos_sin)
        x = layer.output(x, attend_batched(q, k, v, k_cache, v_cache, index, mask, layer.attention_kernel))
        outs.append(x)
    return tuple(outs)


class TargetModel(nn.Module):
    """A Llama-family causal LM.

    Args:
        cfg: model shape.
        capture_layers: indices of layers whose outputs form the EAGLE-3 feature (empty for EAGLE-1 heads).
    """

    def __init__(self, cfg: ModelConfig, capture_layers: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.capture_layers = tuple(capture_layers)
        self.rope: torch.Tensor | None = None
        self.step = decoder_steps  # batched forwards' layers (compiled.compile_target may replace it)
        self.layers_per_step = cfg.num_layers  # layers per self.step call

    def build_rope(self, max_positions: int) -> None:
        """Precompute RoPE rows for positions 0..max_positions-1 in the weights' dtype and device."""
        w = self.embed_tokens.weight
        c = self.cfg
        self.rope = rope_table(c.head_dim, c.rope_theta, c.rope_scaling, max_positions, w.dtype).to(w.device)

    def forward(self, tokens: torch.Tensor, meta: AttnMeta) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the decoder.

        Args:
            tokens: [B, s] token ids.
            meta: attention metadata (prefill or batched).

        Returns:
            hidden [B, s, hidden] after the final norm, and the EAGLE-3 feature [B, s, len(capture)*hidden]
            (outputs of ``capture_layers``, concatenated) or None when no layers are captured.
        """
        x = self.embed_tokens(tokens)
        captured: dict[int, torch.Tensor] = {}
        if meta.segments is None:
            n, layers = self.layers_per_step, tuple(self.layers)
            for start in range(0, len(layers), n):
                ids = range(start, min(start + n, len(layers)))
                outs = self.step(layers[start:start + n], x, tuple(meta.cache.k_layers[i] for i in ids),
                                 tuple(meta.cache.v_layers[i] for i in ids), meta.cos_sin, meta.write_index, meta.mask)
                captured.update((i, out) for i, out in zip(ids, outs) if i in self.capture_layers)
                x = outs[-1]
        else:
            for i, layer in enumerate(self.layers):
                x = layer(x, meta, i)
                if i in self.capture_layers:
                    captured[i] = x
        hidden = F.rms_norm(x, (x.shape[-1],), self.norm, self.cfg.rms_norm_eps)
        aux = torch.cat([captured[i] for i in self.capture_layers], dim=-1) if captured else None
        return hidden, aux

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., hidden] -> float32 logits [..., vocab]."""
        return self.lm_head(hidden).float()
