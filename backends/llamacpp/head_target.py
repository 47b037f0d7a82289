"""The target model as the head GGUF needs it: its shape and vocabulary from a llama.cpp GGUF (read with the
``gguf`` package's :class:`gguf.GGUFReader`) or a Hugging Face folder, and an HF folder of it for llama.cpp's
converter (``--target-model-dir``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spectune.backends.head_config import read_config_json
from spectune.backends.llamacpp.eagle3_names import ARCH
from spectune.core.errors import UserError

if TYPE_CHECKING:
    from gguf import GGUFValueType


@dataclass
class TargetInfo:
    """What the head file needs from the target model.

    Attributes:
        path: the GGUF file or HF folder.
        num_layers: decoder layers (L).
        hidden_size: Ht.
        vocab_size: tokens in its vocabulary.
        gguf_tokenizer: the ``tokenizer.*`` fields of a GGUF target as ``(key, value, type, subtype)``; None for an
            HF folder.
    """

    path: Path
    num_layers: int
    hidden_size: int
    vocab_size: int
    gguf_tokenizer: list[tuple[str, object, GGUFValueType, GGUFValueType | None]] | None = None


def read_gguf_kv(path: str | os.PathLike[str]) -> dict[str, tuple[object, GGUFValueType, GGUFValueType | None]]:
    """The metadata of a GGUF file, in file order: ``{key: (value, GGUFValueType, array subtype or None)}``, read
    with :class:`gguf.GGUFReader` (ggml-org/llama.cpp ``gguf-py/gguf/gguf_reader.py``).

    Strings stay ``bytes`` (copied verbatim: the raw bytes of the reader's string parts); numeric arrays are lists.

    Raises:
        ValueError: not a GGUF file (bad magic or version) or a field type the reader does not know.
    """
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(path)
    out: dict[str, tuple[object, GGUFValueType, GGUFValueType | None]] = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):  # the header (version, counts), which the reader lists as fields
            continue
        main = f.types[0]
        if main == GGUFValueType.ARRAY:
            sub = GGUFValueType(int(f.parts[3][0]))  # parts: key length, key, type, item type, count, items...
            if sub == GGUFValueType.ARRAY:
                raise ValueError(f"nested GGUF array in {key}")
            val: object = [f.parts[i].tobytes() for i in f.data] if sub == GGUFValueType.STRING else f.contents()
            out[key] = (val, main, sub)
        elif main == GGUFValueType.STRING:
            out[key] = (f.parts[-1].tobytes(), main, None)
        else:
            out[key] = (f.contents(), main, None)
    return out


def read_target(target: str | os.PathLike[str]) -> TargetInfo:
    """Read the target's shape and vocabulary from a GGUF file or an HF folder (``config.json``).

    Raises:
        UserError: the path does not exist, is neither a ``.gguf`` file nor a folder with ``config.json``, cannot be
            parsed, or is itself an EAGLE-3 head.
    """
    path = Path(target).expanduser()
    if path.is_dir():
        def unreadable(cfg_file: Path, err: Exception) -> str:
            return (f"cannot read target {cfg_file} ({type(err).__name__}: {err}): give a Hugging Face model folder "
                    "or the target's GGUF file")

        cfg = read_config_json(path, f"target {path} has no config.json: give the target's GGUF file or its Hugging "
                               "Face folder (config.json + tokenizer)", unreadable)
        try:
            if "text_config" in cfg:  # type: ignore[operator]
                cfg = {**cfg, **cfg["text_config"]}  # type: ignore[call-overload, index, dict-item]
            return TargetInfo(path, int(cfg["num_hidden_layers"]), int(cfg["hidden_size"]),  # type: ignore
                              int(cfg["vocab_size"]))  # type: ignore[call-overload, index]
        except (ValueError, KeyError, TypeError) as err:
            raise UserError(unreadable(path / "config.json", err)) from None
    if not path.is_file():
        raise UserError(f"target {path} does not exist: give the target's GGUF file or Hugging Face folder")
    st = path.stat()
    return _read_gguf_target(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read_gguf_target(path: Path, _size: int, _mtime_ns: int) -> TargetInfo:
    """:func:`read_target` of a GGUF file, kept per (path, size, mtime): ``GGUFReader`` takes seconds on a 49k-token
    vocabulary (it splits every string into its own array)."""
    try:
        kv = read_gguf_kv(path)
        arch = kv["general.architecture"][0].decode()
        if arch == ARCH:
            raise UserError(f"target {path} is an EAGLE-3 head, not a target model: give the model the head drafts "
                            "for (e.g. SmolLM2-135M-Instruct.Q4_1.gguf)")
        n_layer = int(kv[f"{arch}.block_count"][0])
        hidden = int(kv[f"{arch}.embedding_length"][0])
        n_vocab = len(kv["tokenizer.ggml.tokens"][0])
        tok = [(key, *val) for key, val in kv.items() if key.startswith("tokenizer.")]
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - a truncated or foreign file fails anywhere in the parse
        raise UserError(f"cannot read target {path} as GGUF ({type(err).__name__}: {err}): give a llama.cpp GGUF "
                        "model file (config, tokenizer and weights) or a Hugging Face folder") from None
    return TargetInfo(path, n_layer, hidden, n_vocab, tok)


def target_hf_dir(target: str | os.PathLike[str]) -> Path:
    """An HF-style folder of the target (``config.json`` + tokenizer) for llama.cpp's converter.

    An HF folder is returned as is. For a GGUF file: spectune's dequantized cache
    (``spectune.backends.local.weights.loader.convert_gguf``) when it already exists, else a light folder with only
    ``config.json`` and the tokenizer (what ``--target-model-dir`` reads), made once under
    ``$SPECTUNE_CACHE_DIR/llamacpp-heads/targets/`` with the same transformers calls as ``convert_gguf``.

    Raises:
        UserError: the GGUF is not a Llama-family model transformers can read.
    """
    path = Path(target).expanduser()
    if path.is_dir():
        return path
    from spectune.backends.llamacpp.install import cache_root
    from spectune.backends.local.weights.loader import _gguf_cache_folder

    full = _gguf_cache_folder(path)
    if (full / "config.json").is_file() and (full / "tokenizer.json").is_file():
        return full
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    folder = cache_root() / "llamacpp-heads" / "targets" / f"{path.stem}-{key}"
    if (folder / "config.json").is_file():
        return folder
    from transformers import AutoTokenizer, LlamaConfig, Qwen2Config
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        meta = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    except Exception as err:  # noqa: BLE001
        raise UserError(f"cannot read target {path} with transformers ({type(err).__name__}: {err}): give its "
                        "Hugging Face folder instead") from None
    model_type = meta.get("model_type")
    config_cls = {"llama": LlamaConfig, "mistral": LlamaConfig, "qwen2": Qwen2Config}.get(model_type)
    if config_cls is None:
        raise UserError(f"{path.name}: GGUF architecture {model_type!r} is not Llama-family (llama, mistral, qwen2): "
                        "give the target's Hugging Face folder")
    config = config_cls(**{k: v for k, v in meta.items() if k not in ("model_type", "_model_name_or_path")}).to_dict()
    config["model_type"] = model_type
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(str(tmp))
    try:
        tmp.rename(folder)
    except OSError:  # another process made it first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return folder
