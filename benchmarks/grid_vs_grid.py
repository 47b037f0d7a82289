"""How often one grid sweep's choices hold on another run of the same grid: the noise floor of "the grid's choice".

    python benchmarks/grid_vs_grid.py RUN1/grid RUN2/grid RUN3/grid ...

Every folder is a finished ``spectune sweep --plan grid`` of the same command (same server, num_steps, concurrency,
prompts, windows) run at different times. For every ordered pair (A, B) it takes ``spectune recommend``'s choice on
A at each concurrency and scores it on B's measurements against B's own choice there (the ratio of objectives, as
``benchmarks/guided_vs_grid.py`` scores the guided plan against the grid), then prints per pair the worst ratio over
the concurrencies, and overall: in how many pairs A's choices are within 3% of B's at every concurrency, and the
same per concurrency. A guided plan run at another time than its grid cannot be expected to match the grid's
choices more often than a second grid run does; docs/sweep.md ("How reproducible the grid's own choice is") gives
the figures on the bundled engine.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # guided_vs_grid, beside this script

AGREE = 0.97  # within 3%, as benchmarks/guided_vs_grid.py counts agreement


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("grids", nargs="+", type=Path, help="finished grid sweep folders of the same command")
    p.add_argument("--objective", choices=("throughput", "tpot"), default="throughput")
    args = p.parse_args(argv)
    if len(args.grids) < 2:
        p.error("give at least two grid folders")

    from guided_vs_grid import choice_ratios  # the guided plan's score against its grid, the same ratio

    from spectune.results.reader import load_results
    from spectune.tune.recommend import RecommendOptions, recommend

    rec = {g: recommend(load_results(g), RecommendOptions(objective=args.objective)) for g in args.grids}
    concs = sorted(ch.concurrency for ch in rec[args.grids[0]].choices)
    per: dict[int, list[float]] = {c: [] for c in concs}
    worst_pair = []
    for a, b in itertools.permutations(args.grids, 2):
        got = choice_ratios(rec[b], rec[a], args.objective)  # A's choices scored on B's measurements
        for c, v in got.items():
            per[c].append(v)
        worst_pair.append(min(got.values()))
        print(f"{a} on {b}: worst {min(got.values()):.3f}")
    n = len(worst_pair)
    print(f"{n} ordered pairs: the first run's choice within 3% of the second's at every concurrency in "
          f"{sum(w >= AGREE for w in worst_pair)}/{n} (worst {min(worst_pair):.3f})")
    for c in concs:
        print(f"  concurrency {c}: within 3% in {sum(v >= AGREE for v in per[c])}/{n} (worst {min(per[c]):.3f})")
    for g in args.grids:
        print(f"  {g}: " + ", ".join(f"K={x.steps} at {x.concurrency}" for x in rec[g].choices))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
