"""The numbers of a sweep point that the sweep itself reads back, as a typed record: :class:`PointNumbers`.

A point's ``metrics`` (points.jsonl, docs/results-format.md) holds every summary.csv column as written; the sweep's
display, drift reference, early-stop rule, guided model and calibration read a handful of them.
:meth:`PointNumbers.from_metrics` reads those once, a value that is not a number (a missing column in an older
file, a null for a point that measured nothing) becoming None, so callers test ``is None`` instead of the type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

__all__ = ["PointNumbers"]


def _number(value: object) -> float | None:
    """``value`` when it is an int or float (bools are flags, not numbers), else None (kept as written: an int
    stays an int, so it prints as it did)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class PointNumbers:
    """The sweep's own reading of a point's ``metrics`` (module docstring; the column names are the attributes).

    Attributes:
        output_throughput_tok_s: output tokens/s over the window. tpot_p50_ms: median time per output token, ms.
        acceptance_length: tokens per verify step (accepted drafts + 1 bonus token).
        num_requests, num_failed: requests in the window (failed included) and failed ones.
        total_output_tokens: output tokens over the window. duration_s: the window's length, s.
        achieved_concurrency: the time-averaged requests in flight (:func:`spectune.loadgen.metrics.compute_metrics`).
        output_throughput_ci_low, output_throughput_ci_high: the 95% interval of the throughput, tokens/s
            (:mod:`spectune.results.confidence`).
        client_limited: the load generator itself limited the window (:func:`spectune.loadgen.metrics.client_limit`).
    """

    output_throughput_tok_s: float | None = None
    tpot_p50_ms: float | None = None
    acceptance_length: float | None = None
    num_requests: float | None = None
    num_failed: float | None = None
    total_output_tokens: float | None = None
    duration_s: float | None = None
    achieved_concurrency: float | None = None
    output_throughput_ci_low: float | None = None
    output_throughput_ci_high: float | None = None
    client_limited: bool = False

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, object]) -> PointNumbers:
        """The record of a point's ``metrics`` (absent or non-numeric columns: None; ``client_limited``: its
        truth)."""
        out = {name: _number(metrics[name]) for name in _NUMERIC if name in metrics}
        return cls(**out, client_limited=bool(metrics.get("client_limited")))  # type: ignore[arg-type]


_NUMERIC = tuple(name for name in PointNumbers.__dataclass_fields__ if name != "client_limited")
