"""The engine -> trace file -> ``spectune simulate`` path with the real pieces: the bundled engine (tiny fixture)
records every verify through :class:`spectune.backends.num_steps.trace.TraceWriter`, and the CLI replays that file."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from spectune.backends.num_steps.trace import TraceWriter, read_trace
from spectune.backends.local.engine.sequence import SamplingParams
from spectune.cli import app
from helpers.tiny_models import tiny_engine


def test_engine_trace_replays_in_simulate(tmp_path: Path) -> None:
    engine = tiny_engine(num_steps=2, slots=4)
    trace_path = tmp_path / "trace.jsonl"
    writer = TraceWriter(trace_path)
    engine.cfg.trace = writer
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [3, 3]]
    outputs = engine.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    writer.close()
    steps = read_trace(trace_path)
    assert {s.num_steps for s in steps} == {2}
    # every verified request's accepted drafts are in the file: their sum is the engine's accepted-draft count, and
    # each request's tokens are its verifies' accepted + 1 plus the prefill's token
    assert sum(sum(s.accepted_drafts) for s in steps) == engine.stats.spec.accepted_tokens
    assert sum(s.batch_size for s in steps) + len(prompts) == sum(len(o) for o in outputs) - sum(
        sum(s.accepted_drafts) for s in steps)
    cfg = tmp_path / "adaptive.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": [1, 2]}}))
    out = tmp_path / "sim.json"
    res = CliRunner().invoke(app, ["simulate", "--config", str(cfg), "--trace", str(trace_path), "--initial-steps",
                                   "2", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert sum(data["steps_per_tier"].values()) == len(steps)  # one decision input per recorded verify


def test_recorded_engine_trace_replays_every_policy(tmp_path: Path) -> None:
    """A recording engine writes what a draft-length policy reads (every position's confidence, context, draft and
    verify ms); simulate --policy all replays it, the recorded num_steps reproducing the engine's acceptance."""
    engine = tiny_engine(num_steps=3, slots=4)
    engine.decoder.record = True
    trace_path = tmp_path / "trace.jsonl"
    writer = TraceWriter(trace_path)
    engine.cfg.trace = writer
    engine.generate([[1, 2, 3], [4, 5], [6, 7, 8, 9]], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    writer.close()
    steps = read_trace(trace_path)
    assert all(len(row) == 3 for s in steps for row in s.draft_probs)  # recorded at the configured maximum
    assert all(s.draft_ms is not None and s.verify_ms is not None and s.context_tokens for s in steps)
    out = tmp_path / "cmp.json"
    res = CliRunner().invoke(app, ["simulate", "--trace", str(trace_path), "--policy", "all", "--json", str(out)])
    assert res.exit_code == 0, res.output
    policies = {p["policy"]: p["overall"] for p in json.loads(out.read_text())["policies"]}
    rows = sum(s.batch_size for s in steps)
    recorded = 1 + engine.stats.spec.accepted_tokens / rows
    assert policies["static:3"]["acceptance_length"] == recorded
    assert policies["oracle"]["acceptance_length"] == recorded
    assert {"p_min:0.5", "specdec:0.5", "ema", "oracle-capped"} <= set(policies)
