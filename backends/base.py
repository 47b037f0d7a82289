"""The interface every sweep target implements, with an explicit lifecycle (as guidellm's backends have).

Lifecycle for one sweep point (num_steps K, a concurrency, a repeat)::

    endpoint = await backend.start(K)          # launch or select the server for K; returns once it is ready
    before = await backend.snapshot()          # spec-decode counters before the measurement window
    ... the load generator sends requests to endpoint ...
    after = await backend.snapshot()           # ... and after it
    acc = backend.acceptance(before, after, records)
    await backend.stop()                       # stop what start() launched (no-op for remote endpoints)
    ...
    await backend.close()                      # end of the sweep

``start`` may be called again for the same K without ``stop`` in between (several concurrencies on one server):
a backend returns the running endpoint when nothing needs to change.

Engine-specific quirks (flags, metric names, lifetime averages) live in the backend classes, never in callers.

The records a backend is built with live in :mod:`spectune.backends.options`; the counter readings and the acceptance
computed from them in :mod:`spectune.backends.snapshots`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar, Sequence, TypedDict

from spectune.backends.eagle_heads import eagle_version
from spectune.backends.options import Endpoint
from spectune.backends.snapshots import (Acceptance, SpecSnapshot, chunk_proxy_acceptance, counter_acceptance,
                                         has_counters)
from spectune.core.json_types import JsonObject
from spectune.loadgen.record import RequestRecord


class Backend(abc.ABC):
    """A sweep target: starts (or selects) a server per num_steps and reads its spec-decode metrics.

    Subclasses set ``name`` and implement :meth:`start` and :meth:`stop`; they override :meth:`snapshot` and
    :meth:`acceptance` where the server exposes acceptance metrics (the defaults fall back to tokens per chunk).
    """

    name: ClassVar[str] = "base"
    #: Whether the load generator may reuse a connection for the next request (HTTP keep-alive).
    reuse_connections: ClassVar[bool] = True
    #: Whether ``start(K)`` for another num_steps is cheap (about a second: the bundled engine switches in place,
    #: llama-server of a small model restarts fast), so a sweep interleaves num_steps at each concurrency instead of
    #: measuring one num_steps block after another (a restart with CUDA-graph capture per switch for SGLang/vLLM).
    cheap_switch: ClassVar[bool] = False
    #: The server flag of the engine's draft-confidence cutoff P (a row stops drafting at the first draft token whose
    #: probability is under P), or None when the engine has none: ``spectune sweep --p-min`` sweeps it
    #: (:meth:`p_min_args`). llama.cpp: ``--spec-draft-p-min``.
    p_min_flag: ClassVar[str | None] = None

    async def preflight(self, steps_list: Sequence[int]) -> list[str]:
        """Check, before anything is measured, that every planned num_steps can be served.

        Called once by the sweep with all planned num_steps. Returns warnings to show the user (may be empty).

        Raises:
            core.errors.UserError: what would make a point fail for a reason the user must fix (no endpoint
                for a num_steps, an unreachable endpoint, a missing executable, a fixed port in use).
        """
        return []

    @abc.abstractmethod
    async def start(self, steps: int) -> Endpoint:
        """Make a server with num_steps ``steps`` ready and return its endpoint.

        Blocks (asynchronously) until the server answers its health check.

        Raises:
            core.errors.UserError: configuration problems the user must fix (missing executable, port in
                use, no endpoint for this num_steps).
            BackendStartError: the server failed to start or never became ready (the point fails, the sweep
                goes on); its message carries the log tail.
        """

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop whatever :meth:`start` launched and wait until its process and port are gone (no-op if none)."""

    async def snapshot(self) -> SpecSnapshot | None:
        """Read cumulative spec-decode metrics now; None if this backend has none."""
        return None

    async def running_requests(self) -> tuple[float, str] | None:
        """The engine's own count of requests in its running batch now (requests; summed over engines/DP ranks),
        and the metric it came from; None when the engine publishes none or it cannot be read.

        The sweep samples it over each measurement window (the batch size the engine actually schedules, below the
        client's concurrency while requests prefill, queue or straggle). Must be cheap: it is polled about twice a
        second during the window.
        """
        return None

    async def switches(self) -> tuple[float, str] | None:
        """The running server's cumulative num_steps switches (an adaptive policy changing its tier) and where the
        count came from; None (the default) when the server exposes none. ``spectune validate`` reads it at phase
        boundaries; the difference between two readings is the window's switches."""
        return None

    def acceptance(
        self, before: SpecSnapshot | None, after: SpecSnapshot | None, records: Sequence[RequestRecord]
    ) -> Acceptance:
        """Acceptance over the window between two snapshots: :func:`counter_acceptance` when both carry counters
        (source ``<metrics prefix>/metrics counters``, the prefix from ``after.raw["metrics_prefix"]``, else the
        backend's name), else the tokens-per-chunk proxy with :meth:`proxy_warning`.

        Raises:
            ValueError: the snapshots carry ``num_drafts`` but not ``num_accepted_tokens``.
        """
        if has_counters(before, after):
            prefix = str(after.raw.get("metrics_prefix", f"{self.name}:"))  # type: ignore[union-attr]
            return counter_acceptance(before, after, f"{prefix}/metrics counters")  # type: ignore[arg-type]
        return chunk_proxy_acceptance(records, warning=self.proxy_warning(after))

    def proxy_warning(self, after: SpecSnapshot | None) -> str:
        """Why :meth:`acceptance` fell back to the tokens-per-chunk proxy (``after``: the window's last snapshot)."""
        return f"{self.name}: no spec-decode metrics; proxy used"

    def schedule_server(self) -> ScheduleServer | None:
        """The server this engine's per-batch-size config runs and how spectune pins it to one num_steps, or None
        when the engine has no per-batch-size config or this backend cannot start such a server (running
        endpoints, a launch template without ``{adaptive_config}``)."""
        return None

    def schedule_steps(self, steps: Sequence[int]) -> tuple[list[int], list[str]]:
        """The num_steps among ``steps`` this backend's :meth:`schedule_server` (not None) can be pinned to, and a
        warning for those it cannot (by default every num_steps can be)."""
        return list(steps), []

    def schedule_setting(self) -> str | None:
        """What to change when the server does not follow a per-batch-size num_steps schedule it was given (one
        clause for :mod:`spectune.measure.schedule_check`'s warning), or None when this engine has no such setting."""
        return None

    def p_min_args(self, p_min: float) -> list[str] | None:
        """The launch arguments that set the draft-confidence cutoff ``p_min`` (a probability, 0..1) on this backend's
        servers: ``[p_min_flag, P]`` by default; None when this backend cannot set it (no :attr:`p_min_flag`, or
        servers it does not launch)."""
        return None if self.p_min_flag is None else [self.p_min_flag, f"{p_min:g}"]

    def server_memory_gib(self, steps: int) -> float | None:
        """About how much host memory (GiB) one server this backend launches on this machine holds at num_steps
        ``steps``, or None when unknown or not on this machine (running endpoints, remote or GPU servers): what
        ``spectune validate --servers together`` checks against the memory available before starting a repeat's
        servers at once."""
        return None

    def failure_log(self) -> str:
        """The log tail of a server this backend launched that has died since its start, else "": attached to a
        point that failed so the reason is kept with it."""
        return ""

    def request_extra(self) -> JsonObject:
        """Extra JSON fields to add to every request body (e.g. SGLang's ``return_spec_tokens_details``)."""
        return {}

    def describe(self) -> JsonObject:
        """A JSON-serialisable description recorded in sweep.json (never secrets such as API keys)."""
        return {"backend": self.name}

    @classmethod
    def draft_algorithm(cls, description: JsonObject) -> tuple[str | None, str]:
        """The speculative method of the draft head a recorded run used, in lower case (``"eagle"``, ``"eagle3"``,
        or another engine method name), and how it was found; ``(None, "unknown")`` when the description (a
        :meth:`describe` result read back from sweep.json) does not tell.

        Reads ``draft_algorithm`` (written by launching backends), else the head's config.json or name
        (:func:`spectune.backends.eagle_heads.eagle_version`) when the description names a ``draft``. Backends
        that record the method under their own key override this.
        """
        if description.get("draft_algorithm"):
            return str(description["draft_algorithm"]).lower(), "sweep.json draft_algorithm"
        if description.get("draft"):
            return eagle_version(str(description["draft"]))
        return None, "unknown"

    embeds_default_pair = False
    """True for backends that run the embedded default pair (SmolLM2 + the bundled EAGLE-3 head) when no model is
    named: :func:`spectune.backends.draft_head` then names the bundled head for a recorded run without a ``draft``."""

    async def close(self) -> None:
        """End of the sweep: release everything (stops a running server)."""
        await self.stop()

    async def hand_over(self, successor: Backend) -> bool:
        """Give this backend's running server to ``successor`` instead of closing it, when ``successor`` can switch it
        to what it serves (e.g. another draft-confidence cutoff) in place. Returns whether it did; then this backend
        holds no server and ``successor`` closes it. By default False: the caller closes this backend."""
        return False


class ScheduleServerJson(TypedDict):
    """:meth:`ScheduleServer.to_json`: sweep.json's ``schedule_server`` entry (``max_k`` is added by the backend)."""

    engine: str
    pinned: str
    source: str
    costs_more: bool


@dataclass(frozen=True)
class ScheduleServer:
    """An engine's *schedule server*: the server its per-batch-size num_steps config runs, which is not the static
    server spectune sweeps at each num_steps (vLLM's drafter runs over the whole batch every step even where its
    schedule says K=0, ``vllm/v1/spec_decode/llm_base_proposer.py`` ``propose``; SGLang's adaptive mode keeps a
    draft extend every round). ``spectune sweep`` measures it pinned to each num_steps beside the static cells
    (the ``schedule-server/`` folder) and ``spectune recommend`` prices a schedule's slots there.

    Attributes:
        engine: the engine's name (``vllm``, ``sglang``, ``spectune``, ``launch``).
        pinned: how one num_steps K is pinned, in the engine's terms (``num_speculative_tokens = max K,
            num_speculative_tokens_per_batch_size [[1, N, K]]``).
        source: the engine file that says what the server runs (cited in recommendation.md).
        costs_more: whether the schedule server can cost more than the static server of the same num_steps
            (a drafter kept running, graphs downgraded): ``spectune sweep`` measures it by default only then.
    """

    engine: str
    pinned: str
    source: str
    costs_more: bool

    def to_json(self) -> ScheduleServerJson:
        """sweep.json's ``schedule_server`` entry."""
        return {"engine": self.engine, "pinned": self.pinned, "source": self.source, "costs_more": self.costs_more}


class PinnedSchedule(TypedDict):
    """A vLLM ``--speculative-config`` schedule pinned to one num_steps (:func:`pinned_vllm_schedule`)."""

    num_speculative_tokens: int
    num_speculative_tokens_per_batch_size: list[list[int]]


def pinned_vllm_schedule(steps: int, max_k: int, max_batch: int) -> PinnedSchedule:
    """A vLLM ``--speculative-config`` schedule that pins num_steps ``steps`` at every batch size:
    ``{"num_speculative_tokens": max_k, "num_speculative_tokens_per_batch_size": [[1, max_batch, steps]]}``
    (``vllm/v1/spec_decode/dynamic/utils.py``: vLLM carries the last range's K above ``max_batch``; buffers are
    sized by ``num_speculative_tokens``, the schedule's largest K).

    Raises:
        ValueError: ``steps`` < 0, ``max_k`` < 1 or ``steps`` > ``max_k``.
    """
    if steps < 0 or max_k < 1 or steps > max_k:
        raise ValueError(f"a pinned schedule needs 0 <= num_steps <= max K >= 1, got num_steps {steps}, max K {max_k}")
    return {"num_speculative_tokens": max_k, "num_speculative_tokens_per_batch_size": [[1, max(max_batch, 1), steps]]}


class BackendStartError(RuntimeError):
    """A server failed to start, died, or never became ready. The sweep fails the point and goes on.

    Attributes:
        log_tail: the last lines of the server's log, or "".
    """

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail
