"""A validation serially and spread over a Ray cluster (``spectune validate --ray``), side by side in one run: wall
times, the runs and the verdicts.

    python benchmarks/ray_validate.py                     # static 0,1,2,3 + the config, 5 single-server nodes
    python benchmarks/ray_validate.py --nodes 3 --phase-s 4 --repeats 2

The servers are tests/helpers/fake_server.py, launched per run by the ``launch`` backend: it sleeps per streamed
token (``--tokens-per-second``; the config's server is ``--config-speedup`` times faster, so the verdict is certain),
so a run costs its workload's seconds and ``--nodes`` runs go on side by side for real even on two cores. The
workload is two phases (concurrency 1, then 4) of ``--phase-s`` seconds each. The cluster is Ray's own
``ray.cluster_utils.Cluster`` on this machine (a head without server resources, ``--nodes`` worker nodes with one
CPU each, all on 127.0.0.1, no dashboard); its start is timed apart and not counted. Both validations run the same
plan through ``spectune.validate.run.execute`` (the serial one first), each into its own folder; the Ray wall time
includes connecting and streaming every run back. Prints both wall times, their ratio, the runs in validate.json
order with the node of each, and both verdicts.

Needs Ray: ``pip install -e ".[ray]"``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", default="0,1,2,3", help="static num_steps (the config's candidates: 1 and 3)")
    p.add_argument("--nodes", type=int, default=5, help="worker nodes of the local cluster (one server each)")
    p.add_argument("--phase-s", type=float, default=4.0, help="s per phase (two phases: c=1, then c=4)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--tokens-per-second", type=int, default=300, help="the static servers' decode speed")
    p.add_argument("--config-speedup", type=float, default=3.0)
    p.add_argument("--startup-s", type=float, default=1.0, help="s a fake server takes to start listening")
    p.add_argument("--output", type=Path, default=None, help="folder for both results folders (default: a temp dir)")
    return p.parse_args(argv)


def template(tokens_per_second: float, startup_s: float) -> str:
    from helpers.paths import FAKE_SERVER

    return (f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE_SERVER))} --port {{port}} --steps {{steps}} "
            f"--tokens-per-second {tokens_per_second:g} --startup-delay {startup_s:g} "
            "--adaptive-config {adaptive_config}")


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every node and the driver on 127.0.0.1
    import ray

    from helpers.ray_cluster import add_worker, start_cluster, stop_cluster
    from spectune.backends.options import BackendOptions
    from spectune.commands.options import parse_int_list
    from spectune.sweep.distributed import RayOptions
    from spectune.validate.plan import ValidatePlan
    from spectune.validate.run import execute
    from spectune.measure.workload import parse_workload

    base = args.output or Path(tempfile.mkdtemp(prefix="ray-validate-"))
    base.mkdir(parents=True, exist_ok=True)
    prompts = base / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}", "category": "chat"}) + "\n" for i in range(8)))
    config = base / "adaptive.json"
    config.write_text(json.dumps({"1": {"candidate_steps": [1, 3]}, "4": {"candidate_steps": [0, 1]}}))
    wl = parse_workload(f"c1@{args.phase_s:g},c4@{args.phase_s:g}", args.phase_s, None, 1.0, 64, 0)
    plan = ValidatePlan(config=str(config), steps=tuple(parse_int_list(args.steps, "steps", 0)), workload=wl,
                        dataset=f"jsonl:{prompts}", num_prompts=8, max_tokens=32, warmup_requests=1,
                        repeats=args.repeats)
    options = BackendOptions(launch=template(args.tokens_per_second, args.startup_s), startup_timeout_s=60)
    config_launch = template(args.tokens_per_second * args.config_speedup, args.startup_s)

    t = time.perf_counter()
    cluster = start_cluster(0)
    try:
        for _ in range(args.nodes):
            add_worker(cluster)
        cluster.wait_for_nodes()
        print(f"local Ray cluster: {args.nodes} nodes x 1 server, started in {time.perf_counter() - t:.1f} s "
              f"(not counted); Ray {ray.__version__}", flush=True)
        walls = {}
        for name, ray_opts in (("serial", None),
                               ("ray", RayOptions(address=cluster.address, resources={"CPU": 1.0, "fast": 1.0}))):
            t = time.perf_counter()
            asyncio.run(execute(plan, "launch", options, base / name, config_launch=config_launch, ray=ray_opts))
            walls[name] = time.perf_counter() - t
            print(f"{name}: {walls[name]:.1f} s", flush=True)
    finally:
        stop_cluster(cluster)

    metas = {name: json.loads((base / name / "validate.json").read_text()) for name in walls}
    print()
    print(f"plan: static num_steps {args.steps} + the config, {args.repeats} repeat(s); workload c=1 then c=4, "
          f"{args.phase_s:g} s each; server start {args.startup_s:g} s; {len(metas['serial']['runs'])} runs")
    print(f"{'':>22}{'serial':>10}{'--ray':>10}")
    print(f"{'wall time, s':>22}{walls['serial']:>10.1f}{walls['ray']:>10.1f}")
    print(f"{'ray / serial':>22}{'':>10}{walls['ray'] / walls['serial']:>10.1%}")
    same = [(r["run"], r["repeat"]) for r in metas["serial"]["runs"]] == [(r["run"], r["repeat"])
                                                                       for r in metas["ray"]["runs"]]
    print(f"same runs in the same order: {same}")
    for r in metas["ray"]["runs"]:
        tput = (r.get("overall") or {}).get("output_throughput_tok_s")
        print(f"  {r['run']} #{r['repeat']}: {r['status']}, {tput or 0:,.1f} tok/s @ node "
              f"{str((r.get('node') or {}).get('id') or '-')[:8]}")
    for name, m in metas.items():
        print(f"{name} verdict: {m['verdict']['line']}")
    print(f"folders: {base}")


if __name__ == "__main__":
    main()
