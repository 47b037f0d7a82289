"""``spectune draft train`` and ``spectune draft eval``: build and measure EAGLE heads."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer

from spectune.core.errors import UserError

app = typer.Typer(no_args_is_help=True)


@app.command("train")
def train(
    output: Annotated[Path, typer.Option(help="Folder for the trained head (safetensors, config.json, training.json).")],
    model: Annotated[Optional[str], typer.Option(help="Target GGUF file or HF folder (default: the embedded "
                                                 "SmolLM2-135M-Instruct).")] = None,
    work_dir: Annotated[Path, typer.Option(help="Folder for data, features and checkpoints (resumable).")]
    = Path("work-data/draft"),
    stage: Annotated[str, typer.Option(help="all, or one of data, features, train, export.")] = "all",
    num_prompts: Annotated[int, typer.Option(min=1, help="ShareGPT prompts whose responses the target "
                                             "regenerates (self-distillation).")] = 6000,
    magpie_prompts: Annotated[int, typer.Option(min=0, help="Extra prompts the target writes itself (Magpie), "
                                                "answered after the ShareGPT ones.")] = 0,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Response length cap, tokens.")] = 256,
    spec_bench: Annotated[Optional[Path], typer.Option(help="Spec-Bench JSONL whose prompts are excluded from "
                                                       "training too (MT-Bench and HumanEval always are).")] = None,
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the data.")] = 3,
    draft_vocab_size: Annotated[int, typer.Option(min=16, help="Rows of the head's lm_head (most frequent "
                                                  "response tokens).")] = 8192,
    ttt_steps: Annotated[int, typer.Option(min=1, help="Training-time-test depth (unrolled draft steps).")] = 3,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW, warmup, cosine decay).")] = 5e-4,
    batch_tokens: Annotated[int, typer.Option(min=64, help="Padded tokens per training batch.")] = 4096,
    seed: Annotated[int, typer.Option(help="Seed for prompt order, initialisation and batching.")] = 0,
    threads: Annotated[int, typer.Option(min=0, help="torch CPU threads (0 = default).")] = 0,
) -> None:
    """Train an EAGLE-3 head: self-distilled data, target features, training-time test; resumable by stage."""
    from rich.console import Console

    from spectune.draft.pipeline import STAGES, PipelineOptions, run_pipeline
    from spectune.draft.train import TrainConfig

    if stage != "all" and stage not in STAGES:
        raise UserError(f"unknown --stage {stage!r}: use all or one of {', '.join(STAGES)}")
    if threads:
        import torch

        torch.set_num_threads(threads)
    console = Console(stderr=True)
    opts = PipelineOptions(model=model, output=output, work_dir=work_dir, num_prompts=num_prompts,
                           magpie_prompts=magpie_prompts, max_new_tokens=max_new_tokens, spec_bench=spec_bench,
                           stages=STAGES if stage == "all" else (stage,))
    cfg = TrainConfig(draft_vocab_size=draft_vocab_size, ttt_steps=ttt_steps, epochs=epochs, lr=lr,
                      batch_tokens=batch_tokens, seed=seed)
    run_pipeline(opts, cfg, lambda msg: console.print(msg, highlight=False))
    if "export" in opts.stages:
        console.print(f"head written to {output}")


@app.command("export")
def export(
    output: Annotated[Path, typer.Option(help="GGUF file to write (llama-server -md FILE --spec-type draft-eagle3).")],
    head: Annotated[Optional[Path], typer.Option(help="EAGLE-3 head folder (default: the bundled SmolLM2 head).")]
    = None,
    model: Annotated[Optional[str], typer.Option(help="Target GGUF file or HF folder whose vocabulary the head "
                                                 "uses (default: the embedded SmolLM2-135M-Instruct).")] = None,
    llama_cpp_dir: Annotated[Optional[Path], typer.Option(help="llama.cpp source tree: convert with its "
                                                          "convert_hf_to_gguf.py instead of spectune's writer.")]
    = None,
) -> None:
    """Write an EAGLE-3 head as a GGUF that llama.cpp's llama-server loads (BF16, d2t as target ids)."""
    from spectune.backends.llamacpp.head_gguf import export_head_gguf
    from spectune.backends.local.options import DEFAULT_HEAD
    from spectune.backends.local.weights.loader import resolve_model_path

    written = export_head_gguf(head if head is not None else DEFAULT_HEAD, resolve_model_path(model), output,
                               llama_cpp_dir)
    size = written.stat().st_size
    writer = "llama.cpp's convert_hf_to_gguf.py" if llama_cpp_dir is not None else "spectune's writer"
    typer.echo(f"wrote {written} ({size / 1e6:.1f} MB, {writer})")


@app.command("eval")
def evaluate(
    draft: Annotated[Optional[str], typer.Option(help="EAGLE head folder (default: the bundled SmolLM2 head).")]
    = None,
    model: Annotated[Optional[str], typer.Option(help="Target (default: the embedded SmolLM2-135M-Instruct).")]
    = None,
    dataset: Annotated[str, typer.Option(help="mt-bench, humaneval, spec-bench:PATH, jsonl:PATH, sharegpt, or "
                                         "sharegpt-heldout (ShareGPT prompts the head was not trained on).")]
    = "mt-bench",
    num_prompts: Annotated[int, typer.Option(min=1, help="Prompts (seeded sample; MT-Bench has 80).")] = 80,
    steps: Annotated[str, typer.Option(help="num_steps values, comma-separated.")] = "1,2,3,4,5",
    max_tokens: Annotated[int, typer.Option(min=1, help="Output tokens per prompt.")] = 256,
    dtype: Annotated[str, typer.Option(help="auto, native (the GGUF's quantized weights), bfloat16 or float32.")] = "bfloat16",
    batch: Annotated[int, typer.Option(min=1, help="Prompts decoded together.")] = 16,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the results as JSON.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the prompt sample.")] = 0,
) -> None:
    """Greedy acceptance length per num_steps, per draft position and per prompt category."""
    from rich.console import Console
    from rich.table import Table

    from spectune.backends.local.build import build_engine
    from spectune.backends.local.options import EngineOptions
    from spectune.loadgen.datasets import load_dataset
    from spectune.draft.evaluate import measure_acceptance

    try:
        ks = sorted({int(x) for x in steps.split(",") if x.strip()})
    except ValueError:
        raise UserError(f"bad --steps {steps!r}: use comma-separated integers like 1,2,3") from None
    if not ks or min(ks) < 1:
        raise UserError("--steps needs num_steps values >= 1")
    if dataset.strip().lower() == "sharegpt-heldout":
        from spectune.backends.local.options import resolve_draft
        from spectune.backends.local.weights.loader import is_default_model
        from spectune.draft.data import heldout_sharegpt

        head = resolve_draft(draft, is_default_model(model))
        if head is None:
            raise UserError("sharegpt-heldout needs a draft head: pass --draft PATH")
        prompts = heldout_sharegpt(head, num_prompts, seed)
    else:
        prompts = load_dataset(dataset, num_prompts, seed)
    engine = build_engine(EngineOptions(model=model, draft=draft, num_steps=max(ks), dtype=dtype,
                                        max_num_seqs=batch, max_model_len=2048, kv_cache_gb=2.0))
    fits = [p for p in prompts if len(engine.tokenizer.encode_chat(p.messages)) + max_tokens <= engine.context_len]
    if len(fits) < len(prompts):
        Console(stderr=True).print(f"warning: {len(prompts) - len(fits)} prompts longer than the context were left "
                                   "out", style="yellow", markup=False)
        prompts = fits
    console = Console()
    results = [measure_acceptance(engine, prompts, k, max_tokens) for k in ks]
    table = Table(title=f"acceptance length on {dataset} ({len(prompts)} prompts, greedy, {max_tokens} tokens)")
    table.add_column("num_steps", justify="right")
    table.add_column("acceptance length", justify="right")
    table.add_column("per-position acceptance", justify="left")
    for r in results:
        table.add_row(str(r.num_steps), f"{r.acceptance_length:.3f}", " ".join(f"{p:.2f}" for p in r.per_position))
    console.print(table)
    cats = sorted({c for r in results for c in r.per_category})
    if len(cats) > 1:
        by_cat = Table(title="acceptance length per category")
        by_cat.add_column("category")
        for r in results:
            by_cat.add_column(f"K={r.num_steps}", justify="right")
        for c in cats:
            by_cat.add_row(c, *(f"{r.per_category.get(c, float('nan')):.3f}" for r in results))
        console.print(by_cat)
    if json_out is not None:
        json_out.write_text(json.dumps({"dataset": dataset, "num_prompts": len(prompts), "max_tokens": max_tokens,
                                        "results": [asdict(r) for r in results]}, indent=2) + "\n")
