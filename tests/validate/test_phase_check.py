"""The steady per-phase window (spill-over of earlier phases left out) and the per-phase ruling of the config
against each phase's best static num_steps."""

from __future__ import annotations

import random

import pytest

from spectune.loadgen.record import RequestRecord
from spectune.results.validate_doc import ValidateDoc
from spectune.results.validate_run import ValidateRun
from spectune.validate.phase_check import markdown, phase_check, summary_line, to_json, window_requests
from spectune.validate.phases import settle_time, summarize_run


def rec(send: float, times: list[float], tokens: list[int], end: float) -> RequestRecord:
    return RequestRecord(f"r{send}", "p", None, send, chunk_times=times, chunk_tokens=tokens, end_time=end)


def test_a_drop_settles_when_only_the_phase_concurrency_of_spill_over_is_left():
    spill = [rec(9.0, [10.5], [1], end) for end in (10.5, 11.0, 12.0)]  # sent before 10, in flight at 10
    assert settle_time(spill, 10.0, 20.0, concurrency=1) == 11.0  # two ended by 11.0, one left


def test_open_loop_settles_when_all_spill_over_ended():
    spill = [rec(9.0, [10.5], [1], end) for end in (10.5, 11.0, 12.0)]
    assert settle_time(spill, 10.0, 20.0, concurrency=None) == 12.0


def test_a_rise_is_steady_at_once():
    spill = [rec(9.0, [10.5], [1], 15.0)]
    assert settle_time(spill, 10.0, 20.0, concurrency=32) == 10.0


def test_requests_that_ended_before_the_window_are_no_spill_over():
    assert settle_time([rec(1.0, [2.0], [1], 3.0)], 10.0, 20.0, concurrency=None) == 10.0


def test_a_window_that_never_settles():
    assert settle_time([rec(9.0, [10.5], [1], 25.0)], 10.0, 20.0, concurrency=None) is None


def test_steady_throughput_leaves_out_the_backlog():
    # phase 1 (c=2): two requests stream until 12 s; phase 2 (c=1) at 10-20 s: one new request after the backlog
    backlog = [rec(5.0, [6.0, 11.0, 12.0], [1, 10, 10], 12.0), rec(5.0, [6.0, 11.4], [1, 10], 11.5)]
    new = rec(12.0, [13.0, 19.0], [2, 4], 19.0)
    phases, _ = summarize_run(backlog + [new], 0.0, [(0.0, 10.0), (10.0, 20.0)], concurrencies=[2, 1])
    two = phases[1]
    assert two.output_throughput_tok_s == pytest.approx((30 + 6) / 10)  # credits the backlog
    assert two.settle_s == pytest.approx(1.5)  # 11.5: one left
    assert two.steady_output_throughput_tok_s == pytest.approx((10 + 6) / 8.5)  # the last backlog request's
    # chunk at 12.0 (one request left, the phase's concurrency) and the new request's


PHASE_S = 10.0


def _runs(values: dict[str, list[float]], repeats: int = 2) -> list[ValidateRun]:
    """validate.json runs with steady tok/s per phase (the same in every repeat), phases of PHASE_S s from t0 = 0."""
    out = []
    for r in range(1, repeats + 1):
        for name, vs in values.items():
            steps = int(name.split(":")[1]) if name.startswith("static:") else 1
            out.append(ValidateRun.from_dict({"run": name, "steps": steps, "repeat": r, "status": "ok", "t0": 0.0,
                        "overall": {"output_throughput_tok_s": sum(vs)},
                        "phases": [{"phase": i + 1, "label": f"c={1 if i % 2 == 0 else 32}", "start_s": i * PHASE_S,
                                    "end_s": (i + 1) * PHASE_S, "settle_s": 0.0,
                                    "steady_output_throughput_tok_s": v} for i, v in enumerate(vs)]}))
    return out


def _requests(names: list[str], phases: int, per_phase: int, repeats: int = 2, seed: int = 0) -> list[dict]:
    """Requests back to back in every phase, each streaming its tokens in 4 chunks at a rate drawn around 70 tok/s."""
    rng = random.Random(seed)
    out = []
    for n in names:
        for r in range(1, repeats + 1):
            for p in range(phases):
                span = PHASE_S / per_phase
                for i in range(per_phase):
                    start = p * PHASE_S + i * span
                    tokens = int(span * rng.uniform(60, 80))
                    out.append({"run": n, "repeat": r, "prompt_id": f"{p}-{i}", "error": None, "send_time": start,
                                "end_time": start + span, "chunk_times": [start + span * (j + 1) / 4 for j in range(4)],
                                "chunk_tokens": [tokens // 4] * 4})
    return out


def test_the_config_holds_a_phase_within_the_tolerance():
    runs = _runs({"static:0": [50.0, 230.0], "static:1": [66.0, 260.0], "config": [65.0, 259.0]})
    rulings = phase_check(runs, _requests(["static:0", "static:1", "config"], 2, 30))
    assert [r.ruling for r in rulings] == ["holds", "holds"]


def test_each_phase_names_its_own_best_static():
    runs = _runs({"static:0": [50.0, 270.0], "static:2": [70.0, 230.0], "config": [69.0, 268.0]})
    rulings = phase_check(runs, _requests(["static:0", "static:2", "config"], 2, 30))
    assert [r.best_static for r in rulings] == [2, 0]


def test_a_config_far_behind_in_a_phase_is_behind():
    runs = _runs({"static:0": [50.0, 270.0], "static:2": [70.0, 230.0], "config": [50.0, 268.0]})
    rulings = phase_check(runs, _requests(["static:0", "static:2", "config"], 2, 30))
    assert rulings[0].ruling == "behind"


def test_a_small_lag_with_few_requests_is_noise():
    runs = _runs({"static:2": [70.0], "config": [66.0]})
    requests = _requests(["static:2", "config"], 1, 3, seed=1)  # three requests per run: a wide interval
    for q in requests:  # request speeds far apart: 30 to 110 tok/s
        q["chunk_tokens"] = [int(random.Random(q["prompt_id"] + q["run"]).uniform(10, 40))] * 4
    assert phase_check(runs, requests, concurrencies=[1])[0].ruling == "noise"


def test_a_request_counts_only_its_time_inside_the_window():
    run = _runs({"config": [70.0, 250.0]}, repeats=1)[0]
    slow = {"run": "config", "repeat": 1, "prompt_id": "x", "error": None, "send_time": 9.0, "end_time": 19.0,
            "chunk_times": [9.5, 10.0, 18.0], "chunk_tokens": [10, 10, 30]}  # sent in phase 1, slow in phase 2
    one = window_requests(run, [slow], 0)
    assert (one.tokens.tolist(), one.latency_ms.tolist()) == ([10.0], [1000.0])  # 9.5 s chunk; 9-10 s in flight


def test_summary_and_markdown_name_the_phases_that_do_not_hold():
    runs = _runs({"static:0": [50.0, 270.0], "static:2": [70.0, 230.0], "config": [50.0, 268.0]})
    check = to_json(phase_check(runs, _requests(["static:0", "static:2", "config"], 2, 30)))
    assert check["line"].startswith("1 of 2 phases within 3%")
    assert "phase 1 behind (0.714x K=2)" in check["line"]
    table = "\n".join(markdown(ValidateDoc.from_json({"runs": [r.to_dict() for r in runs], "phase_check": check})))
    assert "| 1: c=1 | 50.0 | 70.0 | 50.0 | K=2 | 0.714x" in table


def test_runs_without_steady_numbers_give_no_rulings():
    runs = _runs({"static:0": [50.0], "config": [60.0]})
    for r in runs:
        r.phases[0].steady_output_throughput_tok_s = None
    rulings = phase_check(runs, _requests(["static:0", "config"], 1, 10), concurrencies=[1])
    assert summary_line(rulings).startswith("no per-phase steady numbers")
