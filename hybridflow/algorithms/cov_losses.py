"""Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617).

The paper finds that entropy collapse is driven by tokens whose log-probability and advantage have a
large covariance, Cov_t = (A_t − mean A)·(log π_t − mean log π) (means over the valid tokens of the
micro-batch).  Both losses act on a tiny fraction of such tokens only:

* ``clip_cov``: PPO clip (no dual clip) and, among tokens the ordinary clip did not touch whose Cov
  lies in (``clip_cov_lb``, ``clip_cov_ub``), a random ``clip_cov_ratio`` share get no gradient.
* ``kl_cov``: the unclipped surrogate −A·r, plus ``ppo_kl_coef``·|log π − log π_old| on the top
  ``kl_cov_ratio`` share of tokens by Cov.

The covariance statistics are taken per call (per micro-batch), as in the paper and in verl; these two
losses therefore depend slightly on the micro-batch split, unlike the others.  ``clip_cov`` draws its
random subset from torch's global generator (seeded by the trainer).
"""

from __future__ import annotations

from typing import Any

import torch

from .loss_config import clip_range, loss_setting
from .masked import masked_mean
from .policy_losses import Metrics, finish_policy_loss, ppo_metrics
from .registries import register_policy_loss

__all__ = ["compute_policy_loss_clip_cov", "compute_policy_loss_kl_cov", "token_covariance"]


def token_covariance(advantages: torch.Tensor, log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Cov_t = (A_t − mean A)(log π_t − mean log π) over valid tokens (detached)."""
    adv = advantages.detach()
    logp = log_prob.detach()
    return (adv - masked_mean(adv, response_mask)) * (logp - masked_mean(logp, response_mask))


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Clip-Cov (arXiv 2505.22617 §4): PPO clip, plus detach a random ``clip_cov_ratio`` share of the
    high-covariance tokens (Cov in (lb, ub), not already clipped).  ``actor/pg_clipfrac`` reports the
    share of detached tokens."""
    eps_low, eps_high = clip_range(config)
    ratio_share = float(loss_setting(config, "policy_loss.clip_cov_ratio"))
    lower = float(loss_setting(config, "policy_loss.clip_cov_lb"))
    upper = float(loss_setting(config, "policy_loss.clip_cov_ub"))
    if ratio_share <= 0:
        raise ValueError(f"actor.policy_loss.clip_cov_ratio must be > 0, got {ratio_share}")
    mask = response_mask.bool()
    log_ratio = (log_prob - old_log_prob).clamp(min=-20.0, max=20.0)
    ratio = log_ratio.exp()
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    clipped_by_ppo = (loss_clipped > loss_unclipped) & mask
    cov = token_covariance(advantages, log_prob, response_mask)
    candidates = torch.nonzero(mask & ~clipped_by_ppo & (cov > lower) & (cov < upper))
    n_detach = max(int(ratio_share * int(mask.sum())), 1)
    keep = torch.ones_like(ratio)
    if len(candidates) > 0:
        chosen = candidates[torch.randperm(len(candidates), device=candidates.device)[:n_detach]]
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
    pg_losses = torch.maximum(loss_unclipped, loss_clipped) * keep
    loss = finish_policy_loss(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    with torch.no_grad():
        metrics = ppo_metrics(
            masked_mean((keep == 0).to(ratio.dtype), response_mask), masked_mean(-log_ratio, response_mask), 0.0, like=loss
        )
    return loss, metrics


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """KL-Cov (arXiv 2505.22617 §4): L = −A·r, and for the top ``kl_cov_ratio`` share of valid tokens by
    covariance L = −A·r + ``ppo_kl_coef``·|log π − log π_old|.  ``actor/ppo_kl`` reports mean |Δ log π|."""
    share = float(loss_setting(config, "policy_loss.kl_cov_ratio"))
    coef = float(loss_setting(config, "policy_loss.ppo_kl_coef"))
    if share <= 0:
        raise ValueError(f"actor.policy_loss.kl_cov_ratio must be > 0, got {share}")
    mask = response_mask.bool()
    log_ratio = (log_prob - old_log_prob).clamp(min=-20.0, max=20.0)
    ratio = log_ratio.exp()
    pg_losses = -advantages * ratio
    valid = torch.nonzero(mask.flatten()).flatten()
    if len(valid) > 0:
        cov = token_covariance(advantages, log_prob, response_mask).flatten()[valid]
        k = max(1, int(len(valid) * share))
        top = valid[torch.topk(cov, k).indices]
        penalty = torch.zeros_like(pg_losses).flatten()
        penalty[top] = 1.0
        pg_losses = pg_losses + coef * log_ratio.abs() * penalty.view_as(pg_losses)
    loss = finish_policy_loss(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    with torch.no_grad():
        metrics = ppo_metrics(0.0, masked_mean(log_ratio.abs(), response_mask), 0.0, like=loss)
    return loss, metrics
