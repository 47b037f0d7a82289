"""The draft head's linears on spectune's int4 kernel (``--draft-quant int4``, Q4_1) against its bf16 weights
(``off``), side by side in one run: acceptance length on real prompts and decode round (ms) per batch x num_steps.

Why: in a decode round the target's 70 MB of int4 weights stream through the caches, so the head's bf16 weights
(19.6 MB for the bundled SmolLM2 head) come back from DRAM every round; Q4_1 reads about a quarter of those bytes.
What it may cost is acceptance: the drafts come from rounded weights. Greedy output cannot change (verification
keeps it equal to num_steps 0), and the script checks that too.

Two engines of the embedded default pair are built as ``benchmarks/round_table.py`` builds them (native path,
compiled, one torch thread). Acceptance: greedy generation of ``--new-tokens`` tokens for each of ``--prompts``
prompts (Spec-Bench's first turns, every n-th question, those under 380 tokens; ``--prompts-file``), 4 at a time,
at each K of ``--accept-steps``; acceptance length = 1 + accepted drafts / verify rounds. Rounds: ``round_ms`` of
``round_table.py`` (mean of ``--rounds`` after two untimed), ``--repeats`` interleaved repeats, median.

Usage: ``python benchmarks/draft_quant.py [--prompts-file ../shared/data/spec_bench_question.jsonl] [--prompts 24]
[--batches 1,4] [--steps 0,1,2,3] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from round_table import PROMPTS, ints, make_engine, one_thread, round_ms  # noqa: E402

MODES = ("off", "int4")


def chat_prompts(tok, path: Path, count: int, max_tokens: int = 380) -> list[list[int]]:
    """Up to ``count`` first turns spread over the JSONL file ``path`` (``{"turns": [...]}`` lines), tokenized as chat
    prompts of fewer than ``max_tokens`` tokens; round_table's own prompts when the file is absent."""
    if not path.is_file():
        print(f"{path} not found: using round_table.py's 8 prompts")
        return [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    step = max(1, len(rows) // (2 * count))
    ids = [tok.encode_chat([{"role": "user", "content": r["turns"][0]}]) for r in rows[::step]]
    return [p for p in ids if len(p) < max_tokens][:count]


def generate(engine, prompts: list[list[int]], k: int, new_tokens: int, batch: int = 4
             ) -> tuple[float, list[list[int]]]:
    """Greedy generation at num_steps ``k``: (acceptance length, each prompt's first ``new_tokens`` tokens)."""
    from spectune.backends.local.engine.sampling import SamplingTensors

    dec = engine.decoder
    accepted = rounds = 0
    outputs = []
    for i in range(0, len(prompts), batch):
        group = prompts[i:i + batch]
        st = SamplingTensors.build([0.0] * len(group), [0] * len(group), [1.0] * len(group), dec.device)
        out = [[t] for t in dec.prefill(list(range(len(group))), group, st, True)]
        while min(len(o) for o in out) < new_tokens:
            acc, tokens = dec.decode_round(len(group), k, st)
            accepted, rounds = accepted + sum(acc), rounds + len(acc)
            for o, t in zip(out, tokens):
                o.extend(t)
        outputs += [o[:new_tokens] for o in out]
    return 1 + accepted / max(rounds, 1), outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts-file", default=str(Path(__file__).parents[1].parent / "shared" / "data"
                                                      / "spec_bench_question.jsonl"))
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--accept-steps", default="1,3")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--steps", default="0,1,2,3")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import torch

    one_thread()
    batches, steps = ints(args.batches), ints(args.steps)
    engines = {m: make_engine("auto", max(steps + [3]), max(batches + [4]), m) for m in MODES}
    for m, e in engines.items():
        print(f"--draft-quant {m}: draft head on {e.path.to_json()['draft_head']}")
    tok = engines["off"].tokenizer
    prompts = chat_prompts(tok, Path(args.prompts_file), args.prompts)
    with torch.inference_mode():
        _, plain = generate(engines["off"], prompts, 0, args.new_tokens)
        print(f"\nacceptance length over {len(prompts)} prompts x {args.new_tokens} tokens (greedy):")
        print("| num_steps | " + " | ".join(f"--draft-quant {m}" for m in MODES) + " | int4 / off |")
        print("|---:|" + "---:|" * (len(MODES) + 1))
        for k in (int(x) for x in args.accept_steps.split(",")):
            lengths = {}
            for m in MODES:
                lengths[m], out = generate(engines[m], prompts, k, args.new_tokens)
                if out != plain:
                    print(f"--draft-quant {m} at num_steps {k}: greedy output differs from num_steps 0")
            print(f"| {k} | " + " | ".join(f"{lengths[m]:.3f}" for m in MODES)
                  + f" | {lengths['int4'] / lengths['off']:.3f} |")
        cells: dict[tuple[str, int, int], list[float]] = {}
        chat = [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
        for _ in range(args.repeats):
            for m in MODES:
                for b in batches:
                    for k in steps:
                        cells.setdefault((m, b, k), []).append(round_ms(engines[m], chat, b, k, args.rounds))
    print(f"\ndecode round, ms (median of {args.repeats} interleaved; K/K-1 ratio)")
    print("| batch | --draft-quant | " + " | ".join(f"K={k}" for k in steps) + " |")
    print("|---:|---|" + "---:|" * len(steps))
    for b in batches:
        for m in MODES:
            med = [statistics.median(cells[(m, b, k)]) for k in steps]
            text = [f"{v:.1f}" + (f" ({v / med[i - 1]:.2f}x)" if i else "") for i, v in enumerate(med)]
            print(f"| {b} | {m} | " + " | ".join(text) + " |")


if __name__ == "__main__":
    main()
