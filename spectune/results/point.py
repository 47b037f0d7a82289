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
a point loses nothing.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, TypedDict

from spectune.results.schema import KEY_COLUMNS, STATUS_COLUMNS, SUMMARY_COLUMNS, Key, PointKey, now_iso, summary_row

__all__ = ["SweepPoint", "as_points", "MetricValue", "Window", "Warmup"]

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


@dataclass
class SweepPoint:
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
        extra: keys of a newer format.
        absent: fields an older file lacked (not written back).
    """

    steps: int
    concurrency: int
    repeat: int
    status: str
    error: str | None
    metrics: dict[str, MetricValue]
    acceptance: dict[str, Any]
    batch_size: dict[str, Any] | None
    per_category: dict[str, Any]
    window: Window
    requests_planned: int
    stop_reason: str | None
    early_stop: dict[str, Any] | None = None
    warmup: Warmup | None = None
    client_limit: str | None = None
    schedule_check: dict[str, Any] | None = None
    model: str | None = None
    base_url: str | None = None
    started: str | None = None
    finished: str | None = None
    log_tail: str = ""
    drift_check: str | None = None
    timing: dict[str, float] | None = None
    server: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: fields the file it was read from lacked (an older format) -> the value filled in: left out again by
    #: :meth:`to_dict` while they keep that value
    absent: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

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

    def to_dict(self) -> dict[str, Any]:
        """The points.jsonl object, keys in the file's order (module docstring)."""
        d: dict[str, Any] = {
            "steps": self.steps, "concurrency": self.concurrency, "repeat": self.repeat, "status": self.status,
            "error": self.error, "metrics": self.metrics, "acceptance": self.acceptance,
            "batch_size": self.batch_size, "per_category": self.per_category, "window": self.window,
            "requests_planned": self.requests_planned, "stop_reason": self.stop_reason}
        if self.early_stop is not None:
            d["early_stop"] = self.early_stop
        if self.measured:
            d.update(warmup=self.warmup, client_limit=self.client_limit, schedule_check=self.schedule_check,
                     model=self.model, base_url=self.base_url, started=self.started, finished=self.finished)
            if self.log_tail:
                d["log_tail"] = self.log_tail
            if self.drift_check:
                d["drift_check"] = self.drift_check
        else:  # what a point that measured nothing has (any other field set on it is kept, in the same order)
            d.update({k: v for k, v in (("warmup", self.warmup), ("client_limit", self.client_limit),
                                        ("schedule_check", self.schedule_check), ("model", self.model),
                                        ("base_url", self.base_url)) if v is not None})
            d.update(log_tail=self.log_tail, finished=self.finished)
            if self.drift_check:
                d["drift_check"] = self.drift_check
        if self.timing is not None:
            d["timing"] = self.timing
        if self.server is not None:
            d["server"] = self.server
        d.update(self.extra)
        if self.absent:
            d = {k: v for k, v in d.items() if k not in self.absent or v != self.absent[k]}
        return d

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> SweepPoint:
        """A points.jsonl object as a record (older files: ``repeat`` 0 and the optional keys' defaults when
        absent; unknown keys kept in ``extra``).

        Raises:
            KeyError: the object lacks ``steps`` or ``concurrency``.
        """
        names = {f.name for f in dataclasses.fields(cls)} - {"extra", "absent"}
        known = {k: v for k, v in obj.items() if k in names}
        known.setdefault("repeat", 0)
        for name, default in (("status", "ok"), ("error", None), ("metrics", {}), ("acceptance", {}),
                              ("batch_size", None), ("per_category", {}), ("window", {}),
                              ("requests_planned", 0), ("stop_reason", None)):
            known.setdefault(name, default)
        if known.get("log_tail") is None:
            known["log_tail"] = ""
        record = cls(**known, extra={k: v for k, v in obj.items() if k not in names})
        record.absent = {name: copy.deepcopy(getattr(record, name)) for name in names - set(obj)}
        return record

    def summary_row(self) -> dict[str, Any]:
        """The point's summary.csv row (:func:`spectune.results.schema.summary_row`; ``acceptance_vs_c1`` is
        filled by the folder, which sees every point)."""
        return summary_row(self.to_dict())


def as_points(points: Iterable[SweepPoint | dict[str, Any]]) -> list[SweepPoint]:
    """``points`` as records: a :class:`SweepPoint` is kept as it is, a points.jsonl object is read with
    :meth:`SweepPoint.from_dict`.

    Raises:
        KeyError: an object lacks ``steps`` or ``concurrency``.
    """
    return [p if isinstance(p, SweepPoint) else SweepPoint.from_dict(p) for p in points]
