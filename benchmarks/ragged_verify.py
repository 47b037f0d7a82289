"""Rows of different draft lengths in one verify: padded (batched, compiled) versus packed (each row's own tokens).

With a per-row draft-length rule (``p_min`` / ``specdec``) the rows of a round verify different lengths L_b. The
engine can run the target over them two ways (``SpeculativeDecoder.verify_layout``):

- ``padded``: every row to the longest row's width, [B, max L_b + 1], one batched forward (the compiled decode path on
  CPU; captured graphs on CUDA); the padding's rows are computed and thrown away;
- ``packed``: each row's own L_b + 1 tokens concatenated, [1, sum(L_b + 1)], one packed forward (eager, attention per
  row), no wasted rows.

This script builds one engine of the embedded default pair with the rule (native int4 path, ``--compile on``, one torch
thread, as the sweep's server on a 2-core machine) and, for each batch of ``--batches``, prefills b chat prompts and
times ``--rounds`` decode rounds per layout after two untimed ones, the layouts interleaved per repeat (same prompts,
same lengths: greedy drafting is deterministic). It prints per batch the mean round (ms) of each layout (median of the
repeats), the rows each verified and the padded/packed ratio.

Usage: ``python benchmarks/ragged_verify.py [--p-min 0.6] [--n-max 4] [--batches 2,4,8,16] [--rounds 10]
[--repeats 3] [--device cpu]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

PROMPTS = ["Write a short story about a robot learning to paint.", "Explain how a refrigerator works.",
           "What are the benefits of regular exercise?", "Describe the water cycle.",
           "Give me a recipe for pancakes.", "Why do cats purr?", "Summarize the plot of Hamlet.",
           "How do airplanes stay in the air?"]


def rounds_ms(engine, prompts: list[list[int]], batch: int, layout: str, rounds: int) -> tuple[float, float, float]:
    """(mean round ms, mean padded rows, mean packed rows) of ``rounds`` rounds at ``batch`` in ``layout``."""
    from spectune.backends.local.engine.sampling import SamplingTensors

    dec = engine.decoder
    dec.verify_layout = layout
    st = SamplingTensors.build([0.0] * batch, [0] * batch, [1.0] * batch, dec.device)
    dec.prefill(list(range(batch)), [prompts[i % len(prompts)] for i in range(batch)], st, True)
    times, padded, packed = [], [], []
    for i in range(rounds + 2):
        t = time.perf_counter()
        dec.decode_round(batch, engine.cfg.num_steps, st)
        if dec.device.type == "cuda":
            import torch

            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t)
            drafted = dec.last_round.drafted
            padded.append(batch * (max(drafted) + 1))
            packed.append(sum(n + 1 for n in drafted))
    return statistics.mean(times) * 1e3, statistics.mean(padded), statistics.mean(packed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p-min", type=float, default=0.6)
    parser.add_argument("--n-max", type=int, default=4)
    parser.add_argument("--batches", default="2,4,8,16")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    import torch

    from spectune.backends.local.build import build_engine
    from spectune.backends.local.options import EngineOptions
    from spectune.measure.environment import environment

    if args.device == "cpu":
        torch.set_num_threads(1)
    host = environment()["host"]
    print(f"CPU: {host.get('cpu')}; torch {torch.__version__}; load average {host.get('load_average')}")
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"strategy": "p_min", "p_min": args.p_min, "n_max": args.n_max}, f)
    cpu = args.device == "cpu"
    engine = build_engine(EngineOptions(num_steps=0, adaptive_config=f.name, device=args.device,
                                        dtype="native" if cpu else "bfloat16", max_num_seqs=max(batches),
                                        max_model_len=512, kv_cache_gb=1.0, threads=1 if cpu else 0,
                                        compile="on" if cpu else "off"))
    tok = engine.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    cells: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
    with torch.inference_mode():
        for rep in range(args.repeats):
            for b in batches:
                for layout in ("padded", "packed"):
                    cells.setdefault((b, layout), []).append(rounds_ms(engine, prompts, b, layout, args.rounds))
            print(f"repeat {rep + 1} of {args.repeats} done")
    print(f"\np_min {args.p_min}, n_max {args.n_max}: decode round, ms (median of {args.repeats} repeats of "
          f"{args.rounds} rounds)")
    print("| batch | padded ms | packed ms | padded / packed | rows padded | rows packed |")
    print("|---:|---:|---:|---:|---:|---:|")
    for b in batches:
        pad = statistics.median(c[0] for c in cells[(b, "padded")])
        pack = statistics.median(c[0] for c in cells[(b, "packed")])
        rows_pad = statistics.mean(c[1] for c in cells[(b, "padded")])
        rows_pack = statistics.mean(c[2] for c in cells[(b, "packed")])
        print(f"| {b} | {pad:.2f} | {pack:.2f} | {pad / pack:.2f} | {rows_pad:.1f} | {rows_pack:.1f} |")


if __name__ == "__main__":
    main()
