"""A sweep point as a typed record: :class:`SweepPoint` is one line of points.jsonl, and its summary.csv row.

The line's keys and their order are the contract of docs/results-format.md ("points.jsonl" and "points.jsonl
extras"); :meth:`SweepPoint.to_dict` writes them in the order the first release wrote them, so files written before
and after this record read (and diff) the same:

- a measured point: ``steps``, ``concurrency``, ``repeat``, ``status``, ``error``, ``metrics``, ``acceptance``,
  ``batch_size``, ``per_category``, ``window``, ``requests_planned``, ``stop_reason``, [``early_stop``], ``warmup``,
  ``client_limit``, [``schedule_check``], ``model``, ``base_url``, ``started``, ``finished``, [``log_tail``], [``drift_check``],
  [``timing``], [``server``];
- a point that measured nothing (its server never came up, no model, a warm-up past its limit; no ``started``):
  ``steps`` ... ``stop_reason``, ``log_tail``, ``finished``, [``timing``], [``server``].

Keys this version does not know (a newer spectune's) are kept in ``extra`` and written last, so reading and writing
a point loses nothing. :class:`SweepPoint` is the line as a record (its parts: the TypedDicts below),
:data:`PointObject` the line as a dict, :class:`RequestLine` one requests.jsonl line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Required, TypedDict

from spectune.core.json_types import JsonObject
from spectune.results.open_record import LenientRecord
from spectune.results.point_numbers import PointNumbers
from spectune.results.schema import KEY_COLUMNS, STATUS_COLUMNS, SUMMARY_COLUMNS, Key, PointKey, now_iso, summary_row
from spectune.results.sweep_nodes import PointNode

if TYPE_CHECKING:
    from spectune.backends.snapshots import CrossCheck

__all__ = ["SweepPoint", "as_points", "MetricValue", "Window", "Warmup", "PointAcceptance",
           "BatchSize", "CategoryNumbers", "PairedLook", "EarlyStopLook", "EarlyStopRecord", "ScheduleCheck",
           "PointTiming", "ServerRecord", "PointObject", "RequestLine"]

MetricValue = float | int | str | bool | None
"""One value of a point's ``metrics``: a number (ms, tokens/s, req/s, counts as the column names), a source or
reason string, a flag, or None (not measured)."""


class Window(TypedDict):
    """A point's measurement window: ``start_s``, ``end_s`` (``time.perf_counter`` s), None for a point that measured
    nothing."""

    start_s: float | None
    end_s: float | None


class Warmup(TypedDict):
    """A point's warm-up: ``requests`` sent before the window (not recorded), of which ``failed`` failed."""

    requests: int
    failed: int


class PointAcceptance(TypedDict, total=False):
    """A point's ``acceptance``: ``per_position`` (acceptance rate per draft position), ``num_drafts`` (verify steps
    with drafting, or None), ``warning`` (or None) and, for a measured point, ``cross_check`` (or None); empty in a
    line that lacks it."""

    per_position: list[float]
    num_drafts: float | None
    warning: str | None
    cross_check: CrossCheck | None


class BatchSize(TypedDict):
    """A point's ``batch_size``: the engine's running batch over the window
    (:func:`spectune.measure.batch_size.batch_size_summary`): ``mean`` (time average), ``p50``, ``p90``, ``min``,
    ``max`` (requests), ``samples`` (readings), ``histogram`` (``{"B": readings at batch size B}``), ``source`` (the
    gauge)."""

    mean: float
    p50: float
    p90: float
    min: float
    max: float
    samples: int
    histogram: dict[str, int]
    source: str


class CategoryNumbers(TypedDict, total=False):
    """One ``per_category`` entry (:func:`spectune.measure.acceptance.per_category_points`): ``num_requests`` (failed
    included), ``tpot_p50_ms`` (ms), ``output_throughput_tok_s`` (tokens/s), ``acceptance_length`` (tokens per verify
    step) and its ``acceptance_length_source``; None where unknown."""

    num_requests: int
    tpot_p50_ms: float | None
    output_throughput_tok_s: float | None
    acceptance_length: float | None
    acceptance_length_source: str


class PairedLook(TypedDict):
    """``early_stop.paired``: the paired test's last look (:class:`spectune.sweep.sequential.EarlyStop`): ``ratio``
    (the cell over the reference on the requests both measured, "better" up), its bounds ``low``/``high`` and the
    ``pairs``."""

    ratio: float
    low: float
    high: float
    pairs: int


class EarlyStopLook(TypedDict, total=False):
    """The sequential rule's last look (:attr:`spectune.sweep.sequential.EarlyStop.last`): ``estimate`` (tokens/s, or
    TPOT ms) with its confidence-sequence bounds ``low``/``high``, ``requests`` (successful requests seen),
    ``elapsed_s``, ``reference`` (the rescaled reference, or None), ``minimum`` (successful requests required then),
    ``paired`` (from 8 pairs on) and, for a window that stopped early, ``window_output_throughput_tok_s`` (its own
    tokens over its length)."""

    estimate: float
    low: float
    high: float
    requests: int
    elapsed_s: float
    reference: float | None
    minimum: int
    paired: PairedLook
    window_output_throughput_tok_s: MetricValue


class EarlyStopRecord(EarlyStopLook, total=False):
    """A point's ``early_stop`` (:meth:`spectune.sweep.sequential.EarlyStop.describe`): the rule's ``reason`` (None:
    the full window ran), ``objective``, ``confidence``, ``noise_band``, ``precision``, ``min_requests``, ``min_s``,
    ``method``, and its last look (:class:`EarlyStopLook`)."""

    reason: str | None
    objective: str
    confidence: float
    noise_band: float
    precision: float | None
    min_requests: int | None
    min_s: float
    method: str


@dataclass(frozen=True)
class ScheduleCheck:
    """Whether one window's server followed a per-batch-size schedule, or the num_steps it was given
    (:func:`spectune.measure.schedule_check.check_schedule`, :func:`~spectune.measure.schedule_check.check_num_steps`):
    validate's per phase, a sweep point's ``schedule_check`` as :meth:`to_json`.

    Attributes:
        batch_size: the window's batch size (requests; a time average, so fractional).
        drafted_per_step: d(draft tokens) / d(drafts): tokens per request per drafting verify step (0.0: none).
        drafting_share: d(drafts) / verify steps (output tokens - accepted drafts), or None without output tokens.
        k_low, k_high: the schedule's smallest and largest K over the window's batch sizes.
        followed: see :mod:`spectune.measure.schedule_check`.
    """

    batch_size: float
    drafted_per_step: float
    drafting_share: float | None
    k_low: int
    k_high: int
    followed: bool

    @classmethod
    def from_json(cls, obj: JsonObject) -> ScheduleCheck:
        """The record of a ``schedule_check`` object as :meth:`to_json` wrote it (writing it again gives the same
        object: its numbers are already rounded).

        Raises:
            KeyError: a key of :meth:`to_json` is missing. TypeError, ValueError: a value is not a number.
        """
        share = obj["drafting_share"]
        return cls(float(obj["batch_size"]), float(obj["drafted_per_step"]),  # type: ignore[arg-type]
                   None if share is None else float(share), int(obj["k_low"]), int(obj["k_high"]),  # type: ignore
                   bool(obj["followed"]))

    def to_json(self) -> JsonObject:
        """validate.json's per-phase and points.jsonl's per-point ``schedule_check`` (docs/results-format.md)."""
        share = None if self.drafting_share is None else round(self.drafting_share, 4)
        return {"batch_size": round(self.batch_size, 3), "drafted_per_step": round(self.drafted_per_step, 4),
                "drafting_share": share, "k_low": self.k_low, "k_high": self.k_high, "followed": self.followed}

    def message(self, label: str, setting: str | None) -> str:
        """The plain warning when the schedule was not followed (``setting``: the backend's remedy, or None)."""
        k = f"{self.k_low}" if self.k_low == self.k_high else f"{self.k_low}-{self.k_high}"
        share = "" if self.drafting_share is None else f" in {self.drafting_share:.0%} of its verify steps"
        text = (f"{label}: the server drafted {self.drafted_per_step:.2f} tokens per step{share} at batch size "
                f"{self.batch_size:.1f}, where the schedule gives K={k}: it is NOT following the per-batch-size "
                "schedule, so this run measured static speculation")
        return text + (f"; {setting}" if setting else "")

    def steps_message(self, label: str, setting: str | None) -> str:
        """The plain warning when a sweep point's server did not run the static num_steps it was given."""
        share = "" if self.drafting_share is None else f" in {self.drafting_share:.0%} of its verify steps"
        text = (f"{label}: the server drafted {self.drafted_per_step:.2f} tokens per step{share}, but it was given "
                f"num_steps {self.k_high}: it is NOT running the num_steps it was given, so this point measured "
                "another num_steps")
        return text + (f"; {setting}" if setting else "")



class PointTiming(TypedDict):
    """A point's ``timing``: ``switch_s`` (its ``start(K)`` call when it changed the server) and ``measure_s``, s."""

    switch_s: float
    measure_s: float


class ServerRecord(TypedDict, total=False):
    """A point's ``server`` when it is not the static server of its num_steps: a schedule-server point's ``kind``
    (``schedule``), ``max_k`` (the schedule's largest K) and the engine's
    :class:`spectune.backends.base.ScheduleServer` (``engine``, ``pinned``, ``source``, ``costs_more``); a
    draft-confidence cutoff point's ``kind`` (``p_min``), ``p_min`` (the cutoff P), ``max_k`` (its num_steps K, the
    draft's cap) and ``args`` (the flags that set P, :meth:`spectune.backends.base.Backend.p_min_args`)."""

    kind: Required[str]
    max_k: Required[int]
    engine: str
    p_min: float
    args: list[str]
    pinned: str
    source: str
    costs_more: bool


PointObject = JsonObject
"""A points.jsonl object: what :meth:`SweepPoint.to_dict` writes (its keys are :class:`SweepPoint`'s fields, in the
order and on the conditions of the module docstring; a newer format's keys last), or a line as parsed (an older or
newer file's, a predicted cell's row, ``node`` of a ``--ray`` sweep) whose keys :meth:`SweepPoint.from_dict` sorts
out."""


class RequestLine(TypedDict, total=False):
    """One requests.jsonl line (docs/results-format.md): :meth:`spectune.loadgen.record.RequestRecord.to_json` (its
    fields, then ``ttft_ms``, ``tpot_ms``, ``e2e_ms``) after the point's ``steps``, ``concurrency``, ``repeat``, plus
    ``drift_check`` in drift_requests.jsonl. A sweep keeps its points' requests in memory with ``chunk_times`` as
    their count and without ``chunk_tokens`` (:meth:`spectune.sweep.run.Sweep._point`); a line from an older file
    may lack keys."""

    steps: int
    concurrency: int
    repeat: int
    request_id: str
    prompt_id: str
    category: str | None
    send_time: float
    chunk_times: list[float] | int
    chunk_tokens: list[int]
    token_count_source: str
    end_time: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    output_text: str
    finish_reason: str | None
    status: int | None
    error: str | None
    server_stats: JsonObject | None
    dispatch_delay_s: float | None
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    drift_check: str


@dataclass
class SweepPoint(LenientRecord):
    """One finished (num_steps, concurrency, repeat) point of a sweep (one points.jsonl line).

    Attributes:
        steps, concurrency, repeat: the point's key (num_steps K, requests in flight, 0-based repeat).
        status: ``ok`` or ``failed``. error: why it failed (None or a message).
        metrics: every summary.csv column except the key and status ones (ms, tokens/s, req/s as named).
        acceptance: ``per_position``, ``num_drafts``, ``warning`` (and ``cross_check`` for a measured point).
        batch_size: the engine's running batch over the window (``mean``, ``p50``, ... ``source``), or None.
        per_category: category -> its numbers. window: ``start_s``, ``end_s`` (perf_counter s, or None).
        requests_planned: measured requests the point was allowed. stop_reason: why its window ended.
        early_stop: the sequential rule's last look (``--early-stop``), or None (not written).
        warmup: ``{"requests": N, "failed": M}`` (measured points). client_limit: why the load generator limited
            the point, or None. schedule_check: whether the server drafted the point's num_steps
            (:func:`spectune.measure.schedule_check.check_num_steps`), or None (no spec-decode counters; absent in
            files before it). model, base_url: what was sent where. started, finished: UTC ISO-8601 times;
            ``started`` is None for a point that measured nothing.
        log_tail: the server log's last lines ("" for none). drift_check: the label of a drift re-measurement.
        timing: ``switch_s``, ``measure_s`` (s), or None (not written).
        server: the server the point measured when it is not the static one of its num_steps: ``{"kind":
            "schedule", "max_k": M, "engine": ...}`` (the engine's schedule server pinned to K,
            :class:`spectune.backends.base.ScheduleServer`); None (not written): the static server.
        engine_warnings: what the engine said was wrong with its own rounds during the window (the bundled engine:
            a (batch, num_steps) shape over 1.5x its step model, ``backends/local/engine/step_model.py``); empty (not
            written) when nothing was said.
        extra: keys of a newer format.
        absent: fields an older file lacked (not written back).
    """

    steps: int
    concurrency: int
    repeat: int
    status: str
    error: str | None
    metrics: dict[str, MetricValue]
    acceptance: PointAcceptance
    batch_size: BatchSize | None
    per_category: dict[str, CategoryNumbers]
    window: Window
    requests_planned: int
    stop_reason: str | None
    early_stop: EarlyStopRecord | None = None
    warmup: Warmup | None = None
    client_limit: str | None = None
    schedule_check: ScheduleCheck | None = None
    model: str | None = None
    base_url: str | None = None
    started: str | None = None
    finished: str | None = None
    log_tail: str = ""
    drift_check: str | None = None
    timing: PointTiming | None = None
    server: ServerRecord | None = None
    engine_warnings: list[str] = field(default_factory=list)

    @property
    def key(self) -> PointKey:
        """The point key (:func:`spectune.results.schema.point_key`)."""
        return PointKey(self.steps, self.concurrency, self.repeat)

    @property
    def predicted(self) -> bool:
        """True for a guided sweep's predicted cell read back as a point (its ``predicted`` key, kept in
        ``extra``); a measured or failed point is never predicted."""
        return bool(self.extra.get("predicted"))

    @property
    def numbers(self) -> PointNumbers:
        """The numbers the sweep reads back from ``metrics``, typed (:class:`PointNumbers`)."""
        return PointNumbers.from_metrics(self.metrics)

    @property
    def node(self) -> PointNode | None:
        """Where a ``--ray`` sweep measured the point (its ``node``, kept in ``extra``), or None."""
        return PointNode.from_json(self.extra.get("node"))

    @property
    def stopped_early(self) -> bool:
        """True when the sequential rule ended the point's window before its planned requests (``early_stop``
        with a ``reason``)."""
        return self.early_stop is not None and bool(self.early_stop.get("reason"))

    @property
    def measured(self) -> bool:
        """True when the point ran its measurement window (it has ``started``)."""
        return self.started is not None

    @classmethod
    def failed(cls, key: Key, error: str, planned: int, log_tail: str = "",
               stop_reason: str = "server_start_failed") -> SweepPoint:
        """A point that measured nothing: its server never came up (``server_start_failed``), no model name
        (``no_model``) or its warm-up ran past its limit (``warmup_timeout``). Its metrics are null except the
        counts (0) and the sources (``none``)."""
        metrics: dict[str, MetricValue] = {c: None for c in SUMMARY_COLUMNS if c not in (*KEY_COLUMNS, *STATUS_COLUMNS)}
        metrics.update(num_requests=0, num_failed=0, total_output_tokens=0, acceptance_length_source="none",
                       batch_size_source="none")
        key = PointKey(*key)
        return cls(key.steps, key.concurrency, key.repeat, "failed", error, metrics,
                   {"per_position": [], "num_drafts": None, "warning": None}, None, {},
                   {"start_s": None, "end_s": None}, planned, stop_reason, log_tail=log_tail, finished=now_iso())

    def to_dict(self) -> PointObject:
        """The points.jsonl object, keys in the file's order (module docstring)."""
        d: PointObject = {
            "steps": self.steps, "concurrency": self.concurrency, "repeat": self.repeat, "status": self.status,
            "error": self.error, "metrics": self.metrics, "acceptance": self.acceptance,
            "batch_size": self.batch_size, "per_category": self.per_category, "window": self.window,
            "requests_planned": self.requests_planned, "stop_reason": self.stop_reason}
        if self.early_stop is not None:
            d["early_stop"] = self.early_stop
        check = None if self.schedule_check is None else self.schedule_check.to_json()
        if self.measured:
            d.update(warmup=self.warmup, client_limit=self.client_limit, schedule_check=check,
                     model=self.model, base_url=self.base_url, started=self.started, finished=self.finished)
            if self.log_tail:
                d["log_tail"] = self.log_tail
            if self.drift_check:
                d["drift_check"] = self.drift_check
        else:  # what a point that measured nothing has (any other field set on it is kept, in the same order)
            d.update({k: v for k, v in (("warmup", self.warmup), ("client_limit", self.client_limit),
                                        ("schedule_check", check), ("model", self.model),
                                        ("base_url", self.base_url)) if v is not None})
            d.update(log_tail=self.log_tail, finished=self.finished)
            if self.drift_check:
                d["drift_check"] = self.drift_check
        if self.timing is not None:
            d["timing"] = self.timing
        if self.server is not None:
            d["server"] = self.server
        if self.engine_warnings:
            d["engine_warnings"] = self.engine_warnings
        d.update(self.extra)
        return self.without_absent(d)

    @classmethod
    def from_dict(cls, obj: PointObject) -> SweepPoint:
        """A points.jsonl object as a record (older files: ``repeat`` 0 and the optional keys' defaults when
        absent; unknown keys kept in ``extra``).

        Raises:
            KeyError: the object lacks ``steps`` or ``concurrency``.
        """
        known, extra = cls.split(obj)  # type: ignore[arg-type]
        known.setdefault("repeat", 0)
        for name, default in (("status", "ok"), ("error", None), ("metrics", {}), ("acceptance", {}),
                              ("batch_size", None), ("per_category", {}), ("window", {}),
                              ("requests_planned", 0), ("stop_reason", None)):
            known.setdefault(name, default)
        if known.get("log_tail") is None:
            known["log_tail"] = ""
        if isinstance(known.get("schedule_check"), dict):
            known["schedule_check"] = ScheduleCheck.from_json(known["schedule_check"])
        record = cls(**known, extra=extra)  # type: ignore[arg-type]
        record.note_absent(obj)  # type: ignore[arg-type]
        return record

    def category_acceptance(self) -> dict[str, float]:
        """{category: acceptance length (tokens per verify step)} of the ``per_category`` entries that record it as
        a number (an entry without one, or with null, is left out)."""
        return {str(cat): float(al) for cat, v in (self.per_category or {}).items()
                if isinstance(v, dict) and isinstance(al := v.get("acceptance_length"), (int, float))}

    def summary_row(self) -> dict[str, MetricValue]:
        """The point's summary.csv row (:func:`spectune.results.schema.summary_row`; ``acceptance_vs_c1`` is
        filled by the folder, which sees every point)."""
        return summary_row(self.to_dict())


def as_points(points: Iterable[SweepPoint | PointObject]) -> list[SweepPoint]:
    """``points`` as records: a :class:`SweepPoint` is kept as it is, a points.jsonl object is read with
    :meth:`SweepPoint.from_dict`.

    Raises:
        KeyError: an object lacks ``steps`` or ``concurrency``.
    """
    return [p if isinstance(p, SweepPoint) else SweepPoint.from_dict(p) for p in points]
