"""Reading spec-decode counters from a Prometheus text exposition (``GET /metrics``).

Parsing is prometheus-client's (:func:`prometheus_client.parser.text_string_to_metric_families`). vLLM's V1
counters (``vllm/v1/spec_decode/metrics.py``, registered through ``vllm/v1/metrics/loggers.py`` with labels
``model_name`` and ``engine``, one label set per engine) are cumulative:

- ``{prefix}spec_decode_num_drafts_total``: verify steps that carried drafts,
- ``{prefix}spec_decode_num_draft_tokens_total``: draft tokens proposed,
- ``{prefix}spec_decode_num_accepted_tokens_total``: draft tokens accepted (bonus token excluded),
- ``{prefix}spec_decode_num_accepted_tokens_per_pos_total{position="i"}``: drafts whose first i+1 tokens were
  accepted.

The prefix is ``vllm:`` for vLLM and ``spectune:`` for the bundled engine. Scrapes also carry ``_created``
samples (the counter's creation time), which are never summed. Acceptance over a window of two snapshots is
:func:`spectune.backends.snapshots.counter_acceptance`.
"""

from __future__ import annotations

import time
from typing import Iterable

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from spectune.backends.snapshots import SpecSnapshot
from spectune.backends.http import get

DRAFTS = "spec_decode_num_drafts"
DRAFT_TOKENS = "spec_decode_num_draft_tokens"
ACCEPTED = "spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "spec_decode_num_accepted_tokens_per_pos"


def parse_metrics(text: str) -> list[Metric]:
    """All metric families of a text exposition.

    Raises:
        ValueError: the text is not a valid exposition (prometheus-client's parser error).
    """
    return list(text_string_to_metric_families(text))


def _base(name: str) -> str:
    return name[: -len("_total")] if name.endswith("_total") else name


def sum_counter(
    families: Iterable[Metric], name: str, group_by: str | None = None
) -> float | dict[str, float] | None:
    """Sum a counter's samples across label sets (e.g. over vLLM's ``engine`` label).

    ``name`` may be given with or without ``_total``; samples named ``name`` or ``name_total`` count, ``_created``
    samples never do. With ``group_by``, sums per value of that label (samples without it are skipped).

    Returns:
        the sum (or a dict label value -> sum), or None when no sample of that counter exists.
    """
    base = _base(name)
    wanted = {base, base + "_total"}
    total = 0.0
    groups: dict[str, float] = {}
    found = False
    for family in families:
        if _base(family.name) != base:
            continue
        for sample in family.samples:
            if sample.name not in wanted:
                continue
            if group_by is None:
                total += sample.value
                found = True
            elif group_by in sample.labels:
                key = sample.labels[group_by]
                groups[key] = groups.get(key, 0.0) + sample.value
                found = True
    if not found:
        return None
    return groups if group_by is not None else total


def gauge_values(families: Iterable[Metric], name: str) -> list[float]:
    """Every sample value of a gauge (or untyped metric) named ``name``, one per label set, in exposition order."""
    return [s.value for f in families if f.name == name for s in f.samples if s.name == name]


RUNNING_GAUGES = ("vllm:num_requests_running", "sglang:num_running_reqs", "spectune:num_requests_running",
                  "llamacpp:requests_processing")
"""Gauges of requests in an engine's running batch: vLLM (``vllm/v1/metrics/loggers.py``), SGLang
(``python/sglang/srt/metrics/collector.py``), the bundled engine (``backends/local/server/metrics.py``) and llama.cpp's
``llama-server --metrics`` (requests in busy slots)."""


def running_from_families(families: Iterable[Metric], names: Iterable[str]) -> tuple[float, str] | None:
    """(requests running now, summed over label sets such as engines or DP ranks, gauge name) for the first of
    ``names`` the exposition has, or None."""
    families = list(families)
    for name in names:
        values = gauge_values(families, name)
        if values:
            return float(sum(values)), name
    return None


async def scrape_running(base_url: str, names: Iterable[str] = RUNNING_GAUGES, headers: dict[str, str] | None = None,
                         timeout_s: float = 5.0) -> tuple[float, str] | None:
    """GET ``{base_url}/metrics`` and read the running-requests gauge (:func:`running_from_families`); None when
    there is no page, it does not parse, or none of ``names`` is on it."""
    reply = await get(base_url + "/metrics", timeout_s, headers)
    if reply.status != 200:
        return None
    try:
        return running_from_families(parse_metrics(reply.text), names)
    except ValueError:
        return None


SWITCHES_COUNTER = "spectune:spec_num_steps_switches"
"""The bundled engine's counter of adaptive num_steps tier changes (``backends/local/server/metrics.py``)."""


async def scrape_switches(base_url: str, headers: dict[str, str] | None = None,
                          timeout_s: float = 5.0) -> tuple[float, str] | None:
    """GET ``{base_url}/metrics`` and read :data:`SWITCHES_COUNTER` (summed over labels): (switches, its name), or
    None when there is no page, it does not parse, or the counter is absent."""
    reply = await get(base_url + "/metrics", timeout_s, headers)
    if reply.status != 200:
        return None
    try:
        value = sum_counter(parse_metrics(reply.text), SWITCHES_COUNTER)
    except ValueError:
        return None
    return None if value is None else (float(value), SWITCHES_COUNTER + "_total")


def snapshot_from_text(text: str, prefix: str = "vllm:", taken_at: float | None = None) -> SpecSnapshot:
    """A :class:`SpecSnapshot` from a /metrics text, with counters summed over engines.

    Counter fields are None when the server exposes no such counter (no speculation configured, or another
    engine). ``instance`` is ``process_start_time_seconds`` when exposed, so a restarted server is detected.
    ``taken_at`` defaults to :func:`time.perf_counter` (s).

    Raises:
        ValueError: the text is not a valid exposition.
    """
    return snapshot_from_families(parse_metrics(text), prefix, taken_at)


def snapshot_from_families(families: list[Metric], prefix: str, taken_at: float | None = None) -> SpecSnapshot:
    """:func:`snapshot_from_text` on already parsed families."""
    per_pos = sum_counter(families, prefix + ACCEPTED_PER_POS, group_by="position") or {}
    start = gauge_values(families, "process_start_time_seconds")
    return SpecSnapshot(
        taken_at=time.perf_counter() if taken_at is None else taken_at,
        num_drafts=sum_counter(families, prefix + DRAFTS),  # type: ignore[arg-type]
        num_draft_tokens=sum_counter(families, prefix + DRAFT_TOKENS),  # type: ignore[arg-type]
        num_accepted_tokens=sum_counter(families, prefix + ACCEPTED),  # type: ignore[arg-type]
        accepted_per_pos={int(k): v for k, v in per_pos.items()},  # type: ignore[union-attr]
        instance=repr(start[0]) if start else None,
        raw={"metrics_prefix": prefix},
    )


async def scrape_snapshot(
    base_url: str, prefixes: tuple[str, ...] = ("vllm:", "spectune:"), headers: dict[str, str] | None = None,
    timeout_s: float = 5.0, extra_counters: dict[str, str] | None = None,
) -> SpecSnapshot | None:
    """GET ``{base_url}/metrics`` and read the spec-decode counters of the first prefix that has them.

    ``extra_counters`` (``raw`` key -> counter name) are read into the snapshot's ``raw`` too, where present.

    Returns:
        a snapshot (``num_drafts`` None when the server exposes metrics but no spec-decode counters), or None
        when there is no /metrics page or it does not parse.
    """
    taken_at = time.perf_counter()
    reply = await get(base_url + "/metrics", timeout_s, headers)
    if reply.status != 200:
        return None
    try:
        families = parse_metrics(reply.text)
    except ValueError:
        return None
    snaps = [snapshot_from_families(families, p, taken_at) for p in prefixes]
    snap = next((s for s in snaps if s.num_drafts is not None), snaps[0] if snaps else None)
    if snap is not None:
        for key, name in (extra_counters or {}).items():
            value = sum_counter(families, name)
            if value is not None:
                snap.raw[key] = value  # type: ignore[assignment]
    return snap
