"""The target's vocabulary in the head GGUF when the target is a Hugging Face folder: its BPE tokens, types,
merges and special tokens as the converter writes them (``conversion/base.py`` ``TextModel._set_vocab_gpt2``,
``get_vocab_base``, ``does_token_look_special``; ``gguf.SpecialVocab``). A GGUF target's ``tokenizer.*`` fields are
copied as they are instead (:mod:`spectune.backends.llamacpp.head_gguf`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from spectune.backends.llamacpp.head_checkpoint import HeadInfo
from spectune.backends.llamacpp.head_target import TargetInfo
from spectune.core.errors import UserError

if TYPE_CHECKING:
    from gguf import GGUFWriter


def write_hf_tokenizer(w: GGUFWriter, head: HeadInfo, tgt: TargetInfo) -> None:
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
