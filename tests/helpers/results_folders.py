"""Results folders built from constructed rows, for the recommend, confidence, gate, report and engine-contract tests:
``row`` (one summary.csv row with every documented column, docs/results-format.md), ``grid`` (rows from a
{concurrency: {steps: throughput}} table) and ``write_sweep`` (the folder: summary.csv, and sweep.json /
points.jsonl / requests.jsonl when given)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from spectune.results.schema import NUMERIC_COLUMNS

ALPHA = 0.7  # per-token acceptance used for acceptance_length: 1 + sum(ALPHA^i, i=1..K)


def accepted(k: int) -> float:
    """Accepted drafts per verify at num_steps k under ALPHA: 0.7, 1.19, 1.533 for k = 1, 2, 3."""
    return sum(ALPHA ** i for i in range(1, k + 1))


def row(steps: int, conc: int, thr: float = 100.0, rep: int = 0, status: str = "ok", **kw) -> dict:
    """One summary.csv row with every documented column; ``kw`` overrides any column."""
    r: dict = {c: 1.0 for c in NUMERIC_COLUMNS}
    r.update(steps=steps, concurrency=conc, repeat=rep, status=status, error="" if status == "ok" else "boom",
             acceptance_length_source="spectune:/metrics counters", token_count_source="usage",
             output_throughput_tok_s=thr, tpot_p50_ms=10.0, tpot_p99_ms=15.0, acceptance_length=1 + accepted(steps),
             acceptance_rate=ALPHA, slo_attainment=None, goodput_req_s=None, achieved_concurrency=float(conc),
             duration_s=10.0, num_requests=20, num_failed=0, batch_size_mean=None, batch_size_p50=None,
             batch_size_source="none")  # no running-requests gauge unless a test gives one
    if status != "ok":
        r.update({c: None for c in NUMERIC_COLUMNS if c not in ("num_requests", "num_failed")})
    r.update(kw)
    return r


def write_sweep(folder: Path, rows: list[dict], plan: dict | None = None, points: list[dict] | None = None,
                requests: list[dict] | None = None) -> Path:
    """A results folder: summary.csv, and sweep.json / points.jsonl / requests.jsonl when given."""
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(folder / "summary.csv", index=False)
    if plan is not None:
        (folder / "sweep.json").write_text(json.dumps({"spectune_version": "0.1.0", "plan": plan}))
    for name, objs in (("points.jsonl", points), ("requests.jsonl", requests)):
        if objs is not None:
            (folder / name).write_text("".join(json.dumps(o) + "\n" for o in objs))
    return folder


def grid(table: dict[int, dict[int, float]], **kw) -> list[dict]:
    """Rows from {concurrency: {steps: throughput}}."""
    return [row(k, c, v, **kw) for c, by_k in table.items() for k, v in by_k.items()]
