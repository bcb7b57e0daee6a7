"""Optimal Token Baseline (OTB) golden values, computed by hand in the comments."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hybridflow.algorithms import compute_advantage, get_adv_estimator_fn, sum_pi_squared_from_logits
from hybridflow.protocol import DataProto


def _inputs():
    # Group "a": response A (2 tokens, reward 1 at its end), response B (1 token, reward 0).
    # Group "c": response C alone (2 tokens, reward 2).
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 2.0]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]])
    old_log_probs = torch.log(torch.tensor([[0.5, 0.25], [0.2, 0.9], [0.5, 0.5]]))
    sum_pi_sq = torch.tensor([[0.5, 0.25], [0.3, 0.9], [0.5, 0.5]])
    index = np.array(["a", "a", "c"], dtype=object)
    return rewards, mask, old_log_probs, sum_pi_sq, index


def test_otb_golden_values():
    rewards, mask, lp, s2, index = _inputs()
    adv, ret = get_adv_estimator_fn("optimal_token_baseline")(
        token_level_rewards=rewards, response_mask=mask, index=index, old_log_probs=lp, sum_pi_squared=s2
    )
    # rewards-to-go G: A [1, 1], B [0, 0], C [2, 2]
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]]))
    # energies w = 1 - 2*pi + sum pi^2 (valid tokens): A [0.5, 0.75] -> W [0.5, 1.25]; B [0.9] -> W [0.9]
    # B*_0(a) = (1*0.5 + 0*0.9) / (0.5 + 0.9) = 5/14;  B*_1(a) = 1*1.25 / 1.25 = 1 (B has ended)
    # C is alone: its baseline is its own return, so its advantage is 0.
    expected = torch.tensor([[1 - 5 / 14, 0.0], [-5 / 14, 0.0], [0.0, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-6)


def test_otb_through_compute_advantage_and_missing_inputs_name_the_fix():
    rewards, mask, lp, s2, index = _inputs()
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask, "old_log_probs": lp, "sum_pi_squared": s2},
        non_tensors={"uid": index},
    )
    out = compute_advantage(data, "optimal_token_baseline")
    assert out.batch["advantages"][0, 0].item() == pytest.approx(9 / 14, abs=1e-6)
    no_s2 = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask, "old_log_probs": lp},
                                non_tensors={"uid": index})
    with pytest.raises(ValueError, match="calculate_sum_pi_squared=true"):
        compute_advantage(no_s2, "optimal_token_baseline")
    # estimators that do not name the new inputs still get the old keywords only (verl-ported custom code)
    out = compute_advantage(data, "grpo")
    assert out.batch["advantages"].shape == rewards.shape


def test_sum_pi_squared_from_logits():
    # softmax([0, ln 3]) = [0.25, 0.75] -> 0.0625 + 0.5625 = 0.625; uniform over 4 -> 0.25
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])
    assert torch.allclose(sum_pi_squared_from_logits(logits), torch.tensor([0.625, 0.5]))
    assert sum_pi_squared_from_logits(torch.zeros(4)).item() == pytest.approx(0.25)
