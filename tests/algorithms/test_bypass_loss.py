"""verl's bypass-mode loss (``algorithm.rollout_correction.bypass_mode=true``, ``loss_type``): the rollout's log-probs
are pi_old and the correction compares them with the policy being trained, inside the loss."""

from __future__ import annotations

import pytest
import torch

from hybridflow.algorithms import compute_policy_loss_vanilla
from hybridflow.algorithms.bypass_loss import BypassSettings, compute_policy_loss_bypass_mode

MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-2.0, -2.0, -2.0, -2.0]])
MU = torch.log(torch.tensor([[0.5, 0.4, 0.2, 0.1], [0.3, 0.6, 0.1, 0.1]]))
# the trained policy has moved: ratios pi/mu = 1.0, 3.0 (above the cap), 0.8 | 1.5, 0.25 (below 1/2)
PI = MU + torch.log(torch.tensor([[1.0, 3.0, 0.8, 1.0], [1.5, 0.25, 1.0, 1.0]]))


def _loss(settings, pi=PI):
    lp = pi.clone().requires_grad_()
    loss, metrics = compute_policy_loss_bypass_mode(MU, lp, ADV, MASK, "token-mean", None, settings)
    loss.backward()
    return loss, lp.grad, metrics


def test_ppo_clip_is_the_clipped_objective_against_the_rollout():
    loss, grad, metrics = _loss(BypassSettings(loss_type="ppo_clip", rollout_is="token"))
    lp = PI.clone().requires_grad_()
    ref, _ = compute_policy_loss_vanilla(MU, lp, ADV, MASK, "token-mean", None)  # no IS weight multiplied in
    ref.backward()
    assert loss.item() == pytest.approx(ref.item()) and torch.allclose(grad, lp.grad)
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0)  # computed for the metrics only


def test_reinforce_weights_each_token_by_the_truncated_ratio():
    loss, grad, metrics = _loss(BypassSettings(loss_type="reinforce", rollout_is="token", rollout_is_threshold=2.0))
    w = torch.tensor([[1.0, 2.0, 0.8, 0.0], [1.5, 0.25, 0.0, 0.0]])  # min(pi/mu, 2) on valid tokens
    tokens = MASK.sum()
    assert loss.item() == pytest.approx((-(w * ADV * PI) * MASK).sum().item() / tokens.item(), rel=1e-6)
    assert torch.allclose(grad, -(w * ADV) * MASK / tokens)  # sg(w): the weight is not differentiated
    assert metrics["rollout_corr/rollout_is_fraction_truncated"] == pytest.approx(1 / 5)
    assert "actor/ppo_kl" in metrics


def test_reinforce_on_policy_is_plain_reinforce():
    loss, grad, _ = _loss(BypassSettings(loss_type="reinforce", rollout_is="token"), pi=MU)
    assert torch.allclose(grad, -ADV * MASK / MASK.sum())


def test_rejection_removes_tokens_outside_the_band():
    _, grad, metrics = _loss(BypassSettings(loss_type="reinforce", rollout_rs="token", rollout_rs_threshold=2.0))
    rejected = torch.tensor([[0, 1, 0, 0], [0, 1, 0, 0]], dtype=torch.bool)  # ratios 3.0 and 0.25
    assert (grad[rejected] == 0).all() and (grad[MASK.bool() & ~rejected] != 0).all()
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)


def test_settings_from_config_and_unknown_loss_type():
    from hybridflow.launch.config import load_config

    cfg = load_config(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "algorithm.adv_estimator=grpo",
                       "actor_rollout_ref.rollout.calculate_log_probs=true",
                       "algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.loss_type=reinforce",
                       "algorithm.rollout_correction.rollout_is=sequence"])
    s = BypassSettings.from_config(cfg.algorithm.rollout_correction)
    assert (s.loss_type, s.rollout_is, s.rollout_is_threshold) == ("reinforce", "sequence", 2.0)
    with pytest.raises(ValueError, match="loss_type='pg'"):
        _loss(BypassSettings(loss_type="pg"))
