"""simulate's predictions beside the measured sweep cells: the prediction error per policy and concurrency.

Reads a ``spectune simulate --json`` result and the sweep folder whose cells it should predict: static num_steps K
cells (``summary.csv``) and ``--p-min`` cutoff cells (``p-min/P/summary.csv``, at num_steps = the cap). For each
measured cell at concurrency c it takes the simulated policy (``static:K`` or ``p_min:P``) at batch size c and prints
the measured output tok/s and TPOT p50, simulate's prediction, and the error. simulate's tok/s counts decode rounds
only (``spectune/tune/policy_replay.py``); a cell's time also holds its prefills, so the prediction compared is
``tok/s x (1 - engine_prefill_share)``, the cell's own measured share of engine time spent prefilling (the raw
decode-only figure is printed too). TPOT is compared as simulate gives it (the mean decode round / tokens per row).

Usage: ``python benchmarks/simulate_vs_sweep.py SIMULATE_JSON SWEEP_DIR``. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path


def cells(sweep: Path) -> list[tuple[str, int, dict[str, str]]]:
    """(simulate policy name, concurrency, summary.csv row) of every ok cell of ``sweep`` and its p-min folders."""
    out = []
    for row in csv.DictReader((sweep / "summary.csv").open()):
        if row["status"] == "ok":
            out.append((f"static:{int(row['steps'])}", int(row["concurrency"]), row))
    for sub in sorted((sweep / "p-min").glob("*")) if (sweep / "p-min").is_dir() else []:
        for row in csv.DictReader((sub / "summary.csv").open()):
            if row["status"] == "ok":
                out.append((f"p_min:{float(row['p_min']):g}", int(row["concurrency"]), row))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("simulate_json", type=Path)
    parser.add_argument("sweep", type=Path)
    args = parser.parse_args()
    sim = json.loads(args.simulate_json.read_text())
    policies = {p["policy"]: p for p in sim["policies"]}
    print(f"step-time model: {sim['step_time_model'].get('source', sim['step_time_model'])}")
    print("| policy | concurrency | measured tok/s | predicted (decode only) | predicted x (1 - prefill share) | error "
          "| measured TPOT p50 ms | predicted TPOT ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    errors = []
    for name, c, row in cells(args.sweep):
        pol = policies.get(name)
        by = (pol or {}).get("by_batch_size", {}).get(str(c))
        if by is None:
            print(f"| {name} | {c} | {float(row['output_throughput_tok_s']):.1f} | - | - | - | - | - |")
            continue
        measured = float(row["output_throughput_tok_s"])
        share = float(row.get("engine_prefill_share") or 0.0)
        predicted = by["tok_s"] * (1.0 - share)
        err = predicted / measured - 1.0
        errors.append(abs(err))
        print(f"| {name} | {c} | {measured:.1f} | {by['tok_s']:.1f} | {predicted:.1f} | {err:+.1%} | "
              f"{float(row['tpot_p50_ms']):.2f} | {by['tpot_ms']:.2f} |")
    if errors:
        print(f"\n{len(errors)} cells: mean |error| {sum(errors) / len(errors):.1%}, max {max(errors):.1%}, "
              f"within 10%: {sum(e <= 0.10 for e in errors)}")


if __name__ == "__main__":
    main()
