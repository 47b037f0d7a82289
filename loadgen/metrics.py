"""Per-point metrics from request records: the latency/throughput/SLO columns of ``docs/results-format.md``.

Definitions (per request in :mod:`spectune.loadgen.record`) follow vLLM's ``benchmarks/serve.py``, with ITL corrected
for
multi-token chunks: the per-token ITL spreads each chunk gap over the chunk's tokens; the per-chunk gap is what
vLLM calls ITL. Latency metrics are over successful requests (no error, at least one output chunk); throughputs
divide by the measurement window (first measured send to last measured end). Percentiles use
``numpy.percentile``'s default linear interpolation, as vLLM does.

SLO attainment = share of measured requests (failed ones included, as misses) with TTFT <= ``slo_ttft_ms`` and
TPOT <= ``slo_tpot_ms`` (each only if given; a request with a single output token has no TPOT and meets the TPOT
SLO, as in vLLM's goodput). Goodput = SLO-meeting requests / window duration (vLLM's ``--goodput``, in req/s).
The acceptance columns are not computed here: the sweep fills them from the backend.

The client's own load: ``dispatch_delay_*`` over the records' ``dispatch_delay_s`` (failed requests included: the
delay is the client's, whatever the server did), ``client_cpu_share`` copied from the sending loop, and
``client_limited`` (:func:`client_limit`): True when the client's event loop used at least
:data:`CPU_SHARE_LIMIT` of a core, or its p90 dispatch delay exceeded both :data:`DISPATCH_FLOOR_MS` and
:data:`DISPATCH_SHARE` of the median end-to-end latency (requests waited for the client long enough to change the
load the server saw). Such a point measures the load generator as much as the server.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from spectune.core.json_types import JsonObject
from spectune.loadgen.record import RequestRecord

__all__ = ["METRIC_COLUMNS", "SLO_CLIENT_COLUMNS", "STREAM_COLUMNS", "compute_metrics", "per_category", "slo_met"]

_LAT = ("mean", "p50", "p90", "p99")
STREAM_COLUMNS: tuple[str, ...] = (
    "num_requests", "num_failed", "duration_s", "achieved_concurrency", "request_throughput_req_s",
    "output_throughput_tok_s", "total_output_tokens",
    *(f"ttft_{s}_ms" for s in _LAT), *(f"tpot_{s}_ms" for s in _LAT), *(f"itl_{s}_ms" for s in _LAT),
    "chunk_itl_p50_ms", "chunk_itl_p99_ms", *(f"e2el_{s}_ms" for s in _LAT), "mean_tokens_per_chunk",
)
"""Keys of :func:`compute_metrics`'s result measured from the streams: counts, throughput, latency percentiles."""
SLO_CLIENT_COLUMNS: tuple[str, ...] = (
    "slo_attainment", "goodput_req_s", "token_count_source",
    "dispatch_delay_p50_ms", "dispatch_delay_p90_ms", "dispatch_delay_max_ms", "client_cpu_share", "client_limited",
)
"""Keys of :func:`compute_metrics`'s result about SLOs, token counting and the load generator's own load."""
METRIC_COLUMNS: tuple[str, ...] = (*STREAM_COLUMNS, *SLO_CLIENT_COLUMNS)
"""Every key of :func:`compute_metrics`'s result; summary.csv's order is :mod:`spectune.results.schema`'s."""

_SOURCE_RANK = {"usage": 0, "tokenizer": 1, "chunks": 2}
CPU_SHARE_LIMIT = 0.9
"""client_cpu_share at or above which a point is client-limited (the event loop runs on one core)."""
DISPATCH_FLOOR_MS = 5.0
"""ms; a p90 dispatch delay below this never marks a point client-limited."""
DISPATCH_SHARE = 0.05
"""A p90 dispatch delay above this share of the median end-to-end latency marks a point client-limited."""


def compute_metrics(
    records: Sequence[RequestRecord],
    window_start: float | None = None,
    window_end: float | None = None,
    achieved_concurrency: float | None = None,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    client_cpu_share: float | None = None,
) -> JsonObject:
    """Metrics of one point, keyed by :data:`METRIC_COLUMNS`; a value is None when it cannot be computed.

    Args:
        records: the measured requests of the point (warm-up excluded), failed ones included.
        window_start, window_end: s, the measurement window; None takes first send / last end of ``records``.
        achieved_concurrency: requests in flight, time-averaged (from the sending loop), copied through.
        slo_ttft_ms, slo_tpot_ms: SLO limits in ms, or None.
        client_cpu_share: the sending loop's ``client_cpu_share`` (0..1), copied through, or None.
    """
    ok = [r for r in records if r.ok]
    if window_start is None:
        window_start = min((r.send_time for r in records), default=None)
    if window_end is None:
        window_end = max((r.end_time for r in records if r.end_time is not None), default=None)
    duration = None if window_start is None or window_end is None else window_end - window_start
    rate = (lambda n: n / duration) if duration else (lambda n: None)
    out_tokens = sum(r.completion_tokens or 0 for r in ok)
    chunks = sum(len(r.chunk_times) for r in ok)
    m: JsonObject = {
        "num_requests": len(records),
        "num_failed": sum(r.error is not None for r in records),
        "duration_s": duration,
        "achieved_concurrency": achieved_concurrency,
        "request_throughput_req_s": rate(len(ok)),
        "output_throughput_tok_s": rate(out_tokens),
        "total_output_tokens": out_tokens,
    }
    m.update(_stats("ttft", [r.ttft_s for r in ok]))
    m.update(_stats("tpot", [r.tpot_s for r in ok if r.tpot_s is not None]))
    m.update(_stats("itl", _per_token_itl(ok)))
    chunk_gaps = np.concatenate([np.diff(r.chunk_times) for r in ok]) if ok else np.empty(0)
    p50, p99 = _percentiles(chunk_gaps, (50, 99))
    m["chunk_itl_p50_ms"], m["chunk_itl_p99_ms"] = p50, p99
    m.update(_stats("e2el", [r.e2e_s for r in ok if r.e2e_s is not None]))
    m["mean_tokens_per_chunk"] = out_tokens / chunks if chunks else None
    good = slo_met(records, slo_ttft_ms, slo_tpot_ms)
    m["slo_attainment"] = None if good is None or not records else good / len(records)
    m["goodput_req_s"] = None if good is None else rate(good)
    sources = {r.token_count_source for r in ok}
    m["token_count_source"] = max(sources, key=lambda s: _SOURCE_RANK.get(s, 3)) if sources else None
    delays = np.asarray([r.dispatch_delay_s for r in records if r.dispatch_delay_s is not None], dtype=float)
    m["dispatch_delay_p50_ms"], m["dispatch_delay_p90_ms"] = _percentiles(delays, (50, 90))
    m["dispatch_delay_max_ms"] = float(delays.max()) * 1000.0 if delays.size else None
    m["client_cpu_share"] = client_cpu_share
    m["client_limited"] = client_limit(m) is not None
    return m


def client_limit(m: JsonObject) -> str | None:
    """Why the load generator limited a point (one line naming the figures), or None.

    ``m``: a :func:`compute_metrics` result (``client_cpu_share``, ``dispatch_delay_p90_ms``, ``e2el_p50_ms``).
    """
    cpu, p90, e2e = m.get("client_cpu_share"), m.get("dispatch_delay_p90_ms"), m.get("e2el_p50_ms")
    why = []
    if cpu is not None and cpu >= CPU_SHARE_LIMIT:
        why.append(f"its event loop used {cpu:.0%} of a core")
    if p90 is not None and p90 > DISPATCH_FLOOR_MS and (e2e is None or p90 > DISPATCH_SHARE * e2e):
        why.append(f"requests waited {p90:.1f} ms (p90) to be sent" + (f", {p90 / e2e:.0%} of the median "
                                                                        "end-to-end latency" if e2e else ""))
    return "the load generator limited this point: " + " and ".join(why) if why else None


def slo_met(records: Iterable[RequestRecord], slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> int | None:
    """Number of requests meeting every given SLO (failed requests never do), or None when no SLO is given."""
    if slo_ttft_ms is None and slo_tpot_ms is None:
        return None
    good = 0
    for r in records:
        if not r.ok:
            continue
        ttft, tpot = r.ttft_s, r.tpot_s
        if slo_ttft_ms is not None and ttft * 1000.0 > slo_ttft_ms:  # type: ignore[operator]
            continue
        if slo_tpot_ms is not None and tpot is not None and tpot * 1000.0 > slo_tpot_ms:
            continue
        good += 1
    return good


def per_category(records: Sequence[RequestRecord], duration_s: float | None) -> dict[str, JsonObject]:
    """Per dataset category: ``num_requests`` (failed included), ``tpot_p50_ms`` and ``output_throughput_tok_s``.

    Throughput divides the category's output tokens (successful requests) by the whole point's window
    ``duration_s``, so the categories' throughputs add up to the point's. Records without category go under
    ``"none"``.
    """
    groups: dict[str, list[RequestRecord]] = {}
    for r in records:
        groups.setdefault(r.category or "none", []).append(r)
    out = {}
    for cat, recs in sorted(groups.items()):
        ok = [r for r in recs if r.ok]
        tpots = [r.tpot_s for r in ok if r.tpot_s is not None]
        tokens = sum(r.completion_tokens or 0 for r in ok)
        out[cat] = {
            "num_requests": len(recs),
            "tpot_p50_ms": _percentiles(np.asarray(tpots, dtype=float), (50,))[0],
            "output_throughput_tok_s": tokens / duration_s if duration_s else None,
        }
    return out


def _per_token_itl(ok: Sequence[RequestRecord]) -> np.ndarray:
    """Per-token ITL samples, s: chunk i > 0 with gap g and n_i tokens gives n_i samples g / n_i (record.py)."""
    parts = []
    for r in ok:
        if len(r.chunk_times) < 2:
            continue
        gaps = np.diff(r.chunk_times)
        n = np.asarray(r.chunk_tokens[1:], dtype=np.int64)
        keep = n > 0
        parts.append(np.repeat(gaps[keep] / n[keep], n[keep]))
    return np.concatenate(parts) if parts else np.empty(0)


def _stats(name: str, values_s: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    """mean/p50/p90/p99 of latencies given in s, returned in ms under ``{name}_{stat}_ms``."""
    arr = np.asarray(values_s, dtype=float)
    mean = float(arr.mean()) * 1000.0 if arr.size else None
    p50, p90, p99 = _percentiles(arr, (50, 90, 99))
    return {f"{name}_mean_ms": mean, f"{name}_p50_ms": p50, f"{name}_p90_ms": p90, f"{name}_p99_ms": p99}


def _percentiles(arr_s: np.ndarray, qs: tuple[int, ...]) -> list[float | None]:
    """Percentiles (linear interpolation) of values in s, returned in ms; Nones for an empty array."""
    if arr_s.size == 0:
        return [None] * len(qs)
    return [float(v) * 1000.0 for v in np.percentile(arr_s, qs)]
