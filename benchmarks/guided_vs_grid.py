"""Guided plan vs exhaustive grid, side by side, on the same server in the same run.

    python benchmarks/guided_vs_grid.py --emulated compute-bound            # in-process emulated servers
    python benchmarks/guided_vs_grid.py --emulated memory-bound --restart-s 60
    python benchmarks/guided_vs_grid.py --backend local --steps 0,1,2,3,4 --concurrency 1,2,4,8,16,32 \
        --num-prompts 8 --max-tokens 32

Runs ``spectune sweep --plan grid`` and ``--plan guided`` (grid first), then ``spectune recommend`` on each, and
prints per concurrency: each plan's chosen num_steps, the grid-measured objective of both choices and their ratio
(agreement: the guided choice within 3% of the grid's), then the points, launches and measuring time of each plan
(sweep.json ``cost``: measurement windows + server starts/switches, drift checks included). ``--restart-s`` adds a
nominal restart cost per launch (the emulated servers switch for free; SGLang and vLLM restart with CUDA-graph
capture per num_steps), printed as a separate column.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--emulated", choices=("compute-bound", "memory-bound"), default=None)
    p.add_argument("--backend", default="local", help="spectune backend when not --emulated")
    p.add_argument("--steps", default="0,1,2,3,4")
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--duration", type=float, default=None, help="cap per point, s")
    p.add_argument("--objective", default="throughput", choices=("throughput", "tpot"))
    p.add_argument("--restart-s", type=float, default=0.0, help="nominal restart cost per launch, s")
    p.add_argument("--output-dir", type=Path, default=None)
    p.add_argument("--budget", default=None)
    return p.parse_args(argv)


async def run_plans(args: argparse.Namespace, out: Path) -> dict[str, object]:
    from spectune.backends.base import BackendOptions
    from spectune.sweep.plan import SweepPlan, parse_budget
    from spectune.sweep.run import execute

    steps = tuple(int(x) for x in args.steps.split(","))
    concs = tuple(int(x) for x in args.concurrency.split(","))
    points, seconds = parse_budget(args.budget)
    base = dict(steps=steps, concurrency=concs, num_prompts=args.num_prompts, max_tokens=args.max_tokens,
                duration_per_point_s=args.duration, objective=args.objective, dataset="mt-bench")
    outcomes = {}
    for design in ("grid", "guided"):
        extra = dict(budget_points=points, budget_s=seconds) if design == "guided" else {}
        plan = SweepPlan(design=design, **base, **extra)
        t = time.perf_counter()
        if args.emulated:
            from helpers.cost_model import COMPUTE_BOUND, MEMORY_BOUND, EmulatedServers

            model = {"compute-bound": COMPUTE_BOUND, "memory-bound": MEMORY_BOUND}[args.emulated]
            async with EmulatedServers(model, steps) as urls:
                outcomes[design] = await execute(plan, "openai", BackendOptions(endpoints=urls), out / design)
        else:
            outcomes[design] = await execute(plan, args.backend, BackendOptions(), out / design)
        outcomes[design].wall_s = time.perf_counter() - t  # type: ignore[attr-defined]
    return outcomes


def compare(out: Path, objective: str) -> dict[str, object]:
    """Choices per concurrency from ``spectune recommend`` on both folders, and the agreement numbers."""
    from spectune.results.reader import load_results
    from spectune.tune.recommend import OBJECTIVES, RecommendOptions, recommend

    col, direction, _ = OBJECTIVES[objective]
    recs = {d: recommend(load_results(out / d), RecommendOptions(objective=objective)) for d in ("grid", "guided")}
    rows = []
    for ch in recs["grid"].choices:
        g = next(x for x in recs["guided"].choices if x.concurrency == ch.concurrency)
        grid_best = recs["grid"].cell(ch.steps, ch.concurrency)
        grid_of_guided = recs["grid"].cell(g.steps, ch.concurrency)
        a, b = grid_of_guided.objective, grid_best.objective
        ratio = a / b if direction == "max" else b / a
        rows.append({"concurrency": ch.concurrency, "grid_steps": ch.steps, "guided_steps": g.steps,
                     "grid_objective": b, "guided_objective_on_grid": a, "ratio": ratio, "within_3pct": ratio >= 0.97})
    return {"rows": rows, "column": col}


def main(argv: list[str] | None = None) -> int:
    import os

    args = parse(argv)
    out = args.output_dir or Path(tempfile.mkdtemp(prefix="guided-vs-grid-"))
    outcomes = asyncio.run(run_plans(args, out))
    result = compare(out, args.objective)
    print(f"server: {args.emulated or args.backend}; steps {args.steps}; concurrency {args.concurrency}; "
          f"objective {args.objective} ({result['column']}); load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs; folders in {out}")
    print(f"{'concurrency':>11} | {'grid K':>6} | {'guided K':>8} | {'grid obj':>10} | {'guided K on grid':>16} | "
          f"{'ratio':>6} | within 3%")
    for r in result["rows"]:
        print(f"{r['concurrency']:>11} | {r['grid_steps']!s:>6} | {r['guided_steps']!s:>8} | {r['grid_objective']:>10.4g} "
              f"| {r['guided_objective_on_grid']:>16.4g} | {r['ratio']:>6.3f} | {'yes' if r['within_3pct'] else 'NO'}")
    print(f"{'plan':>6} | {'points':>6} | {'launches':>8} | {'measure s':>9} | {'switch s':>8} | "
          f"{'+ restarts s':>12} | {'drift pts':>9} | {'drift s':>7} | {'wall s':>7}")
    totals = {}
    for design in ("grid", "guided"):
        c = outcomes[design].cost  # type: ignore[attr-defined]
        cost = c["measure_s"] + c["switch_s"] + c["launches"] * args.restart_s
        totals[design] = (cost, cost + c["drift_s"], c["points"])
        print(f"{design:>6} | {c['points']:>6} | {c['launches']:>8} | {c['measure_s']:>9.1f} | {c['switch_s']:>8.1f} | "
              f"{cost:>12.1f} | {c['drift_points']:>9} | {c['drift_s']:>7.1f} | "
              f"{outcomes[design].wall_s:>7.1f}")  # type: ignore[attr-defined]
    share = totals["guided"][0] / totals["grid"][0]
    share_drift = totals["guided"][1] / totals["grid"][1]
    agree = all(r["within_3pct"] for r in result["rows"])
    print(f"guided / grid measuring time (points + switches + {args.restart_s:g} s per launch): {share:.1%}; with "
          f"the drift checks: {share_drift:.1%}; points {totals['guided'][2]}/{totals['grid'][2]}; agreement within 3% "
          f"at every concurrency: {'yes' if agree else 'NO'}")
    guided = json.loads((out / "guided" / "sweep.json").read_text()).get("guided") or {}
    print(f"guided rounds: {guided.get('rounds')}; stopped: {guided.get('stopped')}; fit: "
          f"{(guided.get('fit') or {}).get('features')}, relative error "
          f"{(guided.get('fit') or {}).get('relative_error', float('nan')):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
