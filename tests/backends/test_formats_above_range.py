"""One recommendation, one behaviour: for the same :class:`~spectune.backends.formats.Plan` the vLLM file and the
TensorRT-LLM file (both ``draft_len_schedule`` forms) give every batch size the same K, inside the slot table and
above it (2x and 10x its top, where vLLM carries its last range's K and TensorRT-LLM's upper-bound form would fall
to ``min_draft_len`` above its largest key), for a schedule, a schedule ending without speculation and a static
answer (one K at every batch size: TensorRT-LLM's file has no schedule then).

Each file is read the way its engine reads it: vLLM's through
:func:`spectune.backends.num_steps.vllm_schedule.parse_vllm_speculative_config` (``build_dynamic_sd_schedule_lookup``;
a static answer's file has no schedule, ``num_speculative_tokens`` at every batch size),
TensorRT-LLM's through :func:`spectune.backends.num_steps.trtllm_schedule.config_draft_len`
(``get_draft_len_for_batch_size``)."""

from __future__ import annotations

import pytest

from spectune.backends.formats import Plan
from spectune.backends.formats.trtllm import trtllm_config
from spectune.backends.formats.vllm import vllm_config
from spectune.backends.num_steps.trtllm_schedule import config_draft_len, schedule_form
from spectune.backends.num_steps.vllm_schedule import parse_vllm_speculative_config

TOP = 32
"""The slot table's top: the largest measured concurrency."""

PLANS = {
    "schedule": [(1, 2, 3), (3, 15, 2), (16, None, 1)],
    "schedule ending without speculation": [(1, 4, 2), (5, None, 0)],
    "static": [(1, None, 1)],
}
VERSIONS = [None, "1.2.1"]  # the newest (upper-bound keys) and a release before 1.3.0rc8 (lower-bound keys)
WHERE = {"inside the range": range(1, TOP + 1), "at 2x the top": [2 * TOP], "at 10x the top": [10 * TOP]}


def lookups(slots: list, version: str | None) -> tuple:
    """(vLLM's K, TensorRT-LLM's draft length) as functions of the batch size, for the files of one Plan."""
    vllm = vllm_config(Plan(slots=slots, top=TOP))
    trtllm = trtllm_config(Plan(slots=slots, top=TOP), version)
    schedule = parse_vllm_speculative_config(vllm)
    return schedule.k_for_batch_size, lambda b: config_draft_len(trtllm, b, schedule_form(version))


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("plan", PLANS)
def test_vllm_and_trtllm_files_give_the_same_k(plan, version, where):
    vllm, trtllm = lookups(PLANS[plan], version)
    assert {b: (vllm(b), trtllm(b)) for b in WHERE[where] if vllm(b) != trtllm(b)} == {}


@pytest.mark.parametrize("version", VERSIONS)
def test_above_the_range_both_files_keep_the_last_slots_k(version):
    vllm, trtllm = lookups(PLANS["schedule"], version)
    assert (vllm(10 * TOP), trtllm(10 * TOP)) == (1, 1)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_static_answer_is_max_draft_len_without_a_schedule(version):
    assert trtllm_config(Plan(slots=PLANS["static"], top=TOP), version) == {"max_draft_len": 1}
