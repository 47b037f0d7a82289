"""TensorRT-LLM's per-batch-size draft length, ``speculative_config.draft_len_schedule``: its two meanings, by release.

``draft_len_schedule`` is a ``{batch size: draft length}`` mapping (JSON keys are strings; TensorRT-LLM's pydantic
field ``Optional[dict[int, int]]`` converts them). What a key means changed:

- **Lower bounds** (releases before 1.3.0rc8; the two-model drafter's ``Drafter.get_draft_len_for_batch_size`` in
  ``tensorrt_llm/_torch/speculative/drafter.py``, ``bisect_right``): a batch of size b uses the entry with the
  largest key <= b, so the last entry also covers every larger batch. ``DecodingBaseConfig``'s validator
  (``tensorrt_llm/llmapi/llm_args.py``, ``validate_draft_len_schedule_and_sort``) requires key 1 and
  ``schedule[1] == max_draft_len``.
- **Upper bounds** (from 1.3.0rc8: PR #10860 "Dynamic draft length on spec decode one-model path", merged
  2026-03-13 and listed in the v1.3.0rc8 release notes of 2026-03-17; v1.3.0rc7 of 2026-03-10 predates it):
  ``get_draft_len_for_batch_size`` in ``tensorrt_llm/_torch/speculative/utils.py`` takes the first key >= b
  (``bisect_left``): "values represent draft_len to use for batch sizes UP TO that key". A batch larger than every
  key runs ``min_draft_len`` drafts (0 for EAGLE-3: its one-model path keeps the drafter warm at draft length 0;
  modes that need a floor use ``min_runtime_draft_len`` 1). The validator no longer requires key 1; it requires
  ``schedule[smallest key] == max_draft_len``. Both forms: keys >= 1, draft lengths >= 0 and <= ``max_draft_len``.

So ``{"1": 1, "3": 0}`` (lower bounds: batch 1-2 draft 1, 3+ none) reads, to a current TensorRT-LLM, as batch 1
drafts 1, batch 2-3 none. :func:`schedule_form` picks the form for a TensorRT-LLM version; :func:`build_schedule`
writes slots in it; :func:`draft_len_for_batch_size` restates both lookups and :func:`config_draft_len` the lookup
of a whole ``speculative_config`` (checked against TensorRT-LLM's own functions by
``tests/backends/test_trtllm_contract.py``).

Above the measured range spectune's files keep the last range's draft length in every engine (vLLM carries its last
range's K to larger batches, SGLang's slot keys are lower bounds). The lower-bound form does that by itself. The
upper-bound form would drop to ``min_draft_len`` above its largest key, so the open-ended last range is written with
the key :data:`OPEN_END`: the validator bounds keys only from below (``>= 1``; nothing compares them with
``max_batch_size``), the lookup only compares them with the batch size, and the CUDA-graph plan
(``_compute_dynamic_draft_len_mapping``, ``tensorrt_llm/_torch/pyexecutor/model_engine.py``, on main moved to the
decoder runner) gives each captured batch size the entry of the first key >= it and captures none above
``max_batch_size``. A schedule of one range
(one draft length at every batch size) is not written at all: without ``draft_len_schedule``
``get_draft_len_for_batch_size`` returns ``max_draft_len`` and the executor (``tensorrt_llm/_torch/pyexecutor/
py_executor.py``) does not consult a schedule, so every batch drafts ``max_draft_len`` (``Drafter.
should_use_spec_decode`` in ``tensorrt_llm/_torch/speculative/drafter.py`` keeps speculation on when
``max_concurrency`` is unset), in either form's releases.
"""

from __future__ import annotations

import bisect
from typing import Literal, Mapping, Sequence

from spectune.core.json_types import JsonObject

Form = Literal["lower", "upper"]

UPPER_BOUND_SINCE = "1.3.0rc8"
"""The first TensorRT-LLM release whose ``draft_len_schedule`` keys are upper bounds (see the module docstring)."""
OPEN_END = 2**31 - 1
"""The upper-bound form's key for an open-ended last range (every batch size from its lower bound up): the largest
32-bit signed integer, TensorRT-LLM's C++ size type (``SizeType32`` in ``cpp/include/tensorrt_llm/executor/
types.h``), above every batch a server runs (at most ``max_batch_size`` x ``pipeline_parallel_size`` active
requests, ``get_max_num_sequences`` in ``tensorrt_llm/_torch/pyexecutor/model_engine.py``; ``max_batch_size``
defaults to 2048, ``BaseLlmArgs`` in ``tensorrt_llm/llmapi/llm_args.py``). The validator puts no upper bound on keys
(module docstring)."""
NEWEST_KNOWN = "1.4.0rc1"
"""The newest TensorRT-LLM release checked (registry upload 2026-10-21); ``None`` as a version means this one."""


def schedule_form(version: str | None) -> Form:
    """The ``draft_len_schedule`` form TensorRT-LLM ``version`` reads: ``"upper"`` from :data:`UPPER_BOUND_SINCE`
    on (and for ``None``: the newest), ``"lower"`` before. Versions compare as PEP 440 (``1.3.0rc7`` < ``1.3.0rc8``
    < ``1.3.0``; a leading ``v`` is allowed).

    Raises:
        ValueError: ``version`` is not a version number.
    """
    if version is None:
        return "upper"
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(version.strip().lstrip("vV"))
    except InvalidVersion:
        raise ValueError(f"TensorRT-LLM version {version!r} is not a version number; write e.g. 1.3.0rc8 or "
                         "1.2.1") from None
    return "upper" if v >= Version(UPPER_BOUND_SINCE) else "lower"


def draft_len_for_batch_size(schedule: Mapping[int, int], batch_size: int, form: Form,
                             min_draft_len: int = 0) -> int:
    """Draft length TensorRT-LLM runs at ``batch_size`` (requests) under ``schedule`` read in ``form``.

    ``"lower"``: the entry with the largest key <= batch_size (0 below every key, as TensorRT-LLM returns for a
    batch size < 1). ``"upper"``: the entry with the smallest key >= batch_size, floored at ``min_draft_len``;
    ``min_draft_len`` above every key.
    """
    keys = sorted(schedule)
    if form == "lower":
        i = bisect.bisect_right(keys, batch_size)
        return schedule[keys[i - 1]] if i else 0
    i = bisect.bisect_left(keys, batch_size)
    return max(schedule[keys[i]], min_draft_len) if i < len(keys) else min_draft_len


def config_draft_len(config: JsonObject, batch_size: int, form: Form, min_draft_len: int = 0) -> int:
    """Draft length TensorRT-LLM runs at ``batch_size`` under a written ``speculative_config`` ``config``
    (``{"max_draft_len": K, "draft_len_schedule": {...}}``, string or int keys) read in ``form``: ``max_draft_len``
    at every batch size when it has no ``draft_len_schedule`` (``get_draft_len_for_batch_size`` in
    ``tensorrt_llm/_torch/speculative/utils.py`` returns it for a schedule of None; the executor consults no
    schedule then), else :func:`draft_len_for_batch_size`."""
    schedule = config.get("draft_len_schedule")
    if schedule is None:
        return int(config["max_draft_len"])
    return draft_len_for_batch_size({int(k): int(v) for k, v in schedule.items()}, batch_size, form, min_draft_len)


def build_schedule(ranges: Sequence[tuple[int, int | None, int]], form: Form) -> dict[str, int]:
    """``draft_len_schedule`` (string keys, ascending) for inclusive batch-size ranges ``(lo, hi, draft_len)``; the
    last ``hi`` may be None: open-ended, every larger batch size.

    The ranges must be contiguous from batch size 1. ``"lower"``: key = each range's ``lo`` (the first is 1);
    batch sizes above the last range keep its draft length either way. ``"upper"``: key = each range's ``hi``, and
    :data:`OPEN_END` for an open-ended last range (so larger batches keep its draft length); batch sizes above a
    closed last ``hi`` run ``min_draft_len`` drafts (TensorRT-LLM's implicit tier).

    Raises:
        ValueError: ranges empty, not starting at 1, not contiguous, or open-ended before the last.
    """
    if not ranges or ranges[0][0] != 1:
        raise ValueError(f"draft_len_schedule ranges must start at batch size 1, got {list(ranges)!r}")
    for (_, hi, _), (lo, _, _) in zip(ranges, ranges[1:]):
        if hi is None or lo != hi + 1:
            raise ValueError(f"draft_len_schedule ranges must be contiguous, got {list(ranges)!r}")
    return {str(lo if form == "lower" else OPEN_END if hi is None else hi): k for lo, hi, k in ranges}


def check_schedule(schedule: Mapping[str, int], max_draft_len: int, form: Form) -> None:
    """TensorRT-LLM's ``validate_draft_len_schedule_and_sort`` rules for ``form`` (module docstring), restated: keys
    >= 1 (no upper bound), draft lengths in 0..``max_draft_len``, the first key's entry ``max_draft_len``.

    Raises:
        ValueError: one line naming the rule broken.
    """
    sched = {int(k): v for k, v in schedule.items()}
    if not sched:
        raise ValueError("draft_len_schedule is empty")
    if min(sched) < 1 or min(sched.values()) < 0 or max(sched.values()) > max_draft_len:
        raise ValueError(f"draft_len_schedule {dict(schedule)}: keys must be >= 1 and draft lengths in "
                         f"0..max_draft_len ({max_draft_len})")
    first = 1 if form == "lower" else min(sched)
    if first not in sched or sched[first] != max_draft_len:
        raise ValueError(f"draft_len_schedule {dict(schedule)}: TensorRT-LLM requires key {first} with draft "
                         f"length max_draft_len ({max_draft_len})")
