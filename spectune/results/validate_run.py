"""A validate run as a typed record: :class:`ValidateRun` is one entry of validate.json's ``runs``.

The entry's keys and their order are those the first release wrote (docs/validate.md, docs/results-format.md), so
validate.json files written before and after this record read the same:

- a measured run: ``run``, ``steps``, ``repeat``, ``started``, ``status``, ``error``, ``phases``, ``overall``,
  ``switches_source``, ``model``, ``base_url``, ``stop_reason``, ``t0``, ``warmup``, ``finished``;
- a run whose server never came up: ``run`` ... ``overall``, ``log_tail``, ``finished``;
- a run whose warm-up ran past its limit: ``run`` ... ``overall``, ``stop_reason``, ``finished``.

Keys this version does not know are kept in ``extra`` and written last. :class:`ValidateRun` is the entry as the
record the validate modules read, :class:`RunWindow` one of its ``phases`` or its ``overall``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spectune.core.json_types import JsonObject, JsonValue
from spectune.results.open_record import LenientRecord, OrderedRecord

if TYPE_CHECKING:
    from spectune.results.point import Warmup

__all__ = ["ValidateRun", "RunWindow"]


@dataclass
class RunWindow(OrderedRecord):
    """The numbers of one window of a run: a ``phases`` entry (one phase) or ``overall`` (the whole run).

    :func:`spectune.validate.phases.summarize_run` gives ``phase`` (1-based, ``"all"`` for the whole run),
    ``start_s``, ``end_s`` (s from ``t0``), the request and token counts, tokens/s, the TPOT/TTFT percentiles (ms),
    ``slo_attainment`` (a fraction, None without SLOs) and, per phase, the steady window's ``settle_s`` and
    ``steady_output_throughput_tok_s``; the run adds ``label``, the acceptance and ``num_steps_switches``, per phase
    ``schedule_check``, and in ``overall`` the load generator's own figures. A window from older files lacks the
    keys added since; combined over repeats (:func:`spectune.validate.repeats.combine_repeats`) the numbers are
    means (counts: sums).

    Attribute names are the file's keys. :meth:`to_json` writes the keys the window has (:meth:`names`): those of
    the object it was read from (:meth:`from_json`; ``order``), in its order, then every attribute assigned since; a
    window built with the constructor has them all. Keys this version does not know are kept in ``extra`` and
    written last.
    """

    phase: int | str = "all"
    start_s: float = 0.0
    end_s: float = 0.0
    num_requests: int = 0
    num_failed: int = 0
    achieved_concurrency: float | None = None
    output_tokens: int = 0
    output_throughput_tok_s: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    slo_attainment: float | None = None
    settle_s: float | None = None
    steady_output_throughput_tok_s: float | None = None
    label: str | None = None
    acceptance_length: float | None = None
    acceptance_length_source: str | None = None
    num_steps_switches: float | None = None
    schedule_check: JsonObject | None = None
    dispatch_delay_p90_ms: float | None = None
    client_cpu_share: float | None = None
    client_limited: bool | None = None

    def __setattr__(self, name: str, value: object) -> None:
        """Assign ``name``; a window read from an object that lacked it has it from now on (at the end, as a new key
        ends a JSON object)."""
        object.__setattr__(self, name, value)
        order = self.__dict__.get("order")
        if order is not None and name in _WINDOW_FIELDS and name not in order:
            order.append(name)

    @classmethod
    def from_json(cls, obj: JsonObject) -> RunWindow:  # type: ignore[override]
        """A window as read from validate.json (or built by :func:`spectune.validate.phases.summarize_run`)."""
        return cls.read(obj)

    @classmethod
    def empty(cls) -> RunWindow:
        """A window with no numbers (``{}`` in the file: a run that measured nothing)."""
        return cls.from_json({})

    def to_json(self) -> JsonObject:
        """The window's object: the attributes it has, in order, then ``extra``."""
        return {**{k: getattr(self, k) for k in self.names()}, **self.extra}

    def __bool__(self) -> bool:
        """False for a window without numbers (as its object, ``{}``, reads)."""
        return bool(self.names() or self.extra)

    def has(self, name: str) -> bool:
        """True when the window has attribute ``name`` (it was read or assigned)."""
        return name in self.names()

    def names(self) -> list[str]:
        """The names of the attributes the window has, in order."""
        if self.order is None:
            return self.file_keys()
        return [k for k in self.order if k in _WINDOW_FIELDS]

    def numbers(self) -> dict[str, float | int | None]:
        """The window's numeric (or None) attributes it has, by name, in order (for means over repeats)."""
        return {name: v for name in self.names() if isinstance(v := getattr(self, name), (int, float, type(None)))
                and not isinstance(v, bool)}


_WINDOW_FIELDS = set(RunWindow.file_keys())


@dataclass
class ValidateRun(LenientRecord):
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
        repeats, throughput_by_repeat: an entry of :func:`spectune.validate.repeats.combine_repeats` over two or
            more repeats (the number of repeats, each repeat's overall output tok/s); None (not written) otherwise.
        node: ``--ray`` validations: the node the run ran on (kept in ``extra``, docs/results-format.md).
        extra: keys of a newer format. absent: fields an older file lacked (not written back).
    """

    run: str
    steps: int = 0
    repeat: int = 1
    started: str = ""
    status: str = "ok"
    error: str | None = None
    phases: list[RunWindow] = field(default_factory=list)
    overall: RunWindow = field(default_factory=lambda: RunWindow.empty())
    log_tail: str | None = None
    switches_source: str | None = None
    model: str | None = None
    base_url: str | None = None
    stop_reason: str | None = None
    t0: float | None = None
    warmup: Warmup | None = None
    finished: str | None = None
    repeats: int | None = None
    throughput_by_repeat: list[float | None] | None = None

    @property
    def measured(self) -> bool:
        """True when the run sent its workload (it has ``t0``)."""
        return self.t0 is not None

    @property
    def ok(self) -> bool:
        """True when the run finished (``status`` ``ok``)."""
        return self.status == "ok"

    @property
    def throughput(self) -> float | None:
        """The whole run's output tokens/s (``overall.output_throughput_tok_s``; None when not measured)."""
        return self.overall.output_throughput_tok_s

    @property
    def node(self) -> JsonValue:
        """A ``--ray`` run's node (None otherwise)."""
        return self.extra.get("node")

    def to_dict(self) -> JsonObject:
        """The validate.json ``runs`` entry, keys in the file's order (module docstring)."""
        d: JsonObject = {"run": self.run, "steps": self.steps, "repeat": self.repeat, "started": self.started,
                         "status": self.status, "error": self.error, "phases": [w.to_json() for w in self.phases],
                         "overall": self.overall.to_json()}
        if self.measured:
            d.update(switches_source=self.switches_source, model=self.model, base_url=self.base_url,
                     stop_reason=self.stop_reason, t0=self.t0, warmup=self.warmup)  # type: ignore[arg-type]
        else:
            if self.log_tail is not None:
                d["log_tail"] = self.log_tail
            if self.stop_reason is not None:
                d["stop_reason"] = self.stop_reason
        if self.finished is not None:
            d["finished"] = self.finished
        if self.repeats is not None:
            d.update(repeats=self.repeats, throughput_by_repeat=self.throughput_by_repeat)  # type: ignore[arg-type]
        d.update(self.extra)
        return self.without_absent(d)

    @classmethod
    def from_dict(cls, obj: JsonObject) -> ValidateRun:
        """A validate.json ``runs`` entry as a record (unknown keys kept in ``extra``; a key it lacks takes the
        attribute's default and is not written back by :meth:`to_dict`).

        Raises:
            TypeError: the entry lacks ``run``.
        """
        known, extra = cls.split(obj)
        known["phases"] = [RunWindow.from_json(w) for w in known.get("phases") or []]  # type: ignore[union-attr]
        if "overall" in known:
            known["overall"] = RunWindow.from_json(known["overall"] or {})  # type: ignore[arg-type]
        record = cls(**known, extra=extra)  # type: ignore[arg-type]
        record.note_absent(obj)
        return record


def runs_of(meta: JsonObject) -> list[ValidateRun]:
    """validate.json's ``runs`` (one entry per run and repeat, in the order they finished) as records."""
    return [ValidateRun.from_dict(r) for r in meta.get("runs") or []]  # type: ignore[union-attr, arg-type]
