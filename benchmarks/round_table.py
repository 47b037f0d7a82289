"""Decode round (ms) per batch size x num_steps for each native path choice, side by side in one run.

Which rows the native path's linears run on the int4 kernel and which on the dense copy (``--native-dense-above``)
decides what a round costs at each (batch, num_steps): a verify reads batch x (num_steps + 1) rows. This script builds
one engine of the embedded default pair per ``--choices`` entry (a ``--native-dense-above`` value: ``auto`` is what the
start-up probe picks, ``off`` the int4 kernel at every row count, a number a forced row count), each compiled as the
sweep's server is (``--compile on``, one torch thread as ``engine_threads`` gives a 2-core machine), and times decode
rounds on the engine's own decoder: for each batch b of ``--batches`` and K of ``--steps``, b chat prompts are
prefilled into slots 0..b-1 and ``--rounds`` rounds of K drafts are timed after two untimed ones (greedy; the mean).
Repeats are interleaved (choice A's whole table, B's, C's, then A again) and the median per cell is printed, with the
engine's own step model's prediction for the ``auto`` engine and the main job's cells for comparison where given.

It also prints what the crossover probe picks with its weights cache-resident (the probe before issue #71) and streamed
from DRAM up to 16 rows (now), so the old choice can be named as a ``--choices`` entry.

``old`` in ``--choices`` is the row count the cache-resident probe picked in this run. A ``+pytorch`` suffix builds
that choice with ``--cpu-kernels off`` (PyTorch's SDPA, int8 and int4 kernels instead of spectune's,
``backends/local/kernels``): ``--choices auto,auto+pytorch`` measures what the kernels change.

Usage: ``python benchmarks/round_table.py [--choices auto,old,off] [--batches 1,2,4,8,16] [--steps 0,1,2,3]
[--rounds 12] [--repeats 3]``. Prints a Markdown table per choice and the ratio of each K's round to the previous K's.
"""

from __future__ import annotations

import argparse
import statistics
import time

PROMPTS = ["Write a short story about a robot learning to paint.", "Explain how a refrigerator works.",
           "What are the benefits of regular exercise?", "Describe the water cycle.",
           "Give me a recipe for pancakes.", "Why do cats purr?", "Summarize the plot of Hamlet.",
           "How do airplanes stay in the air?"]


def one_thread() -> None:
    """One torch thread, as ``engine_threads`` gives the sweep's server on a 2-core machine, and the line naming the
    CPU, torch and the load average that every figure of these scripts is printed under."""
    import torch

    from spectune.measure.environment import environment

    torch.set_num_threads(1)
    host = environment()["host"]
    print(f"CPU: {host.get('cpu')}; torch {torch.__version__}; load average {host.get('load_average')}")


def ints(text: str) -> list[int]:
    """``"1,4,16"`` -> [1, 4, 16]."""
    return [int(x) for x in text.split(",")]


def make_engine(choice: str, capacity: int, slots: int, draft_quant: str = "auto"):
    """The default pair on the native path with ``--native-dense-above`` the ``choice`` (``+pytorch``: and
    ``--cpu-kernels off``) and ``--draft-quant`` ``draft_quant``, compiled, one thread."""
    from spectune.backends.local.build import build_engine
    from spectune.backends.local.options import EngineOptions

    dense_above, pytorch, _ = choice.partition("+pytorch")
    return build_engine(EngineOptions(num_steps=0, num_steps_capacity=capacity, dtype="native", max_num_seqs=slots,
                                      max_model_len=512, kv_cache_gb=1.0, threads=1, native_dense_above=dense_above,
                                      compile="on", cpu_kernels="off" if pytorch else "auto",
                                      draft_quant=draft_quant))


def round_ms(engine, prompts: list[list[int]], batch: int, k: int, rounds: int) -> float:
    """Mean wall time of ``rounds`` decode rounds at ``batch`` x ``k`` (after two untimed), ms."""
    from spectune.backends.local.engine.sampling import SamplingTensors

    dec = engine.decoder
    st = SamplingTensors.build([0.0] * batch, [0] * batch, [1.0] * batch, dec.device)
    ids = [prompts[i % len(prompts)] for i in range(batch)]
    dec.prefill(list(range(batch)), ids, st, dec.head is not None)
    times = []
    for i in range(rounds + 2):
        t = time.perf_counter()
        dec.decode_round(batch, k, st)
        if i >= 2:
            times.append(time.perf_counter() - t)
    return statistics.mean(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--choices", default="auto,old,off", help="--native-dense-above values, one engine each "
                        "(old: the row count the cache-resident probe picks in this run)")
    parser.add_argument("--batches", default="1,2,4,8,16")
    parser.add_argument("--steps", default="0,1,2,3")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import torch

    from spectune.backends.local.model.config import ModelConfig
    from spectune.backends.local.weights.compute_paths import crossover, dense_crossover
    from spectune.backends.local.weights.loader import convert_gguf, resolve_model_path

    one_thread()
    import json

    cfg = ModelConfig.from_hf(json.loads((convert_gguf(resolve_model_path(None)) / "config.json").read_text()))
    answers = {}
    with torch.inference_mode():
        for label, stream in (("cache-resident (before #71)", 0), ("streamed up to 16 rows (now)", 16)):
            probe = dense_crossover(cfg, stream_rows=stream)
            rows = probe["rows_ms"]
            kind = probe["dense_dtype"]
            answers[stream] = crossover(rows, kind)
            print(f"probe {label}: dense {kind} above {answers[stream]} rows; int4 / {kind} ms at "
                  + ", ".join(f"{r} rows {rows['int4'][r]:.3f}/{rows[kind][r]:.3f}" for r in ("1", "2", "4", "8", "16")))
    batches, steps = ints(args.batches), ints(args.steps)
    # "old": the row count the cache-resident probe picked just now
    old = str(answers[0] if answers[0] is not None else "off")
    choices = [old + c[3:] if c.startswith("old") else c for c in args.choices.split(",")]
    engines = {}
    for c in choices:
        t = time.perf_counter()
        engines[c] = make_engine(c, max(steps), max(batches))
        e = engines[c]
        print(f"engine --native-dense-above {c}: {e.path.to_json()['kernel_ranges']} "
              f"(built in {time.perf_counter() - t:.0f} s)")
    tok = next(iter(engines.values())).tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    cells: dict[str, dict[tuple[int, int], list[float]]] = {c: {} for c in choices}
    for rep in range(args.repeats):
        for c in choices:
            for b in batches:
                for k in steps:
                    cells[c].setdefault((b, k), []).append(round_ms(engines[c], prompts, b, k, args.rounds))
        print(f"repeat {rep + 1} of {args.repeats} done")
    for c in choices:
        model = engines[c].guard.model
        print(f"\n--native-dense-above {c} ({engines[c].path.to_json()['kernel_ranges']}): decode round, ms "
              f"(median of {args.repeats}; K/K-1 ratio; step model's prediction)")
        print("| batch | " + " | ".join(f"K={k}" for k in steps) + " |")
        print("|---:|" + "---:|" * len(steps))
        for b in batches:
            row = []
            for i, k in enumerate(steps):
                med = statistics.median(cells[c][(b, k)])
                text = f"{med:.1f}"
                if i:
                    text += f" ({med / statistics.median(cells[c][(b, steps[i - 1])]):.2f}x)"
                if model is not None:
                    text += f" [{model.predict_ms(b, k):.1f}]"
                row.append(text)
            print(f"| {b} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
