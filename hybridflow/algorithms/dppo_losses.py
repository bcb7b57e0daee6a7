"""DPPO: a trust region on the policy divergence instead of on the probability ratio (``loss_mode=dppo_tv`` |
``dppo_kl``; Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning", arXiv 2602.04879).

PPO clips the ratio r = pi / pi_old, which is volatile for rare tokens (a tiny absolute change of a small
probability is a large ratio) and lax for likely ones.  DPPO keeps a token in the update unless the *divergence*
between the two distributions, restricted to that token (the binary distribution {y_t, not y_t}), left the trust
region in the direction the advantage pushes:

* ``dppo_tv``: total variation of the binary distributions, |p - p_old|; for A > 0 the token is dropped once
  p - p_old > delta_high (it already rose enough), for A <= 0 once p - p_old < -delta_low;
* ``dppo_kl``: the binary KL(p_old || p) = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p)); for
  A > 0 the token is dropped when it exceeds delta_high while p rose, for A <= 0 when it exceeds delta_low while p
  fell.

delta_low / delta_high are ``actor.clip_ratio_low`` / ``clip_ratio_high`` (``clip_ratio`` when null): here they are
divergence bounds, not ratio bounds (DPPO's paper uses 0.15 for TV).  The kept tokens get the truncated
importance-sampled policy gradient L = -A * sg(min(r, c)) * log pi with c = ``clip_ratio_c`` (the paper's TIS
instead of dual clip; its examples set c large, e.g. 10000).  Metrics: ``actor/pg_clipfrac`` is the share of tokens
outside the trust region, ``actor/pg_clipfrac_lower`` the share of kept tokens whose ratio was truncated at c.
"""

from __future__ import annotations

from typing import Any

import torch

from .loss_config import clip_range, loss_setting
from .masked import masked_mean
from .policy_losses import Metrics, finish_policy_loss, ppo_metrics
from .registries import register_policy_loss

__all__ = ["compute_policy_loss_dppo_tv", "compute_policy_loss_dppo_kl", "binary_kl"]

_EPS = 1e-8


def binary_kl(old_prob: torch.Tensor, prob: torch.Tensor) -> torch.Tensor:
    """KL(Bernoulli(old_prob) || Bernoulli(prob)), element-wise."""
    return (old_prob * (torch.log(old_prob + _EPS) - torch.log(prob + _EPS))
            + (1.0 - old_prob) * (torch.log(1.0 - old_prob + _EPS) - torch.log(1.0 - prob + _EPS)))


def _dppo(keep_fn, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights):
    delta_low, delta_high = clip_range(config)
    clip_c = float(loss_setting(config, "clip_ratio_c"))
    mask = response_mask.bool()
    # masked positions may hold anything: read them as "no change" so no NaN reaches a comparison or a metric
    old = torch.where(mask, old_log_prob, 0.0).detach()
    new = torch.where(mask, log_prob, 0.0)
    log_ratio = (new.detach() - old).clamp(min=-20.0, max=20.0)
    ratio = log_ratio.exp()
    keep = keep_fn(old.exp(), new.detach().exp(), advantages, delta_low, delta_high) & mask
    truncated = ratio.clamp(max=clip_c)
    pg_losses = -advantages * truncated * new * keep.to(new.dtype)
    loss = finish_policy_loss(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    with torch.no_grad():
        metrics = ppo_metrics(
            masked_mean((~keep).to(ratio.dtype), response_mask),
            masked_mean(-log_ratio, response_mask),
            masked_mean(((ratio > clip_c) & keep).to(ratio.dtype), response_mask),
            like=loss,
        )
    return loss, metrics


def _tv_keep(old_prob, prob, advantages, delta_low, delta_high):
    change = prob - old_prob
    return torch.where(advantages > 0, change <= delta_high, change >= -delta_low)


def _kl_keep(old_prob, prob, advantages, delta_low, delta_high):
    kl = binary_kl(old_prob, prob)
    return torch.where(advantages > 0, (kl <= delta_high) | (prob <= old_prob), (kl <= delta_low) | (prob >= old_prob))


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """DPPO-Binary-TV: tokens whose probability moved more than delta in the advantage's direction get no gradient."""
    return _dppo(_tv_keep, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                 rollout_is_weights)


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """DPPO-Binary-KL: the same with the binary KL divergence as the trust region's measure."""
    return _dppo(_kl_keep, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                 rollout_is_weights)
