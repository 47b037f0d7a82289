"""TensorRT-LLM's file: ``trtllm-speculative-config.json``, the ``speculative_config`` fields ``max_draft_len`` and
``draft_len_schedule`` in the form a release reads (:mod:`spectune.backends.num_steps.trtllm_schedule`)."""

from __future__ import annotations

from typing import Any, Mapping

from spectune.backends.formats.base import ConfigFile, EngineFormat, Plan
from spectune.backends.num_steps.trtllm_schedule import UPPER_BOUND_SINCE, build_schedule, check_schedule, schedule_form

FILE_NAME = "trtllm-speculative-config.json"


def trtllm_config(plan: Plan, version: str | None = None) -> dict[str, Any] | None:
    """TensorRT-LLM's ``speculative_config`` fields ``{"max_draft_len": K1, "draft_len_schedule": {...}}`` in the
    form TensorRT-LLM ``version`` reads (None: the newest), :mod:`spectune.backends.num_steps.trtllm_schedule`.

    The ranges are the slots, the last ending at ``plan.top`` (``max_batch_size``, default: the largest measured
    concurrency), as for vLLM. Upper-bound form (1.3.0rc8 on): keys are each slot's largest batch size, and batch
    sizes above the last key run no drafts. Lower-bound form (older): keys are the slots' lower bounds, the first 1.
    TensorRT-LLM requires the smallest key's draft length to equal ``max_draft_len``, so a slot asking for more
    drafts than the batch-size-1 slot is capped at its value (with a warning in ``plan.warnings``). None when the
    batch-size-1 slot does not speculate (TensorRT-LLM's EAGLE needs ``max_draft_len`` > 0).

    Raises:
        ValueError: ``version`` is not a version number.
    """
    form = schedule_form(version)
    if not plan.slots or plan.slots[0][2] == 0:
        return None
    first = plan.slots[0][2]
    last = max(plan.top, plan.slots[-1][0])
    ranges = []
    for lower, upper, k in plan.slots:
        if k > first:
            plan.warnings.append(f"TensorRT-LLM: batch sizes from {lower} asked for {k} drafts, more than "
                                 f"batch size 1's {first}: capped at {first} (its schedule cannot exceed "
                                 "max_draft_len)")
            k = first
        ranges.append((lower, upper if upper is not None else last, k))
    schedule = build_schedule(ranges, form)
    check_schedule(schedule, first, form)
    return {"max_draft_len": first, "draft_len_schedule": schedule}


def trtllm_description(config: Mapping[str, Any], version: str | None) -> str:
    """recommendation.md's line for ``trtllm-speculative-config.json``: how to use it and how its keys read."""
    head = "merge into TensorRT-LLM's `speculative_config` (add `decoding_type` and `speculative_model`); "
    named = f"TensorRT-LLM {version}" if version else "the newest TensorRT-LLM"
    if schedule_form(version) == "upper":
        top = max(int(k) for k in config["draft_len_schedule"])
        return (head + f"written for {named}: each key is the LARGEST batch size of its range (the form of "
                f"{UPPER_BOUND_SINCE} on); batch sizes above {top} run no drafts; for an older release rerun "
                "with `--trtllm-version`")
    return (head + f"written for {named}: each key is the SMALLEST batch size of its range (the form before "
            f"{UPPER_BOUND_SINCE}); the last entry also covers larger batches")


class TRTLLMFormat(EngineFormat):
    """``trtllm-speculative-config.json`` for the release ``plan.versions["trtllm"]`` (None: the newest)."""

    engine = "trtllm"
    file_name = FILE_NAME

    def write(self, plan: Plan) -> list[ConfigFile]:
        version = plan.versions.get(self.engine)
        trtllm = trtllm_config(plan, version)
        if trtllm is None:
            return []
        return [ConfigFile(FILE_NAME, trtllm, trtllm_description(trtllm, version))]
