"""Read and write EAGLE draft-head checkpoints in their published layouts.

Accepted layouts (a folder with ``config.json`` and ``*.safetensors`` or ``pytorch_model.bin``):

- EAGLE repo EAGLE-1/2: ``fc.weight`` (+ ``fc.bias``), ``layers.0.self_attn.{q,k,v,o}_proj.weight``,
  ``layers.0.mlp.{gate,up,down}_proj.weight``, ``layers.0.post_attention_layernorm.weight``, optionally
  ``embed_tokens.weight``; config with the Llama fields.
- EAGLE repo EAGLE-3: the same under ``midlayer.`` plus ``midlayer.input_layernorm``/``midlayer.hidden_norm``,
  ``norm.weight``, ``lm_head.weight`` [draft_vocab, H], ``d2t`` (and ``t2d``, ignored); config with
  ``draft_vocab_size``.
- speculators (vLLM) EAGLE-3: ``layers.0.`` instead of ``midlayer.``; config fields may sit under
  ``transformer_layer_config``, with ``draft_vocab_size``, ``target_hidden_size`` and
  ``eagle_aux_hidden_state_layer_ids`` at the top level.

:func:`save_head` writes the EAGLE-3 repo layout (``midlayer.*``) that SGLang loads, with a config vLLM reads too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from spectune.backends.head_config import flat_head_config, head_eagle_version
from spectune.backends.local.model.eagle import DraftConfig, DraftHead
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject

if TYPE_CHECKING:
    from spectune.backends.local.model.config import ModelConfig
    from spectune.backends.local.model.target import TargetModel


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if files:
        out: dict[str, torch.Tensor] = {}
        for f in files:
            out.update(load_file(str(f)))
        return out
    binary = folder / "pytorch_model.bin"
    if binary.is_file():
        return torch.load(str(binary), map_location="cpu", weights_only=True)
    raise UserError(f"draft head {folder} has no .safetensors or pytorch_model.bin file")


def _normalise_keys(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, val in tensors.items():
        key = key.removeprefix("model.").replace("midlayer.", "layers.0.")
        out[key] = val
    return out


def draft_config_from(raw: JsonObject, tensors: dict[str, torch.Tensor], target_cfg: ModelConfig) -> DraftConfig:
    """Infer the head's :class:`DraftConfig` from its config.json and tensors (kind:
    :func:`spectune.backends.head_config.head_eagle_version`)."""
    c = flat_head_config(raw)
    hidden = int(c.get("hidden_size", target_cfg.hidden_size))
    heads = int(c.get("num_attention_heads", target_cfg.num_heads))
    q = tensors.get("layers.0.self_attn.q_proj.weight")
    if q is None:
        raise UserError("draft head lacks tensor 'layers.0.self_attn.q_proj.weight' (or 'midlayer.self_attn.q_proj"
                        ".weight'): is this an EAGLE checkpoint?")
    kind = "eagle3" if head_eagle_version(raw, tensors, hidden) == "eagle3" else "eagle1"
    layers = 1 + max(int(k.split(".")[1]) for k in tensors if k.startswith("layers."))
    num_target_layers = target_cfg.num_layers
    aux = c.get("eagle_aux_hidden_state_layer_ids")
    if kind == "eagle3" and not aux:
        aux = [1, num_target_layers // 2 - 1, num_target_layers - 4]
    lm = tensors.get("lm_head.weight")
    scaling = c.get("rope_scaling")
    return DraftConfig(
        kind=kind,
        hidden_size=hidden,
        intermediate_size=int(c.get("intermediate_size", target_cfg.intermediate_size)),
        num_heads=heads,
        num_kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=int(c.get("head_dim") or hidden // heads),
        vocab_size=target_cfg.vocab_size,
        draft_vocab_size=int(lm.shape[0]) if (kind == "eagle3" and lm is not None) else target_cfg.vocab_size,
        target_hidden_size=int(c.get("target_hidden_size") or target_cfg.hidden_size),
        num_layers=layers,
        rms_norm_eps=float(c.get("rms_norm_eps", target_cfg.rms_norm_eps)),
        rope_theta=float(c.get("rope_theta", 10000.0)),
        rope_scaling=scaling if scaling and scaling.get("rope_type", scaling.get("type")) != "default" else None,
        aux_layers=tuple(int(i) for i in aux) if kind == "eagle3" else (),
        fc_bias="fc.bias" in tensors,
        norm_before_residual=bool(c.get("norm_before_residual", False)),
    )


def _engine_state(cfg: DraftConfig, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint tensors -> DraftHead state dict (q|k|v and gate|up fused)."""
    state = {"fc.weight": t.get("fc.weight")}
    if cfg.fc_bias:
        state["fc.bias"] = t["fc.bias"]
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        names = [p + f"self_attn.{x}_proj.weight" for x in "qkv"] + [p + f"mlp.{x}_proj.weight" for x in ("gate", "up")]
        missing = [n for n in names if n not in t]
        if missing:
            raise UserError(f"draft head lacks tensor {missing[0]!r}")
        state[p + "qkv.weight"] = torch.cat([t[n] for n in names[:3]])
        state[p + "gate_up.weight"] = torch.cat([t[n] for n in names[3:]])
        state[p + "o_proj.weight"] = t.get(p + "self_attn.o_proj.weight")
        state[p + "down_proj.weight"] = t.get(p + "mlp.down_proj.weight")
        state[p + "post_attention_layernorm"] = t.get(p + "post_attention_layernorm.weight")
        if cfg.kind == "eagle3":
            state[p + "input_layernorm"] = t.get(p + "input_layernorm.weight")
            if i == 0:
                state[p + "hidden_norm"] = t.get(p + "hidden_norm.weight")
    if cfg.kind == "eagle3":
        state["norm"] = t.get("norm.weight")
        state["lm_head.weight"] = t.get("lm_head.weight")
        d2t = t.get("d2t")
        state["d2t"] = d2t.long() if d2t is not None else torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
    return state


def load_head(path: str | Path, target: TargetModel, dtype: torch.dtype, device: torch.device) -> DraftHead:
    """Load an EAGLE head for ``target`` (a :class:`~spectune.backends.local.model.target.TargetModel`).

    Raises:
        UserError: missing folder or files, a missing tensor, or a tensor whose shape does not match the config
            (the message names the tensor and both shapes).
    """
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise UserError(f"draft head {folder} has no config.json: give an EAGLE head folder")
    raw = json.loads((folder / "config.json").read_text())
    tensors = _normalise_keys(_read_tensors(folder))
    cfg = draft_config_from(raw, tensors, target.cfg)
    state = _engine_state(cfg, tensors)
    missing = sorted(k for k, v in state.items() if v is None)
    if missing:
        raise UserError(f"draft head lacks tensor {missing[0]!r}")
    with torch.device("meta"):
        head = DraftHead(cfg, target.embed_tokens, target.lm_head)
    expected = head.state_dict()
    for name, tensor in state.items():
        if name not in expected:
            raise UserError(f"draft head tensor {name!r} is not part of a {cfg.kind} head")
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise UserError(f"draft head tensor {name!r} has shape {tuple(tensor.shape)}, expected "
                            f"{tuple(expected[name].shape)} for this config")
    head.load_state_dict({k: v.to(device=device, dtype=torch.long if k == "d2t" else dtype)
                          for k, v in state.items()}, strict=True, assign=True)
    if "embed_tokens.weight" in tensors and tensors["embed_tokens.weight"].shape[1] != target.cfg.hidden_size:
        head.own_embed = torch.nn.Embedding.from_pretrained(tensors["embed_tokens.weight"].to(device, dtype))
    return head.eval().requires_grad_(False)


def save_head(head: DraftHead, folder: str | Path, extra_config: JsonObject | None = None) -> None:
    """Write ``head`` as an EAGLE checkpoint: EAGLE-3 repo keys (``midlayer.*``) or EAGLE-1 keys (``layers.0.*``).

    The config carries the Llama fields, ``draft_vocab_size`` and ``target_hidden_size`` (what SGLang and vLLM read).
    """
    from safetensors.torch import save_file

    c = head.cfg
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    prefix = "midlayer." if c.kind == "eagle3" and c.num_layers == 1 else "layers.0."
    out: dict[str, torch.Tensor] = {}
    qkv_sizes = [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim]
    for name, t in head.state_dict().items():
        t = t.detach().cpu()
        if name.startswith("layers."):
            i, rest = name.split(".", 2)[1], name.split(".", 2)[2]
            p = prefix if i == "0" else f"layers.{i}."
            if rest == "qkv.weight":
                for x, part in zip("qkv", t.split(qkv_sizes)):
                    out[p + f"self_attn.{x}_proj.weight"] = part.contiguous()
            elif rest == "gate_up.weight":
                gate, up = t.chunk(2)
                out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = gate.contiguous(), up.contiguous()
            elif rest == "o_proj.weight":
                out[p + "self_attn.o_proj.weight"] = t
            elif rest == "down_proj.weight":
                out[p + "mlp.down_proj.weight"] = t
            else:
                out[p + rest + ".weight"] = t
        elif name == "norm":
            out["norm.weight"] = t
        else:
            out[name] = t
    save_file(out, str(folder / "model.safetensors"))
    arch = "LlamaForCausalLMEagle3" if c.kind == "eagle3" else "LlamaForCausalLMEagle"
    config = {
        "architectures": [arch],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": c.num_layers,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "vocab_size": c.vocab_size,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }
    if c.kind == "eagle3":
        config.update(draft_vocab_size=c.draft_vocab_size, target_hidden_size=c.target_hidden_size)
    config.update(extra_config or {})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
