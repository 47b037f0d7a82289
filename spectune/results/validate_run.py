"""A validate run as a typed record: :class:`ValidateRun` is one entry of validate.json's ``runs``.

The entry's keys and their order are those the first release wrote (docs/validate.md, docs/results-format.md), so
validate.json files written before and after this record read the same:

- a measured run: ``run``, ``steps``, ``repeat``, ``started``, ``status``, ``error``, ``phases``, ``overall``,
  ``switches_source``, ``model``, ``base_url``, ``stop_reason``, ``t0``, ``warmup``, ``finished``;
- a run whose server never came up: ``run`` ... ``overall``, ``log_tail``, ``finished``;
- a run whose warm-up ran past its limit: ``run`` ... ``overall``, ``stop_reason``, ``finished``.

Keys this version does not know are kept in ``extra`` and written last. :class:`RunEntry` is the entry as the
dict the validate modules read, :class:`RunWindow` one of its ``phases`` or its ``overall``.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypedDict

from spectune.core.json_types import JsonObject

if TYPE_CHECKING:
    from spectune.results.point import Warmup

__all__ = ["ValidateRun", "RunWindow", "RunEntry"]


class RunWindow(TypedDict, total=False):
    """The numbers of one window of a run: a ``phases`` entry (one phase) or ``overall`` (the whole run).

    :func:`spectune.validate.phases.summarize_run` writes ``phase`` (1-based, ``"all"`` for the whole run),
    ``start_s``, ``end_s`` (s from ``t0``), the request and token counts, tokens/s, the TPOT/TTFT percentiles (ms),
    ``slo_attainment`` (a fraction, None without SLOs) and, per phase, the steady window's ``settle_s`` and
    ``steady_output_throughput_tok_s``; the run adds ``label``, the acceptance and ``num_steps_switches``, per phase
    ``schedule_check``, and in ``overall`` the load generator's own figures. A window from older files lacks the
    keys added since; combined over repeats (:func:`spectune.validate.repeats.combine_repeats`) the numbers are
    means (counts: sums).
    """

    phase: int | Literal["all"]
    start_s: float
    end_s: float
    num_requests: int
    num_failed: int
    achieved_concurrency: float | None
    output_tokens: int
    output_throughput_tok_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    slo_attainment: float | None
    settle_s: float | None
    steady_output_throughput_tok_s: float | None
    label: str
    acceptance_length: float | None
    acceptance_length_source: str
    num_steps_switches: float | None
    schedule_check: JsonObject | None
    dispatch_delay_p90_ms: float | None
    client_cpu_share: float | None
    client_limited: bool


class RunEntry(TypedDict, total=False):
    """One validate.json ``runs`` entry (:meth:`ValidateRun.to_dict`; keys: :class:`ValidateRun`'s attributes).

    ``t0``, ``switches_source``, ``model``, ``base_url`` and ``warmup`` are written for a measured run only,
    ``log_tail`` and ``finished`` only when known. ``node``: ``--ray`` validations (docs/results-format.md).
    ``repeats`` and ``throughput_by_repeat``: an entry of :func:`spectune.validate.repeats.combine_repeats` over two
    or more repeats (which has no ``repeat``, ``started`` or ``finished``).
    """

    run: str
    steps: int
    repeat: int
    started: str
    status: str
    error: str | None
    phases: list[RunWindow]
    overall: RunWindow
    log_tail: str
    switches_source: str | None
    model: str | None
    base_url: str | None
    stop_reason: str | None
    t0: float
    warmup: Warmup | None
    finished: str
    node: JsonObject | None
    repeats: int
    throughput_by_repeat: list[float | None]


@dataclass
class ValidateRun:
    """One run of ``spectune validate``: one static num_steps (``static:K``), the config (``config``) or the A/A run
    (``aa:K``: static K on a second fresh server), one repeat.

    Attributes:
        run: the run's name. steps: num_steps it started the server with. repeat: 1-based repeat.
        started, finished: UTC ISO-8601 times. status: ``ok`` or ``failed``. error: why it failed, or None.
        phases: per-phase numbers (:func:`spectune.validate.phases.summarize_run`, annotated). overall: the same
            over the whole run.
        t0: perf_counter s of the run's first send (requests.jsonl ``send_time - t0`` gives the phase); None for a
            run that measured nothing (then ``switches_source``, ``model``, ``base_url``, ``warmup`` are not
            written).
        switches_source: where num_steps switches were counted. model, base_url: what was sent where.
        stop_reason: why the run ended (None: not written for a run whose server never came up).
        warmup: ``{"requests": N, "failed": M}``. log_tail: the server log's last lines (failed start), or None.
        extra: keys of a newer format. absent: fields an older file lacked (not written back).
    """

    run: str
    steps: int
    repeat: int
    started: str
    status: str = "ok"
    error: str | None = None
    phases: list[RunWindow] = field(default_factory=list)
    overall: RunWindow = field(default_factory=dict)
    log_tail: str | None = None
    switches_source: str | None = None
    model: str | None = None
    base_url: str | None = None
    stop_reason: str | None = None
    t0: float | None = None
    warmup: Warmup | None = None
    finished: str | None = None
    extra: JsonObject = field(default_factory=dict)
    #: fields the file it was read from lacked (an older format) -> the value filled in: left out again by
    #: :meth:`to_dict` while they keep that value
    absent: dict[str, object] = field(default_factory=dict, repr=False, compare=False)

    @property
    def measured(self) -> bool:
        """True when the run sent its workload (it has ``t0``)."""
        return self.t0 is not None

    def to_dict(self) -> RunEntry:
        """The validate.json ``runs`` entry, keys in the file's order (module docstring)."""
        d: RunEntry = {"run": self.run, "steps": self.steps, "repeat": self.repeat, "started": self.started,
                     "status": self.status, "error": self.error, "phases": self.phases,
                     "overall": self.overall}
        if self.measured:
            d.update(switches_source=self.switches_source, model=self.model, base_url=self.base_url,
                     stop_reason=self.stop_reason, t0=self.t0, warmup=self.warmup)
        else:
            if self.log_tail is not None:
                d["log_tail"] = self.log_tail
            if self.stop_reason is not None:
                d["stop_reason"] = self.stop_reason
        if self.finished is not None:
            d["finished"] = self.finished
        d.update(self.extra)
        if self.absent:
            d = {k: v for k, v in d.items() if k not in self.absent or v != self.absent[k]}
        return d

    @classmethod
    def from_dict(cls, obj: RunEntry) -> ValidateRun:
        """A validate.json ``runs`` entry as a record (unknown keys kept in ``extra``).

        Raises:
            TypeError: the entry lacks ``run``, ``steps`` or ``started``.
        """
        names = {f.name for f in dataclasses.fields(cls)} - {"extra", "absent"}
        known = {k: v for k, v in obj.items() if k in names}
        known.setdefault("repeat", 1)
        record = cls(**known, extra={k: v for k, v in obj.items() if k not in names})
        record.absent = {name: copy.deepcopy(getattr(record, name)) for name in names - set(obj)}
        return record
