"""An EAGLE-3 head folder as llama.cpp's converter reads it: the check that llama.cpp can run it, its
hyperparameters, and its tensors (through the ``safetensors`` library, or ``torch.load`` for ``pytorch_model*.bin``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from spectune.backends.head_config import flat_head_config, read_config_json
from spectune.backends.llamacpp.eagle3_names import EAGLE3_ARCHITECTURES
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject, JsonValue

if TYPE_CHECKING:
    import numpy as np


@dataclass
class HeadInfo:
    """An EAGLE-3 head folder, checked: its raw ``config.json``, its merged hyperparameters and its weight files."""

    folder: Path
    raw: JsonObject
    hparams: JsonObject
    weight_files: list[Path] = field(default_factory=list)


def _weight_files(folder: Path) -> list[Path]:
    """The files the converter reads: ``model*.safetensors`` (or the index's shards), else ``pytorch_model*.bin``."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{index} is not a safetensors index (no weight_map): repair or delete it") from None
        return [folder / s for s in shards]
    files = sorted(p for p in folder.iterdir() if p.name.startswith("model") and p.name.endswith(".safetensors"))
    if not files:
        files = sorted(p for p in folder.iterdir()
                       if p.name.startswith("pytorch_model") and p.name.endswith(".bin"))
    return files


def read_head(head_dir: str | os.PathLike[str]) -> HeadInfo:
    """Check that ``head_dir`` is an EAGLE-3 head llama.cpp can run and read its config.

    llama.cpp's converter treats a checkpoint as EAGLE-3 when its config has ``draft_vocab_size`` and
    ``num_hidden_layers`` 1 (``conversion/llama.py`` ``LlamaModel.__init__``); so does this check, and it also names
    the EAGLE-3 architectures (``LlamaForCausalLMEagle3``, ``Eagle3LlamaForCausalLM``) in its messages.

    Raises:
        UserError: the folder or its ``config.json`` is missing or unreadable; it is not an EAGLE-3 head (an EAGLE-1
            head, a full model); it has more than one decoder layer; it has no weight files.
    """
    folder = Path(head_dir).expanduser()
    if not folder.is_dir():
        raise UserError(f"draft head {folder} is not a folder: give an EAGLE-3 head folder (config.json + "
                        "model.safetensors), or omit --head for the bundled one")
    cfg_file = folder / "config.json"
    raw = read_config_json(folder, f"draft head {folder} has no config.json: give an EAGLE-3 head folder "
                           "(config.json + model.safetensors)",
                           lambda f, err: f"cannot read {f} ({err}): fix or replace the head's config.json")
    if not isinstance(raw, dict):
        raise UserError(f"{cfg_file} is not a JSON object: fix or replace the head's config.json")
    flat = flat_head_config(raw)
    archs = [str(a) for a in (raw.get("architectures") or [])]
    named = any(a in EAGLE3_ARCHITECTURES for a in archs)
    if "draft_vocab_size" not in flat:
        if named:
            raise UserError(f"draft head {folder} ({archs[0]}) has no draft_vocab_size in config.json: llama.cpp "
                            "recognises EAGLE-3 heads by it; add \"draft_vocab_size\": <rows of lm_head.weight>")
        kind = "an EAGLE-1/2 head" if any("Eagle" in a for a in archs) else (
            f"a {archs[0]} model" if archs else "a model without architectures")
        raise UserError(f"draft head {folder} is not an EAGLE-3 head ({kind}; its config.json has no "
                        "draft_vocab_size): llama.cpp's draft-eagle3 runs LlamaForCausalLMEagle3 / "
                        "Eagle3LlamaForCausalLM heads; train one with `spectune draft train`")
    if flat.get("num_hidden_layers") != 1:
        raise UserError(f"draft head {folder} has num_hidden_layers {flat.get('num_hidden_layers')!r}: llama.cpp's "
                        "EAGLE-3 heads have exactly one decoder layer (num_hidden_layers 1)")
    files = _weight_files(folder)
    if not files:
        raise UserError(f"draft head {folder} has no model*.safetensors or pytorch_model*.bin: give an EAGLE-3 head "
                        "folder with its weights")
    return HeadInfo(folder, raw, _hparams(folder, raw), files)


def _hparams(folder: Path, raw: JsonObject) -> JsonObject:
    """The hyperparameters as the converter sees them: ``transformers.AutoConfig`` (which fills the Llama defaults,
    e.g. ``max_position_embeddings`` 2048 and ``head_dim``), else the raw JSON; flattened by
    :func:`spectune.backends.head_config.flat_head_config` (``conversion/base.py`` ``ModelBase.load_hparams``,
    ``conversion/llama.py`` ``index_tensors``)."""
    try:
        from transformers import AutoConfig

        hparams = AutoConfig.from_pretrained(str(folder), trust_remote_code=False).to_dict()
    except Exception:  # noqa: BLE001 - the converter falls back to config.json on any failure too
        hparams = dict(raw)
    return flat_head_config(hparams)


def find_hparam(hparams: JsonObject, keys: tuple[str, ...]) -> JsonValue:
    """``ModelBase.find_hparam(keys, optional=True)``: the value of the first key present, else None."""
    return next((hparams[k] for k in keys if k in hparams), None)


#: safetensors dtypes the writer takes (floating ones are widened to float32, integer ones to int64).
_ST_DTYPES = ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL")


def _read_safetensors(path: Path) -> list[tuple[str, np.ndarray]]:
    """``(name, numpy array)`` for every tensor of one file, names sorted (the converter's order), read with the
    ``safetensors`` library (``safe_open(framework="pt")``: numpy has no BF16).

    Floating tensors come back as float32 (BF16 widened exactly), integer and bool tensors as int64.

    Raises:
        UserError: not a safetensors file; a tensor of a type the writer does not take (quantized, FP8).
    """
    from safetensors import SafetensorError, safe_open

    out = []
    try:
        with safe_open(str(path), framework="pt") as f:
            for name in sorted(f.keys()):
                dtype = f.get_slice(name).get_dtype()
                if dtype not in _ST_DTYPES:
                    raise UserError(f"{path}: tensor {name!r} has dtype {dtype}, which the GGUF writer does not "
                                    "take: use --llama-cpp-dir (llama.cpp's converter) for quantized heads")
                t = f.get_tensor(name)
                out.append((name, t.float().numpy() if t.is_floating_point() else t.long().numpy()))
    except (OSError, SafetensorError) as err:
        raise UserError(f"cannot read {path} ({err}): is it a safetensors file?") from None
    return out


def _read_torch_bin(path: Path) -> list[tuple[str, np.ndarray]]:
    import torch

    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure is a bad file
        raise UserError(f"cannot read {path} ({type(err).__name__}): give the head as safetensors") from None
    out = []
    for name in sorted(state):
        t = state[name]
        out.append((name, t.float().numpy() if t.is_floating_point() else t.long().numpy()))
    return out


def head_tensors(head: HeadInfo) -> list[tuple[str, np.ndarray]]:
    """``(checkpoint name, numpy array)`` of every weight file, in the converter's order (files, then names).

    Raises:
        UserError: a file named by the index is missing or unreadable.
    """
    out: list[tuple[str, np.ndarray]] = []
    for f in head.weight_files:
        if not f.is_file():
            raise UserError(f"draft head {head.folder} lacks {f.name} (named in its index): download it again")
        out.extend(_read_safetensors(f) if f.suffix == ".safetensors" else _read_torch_bin(f))
    return out
