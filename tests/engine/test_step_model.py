"""The engine's step model and its guard (backends/local/engine/step_model.py): the round formula, the kernel curves
taken from the crossover probe, the once-per-shape warning, and the warning reaching /server_info, /metrics and the
``local`` backend's snapshot on a real default-pair server."""

from __future__ import annotations

import asyncio

import pytest
import requests
import torch
from torch import nn

from spectune.backends.local.engine.step_model import (
    MIN_ROUNDS, SLOW_RATIO, RoundGuard, StepModel, _interp, _kernel_curve, linear_weights,
)
from spectune.backends.local.options import EngineOptions
from spectune.backends.local.weights.compute_paths import PathChoice

from helpers.engine import ThreadedServer, bundled_head_available


def _model(**kw) -> StepModel:
    args = dict(target_ms=10.0, head_ms=2.0, target_weights=1000, head_weights=100, head_lm_weights=40,
                target_curve={1: 0.001, 2: 0.002, 4: 0.004}, head_curve={1: 0.01, 2: 0.02, 4: 0.04}, path="native")
    args.update(kw)
    return StepModel(**args)


def test_a_rounds_own_work_is_added_once_and_drafting_adds_its_own() -> None:
    fixed = _model(round_ms=1.0, draft_round_ms=2.0)
    assert (fixed.predict_ms(2, 0) - _model().predict_ms(2, 0), fixed.predict_ms(2, 3) - _model().predict_ms(2, 3)) == (
        pytest.approx(1.0), pytest.approx(3.0))


def test_each_query_row_pays_for_the_batchs_cached_tokens() -> None:
    # batch 2 at K = 1 holding 300 cached tokens: 2 query rows per sequence over them, 0.001 ms per row per token
    assert _model(ctx_ms=0.001).predict_ms(2, 1, 300) - _model().predict_ms(2, 1) == pytest.approx(0.6)


def test_the_guard_judges_a_shape_at_its_mean_context() -> None:
    model = _model(ctx_ms=0.01)
    guard = RoundGuard(model)
    ok_s = 0.9 * SLOW_RATIO * model.predict_ms(1, 0, 1000) / 1e3  # slow for no context, fine for 1000 tokens
    for _ in range(MIN_ROUNDS):
        guard.record(1, 0, ok_s, 1000)
    assert guard.warnings == []


def test_interp_is_linear_between_probed_counts() -> None:
    assert _interp({2: 1.0, 4: 3.0}, 3) == pytest.approx(2.0)


def test_interp_grows_with_the_rows_beyond_the_largest_count() -> None:
    assert _interp({2: 1.0, 4: 3.0}, 8) == pytest.approx(6.0)


def test_interp_takes_the_smallest_counts_value_below_it() -> None:
    assert _interp({2: 1.0, 4: 3.0}, 1) == pytest.approx(1.0)


def test_a_round_without_drafts_is_one_target_forward() -> None:
    m = _model()
    assert m.predict_ms(2, 0) == pytest.approx(10.0 + 1000 * (0.002 - 0.001))


def test_a_target_forward_at_one_row_is_the_measured_one() -> None:
    assert _model(row_ms=0.5).target_fwd_ms(1) == pytest.approx(10.0)


def test_each_row_beyond_the_first_adds_its_cost_outside_the_linears() -> None:
    assert _model(row_ms=0.5).target_fwd_ms(4) - _model().target_fwd_ms(4) == pytest.approx(1.5)


def test_a_drafting_round_adds_k_lm_heads_k_minus_one_bodies_and_the_extend() -> None:
    m = _model()
    # batch 1, K = 3: target over 4 rows; lm_head (40 of the head's 100 weights) 3x at one row, the body (60)
    # twice at one row and once over 4 rows (the draft extend)
    target = 10.0 + 1000 * (0.004 - 0.001)
    lm, body1, body4 = 2.0 * 0.4, 2.0 * 0.6, 2.0 * 0.6 + 60 * (0.04 - 0.01)
    assert m.predict_ms(1, 3) == pytest.approx(target + 3 * lm + 2 * body1 + body4)


def test_the_native_curve_switches_to_the_dense_kernel_above_dense_above() -> None:
    rows_ms = {"int4": {"1": 1.0, "2": 2.0, "4": 4.0}, "bfloat16": {"1": 5.0, "2": 5.0, "4": 5.0}}
    curve = _kernel_curve(rows_ms, lambda r: "bfloat16" if r > 2 else "int4", probe_weights=1)
    assert curve == {1: 1.0, 2: 2.0, 4: 5.0}


def test_a_kernel_curve_never_falls_with_more_rows() -> None:
    rows_ms = {"int4": {"1": 1.0, "2": 0.8, "4": 3.0}}
    assert _kernel_curve(rows_ms, lambda _: "int4", probe_weights=1)[2] == pytest.approx(1.0)


def test_linear_weights_count_each_pass_of_a_repeated_native_layer() -> None:
    class TwoHalves(nn.Module):
        in_features, out_features, repeat = 8, 4, 2

    net = nn.Sequential(nn.Linear(8, 16, bias=False), TwoHalves())
    assert linear_weights(net) == 8 * 16 + 8 * 4 * 2


def test_the_guard_says_nothing_before_enough_rounds() -> None:
    guard = RoundGuard(_model())
    said = [guard.record(1, 0, 1.0) for _ in range(MIN_ROUNDS - 1)]
    assert said == [None] * (MIN_ROUNDS - 1)


def test_the_guard_flags_a_shape_over_its_ratio_naming_shape_and_path() -> None:
    guard = RoundGuard(_model())
    slow_s = SLOW_RATIO * 1.1 * _model().predict_ms(2, 1) / 1e3
    said = [guard.record(2, 1, slow_s) for _ in range(MIN_ROUNDS)]
    assert "batch 2 x num_steps 1" in said[-1] and "(native)" in said[-1]


def test_the_guard_flags_a_shape_once() -> None:
    guard = RoundGuard(_model())
    for _ in range(30 * MIN_ROUNDS):
        guard.record(1, 2, 1.0)
    assert len(guard.warnings) == 1


def test_the_guard_leaves_a_shape_within_its_ratio_alone() -> None:
    guard = RoundGuard(_model())
    ok_s = 0.9 * SLOW_RATIO * _model().predict_ms(1, 0) / 1e3
    for _ in range(MIN_ROUNDS):
        guard.record(1, 0, ok_s)
    assert guard.warnings == []


def test_a_guard_without_a_model_counts_rounds_but_judges_none() -> None:
    guard = RoundGuard(None)
    for _ in range(MIN_ROUNDS):
        guard.record(1, 0, 10.0)
    assert (guard.shapes[(1, 0)][0], guard.warnings) == (MIN_ROUNDS, [])


@pytest.mark.skipif(not bundled_head_available(), reason="the bundled SmolLM2 head is not installed")
def test_a_slow_shape_reaches_server_info_metrics_and_the_sweeps_snapshot() -> None:
    """The real default pair (float32, uncompiled) with its step model made 100x optimistic: the first shape the
    server runs MIN_ROUNDS rounds of is flagged in /server_info, counted on /metrics and read by the ``local``
    backend's snapshot into ``raw["engine_warnings"]`` (what the sweep records with the point)."""
    from spectune.backends.options import BackendOptions
    from spectune.backends.local.backend import LocalBackend

    server = ThreadedServer(EngineOptions(num_steps=2, dtype="float32", max_num_seqs=2, max_model_len=256,
                                          kv_cache_gb=0.25))
    try:
        real = server.engine.guard.model
        assert real is not None  # a CPU engine builds its model at start-up
        # the start-up rounds that fitted it left their cache slot empty for the first request
        assert (server.engine.decoder.lengths[0], int(server.engine.decoder.seq_len[0])) == (0, 0)
        server.engine.guard.model = StepModel(**{**real.__dict__, "target_ms": real.target_ms / 100,
                                                 "head_ms": real.head_ms / 100, "target_weights": 0,
                                                 "head_weights": 0, "head_lm_weights": 0, "row_ms": 0.0,
                                                 "round_ms": 0.0, "draft_round_ms": 0.0, "ctx_ms": 0.0,
                                                 "checks": []})
        body = {"model": "smollm2-test", "prompt": "Count from one to fifty:", "max_tokens": 3 * MIN_ROUNDS + 5,
                "temperature": 0, "ignore_eos": True}
        assert requests.post(f"{server.url}/v1/completions", json=body, timeout=300).status_code == 200
        info = requests.get(f"{server.url}/server_info", timeout=10).json()["step_model"]
        assert any("batch 1 x num_steps 2" in w for w in info["warnings"])
        metrics = requests.get(f"{server.url}/metrics", timeout=10).text
        assert 'spectune:engine_slow_round_shapes_total{model_name="smollm2-test"} 1.0' in metrics
        backend = LocalBackend(BackendOptions())
        backend._remote_url = server.url  # the snapshot of a server it did not launch (base_url's other source)
        snap = asyncio.run(backend.snapshot())
        assert snap.raw["engine_warnings"] == info["warnings"]
    finally:
        server.close()


def test_a_flag_forced_path_names_itself() -> None:
    from spectune.backends.local.engine.step_model import describe_kernels

    choice = PathChoice("native", torch.bfloat16, "flag", dense_above=8, dense_dtype="bfloat16")
    assert describe_kernels(choice) == "native: int4 up to 8 rows, bfloat16 dense above"
