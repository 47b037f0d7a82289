"""The per-row draft-length rules (``p_min``, ``specdec``) and the verifier's per-row lengths, on small tensors."""

from __future__ import annotations

import pytest
import torch

from spectune.backends.local.engine.draft_length import DraftRule
from spectune.backends.local.engine.sampling import SamplingTensors, verify
from spectune.backends.num_steps import parse_any_config
from spectune.backends.num_steps.confidence_config import ConfidenceConfig


def _run(rule: DraftRule, probs: list[list[float]], p_hat: torch.nn.Module | None = None) -> list[int]:
    """Feed per-step confidences [K][B] through ``rule``; return each row's length."""
    rule.begin(len(probs[0]), torch.device("cpu"))
    for step in probs:
        rule.observe(torch.zeros(len(step), 4), torch.tensor(step))
    return rule.lengths.tolist()


def test_p_min_stops_before_the_first_token_under_the_threshold() -> None:
    # row 0: 0.9, 0.7, 0.4 -> stops at the third (0.4 < 0.5): 2 drafted; row 1: 0.3 first -> 0; row 2: never -> 3
    probs = [[0.9, 0.3, 0.8], [0.7, 0.9, 0.6], [0.4, 0.9, 0.55]]
    assert _run(DraftRule("p_min", 0.5, 3), probs) == [2, 0, 3]


def test_p_min_does_not_resume_after_a_stop() -> None:
    assert _run(DraftRule("p_min", 0.5, 3), [[0.4], [0.9], [0.9]]) == [0]


def test_specdec_keeps_the_token_that_crosses_the_threshold() -> None:
    # h = 0.5: row 0 survival 0.9, 0.9*0.7 = 0.63, 0.63*0.5 = 0.315 -> 1 - 0.315 > 0.5 at token 3 (kept): 3
    # row 1: 0.4 -> 1 - 0.4 = 0.6 > 0.5 at token 1 (kept): 1
    probs = [[0.9, 0.4], [0.7, 0.99], [0.5, 0.99]]
    assert _run(DraftRule("specdec", 0.5, 3), probs) == [3, 1]


def test_specdec_reads_the_acceptance_head_when_one_is_given() -> None:
    class Constant(torch.nn.Module):
        def forward(self, feature: torch.Tensor, prob: torch.Tensor) -> torch.Tensor:
            return torch.full_like(prob, 0.1)  # predicts rejection everywhere

    assert _run(DraftRule("specdec", 0.5, 3, Constant()), [[0.99], [0.99], [0.99]]) == [1]


def test_verify_accepts_at_most_each_rows_length_and_takes_the_bonus_there() -> None:
    v = 6
    target = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])  # the target's argmax after each input
    logits = torch.nn.functional.one_hot(target, v).float() * 10  # [2, 4, V]
    drafts = torch.tensor([[1, 2, 3], [1, 2, 3]])  # every draft matches the target
    st = SamplingTensors.build([0.0, 0.0], [0, 0], [1.0, 1.0], torch.device("cpu"))
    accepted, tokens = verify(logits, drafts, st, lengths=torch.tensor([3, 1]))
    assert accepted.tolist() == [3, 1]
    assert tokens[1, 1].item() == 2  # row 1's bonus token: the target's choice after its one draft


def test_verify_with_lengths_samples_the_bonus_from_the_target_not_the_residual() -> None:
    """A row whose drafts end at L_b was not rejected there: its bonus token may be the padded draft's own token."""
    v = 4
    logits = torch.full((1, 3, v), -30.0)
    logits[0, :, 2] = 30.0  # the target puts all its mass on token 2 at every position
    drafts = torch.tensor([[2, 2]])
    st = SamplingTensors.build([1.0], [0], [1.0], torch.device("cpu"))
    accepted, tokens = verify(logits, drafts, st, torch.Generator().manual_seed(0), lengths=torch.tensor([1]))
    assert accepted.item() == 1
    assert tokens[0, 1].item() == 2  # the residual rule would have removed token 2 (the next draft) and failed


def test_confidence_configs_parse_and_reject_bad_values() -> None:
    cfg = parse_any_config({"strategy": "specdec", "threshold": 0.3, "n_max": 5, "acceptance_head": "bundled"})
    assert cfg == ConfidenceConfig("specdec", 0.3, 5, "bundled")
    with pytest.raises(ValueError, match="'n_max' must be an integer >= 1"):
        parse_any_config({"strategy": "p_min", "p_min": 0.3, "n_max": 0})
    with pytest.raises(ValueError, match="unknown key"):
        parse_any_config({"strategy": "p_min", "p_min": 0.3, "n_max": 2, "threshold": 0.1})
