"""A GGUF target as the Hugging Face safetensors folder vLLM loads (the embedded default pair's target included).

vLLM's EAGLE-3 path wants an HF target folder (``config.json`` with ``architectures``, safetensors, tokenizer). The GGUF
is dequantized once by transformers' GGUF loader (:func:`spectune.backends.local.weights.loader.convert_gguf`: float32
safetensors, llama.cpp's Q/K permutation undone, tokenizer and chat template saved), then written here in ``dtype``
(bfloat16 by default, vLLM's CPU dtype) with:

- ``architectures`` from transformers' causal-LM mapping for the GGUF's ``model_type`` (``llama`` ->
  ``LlamaForCausalLM``): vLLM resolves its model class from it (``vllm/config/model.py``, "Resolved architecture");
- no ``quantization_config`` (the weights are dense now);
- ``conversion.json``: the GGUF's path, size and SHA-256, the tool and its version, the dtype and the tensor count,
  which :meth:`spectune.backends.vllm.VLLMBackend.describe` copies into sweep.json.

``transformers``' ``save_pretrained`` refuses a model loaded from GGUF, so the state dict is written with
``safetensors`` directly. The folder is cached under ``$SPECTUNE_CACHE_DIR/vllm-targets/<stem>-<sha256[:16]>-<dtype>``
and reused.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from spectune.backends.local.weights.loader import cache_dir, convert_gguf
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject

DTYPES = ("bfloat16", "float16", "float32")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json")


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def target_cache_dir() -> Path:
    """``<spectune cache>/vllm-targets``."""
    return cache_dir() / "vllm-targets"


def read_conversion(folder: Path) -> JsonObject | None:
    """``conversion.json`` of a converted folder, or None."""
    try:
        data = json.loads((Path(folder) / "conversion.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def hf_target_folder(gguf: Path, dtype: str = "bfloat16") -> Path:
    """The vLLM-loadable HF folder for ``gguf`` (module docstring), converted on first use.

    Raises:
        UserError: ``dtype`` is not one of :data:`DTYPES`, or the GGUF is not a Llama-family model
            (:func:`~spectune.backends.local.weights.loader.convert_gguf`).
    """
    if dtype not in DTYPES:
        raise UserError(f"unknown target dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    gguf = Path(gguf).resolve()
    sha = file_sha256(gguf)
    folder = target_cache_dir() / f"{gguf.stem}-{sha[:16]}-{dtype}"
    if (folder / "model.safetensors").is_file() and read_conversion(folder) is not None:
        return folder
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    dense = convert_gguf(gguf)
    config = json.loads((dense / "config.json").read_text())
    arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.get("model_type", ""))
    if arch is None:
        raise UserError(f"{gguf.name}: no causal-LM class for model_type {config.get('model_type')!r} in transformers")
    tensors = load_file(str(dense / "model.safetensors"))
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file({k: v.to(getattr(torch, dtype)).contiguous() for k, v in tensors.items()},
              str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config.pop("quantization_config", None)
    config.pop("dtype", None)
    config.update(architectures=[arch], torch_dtype=dtype)
    (tmp / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    for name in TOKENIZER_FILES:
        if (dense / name).is_file():
            shutil.copy2(dense / name, tmp / name)
    record = {"gguf": str(gguf), "gguf_bytes": gguf.stat().st_size, "gguf_sha256": sha,
              "tool": f"transformers {transformers.__version__} GGUF loader (load_gguf_checkpoint), safetensors",
              "dtype": dtype, "tensors": len(tensors), "architectures": [arch],
              "tie_word_embeddings": bool(config.get("tie_word_embeddings"))}
    (tmp / "conversion.json").write_text(json.dumps(record, indent=1) + "\n")
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder
