"""SpecServe (``"strategy": "specserve"``): the step-time fit, the adaptive drafter, the confidence-prior verifier and
the SLO check on synthetic confidences and known time models; the start-up calibration and losslessness on a tiny
engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectune.backends.local.engine.sequence import SamplingParams
from spectune.backends.local.engine.specserve import SpecServeRule
from spectune.backends.num_steps import parse_any_config
from spectune.backends.num_steps.confidence_config import ConfidenceConfig
from spectune.backends.num_steps.step_time import ForwardCost, StepTimeModel, verify_tokens
from helpers.tiny_models import tiny_engine
from helpers.engine import watch_rounds

CPU = torch.device("cpu")
# a draft forward costs 1 ms, a target forward 6 ms + 2 ms per batch token: at one row a round of j >= 1 drafts is
# (j - 1) draft steps + target over j + 1 tokens + the draft extend = (j - 1) + 6 + 2(j + 1) + 1 = 3j + 8 ms
LINEAR = StepTimeModel(ForwardCost(0.0, 0.0, 1.0), ForwardCost(0.0, 2.0, 6.0))


def _draft(rule: SpecServeRule, probs: list[list[float]], context: list[int] | None = None) -> list[int]:
    """Feed per-step confidences [K][B] through ``rule`` as the decoder's loop does (it stops once no row drafts);
    returns each row's drafted length."""
    b = len(probs[0])
    rule.begin(b, CPU, torch.tensor(context or [0] * b))
    for step in probs:
        rule.observe(torch.zeros(b, 4), torch.tensor(step))
        if not bool(rule.active.any()):
            break
    return rule.lengths.tolist()


def test_the_step_time_fit_recovers_known_coefficients_from_synthetic_rounds() -> None:
    draft, target = ForwardCost(2e-5, 0.03, 0.4), ForwardCost(1.5e-4, 0.12, 3.0)
    rounds = [(b, r, s) for b in (1, 4, 16) for r in (1, 3, 5) for s in (5, 300, 900)]
    noise = np.random.default_rng(0).normal(0.0, 0.002, len(rounds))  # ms: timer jitter

    def samples(cost: ForwardCost) -> list[tuple[float, float, float]]:
        out = []
        for (b, r, s), e in zip(rounds, noise):
            n_c, n_b = verify_tokens(b * s, b, r)
            out.append((n_c, n_b, cost.ms(n_c, n_b) + e))
        return out

    for truth in (draft, target):
        fit = ForwardCost.fit(samples(truth))
        assert fit.alpha_ms == pytest.approx(truth.alpha_ms, rel=0.02)
        assert fit.gamma_ms == pytest.approx(truth.gamma_ms, rel=0.02)
        assert fit.delta_ms == pytest.approx(truth.delta_ms, rel=0.02)


def test_the_step_time_fit_needs_forwards_that_separate_the_terms() -> None:
    with pytest.raises(ValueError, match="vary context and batch tokens independently"):
        ForwardCost.fit([(10.0, 1.0, 1.0), (20.0, 2.0, 2.0), (30.0, 3.0, 3.0)])  # N_c proportional to N_b


def test_the_drafter_stops_where_the_model_says_the_next_step_lowers_throughput() -> None:
    c, n_max = 0.8, 6

    def throughput(j: int) -> float:  # Eq. 7-8 at one row of constant confidence, over the model's round time
        return sum(c ** k for k in range(j + 1)) / LINEAR.round_ms(0, 1, j)

    best = next(j for j in range(1, n_max) if throughput(j + 1) <= throughput(j))
    assert 1 < best < n_max  # the case decides something: neither the first step nor the cap
    assert _draft(SpecServeRule(LINEAR, n_max), [[c]] * n_max) == [best]


def test_the_drafter_drafts_on_while_confidence_keeps_the_next_step_worth_it() -> None:
    assert _draft(SpecServeRule(LINEAR, 6), [[0.99]] * 6) == [6]


# two rows, a verify token costs 1 ms: a token is worth verifying while its AR is above the round's tokens per ms
# (about 0.33 here); the drafter runs all 3 steps (its prediction uses the batch's mean confidence)
TOKEN_MS = StepTimeModel(ForwardCost(0.0, 0.0, 0.01), ForwardCost(0.0, 1.0, 10.0))


def test_the_verifier_drops_the_lowest_estimate_tokens_so_rows_verify_different_lengths() -> None:
    # AR row 0: 0.95, 0.9025, 0.857; row 1: 0.9, 0.27, 0.135. Packed, each token costs 1 ms: dropping 0.135 and
    # then 0.27 raises NAT / T (6.02 / 18.0 -> 5.88 / 17.0 -> 5.61 / 16.0), dropping 0.857 next does not (4.75 / 15.0)
    rule = SpecServeRule(TOKEN_MS, 3)
    assert _draft(rule, [[0.95, 0.9], [0.95, 0.3], [0.95, 0.5]]) == [3, 3]
    assert rule.verify_lengths("packed").tolist() == [3, 1]


def test_the_padded_verifier_narrows_the_width_only_when_the_last_column_is_not_worth_its_time() -> None:
    rule = SpecServeRule(TOKEN_MS, 3)
    _draft(rule, [[0.95, 0.9], [0.95, 0.3], [0.95, 0.5]])
    # the last column holds 0.857 and 0.135: dropping both saves 2 ms but loses 0.99 tokens (5.02 / 16.0 < 6.02 / 18.0)
    assert rule.verify_lengths("padded").tolist() == [3, 3]
    assert _draft(rule, [[0.95, 0.9], [0.95, 0.9], [0.2, 0.1]]) == [3, 3]
    # now it holds 0.18 and 0.081: 5.82 / 18.0 -> 5.56 / 16.0 rises; the next column (0.9025, 0.81) would not
    assert rule.verify_lengths("padded").tolist() == [2, 2]


def test_the_slo_check_stops_drafting_before_a_round_over_the_slo() -> None:
    # without an SLO one row of confidence 0.99 drafts 6; a round of j drafts takes 3j + 8 ms (LINEAR)
    slo = LINEAR.round_ms(0, 1, 2) + 0.5
    rule = SpecServeRule(LINEAR, 6, slo_tpot_ms=slo)
    assert _draft(rule, [[0.99]] * 6) == [2]
    assert LINEAR.round_ms(0, 1, rule.verify_lengths("padded").item()) <= slo


def test_the_slo_check_verifies_no_draft_when_one_already_breaks_the_slo() -> None:
    slo = LINEAR.round_ms(0, 1, 0) + 0.5  # a round of plain decoding fits, one with d_1 does not
    for layout in ("padded", "packed"):
        rule = SpecServeRule(LINEAR, 6, slo_tpot_ms=slo)
        _draft(rule, [[0.99]] * 6)
        assert rule.verify_lengths(layout).tolist() == [0]


def test_specserve_config_parses_and_rejects_bad_values() -> None:
    assert parse_any_config({"strategy": "specserve", "n_max": 4, "slo_tpot_ms": 50}) == \
        ConfidenceConfig("specserve", 0.0, 4, slo_tpot_ms=50.0)
    with pytest.raises(ValueError, match="'slo_tpot_ms' must be a number of ms > 0"):
        parse_any_config({"strategy": "specserve", "n_max": 4, "slo_tpot_ms": 0})
    with pytest.raises(ValueError, match="unknown key"):
        parse_any_config({"strategy": "specserve", "n_max": 4, "threshold": 0.5})
    with pytest.raises(ValueError, match="needs 'n_max'"):
        parse_any_config({"strategy": "specserve"})


def test_the_start_up_calibration_fits_a_model_and_keeps_it_per_machine(monkeypatch, tmp_path) -> None:
    from spectune.backends.local.engine.step_time_probe import plan, step_time_model

    monkeypatch.setenv("SPECTUNE_CACHE_DIR", str(tmp_path))
    decoder = tiny_engine(num_steps=3).decoder
    model, source = step_time_model(decoder, 3)
    assert source["calibration"] == "measured"
    assert len(source["samples"]["target"]) == len(source["samples"]["draft"]) == len(plan(decoder, 3))
    again, kept = step_time_model(decoder, 3)
    assert kept["calibration"] == "kept"  # from the cache folder, not measured again
    assert again == model


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_specserve_on_a_tiny_engine_is_lossless_and_packed_rows_verify_their_own_lengths(layout: str) -> None:
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11, 12], [3, 3, 3, 3, 3]]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    expected = tiny_engine(num_steps=0).generate(prompts, params)
    engine = tiny_engine(num_steps=3)
    engine.decoder.rule = SpecServeRule(TOKEN_MS, 3)  # a known model: verifying costs per token, drafting little
    engine.decoder.verify_layout = layout
    rounds = watch_rounds(engine)
    assert engine.generate(prompts, params) == expected
    assert engine.stats.spec.draft_tokens > 0
    # packed: the verifier drops single tokens, so rows of one round differ; padded: only whole columns go
    assert any(len(set(r)) > 1 for r in rounds) == (layout == "packed")
