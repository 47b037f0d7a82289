"""Assemble an engine from paths and options: target, draft head, tokenizer, cache sized from a memory budget."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from spectune.backends.local.engine.tokenizer import Tokenizer
from spectune.backends.local.model.config import ModelConfig
from spectune.backends.local.options import EngineOptions, check_compile_mode, check_draft_quant, resolve_draft
from spectune.backends.local.weights.loader import convert_gguf, is_default_model, load_target, resolve_model_path
from spectune.backends.num_steps import TraceWriter, load_config_file, make_policy
from spectune.core.errors import UserError

if TYPE_CHECKING:
    import torch

    from spectune.backends.local.engine.draft_length import DraftRule
    from spectune.backends.local.engine.loop import Engine
    from spectune.backends.local.engine.specserve import SpecServeRule
    from spectune.backends.local.engine.speculative import SpeculativeDecoder
    from spectune.backends.num_steps.confidence_config import ConfidenceConfig
    from spectune.backends.local.engine.step_model import StepModel
    from spectune.backends.local.weights.compute_paths import PathChoice

log = logging.getLogger("spectune.engine")


def resolve_device_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """Map option strings to torch objects (``auto`` and ``native`` give bf16; :func:`build_engine` resolves
    ``auto`` per machine). Raises UserError for unknown values or CUDA without a GPU."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise UserError(f"unknown --device {device!r}: use auto, cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but no CUDA device is available: use --device cpu")
    from spectune.backends.local.weights.compute_paths import normalise

    name = normalise(dtype)
    return torch.device(device), torch.float32 if name == "float32" else torch.bfloat16


def build_engine(opts: EngineOptions, weights_of: Engine | None = None) -> Engine:
    """Load everything and return a ready :class:`~spectune.backends.local.engine.loop.Engine` (not started).

    ``weights_of``: an engine built from the same model, head, dtype and ``max_model_len`` whose target and head
    modules (weights, compiled layers, RoPE tables) and tokenizer the new engine shares; it gets its own caches,
    scheduler and num_steps policy. Two engines in one process that differ only in how they schedule num_steps then
    run on the very same weight memory: benchmarks/adaptive_overhead.py compares them so, because separately loaded
    copies of the weights ran 2.4% apart at batch 1 (an instance effect, not the engine's).

    Raises:
        UserError: bad paths or options (num_steps > 0 without a head, a config file that does not parse, ...).
        ValueError: ``weights_of`` has no head where one is needed, or another cache length.
    """
    import torch

    from spectune.backends.local.engine.loop import Engine, EngineConfig, seeded_generator
    from spectune.backends.local.weights.heads import load_head
    from spectune.backends.local.model.linear import pack_linears, unpack_bf16_linears
    from spectune.backends.local.weights.compute_paths import choose_path
    from spectune.backends.local.engine.speculative import SpeculativeDecoder
    from spectune.backends.local.kernels import load as load_kernels

    device, _ = resolve_device_dtype(opts.device, opts.dtype)
    check_compile_mode(opts.compile)
    check_draft_quant(opts.draft_quant)
    if opts.threads > 0:
        torch.set_num_threads(opts.threads)
    is_default = is_default_model(opts.model)
    head_path = resolve_draft(opts.draft, is_default)
    config = load_config_file(opts.adaptive_config) if opts.adaptive_config else None
    policy, confidence = None, draft_length_config(opts, config)
    if config is not None and confidence is None:
        policy = make_policy(config, initial_steps=opts.num_steps or None)
    if confidence is not None and not opts.draft_p_min:  # a config file: each round drafts up to n_max per row
        opts = dataclasses.replace(opts, num_steps=confidence.n_max)
    max_steps = max(opts.num_steps, opts.num_steps_capacity, getattr(policy, "max_steps", 0) or 0)
    if max_steps > 0 and head_path is None:
        raise UserError("num_steps > 0 needs a draft head: pass --draft PATH (no bundled head for this model)")
    if weights_of is not None:
        return _sharing(weights_of, opts, policy, max_steps, confidence)
    model_path = resolve_model_path(opts.model)
    native_ok, reason, lm_repeat = False, "not a GGUF file", 1
    if model_path.is_file() and device.type == "cpu":
        from spectune.backends.local.weights.quant import native_support

        native_ok, reason, lm_repeat = native_support(model_path)
    folder = convert_gguf(model_path) if model_path.is_file() else model_path
    cfg = ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))
    kernel_choice = load_kernels(opts.cpu_kernels, device)
    int4_kernel = kernel_choice.probe_tag if kernel_choice.int4 else ""  # the int4 kernel's probes are its own
    path_choice = choose_path(opts.dtype, device, cfg, native_ok, reason, lm_repeat, opts.native_dense_above,
                              opts.native_lm_head, opts.native_dense_dtype, kernel_choice.active, int4_kernel)
    path_choice.cpu_kernels = kernel_choice.to_json()
    dtype = path_choice.dtype
    target, folder = load_target(model_path, dtype, device)
    if path_choice.name == "native":
        from spectune.backends.local.weights.quant import quantize_target

        quantize_target(target, model_path, dtype, path_choice.dense_above, path_choice.lm_head or "int4",
                        path_choice.dense_torch_dtype, kernel_choice.active, kernel_choice.int4)
    head = load_head(head_path, target, dtype, device) if head_path is not None else None
    for layer in [*target.layers, *(head.layers if head is not None else [])]:
        layer.attention_kernel = kernel_choice.active
    if head is not None:
        target.capture_layers = head.cfg.aux_layers  # EAGLE-3 features (empty for EAGLE-1)
    lazy = head is not None and policy is not None and not opts.draft_upkeep
    max_len, slots = _cache_geometry(opts, target.cfg, head, dtype, max_steps, lazy)
    target.build_rope(max_len)
    if head is not None:
        head.prepare(max_len)
    path_choice.draft_head = quantize_draft(head, opts.draft_quant, path_choice, kernel_choice.int4)  # prepared first
    if device.type == "cpu":
        pack_linears(target)  # dense bf16 linears left (none on the native path)
        if head is not None and not pack_linears(head) and dtype == torch.bfloat16:
            if unpack_bf16_linears(head):  # no oneDNN bf16 here: float32 weights beat the scalar bf16 GEMM
                path_choice.draft_head = "float32"
    from spectune.backends.local.engine.compiled import compile_target, warm_up
    from spectune.backends.local.engine.cuda_graphs import CapturedGraphs

    graphs = CapturedGraphs(slots, max_len, capture=True) if device.type == "cuda" and opts.cuda_graphs else None
    rule, acceptance = _draft_rule(confidence, head_path, opts, device, dtype)
    decoder = SpeculativeDecoder(target, head, slots, max_len, seeded_generator(opts.seed, device), graphs,
                                 lazy_draft=lazy, rule=rule, acceptance=acceptance)
    decoder.record = bool(opts.trace_path)
    if str(opts.native_dense_above).strip().lower() == "auto":  # the copy's row count checked on the whole step
        from spectune.backends.local.weights.whole_step import choose_dense_on_whole_step

        from spectune.backends.local.engine.step_model import target_forward

        # an int4 head's linears take the target's row count (whole_step_crossover times the target's forward only)
        layers = _native_layers(target) + (_native_layers(head) if head is not None else [])
        choose_dense_on_whole_step(path_choice, cfg, lm_repeat, layers, lambda rows: target_forward(decoder, rows),
                                   kernel_choice.probe_tag)
    compile_choice = compile_target(target, opts.compile, device)
    # the step model's start-up forwards first (their untimed first calls compile what they meet), then the warm-up,
    # so the warm-up's shape classes are the last thing compiled before serving (tests/engine/test_engine_compile.py)
    step_model = _step_model(decoder, path_choice, cfg, lm_repeat, max_steps, int4_kernel)
    if confidence is not None and confidence.strategy == "specserve":  # its step-time model: this machine's forwards
        decoder.rule = specserve_rule(decoder, confidence)
    warm_up(decoder, compile_choice, max_steps + 1)
    path_choice.compile = compile_choice.to_json()
    if compile_choice.mode != "off":
        log.info("compile: %s (%s; warm-up %.1f s)", "on" if compile_choice.active else "off", compile_choice.reason,
                 compile_choice.warm_up_s)
    ecfg = EngineConfig(num_steps=opts.num_steps, max_num_seqs=slots, max_len=max_len, policy=policy,
                        trace=TraceWriter(opts.trace_path) if opts.trace_path else None, steps_capacity=max_steps,
                        max_prefill_tokens=prefill_token_budget(device))
    name = os.path.basename(str(opts.model)) if opts.model else "SmolLM2-135M-Instruct"
    return Engine(decoder, Tokenizer(folder), ecfg, model_name=name, path=path_choice, step_model=step_model)


def quantize_draft(head: torch.nn.Module | None, mode: str, choice: PathChoice, int4_kernel: bool) -> str | None:
    """The draft head's linears as ``--draft-quant`` ``mode`` says (:data:`~spectune.backends.local.options.
    DRAFT_QUANT_MODES`): Q4_1 on spectune's int4 kernel (:func:`~spectune.backends.local.weights.quant.quantize_head`,
    with ``choice``'s dense copy above its row count) for ``int4``, and for ``auto`` on the native path where
    ``int4_kernel`` (that kernel is loaded); else left in the head's dtype. Returns what runs them (``int4`` or the
    dtype's name; :attr:`PathChoice.draft_head`), None without a head.

    Raises:
        UserError: ``int4`` without spectune's int4 kernel (not a CPU with AVX-512 BW, or ``--cpu-kernels off``).
    """
    if head is None:
        return None
    if mode == "int4" and not int4_kernel:
        raise UserError("--draft-quant int4 needs spectune's int4 kernel (a CPU with AVX-512 BW and --cpu-kernels auto "
                        "or on): use --draft-quant auto or off")
    if mode == "int4" or (mode == "auto" and int4_kernel and choice.name == "native"):
        from spectune.backends.local.weights.quant import quantize_head

        quantize_head(head, choice.dtype, choice.dense_above, choice.dense_torch_dtype)
        return "int4"
    return str(choice.dtype).removeprefix("torch.")


def _native_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The native linears of ``model`` (the target, or a head on the int4 kernel) that hold a dense copy
    (``weights/quant.py``)."""
    return [m for m in model.modules() if getattr(m, "dense", None) is not None and hasattr(m, "dense_above")]


def _step_model(decoder: SpeculativeDecoder, choice: PathChoice, cfg: ModelConfig, lm_repeat: int,
                max_steps: int, int4_kernel: str = "") -> StepModel | None:
    """The engine's :class:`~spectune.backends.local.engine.step_model.StepModel` on CPU: the kernels' per-row
    timings (the crossover probe of the int4 kernel that runs: spectune's where ``int4_kernel`` names it; kept per
    machine) and one-row forwards measured now; the target forwards of one sequence verifying 2 and ``max_steps`` + 1
    tokens are checked against it at start-up. None on CUDA."""
    from spectune.backends.local.engine.step_model import build_step_model
    from spectune.backends.local.weights.compute_paths import kernel_timings

    if decoder.device.type != "cpu":
        return None
    probe, probe_weights = kernel_timings(cfg, lm_repeat, int4_kernel)
    check_rows = tuple(sorted({2, max_steps + 1})) if max_steps > 0 else ()
    return build_step_model(decoder, choice, probe["rows_ms"], probe_weights, check_rows, drafting=max_steps > 0)


def draft_length_config(opts: EngineOptions, config: object) -> ConfidenceConfig | None:
    """The per-row draft-length rule ``opts`` asks for: a ``p_min`` / ``specdec`` / ``specserve`` ``config`` (the
    parsed ``adaptive_config`` file, or None), or ``draft_p_min`` > 0 (llama.cpp's ``--spec-draft-p-min`` with
    ``num_steps`` as ``--spec-draft-n-max``: a sweep switching the server's num_steps in place switches the cap); None
    for a static num_steps or a per-batch-size policy.

    Raises:
        UserError: both given, or ``draft_p_min`` outside [0, 1] or with ``num_steps`` 0.
    """
    from spectune.backends.num_steps.confidence_config import ConfidenceConfig

    if not 0.0 <= opts.draft_p_min <= 1.0:
        raise UserError(f"--draft-p-min {opts.draft_p_min}: give a probability in [0, 1] (0 = off)")
    if opts.draft_p_min > 0:
        if config is not None:
            raise UserError(f"--draft-p-min and --adaptive-config {opts.adaptive_config} both set the draft length: "
                            "give one (a p_min config file, or --draft-p-min with --num-steps as n_max)")
        if max(opts.num_steps, opts.num_steps_capacity) < 1:
            raise UserError("--draft-p-min needs --num-steps >= 1: the most draft tokens per row (llama.cpp's "
                            "--spec-draft-n-max)")
        return ConfidenceConfig("p_min", opts.draft_p_min, max(opts.num_steps, 1))
    return config if isinstance(config, ConfidenceConfig) else None


def _draft_rule(confidence: ConfidenceConfig | None, head_path: Path | None, opts: EngineOptions,
                device: torch.device, dtype: torch.dtype) -> tuple[DraftRule | None, torch.nn.Module | None]:
    """(the decoder's per-row rule, an acceptance head for traces): the rule ``confidence`` asks for, its
    acceptance head loaded (``"bundled"``: the ``acceptance/`` folder beside the draft head); with a trace and no
    rule, the draft head's own acceptance head when it ships one, so the trace holds p_hat for ``simulate``."""
    from spectune.backends.local.engine.draft_length import DraftRule

    if confidence is not None and confidence.strategy == "specserve":
        return None, None  # built on the decoder, whose forwards fit its step-time model: specserve_rule
    beside = head_path / "acceptance" if head_path is not None else None
    wanted = confidence.acceptance_head if confidence is not None else None
    if wanted == "bundled":
        if beside is None or not (beside / "config.json").is_file():
            raise UserError(f"acceptance_head \"bundled\": the draft head {head_path} ships no acceptance/ folder; "
                            "give a folder path or null (raw draft confidence)")
        wanted = str(beside)
    elif confidence is None and opts.trace_path and beside is not None and (beside / "config.json").is_file():
        wanted = str(beside)
    acceptance = None
    if wanted is not None:
        from spectune.backends.local.model.acceptance import load_acceptance_head

        acceptance = load_acceptance_head(wanted, device, dtype)
    if confidence is None:
        return None, acceptance
    rule = DraftRule.from_config(confidence, acceptance)
    log.info("draft length per row: %s", rule.describe())
    return rule, None


def specserve_rule(decoder: SpeculativeDecoder, confidence: ConfidenceConfig) -> SpecServeRule:
    """SpecServe's rule for ``decoder`` (:mod:`spectune.backends.local.engine.specserve`) with this machine's
    step-time model (kept per machine, else measured now on ``decoder``'s forwards:
    :mod:`spectune.backends.local.engine.step_time_probe`)."""
    from spectune.backends.local.engine.specserve import SpecServeRule
    from spectune.backends.local.engine.step_time_probe import step_time_model

    model, source = step_time_model(decoder, confidence.n_max)
    rule = SpecServeRule(model, confidence.n_max, confidence.slo_tpot_ms, source)
    log.info("draft length per row: %s (step-time model %s)", rule.describe(), source["calibration"])
    return rule


def _sharing(source: Engine, opts: EngineOptions, policy: object, max_steps: int,
             confidence: ConfidenceConfig | None = None) -> Engine:
    """:func:`build_engine` around ``source``'s target and head modules and tokenizer (see there): new KV caches for
    ``opts.max_num_seqs`` sequences within ``opts.kv_cache_gb``, a new decoder (lazy drafting as ``opts`` says) and
    engine configuration; no loading, packing, compiling or warm-up (the shared modules have had theirs)."""
    from spectune.backends.local.engine.loop import Engine, EngineConfig, seeded_generator
    from spectune.backends.local.engine.speculative import SpeculativeDecoder

    target, head = source.decoder.target, source.decoder.head
    if max_steps > 0 and head is None:
        raise ValueError("num_steps > 0 needs a draft head, and the engine whose weights are shared has none")
    lazy = head is not None and policy is not None and not opts.draft_upkeep
    max_len, slots = _cache_geometry(opts, target.cfg, head, source.decoder.target_cache.k.dtype, max_steps, lazy)
    if max_len != source.cfg.max_len:
        raise ValueError(f"cache length {max_len} differs from the shared engine's {source.cfg.max_len}: give both the "
                         "same max_model_len and num_steps capacity")
    rule = None
    if confidence is not None and confidence.strategy != "specserve":
        from spectune.backends.local.engine.draft_length import DraftRule

        rule = DraftRule.from_config(confidence, source.decoder.acceptance)
    decoder = SpeculativeDecoder(target, head, slots, max_len, seeded_generator(opts.seed, source.decoder.device),
                                 None, lazy_draft=lazy, rule=rule)
    if confidence is not None and confidence.strategy == "specserve":
        decoder.rule = specserve_rule(decoder, confidence)
    decoder.record = bool(opts.trace_path)
    ecfg = EngineConfig(num_steps=opts.num_steps, max_num_seqs=slots, max_len=max_len, policy=policy,
                        trace=TraceWriter(opts.trace_path) if opts.trace_path else None, steps_capacity=max_steps,
                        max_prefill_tokens=prefill_token_budget(source.decoder.device))
    return Engine(decoder, source.tokenizer, ecfg, model_name=source.model_name, path=source.path,
                  step_model=source.guard.model)


def prefill_token_budget(device: torch.device) -> int:
    """Prompt tokens one engine iteration prefills (in one packed forward) before the running batch's next round.

    On CUDA 8,192 tokens: SGLang's default ``chunked_prefill_size`` for GPUs of 35-160 GB (H100, H200, A100;
    ``python/sglang/srt/server_args.py``, set from the GPU's memory), where a forward costs its kernel launches more
    than its tokens. On CPU 1,024: a forward costs its tokens (0.73 s for 947 of SmolLM2-135M, native int4, on 2
    cores), and every running request waits for it.
    """
    return 8192 if device.type == "cuda" else 1024


def _cache_geometry(opts: EngineOptions, cfg: ModelConfig, head: object, dtype: torch.dtype, max_steps: int,
                    lazy: bool) -> tuple[int, int]:
    """(max_len, slots): tokens per sequence (``max_model_len``, else the model's limit up to 4,096, plus room for
    ``max_steps`` drafts and the bonus token) and how many sequences the target's and head's KV caches (and, with
    ``lazy`` drafting, the head's kept inputs) hold within ``opts.kv_cache_gb``, at most ``opts.max_num_seqs``.

    Raises:
        UserError: not even one sequence fits.
    """
    import torch

    from spectune.backends.local.model.kv_cache import bytes_per_token

    max_len = (opts.max_model_len or min(cfg.max_position_embeddings, 4096)) + max_steps + 1
    per_token = bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype)
    if head is not None:
        per_token += bytes_per_token(head.cfg.num_layers, head.cfg.num_kv_heads, head.cfg.head_dim, dtype)
        if lazy:  # lazy drafting keeps the head's inputs per position (SpeculativeDecoder's feat_buf, tok_buf)
            per_token += head.feature_dim * torch.empty((), dtype=dtype).element_size() + 8
    slots = min(opts.max_num_seqs, int(opts.kv_cache_gb * 2**30 // (per_token * max_len)))
    if slots < 1:
        raise UserError(f"--kv-cache-gb {opts.kv_cache_gb} cannot hold one sequence of {max_len} tokens: raise it "
                        "or lower --max-model-len")
    return max_len, slots
