"""The bake-off's tables (validate.json ``bakeoff``, :mod:`spectune.validate.bakeoff`) as text: validate.md's
section (:func:`markdown`), its opening words (:func:`subject`) and the cells the terminal and the report page
show (:func:`overall_cells`, :func:`phase_cells`). Reads JSON only, so validate.md's renderer can use it."""

from __future__ import annotations

from typing import Sequence

from spectune.core.json_types import JsonObject

OVERALL_HEADERS = ("config", "run", "verdict", "output tok/s", "/ best static [95%]", "TPOT p50 ms", "TPOT p99 ms",
                   "SLO attainment", "goodput req/s")
"""Columns of the overall bake-off table (:func:`overall_cells`)."""

PHASE_HEADERS = ("phase", "config", "steady tok/s", "/ phase's best static [95%]", "TPOT p50 ms", "TPOT p99 ms",
                 "SLO attainment", "goodput req/s", "ruling")
"""Columns of the per-phase bake-off table (:func:`phase_cells`)."""


def _f(v: object, spec: str) -> str:
    return "-" if not isinstance(v, (int, float)) or isinstance(v, bool) else format(v, spec)


def _pct(v: object) -> str:
    return "-" if not isinstance(v, (int, float)) else f"{v:.1%}"


def _ratio(d: JsonObject) -> str:
    """``1.031x [0.990, 1.072]``, ``1.031x`` without an interval, ``-`` without a ratio."""
    r = d.get("ratio")
    if not isinstance(r, (int, float)):
        return "-"
    iv = f" [{d['low']:.3f}, {d['high']:.3f}]" if isinstance(d.get("low"), (int, float)) else ""
    return f"{r:.3f}x{iv}"


def _label(row: JsonObject) -> str:
    return str(row["name"]) if row.get("name") is not None else f"best static K={row.get('steps')}"


def overall_cells(bakeoff: JsonObject) -> list[list[str]]:
    """One row per config, the best static first (:data:`OVERALL_HEADERS`): output tok/s, its ratio to the best
    static with the interval, TPOT p50/p99 (ms), SLO attainment, goodput (req/s); means over repeats."""
    rows = []
    for row in ([bakeoff["best_static"]] if bakeoff.get("best_static") else []) + list(bakeoff.get("configs") or []):
        o = row.get("overall") or {}
        v = row.get("verdict") or {}
        rows.append([_label(row), str(row.get("run")), str(v.get("outcome") or "-"),
                     _f(o.get("output_throughput_tok_s"), ",.1f"), "1" if row.get("name") is None else _ratio(o),
                     _f(o.get("tpot_p50_ms"), ".2f"), _f(o.get("tpot_p99_ms"), ".2f"), _pct(o.get("slo_attainment")),
                     _f(o.get("goodput_req_s"), ".2f")])
    return rows


def phase_cells(bakeoff: JsonObject, labels: Sequence[str] = ()) -> list[list[str]]:
    """Per phase, that phase's best static num_steps (``phase_best_static``) then each config
    (:data:`PHASE_HEADERS`): steady output tok/s, its ratio to that phase's best static with the interval, TPOT
    p50/p99 (ms), SLO attainment, goodput (req/s) and the ruling (``holds``, ``noise``, ``behind``)."""
    tops = list(bakeoff.get("phase_best_static") or [])
    configs = list(bakeoff.get("configs") or [])
    n = max([len(tops), *(len(r.get("phases") or []) for r in configs)], default=0)
    out = []
    for i in range(n):
        top = tops[i] if i < len(tops) else None
        rows = ([("best static K=" + str(top.get("steps")), top, "-")] if top else []) + [
            (str(r.get("name")), (r.get("phases") or [])[i], None) for r in configs if len(r.get("phases") or []) > i]
        for name, ph, fixed in rows:
            label = ph.get("label") or (labels[i] if i < len(labels) else "")
            ratio = fixed or _ratio(ph)
            if fixed is None and ph.get("best_static") is not None and ratio != "-":
                ratio += f" K={ph['best_static']}"
            out.append([f"{i + 1}: {label}", name, _f(ph.get("steady_output_throughput_tok_s"), ",.1f"), ratio,
                        _f(ph.get("tpot_p50_ms"), ".2f"), _f(ph.get("tpot_p99_ms"), ".2f"),
                        _pct(ph.get("slo_attainment")), _f(ph.get("goodput_req_s"), ".2f"),
                        str(ph.get("ruling") or "-")])
    return out


def winner_sentence(bakeoff: JsonObject) -> str:
    """``Winner: NAME.`` or, with no passing config, ``Winner: the best static num_steps K=k (no config passes).``"""
    if bakeoff.get("winner") is not None:
        return f"Winner: {bakeoff['winner']}."
    best = bakeoff.get("best_static")
    if best is None:
        return "Winner: none (no static num_steps run succeeded)."
    return f"Winner: the best static num_steps K={best.get('steps')} (no config passes)."


def subject(meta: JsonObject) -> str | None:
    """validate.md's opening words for a bake-off (``Bake-off of 2 configs: `a` (`a.json`, vllm-schedule,
    candidate steps 0, 3) and `b` (...)``), None for one config."""
    configs = meta.get("configs")
    if not configs:
        return None
    parts = [f"`{c.get('name')}` (`{c.get('path')}`, {c.get('format')}, candidate steps "
             f"{', '.join(map(str, c.get('candidate_steps') or []))})" for c in configs]
    return f"Bake-off of {len(parts)} configs: " + ", ".join(parts[:-1]) + f" and {parts[-1]}"


def _table(headers: Sequence[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
            + ["| " + " | ".join(r) + " |" for r in rows] + [""])


def markdown(meta: JsonObject) -> list[str]:
    """validate.md's bake-off section (nothing without ``meta["bakeoff"]``): the winner, the overall table, the
    per-phase table and every config's verdict line."""
    b = meta.get("bakeoff")
    if not b:
        return []
    labels = [p.get("label") or "" for p in ((meta.get("plan") or {}).get("workload") or {}).get("phases") or []]
    lines = ["## Bake-off: each config against the best static num_steps", "",
             f"{winner_sentence(b)} The same static runs serve every config; each config is ruled as a validation of "
             "it alone would rule it, against the best static num_steps (highest overall output tok/s). `/ best "
             "static`: output tok/s over the best static's with its 95% interval (server-to-server spread of the "
             "whole bake-off included); goodput: requests that met the SLOs per s.", ""]
    lines += _table(OVERALL_HEADERS, overall_cells(b))
    lines += ["Per phase: steady output tok/s (after the earlier phases' spill-over) against that phase's best static "
              "num_steps (`K=`), TPOT and SLO attainment over the requests sent in the phase; the ruling as in the "
              "one-config phase check (`holds` within 3%, `noise`, `behind`).", ""]
    lines += _table(PHASE_HEADERS, phase_cells(b, labels))
    lines += ["Verdicts:", ""] + [f"- **{r.get('name')}**: {(r.get('verdict') or {}).get('line')}"
                                  for r in b.get("configs") or []] + [""]
    return lines
