"""Per-phase numbers of one ``spectune validate`` run, from its request records.

Records are assigned to phases by send time (:func:`phase_index`, :func:`split_by_phase`); output throughput per
phase counts the tokens streamed inside the phase (:func:`tokens_between`); achieved concurrency is the
time-average of requests in flight (:func:`inflight_average`). :func:`summarize_run` puts them together per phase
and over the whole run.

A phase's window also holds the spill-over of the phase before: requests sent earlier and still streaming (after a
drop from concurrency 32 to 1, every request in flight finishes first). A slower engine carries more of it into
the next phase and so streams more tokens there, at the earlier phase's concurrency: the phase's output tok/s
credits it. The *steady* numbers leave the spill-over out: the window starts when the spill-over has ended
(:func:`settle_time`), and the steady output tok/s counts the tokens streamed from then to the
phase's end over that shorter window; ``settle_s`` says how long the spill-over took. In a closed-loop phase the
spill-over has ended once no more than the phase's concurrency of it is left.
"""

from __future__ import annotations

import bisect
from typing import Sequence

from spectune.core.json_types import JsonObject
from spectune.loadgen.record import RequestRecord
from spectune.results.validate_run import RunWindow


def phase_index(offset_s: float, bounds: Sequence[tuple[float, float]]) -> int:
    """0-based phase of a request sent ``offset_s`` s after the run's start: the phase whose [start, end) holds it
    (before the start: the first; past the end: the last)."""
    i = bisect.bisect_right([a for a, _ in bounds], offset_s) - 1
    return min(max(i, 0), len(bounds) - 1)


def tokens_between(records: Sequence[RequestRecord], start: float, end: float) -> int:
    """Output tokens of successful records whose chunk arrived in [start, end) (s, the records' clock)."""
    total = 0
    for r in records:
        if r.ok:
            lo, hi = bisect.bisect_left(r.chunk_times, start), bisect.bisect_left(r.chunk_times, end)
            total += sum(r.chunk_tokens[lo:hi])
    return total


def inflight_average(records: Sequence[RequestRecord], start: float, end: float) -> float | None:
    """Time-average of requests in flight over [start, end), from each record's [send_time, end_time] (requests);
    an open-loop arrival waiting at the client counts from its scheduled arrival. None for an empty window."""
    if not end > start:
        return None
    busy = sum(max(0.0, min(r.end_time, end) - max(r.send_time, start)) for r in records if r.end_time is not None)
    return busy / (end - start)


def settle_time(records: Sequence[RequestRecord], start: float, end: float,
                concurrency: int | None = None) -> float | None:
    """When the spill-over into the window [start, end) has ended (s, the records' clock).

    The spill-over is the records sent before ``start`` and still in flight at ``start``. In a closed-loop phase of
    ``concurrency`` N it has ended once at most N of them are left (a rise from 1 to 32 is steady at once: the
    client fills up to 32); otherwise (open loop, ``concurrency`` None) once all have ended. Returns ``start`` when
    there is none, None when it ends at or after ``end`` (the window never settled). A record without an end time
    ends at its last chunk (one that never streamed was never in flight on the server)."""
    ends = []
    for r in records:
        if r.send_time < start:
            done = r.end_time if r.end_time is not None else (r.chunk_times[-1] if r.chunk_times else None)
            if done is not None and done > start:
                ends.append(done)
    allowed = concurrency or 0
    if len(ends) <= allowed:
        return start
    settle = sorted(ends)[len(ends) - allowed - 1]
    return settle if settle < end else None


def split_by_phase(records: Sequence[RequestRecord], t0: float,
                   bounds: Sequence[tuple[float, float]]) -> list[list[RequestRecord]]:
    """Records grouped by the phase they were sent in (:func:`phase_index` of ``send_time - t0``), in order."""
    groups: list[list[RequestRecord]] = [[] for _ in bounds]
    for r in records:
        groups[phase_index(r.send_time - t0, bounds)].append(r)
    return groups


def summarize_run(records: Sequence[RequestRecord], t0: float, bounds: Sequence[tuple[float, float]],
                  slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
                  concurrencies: Sequence[int | None] | None = None
                  ) -> tuple[list[RunWindow], RunWindow]:
    """Per-phase and overall numbers of one run from its records.

    Args:
        records: measured requests (times in s on the perf_counter clock). t0: s, the measured run's start.
        bounds: (start_s, end_s) per phase, s from ``t0``. slo_ttft_ms, slo_tpot_ms: SLOs in ms, or None.
        concurrencies: each phase's closed-loop concurrency (None for open loop), for :func:`settle_time`.

    Returns:
        (one window per phase, the overall window over [first start, last end)), each with ``phase`` (1-based, or
        ``"all"``), ``start_s``, ``end_s``, ``num_requests`` and ``num_failed`` (requests sent in the window),
        and, over every request (whenever sent), ``achieved_concurrency`` (:func:`inflight_average`),
        ``output_tokens`` and ``output_throughput_tok_s`` (tokens streamed inside the window / its length, s); over
        the requests sent in the window
        ``ttft_p50_ms``, ``ttft_p99_ms``, ``tpot_p50_ms``, ``tpot_p99_ms`` and ``slo_attainment``
        (:func:`spectune.loadgen.compute_metrics` definitions; None without SLOs). Each phase also has
        ``settle_s`` (s from the phase's start until the spill-over of earlier phases ended: :func:`settle_time`;
        None if it never did) and ``steady_output_throughput_tok_s`` (tokens streamed from then to the phase's end
        / that window, s; None if it never settled).
    """
    from spectune.loadgen.metrics import compute_metrics

    def window(recs: Sequence[RequestRecord], a: float, b: float) -> JsonObject:
        m = compute_metrics(recs, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms)
        tokens = tokens_between(records, t0 + a, t0 + b)  # every request streaming in the window counts
        return {"start_s": a, "end_s": b, "num_requests": m["num_requests"], "num_failed": m["num_failed"],
                "achieved_concurrency": inflight_average(records, t0 + a, t0 + b), "output_tokens": tokens,
                "output_throughput_tok_s": tokens / (b - a),
                **{k: m[k] for k in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "slo_attainment")}}

    def steady(a: float, b: float, c: int | None) -> JsonObject:
        settle = settle_time(records, t0 + a, t0 + b, c)
        if settle is None:
            return {"settle_s": None, "steady_output_throughput_tok_s": None}
        return {"settle_s": settle - (t0 + a),
                "steady_output_throughput_tok_s": tokens_between(records, settle, t0 + b) / (t0 + b - settle)}

    cs = list(concurrencies or [None] * len(bounds))
    phases = [RunWindow.from_json({"phase": i + 1, **window(recs, a, b), **steady(a, b, c)})
              for i, (recs, (a, b), c) in enumerate(zip(split_by_phase(records, t0, bounds), bounds, cs))]
    return phases, RunWindow.from_json({"phase": "all", **window(records, bounds[0][0], bounds[-1][1])})
