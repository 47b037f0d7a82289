"""What an early-stopped window would report, against the same window run in full, on finished grid sweeps.

    python benchmarks/early_stop_estimates.py RUN1/grid RUN2/grid ...

Every folder is a finished ``spectune sweep --plan grid`` (requests.jsonl with each request's ``send_time``,
``end_time``, ``e2e_ms``, ``completion_tokens``). Each full window at concurrency c >= 4 is cut after its first one or
two closed-loop waves of finished requests (n = max(waves x c, 8); windows that have no more than n requests are
skipped) and three readings of the cut window are set against the full window's own figure (``metrics
.output_throughput_tok_s``: its tokens over its length):

- ``statistic``: the Little's-law throughput of the n finished requests (:func:`spectune.sweep.sequential
  .closed_loop_throughput`), what an early-stopped window reports (the requests in flight cancelled);
- ``drained x drain factor``: the requests in flight at the cut finishing too (every request sent by then), the
  statistic of those times another full window's own figure over its statistic over all its requests;
- ``statistic x matched scale``: the statistic times another full window's own figure over the statistic of its
  own first n finished requests.

The scaled readings take each other full window of the same concurrency in turn (a guided sweep has one or two at
most concurrencies). Prints, per concurrency and number of waves, the windows cut, then for each reading the mean
ratio to the full window's figure and the RMS of (ratio - 1), as a Markdown table (the figures:
:mod:`spectune.sweep.sequential`, "What an early-stopped window reports").
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

READINGS = ("statistic", "drained x drain factor", "statistic x matched scale")


def load(grid: Path) -> tuple[dict[tuple[int, int], list[dict]], dict[tuple[int, int], float]]:
    """(successful requests of each (num_steps, concurrency) ordered by end time, each cell's reported tokens/s) of
    a grid folder's first repeat, drift checks left out."""
    cells: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for line in (grid / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("drift_check") is None and r.get("repeat", 0) == 0 and r.get("error") is None \
                and r.get("completion_tokens"):
            cells[(r["steps"], r["concurrency"])].append(r)
    for rs in cells.values():
        rs.sort(key=lambda r: r["end_time"])
    reported = {}
    for line in (grid / "points.jsonl").read_text().splitlines():
        p = json.loads(line)
        if p.get("drift_check") is None and p.get("status") == "ok" and p.get("repeat", 0) == 0:
            reported[(p["steps"], p["concurrency"])] = p["metrics"]["output_throughput_tok_s"]
    return cells, reported


def main(argv: list[str] | None = None) -> int:
    from spectune.sweep.sequential import closed_loop_throughput as little

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("grids", nargs="+", type=Path, help="finished grid sweep folders")
    args = p.parse_args(argv)
    ratios: dict[tuple[int, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for grid in args.grids:
        cells, reported = load(grid)
        for (k, c), rs in sorted(cells.items()):
            if (k, c) not in reported or c < 4:
                continue
            for waves in (1, 2):
                n = max(waves * c, 8)
                if n >= len(rs) or (waves == 2 and n == max(c, 8)):
                    continue
                cut_at = rs[n - 1]["end_time"]
                done, sent = rs[:n], [r for r in rs if r["send_time"] <= cut_at]
                full = reported[(k, c)]
                got = ratios[(c, waves)]
                got["statistic"].append(little(done, c) / full)
                for (k2, c2), peer in cells.items():
                    if c2 != c or k2 == k or (k2, c2) not in reported:
                        continue
                    drain = reported[(k2, c2)] / little(peer, c)
                    got["drained x drain factor"].append(little(sent, c) * drain / full)
                    got["statistic x matched scale"].append(little(done, c) * reported[(k2, c2)] / little(peer[:n], c)
                                                            / full)
    print("| concurrency, waves | windows | " + " | ".join(f"{r}: mean (RMS error)" for r in READINGS) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in READINGS) + " |")
    for (c, waves), got in sorted(ratios.items()):
        cols = [f"{statistics.mean(got[r]):.3f} ({math.sqrt(statistics.mean((x - 1) ** 2 for x in got[r])):.1%})"
                for r in READINGS]
        print(f"| {c}, {waves} | {len(got['statistic'])} | " + " | ".join(cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
