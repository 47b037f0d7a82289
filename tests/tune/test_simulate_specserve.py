"""`spectune simulate --policy specserve` (spectune.tune.specserve_replay): the bundled engine's SpecServe rule
replayed on a trace, and every policy's SLO attainment and goodput under ``--slo-tpot-ms``. Expected lengths come
from SpecServe's drafter and verifier written out plainly here for one row, not from the code's output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from helpers.policy_traces import synthetic_trace
from spectune.backends.num_steps.trace import TraceStep, write_trace
from spectune.cli import app
from spectune.core.errors import UserError
from spectune.tune.draft_policies import PolicySpec, parse_policies, trace_arrays
from spectune.tune.policy_replay import evaluate, replay, round_times
from spectune.tune.policy_report import compare
from spectune.tune.step_time import DRAFT_TERMS, VERIFY_TERMS, LinearStepTime, fit_trace_step_time

# a draft step costs 1 ms, a verify 10 ms + 2 ms per padded token: one row's round of D steps and width W is
# D + 10 + 2 W ms
MODEL = LinearStepTime({**dict.fromkeys(DRAFT_TERMS + VERIFY_TERMS, 0.0), "d_step": 1.0, "v_fixed": 10.0,
                        "v_padded": 2.0})


def one_row_ms(d: int, w: int) -> float:
    return d + 10.0 + 2.0 * w


def specserve_one_row(row: list[float], cap: int, slo: float | None = None) -> int:
    """SpecServe for a batch of one row (section 5): draft while one more step (its confidence predicted as this
    step's) raises NAT / T; then drop the tail token while that raises NAT / T with the drafted steps sunk; a
    round over the SLO scores minus its time."""
    def score(nat: float, ms: float) -> float:
        return nat / ms if slo is None or ms <= slo else -ms

    nat, surv, ars, j = 1.0, 1.0, [], 0
    while j < cap:
        surv *= row[j]
        ars.append(surv)
        nat += surv
        j += 1
        if j >= cap or not score(nat + surv * row[j - 1], one_row_ms(j + 1, j + 2)) > score(nat, one_row_ms(j, j + 1)):
            break
    n = j
    while n > 0 and score(1.0 + sum(ars[:n - 1]), one_row_ms(j, n)) > score(1.0 + sum(ars[:n]), one_row_ms(j, n + 1)):
        n -= 1
    return n


ROWS = [[0.95, 0.9, 0.85, 0.8], [0.9, 0.3, 0.9, 0.9], [0.2, 0.9, 0.9, 0.9], [0.99, 0.99, 0.99, 0.99],
        [0.7, 0.6, 0.1, 0.5], [0.5, 0.5, 0.5, 0.5]]
ACCEPTED = [3, 1, 0, 4, 2, 1]


def one_row_trace() -> list[TraceStep]:
    return [TraceStep(1, (a,), 4, None, (4,), (tuple(row),)) for row, a in zip(ROWS, ACCEPTED)]


def test_the_replay_drafts_what_specserve_written_out_drafts() -> None:
    expected = [specserve_one_row(row, 4) for row in ROWS]
    assert len(set(expected)) > 2  # the rows decide different lengths
    rep = replay(trace_arrays(one_row_trace()), PolicySpec("specserve"), model=MODEL)
    assert rep.lengths.tolist() == expected


def test_the_replay_of_a_known_trace_credits_the_expected_accepted_tokens() -> None:
    lengths = [specserve_one_row(row, 4) for row in ROWS]
    credited = sum(min(a, n) for a, n in zip(ACCEPTED, lengths))
    (res,) = evaluate(trace_arrays(one_row_trace()), [PolicySpec("specserve")], MODEL)
    assert res.overall.acceptance_length == pytest.approx(1.0 + credited / len(ROWS))


def test_the_slo_shortens_the_written_out_rounds_as_in_the_replay() -> None:
    slo = one_row_ms(2, 3) + 0.5  # two drafts fit, three do not
    expected = [specserve_one_row(row, 4, slo) for row in ROWS]
    rep = replay(trace_arrays(one_row_trace()), PolicySpec("specserve", slo), model=MODEL)
    assert rep.lengths.tolist() == expected
    assert max(expected) == 2


def test_a_specserve_value_is_a_tpot_slo_in_ms() -> None:
    assert [s.label for s in parse_policies(["specserve", "specserve:50"], True, 4)] == ["specserve", "specserve:50"]
    with pytest.raises(UserError, match="TPOT SLO, a number of ms > 0"):
        parse_policies(["specserve:0"], True, 4)


def _binding_slo(arr, model) -> float:
    """Just above the longest predicted round of one draft step and nothing but the bonus token verified."""
    ones = np.ones(arr.rounds)
    return float(model.round_ms(arr.batch, ones, ones, arr.batch.astype(float), arr.context).max()) * 1.01


def test_specserve_with_a_tight_slo_never_predicts_a_round_over_it() -> None:
    steps = synthetic_trace(seed=3, rounds=80)
    arr, model = trace_arrays(steps), fit_trace_step_time(steps)
    slo = _binding_slo(arr, model)
    rep = replay(arr, PolicySpec("specserve", slo), model=model)
    assert round_times(arr, rep, model).max() <= slo
    full = replay(arr, PolicySpec("static", 5.0))
    assert round_times(arr, full, model).max() > slo  # the SLO binds: static K=5 breaks it


def test_specserve_attains_the_slo_at_least_as_often_as_every_static_num_steps_when_it_binds() -> None:
    steps = synthetic_trace(seed=4, rounds=80)
    arr, model = trace_arrays(steps), fit_trace_step_time(steps)
    slo = _binding_slo(arr, model)
    results = {r.spec.label: r.overall for r in evaluate(
        arr, parse_policies(["static:1,2,3,4,5", f"specserve:{slo}"], True, 5), model, slo)}
    ours = results[PolicySpec("specserve", slo).label]
    assert ours.slo_attainment == 1.0
    for k in range(1, 6):
        assert ours.slo_attainment >= results[f"static:{k}"].slo_attainment, k
    assert results["static:5"].slo_attainment < 1.0


def test_goodput_counts_the_tokens_of_rows_within_the_slo() -> None:
    """Two rounds of one row at static K=4 (D=4, W=5: 4 + 10 + 10 = 24 ms each): 5 tokens (TPOT 4.8 ms) and 1
    token (TPOT 24 ms); an SLO of 10 ms keeps the first row only."""
    steps = [TraceStep(1, (4,), 4, None, (4,), ((0.9,) * 4,)), TraceStep(1, (0,), 4, None, (4,), ((0.1,) * 4,))]
    (res,) = evaluate(trace_arrays(steps), [PolicySpec("static", 4.0)], MODEL, 10.0)
    assert res.overall.slo_attainment == 0.5
    assert res.overall.goodput_tok_s == pytest.approx(1000.0 * 5 / (2 * one_row_ms(4, 5)))


def test_a_specserve_engine_config_replays_as_specserve_at_its_n_max_and_slo(tmp_path: Path) -> None:
    steps = synthetic_trace(seed=6, rounds=40)
    cfg = tmp_path / "specserve.json"
    cfg.write_text(json.dumps({"strategy": "specserve", "n_max": 3, "slo_tpot_ms": 40}))
    by_file = compare(steps, [f"config:{cfg}"]).results[0].overall
    by_name = compare(steps, ["specserve:40"], n_max=3).results[0].overall
    assert by_file == by_name


def test_cli_reports_slo_attainment_and_names_the_bare_policy_by_its_slo(tmp_path: Path) -> None:
    trace, out = tmp_path / "trace.jsonl", tmp_path / "cmp.json"
    write_trace(trace, synthetic_trace(seed=2, rounds=24))
    res = CliRunner().invoke(app, ["simulate", "--trace", str(trace), "--policy", "static:1", "--policy",
                                   "specserve", "--slo-tpot-ms", "30", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "SLO att" in res.output
    doc = json.loads(out.read_text())
    assert doc["slo_tpot_ms"] == 30.0
    assert [p["policy"] for p in doc["policies"]] == ["static:1", "specserve:30"]
    assert all(0.0 <= p["overall"]["slo_attainment"] <= 1.0 for p in doc["policies"])


def test_cli_refuses_specserve_without_a_step_time_model(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, [TraceStep(1, (1,), 2, None, (2,), ((0.9, 0.5),))] * 4)  # no draft_ms / verify_ms
    res = CliRunner().invoke(app, ["simulate", "--trace", str(trace), "--policy", "specserve"])
    assert isinstance(res.exception, UserError), res.output
    assert "pass --sweep FOLDER" in str(res.exception)
    assert "\n" not in str(res.exception)
