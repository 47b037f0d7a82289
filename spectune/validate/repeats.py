"""Runs over repeats: one entry per run name from its repeats (:func:`combine_repeats`), and paired bootstrap
intervals of one run's output throughput over another's, over the whole run (:func:`throughput_ratio`) or any
window (:func:`paired_ratio`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from spectune.results.confidence import RunRequests


def throughput_ratio(runs: Sequence[dict[str, Any]], requests: Sequence[dict[str, Any]], a: str, b: str,
                     confidence: float = 0.95) -> tuple[float, float] | None:
    """The paired percentile-bootstrap interval of overall output throughput run ``a`` / run ``b`` (run names such
    as ``config`` and ``static:2``; ``runs``: validate.json ``runs`` entries, one per repeat; ``requests``: the
    requests.jsonl objects with ``run`` and ``repeat``): requests resampled by prompt with the same draws for both
    runs, tokens over the fixed window (:class:`spectune.results.confidence.Bootstrap`, objective ``tokens``), then
    the median over resampled repeats. Returns (low, high) of the ratio itself; None when either run has no
    requests."""
    from spectune.results.confidence import RunRequests

    return paired_ratio(runs, requests, a, b, lambda r: (r.get("overall") or {}).get("output_throughput_tok_s"),
                        lambda r, qs: RunRequests.from_records(qs) if qs else None, confidence)


def paired_ratio(runs: Sequence[dict[str, Any]], requests: Sequence[dict[str, Any]], a: str, b: str,
                 value: Callable[[dict[str, Any]], float | None],
                 select: Callable[[dict[str, Any], list[dict[str, Any]]], RunRequests | None],
                 confidence: float = 0.95, objective: str = "tokens") -> tuple[float, float] | None:
    """:func:`throughput_ratio` for any window: ``value(run entry)`` is a repeat's tokens/s in the window and
    ``select(run entry, its requests)`` the requests that made it, as the bootstrap resamples them (e.g. only the
    tokens and time each request spent inside one phase). ``objective``: how a resample moves the value
    (:meth:`spectune.results.confidence.Bootstrap.run_replicates`): ``tokens`` (tokens streamed over a fixed
    window: open loop) or ``throughput`` (tokens over the requests' times: a closed loop, where a request with fewer
    tokens also took less time). Returns (low, high) of the ratio a / b, or None when either run has no such
    requests or values."""
    import numpy as np

    from spectune.results.confidence import Bootstrap, percentile_interval

    boot = Bootstrap(r.get("prompt_id") for r in requests)
    reps = []
    for i, name in enumerate((a, b)):
        mine = [r for r in runs if r.get("run") == name and r.get("status") == "ok"]
        values = [value(r) for r in mine]
        cells = [select(r, [q for q in requests if q.get("run") == name and q.get("repeat") == r.get("repeat")])
                 for r in mine]
        if not mine or any(v is None for v in values) or not any(c is not None and len(c) for c in cells):
            return None
        reps.append(boot.cell_replicates(cells, values, objective, seed_offset=i))
    if reps[0] is None or reps[1] is None:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        iv = percentile_interval(reps[0] / reps[1], 1.0, confidence)
    return (iv.low, iv.high) if iv.known else None


_SUMMED = ("num_requests", "num_failed", "output_tokens")


def _mean_window(windows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One window's numbers over repeats: request and token counts summed, other numbers averaged (over the
    repeats that have them), anything else (labels, bounds, sources) from the first."""
    out = dict(windows[0])
    for key, first in windows[0].items():
        values = [w.get(key) for w in windows]
        nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if key in ("phase", "start_s", "end_s") or not nums or not isinstance(first, (int, float, type(None))):
            continue
        out[key] = sum(nums) if key in _SUMMED else sum(nums) / len(nums)
    return out


def combine_repeats(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per run name (``static:K``, ``config``) in first-seen order: the mean of its repeats.

    Overall and per phase: output throughput (tok/s), TPOT/TTFT percentiles (ms), SLO attainment, acceptance
    length, switches and achieved concurrency are means over the repeats; request and token counts are sums. The
    entry gains ``repeats`` and ``throughput_by_repeat`` (overall output tok/s of each repeat, in order). A run
    with a failed repeat is failed (its error names the repeat). A run measured once is returned unchanged.
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault(r.get("run", ""), []).append(r)
    out: list[dict[str, Any]] = []
    for rs in groups.values():
        if len(rs) == 1:
            out.append(rs[0])
            continue
        base = {k: v for k, v in rs[0].items() if k not in ("phases", "overall", "repeat", "started", "finished")}
        base.update(repeats=len(rs), throughput_by_repeat=[(r.get("overall") or {}).get("output_throughput_tok_s")
                                                           for r in rs])
        bad = next((r for r in rs if r.get("status") != "ok"), None)
        if bad is not None:
            out.append({**base, "status": bad.get("status", "failed"), "phases": [], "overall": {},
                        "error": f"repeat {bad.get('repeat')}: {bad.get('error')}"})
            continue
        phases = [_mean_window(list(ps)) for ps in zip(*(r["phases"] for r in rs))]
        out.append({**base, "status": "ok", "overall": _mean_window([r["overall"] for r in rs]), "phases": phases})
    return out
