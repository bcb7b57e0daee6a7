"""DPPO's divergence trust region (dppo_tv / dppo_kl) against hand-computed masks, losses and gradients."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from hybridflow.algorithms import get_policy_loss_fn
from hybridflow.algorithms.dppo_losses import binary_kl

T = torch.tensor


def actor_cfg(**kw):
    base = dict(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0)
    return SimpleNamespace(**{**base, **kw})


def run(name, old, logp, adv, config=None):
    logp = logp.clone().requires_grad_(True)
    loss, metrics = get_policy_loss_fn(name)(old, logp, adv, torch.ones_like(adv), "token-mean", config, None)
    loss.backward()
    return loss.detach(), logp.grad, {k: float(v) for k, v in metrics.items()}


def probs(*p):
    return torch.log(T([list(p)]))


def test_dppo_tv_keeps_tokens_inside_the_total_variation_region():
    # p_old = .5 for every token; p = [.6, .7, .45, .3]; A = [+1, +1, -1, -1]; delta = .15, c = 3
    # TV change p - p_old = [.1, .2, -.05, -.2]: A>0 keeps change <= .15 -> [keep, drop]; A<0 keeps change >= -.15
    # -> [keep, drop].  r = p / p_old = [1.2, 1.4, .9, .6]; kept loss = -A r log p, token-mean over 4 tokens
    old = probs(.5, .5, .5, .5)
    new = probs(.6, .7, .45, .3)
    adv = T([[1.0, 1.0, -1.0, -1.0]])
    loss, grad, m = run("dppo_tv", old, new, adv, config=actor_cfg(clip_ratio_low=0.15, clip_ratio_high=0.15))
    want = (-1.2 * math.log(.6) + 0.9 * math.log(.45)) / 4
    assert loss.item() == pytest.approx(want, abs=1e-6)
    # gradient w.r.t. log p is -A * sg(r) / 4 on kept tokens, 0 on dropped ones
    assert torch.allclose(grad, T([[-1.2 / 4, 0.0, 0.9 / 4, 0.0]]), atol=1e-6)
    assert m["actor/pg_clipfrac"] == pytest.approx(0.5)
    assert m["actor/pg_clipfrac_lower"] == 0.0


def test_dppo_tv_is_not_the_ratio_clip():
    """A rare token whose ratio is 3 (PPO would clip it at 1.2) moved only .02 in probability: DPPO keeps it."""
    old, new, adv = probs(.01), probs(.03), T([[1.0]])
    _, grad, m = run("dppo_tv", old, new, adv, config=actor_cfg(clip_ratio=0.15, clip_ratio_c=10.0))
    assert grad.item() == pytest.approx(-3.0, rel=1e-5) and m["actor/pg_clipfrac"] == 0.0
    _, grad_ppo, _ = run("vanilla", old, new, adv, config=actor_cfg(clip_ratio=0.2))
    assert grad_ppo.item() == 0.0


def test_dppo_truncates_the_importance_ratio_at_clip_ratio_c():
    old, new, adv = probs(.01), probs(.05), T([[1.0]])  # r = 5, change .04 inside the region
    _, grad, m = run("dppo_tv", old, new, adv, config=actor_cfg(clip_ratio=0.15, clip_ratio_c=3.0))
    assert grad.item() == pytest.approx(-3.0, rel=1e-5)
    assert m["actor/pg_clipfrac_lower"] == 1.0


def test_dppo_kl_uses_the_binary_kl_in_the_advantages_direction():
    # p_old = .5, p = [.8, .2, .2, .8], A = [+, +, -, -], delta = .1
    # binary KL(.5 || .8) = KL(.5 || .2) = .5 ln(.5/.8) + .5 ln(.5/.2) = .2231 > .1
    # A>0: keep if KL <= delta or p fell -> [drop, keep]; A<0: keep if KL <= delta or p rose -> [drop, keep]
    old = probs(.5, .5, .5, .5)
    new = probs(.8, .2, .2, .8)
    adv = T([[1.0, 1.0, -1.0, -1.0]])
    assert binary_kl(T(.5), T(.8)).item() == pytest.approx(.5 * math.log(.5 / .8) + .5 * math.log(.5 / .2), abs=1e-6)
    loss, grad, m = run("dppo_kl", old, new, adv, config=actor_cfg(clip_ratio=0.1, clip_ratio_c=10.0))
    assert loss.item() == pytest.approx((-0.4 * math.log(.2) + 1.6 * math.log(.8)) / 4, abs=1e-6)
    assert torch.allclose(grad, T([[0.0, -0.4 / 4, 0.0, 1.6 / 4]]), atol=1e-6)
    assert m["actor/pg_clipfrac"] == pytest.approx(0.5)


def test_dppo_is_registered_with_verls_names():
    for name in ("dppo_tv", "dppo_kl"):
        assert callable(get_policy_loss_fn(name))
