"""TensorRT-LLM's file: ``trtllm-speculative-config.json``, the ``speculative_config`` fields ``max_draft_len`` and
``draft_len_schedule`` in the form a release reads (:mod:`spectune.backends.num_steps.trtllm_schedule`).

Above the largest measured batch size the file keeps the last slot's draft length, as the vLLM and SGLang files do:
the lower-bound form does that by itself, the upper-bound form through its last key
(:data:`~spectune.backends.num_steps.trtllm_schedule.OPEN_END`), and one draft length for every batch size is
written as ``max_draft_len`` alone (no schedule: TensorRT-LLM drafts ``max_draft_len`` at every batch size)."""

from __future__ import annotations

from spectune.backends.formats.base import ConfigFile, EngineFormat, Plan
from spectune.backends.num_steps.trtllm_schedule import (
    OPEN_END,
    UPPER_BOUND_SINCE,
    build_schedule,
    check_schedule,
    schedule_form,
)
from spectune.core.json_types import JsonObject

FILE_NAME = "trtllm-speculative-config.json"


def trtllm_config(plan: Plan, version: str | None = None) -> JsonObject | None:
    """TensorRT-LLM's ``speculative_config`` fields ``{"max_draft_len": K1, "draft_len_schedule": {...}}`` in the
    form TensorRT-LLM ``version`` reads (None: the newest), :mod:`spectune.backends.num_steps.trtllm_schedule`.

    The ranges are the slots, the last open-ended: above the largest measured batch size (``plan.top``) every batch
    keeps the last slot's draft length, as in the vLLM file (vLLM carries its last range's K to larger batches).
    Upper-bound form (1.3.0rc8 on): keys are each slot's largest batch size, the last slot's key
    :data:`~spectune.backends.num_steps.trtllm_schedule.OPEN_END` (2**31 - 1, above every batch a server runs;
    TensorRT-LLM's validator bounds keys only from below). Lower-bound form (older): keys are the slots' lower
    bounds, the first 1; the last entry covers every larger batch. TensorRT-LLM requires the smallest key's draft
    length to equal ``max_draft_len``, so a slot asking for more drafts than the batch-size-1 slot is capped at its
    value (with a warning in ``plan.warnings``); neighbouring slots left with one draft length are merged. When one
    draft length covers every batch size, ``{"max_draft_len": K}`` alone: without ``draft_len_schedule``
    TensorRT-LLM drafts ``max_draft_len`` at every batch size (``get_draft_len_for_batch_size`` in
    ``tensorrt_llm/_torch/speculative/utils.py`` returns it for no schedule), in every release. None when the
    batch-size-1 slot does not speculate (TensorRT-LLM's EAGLE needs ``max_draft_len`` > 0).

    Raises:
        ValueError: ``version`` is not a version number.
    """
    form = schedule_form(version)
    if not plan.slots or plan.slots[0][2] == 0:
        return None
    first = plan.slots[0][2]
    ranges: list[tuple[int, int | None, int]] = []
    for i, (lower, upper, k) in enumerate(plan.slots):
        if k > first:
            plan.warnings.append(f"TensorRT-LLM: batch sizes from {lower} asked for {k} drafts, more than "
                                 f"batch size 1's {first}: capped at {first} (its schedule cannot exceed "
                                 "max_draft_len)")
            k = first
        upper = None if i == len(plan.slots) - 1 else upper
        if ranges and ranges[-1][2] == k:
            ranges[-1] = (ranges[-1][0], upper, k)
        else:
            ranges.append((lower, upper, k))
    if len(ranges) == 1:
        return {"max_draft_len": first}
    schedule = build_schedule(ranges, form)
    check_schedule(schedule, first, form)
    return {"max_draft_len": first, "draft_len_schedule": schedule}


def trtllm_description(config: JsonObject, version: str | None, top: int | None = None) -> str:
    """recommendation.md's line for ``trtllm-speculative-config.json``: how to use it, how its keys read and what it
    does above ``top``, the slot table's top (``plan.top``; None: unknown)."""
    head = "merge into TensorRT-LLM's `speculative_config` (add `decoding_type` and `speculative_model`); "
    above = f"above {top}" if top else "above the measured range"
    if "draft_len_schedule" not in config:
        k = config["max_draft_len"]
        return (head + f"`max_draft_len` alone, no `draft_len_schedule`: every batch size drafts {k} "
                f"token{'' if k == 1 else 's'}, {above} too, as in the vLLM file, in every TensorRT-LLM release")
    named = f"TensorRT-LLM {version}" if version else "the newest TensorRT-LLM"
    if schedule_form(version) == "upper":
        return (head + f"written for {named}: each key is the LARGEST batch size of its range (the form of "
                f"{UPPER_BOUND_SINCE} on); the last key, {OPEN_END} (2**31 - 1), covers every batch a server runs, so "
                f"batch sizes {above} keep the last range's draft length, as in the vLLM file; for an older release "
                "rerun with `--trtllm-version`")
    return (head + f"written for {named}: each key is the SMALLEST batch size of its range (the form before "
            f"{UPPER_BOUND_SINCE}); the last entry also covers larger batches, so batch sizes {above} keep its "
            "draft length, as in the vLLM file")


class TRTLLMFormat(EngineFormat):
    """``trtllm-speculative-config.json`` for the release ``plan.versions["trtllm"]`` (None: the newest)."""

    engine = "trtllm"
    file_name = FILE_NAME

    def write(self, plan: Plan) -> list[ConfigFile]:
        version = plan.versions.get(self.engine)
        trtllm = trtllm_config(plan, version)
        if trtllm is None:
            return []
        return [ConfigFile(FILE_NAME, trtllm, trtllm_description(trtllm, version, plan.top or None))]
