"""``spectune report``: PNG plots of a sweep and a self-contained HTML page that opens with the answer.

matplotlib is imported lazily (Agg backend) so the CLI starts fast. The HTML page (:mod:`spectune.tune.report_html`)
embeds its plots as base64 PNG data URIs and its tables as HTML: it loads nothing from the network.
"""


from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd

from spectune.results.point import PointObject, SweepPoint, as_points
from spectune.results.reader import Results
from spectune.tune.report_html import esc, file_links, frame_table, image, nowrap_words, page


def _medians(df: pd.DataFrame, col: str) -> pd.DataFrame:
    ok = df[df["status"] == "ok"]
    return ok.groupby(["steps", "concurrency"])[col].median().unstack("steps") if col in ok else pd.DataFrame()


def per_category_acceptance(points: Iterable[SweepPoint | PointObject]) -> dict[str, dict[int, float]]:
    """{category: {num_steps: median acceptance length over its ok points}} from points.jsonl ``per_category``
    (points as records or as parsed objects, :func:`spectune.results.point.as_points`)."""
    acc: dict[str, dict[int, list[float]]] = {}
    for pt in as_points(points):
        if pt.status != "ok":
            continue
        for cat, al in pt.category_acceptance().items():
            acc.setdefault(cat, {}).setdefault(int(pt.steps), []).append(al)
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
    ax.xaxis.get_major_locator().set_params(integer=True)  # num_steps are whole numbers
    ax.legend()
    ax.grid(alpha=0.3)
    paths.append(out / "acceptance_vs_steps.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    from spectune.tune.report_choice import make_choice_plots

    return paths + make_choice_plots(results, out)


PLOT_CAPTIONS = {
    "tpot_vs_concurrency": "TPOT p50 per num_steps",
    "throughput_vs_concurrency": "output tokens/s per num_steps",
    "acceptance_vs_steps": "acceptance length (tokens per verify step)",
    "pareto_throughput_vs_tpot": "throughput against TPOT (the Pareto front), the recommendation dashed",
    "slo_attainment_vs_concurrency": "SLO attainment per num_steps",
}
RESULT_FILES = ("summary.csv", "sweep.json", "points.jsonl", "requests.jsonl", "requests.jsonl.gz")


def _meta(results: Results) -> str:
    meta = results.meta
    parts = [f"source <code>{esc(results.source)}</code>"]
    backend = meta.backend_value("backend")
    if backend:
        parts.append(f"backend {esc(backend)}")
    if meta.plan_value("dataset"):
        parts.append(f"{esc(meta.plan_value('dataset'))} prompts, {esc(meta.plan_value('max_tokens'))} tokens each")
    if meta.created:
        parts.append(f"measured {esc(str(meta.created)[:16].replace('T', ' '))} UTC")
    return " · ".join(parts)


def _answer_html(results: Results) -> str:
    from spectune.tune.report_choice import answer, default_recommendation

    rec = default_recommendation(results)
    if rec is None or not rec.cells:
        return ('<section id="answer" class="answer"><p class="lead"><b>No recommendation</b>: the sweep has no '
                "cell recommend can use (see the tables below).</p></section>")
    head, rows = answer(rec)
    gains = {gain for _, _, gain in rows}
    shared = gains.pop() if len(gains) == 1 else None  # one interval for every engine: said once, in the lead
    items = "".join(f"<li><b>{esc(engine)}</b> <code>{nowrap_words(setting)}</code>"
                    + (f" · {esc(gain)}" if gain and shared is None else "") + "</li>"
                    for engine, setting, gain in rows)
    why = rec.primary.reason if rec.primary else None
    details = f"<details><summary>why</summary><p>{esc(why)}.</p></details>" if why else ""
    return (f'<section id="answer" class="answer"><p class="lead"><b>{esc(head)}</b>'
            + (f": output tokens/s {esc(shared)}" if shared else "")
            + ' <span class="meta">(primary recommendation; 95% paired intervals)</span></p>'
            f"<ul>{items}</ul>{details}</section>")


def write_report(results: Results, out: Path) -> Path:
    """Plots plus ``report.html`` (self-contained) in ``out``; returns the HTML path.

    The page opens with the primary recommendation per engine and its interval against no speculation, then the
    speedup heatmap, the TPOT, throughput and acceptance plots and the Pareto front, then the tables; the raw files
    are linked, not shown."""
    out.mkdir(parents=True, exist_ok=True)
    pngs = {p.stem: p for p in make_plots(results, out)}
    df = results.summary
    cols = [c for c in ("output_throughput_tok_s", "tpot_p50_ms", "tpot_p99_ms", "ttft_p50_ms", "acceptance_length",
                        "slo_attainment", "goodput_req_s") if c in df]
    med = df[df["status"] == "ok"].groupby(["concurrency", "steps"])[cols].median().reset_index()
    heat = pngs.pop("speedup_heatmap", None)
    top = image(heat, "speedup heatmap: output tokens/s vs K=0 per num_steps and concurrency", "heatmap",
                caption_html=f'full size: <a href="{heat.name}">{heat.name}</a>') if heat else ""
    order = [n for n in PLOT_CAPTIONS if n in pngs] + [n for n in pngs if n not in PLOT_CAPTIONS]
    plots = "".join(image(pngs[n], n.replace("_", " "), caption=PLOT_CAPTIONS.get(n)) for n in order)
    failed = df[df["status"] != "ok"]
    failed_html = frame_table(failed[[c for c in ("steps", "concurrency", "repeat", "error") if c in failed]]) \
        if len(failed) else "<p>none</p>"
    body = (f"{top}<h2>Plots</h2><div class=\"plots\">{plots}</div>"
            f"<h2>Medians per cell (ok repeats)</h2>{frame_table(med)}"
            f"<h2>Failed points ({len(failed)})</h2>{failed_html}"
            f"<details><summary>All {len(df)} points</summary>{frame_table(df)}</details>"
            + file_links(results.folder, out, RESULT_FILES))
    path = out / "report.html"
    path.write_text(page("spectune sweep report", _meta(results), _answer_html(results), body), encoding="utf-8")
    return path
