"""Where an engine's time went in one window: the mean decode round and the share of its busy time spent on prefill.

Read from two snapshots' engine time counters (``SpecSnapshot.raw``,
:data:`~spectune.backends.snapshots.ENGINE_TIME_KEYS`: the bundled engine's ``spectune:engine_*`` counters,
``backends/local/server/metrics.py``). A cell whose throughput does not follow the decode step (the H200 example's
concurrency 128 and 512) shows it here: rounds as fast as the step table says, but most of the engine's time in prefill.
"""

from __future__ import annotations

from typing import NamedTuple

from spectune.backends.snapshots import ENGINE_TIME_KEYS, SpecSnapshot


class EngineTime(NamedTuple):
    """A window's engine time.

    Attributes:
        round_ms: mean wall time of a decode round (one verify of the running batch, its drafts and draft extend), ms.
        prefill_share: prefill forwards' wall time / (prefill + decode rounds' wall time), 0..1.
    """

    round_ms: float | None
    prefill_share: float | None


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
    return EngineTime(d["decode_seconds"] / d["decode_rounds"] * 1e3 if d["decode_rounds"] else None,
                      d["prefill_seconds"] / busy if busy > 0 else None)


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
