"""The draft trainers' learning-rate schedule (spectune.draft.schedule.warmup_cosine): linear warm-up, cosine decay to
a floor."""

from __future__ import annotations

import pytest

from spectune.draft.schedule import warmup_cosine


def test_the_warm_up_rises_linearly_to_the_peak() -> None:
    assert [warmup_cosine(s, 100, 1.0, 4) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]


def test_the_decay_starts_at_the_peak() -> None:
    assert warmup_cosine(4, 100, 2.0, 4) == pytest.approx(2.0)


def test_the_decay_is_halfway_at_the_middle_of_the_remaining_steps() -> None:
    assert warmup_cosine(52, 100, 1.0, 4, floor=0.2) == pytest.approx(0.6)


def test_the_rate_rests_at_the_floor_past_the_last_step() -> None:
    assert warmup_cosine(150, 100, 1.0, 4, floor=0.1) == pytest.approx(0.1)


def test_no_warm_up_step_is_refused() -> None:
    with pytest.raises(ValueError, match="warmup"):
        warmup_cosine(0, 100, 1.0, 0)
