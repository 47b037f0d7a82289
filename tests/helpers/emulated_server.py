"""One emulated speculative server (tests/helpers/cost_model.py's ``EmulatedEngine``) as a process of its own, for the
``launch`` backend: the distributed-sweep tests and benchmarks/ray_sweep.py.

    python tests/helpers/emulated_server.py --port P --steps K [--host H] [--cost compute-bound|memory-bound]
                                            [--scale F] [--startup-s S] [--pid-dir DIR]

Every verify step sleeps the cost model's step time (times ``--scale``, times the environment's
``EMULATED_SLOWDOWN``, default 1: a slower machine), so a server costs little CPU and several run side by side on
two cores. ``--startup-s``: seconds before it listens (a real server's start: weights, CUDA graphs). ``--pid-dir``:
a file named after its pid is written there at start (tests check afterwards that every server was stopped).
SIGTERM/SIGINT stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: `helpers` importable when run as a script

from aiohttp import web  # noqa: E402

from helpers.cost_model import COMPUTE_BOUND, MEMORY_BOUND, EmulatedEngine  # noqa: E402

SCRIPT = Path(__file__).resolve()
MODELS = {"compute-bound": COMPUTE_BOUND, "memory-bound": MEMORY_BOUND}


def launch_template(extra: str = "") -> str:
    """A ``--launch`` template running this script with the backend's ``{host}``, ``{port}`` and ``{steps}``."""
    return f"{sys.executable} {SCRIPT} --host {{host}} --port {{port}} --steps {{steps}} {extra}".strip()


async def serve(args: argparse.Namespace) -> None:
    slowdown = float(os.environ.get("EMULATED_SLOWDOWN", "1") or 1)
    model = MODELS[args.cost].scaled(args.scale * slowdown)
    if args.pid_dir:
        Path(args.pid_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.pid_dir) / str(os.getpid())).write_text(" ".join(sys.argv))
    await asyncio.sleep(args.startup_s)
    engine = EmulatedEngine(model, args.steps, time.perf_counter())
    engine.task = asyncio.ensure_future(engine.loop())
    runner = web.AppRunner(engine.app(), shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    print(f"emulated server K={args.steps} ({model.name} x{args.scale * slowdown:g}) on {args.host}:{args.port}",
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
    p.add_argument("--startup-s", type=float, default=0.0)
    p.add_argument("--pid-dir", default="")
    asyncio.run(serve(p.parse_args(argv)))


if __name__ == "__main__":
    main()
