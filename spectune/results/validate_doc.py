"""validate.json read back as records: :class:`ValidateDoc` (the document), its :class:`RecordedPlan` (``plan``,
with its :class:`RecordedWorkload`), :class:`RecordedConfig` (``config`` and each of a bake-off's ``configs``),
:class:`RecordedVerdict` (``verdict``), :class:`RecordedPrediction` (``prediction``) and :class:`RecordedBakeoff`
(``bakeoff``: rows of :class:`BakeoffCell`).
docs/results-format.md lists the keys.

``spectune validate`` writes validate.json as it goes (:mod:`spectune.validate.run`); whatever reads it back (the
verdict, validate.md, ``spectune report``, ``--rule-again``) reads these records, never the parsed dicts. A key a
file lacks (an older format) takes the attribute's default; keys this version does not know are ignored here and
kept by the writer, which rewrites the parsed object.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TypeVar

from spectune.core.json_types import JsonObject, JsonValue
from spectune.results.primary import Primary
from spectune.results.validate_run import ValidateRun, runs_of

__all__ = ["BakeoffCell", "BakeoffRow", "ComparisonRow", "PredictedRun", "RecordedBakeoff", "RecordedComparison",
           "RecordedConfig", "RecordedPhase", "RecordedPlan", "RecordedPrediction", "RecordedVerdict",
           "RecordedWorkload", "ValidateDoc"]

_R = TypeVar("_R")


def _known(cls: type[_R], obj: JsonValue) -> _R:
    """``cls`` (a dataclass) from the keys of ``obj`` it names (others ignored; an absent key: the default; not an
    object: every default)."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in obj.items() if k in names} if isinstance(obj, dict) else {})


@dataclass
class RecordedPhase:
    """One phase of ``plan.workload.phases`` (:meth:`spectune.measure.workload.Workload.to_json`): 1-based
    ``phase``, its ``label`` (``c=32``), ``start_s`` and ``end_s`` (s from the run's start), closed-loop
    ``concurrency`` or open-loop ``rate`` (requests/s), the other None."""

    phase: int = 0
    label: str = ""
    start_s: float = 0.0
    end_s: float = 0.0
    concurrency: int | None = None
    rate: float | None = None


@dataclass
class RecordedWorkload:
    """``plan.workload``: its ``name`` (preset or phase tokens), ``total_s`` (s), ``max_concurrency`` (the most
    open-loop requests in flight; None in files without it) and ``phases``."""

    name: str | None = None
    total_s: float | None = None
    phases: list[RecordedPhase] = field(default_factory=list)
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        self.phases = [p if isinstance(p, RecordedPhase) else _known(RecordedPhase, p) for p in self.phases or []]

    @classmethod
    def from_json(cls, obj: JsonObject) -> RecordedWorkload:
        """The record of :meth:`spectune.measure.workload.Workload.to_json` (validate.json's ``plan.workload``)."""
        return _known(cls, obj)

    @property
    def concurrencies(self) -> list[int | None]:
        """Each phase's closed-loop concurrency (None: open loop)."""
        return [p.concurrency for p in self.phases]

    @property
    def bounds(self) -> list[tuple[float, float]]:
        """(start_s, end_s) of each phase, s from the run's start."""
        return [(p.start_s, p.end_s) for p in self.phases]


@dataclass
class RecordedPlan:
    """validate.json's ``plan`` (:meth:`spectune.validate.plan.ValidatePlan.to_json`) as far as a reader needs it:
    static ``steps``, ``repeats``, how the servers were held (``servers``: ``one``, ``together``, ``kept``; None in
    files from before), the request settings (``dataset``, ``max_tokens``, ``temperature``), the SLOs (ms, None:
    none), ``tolerance`` (fraction), ``config_static`` (K the config stands for, or None) and the ``workload``."""

    steps: list[int] = field(default_factory=list)
    repeats: int | None = None
    servers: str | None = None
    dataset: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    tolerance: float | None = None
    config_static: int | None = None
    workload: RecordedWorkload = field(default_factory=RecordedWorkload)

    def __post_init__(self) -> None:
        if not isinstance(self.workload, RecordedWorkload):
            self.workload = _known(RecordedWorkload, self.workload)

    @property
    def with_slo(self) -> bool:
        """True when the validation had a TTFT or TPOT SLO."""
        return self.slo_ttft_ms is not None or self.slo_tpot_ms is not None


@dataclass
class RecordedConfig:
    """validate.json's ``config`` (one config) or an entry of ``configs`` (a bake-off,
    :meth:`spectune.validate.plan.BakeoffConfig.to_json`): ``name`` (bake-off only), ``path``, ``format``,
    ``candidate_steps``, ``static_equivalent`` (``{"steps", "reason"}`` when it runs the same rounds as a static
    num_steps, else None) and ``run`` (the run that measures it, bake-off only)."""

    name: str | None = None
    path: str | None = None
    format: str | None = None
    candidate_steps: list[int] = field(default_factory=list)
    static_equivalent: JsonObject | None = None
    run: str = ""

    @property
    def static(self) -> tuple[int, str] | None:
        """(K, why) when the config is static num_steps K, else None."""
        same = self.static_equivalent
        return (int(same["steps"]), str(same.get("reason") or "")) if same else None  # type: ignore[arg-type]


@dataclass
class RecordedVerdict:
    """validate.json's ``verdict`` (:class:`spectune.validate.verdict.Verdict` as an object) as readers show it:
    ``line``, ``outcome`` (``PASS``, ``FAIL``, ``INCONCLUSIVE``; "" in files from before it), ``passed`` and the
    ``confidence`` of its intervals (None when it has none)."""

    line: str = ""
    outcome: str = ""
    passed: bool = False
    confidence: float | None = None


@dataclass
class BakeoffCell:
    """One window of a bake-off row (:class:`spectune.validate.bakeoff.BakeoffRow`): output tok/s (per phase also
    the steady tok/s), TPOT p50/p99 (ms), SLO attainment (fraction), goodput (req/s); the ratio to the best static
    with its interval (``low``, ``high``); per phase ``phase``, ``label``, that phase's ``best_static`` and the
    ``ruling``; in ``phase_best_static`` also that static's ``steps`` and ``run``. None where not known."""

    phase: int | None = None
    label: str | None = None
    steps: int | None = None
    run: str | None = None
    output_throughput_tok_s: float | None = None
    steady_output_throughput_tok_s: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    slo_attainment: float | None = None
    goodput_req_s: float | None = None
    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    best_static: int | None = None
    ruling: str | None = None


@dataclass
class BakeoffRow:
    """A row of ``bakeoff``: a config (``name``) or the best static (``name`` None, ``steps`` its K), the ``run``
    that measured it, its ``overall`` cell (None when the run failed), its ``phases`` and its ``verdict``."""

    name: str | None = None
    run: str | None = None
    steps: int | None = None
    overall: BakeoffCell | None = None
    phases: list[BakeoffCell] = field(default_factory=list)
    verdict: RecordedVerdict | None = None

    def __post_init__(self) -> None:
        self.overall = _known(BakeoffCell, self.overall) if isinstance(self.overall, dict) and self.overall else None
        self.phases = [_known(BakeoffCell, p) for p in self.phases or []]
        self.verdict = _known(RecordedVerdict, self.verdict) if isinstance(self.verdict, dict) else None


@dataclass
class RecordedBakeoff:
    """validate.json's ``bakeoff`` (:class:`spectune.validate.bakeoff.BakeoffJson`): the ``best_static`` row, per
    phase that phase's best static (``phase_best_static``, None where none), the ``configs`` rows, the
    ``winner``'s name (None: the best static) and the overall ``line``."""

    best_static: BakeoffRow | None = None
    phase_best_static: list[BakeoffCell | None] = field(default_factory=list)
    configs: list[BakeoffRow] = field(default_factory=list)
    winner: str | None = None
    line: str = ""

    def __post_init__(self) -> None:
        self.best_static = _known(BakeoffRow, self.best_static) if self.best_static else None
        self.phase_best_static = [_known(BakeoffCell, c) if c else None for c in self.phase_best_static or []]
        self.configs = [_known(BakeoffRow, r) for r in self.configs or []]


@dataclass
class ComparisonRow:
    """One row of ``prediction.comparison.rows`` (:func:`spectune.validate.prediction.compare`): the ``run``, the
    ``window`` (``overall`` or the 1-based phase), the ``predicted`` tok/s with the sweep's interval (``low``,
    ``high``; at the sweep's speed), the ``band`` it was widened by on each side (fraction), the ``measured`` tok/s,
    ``ratio`` = measured / (predicted x speed factor) and whether it is a ``miss``."""

    run: str = ""
    window: int | str = "overall"
    predicted: float = 0.0
    low: float = 0.0
    high: float = 0.0
    band: float | None = None
    measured: float = 0.0
    ratio: float = 0.0
    miss: bool = False


@dataclass
class RecordedComparison:
    """``prediction.comparison``: the ``speed_factor`` (None: no static run finished), the ``rows`` and the
    ``misses`` as sentences."""

    speed_factor: float | None = None
    rows: list[ComparisonRow] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rows = [_known(ComparisonRow, r) for r in self.rows or []]
        self.misses = list(self.misses or [])


@dataclass
class PredictedRun:
    """One run of ``prediction.runs`` (:func:`spectune.tune.predict.predict_validate`): per phase (``phases``) and
    over the whole run (``overall``), [point, low, high] output tokens/s at the sweep's speed."""

    phases: list[list[float]] = field(default_factory=list)
    overall: list[float] = field(default_factory=list)


@dataclass
class RecordedPrediction:
    """validate.json's ``prediction`` (:func:`spectune.validate.prediction.predict_for`): the recommendation it
    came from (``source``), the sweep's ``model``, or the ``error`` that stopped it; the predicted ``runs`` by name;
    recommend's ``primary`` answer (as written; :attr:`recommended` as a record), the workload's closed-loop seconds
    per concurrency (``load_mix``), the phases above the sweep's largest concurrency (``above_sweep``: ``phases``,
    ``sweep_max``) and the ``comparison`` with what was measured."""

    source: str | None = None
    model: str | None = None
    error: str | None = None
    primary: JsonObject | None = None
    load_mix: dict[str, float] = field(default_factory=dict)
    above_sweep: JsonObject | None = None
    comparison: RecordedComparison = field(default_factory=RecordedComparison)
    runs: dict[str, PredictedRun] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.load_mix = dict(self.load_mix or {})
        self.runs = {str(n): r if isinstance(r, PredictedRun) else _known(PredictedRun, r)
                     for n, r in (self.runs or {}).items()}
        if not isinstance(self.comparison, RecordedComparison):
            self.comparison = _known(RecordedComparison, self.comparison)

    @property
    def recommended(self) -> Primary | None:
        """recommend's primary answer as a record (None without one)."""
        return Primary.from_json(self.primary)

    @classmethod
    def from_json(cls, obj: JsonObject | None) -> RecordedPrediction | None:
        """The record of a ``prediction`` object (None for None or an empty one)."""
        return _known(cls, obj) if obj else None


@dataclass
class ValidateDoc:
    """validate.json as a reader sees it (module docstring): ``status``, ``created`` (UTC ISO 8601), preflight
    ``warnings``, the ``plan``, the
    ``config`` (one config) or ``configs`` (a bake-off), the ``runs`` (one per run and repeat,
    :class:`spectune.results.validate_run.ValidateRun`), the ``verdict`` (None before one), and the JSON sections
    their own modules read: ``phase_check`` (:mod:`spectune.validate.phase_check`) and ``instance_spread``
    (:class:`spectune.validate.repeats.InstanceSpread`); ``prediction`` and ``bakeoff`` as records."""

    status: str | None = None
    created: str | None = None
    warnings: list[str] = field(default_factory=list)
    plan: RecordedPlan = field(default_factory=RecordedPlan)
    config: RecordedConfig = field(default_factory=RecordedConfig)
    configs: list[RecordedConfig] = field(default_factory=list)
    runs: list[ValidateRun] = field(default_factory=list)
    verdict: RecordedVerdict | None = None
    prediction: RecordedPrediction | None = None
    phase_check: JsonObject | None = None
    instance_spread: JsonObject | None = None
    bakeoff: RecordedBakeoff | None = None

    @classmethod
    def from_json(cls, meta: JsonObject) -> ValidateDoc:
        """The records of a parsed validate.json (or of the object a validation is writing)."""
        doc = _known(cls, {k: v for k, v in meta.items() if k != "runs"})
        doc.warnings = list(doc.warnings or [])
        doc.plan = _known(RecordedPlan, meta.get("plan"))
        doc.config = _known(RecordedConfig, meta.get("config"))
        doc.configs = [_known(RecordedConfig, c) for c in meta.get("configs") or []]  # type: ignore[union-attr]
        doc.runs = runs_of(meta)
        doc.prediction = RecordedPrediction.from_json(meta.get("prediction"))  # type: ignore[arg-type]
        doc.verdict = _known(RecordedVerdict, meta["verdict"]) if meta.get("verdict") else None
        doc.bakeoff = _known(RecordedBakeoff, meta["bakeoff"]) if meta.get("bakeoff") else None
        return doc

    def ran(self, name: str) -> bool:
        """True when some run is named ``name`` (``config``, ``static:2``...)."""
        return any(r.run == name for r in self.runs)
