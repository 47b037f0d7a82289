"""summary.csv's columns, written down once (docs/results-format.md): the writer
(:mod:`spectune.results.folder`) writes them in this order and the reader (:mod:`spectune.results.reader`) types
them from the same lists.

A row is one point: its key (num_steps, concurrency, repeat), status, the load generator's metrics
(:data:`spectune.loadgen.metrics.STREAM_COLUMNS` then :data:`~spectune.loadgen.metrics.SLO_CLIENT_COLUMNS`), with the
acceptance columns between the two groups, the engine's batch size over the window, and the derived
``acceptance_vs_c1`` (:func:`spectune.results.batch_acceptance.acceptance_vs_c1`).
"""

from __future__ import annotations

import datetime as _dt
from typing import NamedTuple

from spectune.core.json_types import JsonObject
from spectune.loadgen.metrics import SLO_CLIENT_COLUMNS, STREAM_COLUMNS

class PointKey(NamedTuple):
    """The key of one sweep point: a tuple ``(steps, concurrency, repeat)`` with named fields, so it hashes, compares,
    sorts, pickles and serialises to JSON (a 3-element list) as the bare tuple does.

    Attributes:
        steps: num_steps K (0 = no speculation). concurrency: closed-loop requests in flight (>= 1).
        repeat: 0-based run of the (K, concurrency) cell.
    """

    steps: int
    concurrency: int
    repeat: int = 0

    @property
    def cell(self) -> tuple[int, int]:
        """``(steps, concurrency)``: the cell the point is one run of."""
        return self.steps, self.concurrency


Key = PointKey
"""The point key type (:class:`PointKey`)."""

KEY_COLUMNS = ("steps", "concurrency", "repeat")
STATUS_COLUMNS = ("status", "error")
ACCEPTANCE_COLUMNS = ("acceptance_length", "acceptance_rate", "acceptance_length_source")
BATCH_SIZE_COLUMNS = ("batch_size_mean", "batch_size_p50", "batch_size_source")
DERIVED_COLUMNS = ("acceptance_vs_c1",)
INTERVAL_COLUMNS = ("output_throughput_ci_low", "output_throughput_ci_high", "tpot_p50_ci_low", "tpot_p50_ci_high")
"""95% percentile-bootstrap bounds of the point's output throughput (tokens/s) and TPOT p50 (ms): over its requests
for a measured point, the model's prediction interval for a predicted cell (:mod:`spectune.results.confidence`,
:mod:`spectune.sweep.guided`)."""
PLAN_COLUMNS = ("predicted",)
"""True for a cell the guided plan predicted instead of measuring (``spectune sweep --plan guided``)."""

EARLY_STOP_COLUMNS = ("stopped_early", "early_stop_reason")
"""Whether the point's window stopped before its planned requests because the decision it served was settled
(``--early-stop``; :mod:`spectune.sweep.sequential`) and why (``below_best``, ``above_best``, ``futile``,
``within_band``, ``precise``, ``seed_acceptance``; empty when it ran its full window). Added after the first
release: a summary.csv without them reads as False / empty."""

SCHEDULE_COLUMNS = ("schedule_check",)
"""Whether the point's server drafted the num_steps it was given (points.jsonl ``schedule_check``;
:func:`spectune.measure.schedule_check.check_num_steps`): ``followed``, ``not_followed``, or empty where it could
not be checked (no spec-decode counters) or has no num_steps to follow (a draft-confidence cutoff's point). Added
after the first release: a summary.csv without it reads as empty."""

SCHEDULE_FOLDER = "schedule-server"
"""The sub-folder of a sweep's results folder that holds its schedule-server cells (a sweep folder of its own,
``spectune sweep --schedule-server``; docs/results-format.md)."""

SERVER_COLUMNS = ("server",)
"""Which server the point measured: ``static`` (the static server of its num_steps: K=0 has no drafter),
``schedule:M`` (the engine's schedule server pinned to K, with M the schedule's largest K; points.jsonl ``server``,
:class:`spectune.backends.base.ScheduleServer`) or ``p_min:P`` (a server drafting at most K tokens with the
draft-confidence cutoff P, ``spectune sweep --p-min``). Added after the first release: a summary.csv without it reads
as empty, which means ``static``."""

P_MIN_FOLDER = "p-min"
"""The sub-folder of a sweep's results folder that holds its draft-confidence cutoff cells (``spectune sweep
--p-min``): one sweep folder per cutoff P inside it, named :func:`p_min_folder_name` (docs/results-format.md)."""

P_MIN_COLUMNS = ("p_min",)
"""The draft-confidence cutoff P the point's server ran (points.jsonl ``server.p_min``; ``spectune sweep --p-min``),
empty for every other server. Added after the first release: a summary.csv without it reads as empty."""

ENGINE_TIME_COLUMNS = ("engine_round_ms", "engine_prefill_share", "engine_round_rows")
"""Where the engine's time went over the window, from its own counters (the bundled engine;
:mod:`spectune.measure.engine_time`): the mean decode round (ms), the share of its busy time in prefill (0..1) and
the mean rows of a decode round (requests). Empty for engines that count none. Added after the first release: a
summary.csv without them reads as empty."""

SUMMARY_COLUMNS: tuple[str, ...] = (*KEY_COLUMNS, *STATUS_COLUMNS, *STREAM_COLUMNS, *ACCEPTANCE_COLUMNS,
                                    *SLO_CLIENT_COLUMNS, *BATCH_SIZE_COLUMNS, *DERIVED_COLUMNS, *INTERVAL_COLUMNS,
                                    *PLAN_COLUMNS, *EARLY_STOP_COLUMNS, *SCHEDULE_COLUMNS, *SERVER_COLUMNS,
                                    *ENGINE_TIME_COLUMNS, *P_MIN_COLUMNS)
"""summary.csv columns, in file order."""

REQUIRED_COLUMNS = ("steps", "concurrency", "status")
"""Columns a summary must have to be read at all."""
TEXT_COLUMNS = ("status", "error", "acceptance_length_source", "token_count_source", "batch_size_source",
                "early_stop_reason", "schedule_check", "server")
"""Text columns (read as strings, empty for none)."""
FLAG_COLUMNS = ("client_limited", "predicted", "stopped_early")
"""True/False columns (read as written)."""
NUMERIC_COLUMNS: tuple[str, ...] = tuple(c for c in SUMMARY_COLUMNS
                                         if c not in (*KEY_COLUMNS, *TEXT_COLUMNS, *FLAG_COLUMNS))
"""Numeric columns (read as float, NaN for empty), in file order; the key columns are read as integers."""

def point_key(obj: JsonObject) -> Key | None:
    """(steps, concurrency, repeat) of a points.jsonl / requests.jsonl object, or None if it has none."""
    try:
        return PointKey(int(obj["steps"]), int(obj["concurrency"]), int(obj.get("repeat", 0)))
    except (KeyError, TypeError, ValueError):
        return None


def key_fields(key: Key) -> dict[str, int]:
    """``{"steps": K, "concurrency": c, "repeat": r}``: a point key as the leading fields of a points.jsonl /
    requests.jsonl object (the inverse of :func:`point_key`)."""
    return dict(zip(KEY_COLUMNS, key))


def summary_row(point: JsonObject) -> JsonObject:
    """One summary.csv row from a points.jsonl object (its keys, status, error and ``metrics``)."""
    row = {c: point.get("metrics", {}).get(c) for c in SUMMARY_COLUMNS}
    row.update({c: point.get(c) for c in (*KEY_COLUMNS, *STATUS_COLUMNS)})
    row["predicted"] = bool(point.get("predicted", False))
    why = (point.get("early_stop") or {}).get("reason")
    row["stopped_early"], row["early_stop_reason"] = bool(why), why or ""
    check = point.get("schedule_check")
    server = point.get("server") or {}
    kind = server.get("kind")
    if kind == "p_min":  # a cutoff shortens drafts by design: there is no K to follow (points.jsonl keeps the check)
        check = None
    row["schedule_check"] = "" if not check else ("followed" if check.get("followed") else "not_followed")
    row["server"] = (f"schedule:{server.get('max_k')}" if kind == "schedule" else
                     f"p_min:{server.get('p_min'):g}" if kind == "p_min" else "static")
    row["p_min"] = server.get("p_min") if kind == "p_min" else None
    return row


def p_min_folder_name(p_min: float) -> str:
    """The folder of cutoff ``p_min``'s cells inside :data:`P_MIN_FOLDER`: the value as ``%g`` writes it (``0.3``)."""
    return f"{p_min:g}"


def now_iso() -> str:
    """UTC time now, ISO 8601 to the second (the ``created``/``finished`` stamps)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
