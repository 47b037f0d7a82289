"""Packed prefill against one forward per request, side by side in one run: TTFT and output tokens/s under load.

The bundled engine prefills the requests admitted in one iteration (up to its prefill token budget: 1,024 prompt
tokens on CPU, 8,192 on CUDA) in one packed forward (``SpeculativeDecoder.prefill``: projections and MLP over all
their tokens at once, attention per prompt). The baseline is the engine as it was before: the same admissions, each
prompt prefilled by its own forward (the script wraps the decoder's ``prefill`` to call it once per request);
everything else, the decode rounds included, is the same engine object.

Load: a closed loop in the engine's own thread (no HTTP), ``--concurrency`` requests in flight, each finished one
replaced at once by the next prompt, ``--requests-per-slot`` x concurrency requests in all; MT-Bench first turns
through the chat template (``--dataset``), greedy, ``--max-tokens`` new tokens, EOS ignored. TTFT = time from
``add_request`` to the request's first token; output tokens/s = all output tokens / the load's wall time. The modes
alternate (packed, per-request, packed, ...) for ``--repeats`` rounds at every (num_steps, concurrency); the table
gives medians over repeats, so the machine's drift hits both alike. First it counts the aten operators one prefill
of ``c`` prompts dispatches (a GPU launches about one kernel for each), per request, packed with one SDPA per prompt
and packed with the padded attention groups (``backends/local/model/packed.py``).

Usage: ``python benchmarks/packed_prefill.py [--concurrency 8,32] [--steps 0,3] [--repeats 3] [--max-tokens 32]
[--dtype auto] [--device auto] [--compile auto] [--kv-cache-gb 4] [--json FILE]``; ``--json`` writes the table's
rows (``benchmarks/gpu_campaign.py``'s ``prefill`` part reads them). Runs on CUDA too (``--device cuda``), where a
forward costs its kernel launches more than its tokens, so one forward per request is what set TTFT at high
concurrency.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def per_request(prefill):
    """``prefill`` (``SpeculativeDecoder.prefill``) called once per request, as the engine did before packing."""
    from spectune.backends.local.engine.sampling import SamplingTensors

    def run(slots, prompts, st, draft):
        firsts = []
        for i, (slot, prompt) in enumerate(zip(slots, prompts)):
            one = SamplingTensors.build([st.temperature[i].item()], [int(st.top_k[i])], [st.top_p[i].item()],
                                        st.temperature.device, [st.generators[i]] if st.generators else None)
            firsts += prefill([slot], [prompt], one, draft)
        return firsts
    return run


def op_counts(engine, prompts: list[list[int]], n: int) -> dict[str, int]:
    """aten operators one prefill of the first ``n`` prompts dispatches (about the kernels it launches on a GPU):
    one forward per request, packed with one SDPA per prompt, and packed with the padded attention groups."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from spectune.backends.local.engine.sampling import SamplingTensors
    from spectune.backends.local.model import attention

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    decoder, batch = engine.decoder, prompts[:n]
    draft = decoder.head is not None

    def greedy(k: int) -> SamplingTensors:
        return SamplingTensors.build([0.0] * k, [0] * k, [1.0] * k, decoder.device)

    counts = {}
    with Count() as c:
        for i, p in enumerate(batch):
            decoder.prefill([i], [p], greedy(1), draft)
    counts["per-request"] = c.ops
    groups = attention.pad_groups
    attention.pad_groups = lambda segments, device: None  # packed, one SDPA per prompt
    try:
        with Count() as c:
            decoder.prefill(list(range(n)), batch, greedy(n), draft)
    finally:
        attention.pad_groups = groups
    counts["packed, one SDPA per prompt"] = c.ops
    with Count() as c:
        decoder.prefill(list(range(n)), batch, greedy(n), draft)
    counts["packed, padded groups"] = c.ops
    return counts


def closed_loop(engine, prompts: list[list[int]], concurrency: int, total: int, params) -> tuple[list[float], float]:
    """Run ``total`` requests, ``concurrency`` at a time; returns each request's TTFT (s) and output tokens/s."""
    sent = done = tokens = 0
    started: dict[str, float] = {}
    ttft: dict[str, float] = {}

    def on_output(out) -> None:
        nonlocal done, tokens
        tokens += len(out.new_token_ids)
        if out.new_token_ids and out.request_id not in ttft:
            ttft[out.request_id] = time.perf_counter() - started[out.request_id]
        done += out.finished

    t0 = time.perf_counter()
    while done < total:
        while sent < total and sent - done < concurrency:
            rid = str(sent)
            started[rid] = time.perf_counter()
            engine.add_request(rid, prompts[sent % len(prompts)], params, on_output)
            sent += 1
        engine.step()
    return list(ttft.values()), tokens / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="8,32")
    parser.add_argument("--steps", default="0,3")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests-per-slot", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--dataset", default="mt-bench")
    parser.add_argument("--dtype", default="auto", help="engine compute path (auto, native, bfloat16, float32)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--compile", default="auto",
                        help="torch.compile of the target's batched layers (auto, on, off)")
    parser.add_argument("--kv-cache-gb", type=float, default=4.0, help="KV cache budget (slots are cut to fit)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    steps = [int(x) for x in args.steps.split(",")]

    from rich.console import Console
    from rich.table import Table

    from spectune.backends.local.build import build_engine
    from spectune.backends.local.engine.sequence import SamplingParams
    from spectune.backends.local.options import EngineOptions
    from spectune.loadgen.datasets import load_dataset
    from spectune.measure.environment import cpu_line

    console = Console(width=140)
    engine = build_engine(EngineOptions(num_steps=0, num_steps_capacity=max(steps), dtype=args.dtype,
                                        device=args.device, max_num_seqs=max(concurrencies), max_model_len=1024,
                                        kv_cache_gb=args.kv_cache_gb, compile=args.compile))
    if engine.cfg.max_num_seqs < max(concurrencies):
        parser.error(f"--kv-cache-gb {args.kv_cache_gb} holds {engine.cfg.max_num_seqs} sequences, fewer than "
                     f"concurrency {max(concurrencies)}: raise it")
    prompts = [engine.tokenizer.encode_chat(p.messages) for p in load_dataset(args.dataset, 80, 0)]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    packed = engine.decoder.prefill
    modes = {"packed": packed, "per-request": per_request(packed)}
    console.print(f"{cpu_line()}; device {engine.decoder.device}, path {engine.path.name if engine.path else '?'}; "
                  f"{len(prompts)} prompts, mean {statistics.mean(map(len, prompts)):.0f} tokens")
    ops = {n: op_counts(engine, prompts, n) for n in sorted({min(c, len(prompts)) for c in concurrencies})}
    for n, counts in ops.items():
        console.print(f"aten operators to prefill {n} prompts ({sum(map(len, prompts[:n]))} tokens, head included): "
                      + ", ".join(f"{name} {count:,}" for name, count in counts.items()))
    for k in steps:  # warm-up: every shape once, both modes
        engine.set_num_steps(k)
        for fn in modes.values():
            engine.decoder.prefill = fn
            closed_loop(engine, prompts, max(concurrencies), max(concurrencies), params)
    results: dict[tuple[int, int, str], list[tuple[float, float, float]]] = {}
    for r in range(args.repeats):
        for k in steps:
            engine.set_num_steps(k)
            for c in concurrencies:
                for name in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
                    engine.decoder.prefill = modes[name]
                    ttft, tps = closed_loop(engine, prompts, c, c * args.requests_per_slot, params)
                    results.setdefault((k, c, name), []).append((statistics.median(ttft), statistics.mean(ttft), tps))
                    console.print(f"repeat {r} K={k} c={c} {name}: TTFT p50 {statistics.median(ttft) * 1e3:.0f} ms, "
                                  f"{tps:.1f} tok/s")
    engine.decoder.prefill = packed
    table = Table(title=f"packed prefill vs one forward per request: medians of {args.repeats} repeats, "
                        f"{args.max_tokens} new tokens, greedy")
    for col in ("num_steps", "concurrency", "TTFT p50 packed", "per-request", "TTFT mean packed", "per-request",
                "tok/s packed", "per-request", "tok/s ratio"):
        table.add_column(col, justify="right")
    rows = []
    for k in steps:
        for c in concurrencies:
            p = [statistics.median(x) for x in zip(*results[(k, c, "packed")])]
            q = [statistics.median(x) for x in zip(*results[(k, c, "per-request")])]
            rows.append(dict(num_steps=k, concurrency=c, ttft_p50_ms=[p[0] * 1e3, q[0] * 1e3],
                             ttft_mean_ms=[p[1] * 1e3, q[1] * 1e3], output_tok_s=[p[2], q[2]], ratio=p[2] / q[2]))
            table.add_row(str(k), str(c), f"{p[0] * 1e3:.0f} ms", f"{q[0] * 1e3:.0f} ms", f"{p[1] * 1e3:.0f} ms",
                          f"{q[1] * 1e3:.0f} ms", f"{p[2]:.1f}", f"{q[2]:.1f}", f"{p[2] / q[2]:.3f}x")
    if args.json:
        args.json.write_text(json.dumps({"machine": cpu_line(), "device": str(engine.decoder.device),
                                         "repeats": args.repeats, "max_tokens": args.max_tokens,
                                         "columns": "[packed, per-request]", "rows": rows,
                                         "aten_ops_per_prefill": ops}, indent=1))
    console.print(table)


if __name__ == "__main__":
    main()
