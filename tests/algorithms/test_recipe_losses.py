"""Golden values for the recipes' losses (SPIN's DPO, SPPO, PRIME, on-policy distillation), computed by hand.

Each expected number is derived in the comment beside it from the formula in the module docstring, not by
calling the function under test.  Gradients are checked where the sign decides whether the recipe learns.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hybridflow.algorithms import get_adv_estimator_fn, get_policy_loss_fn, with_global_batch_info
from hybridflow.algorithms.distillation import DistillationSettings, compute_distillation_loss, distillation_token_losses
from hybridflow.algorithms.preference import compute_online_dpo_loss, compute_onlinedpo_pref, pair_rows
from hybridflow.algorithms.prime import (
    compute_ce_dpo_loss_rm,
    compute_dpo_accuracy,
    compute_prime_advantage,
    implicit_process_rewards,
    masked_rloo,
    prime_norm,
)
from hybridflow.algorithms.sppo import compute_sppo_advantage, softmean


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


T = torch.tensor


def close(x: torch.Tensor, expected, tol: float = 1e-6) -> bool:
    return torch.allclose(x.detach().float(), torch.tensor(expected, dtype=torch.float32), atol=tol)


# ---------------------------------------------------------------------------------------------- DPO (SPIN)
def test_dpo_sigmoid_loss_and_logit():
    # z = (-2 - -3) - (-2.5 - -2.5) = 1; loss = -log sigmoid(0.1 * 1) = softplus(-0.1) = 0.64439666
    loss, z = compute_online_dpo_loss(T([-2.0]), T([-3.0]), T([-2.5]), T([-2.5]), beta=0.1)
    assert z.item() == pytest.approx(1.0)
    assert loss.item() == pytest.approx(0.6443966600735709, abs=1e-6)


def test_dpo_label_smoothing_ipo_and_reference_free():
    # eps = 0.1: 0.9 * softplus(-0.1) + 0.1 * softplus(0.1) = 0.65439666
    loss, _ = compute_online_dpo_loss(T([-2.0]), T([-3.0]), T([-2.5]), T([-2.5]), beta=0.1, label_smoothing=0.1)
    assert loss.item() == pytest.approx(0.6543966600735709, abs=1e-6)
    # ipo: (z - 1/(2 beta))^2 = (1 - 5)^2 = 16
    loss, _ = compute_online_dpo_loss(T([-2.0]), T([-3.0]), T([-2.5]), T([-2.5]), beta=0.1, loss_type="ipo")
    assert loss.item() == pytest.approx(16.0)
    # reference (-1, -3) makes z = 1 - 2 = -1: softplus(0.1) = 0.74439666; reference-free ignores it: z = 1
    loss, z = compute_online_dpo_loss(T([-2.0]), T([-3.0]), T([-1.0]), T([-3.0]), beta=0.1)
    assert z.item() == pytest.approx(-1.0) and loss.item() == pytest.approx(0.744396660073571, abs=1e-6)
    loss, _ = compute_online_dpo_loss(T([-2.0]), T([-3.0]), T([-1.0]), T([-3.0]), beta=0.1, reference_free=True)
    assert loss.item() == pytest.approx(0.6443966600735709, abs=1e-6)


def test_dpo_gradient_raises_chosen_and_lowers_rejected():
    # d loss / d L(c) = -beta * sigmoid(-beta z) = -0.1 * sigmoid(-0.1) = -0.04750208; d/d L(r) = +0.04750208
    pc, pr = T([-2.0], requires_grad=True), T([-3.0], requires_grad=True)
    loss, _ = compute_online_dpo_loss(pc, pr, T([-2.5]), T([-2.5]), beta=0.1)
    loss.sum().backward()
    expected = 0.1 / (1.0 + math.exp(0.1))
    assert pc.grad.item() == pytest.approx(-expected, abs=1e-7)
    assert pr.grad.item() == pytest.approx(expected, abs=1e-7)


def test_online_dpo_preference_pairs_adjacent_rows():
    # pair sums: (1, 0) -> first; (0, 1) -> second; (0.5, 0.5) tie -> first
    rewards = T([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 1.0], [0.5, 0.0], [0.0, 0.5]])
    chosen = compute_onlinedpo_pref(rewards, torch.ones_like(rewards))
    assert chosen.tolist() == [True, False, False, True, True, False]
    c, r = pair_rows(T([10.0, 11.0, 12.0, 13.0, 14.0, 15.0]), chosen)
    assert c.tolist() == [10.0, 13.0, 14.0] and r.tolist() == [11.0, 12.0, 15.0]
    with pytest.raises(ValueError, match="rollout.n=2"):
        compute_onlinedpo_pref(rewards[:3], torch.ones_like(rewards[:3]))


# ---------------------------------------------------------------------------------------------- SPPO
def test_softmean():
    # (1/1) log((e + 1 + 1 + e)/4) = log((e + 1)/2) = 0.62011451; beta = 0: the mean 0.5
    assert softmean(T([1.0, 0.0, 0.0, 1.0]), 1.0).item() == pytest.approx(0.6201145069582775, abs=1e-6)
    assert softmean(T([1.0, 0.0, 0.0, 1.0]), 0.0).item() == pytest.approx(0.5)


class _Algo:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_sppo_advantage_over_the_batch_and_over_groups():
    rewards = torch.zeros(4, 3)
    rewards[:, -1] = T([1.0, 1.0, 0.0, 1.0])
    mask = torch.ones(4, 3)
    index = np.array(["a", "a", "b", "b"], dtype=object)
    # batch: softmean_1([1,1,0,1]) = log((3e + 1)/4) = 0.82798894 -> [0.172011, 0.172011, -0.827989, 0.172011]
    adv, ret = get_adv_estimator_fn("sppo")(rewards, mask, index=index, config=_Algo(sppo_eta=1.0))
    sm = 0.8279889392428698
    assert adv[:, 0].tolist() == pytest.approx([1 - sm, 1 - sm, -sm, 1 - sm], abs=1e-6)
    assert torch.equal(adv, ret) and bool((adv[:, 1] == adv[:, 0]).all())
    # group: [1, 1] -> 0, 0; [0, 1] -> softmean log((1 + e)/2) = 0.62011451 -> [-0.620115, 0.379885]
    adv, _ = compute_sppo_advantage(rewards, mask, index=index,
                                    config=_Algo(sppo_eta=1.0, sppo_softmean_scope="group"))
    g = 0.6201145069582775
    assert adv[:, 0].tolist() == pytest.approx([0.0, 0.0, -g, 1 - g], abs=1e-6)


def test_sppo_loss_golden_and_gradient():
    loss_fn = get_policy_loss_fn("sppo")
    old = torch.zeros(2, 2)
    lp = T([[0.3, 0.2], [-0.2, 9.0]], requires_grad=True)  # row 1's second token is padding (its 9 must not count)
    mask = T([[1.0, 1.0], [1.0, 0.0]])
    adv = T([[0.3, 0.3], [-0.1, 0.0]])
    # log-ratios 0.5 and -0.2; eta = 1: ((0.5-0.3)^2 + (-0.2+0.1)^2)/2 = (0.04 + 0.01)/2 = 0.025
    loss, m = loss_fn(old, lp, adv, mask, "token-mean", _Algo(sppo_eta=1.0))
    assert loss.item() == pytest.approx(0.025, abs=1e-7)
    assert m["actor/sppo_log_ratio"].item() == pytest.approx(0.15) and m["actor/sppo_target"].item() == pytest.approx(0.1)
    loss.backward()
    # d/d lp[0, t] = 2 (0.5 - 0.3) / 2 = 0.2; d/d lp[1, 0] = 2 (-0.2 + 0.1) / 2 = -0.1; padding 0
    assert close(lp.grad, [[0.2, 0.2], [-0.1, 0.0]], 1e-6)
    # eta = 2: ((0.5 - 0.6)^2 + (-0.2 + 0.2)^2)/2 = 0.005
    loss, _ = loss_fn(old, lp.detach(), adv, mask, "token-mean", _Algo(sppo_eta=2.0))
    assert loss.item() == pytest.approx(0.005, abs=1e-7)


def test_sppo_loss_uses_the_global_sequence_count():
    # the same two rows split over two micro-batches with the global count 2 sum to the whole-batch loss
    loss_fn = get_policy_loss_fn("sppo")
    lp, mask, adv = T([[0.3, 0.2], [-0.2, 9.0]]), T([[1.0, 1.0], [1.0, 0.0]]), T([[0.3, 0.3], [-0.1, 0.0]])

    class Actor:
        sppo_eta = 1.0
        loss_scale_factor = None

    view = with_global_batch_info(Actor(), global_batch_size=2, global_token_num=3, dp_size=1)
    parts = [loss_fn(torch.zeros(1, 2), lp[i:i + 1], adv[i:i + 1], mask[i:i + 1], "token-mean", view)[0]
             for i in range(2)]
    assert (parts[0] + parts[1]).item() == pytest.approx(0.025, abs=1e-7)


# ---------------------------------------------------------------------------------------------- PRIME
def test_implicit_process_rewards_token_and_whole():
    rm, ref = T([[-1.0, -2.0], [-0.5, 0.0]]), T([[-1.5, -1.0], [-1.0, 5.0]])
    mask = T([[1.0, 1.0], [1.0, 0.0]])
    # q = [[0.5, -1], [0.5, 0 (padding)]]; r = 0.05 q
    r, q = implicit_process_rewards(rm, ref, mask, beta=0.05, granularity="token")
    assert close(q, [[0.5, -1.0], [0.5, 0.0]], 1e-6)
    assert close(r, [[0.025, -0.05], [0.025, 0.0]], 1e-6)
    # whole: the row sum on the last valid token: row 0 -0.025 at t=1, row 1 0.025 at t=0
    r, _ = implicit_process_rewards(rm, ref, mask, beta=0.05, granularity="whole")
    assert close(r, [[0.0, -0.025], [0.025, 0.0]], 1e-6)


def test_prime_ce_loss_and_its_direction():
    q = T([[0.5, -1.0], [0.5, 0.0]], requires_grad=True)
    mask = T([[1.0, 1.0], [1.0, 0.0]])
    # logits 0.05 * (-0.5) = -0.025 (label 1) and 0.05 * 0.5 = 0.025 (label 0): both -log sigmoid(-0.025)
    # = softplus(0.025) = 0.70572530
    loss = compute_ce_dpo_loss_rm(q, T([1.0, 0.0]), mask, beta=0.05)
    assert loss.item() == pytest.approx(softplus(0.025), abs=1e-6)
    loss.backward()
    # the correct response's log-ratio must be pushed up, the wrong one's down
    assert q.grad[0, 0] < 0 and q.grad[1, 0] > 0 and q.grad[1, 1] == 0


def test_prime_norm():
    # reverse cumsums: row 0 [-2, -3], row 1 [2, 0] -> max |.| = 3
    out = prime_norm(T([[1.0, -3.0], [2.0, 0.0]]), "batch_norm")
    assert close(out, [[1 / 3, -1.0], [2 / 3, 0.0]], 1e-5)
    assert prime_norm(T([[1.0]]), "none").item() == 1.0


def test_prime_advantage_golden():
    index = np.array(["p", "p"], dtype=object)
    mask = T([[1.0, 1.0], [1.0, 0.0]])
    process = T([[0.2, 0.4], [0.6, 0.0]])
    acc = T([1.0, 0.0])
    # process RLOO: row means 0.3, 0.6, sum 0.9, n = 2: r * 2 - 0.9 -> [[-0.5, -0.1], [0.3]]
    assert close(masked_rloo(process, mask, index), [[-0.5, -0.1], [0.3, 0.0]], 1e-6)
    # outcome on the last token: [1] and [0] -> 1*2 - 1 = 1, 0*2 - 1 = -1; with coefs 5 and 5:
    # totals [[-2.5, -0.5 + 5], [1.5 - 5]] = [[-2.5, 4.5], [-3.5]]; returns-to-go [[2.0, 4.5], [-3.5]]
    # whitened over (2, 4.5, -3.5): mean 1, unbiased var 33.5/2 = 16.75 -> [0.244339, 0.855186, -1.099525]
    zeros = torch.zeros(2, 2)
    adv, ret = compute_prime_advantage(zeros, mask, index=index, config=_Algo(reward_dpo_coef=5.0, reward_gt_coef=5.0),
                                       process_rewards=process, acc=acc, token_level_scores=zeros)
    assert close(ret, [[2.0, 4.5], [-3.5, 0.0]], 1e-5)
    assert close(adv, [[0.2443389, 0.8551861], [-1.0995250, 0.0]], 1e-5)
    # a KL penalty the reward stage subtracted (rewards - scores) enters the per-token total: -1 on row 0's first token
    penalty = T([[-1.0, 0.0], [0.0, 0.0]])
    _, ret = compute_prime_advantage(penalty, mask, index=index, config=_Algo(reward_dpo_coef=5.0, reward_gt_coef=5.0),
                                     process_rewards=process, acc=acc, token_level_scores=zeros)
    assert close(ret, [[1.0, 4.5], [-3.5, 0.0]], 1e-5)


def test_prime_dpo_accuracy():
    index = np.array(["p", "p", "q", "q"], dtype=object)
    mask = torch.ones(4, 1)
    # group p: scores 1 > 0 and labels 1 > 0 -> 1; group q: labels equal -> 0.5; mean 0.75
    acc = compute_dpo_accuracy(T([[1.0], [0.0], [3.0], [2.0]]), T([1.0, 0.0, 1.0, 1.0]), mask, index)
    assert acc.item() == pytest.approx(0.75)


# ---------------------------------------------------------------------------------------------- distillation
def test_distillation_estimators_golden():
    s, t = T([[-1.0, -2.0]]), T([[-1.5, -1.0]])  # d = s - t = [0.5, -1]
    def est(**kw):
        return distillation_token_losses(s, t, DistillationSettings(**kw)).tolist()[0]
    assert est(loss_mode="k1", use_policy_gradient=True) == pytest.approx([0.5, -1.0])
    assert est(loss_mode="k2") == pytest.approx([0.125, 0.5])
    assert est(loss_mode="abs") == pytest.approx([0.5, 1.0])
    # k3 = exp(-d) + d - 1: exp(-0.5) - 0.5 = 0.10653066, e - 2 = 0.71828183
    assert est(loss_mode="k3") == pytest.approx([0.10653066, 0.71828183], abs=1e-6)
    assert est(loss_mode="k3", loss_max_clamp=0.6) == pytest.approx([0.10653066, 0.6], abs=1e-6)
    # log_prob_min_clamp = -1.2 floors the teacher's -1.5 and the student's -2: d = [0.2, -0.2]
    assert est(loss_mode="k1", use_policy_gradient=True, log_prob_min_clamp=-1.2) == pytest.approx([0.2, -0.2])
    with pytest.raises(ValueError, match="does not depend on the teacher"):
        DistillationSettings(loss_mode="k1", use_policy_gradient=False)


def test_distillation_as_loss_and_as_reward():
    s = T([[-1.0, -2.0]], requires_grad=True)
    t, mask = T([[-1.5, -1.0]]), torch.ones(1, 2)
    # k3 as a loss, token-mean: (0.10653066 + 0.71828183)/2 = 0.41240624; d/ds = (1 - exp(-d))/2
    term, m = compute_distillation_loss(s.detach(), s, t, mask, "token-mean", None, DistillationSettings(loss_mode="k3"))
    assert term.item() == pytest.approx(0.41240624408583937, abs=1e-6)
    assert m["distillation/reverse_kl_k1"].item() == pytest.approx(-0.25)
    term.backward()
    assert s.grad.tolist()[0] == pytest.approx([(1 - math.exp(-0.5)) / 2, (1 - math.e) / 2], abs=1e-6)
    # k1 as a reward at ratio 1: advantages -d = [-0.5, 1]; loss = mean(-A) = -0.25; d/ds = -A/2 = [0.25, -0.5]
    s2 = T([[-1.0, -2.0]], requires_grad=True)
    term, m = compute_distillation_loss(s2.detach(), s2, t, mask, "token-mean", None,
                                        DistillationSettings(loss_mode="k1", use_policy_gradient=True))
    assert term.item() == pytest.approx(-0.25)
    term.backward()
    assert s2.grad.tolist()[0] == pytest.approx([0.25, -0.5])
    assert "distillation/pg_clipfrac" in m
    # the weights: with task rewards the coefficient applies; without, the distillation term alone (1.0)
    assert DistillationSettings(distillation_loss_coef=0.3).coef == 0.3
    assert DistillationSettings(distillation_loss_coef=0.3, use_task_rewards=False).coef == 1.0
    assert DistillationSettings(use_task_rewards=False).task_coef == 0.0
