"""What an EAGLE draft head's ``config.json`` means, read once for every backend: its flattened hyperparameters,
its EAGLE version, and the Llama-3 RoPE frequency factors of a head or target with ``rope_type: llama3``.

Users: the bundled engine's head loader (:mod:`spectune.backends.local.weights.heads`), the launching backends' EAGLE
version (:func:`spectune.backends.eagle_heads.eagle_version`), and llama.cpp's head GGUF
(:mod:`spectune.backends.llamacpp.head_checkpoint`, :mod:`spectune.backends.llamacpp.head_params`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, TypeVar

from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject, JsonValue

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["flat_head_config", "head_eagle_version", "llama3_rope_factors", "read_config_json"]


_Freqs = TypeVar("_Freqs", "np.ndarray", "torch.Tensor")
"""Inverse RoPE frequencies: a numpy array (llama.cpp's GGUF writer) or a torch tensor (the bundled engine)."""


def read_config_json(folder: Path, missing: str, unreadable: Callable[[Path, Exception], str]) -> JsonValue:
    """``folder/config.json`` (a Hugging Face model's or an EAGLE head's) parsed.

    Raises:
        UserError: ``missing`` when the file is absent; ``unreadable(file, error)`` when it cannot be read or is not
            JSON.
    """
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise UserError(missing)
    try:
        return json.loads(cfg_file.read_text())
    except (OSError, ValueError) as err:
        raise UserError(unreadable(cfg_file, err)) from None


def flat_head_config(config: JsonObject) -> JsonObject:
    """A head's hyperparameters as one flat dict: the top-level keys, then ``text_config`` and
    ``transformer_layer_config`` over them (llama.cpp's ``conversion/base.py`` ``ModelBase.load_hparams``, the
    speculators layout vLLM writes), then ``eagle_config`` (EAGLE repo / ModelOpt heads) over all.

    Args:
        config: the parsed ``config.json`` (or ``transformers.AutoConfig(...).to_dict()``); not modified.
    """
    flat = dict(config)
    for nested in ("text_config", "transformer_layer_config", "eagle_config"):
        if nested in flat:
            flat = {**flat, **(flat[nested] or {})}
    return flat


def head_eagle_version(config: JsonObject, tensors: Mapping[str, torch.Tensor] | None = None,
                       hidden_size: int | None = None) -> str:
    """``"eagle3"`` or ``"eagle"`` for a draft head: the one EAGLE version rule.

    EAGLE-3 when its ``config.json`` says so (an architecture containing ``Eagle3``: ``LlamaForCausalLMEagle3``,
    ``Eagle3LlamaForCausalLM``, ``Eagle3Speculator``; or a ``draft_vocab_size``, top level or nested: background
    §5, llama.cpp ``conversion/llama.py``), or, for a loaded checkpoint, when its tensors do (a ``d2t`` map, or a
    ``layers.0.self_attn.q_proj.weight`` reading 2 x ``hidden_size`` features: embedding and fused target features).

    Args:
        config: the parsed ``config.json``. tensors: checkpoint name -> tensor (``.shape``), names as the engine's
            loader normalises them (``layers.0.``), or None when only the config is known.
        hidden_size: the head's hidden size (default: the config's ``hidden_size``).
    """
    archs = " ".join(str(a) for a in config.get("architectures") or []).lower()
    flat = flat_head_config(config)
    if "eagle3" in archs or "draft_vocab_size" in flat:
        return "eagle3"
    if tensors is not None:
        hidden = hidden_size if hidden_size is not None else flat.get("hidden_size")
        q = tensors.get("layers.0.self_attn.q_proj.weight")
        if "d2t" in tensors or (q is not None and hidden is not None and q.shape[1] == 2 * int(hidden)):
            return "eagle3"
    return "eagle"


def llama3_rope_factors(inv_freq: _Freqs, scaling: JsonObject) -> _Freqs:
    """Llama 3.1's RoPE scaling as per-pair divisors: ``inv_freq / factors`` are the scaled inverse frequencies.

    Wavelengths ``2*pi/inv_freq`` shorter than ``original_max_position_embeddings / high_freq_factor`` keep their
    frequency (factor 1), longer than ``... / low_freq_factor`` are divided by ``factor``, and between the two
    ``1 / ((1 - s) / factor + s)`` with ``s = (original_max_position_embeddings / wavelength - low) / (high - low)``
    (llama.cpp ``conversion/llama.py`` ``generate_extra_tensors``, which writes them as ``rope_freqs.weight``;
    transformers ``_compute_llama3_parameters``). Defaults as the converter's: factor 8, low 1, high 4, 8192.

    Args:
        inv_freq: [head_dim // 2] numpy array or torch tensor; the result has its type and dtype (float32 for the
            GGUF tensor, float64 for the engine's table).
        scaling: the config's ``rope_scaling`` / ``rope_parameters``.
    """
    factor = scaling.get("factor", 8.0)
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old = scaling.get("original_max_position_embeddings", 8192)
    wavelen = 2 * math.pi / inv_freq
    smooth = (old / wavelen - low) / (high - low)
    mid = 1 / ((1 - smooth) / factor + smooth)
    ones = wavelen * 0 + 1
    if hasattr(inv_freq, "where"):  # torch
        return ones.where(wavelen < old / high, (ones * factor).where(wavelen > old / low, mid))
    import numpy as np

    return np.where(wavelen < old / high, ones, np.where(wavelen > old / low, ones * factor, mid)).astype(
        inv_freq.dtype)
