"""The head's tensors as llama.cpp's EAGLE-3 model names and lays them out: checks of the head against the target,
the checkpoint -> GGUF name mapping (:mod:`spectune.backends.llamacpp.eagle3_names`), the q/k row permutation, the
absolute ``d2t`` map and the types (BF16 weights, F32 norms, I64 ``d2t``), in the converter's order
(``conversion/llama.py`` ``LlamaModel.modify_tensors``/``prepare_tensors``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spectune.backends.llamacpp.eagle3_names import GLOBAL_TENSORS, LAYER_TENSORS, ROPE_FREQS, SKIPPED_SUFFIXES
from spectune.backends.llamacpp.head_checkpoint import HeadInfo, find_hparam, head_tensors
from spectune.backends.llamacpp.head_params import llama3_rope_freqs
from spectune.backends.llamacpp.head_target import TargetInfo
from spectune.core.errors import UserError

if TYPE_CHECKING:
    import numpy as np
    from gguf import GGMLQuantizationType


def check_pair(head: HeadInfo, tgt: TargetInfo) -> None:
    """Check that the head fits the target: vocabulary size, target hidden size, target layers.

    Raises:
        UserError: one of them does not fit (the message names both values and the fix).
    """
    vocab = head.hparams.get("vocab_size")
    if vocab != tgt.vocab_size:
        raise UserError(f"draft head {head.folder} has vocab_size {vocab} but target {tgt.path.name} has "
                        f"{tgt.vocab_size} tokens: the head was trained for another target; pass that target with "
                        "--model, or a head trained for this one")
    ths = head.raw.get("target_hidden_size") or tgt.hidden_size
    if ths != tgt.hidden_size:
        raise UserError(f"draft head {head.folder} expects a target of hidden size {ths} but {tgt.path.name} has "
                        f"{tgt.hidden_size}: pass the target the head was trained for with --model")
    layers = target_layers(head, tgt)
    if any(not 0 <= i <= tgt.num_layers for i in layers):
        raise UserError(f"draft head {head.folder} reads target layers {layers} but {tgt.path.name} has "
                        f"{tgt.num_layers} layers: pass the target the head was trained for with --model")


def target_layers(head: HeadInfo, tgt: TargetInfo) -> list[int]:
    """``conversion/llama.py``: ``eagle_aux_hidden_state_layer_ids`` of the raw config, else [2, L//2, L-3]."""
    ids = head.raw.get("eagle_aux_hidden_state_layer_ids")
    if ids:
        return [int(i) for i in ids]
    n = tgt.num_layers
    return [2, n // 2, n - 3]


def d2t_absolute(d2t: np.ndarray, target_vocab: int, head: HeadInfo) -> np.ndarray:
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


def _permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """``conversion/llama.py`` ``LlamaModel.permute``: rotate-half rows -> llama.cpp's interleaved rope rows."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(head: HeadInfo, tgt: TargetInfo) -> list[tuple[str, np.ndarray, GGMLQuantizationType]]:
    """``(gguf name, numpy data, GGMLQuantizationType)`` in the converter's order."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    hp = head.hparams
    n_head = int(find_hparam(hp, ("n_heads", "num_attention_heads")))
    n_kv = find_hparam(hp, ("n_kv_heads", "num_key_value_heads"))
    out: list[tuple[str, np.ndarray, GGMLQuantizationType]] = []
    rope_freqs = llama3_rope_freqs(hp)
    if rope_freqs is not None:
        out.append((ROPE_FREQS, rope_freqs, Q.F32))
    d2t = None
    lm_rows = None
    fc_shape = None
    for name, data in head_tensors(head):
        if name.startswith("midlayer."):
            name = "model.layers.0." + name[len("midlayer."):]
        elif name.startswith("layers.0."):
            name = "model." + name
        if name == "d2t":
            d2t = data
            continue
        if name == "t2d" or name.endswith(SKIPPED_SUFFIXES):
            continue
        if name in GLOBAL_TENSORS:
            new = GLOBAL_TENSORS[name]
        elif name.startswith("model.layers.") and name.split(".", 3)[3] in LAYER_TENSORS:
            bid = name.split(".")[2]
            new = f"blk.{bid}.{LAYER_TENSORS[name.split('.', 3)[3]]}"
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
        out.append(("d2t", d2t_absolute(d2t, tgt.vocab_size, head), Q.I64))
    return out
