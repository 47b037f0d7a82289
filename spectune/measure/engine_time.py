"""Where an engine's time went in one window: the mean decode round, its mean rows, and the share of its busy time
spent on prefill.

Read from two snapshots' engine time counters (``SpecSnapshot.raw``,
:data:`~spectune.backends.snapshots.ENGINE_TIME_KEYS`: the bundled engine's ``spectune:engine_*`` counters,
``backends/local/server/metrics.py``). A cell whose throughput does not follow the decode step (the H200 example's
concurrency 128 and 512) shows it here: rounds as fast as the step table says, but most of the engine's time in prefill.

The rows a decode round really ran are the engine's count, not the running-requests gauge's time average
(``batch_size_mean``): the gauge also counts a request while it waits for or runs its prefill, so at concurrency 4 in
a closed loop it reads 3.7-4.0 where the rounds ran 3.4-3.8 rows (the per-request example's sweep, rows counted from
its streamed chunks: ``benchmarks/simulate_vs_sweep.py``). Output tok/s of a window is rows x tokens per row-round /
round time, so a model of it takes the engine's rows.
"""

from __future__ import annotations

from typing import NamedTuple

from spectune.backends.snapshots import ENGINE_ROWS_KEY, ENGINE_TIME_KEYS, SpecSnapshot


class EngineTime(NamedTuple):
    """A window's engine time.

    Attributes:
        round_ms: mean wall time of a decode round (one verify of the running batch, its drafts and draft extend), ms.
        prefill_share: prefill forwards' wall time / (prefill + decode rounds' wall time), 0..1.
        round_rows: mean rows (requests) of a decode round, or None where the engine does not count them
            (:data:`~spectune.backends.snapshots.ENGINE_ROWS_KEY`).
    """

    round_ms: float | None
    prefill_share: float | None
    round_rows: float | None = None


def engine_time(before: SpecSnapshot | None, after: SpecSnapshot | None) -> EngineTime | None:
    """The window's :class:`EngineTime` between two snapshots, or None when either lacks the engine time counters
    or the engine reset between them (a counter went down)."""
    if before is None or after is None:
        return None
    try:
        d = {key: float(after.raw[key]) - float(before.raw[key])  # type: ignore[arg-type]
             for key in ENGINE_TIME_KEYS}
    except (KeyError, TypeError, ValueError):
        return None
    if min(d.values()) < 0:
        return None
    busy = d["decode_seconds"] + d["prefill_seconds"]
    rows: float | None = None
    try:
        rows = float(after.raw[ENGINE_ROWS_KEY]) - float(before.raw[ENGINE_ROWS_KEY])  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError):
        pass
    return EngineTime(d["decode_seconds"] / d["decode_rounds"] * 1e3 if d["decode_rounds"] else None,
                      d["prefill_seconds"] / busy if busy > 0 else None,
                      rows / d["decode_rounds"] if rows is not None and rows >= 0 and d["decode_rounds"] else None)


def engine_warnings(before: SpecSnapshot | None, after: SpecSnapshot | None) -> list[str]:
    """What the engine said about its own rounds during the window: the messages in ``after.raw["engine_warnings"]``
    that ``before`` did not hold (the bundled engine lists every shape it flagged since start, ``/server_info``
    ``step_model.warnings``); empty where the engine says nothing."""
    said = after.raw.get("engine_warnings") if after is not None else None
    if not isinstance(said, list):
        return []
    old = before.raw.get("engine_warnings") if before is not None else None
    seen = set(old) if isinstance(old, list) else set()
    return [str(m) for m in said if m not in seen]
