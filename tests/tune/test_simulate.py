"""Trace format (backends.num_steps.trace) and `spectune simulate` (spectune.tune.simulate + the CLI command)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spectune.backends.num_steps.sglang_config import parse_sglang_adaptive_config, parse_vllm_schedule
from spectune.backends.num_steps.trace import TraceStep, TraceWriter, read_trace, write_trace
from spectune.cli import app
from spectune.core.errors import UserError
from spectune.tune.simulate import Segment, Switch, simulate

# alpha 1 makes the EMA equal to the latest batch mean; a decision after every batch.
FAST = {"ema_alpha": 1.0, "warmup_batches": 0, "update_interval": 1}


def test_trace_round_trip_and_writer(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter(path, stamp_time=False) as w:
        w.record(2, [3, 1], 3)
        w.record(1, [0], 0, t=1.5)
    assert path.read_text().splitlines()[0] == '{"batch_size":2,"accepted_drafts":[3,1],"num_steps":3}'
    assert read_trace(path) == [TraceStep(2, (3, 1), 3), TraceStep(1, (0,), 0, 1.5)]
    with TraceWriter(path, append=True) as w:  # stamps t (s since open) by default
        w.record(1, [1], 1)
    steps = read_trace(path)
    assert len(steps) == 3
    assert steps[2].t is not None
    assert steps[2].t >= 0
    with pytest.raises(ValueError, match="entries must be integers in 0..num_steps=1"):
        TraceWriter(tmp_path / "x.jsonl").record(1, [2], 1)
    with pytest.raises(ValueError, match="must be integers"):
        TraceWriter(tmp_path / "y.jsonl").record(1, [0.5], 1)


@pytest.mark.parametrize("line,match", [
    ('{"batch_size": 2, "accepted_drafts": [1], "num_steps": 3}', "list of batch_size=2 integers"),
    ('{"batch_size": 1, "accepted_drafts": [4], "num_steps": 3}', "in 0..num_steps=3"),
    ('{"batch_size": 0, "accepted_drafts": [], "num_steps": 3}', "'batch_size' must be an integer >= 1"),
    ('{"batch_size": 1, "accepted_drafts": [0], "num_steps": -1}', "'num_steps' must be an integer >= 0"),
    ('{"batch_size": 1, "accepted_drafts": [0]}', "missing key.*'num_steps'"),
    ('{"batch_size": 1, "accepted": [0], "num_steps": 1}', "unknown key.*'accepted'"),
    ('{"batch_size": 1, "accepted_drafts": [0], "num_steps": 1, "t": "x"}', "'t' must be a number"),
    ('{"batch_size": 2, "accepted_drafts": [0, 0], "num_steps": 1, "request_ids": ["a"]}',
     "'request_ids' must be a list of batch_size=2 strings"),
    ('[1, 2]', "expected a JSON object"),
    ('{"batch_size": 1,', "not valid JSON"),
])
def test_read_trace_errors_name_file_and_line(tmp_path: Path, line: str, match: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"batch_size": 1, "accepted_drafts": [1], "num_steps": 1}\n\n' + line + "\n")
    with pytest.raises(UserError, match=f"bad.jsonl:3: .*{match}"):
        read_trace(path)


def test_trace_request_ids_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "ids.jsonl"
    with TraceWriter(path, stamp_time=False) as w:
        w.record(2, [1, 0], 2, request_ids=["chatcmpl-a", "chatcmpl-b"])
    assert read_trace(path)[0].request_ids == ("chatcmpl-a", "chatcmpl-b")


def test_read_trace_empty_or_missing(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(UserError, match="has no verify steps"):
        read_trace(tmp_path / "e.jsonl")
    with pytest.raises(UserError, match="cannot read trace"):
        read_trace(tmp_path / "none.jsonl")


def test_simulate_sglang_timeline_clipping_and_switches() -> None:
    cfg = parse_sglang_adaptive_config({**FAST, "1": {"candidate_steps": [1, 3]}})
    trace = [TraceStep(1, (3,), 3), TraceStep(1, (0,), 3), TraceStep(1, (3,), 3), TraceStep(1, (1,), 1)]
    res = simulate(cfg, trace, initial_steps=3)
    # step 0: k=3, EMA 3 -> stays. step 1: k=3, EMA 0 <= 0.25 -> switch to 1.
    # step 2: k=1, recorded 3 clipped to 1, EMA 1 > 0.5 -> switch to 3. step 3: k=3 above recorded 1, EMA 1.
    assert res.segments == [Segment(0, 1, "1", 3, 2.0, "start"), Segment(2, 2, "1", 1, 0.0, "switch"),
                            Segment(3, 3, "1", 3, 1.0, "switch")]
    assert res.switches == [Switch(1, "1", 3, 1, 0.0), Switch(2, "1", 1, 3, 1.0)]
    assert res.switch_count == 2
    assert res.steps_per_tier == {3: 3, 1: 1}
    assert (res.steps_clipped, res.steps_above_recorded) == (1, 1)
    assert res.acceptance_length == 1 + (3 + 0 + 1 + 1) / 4  # simulated accepted drafts: 3, 0, 1 (clipped), 1
    assert res.recorded_acceptance_length == 1 + (3 + 0 + 3 + 1) / 4
    assert res.final_slots == [{"lower_bound": 1, "current_steps": 3, "ema": 1.0, "batches": 4, "switches": 2}]


def test_simulate_slot_changes_and_graph_padding() -> None:
    cfg = parse_sglang_adaptive_config({"1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0, 1]}})
    trace = [TraceStep(2, (1, 1), 3), TraceStep(5, (0,) * 5, 3), TraceStep(9, (0,) * 9, 3)]
    plain = simulate(cfg, trace, initial_steps=3)
    assert [(s.slot, s.num_steps, s.cause) for s in plain.segments] == [("1", 3, "start"), ("8", 1, "batch size")]
    padded = simulate(cfg, trace, initial_steps=3, cuda_graph_bs=[1, 2, 4, 8, 16])  # 5 pads to 8
    assert [(s.start, s.end, s.slot) for s in padded.segments] == [(0, 0, "1"), (1, 2, "8")]


def test_default_config_starts_slots_where_sglang_does() -> None:
    """Without --initial-steps SGLang sets num_steps to the middle of the union of all slots' candidates
    (speculative_hook.py, _init_adaptive_speculative_params): union [0, 1, 3, 5, 7] -> 3. Slots "1" and "8" list 3
    and start there; "32" ([0, 1]) does not and starts at its own middle, 1."""
    from spectune.backends.num_steps.sglang_config import SGLANG_DEFAULT_CONFIG

    cfg = parse_sglang_adaptive_config(SGLANG_DEFAULT_CONFIG)
    trace = [TraceStep(1, (1,), 3), TraceStep(8, (1,) * 8, 3), TraceStep(32, (0,) * 32, 3)]
    res = simulate(cfg, trace)
    assert [(s.slot, s.num_steps) for s in res.segments] == [("1", 3), ("8", 3), ("32", 1)]
    assert cfg.server_initial_steps == 3


def test_simulate_vllm_schedule() -> None:
    sched = parse_vllm_schedule([[1, 4, 3], [5, 16, 1]])
    trace = [TraceStep(2, (3, 2), 3), TraceStep(6, (3, 0, 0, 1, 2, 3), 3), TraceStep(20, (0,) * 20, 3)]
    res = simulate(sched, trace)
    assert [(s.start, s.end, s.slot, s.num_steps, s.ema) for s in res.segments] == [
        (0, 0, "1-4", 3, None), (1, 2, "5-16", 1, None)]  # 20 is past the last range: its K applies
    assert res.switch_count == 1
    assert res.steps_clipped == 1
    assert res.acceptance_length == 1 + (3 + 2 + 1 + 0 + 0 + 1 + 1 + 1) / 28


def test_cli_end_to_end(tmp_path: Path) -> None:
    cfg = tmp_path / "adaptive.json"
    cfg.write_text(json.dumps({**FAST, "1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0, 1]}}))
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, [TraceStep(1, (3,), 3), TraceStep(1, (0,), 3), TraceStep(1, (3,), 3),
                        TraceStep(8, (0,) * 8, 3), TraceStep(8, (0,) * 8, 3)])
    out = tmp_path / "sim.json"
    res = CliRunner().invoke(app, ["simulate", "--config", str(cfg), "--trace", str(trace), "--initial-steps", "3",
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    # slot 1: 3 -> 1 (EMA 0) -> 3 (EMA 1, clipped from 3); slot 8 starts at [0, 1][1] = 1: -> 0 (EMA 0 <= 0.25),
    # then the next decision at step 0 probes back up to 1
    assert "switches: 4" in res.output
    assert "clipped" in res.output  # the approximation is stated
    data = json.loads(out.read_text())
    assert data["kind"] == "sglang"
    assert data["switch_count"] == 4
    assert data["steps_per_tier"] == {"0": 1, "1": 2, "3": 2}
    assert [(s["start"], s["end"], s["slot"], s["num_steps"]) for s in data["segments"]] == [
        (0, 1, "1", 3), (2, 2, "1", 1), (3, 3, "8", 1), (4, 4, "8", 0)]
    vllm = tmp_path / "vllm.json"
    vllm.write_text(json.dumps({"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 4, 3],
                                                                                                      [5, 8, 0]]}))
    res = CliRunner().invoke(app, ["simulate", "--config", str(vllm), "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    assert "vLLM schedule" in res.output
    assert "switches: 1" in res.output


def test_cli_bad_input_is_a_user_error(tmp_path: Path) -> None:
    cfg = tmp_path / "typo.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": [1, 3], "ceiling_coef": 2}}))
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, [TraceStep(1, (1,), 3)])
    res = CliRunner().invoke(app, ["simulate", "--config", str(cfg), "--trace", str(trace)])
    assert isinstance(res.exception, UserError)
    assert "'ceiling_coef'" in str(res.exception)
    res = CliRunner().invoke(app, ["simulate", "--config", str(cfg), "--trace", str(trace), "--lenient"])
    assert res.exit_code == 0
    assert "warning:" in res.output
    res = CliRunner().invoke(app, ["simulate", "--config", str(cfg), "--trace", str(tmp_path / "no.jsonl"),
                                   "--lenient"])
    assert isinstance(res.exception, UserError)
    assert "cannot read trace" in str(res.exception)
