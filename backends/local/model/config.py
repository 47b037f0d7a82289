"""Model configuration for the bundled engine's Llama-family targets (Llama 2/3.x, Qwen2/2.5, Mistral, SmolLM2).

Read from a Hugging Face ``config.json`` (old ``rope_scaling`` + ``rope_theta`` keys or transformers 5's
``rope_parameters``) or from GGUF metadata (through transformers' GGUF reader, see
:mod:`spectune.backends.local.weights.loader`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass
class ModelConfig:
    """Shape and numerics of a Llama-family decoder.

    Attributes:
        model_type: ``llama``, ``mistral`` or ``qwen2``.
        vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim: sizes (GQA when
            num_kv_heads < num_heads).
        rms_norm_eps: epsilon of every RMSNorm.
        rope_theta: RoPE base.
        rope_scaling: None or a dict with ``rope_type`` (``linear``, ``llama3``) and its parameters.
        max_position_embeddings: the longest context the model supports, tokens.
        tie_word_embeddings: lm_head shares the embedding matrix.
        attention_bias: q/k/v projections have biases (Qwen2).
        bos_token_id: id of the BOS token, or None.
        eos_token_ids: ids that end generation.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: JsonObject | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_hf(cls, d: JsonObject) -> "ModelConfig":
        """Build from a Hugging Face config dict.

        Raises:
            UserError: unsupported ``model_type`` or a missing size field.
        """
        model_type = d.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UserError(
                f"unsupported model_type {model_type!r}: the bundled engine runs {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        try:
            hidden = int(d["hidden_size"])
            heads = int(d["num_attention_heads"])
            cfg = cls(
                model_type=model_type,
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_layers=int(d["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
            )
        except KeyError as err:
            raise UserError(f"model config.json lacks {err.args[0]!r}: is this a Llama-family model?") from None
        rope = d.get("rope_parameters") or {}
        cfg.rms_norm_eps = float(d.get("rms_norm_eps", 1e-5))
        cfg.rope_theta = float(d.get("rope_theta", rope.get("rope_theta", 10000.0)))
        scaling = d.get("rope_scaling") or rope
        rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        cfg.rope_scaling = None if rope_type in (None, "default") else {**scaling, "rope_type": rope_type}
        cfg.max_position_embeddings = int(d.get("max_position_embeddings", 4096))
        cfg.tie_word_embeddings = bool(d.get("tie_word_embeddings", False))
        cfg.attention_bias = bool(d.get("attention_bias", model_type == "qwen2"))
        cfg.bos_token_id = d.get("bos_token_id")
        eos = d.get("eos_token_id")
        cfg.eos_token_ids = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
        return cfg

    def to_hf(self) -> JsonObject:
        """The Hugging Face config dict (as transformers' LlamaConfig/Qwen2Config read it)."""
        d: JsonObject = {
            "model_type": self.model_type,
            "architectures": [{"qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}.get(
                self.model_type, "LlamaForCausalLM")],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else self.eos_token_ids,
        }
        if self.rope_scaling:
            d["rope_scaling"] = dict(self.rope_scaling)
        return d

    def to_dict(self) -> JsonObject:
        """All fields, for caching next to converted weights."""
        return asdict(self)
