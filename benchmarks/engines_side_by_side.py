"""The default pair on the bundled engine and on llama.cpp's llama-server, side by side in one run.

Both engines serve the same model pair (SmolLM2-135M-Instruct + the bundled EAGLE-3 head; llama.cpp gets the head
as a GGUF exported once; both run the target's Q4_1 weights natively, the bundled engine on the path its
``--dtype auto`` / ``--compile auto`` choose, printed as ``bundled path``) and are driven by the same load
generator on the same MT-Bench first turns, greedy, with the same windows: for each num_steps K both servers are
up, and every (concurrency, repeat) cell measures the two engines back to back, alternating which goes first, so a
drift of the machine's speed hits both alike. Per cell: output tokens/s
(output tokens / window), TPOT p50 (ms), acceptance length (1 + accepted drafts / verify steps over the window, from
each engine's own counters) and the llama.cpp / bundled ratios. At K = 0 a third server, llama.cpp on an F16 GGUF
of the same (dequantized) weights, shows llama.cpp's own speed at 16 bits.

Usage: ``python benchmarks/engines_side_by_side.py [--steps 0,1,2,3] [--concurrency 1,8] [--num-prompts 12]
[--max-tokens 96] [--repeats 1]``. Needs ``spectune llamacpp install`` (llama-server and the llama.cpp tree, whose
converter writes the F16 GGUF). Prints the CPU model and its AVX-512/AMX flags first.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any


def cpu_line() -> str:
    """``lscpu`` model name and the vector flags that decide CPU kernels."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return platform.processor()
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("Flags")), [])
    vec = [f for f in flags if f.startswith(("avx512f", "avx512_bf16", "amx", "avx2", "avx_vnni"))]
    return f"{model}; {' '.join(sorted(set(vec)))}"


def f16_gguf() -> Path:
    """An F16 GGUF of the default target's weights as the bundled engine loads them (the Q4_1 file dequantized by
    spectune's cache, converted with llama.cpp's own convert_hf_to_gguf.py); written once into the cache."""
    import os
    import sys

    from spectune.backends.llamacpp.install import cache_root, llama_cpp_source_dir
    from spectune.backends.local.weights import convert_gguf, default_model_path

    out = cache_root() / "llamacpp-models" / "SmolLM2-135M-Instruct.from-Q4_1.F16.gguf"
    if out.is_file():
        return out
    src = llama_cpp_source_dir()
    if src is None:
        raise SystemExit("no llama.cpp tree: run `spectune llamacpp install` first")
    import json
    import tempfile

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.gguf")
    env = {**os.environ, "PYTHONPATH": str(src / "gguf-py")}
    hf = convert_gguf(default_model_path())
    with tempfile.TemporaryDirectory() as folder:  # the converter needs config.json's "architectures"
        for f in hf.iterdir():
            (Path(folder) / f.name).symlink_to(f)
        config = json.loads((hf / "config.json").read_text())
        config["architectures"] = config.get("architectures") or ["LlamaForCausalLM"]
        (Path(folder) / "config.json").unlink()
        (Path(folder) / "config.json").write_text(json.dumps(config))
        subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), folder, "--outtype", "f16",
                        "--outfile", str(tmp)], check=True, env=env, capture_output=True, cwd=folder)
    tmp.rename(out)
    return out


async def measure(backend: Any, steps: int, conc: int, prompts: list, n: int, max_tokens: int) -> dict[str, Any]:
    """One window on ``backend`` at num_steps ``steps`` and concurrency ``conc``: warm-up, snapshots, ``n``
    requests; returns tokens/s, TPOT p50 (ms) and acceptance length."""
    from spectune.loadgen import ClientConfig, ClosedLoop, Constraints, StreamingClient, compute_metrics, run_point
    from spectune.loadgen.runner import warmup_prompt

    endpoint = await backend.start(steps)
    config = ClientConfig(endpoint.base_url, model=None, max_tokens=max_tokens, temperature=0.0,
                          extra_body=backend.request_extra() or None, reuse_connections=backend.reuse_connections)
    async with StreamingClient(config) as client:
        warm = [warmup_prompt(prompts[i % len(prompts)], i) for i in range(min(conc, 4))]
        await run_point(client, warm, ClosedLoop(len(warm)), Constraints(max_requests=len(warm)))
        before = await backend.snapshot()
        result = await run_point(client, prompts, ClosedLoop(conc), Constraints(max_requests=n))
        after = await backend.snapshot()
    m = compute_metrics(result.records, result.window_start, result.window_end, result.achieved_concurrency,
                        None, None)
    acc = backend.acceptance(before, after, result.records)
    return {"tok_s": m["output_throughput_tok_s"], "tpot": m["tpot_p50_ms"], "al": acc.acceptance_length,
            "failed": m["num_failed"], "outputs": {r.prompt_id: r.output_text for r in result.records if r.ok}}


async def run(args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    from spectune.backends import make_backend
    from spectune.backends.base import BackendOptions
    from spectune.loadgen.datasets import load_dataset

    steps = [int(x) for x in args.steps.split(",")]
    concs = [int(x) for x in args.concurrency.split(",")]
    console = Console(width=150)
    console.print(f"CPU: {cpu_line()}; {platform.platform()}")
    prompts = load_dataset("mt-bench", args.num_prompts, 0)
    opts = dict(max_concurrency=max(concs), max_tokens=args.max_tokens)
    local = make_backend("local", BackendOptions(**opts))
    llama = make_backend("llamacpp", BackendOptions(**opts))
    llama_f16 = make_backend("llamacpp", BackendOptions(model=str(f16_gguf()), draft="none", **opts))
    await local.preflight(steps)
    await llama.preflight(steps)
    await llama_f16.preflight([0])
    cells: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    t0 = time.monotonic()
    try:
        for k in steps:
            engines = [("bundled", local), ("llama.cpp Q4_1", llama)]
            engines += [("llama.cpp F16", llama_f16)] if k == 0 else []
            for c in concs:
                n = max(args.num_prompts, 2 * c)
                for rep in range(args.repeats):
                    order = engines if (rep + k + c) % 2 == 0 else engines[::-1]
                    for name, backend in order:
                        cells.setdefault((name, k, c), []).append(
                            await measure(backend, k, c, prompts, n, args.max_tokens))
                    console.print(f"K={k} c={c} repeat {rep + 1}: " + ", ".join(
                        f"{name} {cells[(name, k, c)][-1]['tok_s']:.1f} tok/s" for name, _ in engines),
                        markup=False)
            await llama.stop()
            if k == 0:
                await llama_f16.close()
    finally:
        await local.close()
        await llama.close()
        await llama_f16.close()

    def med(name: str, k: int, c: int, key: str) -> float:
        vals = [r[key] for r in cells.get((name, k, c), []) if r[key] is not None]
        return statistics.median(vals) if vals else float("nan")

    path = local.engine_path or {}
    how = f"{path.get('path', '?')}, compile {'on' if (path.get('compile') or {}).get('active') else 'off'}"
    console.print(f"bundled path: {path}", markup=False)
    table = Table(title=f"bundled engine ({how}) vs llama.cpp, MT-Bench, greedy, {args.max_tokens} tokens, "
                        f"medians of {args.repeats} repeat(s), {time.monotonic() - t0:.0f} s")
    for col in ("K", "conc", "bundled tok/s", "llama tok/s", "llama/bundled", "bundled TPOT ms", "llama TPOT ms",
                "bundled AL", "llama AL", "AL diff", "same text"):
        table.add_column(col, justify="right")
    for k in steps:
        for c in concs:
            a, b = med("bundled", k, c, "tok_s"), med("llama.cpp Q4_1", k, c, "tok_s")
            al_a, al_b = med("bundled", k, c, "al"), med("llama.cpp Q4_1", k, c, "al")
            outs_a = cells[("bundled", k, c)][0]["outputs"]
            outs_b = cells[("llama.cpp Q4_1", k, c)][0]["outputs"]
            same = sum(outs_a[p] == outs_b.get(p) for p in outs_a)
            table.add_row(str(k), str(c), f"{a:.1f}", f"{b:.1f}", f"{b / a:.2f}x",
                          f"{med('bundled', k, c, 'tpot'):.1f}", f"{med('llama.cpp Q4_1', k, c, 'tpot'):.1f}",
                          f"{al_a:.3f}", f"{al_b:.3f}", f"{(al_b - al_a) / al_a:+.1%}", f"{same}/{len(outs_a)}")
    console.print(table)
    for c in concs:
        a, q, f = (med(n, 0, c, "tok_s") for n in ("bundled", "llama.cpp Q4_1", "llama.cpp F16"))
        console.print(f"K=0 c={c}: bundled ({how}) {a:.1f} tok/s, llama.cpp Q4_1 {q:.1f} ({q / a:.2f}x), "
                      f"llama.cpp F16 {f:.1f} ({f / a:.2f}x)", markup=False)
    for name in ("bundled", "llama.cpp Q4_1"):
        for c in concs:
            base = med(name, 0, c, "tok_s")
            console.print(f"{name} c={c} speculative speedup vs K=0: " + ", ".join(
                f"K={k} {med(name, k, c, 'tok_s') / base:.2f}x" for k in steps if k), markup=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="0,1,2,3")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--num-prompts", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=1)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
