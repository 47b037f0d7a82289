"""Does a draft-confidence cutoff beat the best static num_steps? (``spectune sweep --p-min`` cells, docs/recommend.md
"Draft confidence cutoff").

A sweep with ``--p-min`` holds, beside its static cells, one sweep folder per cutoff P (``p-min/P/``): a server that
drafts at most K tokens (K: the sweep's largest num_steps) and stops a row's draft at the first draft token whose
probability is under P (llama.cpp ``--spec-draft-p-min``, ``common/speculative.cpp``
``common_speculative_impl_draft_eagle3``). llama.cpp takes one setting per server, as it takes one draft length, so
a cutoff replaces the static answer only where it is better over the whole measured range:

1. each cutoff's cells are built as the static ones (:func:`spectune.tune.recommend.build_cell`, medians over
   repeats, SLO violations) with paired bootstrap intervals on the same prompts
   (:func:`spectune.tune.recommend.attach_intervals`, on the static cells'
   :class:`~spectune.results.confidence.Bootstrap`);
2. at every concurrency the cutoff's cell is compared with the best static num_steps' cell
   (:func:`spectune.tune.compare.compare`, the band of that concurrency's choice: the noise band widened by the
   cell's spread and the sweep's drift);
3. a cutoff qualifies when its cell is eligible at every concurrency the best static num_steps was chosen over, it
   beats that num_steps beyond the band at one or more of them and loses at none; among those, the best geometric
   mean of the paired ratios wins (the objective's ratio, inverted for minimised objectives).

Without a qualifying cutoff the static answer stands, and the recommendation says why.
"""

from __future__ import annotations

import math

import numpy as np

from spectune.core.json_types import JsonObject
from spectune.results.confidence import Bootstrap, prompt_ids
from spectune.results.reader import Results, load_request_records, summary_with_slos
from spectune.tune.compare import OBJECTIVES
from spectune.tune.recommend import Cell, Recommendation, attach_intervals, build_cell, effective_slos

__all__ = ["p_min_cells", "choose_p_min", "apply_p_min"]


def p_min_cells(rec: Recommendation, cutoffs: dict[float, Results]) -> dict[float, list[Cell]]:
    """{P: its cells} from the cutoffs' sweeps (``Results.p_min``), ``server`` ``p_min:P``, with intervals on the
    static cells' bootstrap (the same prompts, so comparisons pair by prompt)."""
    opts = rec.options
    boot = next((c.bootstrap for c in rec.cells if c.bootstrap is not None), None)
    out: dict[float, list[Cell]] = {}
    seed = len(rec.cells) + len(rec.schedule_cells)
    for p_min, res in sorted(cutoffs.items()):
        ttft, tpot, _ = effective_slos(res, opts)
        df = summary_with_slos(res, ttft, tpot, [])
        records = load_request_records(res.folder)
        if boot is None:
            boot = Bootstrap(prompt_ids([records or []]))
        cells = [build_cell(int(k), int(c), rows, opts, ttft, tpot) for (k, c), rows in sorted(
            dict(iter(df.groupby(["steps", "concurrency"]))).items())]
        for cell in cells:
            cell.server = f"p_min:{p_min:g}"
        attach_intervals(cells, df, records, opts, ttft, tpot, boot, seed)
        seed += len(cells)
        out[p_min] = cells
    return out


def choose_p_min(rec: Recommendation, cells: dict[float, list[Cell]]) -> JsonObject | None:
    """The decision of the module docstring: ``{"p_min": P or None, "num_steps": K of the cutoff cells,
    "static_num_steps": the best static K, "beats": whether P replaces the static answer, "reason": one sentence,
    "values": [{"p_min", "score", "verdicts": {concurrency: verdict}, "comparisons": [...]}]}``; None without
    cutoff cells."""
    if not cells:
        return None
    k0 = rec.best_static
    steps = next((c.steps for cs in cells.values() for c in cs), None)
    if k0 is None:
        return {"p_min": None, "num_steps": steps, "static_num_steps": None, "beats": False, "values": [],
                "reason": "no static num_steps was measured ok at every concurrency, so no cutoff is compared"}
    _, direction, _ = OBJECTIVES[rec.options.objective]
    concs = [ch.concurrency for ch in rec.choices if ch.steps is not None]
    bands = {ch.concurrency: ch.band for ch in rec.choices}
    values, qualified = [], []
    for p_min, cs in sorted(cells.items()):
        by_conc = {c.concurrency: c for c in cs}
        comparisons, verdicts, ratios = [], {}, []
        for conc in concs:
            a, b = by_conc.get(conc), rec.cell(k0, conc)
            if a is None or b is None or not a.eligible or b.status != "ok" or b.predicted:
                verdicts[conc] = "not comparable" if a is None or a.status != "ok" else "not eligible"
                continue
            cmp = rec.compare(a, b, max(bands.get(conc, rec.options.noise_band), rec.options.noise_band))
            cmp["text"] = cmp["text"].replace(f"num_steps {a.steps} ", f"num_steps {a.steps} with p_min {p_min:g} ", 1)
            comparisons.append(cmp)
            verdicts[conc] = cmp["verdict"]
            r = cmp["ratio"] if direction == "max" else 1 / cmp["ratio"]
            ratios.append(r)
        score = float(np.exp(np.mean(np.log(ratios)))) if ratios and all(r > 0 for r in ratios) else math.nan
        values.append({"p_min": p_min, "score": score, "verdicts": verdicts, "comparisons": comparisons})
        if len(ratios) == len(concs) and "beats" in verdicts.values() and "loses" not in verdicts.values():
            qualified.append((score, p_min))
    base = {"num_steps": steps, "static_num_steps": k0, "values": values}
    if qualified:
        score, best = max(qualified)
        won = [c["concurrency"] for c in next(v for v in values if v["p_min"] == best)["comparisons"]
               if c["verdict"] == "beats"]
        return {"p_min": best, "beats": True, **base,
                "reason": f"p_min {best:g} at num_steps {steps} beats the best static num_steps {k0} beyond the "
                          f"noise band at concurrency {', '.join(map(str, won))} and loses nowhere "
                          f"({score:.3f}x over the range, geometric mean)"}
    said = "; ".join(f"p_min {v['p_min']:g}: " + (", ".join(f"c={c} {w}" for c, w in v["verdicts"].items()) or
                                                   "no comparable cell") for v in values)
    return {"p_min": None, "beats": False, **base,
            "reason": f"no cutoff beats the best static num_steps {k0} beyond the noise band at some concurrency "
                      f"while losing at none ({said}): the static answer stands"}


def apply_p_min(rec: Recommendation, results: Results) -> None:
    """Set ``rec.p_min_cells`` and ``rec.p_min`` (:func:`choose_p_min`) from ``results.p_min`` (the sweep's
    ``p-min/P/`` folders); a no-op without them. The llama.cpp settings and recommendation.md carry the decision
    (:mod:`spectune.backends.formats.llamacpp`)."""
    if not results.p_min:
        return
    cells = p_min_cells(rec, results.p_min)
    rec.p_min_cells = [c for cs in cells.values() for c in cs]
    rec.p_min = choose_p_min(rec, cells)
