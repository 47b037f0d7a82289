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
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Sequence, TypedDict

from spectune.backends.eagle_heads import eagle_version
from spectune.core.json_types import JsonObject, JsonValue
from spectune.loadgen.record import RequestRecord


@dataclass(frozen=True)
class Endpoint:
    """A ready OpenAI-compatible server.

    Attributes:
        base_url: scheme://host:port with no trailing slash and no ``/v1`` (``http://127.0.0.1:8000``).
        model: the model name to put in requests, or None to use the first id from ``GET /v1/models``.
    """

    base_url: str
    model: str | None = None


@dataclass(frozen=True)
class BundledEngineOptions:
    """What only the bundled engine (``--backend local``, :mod:`spectune.backends.local`) reads of the command line.

    Attributes:
        device: ``auto`` (cuda when available), ``cpu`` or ``cuda``.
        dtype: the compute path: ``auto``, ``native``, ``bfloat16`` or ``float32`` (docs/engine.md "Compute paths").
        compile: ``auto``, ``on`` or ``off``: torch.compile of the target's decode layers on CPU (docs/engine.md
            "Compiled decode layers").
    """

    device: str = "auto"
    dtype: str = "auto"
    compile: str = "auto"


@dataclass(frozen=True)
class LlamaCppOptions:
    """What only llama.cpp's backend (``--backend llamacpp``, :mod:`spectune.backends.llamacpp`) reads.

    Attributes:
        server_bin: the ``llama-server`` program to run, or None to search for it
            (:func:`spectune.backends.llamacpp.install.find_llama_server`).
    """

    server_bin: str | None = None


@dataclass(frozen=True)
class BackendOptions:
    """Everything the CLI may pass to a backend: the settings every engine's backend reads, and one record per
    engine for the settings only that engine has (:class:`BundledEngineOptions`, :class:`LlamaCppOptions`), so a
    backend's own settings are named by its record. Frozen: a caller that sizes the servers for a plan
    (``max_concurrency``, ``max_tokens``, ``log_dir``) makes a copy with :func:`dataclasses.replace`.

    Attributes:
        endpoints: already-running servers (``openai``, ``sglang``, ``vllm``): num_steps -> base URL; key ``-1``
            means one URL for every num_steps.
        launch: a command template (``launch`` backend) with ``{steps}``, ``{draft_tokens}``, ``{port}``,
            ``{model}``, ``{draft}`` placeholders, split with :func:`shlex.split` and run without a shell.
        model: target model path or name.
        draft: draft head path or name (None: the backend's default, if any).
        algorithm: speculative method name in the engine's spelling (``EAGLE``/``EAGLE3`` for SGLang,
            ``eagle``/``eagle3`` for vLLM), or None to infer it from the head's config.json.
        host: interface launched servers bind to (loopback by default).
        port: port for launched servers; None picks a free one.
        server_args: extra arguments appended to launched servers' command lines.
        startup_timeout_s: s to wait for a launched server to answer its health check.
        log_dir: folder for launched servers' logs (the results folder's ``logs/``), or None.
        max_concurrency: the highest concurrency the sweep will drive (servers are sized for it).
        api_key_env: name of the environment variable holding the API key sent as a Bearer token.
        max_tokens: the longest output the sweep will request (servers are sized for it).
        adaptive_config: path of a per-batch-size num_steps config for the server to run instead of a static
            num_steps (``spectune validate``): an SGLang ``--speculative-adaptive-config`` JSON (``sglang``, ``local``)
            or a vLLM ``num_speculative_tokens_per_batch_size`` schedule (``vllm``, ``local``); with it, the K passed
            to ``start`` is only the initial tier (SGLang, bundled engine) or the maximum (vLLM). ``launch``
            templates get it as ``{adaptive_config}``. None: static num_steps.
        schedule_server_max_k: when set, every ``start(K)`` launches the engine's *schedule server* pinned to K: the
            server a per-batch-size config whose largest K is this value runs, told to use K at every batch size
            (:meth:`Backend.schedule_server`; ``spectune sweep --schedule-server``). None: the static server of K
            (K = 0: no drafter at all).
        local: the bundled engine's own settings.
        llamacpp: llama.cpp's own settings.
    """

    endpoints: dict[int, str] | None = None
    launch: str | None = None
    model: str | None = None
    draft: str | None = None
    algorithm: str | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    server_args: list[str] = field(default_factory=list)
    startup_timeout_s: float = 600.0
    log_dir: Path | None = None
    max_concurrency: int = 1
    api_key_env: str = "OPENAI_API_KEY"
    max_tokens: int = 256
    adaptive_config: str | None = None
    schedule_server_max_k: int | None = None
    local: BundledEngineOptions = field(default_factory=BundledEngineOptions)
    llamacpp: LlamaCppOptions = field(default_factory=LlamaCppOptions)


ENGINE_TIME_KEYS = ("decode_rounds", "decode_seconds", "prefill_seconds")
"""``SpecSnapshot.raw`` keys of an engine's own time counters (see :class:`SpecSnapshot`)."""


@dataclass
class SpecSnapshot:
    """A reading of a server's cumulative speculative-decoding counters at one instant.

    Counter fields follow vLLM's V1 spec-decode metrics (vllm/v1/spec_decode/metrics.py): a *draft* is one verify
    step of one request that carried drafts; ``num_accepted_tokens`` counts accepted draft tokens (the bonus token
    excluded); ``accepted_per_pos[i]`` counts drafts whose first i+1 draft tokens were all accepted.

    Attributes:
        taken_at: s on the client's monotonic clock.
        num_drafts: cumulative drafts (verify steps with drafting), or None if the server has no such counter.
        num_draft_tokens: cumulative draft tokens proposed, or None.
        num_accepted_tokens: cumulative accepted draft tokens, or None.
        accepted_per_pos: cumulative accepted drafts per position, position -> count.
        avg_accept_length: a server-computed average acceptance length including the bonus token (SGLang's
            ``avg_spec_accept_length``), usually over the server's lifetime; None if not offered.
        instance: something that changes when the server restarts (a process start time, a pid), for reset
            detection; None if unknown.
        raw: backend-specific extras. Where an engine counts its own time (the bundled engine), ``raw`` holds
            :data:`ENGINE_TIME_KEYS` too: decode rounds, their wall time in s, the prefill forwards' wall time in s
            (cumulative; :mod:`spectune.measure.engine_time` turns two readings into a window's figures).
    """

    taken_at: float
    num_drafts: float | None = None
    num_draft_tokens: float | None = None
    num_accepted_tokens: float | None = None
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    avg_accept_length: float | None = None
    instance: str | None = None
    raw: dict[str, JsonValue] = field(default_factory=dict)


class CrossCheck(TypedDict):
    """:attr:`Acceptance.cross_check`: the same window's acceptance from a second source."""

    source: str
    acceptance_length: float | None
    acceptance_rate: float | None


@dataclass
class Acceptance:
    """Acceptance over one measurement window.

    Attributes:
        acceptance_length: mean tokens per verify step = 1 + accepted drafts / verify steps (the bonus token
            counted, as SGLang's accept length and vLLM's "mean acceptance length"); 1.0 with no speculation;
            None if unknown.
        acceptance_rate: accepted draft tokens / proposed draft tokens (0..1), or None.
        per_position: acceptance rate per draft position i = accepted_per_pos[i] / drafts, or empty.
        num_drafts: verify steps with drafting inside the window (0 if none), or None.
        source: where the numbers came from, recorded as ``acceptance_length_source`` in summary.csv, e.g.
            ``"spectune:/metrics counters"``, ``"vllm:/metrics counters"``, ``"sglang:per-request"``,
            ``"proxy:tokens-per-chunk"`` (mean output tokens per streamed chunk: an upper-bound proxy), ``"none"``.
        warning: why the number may not be scoped to the window (a lifetime average, a counter reset), or None.
        cross_check: the same window from a second source (``{"source", "acceptance_length", "acceptance_rate"}``,
            e.g. vLLM's /metrics counters beside its per-request metrics), or None.
    """

    acceptance_length: float | None
    acceptance_rate: float | None = None
    per_position: list[float] = field(default_factory=list)
    num_drafts: float | None = None
    source: str = "none"
    warning: str | None = None
    cross_check: CrossCheck | None = None


def join_warnings(*warnings: str | None) -> str | None:
    """The non-empty ``warnings`` joined with ``"; "``, or None when there are none."""
    text = "; ".join(w for w in warnings if w)
    return text or None


def chunk_proxy_acceptance(records: Sequence[RequestRecord], warning: str | None = None) -> Acceptance:
    """Mean output tokens per streamed chunk over successful requests, as an acceptance-length proxy.

    With speculative decoding a server that streams once per verify step sends (accepted drafts + 1) tokens per
    chunk, so tokens per chunk approximates acceptance length; servers that batch chunks differently make it
    wrong, hence the ``proxy:`` source. Returns acceptance_length None when no request produced output.
    """
    chunks = sum(len(r.chunk_tokens) for r in records if r.ok)
    tokens = sum(sum(r.chunk_tokens) for r in records if r.ok)
    return Acceptance(
        acceptance_length=(tokens / chunks) if chunks else None,
        source="proxy:tokens-per-chunk",
        warning=warning,
    )


def zero_steps_acceptance(records: Sequence[RequestRecord]) -> Acceptance:
    """Acceptance at num_steps 0 without spec-decode counters: 1.0 by construction (no drafts, one token per
    target step), source ``config:num_steps=0``.

    The tokens-per-chunk proxy is not used even when it differs: a server that streams several tokens per chunk
    without speculating (stream intervals, detokenizer batching) would show, say, 2.91 at num_steps 0, which is
    not acceptance. Then the Acceptance carries a warning naming the tokens per chunk, since the same server's
    proxy at K > 0 overstates acceptance by about that factor.
    """
    proxy = chunk_proxy_acceptance(records)
    warning = None
    if proxy.acceptance_length is not None and proxy.acceptance_length > 1.05:
        warning = (f"at num_steps 0 this server streamed {proxy.acceptance_length:.2f} tokens per chunk without "
                   "speculating: acceptance is 1.0; a tokens-per-chunk proxy at K > 0 overstates acceptance on it")
    return Acceptance(1.0, None, [], 0.0, "config:num_steps=0", warning)


def counters_reset(before: SpecSnapshot, after: SpecSnapshot) -> bool:
    """True when the server restarted between the snapshots: its ``instance`` changed or a counter went down."""
    if before.instance is not None and after.instance is not None and before.instance != after.instance:
        return True
    pairs = [(before.num_drafts, after.num_drafts), (before.num_draft_tokens, after.num_draft_tokens),
             (before.num_accepted_tokens, after.num_accepted_tokens)]
    pairs += [(v, after.accepted_per_pos.get(k, 0.0)) for k, v in before.accepted_per_pos.items()]
    return any(b is not None and a is not None and a < b for b, a in pairs)


def counter_acceptance(before: SpecSnapshot, after: SpecSnapshot, source: str) -> Acceptance:
    """Acceptance from cumulative counter deltas over a window (vLLM's formulas, background §3).

    acceptance_length = 1 + d(accepted) / d(drafts); acceptance_rate = d(accepted) / d(draft_tokens);
    per_position[i] = d(accepted_per_pos[i]) / d(drafts). With no drafts in the window (num_steps 0) the
    acceptance length is 1.0 and the rate None.

    A server that restarted inside the window (:func:`counters_reset`: its ``instance`` changed or any counter,
    per-position ones included, went down) counts from zero again, so the after-values alone cover the part of
    the window since the restart; the Acceptance then carries a warning.

    Raises:
        ValueError: if either snapshot lacks ``num_drafts`` or ``num_accepted_tokens``.
    """
    if before.num_drafts is None or after.num_drafts is None:
        raise ValueError("counter_acceptance needs num_drafts in both snapshots")
    if before.num_accepted_tokens is None or after.num_accepted_tokens is None:
        raise ValueError("counter_acceptance needs num_accepted_tokens in both snapshots")
    warning = None
    if counters_reset(before, after):
        warning = "counter reset detected (server restarted): acceptance covers only the part of the window after it"
        before = SpecSnapshot(taken_at=before.taken_at, num_drafts=0.0, num_accepted_tokens=0.0,
                              num_draft_tokens=None if after.num_draft_tokens is None else 0.0)
    d_drafts = after.num_drafts - before.num_drafts
    d_acc = after.num_accepted_tokens - before.num_accepted_tokens
    if d_drafts <= 0:
        return Acceptance(1.0, None, [], 0.0, source, warning)
    rate = None
    if before.num_draft_tokens is not None and after.num_draft_tokens is not None:
        d_tok = after.num_draft_tokens - before.num_draft_tokens
        rate = d_acc / d_tok if d_tok > 0 else None
    per_pos = [max(after.accepted_per_pos[pos] - before.accepted_per_pos.get(pos, 0.0), 0.0) / d_drafts
               for pos in sorted(after.accepted_per_pos)]
    return Acceptance(1.0 + d_acc / d_drafts, rate, per_pos, d_drafts, source, warning)


def has_counters(before: SpecSnapshot | None, after: SpecSnapshot | None) -> bool:
    """Both snapshots exist and carry the draft counter (``num_drafts``), so :func:`counter_acceptance` applies."""
    return before is not None and after is not None and before.num_drafts is not None and after.num_drafts is not None


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
