"""``spectune report``'s plots of the choice: a throughput-vs-TPOT Pareto plot (one curve per num_steps, points
labelled by concurrency) and a speedup heatmap (num_steps x concurrency, output throughput vs num_steps 0 with its
paired bootstrap interval), each with the schedule ``spectune recommend`` would choose (default options) drawn on it.

The cells, the intervals and the choice are :func:`spectune.tune.recommend.recommend`'s (throughput objective,
intervals from :func:`spectune.tune.recommend.compare`: requests resampled by prompt, paired across cells). What
the plots mark as recommended is the primary recommendation (``rec.slots``: a static num_steps at every concurrency
when recommend names one), the same answer :func:`answer` words per engine for the report's first lines.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from spectune.core.errors import UserError
from spectune.results.confidence import Interval
from spectune.results.reader import Results

if TYPE_CHECKING:
    from spectune.tune.recommend import Recommendation

Speedups = dict[tuple[int, int], Interval]
"""{(num_steps, concurrency): output throughput / num_steps 0's at that concurrency, with its interval}."""


def default_recommendation(results: Results) -> Recommendation | None:
    """:func:`spectune.tune.recommend.recommend` with its default options, or None where it raises UserError."""
    from spectune.tune.recommend import RecommendOptions, recommend

    try:
        return recommend(results, RecommendOptions())
    except UserError:
        return None


def speedups(rec: Recommendation) -> Speedups:
    """{(num_steps, concurrency): ratio [low, high]}: output throughput of each measured ok cell / num_steps 0's at the
    same concurrency, with the paired 95% interval (NaN bounds without requests.jsonl or repeats)."""
    from spectune.tune.recommend import compare

    out = {}
    for c in rec.cells:
        base = rec.cell(0, c.concurrency)
        if c.status != "ok" or c.predicted or base is None or base.status != "ok" or not base.objective:
            continue
        if c.steps == 0:
            out[(0, c.concurrency)] = Interval(1.0)
            continue
        cmp = compare(c, base, rec.options, rec.options.noise_band)
        out[(c.steps, c.concurrency)] = Interval(cmp["ratio"], cmp["low"], cmp["high"])
    return out


def answer_steps(rec: Recommendation) -> dict[int, int]:
    """{concurrency: num_steps} of the primary recommendation: its slots' measured concurrencies (one static
    num_steps everywhere when recommend names one), else the per-concurrency choices."""
    out = {c: s.steps for s in rec.slots for c in s.concurrencies}
    return out or {ch.concurrency: ch.steps for ch in rec.choices if ch.steps is not None}


def _gain(sp: Speedups, k: int, c: int) -> str:
    """One cell's output throughput vs num_steps 0 as ``1.26x [1.22, 1.30]`` (no interval when unknown)."""
    d = sp[(k, c)]
    iv = f" [{d.low:.2f}, {d.high:.2f}]" if math.isfinite(d.low) and math.isfinite(d.high) else ""
    return f"{d.value:.2f}x{iv}"


def gain_text(rec: Recommendation, steps_at: dict[int, int], sp: Speedups | None = None) -> str:
    """How the answer ``steps_at`` ({concurrency: num_steps}) does against no speculation at the lowest and the
    highest concurrency the sweep measured for it (``vs K=0: 1.26x [1.21, 1.31] at concurrency 1, ...``): output
    throughput vs K=0 with the paired 95% interval; where the
    answer is K=0 itself, what the best num_steps > 0 would give there. Empty when no such cell was measured.
    ``sp``: :func:`speedups` of ``rec`` when already computed."""
    sp = speedups(rec) if sp is None else sp
    measured = [c for c in sorted(steps_at) if (steps_at[c], c) in sp]
    parts = []
    for c in dict.fromkeys(measured[:1] + measured[-1:]):
        k = steps_at[c]
        if k:
            parts.append(f"{_gain(sp, k, c)} at concurrency {c}")
            continue
        drafted = [kk for kk in rec.steps if kk and (kk, c) in sp]
        best = max(drafted, key=lambda kk: sp[(kk, c)].value, default=None)
        parts.append(f"K=0 at concurrency {c}" + (f" (best K={best} there: {_gain(sp, best, c)})" if best else ""))
    return ("vs K=0: " + ", ".join(parts)) if parts else ""


def _slots_text(rec: Recommendation) -> str:
    return ", ".join(f"batch {s.lower}-{s.upper if s.upper is not None else ''}: K={s.steps}" for s in rec.slots)


def answer(rec: Recommendation) -> tuple[str, list[tuple[str, str, str]]]:
    """The primary recommendation in words: (headline, [(engine, setting, gain)]), one entry per engine (SGLang,
    vLLM, TensorRT-LLM, llama.cpp); ``gain`` is :func:`gain_text` of what that engine runs (llama.cpp takes one
    static num_steps, so a schedule's line for it is the best static num_steps)."""
    k = rec.primary.num_steps if rec.primary and rec.primary.kind == "static" else None
    steps_at = answer_steps(rec)
    if k is None and len(set(steps_at.values())) == 1:
        k = next(iter(steps_at.values()))
    sp = speedups(rec)
    if k is not None:
        head = (f"Static num_steps K={k} for every engine" if k else
                "No speculative decoding (K=0) for every engine")
        gain = gain_text(rec, steps_at, sp)
        if k:
            rows = [("SGLang", f"--speculative-num-steps {k} --speculative-num-draft-tokens {k + 1}", gain),
                    ("vLLM", f'"num_speculative_tokens": {k}', gain),
                    ("TensorRT-LLM", f"max_draft_len {k}", gain),
                    ("llama.cpp", f"--spec-draft-n-max {k}", gain)]
        else:
            rows = [(e, "launch without a draft model", gain) for e in ("SGLang", "vLLM", "TensorRT-LLM", "llama.cpp")]
        return head, rows
    slots, gain = _slots_text(rec), gain_text(rec, steps_at, sp)
    rows = [("SGLang", f"sglang-adaptive-custom.json ({slots})", gain),
            ("vLLM", f"num_speculative_tokens_per_batch_size ({slots})", gain),
            ("TensorRT-LLM", f"draft_len_schedule ({slots})", gain)]
    kb = rec.best_static
    if kb is not None:
        rows.append(("llama.cpp", f"--spec-draft-n-max {kb} (one static num_steps)" if kb else
                     "no draft model (one static num_steps: K=0)",
                     gain_text(rec, {c: kb for c in rec.concurrencies}, sp)))
    return "A per-batch-size schedule: " + slots, rows


def make_choice_plots(results: Results, out: Path) -> list[Path]:
    """Write pareto_throughput_vs_tpot.png and speedup_heatmap.png into ``out`` (nothing when the sweep has no
    usable throughput cell or no num_steps 0); returns their paths."""
    rec = default_recommendation(results)
    if rec is None or rec.options.objective != "throughput":
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.patches import Rectangle

    paths: list[Path] = []
    chosen = answer_steps(rec)
    schedule = " ".join(f"c{c}:K{k}" for c, k in sorted(chosen.items()))

    # Pareto: throughput vs TPOT p50
    fig, ax = plt.subplots(figsize=(7, 5))
    for k in rec.steps:
        cells = [c for c in rec.cells if c.steps == k and c.status == "ok" and not c.predicted
                 and math.isfinite(c.metric("tpot_p50_ms"))]
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
                markersize=12, label=f"recommended\n({schedule})" if len(set(chosen.values())) > 1
                else f"recommended (K={next(iter(chosen.values()))})", zorder=5)
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(xlabel="TPOT p50 (ms, log scale)", ylabel="output throughput (tokens/s)",
           title="throughput vs TPOT per num_steps (labels: concurrency)")
    ax.legend(title="num_steps", fontsize=8, loc="lower right")
    ax.grid(alpha=0.3, which="both")
    paths.append(out / "pareto_throughput_vs_tpot.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    # speedup heatmap vs K=0
    sp = speedups(rec)
    if not sp:
        return paths
    steps, concs = rec.steps, rec.concurrencies
    grid = [[sp.get((k, c), Interval(math.nan)).value for c in concs] for k in steps]
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
            text = f"{d.value:.2f}x"
            if math.isfinite(d.low) and math.isfinite(d.high):
                text += f"\n[{d.low:.2f}, {d.high:.2f}]"
            dark = abs(d.value - 1) > 0.6 * spread
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if dark else "black")
            if chosen.get(c) == k:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2.5))
    ax.set_xticks(range(len(concs)), [str(c) for c in concs])
    ax.set_yticks(range(len(steps)), [f"K={k}" for k in steps])
    ax.set(xlabel="concurrency (requests)", ylabel="num_steps")
    # centred on the figure (not the axes) and wrapped to its width (about 8 px per character at 12 pt and
    # 100 dpi), so no part falls outside the image
    title = "output tokens/s vs no speculation (K=0), 95% paired interval; boxed: the recommendation"
    fig.suptitle("\n".join(textwrap.wrap(title, max(20, int(fig.get_figwidth() * 100 / 8)))), fontsize=12)
    fig.colorbar(im, ax=ax, label="speedup vs K=0")
    paths.append(out / "speedup_heatmap.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths
