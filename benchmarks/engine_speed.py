"""Engine speed vs HF transformers, measured side by side in one run.

CPU part (always): SmolLM2-135M-Instruct (the embedded default), greedy, bf16. For batch 1 and 8, both
implementations generate 64 new tokens (EOS ignored) from the same chat prompts; decode tokens/s =
batch * 63 / (t(64 new tokens) - t(1 new token)), so prefill is excluded for both. HF uses ``generate`` with
``cache_implementation="static"``; the engine runs num_steps 0 (plain decoding). Also printed: the batch-1
memory-bandwidth roofline = measured read bandwidth / bytes of bf16 weights, and the engine's speculative
decoding at num_steps 1-5 with the bundled head (batch 1 and 8), as output tokens/s including prefill, on the
first chat prompt(s) only; the batch-1 speedup over many real prompts is ``benchmarks/spec_speedup.py``.

CUDA part (when a GPU is present): a randomly initialised Llama-3.1-8B-shaped target in bf16, batch-1 num_steps 0
decode, as a percentage of the HBM roofline (weights bytes / measured device-to-device copy bandwidth).

Usage: ``python benchmarks/engine_speed.py [--repeats 3] [--skip-hf] [--skip-spec]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

PROMPTS = ["Write a short story about a robot learning to paint.", "Explain how a refrigerator works.",
           "What are the benefits of regular exercise?", "Describe the water cycle.",
           "Give me a recipe for pancakes.", "Why do cats purr?", "Summarize the plot of Hamlet.",
           "How do airplanes stay in the air?"]


def read_bandwidth_gb_s() -> float:
    """CPU read bandwidth: sum over a 512 MB fp32 buffer, best of 5, GB/s."""
    x = torch.ones(128 * 2**20)
    x.sum()
    best = min(_timed(lambda: x.sum()) for _ in range(5))
    return x.numel() * 4 / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def hf_decode_tok_s(folder, prompts: list[list[int]], batch: int, repeats: int) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16).eval()
    ids = prompts[:batch]
    width = max(len(p) for p in ids)
    pad = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 2
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])

    def run(n: int) -> None:
        with torch.inference_mode():
            model.generate(input_ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           cache_implementation="static", pad_token_id=pad)

    run(4)  # warm-up
    deltas = [_timed(lambda: run(64)) - _timed(lambda: run(1)) for _ in range(repeats)]
    return batch * 63 / statistics.median(deltas)


def engine_tok_s(prompts: list[list[int]], batch: int, k: int, repeats: int, decode_only: bool) -> float:
    from spectune.backends.local.build import EngineOptions, build_engine
    from spectune.backends.local.sequence import SamplingParams

    engine = build_engine(EngineOptions(num_steps=k, draft=None if k else "none", dtype="bfloat16",
                                        max_num_seqs=batch, max_model_len=512, kv_cache_gb=1.0))
    ids = prompts[:batch]

    def run(n: int) -> None:
        engine.generate(ids, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))

    run(4)
    if decode_only:
        deltas = [_timed(lambda: run(64)) - _timed(lambda: run(1)) for _ in range(repeats)]
        return batch * 63 / statistics.median(deltas)
    return batch * 64 / statistics.median([_timed(lambda: run(64)) for _ in range(repeats)])


def cuda_roofline_percent(repeats: int) -> str:
    """Batch-1 decode of a random Llama-3.1-8B-shaped bf16 model on CUDA as % of the HBM roofline."""
    from spectune.backends.local.attention import AttnMeta
    from spectune.backends.local.config import ModelConfig
    from spectune.backends.local.kv_cache import KVCache
    from spectune.backends.local.model import TargetModel

    cfg = ModelConfig(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
                      max_position_embeddings=8192)
    with torch.device("cuda"):
        model = TargetModel(cfg).to(torch.bfloat16).eval().requires_grad_(False)
    model.build_rope(2048)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    src = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    copy_bw = 2 * src.numel() * 10 / (time.perf_counter() - t)  # read + write bytes/s
    cache = KVCache(cfg.num_layers, 1, 2048, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, "cuda")
    from spectune.backends.local.cuda_graphs import GraphRunner

    graphs = GraphRunner(num_slots=1, max_len=2048, capture=True)

    def forward(tokens, positions, _features, kv):
        meta = AttnMeta.for_batch(cache, model.rope, positions, cfg.num_heads // cfg.num_kv_heads, kv)
        hidden, _ = model(tokens, meta)
        return model.logits(hidden[:, -1])

    tok = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    pos = torch.full((1, 1), 512, device="cuda")
    with torch.inference_mode():
        for _ in range(3):
            graphs.run("target", forward, tok, pos, None)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats * 20):
            t = time.perf_counter()
            graphs.run("target", forward, tok, pos, None)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
    step = statistics.median(times)
    roof = weight_bytes / copy_bw
    return (f"CUDA {torch.cuda.get_device_name()}: 8B-shaped bf16 decode step {step * 1e3:.2f} ms, roofline "
            f"{roof * 1e3:.2f} ms (weights {weight_bytes / 1e9:.1f} GB / copy bandwidth {copy_bw / 1e12:.2f} TB/s) "
            f"-> {100 * roof / step:.0f}% of roofline, {1 / step:.0f} tok/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--skip-spec", action="store_true")
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    from spectune.backends.local.tokenizer import Tokenizer
    from spectune.backends.local.weights import convert_gguf, default_model_path

    folder = convert_gguf(default_model_path())
    tok = Tokenizer(folder)
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    console = Console()
    bw = read_bandwidth_gb_s()
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:  # bf16 bytes of the (tied) weights
        weights = 2 * sum(f.get_slice(k).get_shape()[0] * (f.get_slice(k).get_shape() + [1])[1] for k in f.keys())
    table = Table(title=f"SmolLM2-135M-Instruct decode on CPU ({torch.get_num_threads()} threads, bf16)")
    for col in ("batch", "HF transformers tok/s", "spectune K=0 tok/s", "ratio"):
        table.add_column(col, justify="right")
    for batch in (1, 8):
        hf = None if args.skip_hf else hf_decode_tok_s(folder, prompts, batch, args.repeats)
        ours = engine_tok_s(prompts, batch, 0, args.repeats, decode_only=True)
        table.add_row(str(batch), "-" if hf is None else f"{hf:.1f}", f"{ours:.1f}",
                      "-" if hf is None else f"{ours / hf:.2f}x")
    console.print(table)
    console.print(f"batch-1 roofline: read bandwidth {bw:.1f} GB/s / {weights / 1e6:.0f} MB bf16 weights = "
                  f"{bw * 1e9 / weights:.0f} tok/s")
    if not args.skip_spec:
        spec = Table(title="spectune output tok/s incl. prefill (64 tokens, greedy, bundled head)")
        spec.add_column("batch", justify="right")
        for k in range(6):
            spec.add_column(f"K={k}", justify="right")
        for batch in (1, 8):
            vals = [engine_tok_s(prompts, batch, k, args.repeats, decode_only=False) for k in range(6)]
            spec.add_row(str(batch), *(f"{v:.1f}" for v in vals))
        console.print(spec)
    if torch.cuda.is_available():
        console.print(cuda_roofline_percent(args.repeats))
    else:
        console.print("CUDA: no GPU available on this machine; the 8B-shaped roofline figure was not measured.")


if __name__ == "__main__":
    main()
