"""EAGLE draft heads (chain drafting, topk 1): EAGLE-1/2 (Li et al., 2024) and EAGLE-3 (Li et al., 2025).

Both predict the next token from (embedding of the current token, a feature of the previous position):

- EAGLE-1/2: ``x = fc(cat(embed(token), feature))`` [2H -> H], one Llama decoder layer without input_layernorm,
  no final norm; logits from the *target's* lm_head. The feature is the target's last hidden state after its final
  norm, and for later draft steps the head's own output.
- EAGLE-3: the first feature is ``fc(cat(low, mid, high))`` [3H_target -> H] over three captured target layers;
  the decoder layer's q/k/v read ``cat(input_layernorm(embed), hidden_norm(feature))`` [2H]; the head has its own
  final ``norm`` and ``lm_head`` over a reduced draft vocabulary, mapped back with ``d2t`` (target_id = draft_id +
  d2t[draft_id]); the pre-norm output feeds the next draft step. Layer layouts follow vLLM's
  ``llama_eagle3.py``/``llama_eagle.py`` and SGLang's ``llama_eagle3.py``.

Captured target layers: ``eagle_aux_hidden_state_layer_ids`` are read as *outputs of* those layers (SGLang's
convention; vLLM reads the same ids one layer earlier). Without ids the default is the outputs of layers
1, L//2 - 1 and L - 4, where both engines agree (their inputs 2, L//2, L-3).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from spectune.backends.local.model.attention import AttnMeta, attend
from spectune.backends.local.model.target import output_block, split_qkv_rope
from spectune.backends.local.model.rope import rope_table

CONFIDENCE_TOP_K = 10
"""Candidates the draft confidence is normalised over: llama.cpp's draft top-k (:meth:`DraftHead.draft_with_prob`)."""


@dataclass
class DraftConfig:
    """Shape of a draft head.

    Attributes:
        kind: ``eagle1`` or ``eagle3``.
        hidden_size, intermediate_size, num_heads, num_kv_heads, head_dim, num_layers: decoder shape.
        vocab_size: target vocabulary size.
        draft_vocab_size: rows of the head's own lm_head (EAGLE-3), else == vocab_size.
        target_hidden_size: hidden size of the target (EAGLE-3 fc input is 3x this).
        rms_norm_eps, rope_theta, rope_scaling: numerics (RoPE base defaults to 10000).
        aux_layers: target layers whose outputs form the EAGLE-3 feature (empty for EAGLE-1).
        fc_bias: the fc layer has a bias (some EAGLE-1 checkpoints).
        norm_before_residual: EAGLE-3 variant where the residual is taken after hidden_norm (vLLM option).
    """

    kind: str
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    num_layers: int = 1
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    aux_layers: tuple[int, ...] = ()
    fc_bias: bool = False
    norm_before_residual: bool = False


class DraftLayer(nn.Module):
    """One decoder layer of a draft head; layer 0 of an EAGLE-3 head reads 2H inputs."""

    def __init__(self, cfg: DraftConfig, first: bool) -> None:
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.eagle3_first = cfg.kind == "eagle3" and first
        self.has_input_norm = cfg.kind == "eagle3"
        self.cfg = cfg
        in_dim = 2 * h if self.eagle3_first else h
        if self.has_input_norm:
            self.input_layernorm = nn.Parameter(torch.ones(h))
        if self.eagle3_first:
            self.hidden_norm = nn.Parameter(torch.ones(h))
        self.qkv = nn.Linear(in_dim, (cfg.num_heads + 2 * cfg.num_kv_heads) * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * hd, h, bias=False)
        self.post_attention_layernorm = nn.Parameter(torch.ones(h))
        self.gate_up = nn.Linear(h, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.attention_kernel = False  # batched attention through spectune::decode_attention (build_engine sets it)

    def forward(self, x: torch.Tensor, emb: torch.Tensor, meta: AttnMeta, index: int) -> torch.Tensor:
        """x, emb [B, s, H] -> [B, s, H] (the pre-norm residual stream): :meth:`inputs`, :meth:`qkv_rope`, paged
        attention over the head's KV cache, :meth:`output`."""
        residual, y = self.inputs(x, emb)
        q, k, v = self.qkv_rope(y, meta.cos_sin)
        return self.output(residual, attend(meta, index, q, k, v, self.attention_kernel))

    def inputs(self, x: torch.Tensor, emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's input and its residual: x, emb [B, s, H] -> (residual [B, s, H], y [B, s, 2H or H]).

        EAGLE-3's first layer concatenates the normed token embedding with the normed feature (its residual is the
        normed feature when ``norm_before_residual``, else x); other EAGLE-3 layers norm x; EAGLE-1 has no input
        norm. Public so that the draft trainer (:mod:`spectune.draft.train`) runs the same math.
        """
        h, eps = x.shape[-1], self.cfg.rms_norm_eps
        if self.eagle3_first:
            normed = F.rms_norm(x, (h,), self.hidden_norm, eps)
            residual = normed if self.cfg.norm_before_residual else x
            return residual, torch.cat([F.rms_norm(emb, (h,), self.input_layernorm, eps), normed], dim=-1)
        if self.has_input_norm:
            return x, F.rms_norm(x, (h,), self.input_layernorm, eps)
        return x, x  # EAGLE-1: no input_layernorm

    def qkv_rope(self, y: torch.Tensor, cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """y [B, s, in] -> q [B, s, num_heads, hd], k and v [B, s, num_kv_heads, hd], RoPE applied to q and k with
        ``cos_sin`` [B or 1, s, 2, hd]."""
        c = self.cfg
        return split_qkv_rope(self.qkv(y), c.num_heads, c.num_kv_heads, c.head_dim, cos_sin)

    def output(self, residual: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """residual [B, s, H] + o_proj(attn [B, s, num_heads * hd]), then the MLP block -> [B, s, H]."""
        return output_block(self, residual, attn, self.cfg.rms_norm_eps)


class DraftHead(nn.Module):
    """An EAGLE draft head sharing the target's embedding (and, for EAGLE-1, its lm_head).

    Args:
        cfg: head shape.
        embed: the target's embedding module (used unless the checkpoint carries its own).
        target_lm_head: the target's lm_head (EAGLE-1 logits).
    """

    def __init__(self, cfg: DraftConfig, embed: nn.Module, target_lm_head: nn.Module) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        fc_in = 3 * cfg.target_hidden_size if cfg.kind == "eagle3" else 2 * h
        self.fc = nn.Linear(fc_in, h, bias=cfg.fc_bias)
        self.layers = nn.ModuleList(DraftLayer(cfg, i == 0) for i in range(cfg.num_layers))
        self.own_embed: nn.Embedding | None = None  # set when the checkpoint carries embed_tokens
        self.embed = [embed]  # a list: not registered, so state_dict() holds only the head's own weights
        self.target_lm_head = [target_lm_head]
        if cfg.kind == "eagle3":
            self.norm = nn.Parameter(torch.ones(h))
            self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.rope: torch.Tensor | None = None
        self.draft_to_target: torch.Tensor | None = None

    @property
    def feature_dim(self) -> int:
        """Width of the target feature the head consumes: 3*H_target (EAGLE-3) or H (EAGLE-1)."""
        return 3 * self.cfg.target_hidden_size if self.cfg.kind == "eagle3" else self.cfg.hidden_size

    def prepare(self, max_positions: int) -> None:
        """Build RoPE rows and the draft-id -> target-id table; call after loading weights."""
        c = self.cfg
        dev, dt = self.fc.weight.device, self.fc.weight.dtype
        self.rope = rope_table(c.head_dim, c.rope_theta, c.rope_scaling, max_positions, dt).to(dev)
        if c.kind == "eagle3":
            self.draft_to_target = torch.arange(c.draft_vocab_size, device=dev) + self.d2t

    def forward(self, tokens: torch.Tensor, feature: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        """One draft forward.

        Args:
            tokens: [B, s] token ids (target vocabulary).
            feature: [B, s, feature_dim] target features, or [B, s, H] the head's own previous outputs.
            meta: attention metadata for the head's KV cache.

        Returns:
            [B, s, H] output features (feed the next draft step; :meth:`draft_tokens` turns them into tokens).
        """
        emb = (self.own_embed or self.embed[0])(tokens)
        if self.cfg.kind == "eagle3":
            x = self.fc(feature) if feature.shape[-1] != self.cfg.hidden_size else feature
        else:
            x = self.fc(torch.cat([emb, feature], dim=-1))
        for i, layer in enumerate(self.layers):
            x = layer(x, emb, meta, i)
        return x

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Output features [..., H] -> float32 logits over the draft vocabulary [..., Vd] (target vocab for EAGLE-1)."""
        if self.cfg.kind == "eagle3":
            return self.lm_head(F.rms_norm(out, (out.shape[-1],), self.norm, self.cfg.rms_norm_eps)).float()
        return self.target_lm_head[0](out).float()

    def draft_tokens(self, out: torch.Tensor) -> torch.Tensor:
        """Greedy draft tokens in the target vocabulary: [..., H] -> [...] long."""
        ids = self.logits(out).argmax(dim=-1)
        return self.draft_to_target[ids] if self.draft_to_target is not None else ids

    def draft_with_prob(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy draft tokens and their confidence: [..., H] -> tokens [...] long, prob [...] float32.

        The confidence is what llama.cpp's EAGLE-3 drafter compares with ``--spec-draft-p-min``: the top candidate's
        probability after its draft sampler, a top-k of :data:`CONFIDENCE_TOP_K` = 10 (softmax over the 10 largest
        logits), read in ``common/speculative.cpp`` (``common_speculative_impl_draft_eagle3``: ``sparams.top_k = 10``,
        ``if (cur_p->data[0].p < params.p_min)``) of llama.cpp release 11434. The token is the argmax, as
        :meth:`draft_tokens`.
        """
        top = self.logits(out).topk(CONFIDENCE_TOP_K, dim=-1)  # values, indices [..., 10], descending
        prob = top.values.softmax(dim=-1)[..., 0]  # [...]
        ids = top.indices[..., 0]
        return (self.draft_to_target[ids] if self.draft_to_target is not None else ids), prob
