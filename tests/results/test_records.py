"""The typed records of the results folder: a points.jsonl line and a validate.json run read and written back
unchanged (keys and their order), for the shipped example folders (several spectune versions wrote them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectune.results.point import SweepPoint
from spectune.results.schema import SUMMARY_COLUMNS, point_key, summary_row
from spectune.results.validate_run import RunWindow, ValidateRun
from spectune.sweep.run import failed_point

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
POINT_FILES = sorted(EXAMPLES.glob("*/*/points.jsonl"))
VALIDATE_FILES = sorted(EXAMPLES.glob("*/*/validate.json"))


@pytest.mark.parametrize("path", POINT_FILES, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_points_round_trip_byte_for_byte(path):
    lines = path.read_text().splitlines()
    assert lines
    for line in lines:
        obj = json.loads(line)
        assert json.dumps(SweepPoint.from_dict(obj).to_dict()) == json.dumps(obj)


@pytest.mark.parametrize("path", VALIDATE_FILES, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_validate_runs_round_trip_byte_for_byte(path):
    runs = json.loads(path.read_text())["runs"]
    assert runs
    for obj in runs:
        assert json.dumps(ValidateRun.from_dict(obj).to_dict()) == json.dumps(obj)


def test_failed_point_keeps_the_first_release_key_order():
    d = failed_point((2, 4, 1), "server for num_steps 2 exited", 16, "boom").to_dict()
    assert list(d) == ["steps", "concurrency", "repeat", "status", "error", "metrics", "acceptance", "batch_size",
                       "per_category", "window", "requests_planned", "stop_reason", "log_tail", "finished"]
    assert point_key(d) == (2, 4, 1)
    assert d["stop_reason"] == "server_start_failed"


def test_record_summary_row_matches_the_dict_one():
    point = SweepPoint.failed((1, 2, 0), "no model", 8, stop_reason="no_model")
    row = point.summary_row()
    assert list(row) == list(SUMMARY_COLUMNS)
    assert row == summary_row(point.to_dict())


def test_unknown_keys_of_a_newer_file_are_kept_last():
    obj = {**failed_point((0, 1, 0), "x", 4).to_dict(), "future_field": [1, 2]}
    point = SweepPoint.from_dict(obj)
    assert point.extra == {"future_field": [1, 2]}
    assert list(point.to_dict())[-1] == "future_field"


def test_measured_validate_run_key_order():
    run = ValidateRun("static:2", 2, 1, "t", "ok", None, [], RunWindow.empty(), switches_source="none", model="m",
                      base_url="http://x", stop_reason="max_duration", t0=1.5, warmup={"requests": 1, "failed": 0},
                      finished="t2")
    assert list(run.to_dict()) == ["run", "steps", "repeat", "started", "status", "error", "phases", "overall",
                                   "switches_source", "model", "base_url", "stop_reason", "t0", "warmup", "finished"]


def test_a_field_an_older_file_lacked_is_written_once_it_is_set():
    old = {k: v for k, v in failed_point((1, 1, 0), "x", 4).to_dict().items() if k != "log_tail"}
    point = SweepPoint.from_dict(old)
    assert "log_tail" not in point.to_dict()
    assert "timing" not in point.to_dict()
    point.timing = {"switch_s": 0.0, "measure_s": 1.0}
    assert point.to_dict()["timing"] == {"switch_s": 0.0, "measure_s": 1.0}
