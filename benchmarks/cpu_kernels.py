"""spectune's CPU kernels against the PyTorch kernels they replace, op by op, side by side in one run.

``spectune::decode_attention`` against ``F.scaled_dot_product_attention`` over cache slices (what
``model/attention.py`` ran before; bf16, SmolLM2's 3 KV heads x 3 query heads, head_dim 64) at batch x new tokens per
sequence x visible cache length, ``spectune::int8_linear`` against ``torch.ops.aten._weight_int8pack_mm`` on
SmolLM2's lm_head shape (49152 x 576 int8, weights streamed from memory) at 1-16 input rows, and (AVX-512 builds)
``spectune::int4_linear`` against ``torch.ops.aten._weight_int4pack_mm_for_cpu`` on SmolLM2's gate|up shape
(3072 x 576, Q4_1-like codes; 48 copies, 42 MB, so the weights stream from memory as in a decode step) at 1-16 rows. One torch thread, as
the sweep's server runs; each figure is the fastest of 5 timed loops (microseconds or ms per call).

Usage: ``python benchmarks/cpu_kernels.py``. Prints the CPU (``lscpu``'s model name) and two Markdown tables.
"""

from __future__ import annotations

import platform
import subprocess
import time

import torch
import torch.nn.functional as F


def best_us(fn, calls: int) -> float:
    """The fastest of 5 loops of ``calls`` calls, microseconds per call (after 30 untimed calls)."""
    for _ in range(30):
        fn()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t) / calls * 1e6)
    return min(times)


def main() -> None:
    from spectune.backends.local import kernels

    torch.set_num_threads(1)
    choice = kernels.load("on", torch.device("cpu"))
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout if platform.system() == "Linux" else ""
    model = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("Model name")), "?")
    print(f"CPU: {model}; torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}); kernels: "
          f"{choice.reason}")
    hkv, group, hd, length = 3, 3, 64, 2048
    kc = torch.randn(16, hkv, length, hd).bfloat16()
    vc = torch.randn(16, hkv, length, hd).bfloat16()
    print("\n| batch | new tokens | cache length | SDPA, us | spectune, us | speedup |\n|---:|---:|---:|---:|---:|---:|")
    for b, s in ((1, 1), (1, 4), (4, 1), (4, 2), (4, 4), (16, 1)):
        for t in (64, 256, 512):
            q = torch.randn(b, hkv, group * s, hd).bfloat16()
            mask = torch.ones(b, 1, group * s, t, dtype=torch.bool)
            sdpa = best_us(lambda: F.scaled_dot_product_attention(q, kc[:b, :, :t], vc[:b, :, :t], attn_mask=mask),
                           300)
            mine = best_us(lambda: torch.ops.spectune.decode_attention(q, kc, vc, mask), 300)
            print(f"| {b} | {s} | {t} | {sdpa:.1f} | {mine:.1f} | {sdpa / mine:.2f}x |")
    codes = torch.randint(-127, 128, (49152, 576), dtype=torch.int8)
    scale = (torch.rand(49152) * 0.01).bfloat16()
    print("\n| rows | _weight_int8pack_mm, ms | spectune, ms | speedup |\n|---:|---:|---:|---:|")
    for m in (1, 2, 4, 8, 16):
        x = torch.randn(m, 576).bfloat16()
        aten = best_us(lambda: torch.ops.aten._weight_int8pack_mm(x, codes, scale), 30) / 1e3
        mine = best_us(lambda: torch.ops.spectune.int8_linear(x, codes, scale), 30) / 1e3
        print(f"| {m} | {aten:.2f} | {mine:.2f} | {aten / mine:.2f}x |")
    if choice.int4:
        int4_table()


def int4_table() -> None:
    """spectune::int4_linear against PyTorch's int4 kernel, per call of one gate|up-shaped layer (streamed)."""
    import numpy as np

    from spectune.backends.local.weights.quant import Int4Linear, QuantTensor

    rng = np.random.default_rng(0)
    n, k = 3072, 576
    pairs = []
    for _ in range(48):
        qt = QuantTensor(rng.integers(0, 16, (n, k), dtype=np.uint8),
                         (rng.random((n, k // 32)) * 0.02).astype(np.float32),
                         (rng.standard_normal((n, k // 32)) * 0.01).astype(np.float32), 1, "Q4_1")
        pairs.append((Int4Linear(qt), Int4Linear(qt, spectune_kernel=True)))
    print("\n| rows | _weight_int4pack_mm_for_cpu, ms | spectune, ms | speedup |\n|---:|---:|---:|---:|")
    for m in (1, 2, 4, 8, 12, 16):
        x = torch.randn(m, k).bfloat16()
        aten = best_us(lambda: [p[0](x) for p in pairs], 10) / 1e3 / len(pairs)
        mine = best_us(lambda: [p[1](x) for p in pairs], 10) / 1e3 / len(pairs)
        print(f"| {m} | {aten:.3f} | {mine:.3f} | {aten / mine:.2f}x |")


if __name__ == "__main__":
    main()
