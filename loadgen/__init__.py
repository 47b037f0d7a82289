"""Load generation: prompt datasets, arrival processes, the streaming client and per-request metrics.

Never imports ``spectune`` or ``backends``. The sweep drives one point like this::

    from spectune.loadgen import (ClientConfig, ClosedLoop, Constraints, StreamingClient, compute_metrics, load_dataset,
                                  run_point)

    prompts = load_dataset("mt-bench", num_prompts=80, seed=0)
    async with StreamingClient(ClientConfig(endpoint.base_url, model=endpoint.model, max_tokens=256)) as client:
        result = await run_point(client, prompts, ClosedLoop(16), Constraints(max_requests=64),
                                 warmup_requests=2, on_record=append_to_requests_jsonl)
    metrics = compute_metrics(result.records, result.window_start, result.window_end,
                              result.achieved_concurrency, slo_ttft_ms=None, slo_tpot_ms=None)

Heavy modules (aiohttp, numpy) load on first use of these names, so ``import loadgen`` stays cheap.
"""

from __future__ import annotations

import importlib

from spectune.core.errors import UserError

_EXPORTS = {
    "RequestRecord": "spectune.loadgen.record",
    "Prompt": "spectune.loadgen.datasets",
    "load_dataset": "spectune.loadgen.datasets",
    "DATASET_NAMES": "spectune.loadgen.datasets",
    "ClientConfig": "spectune.loadgen.client",
    "StreamingClient": "spectune.loadgen.client",
    "Strategy": "spectune.loadgen.strategy",
    "ClosedLoop": "spectune.loadgen.strategy",
    "OpenLoop": "spectune.loadgen.strategy",
    "Phase": "spectune.loadgen.strategy",
    "Phased": "spectune.loadgen.strategy",
    "TraceArrivals": "spectune.loadgen.strategy",
    "Constraints": "spectune.loadgen.constraints",
    "PointResult": "spectune.loadgen.send_loop",
    "run_point": "spectune.loadgen.send_loop",
    "METRIC_COLUMNS": "spectune.loadgen.metrics",
    "compute_metrics": "spectune.loadgen.metrics",
    "per_category": "spectune.loadgen.metrics",
}

__all__ = ["UserError", *_EXPORTS]


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'loadgen' has no attribute {name!r}")
