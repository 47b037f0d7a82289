"""What adaptive num_steps costs at high concurrency, where its policy runs num_steps 0: the bundled engine with an
adaptive config vs static num_steps 0, measured side by side in one process.

Three engines on the default pair (SmolLM2-135M-Instruct + bundled EAGLE-3 head, bf16): static K=0 (the baseline),
adaptive with lazy drafting (what ``spectune serve --adaptive-config`` runs: prefills and K=0 rounds keep only the
head's inputs), and adaptive with an always-current head (every prefill and K=0 round also runs the head, the
engine's behaviour before lazy drafting). Each runs a closed loop of ``--concurrency`` MT-Bench requests (a
finished request is replaced at once, greedy, up to ``--max-tokens`` tokens) in windows of ``--window`` seconds,
rotating through the engines ``--rounds`` times, so a drift of the machine's speed hits all three alike. Output
tokens/s = tokens emitted in an engine's windows / their total length. The config gives batch size 1-2 num_steps 2
and 3+ num_steps 0 (``--config`` to change).

Usage: ``python benchmarks/adaptive_overhead.py [--concurrency 32] [--window 8] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

DEFAULT_CONFIG = {"ema_alpha": 0.2, "update_interval": 5, "warmup_batches": 10,
                  "1": {"candidate_steps": [2, 3]}, "3": {"candidate_steps": [0]}}


class ClosedLoop:
    """Keeps ``concurrency`` requests in an engine; counts the output tokens it emits."""

    def __init__(self, engine, prompts: list[list[int]], concurrency: int, max_tokens: int) -> None:
        from spectune.backends.local.sequence import SamplingParams

        self.engine, self.prompts, self.params = engine, prompts, SamplingParams(max_tokens=max_tokens,
                                                                                temperature=0.0)
        self.next, self.tokens, self.finished = 0, 0, 0
        for _ in range(concurrency):
            self._add()

    def _add(self) -> None:
        i, self.next = self.next, self.next + 1

        def on_output(out) -> None:
            self.tokens += len(out.new_token_ids)
            if out.finished:
                self.finished += 1

        self.engine.add_request(str(i), self.prompts[i % len(self.prompts)], self.params, on_output)

    def run(self, seconds: float) -> int:
        """Step for ``seconds`` s; returns the tokens emitted."""
        start_tokens, done = self.tokens, self.finished
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            self.engine.step()
            while done < self.finished:
                done += 1
                self._add()
        return self.tokens - start_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--window", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--config", type=Path, default=None, help="SGLang adaptive config (default: see above)")
    args = parser.parse_args()

    import torch
    from rich.console import Console
    from rich.table import Table

    from spectune.backends.local.build import EngineOptions, build_engine
    from spectune.loadgen.datasets import load_dataset

    config = args.config
    if config is None:
        config = Path(tempfile.mkdtemp()) / "adaptive.json"
        config.write_text(json.dumps(DEFAULT_CONFIG))
    common = dict(max_num_seqs=args.concurrency, max_model_len=2048, num_steps_capacity=3,
                  kv_cache_gb=args.concurrency * 2056 * 32768 / 2**30, dtype="bfloat16")
    engines = {"static K=0": build_engine(EngineOptions(num_steps=0, **common)),
               "adaptive, lazy drafting": build_engine(EngineOptions(num_steps=3, adaptive_config=str(config),
                                                                     **common)),
               "adaptive, head always current": build_engine(EngineOptions(num_steps=3,
                                                                           adaptive_config=str(config), **common))}
    engines["adaptive, head always current"].runner.lazy = False  # before any request: the eager path throughout
    tok = engines["static K=0"].tokenizer
    prompts = [tok.encode_chat(p.messages) for p in load_dataset("mt-bench", 80, 0)]
    loops = {name: ClosedLoop(e, prompts, args.concurrency, args.max_tokens) for name, e in engines.items()}
    for loop in loops.values():  # warm-up: the first window of every engine is not counted
        loop.run(2.0)
    tokens = dict.fromkeys(loops, 0)
    per_window: dict[str, list[float]] = {n: [] for n in loops}
    console = Console(width=140)
    with console.status("") as status:
        for r in range(args.rounds):
            names = list(loops)
            for name in names[r % 3:] + names[:r % 3]:
                status.update(f"round {r + 1}/{args.rounds}: {name}")
                n = loops[name].run(args.window)
                tokens[name] += n
                per_window[name].append(n / args.window)
    base = tokens["static K=0"] / (args.window * args.rounds)
    table = Table(title=f"closed loop at concurrency {args.concurrency}, MT-Bench, up to {args.max_tokens} tokens, "
                        f"greedy, {args.rounds} x {args.window:g} s windows per engine, bf16, "
                        f"{torch.get_num_threads()} threads")
    for col in ("engine", "output tok/s", "vs static K=0", "per window", "rounds", "switches", "acceptance length"):
        table.add_column(col, justify="right")
    for name, e in engines.items():
        tps = tokens[name] / (args.window * args.rounds)
        table.add_row(name, f"{tps:.1f}", f"{tps / base:.3f}x", " ".join(f"{x:.0f}" for x in per_window[name]),
                      str(e.stats.num_rounds), str(e.stats.num_steps_switches), f"{e.stats.avg_accept_length:.2f}")
    console.print(table)


if __name__ == "__main__":
    main()
