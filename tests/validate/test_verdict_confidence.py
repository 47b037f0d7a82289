"""validate's verdict carries the interval of the config's throughput ratio to the best static: the paired bootstrap
over requests, widened by the server-to-server spread (tests/validate/test_instance_spread.py)."""

from __future__ import annotations

import numpy as np

from spectune.results.validate_run import ValidateRun
from spectune.validate.repeats import WITHIN_ONLY, throughput_ratio
from spectune.validate.verdict import verdict


def requests(run: str, n: int, tokens_mean: float, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"run": run, "repeat": 1, "prompt_id": f"p{i}", "error": None, "chunk_times": 3,
             "completion_tokens": int(max(2, tokens_mean * (1 + 0.3 * rng.standard_normal()))), "e2e_ms": 100.0,
             "tpot_ms": 1.0, "ttft_ms": 1.0} for i in range(n)]


def runs_and_requests(config_gain: float) -> tuple[list[ValidateRun], list[dict]]:
    reqs = requests("static:0", 60, 100, 1) + requests("config", 60, 100 * config_gain, 2)
    runs = []
    for name, steps in (("static:0", 0), ("config", 2)):
        tokens = sum(r["completion_tokens"] for r in reqs if r["run"] == name)
        runs.append(ValidateRun.from_dict({"run": name, "steps": steps, "repeat": 1, "status": "ok",
                                           "overall": {"output_throughput_tok_s": tokens / 10.0,
                                                       "slo_attainment": None}}))
    return runs, reqs


def test_verdict_line_shows_the_ratio_interval():
    runs, reqs = runs_and_requests(1.5)
    v = verdict(runs, False, 0.0, ratio=lambda a, b: throughput_ratio(runs, reqs, a, b))
    assert v.passed
    assert v.ratio_low > 1.0  # 1.5x more tokens: the whole interval is above 1
    assert f"[{v.ratio_low:.3f}, {v.ratio_high:.3f}], 95%" in v.line


def test_equal_runs_give_an_interval_holding_one():
    runs, reqs = runs_and_requests(1.0)
    low, high = throughput_ratio(runs, reqs, "config", "static:0")
    assert low < 1.0 < high


def test_no_requests_and_no_server_spread_no_interval():
    runs, _ = runs_and_requests(1.0)
    v = verdict(runs, False, 0.0, ratio=lambda a, b: throughput_ratio(runs, [], a, b, spread=WITHIN_ONLY))
    assert v.ratio_low is None
