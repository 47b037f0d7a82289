"""The native path's dense-copy row count chosen on the whole target forward
(backends/local/weights/whole_step.py whole_step_crossover, choose_dense_on_whole_step): the decision rule on
synthetic forwards, and on the real default pair what the engine records and runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from spectune.backends.local.weights import whole_step
from spectune.backends.local.weights.compute_paths import PathChoice
from spectune.backends.local.weights.whole_step import choose_dense_on_whole_step, whole_step_crossover


@pytest.fixture
def synthetic(monkeypatch):
    """Timing replaced by the forward's own answer: ``forward(rows)()`` returns its cost in ms for the kernel the
    layers are switched to (int4 grows 4 ms a row, the copy costs 40 ms + 1 ms a row)."""
    monkeypatch.setattr(whole_step, "_best_ms", lambda fn, reps: fn())
    layers = [SimpleNamespace(dense_above=7) for _ in range(3)]

    def forward(rows: int):
        return lambda: 4.0 * rows if layers[0].dense_above > rows else 40.0 + rows
    return forward, layers


def test_the_copy_is_used_above_the_count_below_where_it_starts_to_win(synthetic) -> None:
    forward, layers = synthetic  # int4 32 ms vs copy 48 at 8 rows; 64 vs 56 at 16: the copy from 16 on
    assert whole_step_crossover(forward, layers, "bfloat16", layer_answer=4)["dense_above_rows"] == 8


def test_a_copy_ahead_by_less_than_the_margin_does_not_win(monkeypatch) -> None:
    """At 8 rows the copy is 3.5% ahead (30.9 against 32 ms), under COPY_MARGIN: int4 keeps 8 rows."""
    monkeypatch.setattr(whole_step, "_best_ms", lambda fn, reps: fn())
    layers = [SimpleNamespace(dense_above=7)]
    forward = lambda rows: (lambda: 4.0 * rows if layers[0].dense_above > rows else 22.9 + rows)  # noqa: E731
    assert whole_step_crossover(forward, layers, "bfloat16", layer_answer=4)["dense_above_rows"] == 8


def test_both_kernels_are_timed_at_every_row_count(synthetic) -> None:
    forward, layers = synthetic
    rows_ms = whole_step_crossover(forward, layers, "bfloat16", layer_answer=4)["rows_ms"]
    assert (rows_ms["int4"]["16"], rows_ms["bfloat16"]["16"]) == (64.0, 56.0)


def test_the_layers_get_their_row_count_back(synthetic) -> None:
    forward, layers = synthetic
    whole_step_crossover(forward, layers, "bfloat16", layer_answer=4)
    assert [m.dense_above for m in layers] == [7, 7, 7]


def test_a_copy_that_never_wins_keeps_a_larger_layer_answer(monkeypatch) -> None:
    monkeypatch.setattr(whole_step, "_best_ms", lambda fn, reps: fn())
    layers = [SimpleNamespace(dense_above=7)]
    forward = lambda rows: (lambda: 1.0 if layers[0].dense_above > rows else 2.0)  # noqa: E731 - int4 always wins
    assert whole_step_crossover(forward, layers, "float32", layer_answer=64)["dense_above_rows"] == 64


def test_a_copy_that_never_wins_is_used_only_past_the_largest_count(monkeypatch) -> None:
    monkeypatch.setattr(whole_step, "_best_ms", lambda fn, reps: fn())
    layers = [SimpleNamespace(dense_above=7)]
    forward = lambda rows: (lambda: 1.0 if layers[0].dense_above > rows else 2.0)  # noqa: E731
    assert whole_step_crossover(forward, layers, "float32", layer_answer=4)["dense_above_rows"] == 32


def test_other_paths_are_left_alone() -> None:
    choice = PathChoice("bfloat16", torch.bfloat16, "measured")
    choose_dense_on_whole_step(choice, None, 1, [SimpleNamespace(dense_above=4)], lambda rows: lambda: None)
    assert (choice.dense_above, choice.whole_step_ms) == (None, {})


@pytest.fixture(scope="module")
def auto_native():
    from spectune.backends.local.build import build_engine
    from spectune.backends.local.options import EngineOptions

    return build_engine(EngineOptions(num_steps=0, draft="none", dtype="native", max_num_seqs=2, max_model_len=256,
                                      kv_cache_gb=0.25, native_lm_head="int4", native_dense_above="auto"))


def test_the_engine_records_the_whole_step_timings_of_both_kernels(auto_native) -> None:
    path = auto_native.path
    if path.dense_dtype is None:
        pytest.skip("no dense copy on this machine (it does not fit, or it never wins)")
    assert set(path.to_json()["dense_whole_step_ms"]) == {"int4", path.dense_dtype}


def test_every_native_layer_runs_the_row_count_the_engine_reports(auto_native) -> None:
    layers = [m for m in auto_native.decoder.target.modules() if hasattr(m, "dense_above") and hasattr(m, "dense")]
    assert {m.dense_above for m in layers} == {auto_native.path.dense_above}
