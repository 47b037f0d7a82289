"""A sweep serially and spread over a Ray cluster (``spectune sweep --ray``), side by side in one run: wall times and
choices.

    python benchmarks/ray_sweep.py                      # 5 num_steps x 3 concurrencies, 5 single-server nodes
    python benchmarks/ray_sweep.py --nodes 3 --slots 2 --startup-s 3 --scale 2

The servers are emulated (tests/helpers/emulated_server.py, launched per num_steps by the ``launch`` backend): each
verify step sleeps the compute-bound cost model's step time (times ``--scale``), and a server takes ``--startup-s``
seconds to start listening, so a block costs what its sleeps cost and ``--nodes`` servers run side by side for real
even on two cores. The cluster is Ray's own ``ray.cluster_utils.Cluster`` on this machine (a head without server
resources, ``--nodes`` worker nodes with ``--slots`` servers each, all on 127.0.0.1, no dashboard); its start is
timed apart and not counted. Both sweeps run the same plan through ``spectune.sweep.run.execute`` (the serial one
first), each into its own folder; the Ray wall time includes connecting, the calibration cell on every node, and
streaming every point back. Prints both wall times, their ratio, the calibration verdicts, and ``spectune
recommend``'s choice per concurrency for each folder.

Needs Ray: ``pip install -e ".[ray]"``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def point_dicts(outcome: Any) -> list[dict]:
    """A sweep outcome's points as points.jsonl objects."""
    return [p.to_dict() for p in outcome.points]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", default="0,1,2,3,5")
    p.add_argument("--concurrency", default="2,4,8")
    p.add_argument("--nodes", type=int, default=5, help="worker nodes of the local cluster")
    p.add_argument("--slots", type=int, default=1, help="servers one node fits")
    p.add_argument("--scale", type=float, default=4.0, help="the cost model's step times x this (4: steps of "
                   "18-135 ms, so the sleeps dwarf the CPU a step costs on a busy 2-core machine)")
    p.add_argument("--startup-s", type=float, default=2.0, help="s an emulated server takes to start")
    p.add_argument("--requests", type=int, default=None, help="measured requests per point (default: spectune's, "
                   "max(8 prompts, 4 x concurrency))")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--output", type=Path, default=None, help="folder for both results folders (default: a temp dir)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    import os

    # keep every Ray node and the driver on 127.0.0.1 (Ray otherwise maps loopback to the machine's address)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray.cluster_utils import Cluster

    from helpers.emulated_server import launch_template
    from spectune.backends.options import BackendOptions
    from spectune.commands.options import parse_int_list
    from spectune.results.reader import load_results
    from spectune.sweep.distributed import RayOptions
    from spectune.sweep.plan import SweepPlan
    from spectune.sweep.run import execute
    from spectune.tune.recommend import RecommendOptions, recommend

    base = args.output or Path(tempfile.mkdtemp(prefix="ray-sweep-"))
    base.mkdir(parents=True, exist_ok=True)
    prompts = base / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}", "category": "chat"}) + "\n" for i in range(8)))
    plan = SweepPlan(steps=tuple(parse_int_list(args.steps, "steps", 0)),
                     concurrency=tuple(parse_int_list(args.concurrency, "concurrency", 1)),
                     dataset=f"jsonl:{prompts}", num_prompts=8, max_tokens=args.max_tokens,
                     requests_per_point=args.requests, warmup_requests=1, drift_check=False)

    def options(name: str) -> BackendOptions:
        return BackendOptions(launch=launch_template(f"--scale {args.scale:g} --startup-s {args.startup_s:g} "
                                                     f"--pid-dir {base / ('pids-' + name)}"), startup_timeout_s=120)

    loopback = {"node_ip_address": "127.0.0.1", "object_store_memory": 80 * 1024 * 1024}
    t = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, **loopback})
    try:
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=args.slots, resources={"emulated_server": args.slots}, **loopback)
        cluster.wait_for_nodes()
        cluster_s = time.perf_counter() - t
        print(f"local Ray cluster: {args.nodes} nodes x {args.slots} server(s), started in {cluster_s:.1f} s "
              f"(not counted); Ray {ray.__version__}", flush=True)
        runs = {}
        for name, ray_opts in (("serial", None),
                               ("ray", RayOptions(address=cluster.address,
                                                  resources={"CPU": 1.0, "emulated_server": 1.0}))):
            t = time.perf_counter()
            outcome = asyncio.run(execute(plan, "launch", options(name), base / name, ray=ray_opts))
            wall = time.perf_counter() - t
            bad = [p for p in point_dicts(outcome) if p.get("status") != "ok"]
            rec = recommend(load_results(base / name), RecommendOptions())
            runs[name] = (wall, {ch.concurrency: ch.steps for ch in rec.choices}, len(point_dicts(outcome)), len(bad))
            print(f"{name}: {wall:.1f} s, {len(point_dicts(outcome))} points ({len(bad)} not ok)", flush=True)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()

    (ws, cs, _, _), (wr, cr, _, _) = runs["serial"], runs["ray"]
    print()
    per_point = ", ".join(f"c={c}: {plan.requests_for(c)}" for c in plan.concurrency)
    print(f"plan: num_steps {args.steps} x concurrency {args.concurrency}, requests per point {per_point}, "
          f"{args.max_tokens} tokens each; server start {args.startup_s:g} s; step times x{args.scale:g} "
          f"(compute-bound cost model)")
    print(f"{'':>22}{'serial':>10}{'--ray':>10}")
    print(f"{'wall time, s':>22}{ws:>10.1f}{wr:>10.1f}")
    print(f"{'ray / serial':>22}{'':>10}{wr / ws:>10.1%}")
    for c in plan.concurrency:
        print(f"{'choice at c=' + str(c):>22}{str(cs.get(c)):>10}{str(cr.get(c)):>10}")
    print(f"same choices: {cs == cr}")
    meta = json.loads((base / "ray" / "sweep.json").read_text())
    for node_id, entry in sorted((meta.get("nodes") or {}).items()):
        cal = entry.get("calibration") or {}
        tput = cal.get("output_throughput_tok_s")
        ratio = entry.get("ratio")
        print(f"node {node_id[:8]}: blocks {entry.get('blocks')}, calibration K=0 "
              f"{'-' if tput is None else f'{tput:.1f} tok/s'}, "
              f"{'-' if ratio is None else f'{ratio:.3f}x the median node'}, alike {entry.get('alike')}")
    print(f"results: {base}")


if __name__ == "__main__":
    main()
