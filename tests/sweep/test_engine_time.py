"""A window's engine time and engine warnings (spectune.measure.engine_time) from two snapshots of the engine's counters,
and the warnings kept with the point."""

from __future__ import annotations

import pytest

from spectune.backends.snapshots import SpecSnapshot
from spectune.measure.engine_time import engine_time, engine_warnings
from spectune.results.point import SweepPoint


def _snap(rounds: float, decode_s: float, prefill_s: float) -> SpecSnapshot:
    return SpecSnapshot(0.0, raw={"decode_rounds": rounds, "decode_seconds": decode_s, "prefill_seconds": prefill_s})


def test_the_mean_round_is_the_windows_decode_time_over_its_rounds() -> None:
    assert engine_time(_snap(10, 1.0, 0.5), _snap(20, 1.1, 0.8)).round_ms == pytest.approx(10.0)


def test_the_prefill_share_is_of_the_windows_busy_time() -> None:
    assert engine_time(_snap(10, 1.0, 0.5), _snap(20, 1.1, 0.8)).prefill_share == pytest.approx(0.75)


def test_no_rounds_leaves_the_mean_round_empty() -> None:
    assert engine_time(_snap(10, 1.0, 0.5), _snap(10, 1.0, 0.9)).round_ms is None


def test_the_mean_rows_are_the_windows_decode_rows_over_its_rounds() -> None:
    before, after = _snap(10, 1.0, 0.5), _snap(20, 1.1, 0.8)
    before.raw["decode_rows"], after.raw["decode_rows"] = 30, 66
    assert engine_time(before, after).round_rows == pytest.approx(3.6)


def test_an_engine_that_counts_no_rows_leaves_the_mean_rows_empty() -> None:
    assert engine_time(_snap(10, 1.0, 0.5), _snap(20, 1.1, 0.8)).round_rows is None


def test_an_engine_without_time_counters_gives_none() -> None:
    assert engine_time(SpecSnapshot(0.0), SpecSnapshot(1.0)) is None


def test_a_restarted_engine_gives_none() -> None:
    assert engine_time(_snap(10, 1.0, 0.5), _snap(2, 0.1, 0.1)) is None


def _said(*messages: str) -> SpecSnapshot:
    return SpecSnapshot(0.0, raw={"engine_warnings": list(messages)})


def test_a_window_holds_the_engine_warnings_said_during_it() -> None:
    assert engine_warnings(_said("a"), _said("a", "b")) == ["b"]


def test_a_window_without_new_warnings_holds_none() -> None:
    assert engine_warnings(_said("a"), _said("a")) == []


def test_an_engine_that_says_nothing_gives_no_warnings() -> None:
    assert engine_warnings(SpecSnapshot(0.0), SpecSnapshot(1.0)) == []


def test_a_point_keeps_its_engine_warnings_through_points_jsonl() -> None:
    point = SweepPoint.failed((2, 1, 0), "x", 4)
    point.engine_warnings = ["decode rounds at batch 1 x num_steps 2: ..."]
    assert SweepPoint.from_dict(point.to_dict()).engine_warnings == point.engine_warnings


def test_a_point_without_engine_warnings_writes_no_key() -> None:
    assert "engine_warnings" not in SweepPoint.failed((2, 1, 0), "x", 4).to_dict()
