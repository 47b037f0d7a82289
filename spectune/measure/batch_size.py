"""The engine's running batch size over a measurement window, from its own running-requests gauge."""

from __future__ import annotations

import asyncio
from typing import Sequence

from spectune.backends.base import Backend
from spectune.core.json_types import JsonObject


BATCH_SIZE_INTERVAL_S = 0.5
"""s between two readings of the engine's running-requests gauge during a measurement window."""


def batch_size_summary(samples: Sequence[float], source: str) -> JsonObject | None:
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

    async def stop(self) -> JsonObject | None:
        """Stop sampling; :func:`batch_size_summary` of the readings, or None without any."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        return batch_size_summary(self.samples, self.source or "") if self.samples else None
