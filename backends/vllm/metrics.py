"""vLLM's per-request spec-decode metrics: the ``metrics.speculative_decoding`` object each response carries when
the server runs with ``--per-request-spec-decode-metrics summary`` (vLLM >= 0.29,
``docs/features/speculative_decoding/acceptance_metrics.md``), and the window's acceptance summed from them."""

from __future__ import annotations

from typing import Sequence

from spectune.backends.snapshots import Acceptance
from spectune.core.json_types import JsonObject, JsonValue
from spectune.loadgen.record import RequestRecord


def spec_decoding_metrics(server_stats: JsonObject | None) -> JsonObject | None:
    """vLLM's per-request ``metrics.speculative_decoding`` object from a record's ``server_stats`` (the response's
    top-level ``metrics``), or None when absent (flag off, K = 0, or ``n`` > 1)."""
    metrics = server_stats.get("metrics") if isinstance(server_stats, dict) else None
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    return spec if isinstance(spec, dict) and spec.get("num_spec_steps") is not None else None


def _histogram(h: JsonValue) -> list[float]:
    """A dense acceptance histogram (entry j = spec steps that accepted exactly j drafts) from vLLM's list or sparse
    ``{"j": count}`` form."""
    if isinstance(h, dict):
        dense = [0.0] * (max((int(k) for k in h), default=-1) + 1)
        for k, v in h.items():
            dense[int(k)] += float(v)
        return dense
    return [float(v) for v in h] if isinstance(h, list) else []


def per_request_acceptance(records: Sequence[RequestRecord]) -> Acceptance | None:
    """Acceptance from vLLM's per-request ``metrics.speculative_decoding`` summed over successful records; None when
    none carries it.

    acceptance_length = 1 + sum(num_accepted_draft_tokens) / sum(num_spec_steps) (bonus token counted);
    acceptance_rate = sum(num_accepted_draft_tokens) / sum(num_draft_tokens); per_position[i] = share of spec steps
    that accepted more than i drafts, from the summed ``acceptance_histogram``. Source: vLLM
    ``docs/features/speculative_decoding/acceptance_metrics.md``.
    """
    ok = [r for r in records if r.ok]
    found = [d for r in ok if (d := spec_decoding_metrics(r.server_stats)) is not None]
    if not found:
        return None
    warning = None if len(found) == len(ok) else f"{len(ok) - len(found)} of {len(ok)} requests had no spec metrics"
    steps = sum(float(d["num_spec_steps"]) for d in found)
    accepted = sum(float(d.get("num_accepted_draft_tokens") or 0) for d in found)
    drafted = sum(float(d.get("num_draft_tokens") or 0) for d in found)
    hist: list[float] = []
    for d in found:
        h = _histogram(d.get("acceptance_histogram"))
        hist += [0.0] * (len(h) - len(hist))
        for j, n in enumerate(h):
            hist[j] += n
    source = "vllm:per-request"
    if steps <= 0:
        return Acceptance(1.0, None, [], 0.0, source, warning)
    per_pos = [sum(hist[i + 1:]) / sum(hist) for i in range(len(hist) - 1)] if sum(hist) > 0 else []
    return Acceptance(1.0 + accepted / steps, accepted / drafted if drafted > 0 else None, per_pos, steps, source,
                      warning)
