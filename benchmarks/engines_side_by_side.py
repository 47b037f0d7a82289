"""The default pair on the bundled engine, llama.cpp's llama-server and vLLM, side by side in one run.

The engines serve the same model pair (SmolLM2-135M-Instruct + the bundled EAGLE-3 head; llama.cpp gets the head
as a GGUF exported once and runs the target's Q4_1 weights natively; vLLM gets the target dequantized to a bf16 HF
folder and the head folder as it is; the bundled engine runs on the path its ``--dtype auto`` / ``--compile auto``
choose, printed as ``bundled path``) and are driven by the same load generator on the same MT-Bench first turns,
greedy, with the same windows: for each num_steps K every engine's server is up, and every (concurrency, repeat)
cell measures the engines back to back, rotating which goes first, so a drift of the machine's speed hits all
alike. Per cell and engine: output tokens/s (output tokens / window), TPOT p50 (ms), acceptance length (1 +
accepted drafts / verify steps over the window, from each engine's own counters or per-request metrics) and the
ratios to the bundled engine. At K = 0 llama.cpp on an F16 GGUF of the same (dequantized) weights also runs, to show
llama.cpp's own speed at 16 bits (``--engines`` without ``llamacpp`` leaves it out).

Usage: ``python benchmarks/engines_side_by_side.py [--engines bundled,llamacpp,vllm] [--steps 0,1,2,3]
[--concurrency 1,8] [--num-prompts 12] [--max-tokens 96] [--repeats 1]``. llama.cpp needs ``spectune llamacpp
install`` (llama-server and the llama.cpp tree, whose converter writes the F16 GGUF), vLLM ``spectune vllm install``
(its server starts take minutes: each K launches one). Prints the CPU model and its AVX-512/AMX flags first.
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


def f16_gguf() -> Path:
    """An F16 GGUF of the default target's weights as the bundled engine loads them (the Q4_1 file dequantized by
    spectune's cache, converted with llama.cpp's own convert_hf_to_gguf.py); written once into the cache."""
    import os
    import sys

    from spectune.backends.llamacpp.install import cache_root, llama_cpp_source_dir
    from spectune.backends.local.weights.loader import convert_gguf, default_model_path

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
    from spectune.loadgen.send_loop import warmup_prompt

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


ENGINES = {"bundled": ("local", {}), "llama.cpp Q4_1": ("llamacpp", {}), "vllm bf16": ("vllm", {})}
"""Engine label -> (backend name, extra BackendOptions); ``--engines`` picks by backend name."""


async def run(args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    from spectune.backends import make_backend
    from spectune.backends.options import BackendOptions
    from spectune.loadgen.datasets import load_dataset
    from spectune.measure.environment import cpu_line

    steps = [int(x) for x in args.steps.split(",")]
    concs = [int(x) for x in args.concurrency.split(",")]
    wanted = {"bundled": "local", "local": "local", "llamacpp": "llamacpp", "llama.cpp": "llamacpp", "vllm": "vllm"}
    picked = {wanted[e.strip()] for e in args.engines.split(",")}
    console = Console(width=170)
    console.print(f"CPU: {cpu_line()}; {platform.platform()}")
    prompts = load_dataset("mt-bench", args.num_prompts, 0)
    opts = dict(max_concurrency=max(concs), max_tokens=args.max_tokens, startup_timeout_s=1200)
    engines = [(label, make_backend(name, BackendOptions(**opts, **extra)))
               for label, (name, extra) in ENGINES.items() if name in picked]
    f16 = [("llama.cpp F16", make_backend("llamacpp", BackendOptions(model=str(f16_gguf()), draft="none", **opts)))
           ] if "llamacpp" in picked else []
    for _, backend in engines:
        await backend.preflight(steps)
    for _, backend in f16:
        await backend.preflight([0])
    names = [label for label, _ in engines]
    cells: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    t0 = time.monotonic()
    try:
        for k in steps:
            here = engines + (f16 if k == 0 else [])
            for c in concs:
                n = max(args.num_prompts, 2 * c)
                for rep in range(args.repeats):
                    shift = (rep + k + c) % len(here)
                    for name, backend in here[shift:] + here[:shift]:
                        cells.setdefault((name, k, c), []).append(
                            await measure(backend, k, c, prompts, n, args.max_tokens))
                    console.print(f"K={k} c={c} repeat {rep + 1}: " + ", ".join(
                        f"{name} {cells[(name, k, c)][-1]['tok_s']:.1f} tok/s" for name, _ in here), markup=False)
            for name, backend in here:
                if name != "bundled":  # the bundled engine switches num_steps in place; the others relaunch
                    await backend.stop()
    finally:
        for _, backend in engines + f16:
            await backend.close()

    def med(name: str, k: int, c: int, key: str) -> float:
        vals = [r[key] for r in cells.get((name, k, c), []) if r[key] is not None]
        return statistics.median(vals) if vals else float("nan")

    local = dict(engines).get("bundled")
    path = (local.engine_path or {}) if local is not None else {}
    how = f"{path.get('path', '?')}, compile {'on' if (path.get('compile') or {}).get('active') else 'off'}"
    if local is not None:
        console.print(f"bundled path: {path}", markup=False)
    ref = names[0]
    table = Table(title=f"{', '.join(names)} (bundled: {how}), MT-Bench, greedy, {args.max_tokens} tokens, medians of "
                        f"{args.repeats} repeat(s), {time.monotonic() - t0:.0f} s; ratios and AL diff vs {ref}")
    for col in ["K", "conc"] + [f"{n} tok/s" for n in names] + [f"{n}/{ref}" for n in names[1:]] \
            + [f"{n} TPOT ms" for n in names] + [f"{n} AL" for n in names] + [f"{n} AL diff" for n in names[1:]] \
            + [f"{n} same text" for n in names[1:]]:
        table.add_column(col, justify="right")
    for k in steps:
        for c in concs:
            tok = {n: med(n, k, c, "tok_s") for n in names}
            al = {n: med(n, k, c, "al") for n in names}
            outs = {n: cells[(n, k, c)][0]["outputs"] for n in names}
            table.add_row(str(k), str(c), *(f"{tok[n]:.1f}" for n in names),
                          *(f"{tok[n] / tok[ref]:.2f}x" for n in names[1:]),
                          *(f"{med(n, k, c, 'tpot'):.1f}" for n in names), *(f"{al[n]:.3f}" for n in names),
                          *(f"{(al[n] - al[ref]) / al[ref]:+.1%}" for n in names[1:]),
                          *(f"{sum(outs[ref][p] == outs[n].get(p) for p in outs[ref])}/{len(outs[ref])}"
                            for n in names[1:]))
    console.print(table)
    if f16:
        for c in concs:
            a, q, f = (med(n, 0, c, "tok_s") for n in (ref, "llama.cpp Q4_1", "llama.cpp F16"))
            console.print(f"K=0 c={c}: {ref} {a:.1f} tok/s, llama.cpp Q4_1 {q:.1f} ({q / a:.2f}x), "
                          f"llama.cpp F16 {f:.1f} ({f / a:.2f}x)", markup=False)
    for name in names:
        for c in concs:
            base = med(name, 0, c, "tok_s")
            console.print(f"{name} c={c} speculative speedup vs K=0: " + ", ".join(
                f"K={k} {med(name, k, c, 'tok_s') / base:.2f}x" for k in steps if k), markup=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="bundled,llamacpp,vllm", help="bundled, llamacpp, vllm (comma-separated)")
    parser.add_argument("--steps", default="0,1,2,3")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--num-prompts", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=1)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
