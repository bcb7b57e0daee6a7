"""Policy losses against hand-computed values and gradients."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from hybridflow.algorithms import (
    POLICY_LOSS_REGISTRY,
    get_policy_loss_fn,
    with_global_batch_info,
)

T = torch.tensor


def actor_cfg(**overrides):
    policy_loss = SimpleNamespace(
        loss_mode="vanilla", clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0, kl_cov_ratio=0.0002, ppo_kl_coef=0.1
    )
    base = dict(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0, tau_pos=1.0, tau_neg=1.05)
    for key in list(overrides):
        if hasattr(policy_loss, key):
            setattr(policy_loss, key, overrides.pop(key))
    base.update(overrides)
    return SimpleNamespace(policy_loss=policy_loss, **base)


def run(name, old, logp, adv, mask=None, mode="token-mean", config=None, weights=None):
    logp = logp.clone().requires_grad_(True)
    mask = torch.ones_like(adv) if mask is None else mask
    loss, metrics = get_policy_loss_fn(name)(old, logp, adv, mask, mode, config, weights)
    loss.backward()
    return loss.detach(), logp.grad, {k: float(v) for k, v in metrics.items()}


def logs(*ratios):
    return torch.log(T([list(ratios)]))


def test_vanilla_clip_and_dual_clip_hand_computed():
    # r = [1.5, .5, 4, 1.1], A = [1, 1, −1, −1], ε = .2, c = 3
    # tok0: max(−1.5, −1.2) = −1.2 (clipped)      tok1: max(−.5, −.8) = −.5
    # tok2: max(4, 1.2) = 4 → dual min(4, 3) = 3  tok3: 1.1
    # token-mean = (−1.2 − .5 + 3 + 1.1)/4 = .6; clipfrac 1/4, clipfrac_lower 1/4, ppo_kl = −ln(3.3)/4
    # d/dlogp = −A·r/4 on unclipped tokens: [0, −.125, 0, .275]
    loss, grad, m = run("vanilla", torch.zeros(1, 4), logs(1.5, 0.5, 4.0, 1.1), T([[1.0, 1.0, -1.0, -1.0]]))
    assert loss.item() == pytest.approx(0.6, abs=1e-6)
    assert torch.allclose(grad, T([[0.0, -0.125, 0.0, 0.275]]), atol=1e-6)
    assert m["actor/pg_clipfrac"] == pytest.approx(0.25)
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(0.25)
    assert m["actor/ppo_kl"] == pytest.approx(-math.log(3.3) / 4, abs=1e-6)


def test_vanilla_defaults_when_config_is_none():
    loss_none, _, _ = run("vanilla", torch.zeros(1, 4), logs(1.5, 0.5, 4.0, 1.1), T([[1.0, 1.0, -1.0, -1.0]]))
    loss_cfg, _, _ = run("vanilla", torch.zeros(1, 4), logs(1.5, 0.5, 4.0, 1.1), T([[1.0, 1.0, -1.0, -1.0]]), config=actor_cfg())
    assert loss_none == loss_cfg


@pytest.mark.parametrize(
    "ratio, loss, grad, lower",
    [
        (2.9, 2.9, 2.9, 0.0),  # below c: PPO branch −A·r = 2.9, gradient −A·r = 2.9
        (3.0, 3.0, None, 0.0),  # at c exactly: 3, not counted as dual-clipped (strict >)
        (3.5, 3.0, 0.0, 1.0),  # above c: bounded at −A·c = 3, no gradient
    ],
)
def test_dual_clip_boundary(ratio, loss, grad, lower):
    value, g, m = run("vanilla", torch.zeros(1, 1), logs(ratio), T([[-1.0]]), config=actor_cfg())
    assert value.item() == pytest.approx(loss, abs=1e-5)
    if grad is not None:
        assert g.item() == pytest.approx(grad, abs=1e-5)
    assert m["actor/pg_clipfrac_lower"] == lower


def test_clip_higher_uses_asymmetric_bounds():
    # A = 1: r = 1.5 clipped at 1 + .28 → −1.28;  A = −1: r = .7 clipped at 1 − .2 = .8 → .8
    loss, _, _ = run("vanilla", torch.zeros(1, 1), logs(1.5), T([[1.0]]), config=actor_cfg(clip_ratio_high=0.28))
    assert loss.item() == pytest.approx(-1.28, abs=1e-6)
    loss, _, _ = run("vanilla", torch.zeros(1, 1), logs(0.7), T([[-1.0]]), config=actor_cfg(clip_ratio_high=0.28))
    assert loss.item() == pytest.approx(0.8, abs=1e-6)


def test_dual_clip_bound_must_exceed_one():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        run("vanilla", torch.zeros(1, 1), logs(1.0), T([[1.0]]), config=actor_cfg(clip_ratio_c=1.0))


def test_rollout_is_weights_scale_the_token_loss():
    # on-policy (r = 1): per-token loss −A = [−1, −2]; weights [.5, 2] → (−.5 − 4)/2 = −2.25
    loss, _, _ = run("vanilla", torch.zeros(1, 2), torch.zeros(1, 2), T([[1.0, 2.0]]), weights=T([[0.5, 2.0]]))
    assert loss.item() == pytest.approx(-2.25)


def test_gspo_sequence_ratio_and_token_gradient():
    # log r = [ln 2, 0] → s = exp(ln2 / 2) = √2;  ε = .2 → clipped: −A·1.2 = −1.2 per token; no gradient
    loss, grad, m = run("gspo", torch.zeros(1, 2), T([[math.log(2.0), 0.0]]), T([[1.0, 1.0]]), config=actor_cfg())
    assert loss.item() == pytest.approx(-1.2, abs=1e-6)
    assert torch.allclose(grad, torch.zeros(1, 2))
    assert m["actor/pg_clipfrac"] == 1.0
    # wide clip (ε = 10): loss −√2; ∂/∂logp_t of −A·sg(s)·e^{logp_t − sg(logp_t)} = −√2, ÷ 2 tokens (token mean)
    loss, grad, _ = run("gspo", torch.zeros(1, 2), T([[math.log(2.0), 0.0]]), T([[1.0, 1.0]]), config=actor_cfg(clip_ratio=10.0))
    assert loss.item() == pytest.approx(-math.sqrt(2), abs=1e-6)
    assert torch.allclose(grad, torch.full((1, 2), -math.sqrt(2) / 2), atol=1e-6)


def test_gspo_forces_seq_mean_token_mean():
    # two sequences of different lengths, on-policy, A = 1 everywhere: every mode must give −1
    mask = T([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    for mode in ("token-mean", "seq-mean-token-sum"):
        loss, _, _ = run("gspo", torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), mask=mask, mode=mode)
        assert loss.item() == pytest.approx(-1.0)


def test_gpg_is_plain_policy_gradient():
    # L = −logp·A = [2, −2] → mean 0; gradient −A/2 = [−1, .5]
    loss, grad, _ = run("gpg", torch.zeros(1, 2), T([[-1.0, -2.0]]), T([[2.0, -1.0]]))
    assert loss.item() == pytest.approx(0.0)
    assert torch.allclose(grad, T([[-1.0, 0.5]]))


def test_cispo_clipped_weight_keeps_gradient():
    # r = [1.5, .9] → sg(clip) = [1.2, .9]; L = −w·A·logp = [−1.2·ln1.5, −.9·ln.9]; grad −w·A/2 = [−.6, −.45]
    loss, grad, m = run("cispo", torch.zeros(1, 2), logs(1.5, 0.9), T([[1.0, 1.0]]))
    assert loss.item() == pytest.approx((-1.2 * math.log(1.5) - 0.9 * math.log(0.9)) / 2, abs=1e-6)
    assert torch.allclose(grad, T([[-0.6, -0.45]]), atol=1e-6)
    assert m["actor/pg_clipfrac"] == 0.5


def test_sapo_soft_gate_at_ratio_one():
    # r = 1: gate = σ(0)·4/τ = 2/τ → L = [−2·1, +2/1.05·1] → seq-mean-token-mean (−2 + 1.904762)/2
    # gate'(1) = 4·σ'(0) = 1 for any τ, dr/dlogp = r = 1 → grad = −A/2 = [−.5, .5]
    loss, grad, m = run("sapo", torch.zeros(1, 2), torch.zeros(1, 2), T([[1.0, -1.0]]), config=actor_cfg())
    assert loss.item() == pytest.approx((-2.0 + 2.0 / 1.05) / 2, abs=1e-6)
    assert torch.allclose(grad, T([[-0.5, 0.5]]), atol=1e-6)
    assert m["actor/pg_clipfrac"] == 0.0


def test_geo_mean_hand_computed():
    # row0 A=+1, log r = [.1, .3] → sign-aware clip to [.1, .2], mean .15 → L0 = −e^.15
    # row1 A=−1, log r = [−.5, .1] → max(log r, clamp) = [−.2, .1], mean −.05 → L1 = +e^−.05
    # mean over sequences; clipped tokens: row0 tok1 (A>0) and row1 tok0 (A<0)
    old = torch.zeros(2, 2)
    logp = T([[0.1, 0.3], [-0.5, 0.1]])
    adv = T([[1.0, 1.0], [-1.0, -1.0]])
    loss, _, m = run("geo_mean", old, logp, adv, config=actor_cfg())
    assert loss.item() == pytest.approx((-math.exp(0.15) + math.exp(-0.05)) / 2, abs=1e-6)
    assert m["actor/pg_clipfrac"] == 0.25 and m["actor/pg_clipfrac_lower"] == 0.25


def test_kl_cov_penalises_top_covariance_token():
    # A = [1,0,0,−1] (mean 0), logp = [−1,−2,−3,−.5] (mean −1.625) → Cov = [.625, 0, 0, −1.125]
    # top 1 (ratio .25 of 4 tokens) = tok0: −e^.1 + .1·|.1|; tok3: −(−1)·1 = 1 → token-mean
    old = T([[-1.1, -2.0, -3.0, -0.5]])
    logp = T([[-1.0, -2.0, -3.0, -0.5]])
    adv = T([[1.0, 0.0, 0.0, -1.0]])
    loss, _, m = run("kl_cov", old, logp, adv, config=actor_cfg(kl_cov_ratio=0.25, ppo_kl_coef=0.1))
    assert loss.item() == pytest.approx((-math.exp(0.1) + 0.01 + 1.0) / 4, abs=1e-6)
    assert m["actor/ppo_kl"] == pytest.approx(0.025, abs=1e-6)


def test_clip_cov_detaches_high_covariance_token():
    # same tokens; Cov in (.5, 5) and not PPO-clipped: only tok0 → its loss and gradient vanish
    # remaining: tok3 −(−1)·1 = 1 → token-mean 1/4; clipfrac reports the detached share 1/4
    old = T([[-1.1, -2.0, -3.0, -0.5]])
    logp = T([[-1.0, -2.0, -3.0, -0.5]])
    adv = T([[1.0, 0.0, 0.0, -1.0]])
    loss, grad, m = run("clip_cov", old, logp, adv, config=actor_cfg(clip_cov_ratio=0.25, clip_cov_lb=0.5))
    assert loss.item() == pytest.approx(0.25, abs=1e-6)
    assert grad[0, 0].item() == 0.0 and grad[0, 3].item() == pytest.approx(0.25)
    assert m["actor/pg_clipfrac"] == 0.25


@pytest.mark.parametrize("name", sorted(POLICY_LOSS_REGISTRY.names()))
def test_masked_positions_never_leak(name):
    torch.manual_seed(0)
    mask = T([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    old = torch.randn(2, 4) * 0.1 - 1.0
    logp = old + torch.randn(2, 4) * 0.1
    adv = torch.randn(2, 4)
    garbage = lambda x: torch.where(mask.bool(), x, torch.full_like(x, 1e4))  # noqa: E731
    cfg = actor_cfg(clip_cov_ratio=0.5, kl_cov_ratio=0.5)
    torch.manual_seed(1)
    l1, g1, m1 = run(name, old, logp, adv, mask=mask, config=cfg)
    torch.manual_seed(1)
    l2, g2, m2 = run(name, garbage(old), garbage(logp), garbage(adv), mask=mask, config=cfg)
    assert torch.allclose(l1, l2, atol=1e-6)
    assert torch.allclose(g1 * mask, g2 * mask, atol=1e-6) and torch.all(g2[mask == 0] == 0)
    assert m1 == pytest.approx(m2, abs=1e-6)


def test_metrics_are_detached_scalars():
    _, metrics = get_policy_loss_fn("vanilla")(
        torch.zeros(1, 2), torch.zeros(1, 2, requires_grad=True), torch.ones(1, 2), torch.ones(1, 2)
    )
    assert set(metrics) >= {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"}
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())


def test_unknown_policy_loss():
    with pytest.raises(ValueError, match="Did you mean 'vanilla'"):
        get_policy_loss_fn("vanila")


def test_global_batch_info_rejects_verl_key_with_hint():
    from hybridflow.algorithms.loss_config import GlobalBatchConfig

    with pytest.raises(ValueError, match="global_token_num"):
        GlobalBatchConfig(actor_cfg(), {"batch_num_tokens": 3})
    view = with_global_batch_info(actor_cfg(clip_ratio=0.3), global_token_num=4)
    assert view.clip_ratio == 0.3 and view.global_batch_info["global_token_num"] == 4


def test_actor_loss_scale_factor_is_honoured():
    # Dr.GRPO aggregation: Σ_i Σ_t L / (N · loss_scale_factor); on-policy A = 1 → L = −1 on 2 tokens of 1 row
    cfg = actor_cfg(loss_scale_factor=4.0)
    loss, _, _ = run("vanilla", torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), mode="seq-mean-token-sum-norm", config=cfg)
    assert loss.item() == pytest.approx(-2.0 / 4.0)
    view = with_global_batch_info(cfg, global_batch_size=2, loss_scale_factor=8.0)  # explicit value wins
    loss, _, _ = run("vanilla", torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), mode="seq-mean-token-sum-norm", config=view)
    assert loss.item() == pytest.approx(-2.0 / (2 * 8.0))
