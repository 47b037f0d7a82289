"""`spectune simulate --policy`: the full trace format (backends.num_steps.trace), per-row draft-length policies
(spectune.tune.draft_policies), their replay and scores (spectune.tune.policy_replay), the step-time models
(spectune.tune.step_time) and the CLI. Expected lengths come from the rules written out plainly here, not from the
code's output."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from helpers.policy_traces import D_ROW, D_STEP, V_CTX, V_FIXED, V_PADDED, synthetic_trace
from spectune.backends.num_steps.trace import TraceStep, TraceWriter, read_trace, write_trace
from spectune.cli import app
from spectune.core.errors import UserError
from spectune.tune.draft_policies import PolicySpec, parse_policies, threshold_lengths, trace_arrays
from spectune.tune.policy_replay import best_per_batch, evaluate, replay
from spectune.tune.policy_report import compare
from spectune.tune.step_time import RoundShape, cells_step_time, fit_step_time, fit_trace_step_time


# ---- the rules, written out per row ----

def p_min_rule(row: list[float], p_min: float, cap: int) -> int:
    """llama.cpp: stop before the first token whose probability is under p_min; at most cap tokens."""
    n = 0
    for p in row:
        if p < p_min or n >= cap:
            break
        n += 1
    return n


def specdec_rule(row: list[float], h: float, cap: int) -> int:
    """SpecDec++: draft, then stop once 1 - prod(p) > h (that token kept); at most cap tokens."""
    surv, n = 1.0, 0
    for p in row:
        if n >= cap:
            break
        n += 1
        surv *= p
        if 1.0 - surv > h:
            break
    return n


FULL = TraceStep(2, (1, 2), 3, 1.5, (2, 3), ((0.9, 0.6, 0.2), (0.95, 0.9, 0.85)), ((0.8, 0.5, 0.1), (0.9, 0.9, 0.9)),
                 (40, 7), 1.25, 4.5)


def test_full_format_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(path, [FULL, TraceStep(1, (0,), 0)])
    assert read_trace(path) == [FULL, TraceStep(1, (0,), 0)]
    assert FULL.round_ms == 5.75
    assert TraceStep(1, (0,), 2).drafted_per_row == (2,)


def test_writer_rounds_and_takes_numpy(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter(path, stamp_time=False) as w:
        w.record(np.int64(1), np.array([1]), 2, drafted=np.array([2]), draft_probs=np.array([[0.123456, 0.5]]),
                 context_tokens=[np.int32(9)], draft_ms=np.float32(0.5), verify_ms=1.123456789)
    line = json.loads(path.read_text())
    assert line == {"batch_size": 1, "accepted_drafts": [1], "num_steps": 2, "drafted": [2],
                    "draft_probs": [[0.1235, 0.5]], "context_tokens": [9], "draft_ms": 0.5, "verify_ms": 1.1235}


def test_old_format_line_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    path.write_text('{"batch_size": 2, "accepted_drafts": [3, 1], "num_steps": 3, "t": 0.5}\n')
    (step,) = read_trace(path)
    assert step == TraceStep(2, (3, 1), 3, 0.5)
    assert (step.drafted, step.draft_probs, step.draft_ms) == (None, None, None)


BASE = {"batch_size": 2, "accepted_drafts": [1, 0], "num_steps": 3}


@pytest.mark.parametrize("extra,match", [
    ({"drafted": [3]}, "'drafted' must be a list of batch_size=2"),
    ({"drafted": [4, 1]}, "'drafted' entries must be integers in 0..num_steps=3"),
    ({"drafted": [0, 1]}, "row 0 accepted 1 drafts but 'drafted' says it drafted 0"),
    ({"drafted": [2, 1], "draft_probs": [[0.5], [0.5]]}, "'draft_probs' row 0 holds 1 entries: it must hold between "
                                                        "drafted=2 and num_steps=3"),
    ({"draft_probs": [[0.5, 0.5, 0.5], [0.5, 0.5]]}, "row 1 holds 2 entries: it must hold between drafted=3"),
    ({"draft_probs": [[0.5, 0.5, 1.5], [0.5, 0.5, 0.5]]}, "'draft_probs' row 0 entries must be probabilities"),
    ({"draft_probs": [[0.5, 0.5, True], [0.5, 0.5, 0.5]]}, "'draft_probs' row 0 entries must be probabilities"),
    ({"draft_probs": [0.5, 0.5]}, "'draft_probs' must be a list of batch_size=2 lists"),
    ({"draft_probs": [[0.5] * 3] * 2, "accept_probs": [[0.5] * 3, [0.5] * 2]},
     "'accept_probs' row 1 holds 2 entries"),
    ({"drafted": [1, 1], "draft_probs": [[0.5] * 3] * 2, "accept_probs": [[0.5] * 3, [0.5] * 2]},
     "'accept_probs' row 1 holds 2 entries but 'draft_probs' row 1 holds 3"),
    ({"context_tokens": [1, -1]}, "'context_tokens' entries must be integers >= 0"),
    ({"draft_ms": -1}, "'draft_ms' must be a number of ms >= 0"),
    ({"verify_ms": "5"}, "'verify_ms' must be a number of ms >= 0"),
])
def test_new_fields_are_checked_with_one_line_errors(tmp_path: Path, extra: dict, match: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({**BASE, **extra}) + "\n")
    with pytest.raises(UserError, match=f"bad.jsonl:1: .*{match}") as err:
        read_trace(path)
    assert "\n" not in str(err.value)


def test_nan_probability_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nan.jsonl"
    path.write_text('{"batch_size": 1, "accepted_drafts": [0], "num_steps": 2, "draft_probs": [[NaN, 0.5]]}\n')
    with pytest.raises(UserError, match="entries must be probabilities"):
        read_trace(path)


# ---- per-row lengths ----

def test_policy_lengths_follow_the_rules() -> None:
    trace = synthetic_trace(seed=3, rounds=40, with_accept_probs=True)
    arr = trace_arrays(trace)
    rows = [(s, i) for s in trace for i in range(s.batch_size)]
    for thr in (0.3, 0.6, 0.85):
        got = threshold_lengths(arr, "p_min", thr, None).lengths
        assert list(got) == [p_min_rule(list(s.draft_probs[i]), thr, s.num_steps) for s, i in rows]
        capped = threshold_lengths(arr, "p_min", thr, 2).lengths
        assert list(capped) == [p_min_rule(list(s.draft_probs[i]), thr, 2) for s, i in rows]
        head = threshold_lengths(arr, "specdec", thr, None).lengths
        assert list(head) == [specdec_rule(list(s.accept_probs[i]), thr, s.num_steps) for s, i in rows]
        raw = threshold_lengths(arr, "specdec-raw", thr, None).lengths
        assert list(raw) == [specdec_rule(list(s.draft_probs[i]), thr, s.num_steps) for s, i in rows]
    assert list(replay(arr, PolicySpec("static", 2.0)).lengths) == [2] * len(rows)
    assert list(replay(arr, PolicySpec("oracle")).lengths) == [s.accepted_drafts[i] for s, i in rows]


def test_hand_made_round_lengths_and_credit() -> None:
    # row 0 drafted 3, accepted 1 (rejected at 2); row 1 drafted 3, accepted 3
    step = TraceStep(2, (1, 3), 3, None, None, ((0.9, 0.4, 0.8), (0.95, 0.9, 0.7)), None, (10, 10), 1.0, 2.0)
    arr = trace_arrays([step])
    assert list(threshold_lengths(arr, "p_min", 0.5, None).lengths) == [1, 3]  # 0.4 < 0.5 at position 2
    # specdec h=0.2: row 0: 1-0.9=0.1, 1-0.36=0.64 > 0.2 at t=2; row 1: 0.05, 1-0.855=0.145, 1-0.5985 > 0.2 at t=3
    assert list(threshold_lengths(arr, "specdec", 0.2, None).lengths) == [2, 3]
    res = {r.spec.label: r.overall for r in evaluate(arr, [PolicySpec("static", 1.0), PolicySpec("static", 4.0),
                                                           PolicySpec("oracle")], None)}
    assert res["static:1"].acceptance_length == 1 + (1 + 1) / 2
    assert res["static:4"].acceptance_length == 1 + (1 + 3) / 2  # row 1 given 4 > 3 drafted, all accepted
    assert res["static:4"].lower_bound_rows == 1
    assert res["oracle"].drafted_per_accepted == 1.0
    assert res["static:1"].tok_s is None  # no step-time model


def test_threshold_rule_past_the_recorded_positions_is_counted() -> None:
    step = TraceStep(1, (2,), 2, None, None, ((0.9, 0.9),), None, None, None, None)
    arr = trace_arrays([step])
    rl = threshold_lengths(arr, "p_min", 0.5, 4)
    assert list(rl.lengths) == [2]
    assert list(rl.past_recorded) == [True]
    assert list(threshold_lengths(arr, "p_min", 0.5, 2).past_recorded) == [False]


def test_engine_confidence_config_replays_as_its_rule(tmp_path: Path) -> None:
    trace = synthetic_trace(seed=4, rounds=24)
    cfg = tmp_path / "p_min.json"
    cfg.write_text(json.dumps({"strategy": "p_min", "p_min": 0.7, "n_max": 2}))
    (res,) = evaluate(trace_arrays(trace), [PolicySpec("config", path=cfg)], None)
    rows = [(s.accepted_drafts[i], p_min_rule(list(s.draft_probs[i]), 0.7, 2)) for s in trace
            for i in range(s.batch_size)]
    assert res.overall.acceptance_length == pytest.approx(1 + sum(min(a, n) for a, n in rows) / len(rows))
    assert res.overall.drafted_per_accepted == pytest.approx(sum(n for _, n in rows) / sum(min(a, n) for a, n in rows))


def test_draft_to_cap_charges_n_max_draft_steps() -> None:
    arr = trace_arrays(synthetic_trace(seed=4, rounds=12))
    assert set(replay(arr, PolicySpec("p_min", 0.95), draft_to_cap=True).draft_steps) == {5}
    assert set(replay(arr, PolicySpec("p_min", 0.95), n_max=3, draft_to_cap=True).draft_steps) == {3}
    stop = replay(arr, PolicySpec("p_min", 0.95)).draft_steps
    assert max(stop) < 5  # probabilities above 0.95 are rare: the longest row stops early


def test_old_trace_replays_static_ema_and_oracle() -> None:
    trace = [TraceStep(1, (3,), 3), TraceStep(2, (0, 2), 3)]
    cmp = compare(trace, ["static:1,3", "ema", "oracle"])
    acc = {r.spec.label: r.overall.acceptance_length for r in cmp.results}
    assert acc["static:1"] == 1 + (1 + 0 + 1) / 3
    assert acc["static:3"] == 1 + (3 + 0 + 2) / 3
    assert acc["oracle"] == acc["static:3"]
    assert "oracle-capped" not in acc  # needs a step-time model
    assert any("p_min and specdec left out" in n for n in compare(trace, ["all"]).notes)
    with pytest.raises(UserError, match="p_min needs per-position draft probabilities"):
        compare(trace, ["p_min:0.5"])


# ---- step-time models ----

def test_fit_recovers_known_coefficients() -> None:
    rng = np.random.default_rng(7)
    n = 200
    b = rng.integers(1, 33, n).astype(float)
    d = rng.integers(0, 7, n).astype(float)
    w = np.minimum(d, rng.integers(0, 7, n)) + 1
    v = np.array([rng.integers(bi, bi * wi + 1) for bi, wi in zip(b, w)], dtype=float)  # ragged: b <= V <= b * W
    c = rng.integers(0, 20000, n).astype(float)
    true = {"d_step": 0.7, "d_row": 0.03, "v_fixed": 8.0, "v_padded": 0.2, "v_ctx": 0.05, "v_row": 0.1,
            "v_tokens": 0.15}
    draft = d * (true["d_step"] + true["d_row"] * b)
    verify = (true["v_fixed"] + true["v_padded"] * b * w + true["v_ctx"] * w * c / 1000 + true["v_row"] * b
              + true["v_tokens"] * v)
    model = fit_step_time(RoundShape(b, d, w, v, c), draft, verify)
    assert model.dropped == ()
    for name, value in true.items():
        assert model.coef[name] == pytest.approx(value, rel=1e-6), name
    assert model.rel_rmse < 1e-9


def test_fit_from_one_width_drops_what_it_cannot_tell_apart() -> None:
    model = fit_trace_step_time(synthetic_trace(seed=1, rounds=60))
    assert model is not None
    assert set(model.dropped) == {"v_row", "v_tokens"}  # one width: b and V are b * W over again
    assert model.widths == (6,)
    for name, value in {"d_step": D_STEP, "d_row": D_ROW, "v_fixed": V_FIXED, "v_padded": V_PADDED,
                        "v_ctx": V_CTX}.items():
        assert model.coef[name] == pytest.approx(value, rel=1e-3, abs=1e-4), name


def _cells_sweep(folder: Path) -> Path:
    """A sweep summary.csv of static cells, K 0, 2, 4 at concurrency 1 and 4 (K=4 at 1 measured below K=2)."""
    rows = ["steps,concurrency,repeat,status,batch_size_mean,engine_round_ms"]
    for k, c, ms in [(0, 1, 10.0), (0, 4, 14.0), (2, 1, 13.0), (2, 4, 19.0), (4, 1, 12.5), (4, 4, 25.0)]:
        rows.append(f"{k},{c},0,ok,{c},{ms}")
    (folder / "summary.csv").write_text("\n".join(rows) + "\n")
    return folder


def test_cells_model_interpolates_and_is_monotone(tmp_path: Path) -> None:
    model = cells_step_time(_cells_sweep(tmp_path))
    one = np.array([1.0])

    def at(b: float, k: float) -> float:
        return float(model.round_ms(np.array([b]), np.array([k]), np.array([k + 1]), one, one * 0)[0])

    assert at(1, 0) == 10.0
    assert at(4, 2) == 19.0
    assert at(2, 0) == pytest.approx(10.0 + (14.0 - 10.0) / 3)  # linear in batch size
    assert at(1, 1) == pytest.approx(11.5)  # linear in K
    assert at(1, 4) == 13.0  # 12.5 measured below K=2's 13.0: held at 13.0 (non-decreasing in K)
    assert at(4, 6) == pytest.approx(25.0 + (25.0 - 19.0))  # beyond the largest K: the last slope
    assert at(8, 0) == 14.0  # flat beyond the largest batch size


def test_cells_model_of_one_repeat_reads_that_repeat_only(tmp_path: Path) -> None:
    rows = ["steps,concurrency,repeat,status,batch_size_mean,engine_round_ms",
            "0,1,0,ok,1,10.0", "0,1,1,ok,1,16.0", "0,1,2,ok,1,11.0"]
    (tmp_path / "summary.csv").write_text("\n".join(rows) + "\n")
    one = np.array([1.0])

    def at(model) -> float:
        return float(model.round_ms(one, one * 0, one, one, one * 0)[0])

    assert (at(cells_step_time(tmp_path)), at(cells_step_time(tmp_path, repeat=1))) == (11.0, 16.0)


def test_cells_model_keys_a_cell_on_the_rows_its_rounds_ran(tmp_path: Path) -> None:
    """The engine's rows per round (engine_round_rows), not the running-requests gauge's mean, place a cell."""
    rows = ["steps,concurrency,repeat,status,batch_size_mean,engine_round_ms,engine_round_rows",
            "0,1,0,ok,1,10.0,1", "0,4,0,ok,3.9,14.0,3.5"]
    (tmp_path / "summary.csv").write_text("\n".join(rows) + "\n")
    one = np.array([1.0])
    model = cells_step_time(tmp_path)
    assert float(model.round_ms(one * 3.5, one * 0, one, one, one * 0)[0]) == 14.0


def test_cells_model_charges_the_verify_width_and_each_draft_step_beyond_it(tmp_path: Path) -> None:
    """A p_min round whose longest row stops before the cap computes one position more than it verifies (D = W):
    the static round of the verified width plus one draft step, not the static round one position wider."""
    model = cells_step_time(_cells_sweep(tmp_path), draft_step=(1.0, 0.25))
    one = np.array([1.0])

    def at(b: float, d: float, w: float) -> float:
        return float(model.round_ms(np.array([b]), np.array([d]), np.array([w]), one, one * 0)[0])

    assert at(4, 2, 3) == 19.0  # a static shape: the cell itself
    assert at(4, 3, 3) == pytest.approx(19.0 + 1.0 + 0.25 * 4)  # K=2's verify and one more draft step
    assert at(1, 1, 1) == pytest.approx(10.0 + 1.25)  # every row stopped at its first position
    assert at(4, 4, 5) == 25.0  # the longest row reached the cap: no position beyond the verify
    before = cells_step_time(tmp_path)  # no draft step known: charged the static round at K = max(D, W - 1)
    assert float(before.round_ms(np.array([4.0]), np.array([3.0]), np.array([3.0]), one, one * 0)[0]) == 22.0


def test_simulate_with_a_sweep_takes_the_draft_step_from_the_trace(tmp_path: Path) -> None:
    cmp = compare(synthetic_trace(seed=1, rounds=60), ["p_min:0.5"], sweep=_cells_sweep(tmp_path))
    assert cmp.model.draft_step == pytest.approx((D_STEP, D_ROW), rel=1e-3)
    untimed = [TraceStep(s.batch_size, s.accepted_drafts, s.num_steps, None, s.drafted, s.draft_probs)
               for s in synthetic_trace(seed=1, rounds=60)]
    assert compare(untimed, ["p_min:0.5"], sweep=tmp_path).model.draft_step is None


def test_oracle_bounds_every_policy_under_the_cells_model(tmp_path: Path) -> None:
    trace = synthetic_trace(seed=5, rounds=160, noise=0.05)
    cmp = compare(trace, ["all"], sweep=_cells_sweep(tmp_path))
    capped = next(r for r in cmp.results if r.spec.kind == "oracle-capped")
    others = [r for r in cmp.results if not r.spec.kind.startswith("oracle")]
    for r in others:
        assert capped.overall.tok_s >= r.overall.tok_s, r.spec.label
        for b, m in r.by_batch.items():
            assert capped.by_batch[b].tok_s >= m.tok_s, (r.spec.label, b)


# ---- the oracle bound and threshold picking ----

def test_oracle_is_at_or_above_every_policy() -> None:
    trace = synthetic_trace(seed=5, rounds=160, with_accept_probs=True, noise=0.05)
    cmp = compare(trace, ["all", "specdec-raw:0.3,0.6"])
    oracle = next(r for r in cmp.results if r.spec.kind == "oracle")
    capped = next(r for r in cmp.results if r.spec.kind == "oracle-capped")
    others = [r for r in cmp.results if not r.spec.kind.startswith("oracle")]
    assert len(others) > 20
    for r in others:
        assert oracle.overall.acceptance_length >= r.overall.acceptance_length, r.spec.label
        assert capped.overall.tok_s >= r.overall.tok_s, r.spec.label
        for b, m in r.by_batch.items():
            assert oracle.by_batch[b].acceptance_length >= m.acceptance_length, (r.spec.label, b)
            assert capped.by_batch[b].tok_s >= m.tok_s, (r.spec.label, b)
    assert capped.overall.tok_s >= oracle.overall.tok_s


def test_threshold_picking_finds_the_informative_threshold() -> None:
    """Draft probabilities 0.9 on accepted positions, 0.35 at the first rejection, 0.2 after, every row rejected
    before num_steps: p_min 0.4 drafts exactly the accepted tokens (the oracle's lengths), 0.1 drafts all 4 (the
    same tokens in more time), 0.95 nothing; with a round's time mostly fixed, 0.4 is the best at every batch
    size, a little behind the oracle, which never computes the draft position that stops a row."""
    rng = np.random.default_rng(11)
    steps = []
    for r in range(80):
        b = (1, 4, 16)[r % 3]
        acc = tuple(int(a) for a in rng.integers(0, 4, b))
        probs = tuple(tuple(0.9 if j < a else (0.35 if j == a else 0.2) for j in range(4)) for a in acc)
        steps.append(TraceStep(b, acc, 4, None, (4,) * b, probs, None, None, 4 * (0.3 + 0.02 * b), 5.0 + 0.05 * b * 5))
    cmp = compare(steps, ["p_min:0.1,0.4,0.95", "oracle"])
    best = best_per_batch(cmp.results)["p_min"]
    assert {b: r.spec.value for b, r in best.items()} == {1: 0.4, 4: 0.4, 16: 0.4}
    p04 = next(r for r in cmp.results if r.spec.label == "p_min:0.4")
    oracle = next(r for r in cmp.results if r.spec.label == "oracle")
    assert p04.overall.acceptance_length == oracle.overall.acceptance_length
    assert p04.overall.tok_s < oracle.overall.tok_s  # p_min also computes the position that stops a row


def test_parse_policies() -> None:
    specs = parse_policies(["p-min:0.5,0.1", "static:2", "oracle", "static:2"], True, 4)
    assert [s.label for s in specs] == ["static:2", "p_min:0.1", "p_min:0.5", "oracle", "oracle-capped"]
    assert [s.label for s in parse_policies(["static"], False, 2)] == ["static:0", "static:1", "static:2"]
    assert not any(s.kind == "p_min" for s in parse_policies(["all"], False, 2))  # nothing to read them from


# ---- CLI ----

def test_cli_config_alone_with_an_engine_rule_compares(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, synthetic_trace(seed=2, rounds=16))
    cfg = tmp_path / "specdec.json"
    cfg.write_text(json.dumps({"strategy": "specdec", "threshold": 0.5, "n_max": 3}))
    out = tmp_path / "cmp.json"
    res = CliRunner().invoke(app, ["simulate", "--trace", str(trace), "--config", str(cfg), "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert [p["policy"] for p in json.loads(out.read_text())["policies"]] == [
        "static:3", "config:specdec.json", "oracle", "oracle-capped"]


def test_cli_compares_policies_and_writes_json(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, synthetic_trace(seed=2, rounds=48, with_accept_probs=True, noise=0.03))
    out = tmp_path / "cmp.json"
    res = CliRunner().invoke(app, ["simulate", "--trace", str(trace), "--policy", "static:1,3", "--policy",
                                   "p_min:0.3,0.6", "--policy", "specdec:0.5", "--policy", "oracle", "--json",
                                   str(out)], env={"COLUMNS": "140"})
    assert res.exit_code == 0, res.output
    assert "best per batch size" in res.output
    assert "p_min:0.3" in res.output
    data = json.loads(out.read_text())
    assert [p["policy"] for p in data["policies"]] == ["static:1", "static:3", "p_min:0.3", "p_min:0.6",
                                                       "specdec:0.5", "oracle", "oracle-capped"]
    assert data["step_time_model"]["kind"] == "trace"
    assert set(data["best_per_batch_size"]["p_min"]) == {"1", "2", "4", "8"}
    for p in data["policies"]:
        assert set(p["by_batch_size"]) == {"1", "2", "4", "8"}
        assert math.isfinite(p["overall"]["tok_s"])


@pytest.mark.parametrize("args,match", [
    (["--policy", "bogus"], "unknown policy 'bogus'"),
    (["--policy", "p_min:2"], "thresholds are probabilities in \\[0, 1\\]"),
    (["--policy", "p_min:x"], "'x' is not a number"),
    (["--policy", "config:nowhere.json"], "no such config file"),
    (["--policy", "specdec"], "specdec needs per-position draft probabilities"),
    (["--config", "CFG", "--n-max", "3"], "--n-max applies to the policy comparison"),
    (["--policy", "static:1", "--sweep", "nowhere"], "no such file or folder"),
])
def test_cli_errors_are_one_line(tmp_path: Path, args: list[str], match: str) -> None:
    trace = tmp_path / "old.jsonl"
    write_trace(trace, [TraceStep(1, (1,), 2)] * 3)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": [1, 2]}}))
    args = [str(cfg) if a == "CFG" else a for a in args]
    res = CliRunner().invoke(app, ["simulate", "--trace", str(trace), *args])
    assert isinstance(res.exception, UserError), res.output
    assert "\n" not in str(res.exception)
    assert re.search(match, str(res.exception)), str(res.exception)
