"""Where a decode round's time goes: the round per num_steps K beside its parts, timed one by one on the engine.

A round of num_steps K at batch b drafts K tokens per row (the head's first token from the last round's feature, then
K - 1 head forwards of one entry per row), verifies b x (K + 1) rows in one target forward and its lm_head, and runs
the head's extend over the K + 1 entries per row (:meth:`spectune.backends.local.engine.speculative.SpeculativeDecoder.
decode_round`). This script builds the default pair as the sweep's server runs it (native path, compiled, one torch
thread; ``round_table.make_engine``), prefills b chat prompts, and prints, per batch of ``--batches``: the whole
round's median at each K of ``--steps``, then each part's median at each verify width K + 1: the target's layers, the
lm_head over the verified rows, the extend, and the head's draft token and one-entry draft step. The ratio of the
target's layers at b x (K + 1) rows to b rows says how much of a round's growth over K is the verify's own work.

Usage: ``python benchmarks/round_parts.py [--batches 1,4] [--steps 0,1,2] [--repeats 30]``. Medians of
``--repeats`` calls after three untimed ones, ms.
"""

from __future__ import annotations

import argparse
import statistics
import time

from round_table import PROMPTS, ints, make_engine, one_thread


def median_ms(fn, repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls after three untimed ones, ms."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--steps", default="0,1,2")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    import torch

    from spectune.backends.local.engine.sampling import SamplingTensors

    one_thread()
    batches, steps = ints(args.batches), ints(args.steps)
    engine = make_engine("auto", max(steps), max(batches))
    path = engine.path.to_json()
    print(f"engine: {path['kernel_ranges']}, draft head {path.get('draft_head')}")
    dec, tok = engine.decoder, engine.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    with torch.inference_mode():
        for b in batches:
            st = SamplingTensors.build([0.0] * b, [0] * b, [1.0] * b, dec.device)
            dec.prefill(list(range(b)), [prompts[i % len(prompts)] for i in range(b)], st, True)
            rounds = {k: median_ms(lambda k=k: dec.decode_round(b, k, st), args.repeats) for k in steps}
            print(f"\nbatch {b}: round ms " + ", ".join(
                f"K={k} {ms:.2f}" + (f" ({ms / rounds[steps[i - 1]]:.2f}x)" if i else "")
                for i, (k, ms) in enumerate(rounds.items())))
            print("| verify width | rows | target layers ms | lm_head ms | extend ms |")
            print("|---:|---:|---:|---:|---:|")
            m = dec.seq_len[:b]
            base = None
            for k in steps:
                width = k + 1
                inputs = torch.zeros(b, width, dtype=torch.long)
                pos = m.unsqueeze(1) + torch.arange(width)
                out = {}

                def target(inputs=inputs, pos=pos, out=out):
                    out["h"] = dec._run("target", dec._target_fwd, inputs, pos)

                t_target = median_ms(target, args.repeats)
                hidden, aux = out["h"]
                t_logits = median_ms(lambda hidden=hidden: dec.target.logits(hidden), args.repeats)
                feats = dec._features(hidden, aux)
                t_extend = median_ms(lambda: dec._run("extend", dec._draft_fwd, inputs, pos, feats), args.repeats)
                base = base or t_target
                print(f"| {width} | {b * width} | {t_target:.2f} ({t_target / base:.2f}x) | {t_logits:.2f} | "
                      f"{t_extend:.2f} |")
            feat = dec.draft_feature[:b]
            t_token = median_ms(lambda: dec.head.draft_tokens(feat), args.repeats)
            one = torch.zeros(b, 1, dtype=torch.long)
            t_step = median_ms(lambda: dec._run("draft", dec._draft_fwd, one, m.view(b, 1), feat.unsqueeze(1)),
                               args.repeats)
            print(f"head: draft token {t_token:.2f} ms, one-entry draft step {t_step:.2f} ms")


if __name__ == "__main__":
    main()
