"""The main job end to end, once, in the default test run: ``spectune sweep`` with no model arguments runs the
embedded default pair (SmolLM2-135M-Instruct + the bundled EAGLE-3 head) on real MT-Bench prompts through the
``local`` backend (a real server subprocess), writes the results folder and prints its table; then
``spectune recommend`` turns the folder into configs that SGLang's and vLLM's validators accept."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from spectune.backends.num_steps import parse_sglang_adaptive_config, parse_vllm_speculative_config
from helpers.engine import bundled_head_available

pytestmark = pytest.mark.skipif(not bundled_head_available(), reason="the bundled SmolLM2 head is not installed")


def test_default_pair_sweep_then_recommend(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "spectune.cli", "sweep", "--steps", "0,3", "--concurrency", "1,4",
           "--num-prompts", "8", "--max-tokens", "32", "--device", "cpu", "--output-dir", str(out),
           "--compile", "off",  # uncompiled (a minute per server start on 2 cores): test_engine_compile.py tests it
           "--server-args", "--native-dense-above 8"]  # spectune serve's option, reaching the launched server
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "K=0" in run.stdout
    assert "K=3" in run.stdout
    assert "concurrency" in run.stdout
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert {(r["steps"], r["concurrency"]) for r in rows} == {("0", "1"), ("0", "4"), ("3", "1"), ("3", "4")}
    assert all(r["status"] == "ok" and r["num_failed"] == "0" for r in rows)
    by = {(int(r["steps"]), int(r["concurrency"])): r for r in rows}
    assert float(by[(0, 1)]["acceptance_length"]) == 1.0
    for c in (1, 4):
        spec = by[(3, c)]
        assert spec["acceptance_length_source"].startswith("spectune:")
        assert 1.3 < float(spec["acceptance_length"]) <= 4.0  # the trained head's drafts are accepted
        assert float(spec["output_throughput_tok_s"]) > 0
    for r in rows:  # the engine's own time: decode rounds and the prefill share (spectune:engine_* counters)
        assert float(r["engine_round_ms"]) > 0
        assert 0 < float(r["engine_prefill_share"]) < 1
        assert 0 < float(r["engine_round_rows"]) <= int(r["concurrency"])  # rows of its decode rounds, mean
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["backend"]["backend"] == "local"
    assert sweep["backend"]["engine"]["server_args"] == {"native_dense_above": "8"}
    path = sweep["backend"]["engine"]["path"]  # what the server ran: the dense copy above 8 rows on the native path
    assert path["dense_above_rows"] == (8 if path["path"] == "native" else None)
    assert sweep["plan"]["dataset"] == "mt-bench"
    n_requests = sum(1 for _ in (out / "requests.jsonl").open())
    assert n_requests == sum(int(r["num_requests"]) for r in rows)

    rec = tmp_path / "rec"
    run = subprocess.run([sys.executable, "-m", "spectune.cli", "recommend", str(out), "-o", str(rec)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    for name in ("custom", "conservative", "aggressive"):
        parse_sglang_adaptive_config(json.loads((rec / f"sglang-adaptive-{name}.json").read_text()), strict=True)
    # recommend's rule on this measured table (docs/recommend.md; ties go to the smaller K): K=3 at concurrency c only
    # when its measured throughput is above K=0's by more than the choice's noise band (2%, widened by a drift the
    # sweep's drift check measured) and the paired interval of that ratio lies wholly beyond the band
    tput = {k: float(r["output_throughput_tok_s"]) for k, r in by.items()}
    choices = {ch["concurrency"]: ch for ch in json.loads((rec / "recommendation.json").read_text())["choices"]}
    expected = {}
    for c in (1, 4):
        band = choices[c]["band"]
        pair = next(x for x in choices[c]["comparisons"] if {x["a"], x["b"]} == {0, 3})
        low = pair["low"] if pair["a"] == 3 else 1 / pair["high"]  # the interval of K=3 / K=0
        expected[c] = 3 if tput[(3, c)] > (1 + band) * tput[(0, c)] and low > 1 + band else 0
    assert {c: ch["steps"] for c, ch in choices.items()} == expected
    vllm = rec / "vllm-speculative-config.json"
    slots = json.loads((rec / "recommendation.json").read_text())["slots"]  # the primary answer's (static or not)
    assert vllm.exists() == any(s["steps"] > 0 for s in slots)  # no vLLM file when the answer never speculates
    # the file is the primary answer: at batch size 1, its first slot's K (a static primary K=3 beside
    # per-concurrency ties at K=0 writes K=3); test_recommend.py's committed real-engine sweep checks a written
    # schedule deterministically
    for path in [vllm] if vllm.exists() else []:
        assert parse_vllm_speculative_config(json.loads(path.read_text())).k_for_batch_size(1) == slots[0]["steps"]
    assert (rec / "recommendation.md").read_text().strip()
