"""``spectune report``'s plots of the choice: a throughput-vs-TPOT Pareto plot (one curve per num_steps, points
labelled by concurrency) and a speedup heatmap (num_steps x concurrency, output throughput vs num_steps 0 with its
paired bootstrap interval), each with the schedule ``spectune recommend`` would choose (default options) drawn on it.

The cells, the intervals and the choice are :func:`spectune.tune.recommend.recommend`'s (throughput objective,
intervals from :func:`spectune.tune.recommend.compare`: requests resampled by prompt, paired across cells).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from spectune.loadgen.errors import UserError
from spectune.results.reader import Results


def _recommendation(results: Results) -> Any:
    from spectune.tune.recommend import RecommendOptions, recommend

    try:
        return recommend(results, RecommendOptions())
    except UserError:
        return None


def speedups(rec: Any) -> dict[tuple[int, int], dict[str, float]]:
    """{(num_steps, concurrency): {"ratio", "low", "high"}}: output throughput of each measured ok cell / num_steps 0's
    at the same concurrency, with the paired 95% interval (NaN bounds without requests.jsonl or repeats)."""
    from spectune.tune.recommend import compare

    out = {}
    for c in rec.cells:
        base = rec.cell(0, c.concurrency)
        if c.status != "ok" or c.predicted or base is None or base.status != "ok" or not base.objective:
            continue
        if c.steps == 0:
            out[(0, c.concurrency)] = {"ratio": 1.0, "low": math.nan, "high": math.nan}
            continue
        cmp = compare(c, base, rec.options, rec.options.noise_band)
        out[(c.steps, c.concurrency)] = {"ratio": cmp["ratio"], "low": cmp["low"], "high": cmp["high"]}
    return out


def make_choice_plots(results: Results, out: Path) -> list[Path]:
    """Write pareto_throughput_vs_tpot.png and speedup_heatmap.png into ``out`` (nothing when the sweep has no
    usable throughput cell or no num_steps 0); returns their paths."""
    rec = _recommendation(results)
    if rec is None or rec.options.objective != "throughput":
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.patches import Rectangle

    paths: list[Path] = []
    chosen = {ch.concurrency: ch.steps for ch in rec.choices if ch.steps is not None}
    schedule = " ".join(f"c{c}:K{k}" for c, k in sorted(chosen.items()))

    # Pareto: throughput vs TPOT p50
    fig, ax = plt.subplots(figsize=(7, 5))
    for k in rec.steps:
        cells = [c for c in rec.cells if c.steps == k and c.status == "ok" and not c.predicted
                 and math.isfinite(c.metrics.get("tpot_p50_ms", math.nan))]
        if not cells:
            continue
        xs = [c.metrics["tpot_p50_ms"] for c in cells]
        ys = [c.metrics["output_throughput_tok_s"] for c in cells]
        (line,) = ax.plot(xs, ys, marker="o", label=f"K={k}", alpha=0.8)
        for c, x, y in zip(cells, xs, ys):
            ax.annotate(str(c.concurrency), (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7,
                        color=line.get_color())
    pts = [(rec.cell(k, c).metrics["tpot_p50_ms"], rec.cell(k, c).metrics["output_throughput_tok_s"])
           for c, k in sorted(chosen.items()) if rec.cell(k, c) is not None and rec.cell(k, c).status == "ok"]
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color="black", linestyle="--", linewidth=2, marker="*",
                markersize=12, label="recommended", zorder=5)
    ax.set_xscale("log")
    ax.set(xlabel="TPOT p50 (ms, log scale)", ylabel="output throughput (tokens/s)",
           title="throughput vs TPOT per num_steps (labels: concurrency)")
    ax.legend(title="num_steps", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.text(0.01, 0.01, f"recommended: {schedule}", transform=ax.transAxes, fontsize=7, va="bottom")
    paths.append(out / "pareto_throughput_vs_tpot.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    # speedup heatmap vs K=0
    sp = speedups(rec)
    if not sp:
        return paths
    steps, concs = rec.steps, rec.concurrencies
    grid = [[sp.get((k, c), {}).get("ratio", math.nan) for c in concs] for k in steps]
    finite = [v for row in grid for v in row if math.isfinite(v)]
    spread = max([abs(v - 1) for v in finite] + [0.05])
    fig, ax = plt.subplots(figsize=(1.3 * len(concs) + 2, 0.8 * len(steps) + 1.8))
    im = ax.imshow(grid, cmap="RdBu", norm=TwoSlopeNorm(1.0, 1 - spread, 1 + spread), aspect="auto")
    for i, k in enumerate(steps):
        for j, c in enumerate(concs):
            d = sp.get((k, c))
            if d is None:
                ax.text(j, i, "-", ha="center", va="center", fontsize=8)
                continue
            text = f"{d['ratio']:.2f}x"
            if math.isfinite(d["low"]) and math.isfinite(d["high"]):
                text += f"\n[{d['low']:.2f}, {d['high']:.2f}]"
            dark = abs(d["ratio"] - 1) > 0.6 * spread
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
            if chosen.get(c) == k:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2.5))
    ax.set_xticks(range(len(concs)), [str(c) for c in concs])
    ax.set_yticks(range(len(steps)), [f"K={k}" for k in steps])
    ax.set(xlabel="concurrency", ylabel="num_steps",
           title="output throughput vs K=0 (95% paired interval); boxed: recommended")
    fig.colorbar(im, ax=ax, label="speedup vs K=0")
    paths.append(out / "speedup_heatmap.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths
