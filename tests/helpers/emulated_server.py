"""One emulated speculative server (tests/helpers/cost_model.py's ``EmulatedEngine``) as a process of its own, for the
``launch`` backend: the distributed-sweep tests, the server-spread and schedule-server tests, benchmarks/ray_sweep.py.

    python tests/helpers/emulated_server.py --port P --steps K [--host H] [--cost compute-bound|memory-bound]
                                            [--scale F] [--per-token-ms MS] [--base-ms MS] [--accept P] [--startup-s S] [--pid-dir DIR]
                                            [--instance-factors F1,F2,... --instance-dir DIR]
                                            [--slow-above N --slow-factor F] [--continuous-usage]
                                            [--adaptive-config PATH [--schedule-draft-floor] [--schedule-factor F]]

Every verify step sleeps the cost model's step time (times ``--scale``, times the environment's
``EMULATED_SLOWDOWN``, default 1: a slower machine), so a server costs little CPU and several run side by side on
two cores. ``--startup-s``: seconds before it listens (a real server's start: weights, CUDA graphs). ``--pid-dir``:
a file named after its pid is written there at start (tests check afterwards that every server was stopped).
SIGTERM/SIGINT stop it.

``--instance-factors`` with ``--instance-dir``: a server process's own speed (two real engines with their own
weights run a few per cent apart, docs/engine.md): the i-th server started with the same ``--instance-dir`` (claimed
by creating the file ``i`` there) has its step times times the i-th factor (cycling), so servers started one after
another (a serial validation) draw known factors in their start order. ``--slow-above N --slow-factor F``: steps of
more than N sequences take F times as long (an engine that loses only under load). ``--per-token-ms``, ``--base-ms``,
``--accept``: the cost model's verify cost per token verified, fixed step cost and acceptance per draft position (a
costlier verify makes speculation lose at larger batches, a larger fixed cost makes it gain more at batch 1).

``--adaptive-config PATH`` (a launch template's ``{adaptive_config}``): when PATH holds a vLLM per-batch-size
schedule, ``[[lo, hi, K], ...]`` or a speculative config ``{"num_speculative_tokens": M,
"num_speculative_tokens_per_batch_size": [...]}``, the server runs it as vLLM does
(``vllm/v1/spec_decode/dynamic/utils.py``): each verify step drafts the K of the range holding the number of running
sequences (a gap or a size above the last range: the nearest range below; K clamped to M), and its spec-decode
counters count each step's drafts with that K (K=0 steps none). An invalid schedule stops the server before it
listens (exit 2), as vLLM refuses it. Any other file (an SGLang adaptive config), or an empty PATH, is ignored:
every step drafts ``--steps``. A server running a schedule costs more than its K says (cost_model.py's
``ScheduleServer``; vLLM's drafter runs over the whole batch every step,
``vllm/v1/spec_decode/llm_base_proposer.py``): ``--schedule-draft-floor``: a K=0 step takes one draft step anyway
(``per_draft_ms + per_draft_seq_ms * batch``, scaled like every other term); ``--schedule-factor F`` (default 1):
every step takes F times as long (CUDA graphs downgraded for a K-varying schedule). Neither applies to a server
without a schedule.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import replace
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: `helpers` importable when run as a script

from aiohttp import web  # noqa: E402

from helpers.cost_model import (COMPUTE_BOUND, MEMORY_BOUND, CostModel, EmulatedEngine,  # noqa: E402
                                ScheduleServer, load_vllm_schedule)

SCRIPT = Path(__file__).resolve()
MODELS = {"compute-bound": COMPUTE_BOUND, "memory-bound": MEMORY_BOUND}


def launch_template(extra: str = "") -> str:
    """A ``--launch`` template running this script with the backend's ``{host}``, ``{port}`` and ``{steps}``."""
    return f"{sys.executable} {SCRIPT} --host {{host}} --port {{port}} --steps {{steps}} {extra}".strip()


class BatchSlowdown:
    """``model``'s step times, ``factor`` times as long while more than ``above`` sequences run."""

    def __init__(self, model: CostModel, above: int, factor: float) -> None:
        self.model, self.above, self.factor = model, above, factor

    def __getattr__(self, name: str):
        return getattr(self.model, name)

    def step_s(self, batch: int, steps: int) -> float:
        return self.model.step_s(batch, steps) * (self.factor if batch > self.above else 1.0)

    def draft_step_s(self, batch: int) -> float:
        return self.model.draft_step_s(batch) * (self.factor if batch > self.above else 1.0)


def instance_factor(factors: str, folder: str) -> float:
    """This process's own speed factor: the i-th of ``factors`` (comma-separated, cycling) for the i-th server that
    claims a file in ``folder`` (1.0 without factors)."""
    values = [float(x) for x in factors.split(",") if x.strip()]
    if not values:
        return 1.0
    Path(folder).mkdir(parents=True, exist_ok=True)
    i = 0
    while True:
        try:
            os.close(os.open(Path(folder) / str(i), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return values[i % len(values)]
        except FileExistsError:
            i += 1


def schedule_server(args: argparse.Namespace) -> ScheduleServer | None:
    """The vLLM schedule ``--adaptive-config`` holds, with its extra cost, or None (no schedule: ``--steps``).
    Exits 2 on an invalid schedule."""
    try:
        schedule = load_vllm_schedule(args.adaptive_config)
    except ValueError as err:
        print(f"emulated server: invalid vLLM schedule in {args.adaptive_config}: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    if schedule is None:
        return None
    return ScheduleServer(schedule, draft_floor=args.schedule_draft_floor, factor=args.schedule_factor)


async def serve(args: argparse.Namespace) -> None:
    schedule = schedule_server(args)
    slowdown = float(os.environ.get("EMULATED_SLOWDOWN", "1") or 1)
    own = instance_factor(args.instance_factors, args.instance_dir)
    base = MODELS[args.cost]
    if args.per_token_ms is not None:  # a costlier verify: speculation loses at larger batches
        base = replace(base, per_token_ms=args.per_token_ms)
    if args.base_ms is not None:  # a larger fixed step cost: speculation gains more at batch 1
        base = replace(base, base_ms=args.base_ms)
    if args.accept is not None:  # one acceptance rate at every draft position
        base = replace(base, accept=(args.accept,))
    model = base.scaled(args.scale * slowdown * own)
    if args.slow_above is not None:
        model = BatchSlowdown(model, args.slow_above, args.slow_factor)
    if args.pid_dir:
        Path(args.pid_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.pid_dir) / str(os.getpid())).write_text(" ".join(sys.argv))
    await asyncio.sleep(args.startup_s)
    engine = EmulatedEngine(model, args.steps, time.perf_counter(), continuous_usage=args.continuous_usage,
                            schedule=schedule)
    engine.task = asyncio.ensure_future(engine.loop())
    runner = web.AppRunner(engine.app(), shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    runs = (f"K={args.steps}" if schedule is None else
            f"schedule {schedule.schedule.to_json()} (draft floor {'on' if schedule.draft_floor else 'off'}, "
            f"x{schedule.factor:g})")
    print(f"emulated server {runs} ({model.name} x{args.scale * slowdown * own:g}) on {args.host}:{args.port}",
          flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    engine.task.cancel()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--cost", choices=sorted(MODELS), default="compute-bound")
    p.add_argument("--scale", type=float, default=1.0, help="step times x this")
    p.add_argument("--per-token-ms", type=float, default=None, help="the cost model's verify cost per token "
                   "verified, ms (before --scale; default: the model's own)")
    p.add_argument("--base-ms", type=float, default=None, help="the cost model's fixed cost of a step, ms (before "
                   "--scale; default: the model's own)")
    p.add_argument("--accept", type=float, default=None, help="the conditional acceptance of every draft position "
                   "(default: the model's own)")
    p.add_argument("--startup-s", type=float, default=0.0)
    p.add_argument("--pid-dir", default="")
    p.add_argument("--instance-factors", default="", help="step-time factors, one per server started (cycling)")
    p.add_argument("--instance-dir", default="", help="where servers claim their place in the start order")
    p.add_argument("--slow-above", type=int, default=None, help="steps of more sequences than this are slower")
    p.add_argument("--slow-factor", type=float, default=1.0, help="how much slower (step time x this)")
    p.add_argument("--continuous-usage", action="store_true", help="cumulative usage in every chunk when asked "
                   "(continuous_usage_stats), as vLLM and SGLang: the client then counts each chunk's tokens")
    p.add_argument("--adaptive-config", default="", help="a vLLM per-batch-size schedule to run instead of --steps; "
                   "any other file ignored (a launch template's {adaptive_config})")
    p.add_argument("--schedule-draft-floor", action="store_true", help="a server running a schedule pays one draft "
                   "step at K=0 steps (its drafter runs over the batch anyway)")
    p.add_argument("--schedule-factor", type=float, default=1.0, help="a server running a schedule: every step "
                   "time x this (CUDA graphs downgraded)")
    args = p.parse_args(argv)
    if args.schedule_factor <= 0:
        p.error(f"--schedule-factor must be > 0, got {args.schedule_factor:g}")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
