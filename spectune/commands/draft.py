"""``spectune draft train`` and ``spectune draft eval``: build and measure EAGLE heads."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer

from spectune.core.errors import UserError

app = typer.Typer(no_args_is_help=True)

# Options several draft commands share, written once (the command gives the default in its signature)
Threads = Annotated[int, typer.Option(min=0, help="torch CPU threads (0 = default).")]
Target = Annotated[Optional[str], typer.Option(help="Target (default: the embedded SmolLM2-135M-Instruct).")]
PromptSeed = Annotated[int, typer.Option(help="Seed of the prompt sample.")]
MaxNewTokens = Annotated[int, typer.Option(min=1, help="Response length cap, tokens.")]
MaxPromptTokens = Annotated[int, typer.Option(min=8, help="Longer prompts are skipped.")]


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
    max_new_tokens: MaxNewTokens = 256,
    spec_bench: Annotated[Optional[Path], typer.Option(help="Spec-Bench JSONL whose prompts are excluded from "
                                                       "training too (MT-Bench and HumanEval always are).")] = None,
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the data.")] = 3,
    draft_vocab_size: Annotated[int, typer.Option(min=16, help="Rows of the head's lm_head (most frequent "
                                                  "response tokens).")] = 8192,
    ttt_steps: Annotated[int, typer.Option(min=1, help="Training-time-test depth (unrolled draft steps).")] = 3,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW, warmup, cosine decay).")] = 5e-4,
    batch_tokens: Annotated[int, typer.Option(min=64, help="Padded tokens per training batch.")] = 4096,
    seed: Annotated[int, typer.Option(help="Seed for prompt order, initialisation and batching.")] = 0,
    threads: Threads = 0,
) -> None:
    """Train an EAGLE-3 head: self-distilled data, target features, training-time test; resumable by stage."""
    from rich.console import Console

    from spectune.draft.pipeline import STAGES, PipelineOptions, run_pipeline
    from spectune.draft.train import TrainConfig

    stages = _stages(stage, STAGES)
    _set_threads(threads)
    console = Console(stderr=True)
    opts = PipelineOptions(model=model, output=output, work_dir=work_dir, num_prompts=num_prompts,
                           magpie_prompts=magpie_prompts, max_new_tokens=max_new_tokens, spec_bench=spec_bench,
                           stages=stages)
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
    model: Target = None,
    dataset: Annotated[str, typer.Option(help="mt-bench, humaneval, spec-bench:PATH, jsonl:PATH, sharegpt, or "
                                         "sharegpt-heldout (ShareGPT prompts the head was not trained on).")]
    = "mt-bench",
    num_prompts: Annotated[int, typer.Option(min=1, help="Prompts (seeded sample; MT-Bench has 80).")] = 80,
    steps: Annotated[str, typer.Option(help="num_steps values, comma-separated.")] = "1,2,3,4,5",
    max_tokens: Annotated[int, typer.Option(min=1, help="Output tokens per prompt.")] = 256,
    dtype: Annotated[str, typer.Option(help="auto, native (the GGUF's quantized weights), bfloat16 or float32.")] = "bfloat16",
    batch: Annotated[int, typer.Option(min=1, help="Prompts decoded together.")] = 16,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the results as JSON.")] = None,
    seed: PromptSeed = 0,
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


@app.command("accept-train")
def accept_train(
    output: Annotated[Path, typer.Option(help="Folder for the acceptance head (config.json, model.safetensors, "
                                         "training.json).")],
    draft: Annotated[Optional[str], typer.Option(help="Frozen EAGLE-3 head whose drafts are judged (default: the "
                                                 "bundled SmolLM2 head).")] = None,
    model: Target = None,
    work_dir: Annotated[Path, typer.Option(help="Folder for prompts, responses, features, samples (resumable).")]
    = Path("work-data/accept"),
    stage: Annotated[str, typer.Option(help="all, or one of data, features, chain, train, export.")] = "all",
    num_prompts: Annotated[int, typer.Option(min=1, help="ShareGPT prompts the EAGLE head was not trained on, "
                                             "answered greedily by the target.")] = 96,
    max_new_tokens: MaxNewTokens = 128,
    max_prompt_tokens: MaxPromptTokens = 256,
    spec_bench: Annotated[Optional[Path], typer.Option(help="Spec-Bench JSONL whose prompts are excluded too "
                                                       "(MT-Bench and HumanEval always are).")] = None,
    n_max: Annotated[int, typer.Option(min=1, help="Draft steps per round unrolled for the data.")] = 4,
    w_rej: Annotated[float, typer.Option(min=0.01, help="Loss weight of rejected drafts (SpecDec++'s weighted "
                                         "BCE; accepted drafts weigh 1).")] = 3.0,
    width: Annotated[int, typer.Option(min=8, help="Width of the residual blocks.")] = 256,
    layers: Annotated[int, typer.Option(min=0, help="Residual blocks (SpecDec++'s depth D).")] = 3,
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the samples.")] = 10,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW, warm-up, cosine decay).")] = 1e-3,
    batch_size: Annotated[int, typer.Option(min=8, help="Samples per training batch.")] = 256,
    seed: Annotated[int, typer.Option(help="Seed for prompts, split, initialisation and batches.")] = 0,
    threads: Threads = 0,
) -> None:
    """Train an acceptance-prediction head (SpecDec++) on the frozen EAGLE-3 head's draft chains."""
    import sys

    from rich.console import Console

    from spectune.draft.acceptance_pipeline import TRAIN_STAGES, SampleOptions, run_train
    from spectune.draft.acceptance_train import AcceptanceTrainConfig

    stages = _stages(stage, TRAIN_STAGES)
    _set_threads(threads)
    head = _eagle_head(draft, model)
    console = Console(stderr=True)

    def prompts(tokenizer):
        from spectune.draft.acceptance_data import acceptance_prompts
        from spectune.draft.data import evaluation_texts

        return acceptance_prompts(tokenizer, head, num_prompts, max_prompt_tokens, evaluation_texts(spec_bench), seed)

    opts = SampleOptions(model=model, draft=head, work_dir=work_dir, max_new_tokens=max_new_tokens,
                         max_prompt_tokens=max_prompt_tokens, n_max=n_max)
    cfg = AcceptanceTrainConfig(n_max=n_max, width=width, num_layers=layers, w_rej=w_rej, epochs=epochs, lr=lr,
                                batch_size=batch_size, seed=seed)
    run_train(opts, output, prompts, cfg, stages,
              lambda msg: console.print(msg, highlight=False, markup=False),
              command="spectune " + " ".join(sys.argv[1:]))
    if stage in ("all", "export"):
        console.print(f"acceptance head written to {output}", highlight=False, markup=False)


@app.command("accept-eval")
def accept_eval(
    dataset: Annotated[str, typer.Option(help="Held-out prompts: spec-bench:PATH, mt-bench, humaneval, jsonl:PATH.")],
    acceptance_head: Annotated[Optional[Path], typer.Option(help="Acceptance head folder (default: the bundled "
                                                            "one).")] = None,
    draft: Annotated[Optional[str], typer.Option(help="Frozen EAGLE-3 head (default: the bundled SmolLM2 head).")]
    = None,
    model: Target = None,
    work_dir: Annotated[Path, typer.Option(help="Folder for this prompt set's responses, features and samples "
                                           "(reused by a rerun with the same prompts and heads).")]
    = Path("work-data/accept-eval"),
    num_prompts: Annotated[int, typer.Option(min=1, help="Prompts (seeded sample).")] = 160,
    max_tokens: Annotated[int, typer.Option(min=1, help="Greedy response length cap, tokens.")] = 128,
    max_prompt_tokens: MaxPromptTokens = 1024,
    bins: Annotated[int, typer.Option(min=2, help="Equal-width bins of the ECE and the reliability plot.")] = 10,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the calibration as JSON.")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Write the reliability plot (PNG).")] = None,
    seed: PromptSeed = 0,
    threads: Threads = 0,
) -> None:
    """Calibration of an acceptance head against the raw draft confidence: ECE, Brier, AUROC per draft step."""
    from collections import Counter

    import torch
    from rich.console import Console
    from rich.table import Table

    from spectune.backends.local.model.acceptance import BUNDLED_ACCEPTANCE_HEAD, load_acceptance_head
    from spectune.draft.acceptance_data import evaluation_prompts
    from spectune.draft.acceptance_pipeline import (SampleOptions, collect_samples, evaluate_samples, read_card,
                                                    sample_summary, write_card)
    from spectune.draft.calibration import reliability_plot

    _set_threads(threads)
    acc = load_acceptance_head(acceptance_head or BUNDLED_ACCEPTANCE_HEAD, torch.device("cpu"), torch.float32)
    head = _eagle_head(draft, model)
    err = Console(stderr=True)
    opts = SampleOptions(model=model, draft=head, work_dir=work_dir, max_new_tokens=max_tokens,
                         max_prompt_tokens=max_prompt_tokens, n_max=acc.cfg.n_max)
    card = read_card(work_dir)
    chain = card["stages"].get("chain", {})
    done = chain.get("n_max") == acc.cfg.n_max and (work_dir / "samples.pt").is_file()
    stages = () if done else ("data", "features", "chain")
    samples = collect_samples(opts, lambda tok: evaluation_prompts(tok, dataset, num_prompts, max_prompt_tokens, seed),
                              stages, card, lambda msg: err.print(msg, highlight=False, markup=False))
    if samples is None or len(samples["prob"]) == 0:
        raise UserError(f"no draft-chain samples in {work_dir}: give prompts whose responses are non-empty")
    result = evaluate_samples(acc, samples, bins)
    prompts = [json.loads(r) for r in (work_dir / "prompts.jsonl").read_text().splitlines() if r.strip()]
    categories = Counter(str(r.get("category")) for r in prompts)
    out = {"dataset": dataset, "prompts": len(prompts), "categories": dict(sorted(categories.items())),
           "max_tokens": max_tokens, "n_max": acc.cfg.n_max,
           "bins": bins, "binning": f"{bins} equal-width bins on [0, 1]",
           "predictors": {"head": "acceptance head p_hat", "draft_prob": "raw draft confidence (top-10 softmax)"},
           "acceptance_head": asdict(acc.cfg), **sample_summary(samples, acc.cfg.n_max), **result}
    write_card(work_dir, card)
    table = Table(title=f"calibration on {dataset} ({len(prompts)} prompts, {out['samples']} draft steps)")
    for col in ("draft step", "samples", "accepted", "ECE head", "ECE raw", "Brier head", "Brier raw", "AUROC head",
                "AUROC raw"):
        table.add_column(col, justify="right")
    for name, r in [(str(s["step"] + 1), s) for s in result["per_step"]] + [("all", result["overall"])]:
        h, d = r["head"], r["draft_prob"]
        table.add_row(name, str(h["samples"]), f"{h['acceptance_rate']:.3f}", f"{h['ece']:.4f}", f"{d['ece']:.4f}",
                      f"{h['brier']:.4f}", f"{d['brier']:.4f}", f"{h['auroc']:.3f}", f"{d['auroc']:.3f}")
    Console(width=max(Console().width, 110)).print(table)
    if json_out is not None:
        json_out.write_text(json.dumps(out, indent=2) + "\n")
    if plot is not None:
        reliability_plot(result, {"head": "acceptance head", "draft_prob": "draft confidence"}, plot,
                         f"reliability on {dataset.split(':')[0]} ({len(prompts)} prompts), {bins} bins")


def _stages(stage: str, known: tuple[str, ...]) -> tuple[str, ...]:
    """The stages ``--stage`` asks for: every one of ``known`` for ``all``, else the one named.

    Raises:
        UserError: a stage not in ``known`` (naming them).
    """
    if stage == "all":
        return known
    if stage not in known:
        raise UserError(f"unknown --stage {stage!r}: use all or one of {', '.join(known)}")
    return (stage,)


def _set_threads(threads: int) -> None:
    """``--threads``: torch's CPU threads (0 leaves torch's default)."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def _eagle_head(draft: str | None, model: str | None) -> Path:
    """The EAGLE head folder: ``--draft`` or the bundled head for the default target; UserError when neither."""
    from spectune.backends.local.options import resolve_draft
    from spectune.backends.local.weights.loader import is_default_model

    head = resolve_draft(draft, is_default_model(model))
    if head is None:
        raise UserError("acceptance heads judge an EAGLE head's drafts: pass --draft PATH")
    return head
