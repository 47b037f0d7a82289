"""An event loop that SIGINT/SIGTERM cancel cleanly: what ``spectune sweep`` and ``spectune validate`` run in."""

from __future__ import annotations

import asyncio
import signal
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")


def run_with_signals(make: Callable[[], Awaitable[T]]) -> tuple[T | None, int | None]:
    """Run the coroutine ``make()`` in a new event loop (main thread); SIGINT/SIGTERM cancel it cleanly.

    Returns ``(result, None)`` when it finished, or ``(None, signal number)`` when a signal cancelled it. A second
    signal raises KeyboardInterrupt at once (launched servers are then killed at interpreter exit by
    ``spectune.backends.process``).
    """
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
