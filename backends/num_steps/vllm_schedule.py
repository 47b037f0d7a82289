"""vLLM's dynamic speculative decoding: the ``num_speculative_tokens_per_batch_size`` schedule and a static policy.

Format (source: ``vllm/v1/spec_decode/dynamic/utils.py``, ``validate_and_normalize_dynamic_sd_schedule``; field in
``vllm/config/speculative.py``): a list of ``[range_start, range_end, K]`` inclusive batch-size ranges; starts and
ends >= 1, start <= end, K >= 0 (0 = no speculation), ranges non-overlapping, the first starting at 1. vLLM sorts
the list itself; spectune requires it written sorted unless ``strict=False``. Lookup
(``build_dynamic_sd_schedule_lookup``, indexed by the number of scheduled requests, no CUDA-graph padding): a batch
size in a gap, or above the last range, uses the K of the nearest range below it; K is clamped to
``num_speculative_tokens`` (the maximum, used for buffer sizing). spectune rejects K > ``num_speculative_tokens``
instead of clamping silently, rejects non-integers (vLLM calls ``int()`` on each item) and does not support vLLM's
5-item context-bucketed entries ``[bs_lo, bs_hi, ctx_lo, ctx_hi, K]``.

:class:`SchedulePolicy` puts the schedule behind the same interface as
:class:`spectune.backends.num_steps.ema_policy.AdaptivePolicy` so an engine can run either.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from typing import Sequence


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class VllmRange:
    """One ``[start, end, k]`` schedule entry: batch sizes start..end (inclusive, requests) use K drafts."""

    start: int
    end: int
    k: int


@dataclass(frozen=True)
class VllmSchedule:
    """A validated vLLM ``num_speculative_tokens_per_batch_size`` schedule.

    Attributes:
        ranges: sorted, non-overlapping, the first starting at batch size 1.
        max_k: ``num_speculative_tokens`` when known (every K is <= it), else None.
        static: read from a speculative config without ``num_speculative_tokens_per_batch_size``: one range
            ``[1, 1, num_speculative_tokens]`` standing for a static server at that K (no dynamic mode).
    """

    ranges: tuple[VllmRange, ...]
    max_k: int | None = None
    static: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "_starts", [r.start for r in self.ranges])

    def range_index(self, batch_size: int) -> int:
        """Index of the range whose K applies to ``batch_size`` (gaps and sizes past the end: the range below)."""
        if not _is_int(batch_size) or batch_size < 1:
            raise ValueError(f"batch size must be an integer >= 1, got {batch_size!r}")
        return bisect.bisect_right(self._starts, batch_size) - 1  # type: ignore[attr-defined]

    def k_for_batch_size(self, batch_size: int) -> int:
        """num_speculative_tokens vLLM uses at ``batch_size`` (requests); raises ValueError for batch_size < 1."""
        return self.ranges[self.range_index(batch_size)].k

    def to_json(self) -> list[list[int]]:
        """The schedule in vLLM's format: ``[[start, end, k], ...]``."""
        return [[r.start, r.end, r.k] for r in self.ranges]


def parse_vllm_schedule(obj: object, *, max_k: int | None = None, strict: bool = True) -> VllmSchedule:
    """Validate a ``num_speculative_tokens_per_batch_size`` value (rules in the module docstring).

    Args:
        obj: the decoded JSON list of ``[range_start, range_end, K]``.
        max_k: ``num_speculative_tokens``; each K must be <= it (vLLM would clamp silently).
        strict: require the ranges written in ascending order (vLLM sorts them itself).

    Raises:
        ValueError: one line naming the entry and the fix.
    """
    if max_k is not None and (not _is_int(max_k) or max_k < 1):
        raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {max_k!r}")
    if not isinstance(obj, list) or not obj:
        raise ValueError(f"a vLLM schedule must be a non-empty list of [range_start, range_end, K], got {obj!r}")
    ranges = []
    for i, e in enumerate(obj):
        where = f"schedule entry {i} {json.dumps(e)}"
        if isinstance(e, (list, tuple)) and len(e) == 5:
            raise ValueError(f"{where}: 5-item context-bucketed entries are not supported; use [start, end, K]")
        if not isinstance(e, (list, tuple)) or len(e) != 3 or not all(_is_int(v) for v in e):
            raise ValueError(f"{where}: must be three integers [range_start, range_end, K]")
        start, end, k = e
        if start < 1 or start > end:
            raise ValueError(f"{where}: needs 1 <= range_start <= range_end (inclusive batch sizes)")
        if k < 0:
            raise ValueError(f"{where}: K must be >= 0 (0 = no speculation)")
        if max_k is not None and k > max_k:
            raise ValueError(f"{where}: K {k} exceeds num_speculative_tokens {max_k} (vLLM would clamp it to "
                             f"{max_k}); raise num_speculative_tokens or lower K")
        ranges.append(VllmRange(start, end, k))
    ordered = sorted(ranges, key=lambda r: r.start)
    if strict and ordered != ranges:
        raise ValueError("schedule ranges must be listed in ascending batch-size order; sort them by range_start")
    for prev, cur in zip(ordered, ordered[1:]):
        if cur.start <= prev.end:
            raise ValueError(f"schedule ranges [{prev.start}, {prev.end}] and [{cur.start}, {cur.end}] overlap; "
                             "make each range_start greater than the previous range_end")
    if ordered[0].start != 1:
        raise ValueError(f"the first schedule range starts at {ordered[0].start}, must start at batch size 1")
    return VllmSchedule(tuple(ordered), max_k)


def parse_vllm_speculative_config(obj: object, *, strict: bool = True) -> VllmSchedule:
    """Validate a vLLM ``--speculative-config`` object carrying a dynamic schedule, or a static one.

    Needs ``num_speculative_tokens`` (integer >= 1, the maximum K) and ``num_speculative_tokens_per_batch_size``;
    without the schedule key, a static server at ``num_speculative_tokens`` (``VllmSchedule.static``, one range
    ``[1, 1, K]``: K at every batch size). Other keys (method, model, ...) are ignored. Raises ValueError.
    """
    if not isinstance(obj, dict):
        raise ValueError(f"a vLLM speculative config must be a JSON object, got {type(obj).__name__}")
    if "num_speculative_tokens_per_batch_size" not in obj and "num_speculative_tokens" in obj:
        k = obj["num_speculative_tokens"]
        if not _is_int(k) or k < 1:
            raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {k!r}")
        return VllmSchedule((VllmRange(1, 1, k),), k, static=True)
    if "num_speculative_tokens_per_batch_size" not in obj:
        raise ValueError("vLLM speculative config has no 'num_speculative_tokens_per_batch_size' schedule")
    if "num_speculative_tokens" not in obj:
        raise ValueError("vLLM speculative config needs 'num_speculative_tokens' (the largest K in the schedule)")
    return parse_vllm_schedule(obj["num_speculative_tokens_per_batch_size"],
                               max_k=obj["num_speculative_tokens"], strict=strict)



class SchedulePolicy:
    """Static per-batch-size num_steps from a vLLM schedule, with :class:`AdaptivePolicy`'s interface.

    Args:
        schedule: the validated schedule; K is looked up from the unpadded batch size (as vLLM does).
    """

    def __init__(self, schedule: VllmSchedule) -> None:
        self.schedule = schedule
        self._current = schedule.ranges[0].k
        self.switch_count = 0
        """Verify batches whose range had a different K than the previous verify batch's."""
        self.num_batches = 0

    @property
    def candidate_steps(self) -> tuple[int, ...]:
        """Every K the schedule can select, ascending."""
        return tuple(sorted({r.k for r in self.schedule.ranges}))

    @property
    def max_steps(self) -> int:
        """The largest K (``num_speculative_tokens`` when the schedule carries it)."""
        return self.schedule.max_k if self.schedule.max_k is not None else max(self.candidate_steps)

    @property
    def current_steps(self) -> int:
        """K of the last verify batch (the first range's K before any)."""
        return self._current

    def steps_for_batch(self, batch_size: int) -> int:
        """num_steps (K) for a round at ``batch_size`` requests. Raises ValueError for batch_size < 1."""
        return self.schedule.k_for_batch_size(batch_size)

    def on_verify(self, accepted_drafts_per_req: Sequence[int], batch_size: int) -> int | None:
        """Note one verify batch; accepted drafts are ignored (the schedule is static).

        Returns:
            the new K when this batch size's range has a different K than the previous verify batch, else None.
        """
        self.num_batches += 1
        k = self.schedule.k_for_batch_size(batch_size)
        if k == self._current:
            return None
        self._current = k
        self.switch_count += 1
        return k
