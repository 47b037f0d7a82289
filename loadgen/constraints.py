"""Constraints: WHEN a run stops sending (guidellm's split: strategies time requests, constraints end the run).

A point ends after ``max_requests`` requests or ``max_duration_s`` seconds, whichever comes first. After that no
request is sent; requests in flight may finish for up to ``drain_timeout_s`` seconds, then they are cancelled and
recorded as failed (their partial measurements kept). ``max_failures`` stops a point early when the server is
clearly broken (every request failing fast would otherwise burn through the whole request budget). ``stop_when``
ends a point once its caller has learnt what it measures the point for (a sequential test on the finished requests,
``spectune.sweep.sequential``); requests in flight then finish as after ``max_requests``, or, with
``cancel_on_early_stop``, are cancelled at once and left out of the point (their connections closed, which a server
takes as an abort: vLLM and SGLang abort a request whose client disconnected, the bundled engine too,
``spectune/backends/local/server/app.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from spectune.core.errors import UserError
from spectune.loadgen.record import RequestRecord

__all__ = ["Constraints", "RunState"]


@dataclass
class RunState:
    """Progress of a run, as constraints see it.

    Attributes:
        started: requests sent so far.
        finished: requests finished (successfully or not).
        failed: finished requests that failed.
        elapsed_s: s since the run started.
        records: the finished requests, in the order they finished.
    """

    started: int = 0
    finished: int = 0
    failed: int = 0
    elapsed_s: float = 0.0
    records: list[RequestRecord] = field(default_factory=list)


@dataclass(frozen=True)
class Constraints:
    """When to stop sending, and how long to wait for the requests still in flight.

    Attributes:
        max_requests: stop sending after this many requests (warm-up excluded), or None.
        max_duration_s: s; stop sending this long after the first measured send, or None.
        max_failures: stop sending once this many requests have failed, or None.
        drain_timeout_s: s; after sending stopped, how long requests in flight may take to finish before they are
            cancelled and recorded as failed.
        stop_when: called with the finished records and the seconds since the run started whenever the sending loop
            decides whether to send; a non-empty string it returns stops sending (``stop_reason`` ``early_stop``;
            the string is the caller's own reason, kept by the caller), or None.
        cancel_on_early_stop: when ``stop_when`` stops the run, cancel the requests in flight at once and record
            nothing of them (the caller's estimate needs only the finished ones), instead of waiting for them;
            ``stop_when`` is then also asked as each request in flight at the ``max_duration_s`` cap finishes
            (``spectune.loadgen.send_loop``), and may end that drain the same way (not after ``max_requests``:
            those requests run to the end).

    Raises:
        UserError: neither ``max_requests`` nor ``max_duration_s`` given (the point would never end), or a
            non-positive limit.
    """

    max_requests: int | None = None
    max_duration_s: float | None = None
    max_failures: int | None = None
    drain_timeout_s: float = 60.0
    stop_when: Callable[[Sequence[RequestRecord], float], str | None] | None = None
    cancel_on_early_stop: bool = False

    def __post_init__(self) -> None:
        if self.max_requests is None and self.max_duration_s is None:
            raise UserError("a point needs a request count or a duration: set requests or duration per point")
        for name in ("max_requests", "max_duration_s", "max_failures"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise UserError(f"{name} must be positive, got {value}")
        if self.drain_timeout_s < 0:
            raise UserError(f"drain_timeout_s must be >= 0, got {self.drain_timeout_s}")

    def stop_reason(self, state: RunState) -> str | None:
        """Why sending must stop now (``"max_requests"``, ``"max_duration"``, ``"max_failures"``, ``"early_stop"``),
        or None."""
        if self.max_requests is not None and state.started >= self.max_requests:
            return "max_requests"
        if self.max_duration_s is not None and state.elapsed_s >= self.max_duration_s:
            return "max_duration"
        if self.max_failures is not None and state.failed >= self.max_failures:
            return "max_failures"
        if self.stop_when is not None and self.stop_when(state.records, state.elapsed_s):
            return "early_stop"
        return None

    def deadline(self, t0: float) -> float | None:
        """Absolute time (s, same clock as ``t0``) when the duration limit stops sending, or None."""
        return None if self.max_duration_s is None else t0 + self.max_duration_s
