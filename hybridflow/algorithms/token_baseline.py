"""Optimal Token Baseline (OTB): a per-token, variance-minimising baseline for outcome-reward policy gradients.

For REINFORCE with return G and score function g = ∇_θ log π(y), the baseline that minimises the variance
of (G − b)·g is b* = E[G·‖g‖²] / E[‖g‖²] (Weaver & Tao 2001; Greensmith et al. 2004).  OTB (Li et al. 2026,
"Optimal Token Baseline", arXiv 2602.07078) makes it per token and cheap: with respect to the logits z_j
of step j, ∇_z log softmax(z)_y = e_y − π_j, whose squared norm is

    ‖e_y − π_j‖² = 1 − 2·π_j(y_j) + Σ_v π_j(v)²        (the "logit-gradient proxy", forward-only)

so the energy accumulated up to token t is W_t = Σ_{j ≤ t} (1 − 2·π_j(y_j) + Σπ_j²) over valid tokens.
With G_t the reward-to-go of token t (Σ_{s ≥ t} r_s, undiscounted), the baseline of token t in the group
of responses to one prompt is

    B*_t = Σ_i G_t^(i)·W_t^(i) / (Σ_i W_t^(i) + ε)       (sum over the group's responses still running at t)

and the advantage is A_t = (G_t − B*_t)·mask_t.  Responses that ended before t do not enter B*_t, so
padding never dilutes the baseline of long responses.

Inputs beyond the standard estimator keywords: ``old_log_probs`` (log π_old(y_j), the actor's temperature
scaled log-probs) and ``sum_pi_squared`` (Σ_v π_j(v)², emitted by the actor's log-prob pass when
``actor_rollout_ref.actor.calculate_sum_pi_squared=true``).
"""

from __future__ import annotations

from typing import Any

import torch

from .outcome_advantages import group_ids
from .registries import AdvantageEstimator, register_adv_est

__all__ = ["compute_optimal_token_baseline_advantage", "sum_pi_squared_from_logits"]


def sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Σ_v softmax(z)_v² for (..., V) logits, computed stably as exp(logsumexp(2z) − 2·logsumexp(z))."""
    z = logits.float()
    return torch.exp(torch.logsumexp(2.0 * z, dim=-1) - 2.0 * torch.logsumexp(z, dim=-1))


@register_adv_est(AdvantageEstimator.OPTIMAL_TOKEN_BASELINE)
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    epsilon: float = 1e-8,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB advantages (see the module docstring); returns ``(advantages, returns)`` with returns = G_t."""
    missing = [name for name, t in (("old_log_probs", old_log_probs), ("sum_pi_squared", sum_pi_squared)) if t is None]
    if missing:
        raise ValueError(
            f"algorithm.adv_estimator=optimal_token_baseline needs {' and '.join(missing)} in the batch; set "
            "actor_rollout_ref.actor.calculate_sum_pi_squared=true (the actor's log-prob pass then emits sum_pi_squared)"
        )
    mask = response_mask.to(torch.float32)
    rewards = token_level_rewards.to(torch.float32) * mask
    # G_t = Σ_{s ≥ t} r_s: reverse cumulative sum along the response.
    returns = rewards.flip(-1).cumsum(-1).flip(-1) * mask
    pi = old_log_probs.detach().to(torch.float32).exp()
    energy = ((1.0 - 2.0 * pi + sum_pi_squared.detach().to(torch.float32)).clamp(min=0.0) * mask).cumsum(-1) * mask

    gid, n_groups = group_ids(index, rewards.shape[0], rewards.device)
    width = rewards.shape[1]
    weighted = torch.zeros(n_groups, width, device=rewards.device).index_add_(0, gid, returns * energy)
    total = torch.zeros(n_groups, width, device=rewards.device).index_add_(0, gid, energy)
    baseline = weighted[gid] / (total[gid] + epsilon)
    advantages = (returns - baseline) * mask
    return advantages, returns
