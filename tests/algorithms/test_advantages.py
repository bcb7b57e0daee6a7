"""Advantage estimators against hand-computed values, the registry, and the batch-level stages."""

from __future__ import annotations

import math
import uuid
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hybridflow.algorithms import (
    AdvantageEstimator,
    FixedKLController,
    AdaptiveKLController,
    UnknownAlgorithmError,
    apply_kl_penalty,
    compute_advantage,
    get_adv_estimator_fn,
    register_adv_est,
)
from hybridflow.protocol import DataProto

T = torch.tensor


def cfg(gamma=1.0, lam=1.0, norm=True):
    return SimpleNamespace(gamma=gamma, lam=lam, norm_adv_by_std_in_grpo=norm)


def outcome_batch():
    """Six responses in groups a,a,a,b,b,c with lengths 1,2,3,1,3,2 and scores 1,0,0,2,4,5
    (the score sits on the last valid token)."""
    lengths = [1, 2, 3, 1, 3, 2]
    scores = [1.0, 0.0, 0.0, 2.0, 4.0, 5.0]
    mask = torch.zeros(6, 3)
    rewards = torch.zeros(6, 3)
    for i, (n, s) in enumerate(zip(lengths, scores)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    index = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)
    return rewards, mask, index


def per_row(adv, mask):
    """The scalar advantage of each row (it is constant over the row's valid tokens)."""
    assert torch.all(adv[mask == 0] == 0)
    first = adv[:, 0]
    assert torch.allclose(adv, first[:, None] * mask)
    return first


# ---------------------------------------------------------------------------------------------- GAE
def test_gae_hand_computed():
    # r = [0, 0, 1], V = [.5, .6, .7], γ = λ = 1
    # t2: δ = 1 − .7 = .3, A = .3;  t1: δ = .7 − .6 = .1, A = .4;  t0: δ = .6 − .5 = .1, A = .5
    # returns = A + V = [1, 1, 1]; whiten [.5, .4, .3]: mean .4, unbiased var .01 → [1, 0, −1]
    adv, ret = get_adv_estimator_fn("gae")(
        token_level_rewards=T([[0.0, 0.0, 1.0]]), values=T([[0.5, 0.6, 0.7]]),
        response_mask=T([[1.0, 1.0, 1.0]]), config=cfg(), index=None,
    )
    assert torch.allclose(ret, T([[1.0, 1.0, 1.0]]), atol=1e-6)
    assert torch.allclose(adv, T([[1.0, 0.0, -1.0]]), atol=1e-5)


def test_gae_skips_masked_observation_tokens():
    # mask [1, 0, 1] (token 1 is a tool observation), γ = λ = .5, r = [0, 0, 1], V = [.5, ?, .7]
    # t2: δ = .3, A2 = .3; t1 masked: V_next=.7 and A_next=.3 carried
    # t0: δ = 0 + .5·.7 − .5 = −.15, A0 = −.15 + .25·.3 = −.075;  returns = [.425, 0, 1.0]
    # whiten [−.075, .3]: mean .1125, deviations ∓.1875, unbiased var .0703125 → ∓1/√2
    results = []
    for obs_value in (9.0, -123.0):
        adv, ret = get_adv_estimator_fn(AdvantageEstimator.GAE)(
            token_level_rewards=T([[0.0, 0.0, 1.0]]), values=T([[0.5, obs_value, 0.7]]),
            response_mask=T([[1.0, 0.0, 1.0]]), config=cfg(0.5, 0.5),
        )
        assert torch.allclose(ret, T([[0.425, 0.0, 1.0]]), atol=1e-6)
        assert torch.allclose(adv, T([[-1 / math.sqrt(2), 0.0, 1 / math.sqrt(2)]]), atol=1e-5)
        results.append((adv, ret))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_gae_requires_values():
    with pytest.raises(ValueError, match="values"):
        get_adv_estimator_fn("gae")(token_level_rewards=torch.zeros(1, 2), response_mask=torch.ones(1, 2))


# ---------------------------------------------------------------------------------------------- REINFORCE++ / ReMax
def test_reinforce_plus_plus_hand_computed():
    # γ = .5; row0 r=[0,0,1] → G=[.25,.5,1]; row1 r=[0,2,(pad)] → G=[1,2,0]
    # valid G = [.25,.5,1,1,2]: mean .95, Σdev² = .49+.2025+.0025+.0025+1.1025 = 1.8, var = 1.8/4 = .45
    rewards = T([[0.0, 0.0, 1.0], [0.0, 2.0, 7.0]])  # 7.0 sits under the mask and must not leak
    mask = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = get_adv_estimator_fn("reinforce_plus_plus")(
        token_level_rewards=rewards, response_mask=mask, config=cfg(gamma=0.5)
    )
    assert torch.allclose(ret, T([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]))
    std = math.sqrt(0.45)
    expected = T([[-0.7, -0.45, 0.05], [0.05, 1.05, 0.0]]) / std * mask
    assert torch.allclose(adv, expected, atol=1e-5)


def test_remax_hand_computed():
    # masked rewards [0, 1, (2 masked)] → reverse cumsum [1, 1, 0]; baseline .5 → A = [.5, .5, 0]
    adv, ret = get_adv_estimator_fn("remax")(
        token_level_rewards=T([[0.0, 1.0, 2.0]]), response_mask=T([[1.0, 1.0, 0.0]]),
        reward_baselines=T([0.5]), config=None,
    )
    assert torch.allclose(ret, T([[1.0, 1.0, 0.0]]))
    assert torch.allclose(adv, T([[0.5, 0.5, 0.0]]))


# ---------------------------------------------------------------------------------------------- group estimators
def test_grpo_hand_computed():
    # group a: R = [1,0,0], mean 1/3, unbiased std √(1/3) = .57735 → [1.1547, −.57735, −.57735]
    # group b: R = [2,4], mean 3, std √2 → [−.70711, .70711];  singleton c: mean 0, std 1 → 5/(1+1e-6)
    rewards, mask, index = outcome_batch()
    adv, ret = get_adv_estimator_fn("grpo")(token_level_rewards=rewards, response_mask=mask, index=index, config=cfg())
    s = math.sqrt(1 / 3)
    expected = T([(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s, -1 / math.sqrt(2), 1 / math.sqrt(2), 5.0])
    assert torch.allclose(per_row(adv, mask), expected, atol=1e-5)
    assert torch.equal(adv, ret)


def test_dr_grpo_drops_the_std():
    # Dr.GRPO: R − mean_g → a: [2/3, −1/3, −1/3], b: [−1, 1], c: 5 − 0
    rewards, mask, index = outcome_batch()
    adv, _ = get_adv_estimator_fn("grpo")(
        token_level_rewards=rewards, response_mask=mask, index=index, config=cfg(norm=False)
    )
    assert torch.allclose(per_row(adv, mask), T([2 / 3, -1 / 3, -1 / 3, -1.0, 1.0, 5.0]), atol=1e-6)


def test_grpo_passk_credits_only_the_best():
    # a: best row 0, gap 1 − 0 = 1, ÷ (√(1/3) + 1e-6);  b: best row 4, gap 4 − 2 = 2, ÷ (√2 + 1e-6)
    rewards, mask, index = outcome_batch()
    rewards, mask, index = rewards[:5], mask[:5], index[:5]
    adv, _ = get_adv_estimator_fn("grpo_passk")(token_level_rewards=rewards, response_mask=mask, index=index, config=cfg())
    expected = T([1 / (math.sqrt(1 / 3) + 1e-6), 0.0, 0.0, 0.0, 2 / (math.sqrt(2) + 1e-6)])
    assert torch.allclose(per_row(adv, mask), expected, atol=1e-5)
    adv, _ = get_adv_estimator_fn("grpo_passk")(
        token_level_rewards=rewards, response_mask=mask, index=index, config=cfg(norm=False)
    )
    assert torch.allclose(per_row(adv, mask), T([1.0, 0.0, 0.0, 0.0, 2.0]))


def test_grpo_passk_rejects_singleton_groups():
    rewards, mask, index = outcome_batch()
    with pytest.raises(ValueError, match="at least 2"):
        get_adv_estimator_fn("grpo_passk")(token_level_rewards=rewards, response_mask=mask, index=index, config=cfg())


def test_rloo_hand_computed():
    # R_i − mean of the others: a: [1 − 0, 0 − .5, 0 − .5], b: [2 − 4, 4 − 2], singleton c keeps R = 5
    rewards, mask, index = outcome_batch()
    adv, _ = get_adv_estimator_fn("rloo")(token_level_rewards=rewards, response_mask=mask, index=index, config=None)
    assert torch.allclose(per_row(adv, mask), T([1.0, -0.5, -0.5, -2.0, 2.0, 5.0]), atol=1e-6)


def test_opo_length_weighted_baseline():
    # a: lengths [1,2,3], baseline (1·1 + 2·0 + 3·0)/6 = 1/6 → [5/6, −1/6, −1/6]
    # b: lengths [1,3], baseline (1·2 + 3·4)/4 = 3.5 → [−1.5, .5];  singleton c: baseline 0 → 5
    rewards, mask, index = outcome_batch()
    adv, _ = get_adv_estimator_fn("opo")(token_level_rewards=rewards, response_mask=mask, index=index)
    assert torch.allclose(per_row(adv, mask), T([5 / 6, -1 / 6, -1 / 6, -1.5, 0.5, 5.0]), atol=1e-6)


def test_gpg_alpha_scaling():
    # α = B / #nonzero = 6 / 4 = 1.5; A = α (R − mean_g): a: [1, −.5, −.5], b: [−1.5, 1.5], c: 7.5
    rewards, mask, index = outcome_batch()
    adv, _ = get_adv_estimator_fn("gpg")(token_level_rewards=rewards, response_mask=mask, index=index)
    assert torch.allclose(per_row(adv, mask), T([1.0, -0.5, -0.5, -1.5, 1.5, 7.5]), atol=1e-6)


def test_reinforce_plus_plus_baseline_hand_computed():
    # one-token responses, R = [1, 0, 3, 1] in groups a,a,b,b → centred [.5, −.5, 1, −1]
    # batch mean 0, unbiased var (.25+.25+1+1)/3 = 5/6 → A = centred / √(5/6)
    rewards = T([[1.0, 0.0], [0.0, 0.0], [3.0, 0.0], [1.0, 0.0]])
    mask = T([[1.0, 0.0]] * 4)
    index = np.array([0, 0, 1, 1], dtype=object)
    adv, _ = get_adv_estimator_fn("reinforce_plus_plus_baseline")(
        token_level_rewards=rewards, response_mask=mask, index=index
    )
    expected = T([0.5, -0.5, 1.0, -1.0]) / math.sqrt(5 / 6)
    assert torch.allclose(per_row(adv, mask), expected, atol=1e-5)


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline"])
def test_group_estimators_ignore_masked_rewards(name):
    rewards, mask, index = outcome_batch()
    noisy = torch.where(mask.bool(), rewards, torch.full_like(rewards, 1e4))
    fn = get_adv_estimator_fn(name)
    a1, _ = fn(token_level_rewards=rewards, response_mask=mask, index=index, config=cfg())
    a2, _ = fn(token_level_rewards=noisy, response_mask=mask, index=index, config=cfg())
    assert torch.equal(a1, a2)


def test_group_estimator_needs_index():
    rewards, mask, _ = outcome_batch()
    with pytest.raises(ValueError, match="index"):
        get_adv_estimator_fn("grpo")(token_level_rewards=rewards, response_mask=mask, config=cfg())


# ---------------------------------------------------------------------------------------------- registry
def test_unknown_estimator_lists_names_and_closest():
    with pytest.raises(UnknownAlgorithmError) as err:
        get_adv_estimator_fn("grpp")
    message = str(err.value)
    assert "Did you mean 'grpo'" in message and "rloo" in message and "algorithm.adv_estimator" in message
    assert isinstance(err.value, ValueError) and isinstance(err.value, KeyError)


def test_duplicate_registration_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est("grpo")(lambda **kw: None)
    original = get_adv_estimator_fn("grpo")
    assert register_adv_est(AdvantageEstimator.GRPO)(original) is original  # same object: allowed


def test_custom_estimator_through_compute_advantage():
    name = f"test_const_{uuid.uuid4().hex[:8]}"

    @register_adv_est(name)
    def const(token_level_rewards, response_mask, index=None, config=None, **kwargs):
        return response_mask * config.gamma, response_mask * config.custom_scale

    data = DataProto.from_dict(
        {"token_level_rewards": torch.zeros(2, 3), "response_mask": T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])},
        {"uid": ["u", "u"]},
    )
    out = compute_advantage(data, name, gamma=0.5, config=SimpleNamespace(use_pf_ppo=False, custom_scale=3.0))
    assert torch.equal(out.batch["advantages"], data.batch["response_mask"] * 0.5)
    assert torch.equal(out.batch["returns"], data.batch["response_mask"] * 3.0)


# ---------------------------------------------------------------------------------------------- batch stages
def test_compute_advantage_grpo_and_gae_on_dataproto():
    rewards, mask, index = outcome_batch()
    data = DataProto.from_dict({"token_level_rewards": rewards, "response_mask": mask}, {"uid": index})
    out = compute_advantage(data, AdvantageEstimator.GRPO, norm_adv_by_std_in_grpo=False, num_repeat=3)
    assert torch.allclose(per_row(out.batch["advantages"], mask), T([2 / 3, -1 / 3, -1 / 3, -1.0, 1.0, 5.0]), atol=1e-6)

    data = DataProto.from_dict(
        {"token_level_rewards": T([[0.0, 0.0, 1.0]]), "values": T([[0.5, 0.6, 0.7]]), "response_mask": T([[1.0, 1.0, 1.0]])}
    )
    out = compute_advantage(data, "gae", gamma=1.0, lam=1.0)
    assert torch.allclose(out.batch["returns"], T([[1.0, 1.0, 1.0]]), atol=1e-6)


def test_compute_advantage_remax_reads_reward_baselines():
    data = DataProto.from_dict(
        {"token_level_rewards": T([[0.0, 1.0]]), "response_mask": T([[1.0, 1.0]]), "reward_baselines": T([0.25])}
    )
    out = compute_advantage(data, "remax")
    assert torch.allclose(out.batch["advantages"], T([[0.75, 0.75]]))


def test_compute_advantage_with_pf_ppo_resamples():
    rewards, mask, index = outcome_batch()
    data = DataProto.from_dict(
        {"token_level_rewards": rewards, "token_level_scores": rewards, "response_mask": mask},
        {"uid": index},
        {"global_steps": 3},
    )
    algo = SimpleNamespace(use_pf_ppo=True, pf_ppo=SimpleNamespace(reweight_method="max_min", weight_pow=2.0))
    out = compute_advantage(data, "grpo", config=algo)
    assert len(out) == 6
    # max_min keeps only the rows with the batch max (5: row 5) or min (0: rows 1, 2) score
    kept = set(out.batch["token_level_scores"].sum(-1).tolist())
    assert kept <= {0.0, 5.0}


def test_apply_kl_penalty_fixed_and_adaptive():
    # k1 = old − ref = [.5, 0, 0]; β = .1 → rewards = scores − β·kl = [−.05, 0, 1]
    # batch KL = mean over rows of per-row token mean = 0.5/3
    def batch():
        return DataProto.from_dict({
            "token_level_scores": T([[0.0, 0.0, 1.0]]),
            "old_log_probs": T([[-1.0, -1.0, -1.0]]),
            "ref_log_prob": T([[-1.5, -1.0, -1.0]]),
            "response_mask": T([[1.0, 1.0, 1.0]]),
        })

    data, metrics = apply_kl_penalty(batch(), FixedKLController(0.1), "kl")
    assert torch.allclose(data.batch["token_level_rewards"], T([[-0.05, 0.0, 1.0]]))
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.5 / 3)
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)

    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=10)
    _, metrics = apply_kl_penalty(batch(), ctrl, "kl")
    # e = clip(0.1667/0.1 − 1, ±.2) = .2, n_steps = 1 → β = .1·(1 + .2/10) = .102
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)
    assert ctrl.value == pytest.approx(0.102)


def test_verl_positional_orders():
    from hybridflow.algorithms import compute_gae_advantage_return, compute_remax_outcome_advantage

    # verl: (token_level_rewards, values, response_mask, gamma, lam)
    adv, ret = compute_gae_advantage_return(T([[0.0, 0.0, 1.0]]), T([[0.5, 0.6, 0.7]]), T([[1.0, 1.0, 1.0]]), 1.0, 1.0)
    assert torch.allclose(ret, T([[1.0, 1.0, 1.0]]), atol=1e-6)
    # verl: (token_level_rewards, reward_baselines, response_mask)
    adv, _ = compute_remax_outcome_advantage(T([[0.0, 1.0]]), T([0.25]), T([[1.0, 1.0]]))
    assert torch.allclose(adv, T([[0.75, 0.75]]))
