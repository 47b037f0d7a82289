"""What a backend reads from a server: a reading of its cumulative spec-decode counters (:class:`SpecSnapshot`), the
window's acceptance computed from two readings or from the streamed chunks (:class:`Acceptance`, with the counters'
cross-check :class:`CrossCheck`), and the helpers every backend's :meth:`~spectune.backends.base.Backend.acceptance`
shares (:func:`counter_acceptance`, :func:`chunk_proxy_acceptance`, :func:`zero_steps_acceptance`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence, TypedDict

from spectune.core.json_types import JsonValue
from spectune.loadgen.record import RequestRecord


ENGINE_TIME_KEYS = ("decode_rounds", "decode_seconds", "prefill_seconds")
"""``SpecSnapshot.raw`` keys of an engine's own time counters (see :class:`SpecSnapshot`)."""

ENGINE_ROWS_KEY = "decode_rows"
"""``SpecSnapshot.raw`` key of an engine's count of decode-round rows (each round's running batch, summed; the bundled
engine's ``spectune:engine_decode_rows_total``), absent where the engine does not count them."""


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
            (cumulative; :mod:`spectune.measure.engine_time` turns two readings into a window's figures), and
            :data:`ENGINE_ROWS_KEY`, the rows of those rounds summed, where the engine counts them.
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
