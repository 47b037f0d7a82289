"""The knobs of ``spectune recommend`` (:class:`RecommendOptions`), apart from the analysis that reads them
(:mod:`spectune.tune.recommend`), so the modules it imports (:mod:`spectune.tune.compare`, :mod:`spectune.tune.gain`)
can name them too."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RecommendOptions:
    """Knobs of the recommendation. Fractions, not percent (0.02 = 2%); SLOs in ms (None: not given)."""

    objective: str = "throughput"
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    min_slo_attainment: float = 0.9
    noise_band: float = 0.02
    max_spread: float = 0.05
    boundary: str = "geometric"
    max_batch_size: int | None = None
    confidence: float = 0.95
    allow_mixed_nodes: bool = False  # compare points of a --ray sweep's unlike nodes (spectune.results.nodes)
    mix: dict[int, float] | None = None  # {concurrency: time share} of the load served (spectune.tune.mix)
