"""Acceptance of a measured window from the backend, and per prompt category.

:func:`window_acceptance` asks the backend (``Backend.acceptance``) and turns its exceptions into a recorded warning
(an odd metrics page must not lose a point); :func:`per_category_points` splits acceptance by prompt category where
per-request data allows it.
"""

from __future__ import annotations

from typing import Callable, Sequence

from spectune.backends.base import Backend
from spectune.backends.snapshots import Acceptance, SpecSnapshot
from spectune.core.json_types import JsonObject
from spectune.loadgen.record import RequestRecord


def window_acceptance(backend: Backend, before: SpecSnapshot | None, after: SpecSnapshot | None,
                      records: Sequence[RequestRecord]) -> Acceptance:
    """``backend.acceptance(before, after, records)``; an exception becomes ``Acceptance(None, source="none")``
    with a warning naming it."""
    try:
        return backend.acceptance(before, after, records)
    except Exception as err:  # noqa: BLE001 - a metrics page problem must not lose the point
        return Acceptance(None, source="none", warning=f"acceptance failed: {type(err).__name__}: {err}")


def spec_decode_acceptance(records: Sequence[RequestRecord]) -> float | None:
    """Acceptance length from per-request ``server_stats["spec_decode"]`` counters (the bundled engine's).

    acceptance_length = 1 + sum(accepted_tokens) / sum(verify_steps) over the successful records (bonus token
    counted; 1.0 when no verify step ran). None unless every successful record carries both fields.
    """
    verify = accepted = 0.0
    ok = [r for r in records if r.ok]
    for r in ok:
        spec = (r.server_stats or {}).get("spec_decode")
        if not isinstance(spec, dict) or spec.get("verify_steps") is None or spec.get("accepted_tokens") is None:
            return None
        verify += float(spec["verify_steps"])
        accepted += float(spec["accepted_tokens"])
    if not ok:
        return None
    return 1.0 + accepted / verify if verify > 0 else 1.0


def per_category_points(records: Sequence[RequestRecord], duration_s: float | None, steps: int,
                        ask: Callable[[list[RequestRecord]], Acceptance]) -> dict[str, JsonObject]:
    """points.jsonl ``per_category``: :func:`spectune.loadgen.metrics.per_category` plus ``acceptance_length`` and its
    source.

    Per category, acceptance comes from (1) 1.0 at num_steps 0; (2) per-request ``spec_decode`` counters
    (:func:`spec_decode_acceptance`); (3) ``ask(records)``, the backend's acceptance over those records without
    counter snapshots, kept only when its source is per-request (not ``proxy:``/``none``). Else None: window
    counters cannot be split by category.
    """
    from spectune.loadgen.metrics import per_category

    out = per_category(records, duration_s)
    groups: dict[str, list[RequestRecord]] = {}
    for r in records:
        groups.setdefault(r.category or "none", []).append(r)
    for cat, entry in out.items():
        recs = groups.get(cat, [])
        value, source = None, "none"
        if steps == 0:
            value, source = 1.0, "config:num_steps=0"
        elif (v := spec_decode_acceptance(recs)) is not None:
            value, source = v, "spec_decode:per-request"
        else:
            acc = ask(recs)
            if acc.acceptance_length is not None and not acc.source.startswith(("proxy:", "none")):
                value, source = acc.acceptance_length, acc.source
        entry["acceptance_length"], entry["acceptance_length_source"] = value, source
    return out
