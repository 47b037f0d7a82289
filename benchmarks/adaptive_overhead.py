"""What adaptive num_steps costs while it sits at one num_steps: the bundled engine serving with an adaptive config
that keeps num_steps k vs a static-k engine, measured side by side in one process, for each k and batch size.

Engines on the default pair (SmolLM2-135M-Instruct + bundled EAGLE-3 head; ``--dtype``, ``--compile`` and
``--threads`` default to what the local backend's servers use: ``auto``, ``auto``, one fewer thread than the CPUs):

- ``static``: one engine sized for num_steps up to 2 and switched to k while idle (what the local sweep and validate
  backends do);
- ``adaptive``: per k, an engine whose SGLang config gives batch sizes 1-63 the ladder ``[k]`` and 64+ ``[2]`` (never
  reached here: it only makes the engine an adaptive, drafting-capable one, as a real config with a speculating
  slot does), with lazy drafting (the default: prefills and num_steps 0 rounds keep only the head's inputs);
- ``upkeep`` (the engine before lazy drafting, and SGLang's behaviour at num_steps 0: a draft extend every round,
  ``python/sglang/srt/speculative/eagle_worker_v2.py``): the same config with ``EngineOptions.draft_upkeep``;
- ``static2`` (the A/A control): a second static engine, the same as ``static``; its ratio is the noise floor.

The adaptive, upkeep and static2 engines share the static engine's weights (``build_engine(..., weights_of=static)``:
the same target and head modules, their own caches and policy), so they differ from it only in how they schedule
num_steps. Separately loaded copies of the weights (``--separate-weights``) ran 2.4% (k=1) and 3.8% (k=0) apart at
batch 1, static against static: an instance effect (where each copy's pages landed) that swamped the
1% question.

Two measurements:

1. **Per round at a fixed batch** (the engine's own cost, no arrivals): each engine holds the same B greedy requests
   (MT-Bench prompts, ``ignore_eos``), all prefilled and past their first rounds; then chunks of ``--chunk-rounds``
   decode rounds run in turn on each engine (order rotating every chunk) ``--chunks`` times. Because the engines
   generate the same tokens, chunk i of every engine covers the same positions, so the per-chunk time ratios are
   paired exactly; the interval is the mean ratio +- 1.96 standard errors over the chunks.
2. **Closed-loop windows** (``--windows``; what a server sees: finished requests replaced at once, prefills mixed in):
   static vs adaptive, ``--rounds`` windows of ``--window`` s each, alternating; output tokens/s and output tokens per
   CPU second of this process (``time.process_time``), with a percentile bootstrap over the paired windows. At
   concurrency 32 the windows swing by 20-30% with the requests' life cycles, so this needs many rounds for 1%.

Usage: ``python benchmarks/adaptive_overhead.py [--steps 0,1] [--batch 1,32] [--chunks 20] [--windows]``.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path


class ClosedLoop:
    """Keeps ``concurrency`` requests in an engine; counts the output tokens it emits. :meth:`close` aborts the
    requests in flight and steps the engine until it is idle."""

    def __init__(self, engine, prompts: list[list[int]], concurrency: int, max_tokens: int, tag: str) -> None:
        from spectune.backends.local.engine.sequence import SamplingParams

        self.engine, self.prompts, self.tag = engine, prompts, tag
        self.params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        self.next, self.tokens, self.finished, self.live = 0, 0, 0, set()
        for _ in range(concurrency):
            self._add()

    def _add(self) -> None:
        i, self.next = self.next, self.next + 1
        rid = f"{self.tag}-{i}"
        self.live.add(rid)

        def on_output(out) -> None:
            self.tokens += len(out.new_token_ids)
            if out.finished:
                self.finished += 1
                self.live.discard(out.request_id)

        self.engine.add_request(rid, self.prompts[i % len(self.prompts)], self.params, on_output)

    def run(self, seconds: float) -> tuple[int, float]:
        """Step for ``seconds`` s of wall time; returns (tokens emitted, CPU seconds this process used)."""
        start_tokens, done = self.tokens, self.finished
        end, cpu = time.perf_counter() + seconds, time.process_time()
        while time.perf_counter() < end:
            self.engine.step()
            while done < self.finished:
                done += 1
                self._add()
        return self.tokens - start_tokens, time.process_time() - cpu

    def close(self) -> None:
        for rid in list(self.live):
            self.engine.abort(rid)
        while self.engine.num_running or self.engine.num_waiting or self.engine._aborts:
            self.engine.step()


def ratio_interval(a: list[float], b: list[float], reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap of sum(a) / sum(b) over paired windows."""
    rng = random.Random(seed)
    n, out = len(a), []
    for _ in range(reps):
        idx = [rng.randrange(n) for _ in range(n)]
        out.append(sum(a[i] for i in idx) / max(1e-9, sum(b[i] for i in idx)))
    out.sort()
    return out[int(0.025 * reps)], out[int(0.975 * reps) - 1]


def fixed_batch(engines: dict, prompts: list[list[int]], k: int, batch: int, chunk_rounds: int, chunks: int,
                warm_rounds: int = 6) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per-round time (ms) of each engine in chunks of ``chunk_rounds`` rounds at a fixed batch of ``batch`` requests.

    Returns:
        wall-clock and CPU (``time.process_time`` of this process) ms per round: engine name -> one value per chunk
        (``chunks`` values, chunk i of every engine at the same positions).
    """
    from spectune.backends.local.engine.sequence import SamplingParams

    params = SamplingParams(max_tokens=(warm_rounds + chunk_rounds * chunks) * (k + 1) + 8, temperature=0.0,
                            ignore_eos=True)
    names = list(engines)
    for name, engine in engines.items():
        for i in range(batch):
            engine.add_request(f"fixed-{name}-{k}-{batch}-{i}", prompts[i % len(prompts)], params, lambda out: None)
        for _ in range(warm_rounds):  # prefills, the catch-up of lazy drafting, new shapes
            engine.step()
        if engine.num_running != batch:
            raise SystemExit(f"{name}: {engine.num_running} of {batch} requests running (raise --kv-cache-gb)")
    ms, cpu_ms = {n: [] for n in names}, {n: [] for n in names}
    for c in range(chunks):
        for name in names[c % len(names):] + names[: c % len(names)]:
            engine, t0, c0 = engines[name], time.perf_counter(), time.process_time()
            for _ in range(chunk_rounds):
                engine.step()
            ms[name].append((time.perf_counter() - t0) * 1000 / chunk_rounds)
            cpu_ms[name].append((time.process_time() - c0) * 1000 / chunk_rounds)
    for name, engine in engines.items():
        for i in range(batch):
            engine.abort(f"fixed-{name}-{k}-{batch}-{i}")
        while engine.num_running or engine.num_waiting or engine._aborts:
            engine.step()
    return ms, cpu_ms


def mean_interval(ratios: list[float]) -> tuple[float, float, float]:
    """Mean of paired ratios and its 95% normal interval (mean +- 1.96 standard errors)."""
    n = len(ratios)
    m = sum(ratios) / n
    sd = (sum((r - m) ** 2 for r in ratios) / max(1, n - 1)) ** 0.5
    return m, m - 1.96 * sd / n**0.5, m + 1.96 * sd / n**0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="0,1", help="num_steps k to sit at, comma-separated (0..2)")
    parser.add_argument("--batch", default="1,32", help="fixed batch sizes for the per-round measurement")
    parser.add_argument("--chunks", type=int, default=20, help="chunks per engine (per-round measurement)")
    parser.add_argument("--chunk-rounds", type=int, default=8, help="decode rounds per chunk")
    parser.add_argument("--windows", action="store_true", help="also run the closed-loop windows")
    parser.add_argument("--concurrency", default="1,32", help="closed-loop concurrencies, comma-separated")
    parser.add_argument("--window", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=float, default=6.0, help="uncounted seconds per engine before each k, "
                        "closed loop")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--compile", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: what the local backend's "
                        "servers use, one fewer than the CPUs)")
    parser.add_argument("--separate-weights", action="store_true", help="load the weights once per engine (the "
                        "instance effect included) instead of sharing the static engine's")
    args = parser.parse_args()
    steps = [int(x) for x in args.steps.split(",")]
    batches = [int(x) for x in args.batch.split(",")]
    concs = [int(x) for x in args.concurrency.split(",")] if args.windows else []

    import torch
    from rich.console import Console
    from rich.table import Table

    from spectune.backends.local.backend import engine_threads
    from spectune.backends.local.build import build_engine
    from spectune.backends.local.options import EngineOptions
    from spectune.loadgen.datasets import load_dataset

    folder = Path(tempfile.mkdtemp())
    common = dict(max_num_seqs=max(batches + concs), max_model_len=1024, num_steps_capacity=2, dtype=args.dtype,
                  compile=args.compile, kv_cache_gb=4.0, threads=args.threads or engine_threads())
    console = Console(width=150)
    t0 = time.perf_counter()
    static = build_engine(EngineOptions(num_steps=0, **common))
    shared = None if args.separate_weights else static
    static2 = build_engine(EngineOptions(num_steps=0, **common), weights_of=shared)
    adaptive, upkeep = {}, {}
    for k in steps:
        cfg = folder / f"sit-{k}.json"
        cfg.write_text(json.dumps({"1": {"candidate_steps": [k]}, "64": {"candidate_steps": [2]}}))
        adaptive[k] = build_engine(EngineOptions(num_steps=k, adaptive_config=str(cfg), **common), weights_of=shared)
        upkeep[k] = build_engine(EngineOptions(num_steps=k, adaptive_config=str(cfg), draft_upkeep=True, **common),
                                 weights_of=shared)
    console.print(f"engines built in {time.perf_counter() - t0:.0f} s; path {static.path.name if static.path else '?'}"
                  f", compile {args.compile}, {torch.get_num_threads()} threads; weights "
                  f"{'loaded per engine' if args.separate_weights else 'shared with the static engine'}")
    tok = static.tokenizer
    prompts = [tok.encode_chat(p.messages) for p in load_dataset("mt-bench", 80, 0)]

    rounds = Table(title=f"per round at a fixed batch: {args.chunks} chunks of {args.chunk_rounds} rounds per engine, "
                         "rotating order; time ratio vs static (< 1 is faster), mean [95%]")
    for col in ("k", "batch", "clock", "static ms/round", "static2 ms/round", "static2 / static (A/A)",
                "adaptive ms/round", "adaptive / static", "upkeep ms/round", "upkeep / static"):
        rounds.add_column(col, justify="right")
    for k in steps:
        static.set_num_steps(k)
        static2.set_num_steps(k)
        for b in batches:
            with console.status(f"k={k} batch {b}: per-round chunks"):
                both = fixed_batch({"static": static, "static2": static2, "adaptive": adaptive[k],
                                    "upkeep": upkeep[k]}, prompts, k, b, args.chunk_rounds, args.chunks)
            for clock, ms in zip(("wall", "CPU"), both):
                row = [str(k), str(b), clock, f"{sorted(ms['static'])[len(ms['static']) // 2]:.2f}"]
                for name in ("static2", "adaptive", "upkeep"):
                    m, lo, hi = mean_interval([x / y for x, y in zip(ms[name], ms["static"])])
                    row += [f"{sorted(ms[name])[len(ms[name]) // 2]:.2f}", f"{m:.4f} [{lo:.4f}, {hi:.4f}]"]
                    console.print(f"k={k} batch={b} {clock}: {name}/static time per round {m:.4f} [{lo:.4f}, "
                                  f"{hi:.4f}]")
                rounds.add_row(*row)
    console.print(rounds)
    console.print("ms/round: medians over the chunks; CPU: this process's CPU time (time.process_time), which a "
                  "machine shared with other busy processes disturbs far less than the wall clock")
    if not concs:
        return
    table = Table(title=f"static k vs adaptive sitting at k: closed loop, MT-Bench, up to {args.max_tokens} tokens, "
                        f"greedy, {args.rounds} x {args.window:g} s windows per engine, alternating")
    for col in ("k", "concurrency", "static tok/s", "adaptive tok/s", "adaptive / static, 95%", "static tok/CPU-s",
                "adaptive tok/CPU-s", "adaptive / static, 95%", "static windows tok/s", "adaptive windows tok/s",
                "switches"):
        table.add_column(col, justify="right")
    for k in steps:
        static.set_num_steps(k)
        for c in concs:
            engines = {"static": static, "adaptive": adaptive[k]}
            switches0 = adaptive[k].stats.num_steps_switches
            loops = {n: ClosedLoop(e, prompts, c, args.max_tokens, f"{n}-{k}-{c}") for n, e in engines.items()}
            for loop in loops.values():  # warm-up (new shapes, first prefills): not counted
                loop.run(args.warmup)
            per = {n: [] for n in loops}  # per window: (tokens, CPU s)
            with console.status("") as status:
                for r in range(args.rounds):
                    order = ["static", "adaptive"] if r % 2 == 0 else ["adaptive", "static"]
                    for name in order:
                        status.update(f"k={k} c={c} round {r + 1}/{args.rounds}: {name}")
                        per[name].append(loops[name].run(args.window))
            for loop in loops.values():
                loop.close()
            wall = {n: [t / args.window for t, _ in v] for n, v in per.items()}
            cpu = {n: [t / max(cs, 1e-9) for t, cs in v] for n, v in per.items()}
            row = [str(k), str(c)]
            for m in (wall, cpu):
                s, a = sum(m["static"]) / len(m["static"]), sum(m["adaptive"]) / len(m["adaptive"])
                lo, hi = ratio_interval(m["adaptive"], m["static"])
                row += [f"{s:.1f}", f"{a:.1f}", f"{a / s:.3f}x [{lo:.3f}, {hi:.3f}]"]
                console.print(f"k={k} c={c} {'wall' if m is wall else 'CPU'}: static {s:.1f}, adaptive {a:.1f} "
                              f"({a / s:.3f}x [{lo:.3f}, {hi:.3f}])")
            row += [" ".join(f"{x:.0f}" for x in wall["static"]), " ".join(f"{x:.0f}" for x in wall["adaptive"]),
                    str(adaptive[k].stats.num_steps_switches - switches0)]
            table.add_row(*row)
    console.print(table)
    console.print("tok/CPU-s: output tokens per CPU second of this process (time.process_time): on a machine shared "
                  "with other busy processes it is far steadier than wall-clock tok/s, which counts the time the "
                  "engine waited for a core")


if __name__ == "__main__":
    main()
