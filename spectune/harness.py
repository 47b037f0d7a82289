"""What ``spectune sweep`` and ``spectune validate`` share to measure a server: the model name to send
(:func:`resolve_model`), the client settings of a measured run (:func:`client_config`), the host and package
versions for the results file (:func:`environment`), the engine's running batch size over a window
(:class:`BatchSizeSampler`) and an event loop that SIGINT/SIGTERM cancel cleanly (:func:`run_with_signals`).
"""

from __future__ import annotations

import asyncio
import os
import platform
import socket
import sys
from typing import Any, Awaitable, Callable, Sequence, TypeVar

from backends.base import Backend
from loadgen.errors import UserError

__all__ = ["BatchSizeSampler", "batch_size_summary", "client_config", "environment", "resolve_model",
           "run_with_signals", "warm_up"]

T = TypeVar("T")


def environment() -> dict[str, Any]:
    """``host`` and ``versions`` for sweep.json and validate.json (package versions read from metadata: nothing
    is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    versions = {n: ver(n) for n in ("spectune", "aiohttp", "numpy", "torch", "transformers")}
    versions["python"] = platform.python_version()
    host = {"hostname": socket.gethostname(), "platform": platform.platform(), "python": sys.version.split()[0],
            "cpus": os.cpu_count()}
    return {"host": host, "versions": versions}


async def resolve_model(base_url: str, preferred: str | None, headers: dict[str, str]) -> str:
    """The model name to send: ``preferred`` when ``GET /v1/models`` lists it (or lists nothing), else the only
    listed id (a server started with another served name), else ``preferred``, else the first listed id.

    Raises:
        UserError: no model list and no ``preferred`` name (the point or run fails with this message).
    """
    from backends.http import get

    reply = await get(base_url + "/v1/models", 10.0, headers)
    data = reply.json() if reply.status == 200 else None
    ids = [m.get("id") for m in (data.get("data") or [])] if isinstance(data, dict) else []
    ids = [i for i in ids if isinstance(i, str)]
    if preferred and (preferred in ids or len(ids) != 1):
        return preferred
    if ids:
        return ids[0]
    why = reply.error or f"HTTP {reply.status}"
    raise UserError(f"cannot read the model name from {base_url}/v1/models ({why}); pass --model")


def client_config(plan: Any, backend: Backend, base_url: str, model: str | None, api_key_env: str | None,
                  timeout_s: float = 600.0) -> Any:
    """The :class:`loadgen.ClientConfig` of a measured run: ``plan``'s ``api``, ``max_tokens``, ``temperature`` and
    ``ignore_eos`` (a :class:`~spectune.sweep_plan.SweepPlan`, a :class:`~spectune.validate_plan.ValidatePlan` or
    any object with those fields) plus the backend's extra request fields; ``timeout_s`` (s) per request."""
    from loadgen import ClientConfig

    extra = backend.request_extra()
    return ClientConfig(base_url, model=model, api=plan.api, max_tokens=plan.max_tokens,
                        temperature=plan.temperature, ignore_eos=plan.ignore_eos, extra_body=extra or None,
                        api_key_env=api_key_env, timeout_s=timeout_s, reuse_connections=backend.reuse_connections)


BATCH_SIZE_INTERVAL_S = 0.5
"""s between two readings of the engine's running-requests gauge during a measurement window."""


def batch_size_summary(samples: Sequence[float], source: str) -> dict[str, Any] | None:
    """The running batch size over a window from evenly spaced gauge readings (requests), or None without any.

    Returns ``mean`` (the time average, readings being evenly spaced), ``p50``, ``p90`` (``numpy.percentile``,
    linear), ``min``, ``max``, ``samples`` (readings), ``histogram`` (``{"B": readings at batch size B}``, B rounded
    to an integer) and ``source`` (the gauge).
    """
    import numpy as np

    if not samples:
        return None
    arr = np.asarray(samples, dtype=float)
    hist: dict[str, int] = {}
    for v in sorted(int(round(x)) for x in samples):
        hist[str(v)] = hist.get(str(v), 0) + 1
    return {"mean": float(arr.mean()), "p50": float(np.percentile(arr, 50)), "p90": float(np.percentile(arr, 90)),
            "min": float(arr.min()), "max": float(arr.max()), "samples": len(samples), "histogram": hist,
            "source": source}


class BatchSizeSampler:
    """Reads ``backend.running_requests()`` every ``interval_s`` s between :meth:`start` and :meth:`stop` (the first
    reading one interval after the start, none at the stop, so the drained server after the window is not counted).

    A reading that fails or returns None is skipped; the source is the gauge of the readings taken.
    """

    def __init__(self, backend: Backend, interval_s: float = BATCH_SIZE_INTERVAL_S) -> None:
        self.backend, self.interval_s = backend, interval_s
        self.samples: list[float] = []
        self.source: str | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin sampling in the background (call from a running event loop)."""
        self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                reading = await self.backend.running_requests()
            except Exception:  # noqa: BLE001 - a metrics page problem must not lose the point
                reading = None
            if reading is not None:
                self.samples.append(reading[0])
                self.source = reading[1]

    def cancel(self) -> None:
        """Stop sampling without a summary (the window was abandoned)."""
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> dict[str, Any] | None:
        """Stop sampling; :func:`batch_size_summary` of the readings, or None without any."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        return batch_size_summary(self.samples, self.source or "") if self.samples else None


async def warm_up(client: Any, prompts: list[Any], concurrency: int, timeout_s: float) -> tuple[list[Any], str | None]:
    """Send ``prompts`` (warm-up prompts, :func:`loadgen.runner.warmup_prompt`) closed-loop at ``concurrency``.

    Returns:
        (their records, None), or ([], why) when they did not all finish within ``timeout_s`` s (the requests still
        in flight are cancelled): the server accepts requests but does not answer them in time.
    """
    from loadgen import ClosedLoop, Constraints, run_point

    if not prompts:
        return [], None
    try:
        result = await asyncio.wait_for(run_point(client, prompts, ClosedLoop(max(1, min(len(prompts), concurrency))),
                                                  Constraints(max_requests=len(prompts))), timeout_s)
    except asyncio.TimeoutError:
        return [], (f"warm-up: {len(prompts)} request(s) did not finish within {timeout_s:g} s (the server accepts "
                    "requests but does not answer them); raise --warmup-timeout if it is only slow")
    return result.records, None


def run_with_signals(make: Callable[[], Awaitable[T]]) -> tuple[T | None, int | None]:
    """Run the coroutine ``make()`` in a new event loop (main thread); SIGINT/SIGTERM cancel it cleanly.

    Returns ``(result, None)`` when it finished, or ``(None, signal number)`` when a signal cancelled it. A second
    signal raises KeyboardInterrupt at once (launched servers are then killed at interpreter exit by
    ``backends.process``).
    """
    import signal

    async def main() -> tuple[T | None, int | None]:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(make())
        got: list[int] = []

        def on_signal(signum: int) -> None:
            if got:
                raise KeyboardInterrupt
            got.append(signum)
            task.cancel()

        handled = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, on_signal, sig)
                handled.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signal support
                pass
        try:
            return await task, None
        except asyncio.CancelledError:
            if not got:
                raise
            return None, got[0]
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)

    return asyncio.run(main())
