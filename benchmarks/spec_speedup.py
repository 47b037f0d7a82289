"""Batch-1 speculative decoding speedup of the default pair on real prompts, every num_steps in one run.

One engine (SmolLM2-135M-Instruct + the bundled EAGLE-3 head, bf16, this machine's threads) serves one request at
a time, as a single user would see it. For each prompt the num_steps values run back to back in a rotated order
(prompt i starts at the i-th value), so slow drifts of the machine's speed hit every K alike. Greedy, EOS
respected: speculative decoding is lossless, so every K produces the same text (the script counts the prompts
where bf16 rounding made a K diverge). Output tokens/s = output tokens / wall time including prefill (what a user
waits for); the speedup column divides by K=0's tokens/s from the same run. Acceptance length = 1 + accepted
drafts / verify steps (EAGLE papers' tau; SGLang's accept length).

Usage: ``python benchmarks/spec_speedup.py [--dataset mt-bench] [--num-prompts 24] [--max-tokens 128]
[--steps 0,1,2,3,4] [--dtype bfloat16] [--compile off]`` (spec-bench:PATH works too; ``--dtype``, ``--compile`` as
``spectune serve``'s). About 30 s per prompt on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mt-bench")
    parser.add_argument("--num-prompts", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--steps", default="0,1,2,3,4")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16", help="engine compute path (auto, native, bfloat16, float32)")
    parser.add_argument("--compile", default="off", help="torch.compile of the target's batched layers (auto, on, off)")
    args = parser.parse_args()
    steps = [int(x) for x in args.steps.split(",")]
    if 0 not in steps:
        parser.error("--steps must include 0 (the baseline)")

    import torch
    from rich.console import Console
    from rich.table import Table

    from spectune.backends.local.build import build_engine
    from spectune.backends.local.options import EngineOptions
    from spectune.backends.local.engine.sequence import SamplingParams
    from spectune.loadgen.datasets import load_dataset

    engine = build_engine(EngineOptions(num_steps=0, num_steps_capacity=max(steps), dtype=args.dtype,
                                        max_num_seqs=1, max_model_len=2048, kv_cache_gb=1.0, compile=args.compile))
    prompts = [engine.tokenizer.encode_chat(p.messages) for p in load_dataset(args.dataset, args.num_prompts,
                                                                              args.seed)]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    for k in steps:  # warm-up: every shape once
        engine.set_num_steps(k)
        engine.generate([prompts[0]], SamplingParams(max_tokens=16, temperature=0.0))
    tokens = dict.fromkeys(steps, 0)
    seconds = dict.fromkeys(steps, 0.0)
    verify = dict.fromkeys(steps, 0)
    accepted = dict.fromkeys(steps, 0)
    per_prompt: dict[int, list[float]] = {k: [] for k in steps}
    diverged = 0
    console = Console(width=140)
    with console.status("") as status:
        for i, ids in enumerate(prompts):
            order = steps[i % len(steps):] + steps[:i % len(steps)]
            outs = {}
            for k in order:
                status.update(f"prompt {i + 1}/{len(prompts)}, num_steps {k}")
                engine.set_num_steps(k)
                before = (engine.stats.spec.verify_steps, engine.stats.spec.accepted_tokens)
                t = time.perf_counter()
                outs[k] = engine.generate([ids], params)[0]
                dt = time.perf_counter() - t
                tokens[k] += len(outs[k])
                seconds[k] += dt
                per_prompt[k].append(len(outs[k]) / dt)
                verify[k] += engine.stats.spec.verify_steps - before[0]
                accepted[k] += engine.stats.spec.accepted_tokens - before[1]
            diverged += any(outs[k] != outs[0] for k in steps)

    base = tokens[0] / seconds[0]
    table = Table(title=f"batch 1, {args.dataset} ({len(prompts)} prompts, up to {args.max_tokens} tokens, greedy), "
                        f"SmolLM2-135M-Instruct + bundled EAGLE-3 head, path {engine.path.name}, compile "
                        f"{'on' if engine.path.compile['active'] else 'off'}, {torch.get_num_threads()} threads, "
                        f"{engine.decoder.device.type}")
    for col in ("num_steps", "output tokens", "seconds", "output tok/s", "speedup vs K=0",
                "median per-prompt speedup", "acceptance length"):
        table.add_column(col, justify="right")
    for k in steps:
        tps = tokens[k] / seconds[k]
        ratios = [a / b for a, b in zip(per_prompt[k], per_prompt[0])]
        al = 1.0 + accepted[k] / verify[k] if verify[k] else 1.0
        table.add_row(str(k), str(tokens[k]), f"{seconds[k]:.1f}", f"{tps:.1f}", f"{tps / base:.2f}x",
                      f"{statistics.median(ratios):.2f}x", f"{al:.3f}")
    console.print(table)
    best = max(steps, key=lambda k: tokens[k] / seconds[k])
    console.print(f"best num_steps {best}: {tokens[best] / seconds[best]:.1f} vs {base:.1f} tok/s at num_steps 0 "
                  f"= {tokens[best] / seconds[best] / base:.2f}x; prompts whose output differed between num_steps "
                  f"(bf16 rounding): {diverged}/{len(prompts)}")


if __name__ == "__main__":
    main()
