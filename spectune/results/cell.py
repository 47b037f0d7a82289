"""One cell of a recommendation as a record: :class:`Cell` is a (num_steps, concurrency) cell of a sweep as
``spectune recommend`` reduces it (:func:`spectune.tune.recommend.build_cell`) and recommendation.json's ``cells``
(and ``schedule_cells``, ``p_min_cells``) keep it; :meth:`Cell.from_json` reads such an entry back
(:class:`spectune.results.recommendation_doc.RecordedRecommendation`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from spectune.core.json_types import JsonObject
from spectune.results.confidence import Bootstrap, CellRuns, Interval

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Cell"]

_NAN_FIELDS = ("objective", "spread", "ci_low", "ci_high")  # written as null where NaN (JSON has no NaN)


@dataclass
class Cell:
    """One (num_steps, concurrency) cell: status ``ok``/``failed``/``missing``/``no-data``, medians, flags."""

    steps: int
    concurrency: int
    status: str
    n_ok: int = 0
    n_runs: int = 0
    objective: float = math.nan
    spread: float = math.nan
    noisy: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ci_low: float = math.nan
    ci_high: float = math.nan
    predicted: bool = False
    replicates: np.ndarray | None = field(default=None, repr=False, compare=False)  # (B,) bootstrap replicates
    #: the cell's runs for comparisons on shared prompts, and the analysis's Bootstrap; None without requests
    runs: CellRuns | None = field(default=None, repr=False, compare=False)
    bootstrap: Bootstrap | None = field(default=None, repr=False, compare=False)
    #: s since the epoch, the middle of the cell's measurements (mean over its points; None when unknown or
    #: predicted): how far apart two cells were measured, for the drift share of their comparison
    at_s: float | None = None
    #: the server the cell measured: ``static`` (K=0: no drafter) or ``schedule`` (the engine's schedule server
    #: pinned to K, the sweep's ``schedule-server/`` folder)
    server: str = "static"

    def metric(self, name: str) -> float:
        """The cell's median of summary.csv column ``name`` (:data:`spectune.tune.recommend.CELL_METRICS`; NaN when
        not measured)."""
        return self.metrics.get(name, math.nan)

    @property
    def eligible(self) -> bool:
        """Measured, not failed, finite objective and no SLO violation."""
        return self.status == "ok" and not self.violations and math.isfinite(self.objective)

    @property
    def interval(self) -> Interval:
        """The objective with its confidence interval (bounds NaN when unknown)."""
        return Interval(self.objective, self.ci_low, self.ci_high)

    @classmethod
    def from_json(cls, obj: JsonObject) -> Cell:
        """A recommendation.json ``cells`` entry as a cell: the keys it names (``eligible`` is derived, the working
        data ``replicates``, ``runs``, ``bootstrap`` never written, others ignored), null numbers back to NaN.

        Raises:
            TypeError: the entry lacks ``steps``, ``concurrency`` or ``status``.
        """
        known = {k: v for k, v in obj.items() if k in _JSON_FIELDS}
        known.update({k: math.nan for k in _NAN_FIELDS if k in known and known[k] is None})
        metrics = known.pop("metrics", None)
        cell = cls(**known)  # type: ignore[arg-type]
        if isinstance(metrics, dict):
            cell.metrics = {k: math.nan if v is None else float(v)  # type: ignore[arg-type]
                            for k, v in metrics.items()}
        return cell


_JSON_FIELDS = {f.name for f in fields(Cell)} - {"replicates", "runs", "bootstrap"}
