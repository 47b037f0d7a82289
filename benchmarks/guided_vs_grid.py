"""Guided plan vs exhaustive grid, side by side, on the same server in the same run.

    python benchmarks/guided_vs_grid.py --emulated compute-bound            # in-process emulated servers
    python benchmarks/guided_vs_grid.py --emulated memory-bound --restart-s 60
    python benchmarks/guided_vs_grid.py --backend local --steps 0,1,2,3,4 --concurrency 1,2,4,8,16,32 \
        --num-prompts 8 --max-tokens 32
    python benchmarks/guided_vs_grid.py --replay docs/examples/smollm2-cpu/sweep   # offline, on a measured grid
    python benchmarks/guided_vs_grid.py --recorded docs/examples/smollm2-cpu/sweep # offline, windows that stop early
    python benchmarks/guided_vs_grid.py --virtual 8 --emulated held-out --steps 0,1,2,3,5 --concurrency 1,4,16,64

``--virtual N`` runs N seeded pairs of sweeps (grid, then guided) through spectune's own sweep loop whose every
point is answered by the cost model's virtual window (tests/helpers/cost_model.py ``virtual_point``: the model's
closed-loop throughput with 1% noise per point, ``--request-noise`` per request and ``--prompt-noise`` per prompt
(the same in every cell; ``--prompts`` distinct prompts, 8 by default), the guided plan's early-stop rule applied to
the requests in order; a grid's window and a guided one read the same cell alike), so the figures do not depend on
how loaded the machine is (nothing sleeps: a 5 x 6 pair takes seconds); the time is the points' modelled windows
plus ``--restart-s`` per launch (default 0: the in-process servers switch for free). It prints per seed and
overall: the guided plan's share of the grid's time, whether its choice at every concurrency is within 3% of the
grid's (recommend on both folders), points, launches, early stops, and how many early-stopped windows'
confidence-sequence bounds hold the grid's full window of the same cell; ``--show-cells`` adds every guided point
with its window, stop reason and why it was measured, and each concurrency's choices. The grid and the guided plan of
a pair draw the same noise for a cell (common random numbers: where both measure it, they read the same), so each
pair runs both plans again on other draws (seed + ``REGRID_SEED``, the same draws for both): how often that guided
plan's choice and that second grid's are within 3% of the first grid's at every concurrency says how far the grid's
own choice moves with the noise, the band a guided plan measured at another time can be held to.

``--recorded GRID...`` runs no server either: the guided plan runs through spectune's own sweep loop (early stop,
settle step, switch costs) with every point answered from a finished grid's recorded window of that cell: its
requests fed to the early-stop rule in the order they finished (elapsed time from the window's start; a window that
ended at its request count is not asked about the requests finishing after its last send, as in a live sweep), and
when the rule stops the window, the requests in flight then are dropped, as the sweep cancels them (the point's
throughput, duration and intervals from the finished ones, the window ending at the stop); a settle run gets the
cell's one recorded window again. Each launch costs the grid's own measured switch time (sweep.json ``cost``) plus
``--restart-s``. It prints per grid the guided plan's share of the grid's time, points, early stops and the choices
of both (``spectune recommend``). ``--only-concurrency C,C,...`` replays the smaller grid inside each recorded one: a
copy of the grid keeping only those concurrencies' points and requests (its drift check and cost as recorded), on
which both the guided plan and the grid's own choices are made, the grid's time being the kept cells' windows.

``--replay GRID`` runs no server: the guided planner (spectune.sweep.guided) chooses its cells from a finished grid
sweep's own measurements, round by round, and its cost is those points' measurement windows (``duration_s``); the
guided folder (measured subset + predicted cells) is written next to a copy of nothing else. A grid holds one run
per cell, so the replay cannot measure a cell again: the guided plan's settle step (more runs of a pair whose tie
rests on a wide interval, spectune.sweep.guided.settle) runs live only. Otherwise it
runs ``spectune sweep --plan grid`` and ``--plan guided`` (grid first), then ``spectune recommend`` on each, and
prints per concurrency: each plan's chosen num_steps, the grid-measured objective of both choices and their ratio
(agreement: the guided choice within 3% of the grid's), then the points, launches and measuring time of each plan
(sweep.json ``cost``: measurement windows + server starts/switches, drift checks included). ``--restart-s`` adds a
nominal restart cost per launch (the emulated servers switch for free; SGLang and vLLM restart with CUDA-graph
capture per num_steps), printed as a separate column (with ``--replay``: a line of its own, the launches counted
as changes of num_steps in the order measured, the grid's as one per num_steps).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


#: ``--virtual``: the second grid's noise seed is the pair's plus this (its draws independent of the first grid's)
REGRID_SEED = 100_000


def point_dicts(outcome: Any) -> list[dict]:
    """A sweep outcome's points as points.jsonl objects."""
    return [p.to_dict() for p in outcome.points]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--emulated", choices=("compute-bound", "memory-bound", "held-out", "held-out-2", "held-out-3",
                                          "held-out-4", "held-out-5"),
                   default=None, help="in-process emulated servers: the tests' two cost models, or a held-out one "
                                      "(benchmarks/heldout_cost_model.py, never used by tests or tuning)")
    p.add_argument("--dataset", default="mt-bench")
    p.add_argument("--early-stop", action="store_true", help="the grid's windows stop early too (--early-stop)")
    p.add_argument("--guided-full-windows", action="store_true",
                   help="the guided plan without early stop (--no-early-stop): what the windows' stop rule saves")
    p.add_argument("--backend", default="local", help="spectune backend when not --emulated")
    p.add_argument("--steps", default="0,1,2,3,4")
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--duration", type=float, default=None, help="cap per point, s")
    p.add_argument("--objective", default="throughput", choices=("throughput", "tpot"))
    p.add_argument("--restart-s", type=float, default=0.0, help="nominal restart cost per launch, s")
    p.add_argument("--output-dir", type=Path, default=None)
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="TPOT SLO, ms (both plans' goodput columns)")
    p.add_argument("--slo-ttft-ms", type=float, default=None, help="TTFT SLO, ms")
    p.add_argument("--budget", default=None)
    p.add_argument("--replay", type=Path, default=None, help="a finished grid sweep folder: replay offline")
    p.add_argument("--recorded", type=Path, nargs="+", default=None,
                   help="finished grid sweeps: run the guided plan on their recorded windows (module docstring)")
    p.add_argument("--without-slo", action="store_true",
                   help="--recorded: the guided plan without the grid's SLOs (it may then leave a concurrency to the "
                        "model; with SLOs every concurrency is measured)")
    p.add_argument("--only-concurrency", default=None,
                   help="--recorded: replay only these of each grid's concurrencies (e.g. 1,4,16,32: a 5 x 4 grid "
                        "inside a recorded 5 x 6 one; module docstring)")
    p.add_argument("--virtual", type=int, default=0, help="N seeded virtual sweep pairs (module docstring)")
    p.add_argument("--request-noise", type=float, default=0.10, help="--virtual: relative sd of a request's latency")
    p.add_argument("--prompt-noise", type=float, default=0.0,
                   help="--virtual: relative sd of a prompt's own latency factor, the same in every cell (default 0)")
    p.add_argument("--prompts", type=int, default=8,
                   help="--virtual: distinct prompts a virtual window's requests cycle over (default 8; "
                        "tests/helpers/cost_model.py PROMPTS)")
    p.add_argument("--show-cells", action="store_true",
                   help="--virtual: per seed, every guided point in the order measured (window, requests, early "
                        "stop, why) and where the time went by role")
    return p.parse_args(argv)


def replay(grid: Path, out: Path, objective: str, restart_s: float = 0.0) -> dict[str, object]:
    """The guided planner on a finished grid's measurements (module docstring), asking for every open cell at once
    where ``restart_s`` (s per launch) exceeds the mean point's measuring window, as spectune.sweep.run does; writes
    ``out/guided`` and returns {"rounds", "points", "grid_points", "seconds", "grid_seconds", "launches",
    "grid_launches"}."""
    from spectune.results.folder import SweepFolder
    from spectune.sweep.guided import GuidedPlanner

    meta = json.loads((grid / "sweep.json").read_text())
    points = [json.loads(line) for line in (grid / "points.jsonl").read_text().splitlines() if line.strip()]
    by_cell = {(p["steps"], p["concurrency"]): p for p in points if p.get("repeat", 0) == 0}
    plan = meta["plan"]
    planner = GuidedPlanner(plan["steps"], plan["concurrency"], 1, objective)
    got, tried, order = [], set(), []
    while True:
        windows = [(p.get("metrics") or {}).get("duration_s") or 0.0 for p in got]
        point = sum(windows) / len(windows) if windows else 0.0
        cells = planner.next_round(got, tried, all_threats=restart_s > point > 0)
        if not cells:
            break
        current = order[-1][0] if order else None
        for kc in sorted(cells, key=lambda kc: (kc[0] != current, kc[0], kc[1])):
            tried.add(kc)
            if kc in by_cell:
                got.append(by_cell[kc])
                order.append(kc)
    folder = SweepFolder(out / "guided")
    folder.path.mkdir(parents=True, exist_ok=True)
    (folder.path / "sweep.json").write_text(json.dumps({**meta, "plan": {**plan, "design": "guided"},
                                                        "guided": planner.describe()}, indent=2))
    measured = {(p["steps"], p["concurrency"]) for p in got}
    folder.predicted = [pr.row() for kc, pr in sorted(planner.predict(got).items()) if kc not in measured]
    folder.write_summary(got)
    (folder.path / "points.jsonl").write_text("".join(json.dumps(p) + "\n" for p in got))
    dur = lambda ps: sum((p.get("metrics") or {}).get("duration_s") or 0.0 for p in ps)  # noqa: E731
    launches = sum(1 for i, kc in enumerate(order) if i == 0 or order[i - 1][0] != kc[0])
    return {"rounds": planner.rounds, "points": len(got), "grid_points": len(by_cell), "seconds": dur(got),
            "grid_seconds": dur(by_cell.values()), "launches": launches, "grid_launches": len(plan["steps"])}


def run_plans(args: argparse.Namespace, out: Path) -> dict[str, object]:
    """Run the grid, then the guided plan; returns {design: SweepOutcome} (each with ``wall_s``). A real backend runs
    under spectune's signal handling (Ctrl-C/SIGTERM stop its servers)."""
    from spectune.backends.options import BackendOptions
    from spectune.sweep.plan import SweepPlan, parse_budget
    from spectune.sweep.run import execute, run_blocking

    steps = tuple(int(x) for x in args.steps.split(","))
    concs = tuple(int(x) for x in args.concurrency.split(","))
    points, seconds = parse_budget(args.budget)
    base = dict(steps=steps, concurrency=concs, num_prompts=args.num_prompts, max_tokens=args.max_tokens,
                duration_per_point_s=args.duration, objective=args.objective, dataset=args.dataset,
                slo_tpot_ms=args.slo_tpot_ms, slo_ttft_ms=args.slo_ttft_ms)
    outcomes = {}
    for design in ("grid", "guided"):
        extra = (dict(budget_points=points, budget_s=seconds) if design == "guided"
                 else dict(early_stop=True) if args.early_stop else {})
        plan = SweepPlan(design=design, **base, **extra)
        t = time.perf_counter()
        if args.emulated:
            from helpers.cost_model import EmulatedServers

            model = emulated_model(args.emulated)

            async def emulated() -> object:
                async with EmulatedServers(model, steps) as urls:
                    return await execute(plan, "openai", BackendOptions(endpoints=urls), out / design)

            outcomes[design] = asyncio.run(emulated())
        else:
            outcomes[design] = run_blocking(plan, args.backend, BackendOptions(), out / design)
            if outcomes[design].interrupted is not None:  # type: ignore[attr-defined]
                raise SystemExit(130)
        outcomes[design].wall_s = time.perf_counter() - t  # type: ignore[attr-defined]
    return outcomes


def compare(out: Path, objective: str, grid: Path | None = None) -> dict[str, object]:
    """Choices per concurrency from ``spectune recommend`` on both folders (``grid``: the grid folder, default
    ``out/grid``), and the agreement numbers."""
    from spectune.results.reader import load_results
    from spectune.tune.recommend import OBJECTIVES, RecommendOptions, recommend

    col, direction, _ = OBJECTIVES[objective]
    recs = {d: recommend(load_results(grid if d == "grid" and grid else out / d), RecommendOptions(objective=objective))
            for d in ("grid", "guided")}
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


def emulated_model(name: str) -> object:
    """The cost model named by ``--emulated`` (the tests' two, or the held-out one in benchmarks/)."""
    from helpers.cost_model import COMPUTE_BOUND, MEMORY_BOUND

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from heldout_cost_model import HELD_OUT, HELD_OUT_2, HELD_OUT_3, HELD_OUT_4, HELD_OUT_5

    return {"compute-bound": COMPUTE_BOUND, "memory-bound": MEMORY_BOUND, "held-out": HELD_OUT,
            "held-out-2": HELD_OUT_2, "held-out-3": HELD_OUT_3, "held-out-4": HELD_OUT_4,
            "held-out-5": HELD_OUT_5}[name]


def early_vs_full(guided: list[dict], grid: list[dict], objective: str) -> tuple[int, int, int, int]:
    """(held, stopped, held_grid, stopped_grid): of the guided plan's early-stopped points, how many have inside
    their confidence-sequence bounds (points.jsonl ``early_stop`` ``low``, ``high``; the throughput or TPOT statistic
    of spectune.sweep.sequential) the same window's statistic had it run in full (the virtual window's
    ``full_window_estimate``), and how many the grid's full window of the same (num_steps, concurrency, repeat) (a
    separate draw of any per-point noise the cost model has: the held-out model's step noise)."""
    col = "output_throughput_tok_s" if objective != "tpot" else "tpot_p50_ms"
    full = {(p["steps"], p["concurrency"], p.get("repeat", 0)): p["metrics"][col] for p in grid}
    held = stopped = held_grid = stopped_grid = 0
    for p in guided:
        es = p.get("early_stop") or {}
        key = (p["steps"], p["concurrency"], p.get("repeat", 0))
        if not es.get("reason") or es.get("low") is None:
            continue
        if es.get("full_window_estimate") is not None:
            stopped += 1
            held += es["low"] <= es["full_window_estimate"] <= es["high"]
        if key in full:
            stopped_grid += 1
            held_grid += es["low"] <= full[key] <= es["high"]
    return held, stopped, held_grid, stopped_grid


def show_cells(points: list[dict], meta: dict, grid_s: float) -> None:
    """``--show-cells``: the guided plan's points in the order measured, each with its window (s, share of the
    grid's time), requests, early-stop reason and why it was measured (sweep.json ``guided.why``), then the time
    summed by why (seed, first cell at a concurrency, expected improvement, settle)."""
    why = list((meta.get("guided") or {}).get("why") or [])
    by_role: dict[str, float] = {}
    for p in points:
        key = (p["steps"], p["concurrency"])
        w = next((x for x in why if (x["steps"], x["concurrency"]) == key
                  and x.get("repeat", 0) == p.get("repeat", 0)), None)
        if w is not None:
            why.remove(w)
        reason = (w or {}).get("reason", "?")
        role = reason.split(":")[0] if reason.startswith(("seed", "settle")) else reason.split(" at ")[0][:30]
        m = p["metrics"]
        by_role[role] = by_role.get(role, 0.0) + m["duration_s"]
        print(f"  K={p['steps']} c={p['concurrency']} r={p.get('repeat', 0)}: {m['duration_s']:6.2f} s "
              f"({m['duration_s'] / grid_s:5.1%}) {m['num_requests']:>4} req, stop "
              f"{(p.get('early_stop') or {}).get('reason')}; {reason}")
    print("  by role: " + ", ".join(f"{k} {v / grid_s:.1%}" for k, v in by_role.items()))


def charge_launches(sweep: object, seconds: float) -> None:
    """Add ``seconds`` per server launch since the last call to the sweep's ``cost["switch_s"]`` (a
    spectune.sweep.run.Sweep answering its points without servers): the cost the guided plan weighs a switch by,
    and the benchmark's time, count what a launch would have cost."""
    cost = sweep.cost  # type: ignore[attr-defined]
    cost["switch_s"] += (cost["launches"] - getattr(sweep, "_charged_launches", 0)) * seconds
    sweep._charged_launches = cost["launches"]  # type: ignore[attr-defined]


def choice_ratios(grid: object, other: object, objective: str) -> dict[int, float]:
    """Per concurrency, ``other``'s choice measured on ``grid`` over ``grid``'s own choice (``spectune recommend``
    results of both folders; TPOT inverted so that 1 is as good, below 1 worse, above 1 better)."""
    out = {}
    for ch in grid.choices:  # type: ignore[attr-defined]
        mine = next(x for x in other.choices if x.concurrency == ch.concurrency)  # type: ignore[attr-defined]
        a = grid.cell(mine.steps, ch.concurrency).objective  # type: ignore[attr-defined]
        b = grid.cell(ch.steps, ch.concurrency).objective  # type: ignore[attr-defined]
        out[ch.concurrency] = a / b if objective != "tpot" else b / a
    return out


def show_choices(grid: object, guided: object, exact: object, best: object, concs: tuple[int, ...],
                 objective: str) -> None:
    """``--virtual --show-cells``: per concurrency the grid's and the guided plan's choices (``spectune recommend``
    results of both folders), the guided one's on the grid's measurements and both against the noise-free model's
    best (``exact(k, c)``: its objective, tokens/s or 1 / TPOT; ``best(c)``: the largest over num_steps); then every
    cell of the guided folder, measured or predicted (``p``), its throughput over the noise-free best at its
    concurrency (the throughput objective)."""
    def true(k: int, c: int) -> float:
        return exact(k, c) / best(c)  # type: ignore[operator]

    ratios = choice_ratios(grid, guided, objective)
    print("  choices (grid / guided; the guided one's on the grid's measurements; both against the noise-free best): "
          + "; ".join(f"c={g.concurrency}: K={g.steps} / K={u.steps} {ratios[g.concurrency]:.3f} (noise-free "
                      f"{true(g.steps, g.concurrency):.3f} / {true(u.steps, u.concurrency):.3f})"
                      for g, u in zip(grid.choices, guided.choices)))  # type: ignore[attr-defined]
    print("  guided cells over the noise-free best (p: predicted): " + "; ".join(
        f"c={c}: " + " ".join(f"K{x.steps}{'p' if x.predicted else ''} {x.objective / best(c):.3f}"
                              for x in sorted(guided.cells, key=lambda x: x.steps)  # type: ignore[attr-defined]
                              if x.concurrency == c and math.isfinite(x.objective))
        for c in concs))


def worst_choice(grid: object, guided: object, objective: str) -> float:
    """The lowest, over the concurrencies, of :func:`choice_ratios` (at most 1)."""
    return min([1.0, *choice_ratios(grid, guided, objective).values()])


def only_concurrency(grid: Path, keep: set[int], out: Path) -> Path:
    """A copy of the finished grid sweep ``grid`` in ``out`` with only the concurrencies in ``keep``: sweep.json's
    plan lists those, points.jsonl, requests.jsonl and summary.csv keep their rows (the drift checks and cost as
    recorded; drift_requests.jsonl, which recommend does not read, is left out).

    Raises:
        SystemExit: ``keep`` names a concurrency the grid did not measure.
    """
    meta = json.loads((grid / "sweep.json").read_text())
    missing = keep - set(meta["plan"]["concurrency"])
    if missing:
        raise SystemExit(f"--only-concurrency: {grid} has no concurrency {sorted(missing)}; pick from "
                         f"{meta['plan']['concurrency']}")
    out.mkdir(parents=True)
    meta["plan"]["concurrency"] = [c for c in meta["plan"]["concurrency"] if c in keep]
    (out / "sweep.json").write_text(json.dumps(meta, indent=2))
    for name in ("points.jsonl", "requests.jsonl"):
        rows = [line for line in (grid / name).read_text().splitlines()
                if line.strip() and json.loads(line)["concurrency"] in keep]
        (out / name).write_text("".join(r + "\n" for r in rows))
    if (grid / "summary.csv").is_file():
        import pandas as pd

        df = pd.read_csv(grid / "summary.csv")
        df[df["concurrency"].isin(keep)].to_csv(out / "summary.csv", index=False)
    return out


def recorded(args: argparse.Namespace) -> int:
    """``--recorded GRID...``: the guided plan run through spectune's own sweep loop on each finished grid sweep's
    recorded windows (module docstring); prints the figures per grid."""
    from types import SimpleNamespace

    from helpers.cost_model import COMPUTE_BOUND, EmulatedServers
    from spectune.backends.options import BackendOptions
    from spectune.results.confidence import point_intervals
    from spectune.results.point import SweepPoint
    from spectune.results.reader import load_results
    from spectune.sweep.plan import SweepPlan
    from spectune.sweep.run import Sweep, execute
    from spectune.tune.recommend import RecommendOptions, recommend

    state: dict[str, object] = {}

    async def point(self, key, base_url, model_name, drift=None):  # noqa: ANN001 - Sweep._point's signature
        charge_launches(self, state["launch_s"])  # type: ignore[arg-type]
        k, c, _ = key
        # a repeat (the settle step's) gets the cell's one recorded window again: a grid has one run per cell
        gp = {**json.loads(json.dumps(state["points"][(k, c)])), "repeat": key[2]}  # type: ignore[index]
        recs = sorted(state["requests"].get((k, c), []), key=lambda r: r["end_time"])  # type: ignore[union-attr]
        t0 = gp["window"]["start_s"]
        rule = self._early_stop(key, self.plan.requests_for(c)) if drift is None else None
        kept = recs
        # a window that sent its planned requests runs them to the end (loadgen/send_loop.py, _Run._drain): the
        # rule is not asked about those finishing after its last send; after the --duration cap it is
        last_send = max((r["send_time"] for r in recs), default=0.0) if gp.get("stop_reason") == "max_requests" \
            else float("inf")
        if rule is not None:
            seen = []
            for r in recs:
                seen.append(SimpleNamespace(ok=not r.get("error"), prompt_id=r.get("prompt_id"),
                                            completion_tokens=r.get("completion_tokens"),
                                            e2e_s=(r.get("e2e_ms") or 0) / 1000,
                                            tpot_s=None if r.get("tpot_ms") is None else r["tpot_ms"] / 1000,
                                            dispatch_delay_s=r.get("dispatch_delay_s") or 0.0))
                if r["end_time"] > last_send:
                    continue
                if rule.check(seen, r["end_time"] - t0):
                    kept = recs[:len(seen)]  # those in flight are cancelled (Constraints.cancel_on_early_stop)
                    break
            m = gp["metrics"]
            full = m["output_throughput_tok_s"]
            if rule.reason:
                end = max(x["end_time"] for x in kept)
                tokens = sum(x.get("completion_tokens") or 0 for x in kept)
                m.update(num_requests=len(kept), total_output_tokens=tokens, duration_s=end - t0,
                         output_throughput_tok_s=tokens / (end - t0))
                self._as_statistic(key, kept, m, rule)  # as Sweep._point does
                m.update(point_intervals([{**x, "steps": k, "concurrency": c} for x in kept], m))
                gp.update(stop_reason="early_stop", window={"start_s": t0, "end_s": end})
            gp["early_stop"] = {**rule.describe(), "full_window_estimate": full}
        for r in kept:
            self.folder.append_request({kk: v for kk, v in r.items() if kk not in ("chunk_times", "chunk_tokens")}
                                       | {"repeat": key[2]})
        return SweepPoint.from_dict(gp), kept

    Sweep._point = point  # type: ignore[method-assign]
    # the smaller grids are copied before anything is replayed, so a concurrency a grid lacks stops the run first
    subsets = tempfile.TemporaryDirectory()
    keep = None if args.only_concurrency is None else {int(x) for x in args.only_concurrency.split(",")}
    grids = list(args.recorded) if keep is None else \
        [only_concurrency(g, keep, Path(subsets.name) / str(n)) for n, g in enumerate(args.recorded)]
    for source, grid in zip(args.recorded, grids):
        meta = json.loads((grid / "sweep.json").read_text())
        plan_meta = meta["plan"]
        pts = [json.loads(x) for x in (grid / "points.jsonl").read_text().splitlines() if x.strip()]
        state["points"] = {(p["steps"], p["concurrency"]): p for p in pts if p.get("repeat", 0) == 0}
        reqs: dict[tuple[int, int], list[dict]] = {}
        for line in (grid / "requests.jsonl").read_text().splitlines():
            r = json.loads(line)
            if r.get("repeat", 0) == 0:
                reqs.setdefault((r["steps"], r["concurrency"]), []).append(r)
        state["requests"] = reqs
        cost = meta.get("cost") or {}
        state["launch_s"] = (cost.get("switch_s") or 0.0) / max(cost.get("launches") or 1, 1) + args.restart_s
        steps, concs = tuple(plan_meta["steps"]), tuple(plan_meta["concurrency"])
        plan = SweepPlan(steps=steps, concurrency=concs, num_prompts=plan_meta["num_prompts"],
                         max_tokens=plan_meta["max_tokens"], duration_per_point_s=plan_meta.get("duration_per_point_s"),
                         design="guided", drift_check=False, objective=args.objective, dataset=plan_meta["dataset"],
                         slo_tpot_ms=None if args.without_slo else plan_meta.get("slo_tpot_ms"),
                         slo_ttft_ms=None if args.without_slo else plan_meta.get("slo_ttft_ms"))

        async def run(out: Path) -> object:
            async with EmulatedServers(COMPUTE_BOUND, steps) as urls:  # endpoints only: every point is recorded
                return await execute(plan, "openai", BackendOptions(endpoints=urls), out)

        with tempfile.TemporaryDirectory() as d:
            run_guided = asyncio.run(run(Path(d) / "guided"))
            rec = {"grid": recommend(load_results(grid), RecommendOptions(objective=args.objective)),
                   "guided": recommend(load_results(Path(d) / "guided"), RecommendOptions(objective=args.objective))}
            if args.show_cells:
                show_cells(point_dicts(run_guided), json.loads((Path(d) / "guided" / "sweep.json").read_text()),  # type: ignore
                           sum(p["metrics"]["duration_s"] for p in state["points"].values()))  # type: ignore
        grid_s = sum(p["metrics"]["duration_s"] for p in state["points"].values()) + \
            (cost.get("launches") or len(steps)) * state["launch_s"]  # type: ignore
        g = run_guided.cost  # type: ignore[attr-defined]
        guided_s = sum(p["metrics"]["duration_s"] for p in point_dicts(run_guided)) + g["switch_s"]  # type: ignore
        worst = worst_choice(rec["grid"], rec["guided"], args.objective)
        early = sum(1 for p in point_dicts(run_guided) if (p.get("early_stop") or {}).get("reason"))  # type: ignore
        print(f"{source}: guided {guided_s:.1f} s / grid {grid_s:.1f} s = {guided_s / grid_s:.1%} (launches "
              f"{g['launches']}, {state['launch_s']:.2f} s each); points {len(point_dicts(run_guided))}/"  # type: ignore
              f"{len(state['points'])}; early-stopped {early}; worst choice {worst:.3f} of the grid's; choices "
              f"guided {[ (x.concurrency, x.steps) for x in rec['guided'].choices]}, grid "
              f"{[(x.concurrency, x.steps) for x in rec['grid'].choices]}", flush=True)
    subsets.cleanup()
    return 0


def virtual(args: argparse.Namespace) -> int:
    """``--virtual N``: N seeded grid/guided pairs on virtual windows (module docstring); prints the figures."""
    import statistics

    import helpers.cost_model as cost_model
    from helpers.cost_model import EmulatedServers, virtual_point
    from spectune.results.point import SweepPoint
    from spectune.backends.options import BackendOptions
    from spectune.results.reader import load_results
    from spectune.sweep.plan import SweepPlan
    from spectune.sweep.run import Sweep, execute
    from spectune.tune.recommend import RecommendOptions, recommend

    cost_model.PROMPTS = args.prompts  # virtual_point reads it per call

    model = emulated_model(args.emulated or "held-out")
    steps = tuple(int(x) for x in args.steps.split(","))
    concs = tuple(int(x) for x in args.concurrency.split(","))
    seed = [0]
    import dataclasses

    quiet = dataclasses.replace(model, noise=0.0) if hasattr(model, "noise") else model  # type: ignore[arg-type]

    def exact(k: int, c: int) -> float:
        """The noise-free model's closed-loop throughput (or 1 / TPOT), as virtual_point computes it."""
        step, al, L = quiet.step_s(c, k), quiet.acceptance_length(k), args.max_tokens
        return c * L / ((1 + (L - 1) / al) * step) if args.objective != "tpot" else al / step

    def best(c: int) -> float:
        """The noise-free model's best objective at concurrency ``c`` over the swept num_steps (:func:`exact`)."""
        return max(exact(k, c) for k in steps)

    async def point(self, key, base_url, model_name, drift=None):  # noqa: ANN001 - Sweep._point's signature
        charge_launches(self, args.restart_s)  # the in-process servers switch for free
        rule = self._early_stop(key, self.plan.requests_for(key[1])) if drift is None else None
        p, recs = virtual_point(model, key, self.plan.requests_for(key[1]), self.plan.max_tokens, 0.01, seed[0],
                                rule, args.request_noise, args.prompt_noise)
        for r in recs:
            self.folder.append_request(r)
        return SweepPoint.from_dict(p), recs  # Sweep._point returns the typed record

    Sweep._point = point  # type: ignore[method-assign]

    async def pair(out: Path) -> dict[str, object]:
        res = {}
        # regrid and reguided: both plans again on other draws of the noise (the same draws for both)
        for name in ("grid", "guided", "regrid", "reguided"):
            design = "guided" if name.endswith("guided") else "grid"
            plan = SweepPlan(steps=steps, concurrency=concs, num_prompts=args.num_prompts, max_tokens=args.max_tokens,
                             design=design, drift_check=False, objective=args.objective,
                             **({"early_stop": True} if design == "grid" and args.early_stop else
                                {"early_stop": False} if design == "guided" and args.guided_full_windows else {}))
            own = seed[0]
            seed[0] = own + REGRID_SEED if name.startswith("re") else own
            try:
                async with EmulatedServers(model, steps) as urls:  # type: ignore[arg-type]
                    res[name] = await execute(plan, "openai", BackendOptions(endpoints=urls), out / name)
            finally:
                seed[0] = own
        return res

    rows = []
    for s in range(args.virtual):
        seed[0] = s
        with tempfile.TemporaryDirectory() as d:
            res = asyncio.run(pair(Path(d)))
            rec = {k: recommend(load_results(Path(d) / k), RecommendOptions(objective=args.objective))
                   for k in ("grid", "guided", "regrid", "reguided")}
            if args.show_cells:
                show_cells(point_dicts(res["guided"]), json.loads((Path(d) / "guided" / "sweep.json").read_text()),
                           sum(p["metrics"]["duration_s"] for p in point_dicts(res["grid"])))
        worst = worst_choice(rec["grid"], rec["guided"], args.objective)
        if args.show_cells:
            show_choices(rec["grid"], rec["guided"], exact, best, concs, args.objective)
        true = {d: min(exact(mine.steps, mine.concurrency) / best(mine.concurrency) for mine in rec[d].choices)
                for d in ("grid", "guided")}
        secs = {k: sum(p["metrics"]["duration_s"] for p in point_dicts(o)) for k, o in res.items()}
        launches = {k: o.cost["launches"] for k, o in res.items()}
        early = sum(1 for p in point_dicts(res["guided"]) if (p.get("early_stop") or {}).get("reason"))
        agree = early_vs_full(point_dicts(res["guided"]), point_dicts(res["grid"]), args.objective)
        secs = {k: v + launches[k] * args.restart_s for k, v in secs.items()}  # launches counted (--restart-s)
        regrid = worst_choice(rec["grid"], rec["regrid"], args.objective)
        reguided = worst_choice(rec["grid"], rec["reguided"], args.objective)
        rows.append((secs["guided"] / secs["grid"], worst, len(point_dicts(res["guided"])), early, launches, true, agree,
                     regrid, reguided))
        print(f"seed {s}: guided {secs['guided']:.1f} s / grid {secs['grid']:.1f} s = {rows[-1][0]:.1%}; worst choice "
              f"{worst:.3f} of the grid's (on other draws of the noise: the guided plan's {reguided:.3f}, a second "
              f"grid's {regrid:.3f}); worst against the noise-free model: guided {true['guided']:.3f}, grid "
              f"{true['grid']:.3f}; points {rows[-1][2]}/{len(point_dicts(res['grid']))}; early-stopped {early}; "
              f"launches {launches['guided']}/{launches['grid']}; early-stopped estimates whose interval holds the "
              f"same window run in full: {agree[0]}/{agree[1]}, the grid's window: {agree[2]}/{agree[3]}", flush=True)
    print(f"{getattr(model, 'name', model)}; steps {args.steps}; concurrency {args.concurrency}; {args.num_prompts} prompts "
          f"x {args.max_tokens} tokens; request noise {args.request_noise:g}, prompt noise {args.prompt_noise:g} "
          f"over {args.prompts} prompts: "
          f"guided / grid time mean "
          f"{statistics.mean(r[0] for r in rows):.1%}, max {max(r[0] for r in rows):.1%}; the grid's choice within 3% "
          f"at every concurrency in {sum(r[1] >= 0.97 for r in rows)}/{len(rows)} "
          f"(worst {min(r[1] for r in rows):.3f}); "
          f"on other draws of the noise, within 3% of the first grid's choice at every concurrency: the guided plan's "
          f"in {sum(r[8] >= 0.97 for r in rows)}/{len(rows)} (worst {min(r[8] for r in rows):.3f}), a second grid's in "
          f"{sum(r[7] >= 0.97 for r in rows)}/{len(rows)} (worst {min(r[7] for r in rows):.3f});"
          f" points {statistics.mean(r[2] for r in rows):.1f}; early stops {statistics.mean(r[3] for r in rows):.1f}; "
          f"against the noise-free model, every choice within 3% of the best in: guided "
          f"{sum(r[5]['guided'] >= 0.97 for r in rows)}/{len(rows)} (worst {min(r[5]['guided'] for r in rows):.3f}), "
          f"grid {sum(r[5]['grid'] >= 0.97 for r in rows)}/{len(rows)} (worst {min(r[5]['grid'] for r in rows):.3f}); "
          f"launches guided {statistics.mean(r[4]['guided'] for r in rows):.1f}, grid "
          f"{statistics.mean(r[4]['grid'] for r in rows):.1f} ({args.restart_s:g} s each in the times); early-stopped "
          f"estimates whose interval holds the same window run in full: {sum(r[6][0] for r in rows)}/"
          f"{sum(r[6][1] for r in rows)}, the grid's window of the cell: {sum(r[6][2] for r in rows)}/"
          f"{sum(r[6][3] for r in rows)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    import os

    args = parse(argv)
    if args.virtual:
        return virtual(args)
    if args.recorded:
        return recorded(args)
    out = args.output_dir or Path(tempfile.mkdtemp(prefix="guided-vs-grid-"))
    if args.replay is not None:
        r = replay(args.replay, out, args.objective, args.restart_s)
        result = compare(out, args.objective, args.replay)
        print(f"replay of {args.replay} (no server run); objective {args.objective}; guided folder {out / 'guided'}")
        print(f"{'concurrency':>11} | {'grid K':>6} | {'guided K':>8} | {'grid obj':>10} | {'guided K on grid':>16} | "
              f"{'ratio':>6} | within 3%")
        for row in result["rows"]:
            print(f"{row['concurrency']:>11} | {row['grid_steps']!s:>6} | {row['guided_steps']!s:>8} | "
                  f"{row['grid_objective']:>10.4g} | {row['guided_objective_on_grid']:>16.4g} | {row['ratio']:>6.3f} | "
                  f"{'yes' if row['within_3pct'] else 'NO'}")
        print(f"points {r['points']}/{r['grid_points']}; measuring windows {r['seconds']:.1f}/{r['grid_seconds']:.1f} s "
              f"= {r['seconds'] / r['grid_seconds']:.1%}; launches {r['launches']}/{r['grid_launches']}; rounds "
              f"{r['rounds']}")
        if args.restart_s:
            g = r["seconds"] + r["launches"] * args.restart_s
            full = r["grid_seconds"] + r["grid_launches"] * args.restart_s
            print(f"with {args.restart_s:g} s per launch: {g:.1f}/{full:.1f} s = {g / full:.1%}")
        return 0
    outcomes = run_plans(args, out)
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
    early = {d: sum(1 for p in point_dicts(outcomes[d]) if (p.get("early_stop") or {}).get("reason"))  # type: ignore
             for d in ("grid", "guided")}
    print(f"windows stopped early: grid {early['grid']}, guided {early['guided']}")
    guided = json.loads((out / "guided" / "sweep.json").read_text()).get("guided") or {}
    print(f"guided rounds: {guided.get('rounds')}; stopped: {guided.get('stopped')}; fit: "
          f"{(guided.get('fit') or {}).get('features')}, relative error "
          f"{(guided.get('fit') or {}).get('relative_error', float('nan')):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
