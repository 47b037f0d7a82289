"""Is the server following a per-batch-size schedule? Drafted tokens per verify step over a window, from the
spec-decode counters, against the schedule's K at the window's batch size.

vLLM's counters (``vllm/v1/spec_decode/metrics.py``; :class:`~spectune.backends.snapshots.SpecSnapshot`) count a
*draft* per request per verify step that carried drafts and the draft tokens it carried, so over a window
d(num_draft_tokens) / d(num_drafts) is the mean K of the steps that drafted. Under a
``num_speculative_tokens_per_batch_size`` schedule it must not exceed the largest K the schedule gives the window's
batch sizes (its measured batch size rounded down and up) by more than :data:`TOLERANCE`. Where that largest K is
0 the schedule says not to draft at all; steps that drafted anyway are counted against all verify steps, estimated
as output tokens - accepted drafts (each verify step emits one token of the target's own), and more than
:data:`MAX_DRAFTING_SHARE` of them drafting means the schedule was not followed (a window's first requests may
still draft at a smaller batch size). A server that fails either ignores the schedule: vLLM issue #57053 (and
#51510) reports that Model Runner V2 (``VLLM_USE_V2_MODEL_RUNNER=1``; the default where it is supported) does not
apply the scheduled K for EAGLE-style drafters, which then draft the static ``num_speculative_tokens`` at every
batch size, silently.

``spectune sweep`` checks every point the same way against the static num_steps K its server was given
(:func:`check_num_steps`: K at every batch size): a server drafting more than K tokens per step, or drafting at all
in most steps at K = 0, is not running the num_steps the point is labelled with (an engine that ignores the K it is
given, a running server of another K behind ``--endpoint K=URL``, a launch template without ``{steps}``). Drafting
*fewer* than K is not flagged: an engine may cut a draft short (a llama-server started with ``--spec-draft-p-min``
above 0 stops drafting once the draft's top probability falls below it, ``common/speculative.cpp``).

The engine-specific remedy comes from the backend (:meth:`spectune.backends.base.Backend.schedule_setting`).
"""

from __future__ import annotations

import math

from spectune.backends.num_steps.sglang_config import VllmRange, VllmSchedule
from spectune.backends.snapshots import SpecSnapshot, counters_reset
from spectune.results.point import ScheduleCheck

TOLERANCE = 0.25
"""Drafted tokens per drafting step may exceed the schedule's largest K by this much (tokens) before it counts."""
MAX_DRAFTING_SHARE = 0.5
"""Where the schedule says K = 0, the largest share of verify steps that may still draft."""


def _deltas(before: SpecSnapshot | None, after: SpecSnapshot | None) -> tuple[float, float, float] | None:
    """(d drafts, d draft tokens, d accepted tokens) over the window, or None without the counters or across a
    restart."""
    if before is None or after is None or counters_reset(before, after):
        return None
    pairs = [(before.num_drafts, after.num_drafts), (before.num_draft_tokens, after.num_draft_tokens),
             (before.num_accepted_tokens, after.num_accepted_tokens)]
    if any(b is None or a is None for b, a in pairs):
        return None
    return tuple(a - b for b, a in pairs)  # type: ignore[return-value,operator]


def check_schedule(schedule: VllmSchedule, before: SpecSnapshot | None, after: SpecSnapshot | None,
                   batch_size: float | None, output_tokens: float | None = None) -> ScheduleCheck | None:
    """The window's :class:`ScheduleCheck`, or None when the counters or the batch size are missing.

    Args:
        schedule: the per-batch-size schedule the server was given.
        before, after: the counter snapshots at the window's start and end.
        batch_size: the window's batch size (requests; measured running batch, or achieved concurrency).
        output_tokens: tokens the server emitted in the window (for the drafting share), or None.
    """
    d = _deltas(before, after)
    if d is None or batch_size is None or not math.isfinite(batch_size) or batch_size <= 0:
        return None
    drafts, tokens, accepted = d
    per_step = tokens / drafts if drafts > 0 else 0.0
    steps = (output_tokens - accepted) if output_tokens is not None else None
    share = min(1.0, drafts / steps) if steps is not None and steps > 0 else None
    ks = [schedule.k_for_batch_size(b) for b in range(max(1, math.floor(batch_size)), math.ceil(batch_size) + 1)]
    k_low, k_high = min(ks), max(ks)
    if k_high > 0:
        followed = per_step <= k_high + TOLERANCE
    else:
        followed = drafts == 0 or (share is not None and share <= MAX_DRAFTING_SHARE)
    return ScheduleCheck(batch_size, per_step, share, k_low, k_high, followed)


def check_num_steps(steps: int, before: SpecSnapshot | None, after: SpecSnapshot | None, batch_size: float | None,
                    output_tokens: float | None = None) -> ScheduleCheck | None:
    """A sweep point's :class:`ScheduleCheck`: :func:`check_schedule` against the static num_steps ``steps`` (the same
    K at every batch size), or None when the counters or the batch size are missing.

    Args:
        steps: the num_steps K (draft tokens per verify step) the point's server was given.
        before, after: the counter snapshots at the window's start and end.
        batch_size: the window's batch size (requests); only its presence matters for a static K.
        output_tokens: tokens the server emitted in the window (for the drafting share at K = 0), or None.

    Raises:
        ValueError: ``steps`` < 0.
    """
    if steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {steps}")
    static = VllmSchedule((VllmRange(1, 1 << 30, steps),), max_k=steps)
    return check_schedule(static, before, after, batch_size, output_tokens)
