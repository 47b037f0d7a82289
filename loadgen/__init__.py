"""Load generation: prompt datasets, arrival processes, the streaming client and per-request metrics.

Never imports ``spectune`` or ``backends``. The sweep drives one point like this::

    from loadgen import ClientConfig, ClosedLoop, Constraints, StreamingClient, compute_metrics, load_dataset, run_point

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
from typing import Any

from loadgen.errors import UserError

_EXPORTS = {
    "RequestRecord": "loadgen.record",
    "Prompt": "loadgen.datasets",
    "load_dataset": "loadgen.datasets",
    "DATASET_NAMES": "loadgen.datasets",
    "ClientConfig": "loadgen.client",
    "StreamingClient": "loadgen.client",
    "Strategy": "loadgen.strategy",
    "ClosedLoop": "loadgen.strategy",
    "OpenLoop": "loadgen.strategy",
    "Phase": "loadgen.strategy",
    "Phased": "loadgen.strategy",
    "Constraints": "loadgen.constraints",
    "PointResult": "loadgen.runner",
    "run_point": "loadgen.runner",
    "METRIC_COLUMNS": "loadgen.metrics",
    "compute_metrics": "loadgen.metrics",
    "per_category": "loadgen.metrics",
}

__all__ = ["UserError", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'loadgen' has no attribute {name!r}")
