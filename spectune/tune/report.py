"""``spectune report``: PNG plots of a sweep and a self-contained HTML page.

matplotlib is imported lazily (Agg backend) so the CLI starts fast. The HTML page embeds its plots as base64 PNG
data URIs and its tables as pandas ``to_html`` output: it loads nothing from the network.
"""


from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

import pandas as pd

from spectune.results.reader import Results


def _medians(df: pd.DataFrame, col: str) -> pd.DataFrame:
    ok = df[df["status"] == "ok"]
    return ok.groupby(["steps", "concurrency"])[col].median().unstack("steps") if col in ok else pd.DataFrame()


def per_category_acceptance(points: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """{category: {num_steps: median acceptance length over its ok points}} from points.jsonl ``per_category``."""
    acc: dict[str, dict[int, list[float]]] = {}
    for pt in points:
        if pt.get("status", "ok") != "ok":
            continue
        for cat, v in (pt.get("per_category") or {}).items():
            if isinstance(v, dict) and isinstance(v.get("acceptance_length"), (int, float)):
                acc.setdefault(str(cat), {}).setdefault(int(pt["steps"]), []).append(float(v["acceptance_length"]))
    return {cat: {k: float(pd.Series(by_k[k]).median()) for k in sorted(by_k)} for cat, by_k in sorted(acc.items())}


def make_plots(results: Results, out: Path) -> list[Path]:
    """Write tpot_vs_concurrency.png, throughput_vs_concurrency.png, acceptance_vs_steps.png,
    slo_attainment_vs_concurrency.png and the choice plots of :mod:`spectune.tune.report_choice`
    (pareto_throughput_vs_tpot.png, speedup_heatmap.png) into ``out``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df, paths = results.summary, []
    for name, col, ylabel in (("tpot_vs_concurrency", "tpot_p50_ms", "TPOT p50 (ms)"),
                              ("throughput_vs_concurrency", "output_throughput_tok_s", "output throughput (tokens/s)"),
                              ("slo_attainment_vs_concurrency", "slo_attainment", "SLO attainment")):
        fig, ax = plt.subplots(figsize=(6, 4))
        table = _medians(df, col)
        if table.empty or table.isna().all().all():
            ax.text(0.5, 0.5, f"no {col} data", ha="center", va="center", transform=ax.transAxes)
        else:
            for k in table.columns:
                ax.plot(table.index, table[k], marker="o", label=f"K={k}")
            ax.set_xscale("log", base=2)
            ax.set_xticks(list(table.index), [str(i) for i in table.index])
            ax.legend(title="num_steps")
        ax.set(xlabel="concurrency (requests)", ylabel=ylabel, title=f"{ylabel} vs concurrency")
        ax.grid(alpha=0.3)
        paths.append(out / f"{name}.png")
        fig.tight_layout()
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    acc = df[df["status"] == "ok"].groupby("steps")["acceptance_length"].median() if "acceptance_length" in df \
        else pd.Series(dtype=float)
    ax.plot(acc.index, acc.values, marker="o", color="black", label="all prompts")
    for cat, by_k in per_category_acceptance(results.points or []).items():
        ax.plot(list(by_k), list(by_k.values()), marker=".", linestyle="--", label=cat)
    ax.set(xlabel="num_steps K", ylabel="acceptance length (tokens/verify)", title="acceptance length vs num_steps")
    ax.legend()
    ax.grid(alpha=0.3)
    paths.append(out / "acceptance_vs_steps.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    from spectune.tune.report_choice import make_choice_plots

    return paths + make_choice_plots(results, out)


def write_report(results: Results, out: Path) -> Path:
    """Plots plus ``report.html`` (self-contained) in ``out``; returns the HTML path."""
    out.mkdir(parents=True, exist_ok=True)
    pngs = make_plots(results, out)
    df = results.summary
    cols = [c for c in ("output_throughput_tok_s", "tpot_p50_ms", "tpot_p99_ms", "ttft_p50_ms", "acceptance_length",
                        "slo_attainment", "goodput_req_s") if c in df]
    med = df[df["status"] == "ok"].groupby(["concurrency", "steps"])[cols].median().reset_index()
    imgs = "\n".join(f'<h3>{html.escape(p.stem)}</h3><img alt="{html.escape(p.stem)}" '
                     f'src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">' for p in pngs)
    failed = df[df["status"] != "ok"]
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>spectune report</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}} img{{max-width:640px}}</style></head><body>
<h1>spectune sweep report</h1><p>Source: <code>{html.escape(str(results.source))}</code></p>
<h2>Plan</h2><pre>{html.escape(json.dumps(results.plan, indent=2)) if results.plan else "(bare summary.csv)"}</pre>
<h2>Plots</h2>{imgs}
<h2>Medians per cell (ok repeats)</h2>{med.to_html(index=False, float_format=lambda x: f"{x:.4g}", na_rep="-")}
<h2>Failed points ({len(failed)})</h2>{failed[[c for c in ("steps", "concurrency", "repeat", "error")
                                              if c in failed]].to_html(index=False) if len(failed) else "<p>none</p>"}
<h2>All points</h2>{df.to_html(index=False, float_format=lambda x: f"{x:.4g}", na_rep="-")}
</body></html>
"""
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
