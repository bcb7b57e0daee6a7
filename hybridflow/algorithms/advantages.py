"""Token-level advantage estimators: GAE, REINFORCE++ and ReMax.

Every estimator is called with keyword arguments ``token_level_rewards`` (B, R), ``response_mask``
(B, R), ``index`` (group ids, numpy object array), ``config`` (read by attribute: ``gamma``, ``lam``,
``norm_adv_by_std_in_grpo``; ``None`` means verl's defaults 1.0 / 1.0 / True) and, where needed,
``values`` (B, R) or ``reward_baselines`` (B,); it ignores the keywords it does not use and returns
``(advantages, returns)``, both (B, R) and zero on masked positions.

The group (outcome-reward) estimators live in :mod:`.outcome_advantages`.
"""

from __future__ import annotations

from typing import Any

import torch

from .masked import masked_whiten
from .registries import AdvantageEstimator, register_adv_est

__all__ = [
    "compute_gae_advantage_return",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "algo_setting",
]

_DEFAULTS = {"gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True, "gdpo_reward_keys": None,
             "gdpo_reward_weights": None}


def algo_setting(config: Any, name: str):
    """``config.<name>``, or verl's default when no config is given (estimators may run without one)."""
    if config is None:
        return _DEFAULTS[name]
    try:
        return getattr(config, name)
    except AttributeError:
        raise AttributeError(
            f"advantage estimator config {type(config).__name__} has no '{name}'; pass the algorithm config "
            f"(cfg.algorithm) or None for the defaults {_DEFAULTS}"
        ) from None


def _zero_masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def _require(name: str, value, estimator: str):
    if value is None:
        raise ValueError(f"advantage estimator '{estimator}' needs '{name}' in the batch")
    return value


@register_adv_est(AdvantageEstimator.GAE)
@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor | None = None,
    response_mask: torch.Tensor | None = None,
    gamma: float | None = None,
    lam: float | None = None,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2015, arXiv 1506.02438), backwards in time:

        δ_t = r_t + γ·V_{t+1} − V_t,   A_t = δ_t + γλ·A_{t+1},   returns_t = A_t + V_t

    Masked positions inside a response (tool observations in multi-turn rollouts) are skipped: the
    "next" value and advantage are carried across them unchanged, so an action's advantage sees the
    next *action* token's value.  Advantages are then whitened over the batch
    (``masked_whiten``: masked mean, unbiased masked variance).  The positional order is verl's;
    explicit ``gamma``/``lam`` override ``config``.
    """
    values = _require("values", values, "gae")
    response_mask = _require("response_mask", response_mask, "gae")
    gamma = algo_setting(config, "gamma") if gamma is None else gamma
    lam = algo_setting(config, "lam") if lam is None else lam
    mask = response_mask.bool()
    batch, length = token_level_rewards.shape
    next_value = torch.zeros(batch, dtype=values.dtype, device=values.device)
    next_adv = torch.zeros_like(next_value)
    advantages = torch.zeros_like(values)
    for t in reversed(range(length)):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        next_value = torch.where(mask[:, t], values[:, t], next_value)
        next_adv = torch.where(mask[:, t], adv_t, next_adv)
        advantages[:, t] = next_adv
    returns = _zero_masked(advantages + values, mask)
    advantages = _zero_masked(masked_whiten(advantages, mask), mask)
    return advantages, returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config: Any = None, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262): discounted return G_t = r_t + γ·G_{t+1}, with the running
    return reset at masked positions, then global-batch whitening A = masked_whiten(G)·m.
    Returns are G."""
    gamma = algo_setting(config, "gamma")
    mask = response_mask.bool()
    rewards = _zero_masked(token_level_rewards, mask)
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
        running = torch.where(mask[:, t], running, torch.zeros_like(running))
    advantages = _zero_masked(masked_whiten(returns, mask), mask)
    return advantages, _zero_masked(returns, mask)


@register_adv_est(AdvantageEstimator.REMAX)
@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor | None = None,
    response_mask: torch.Tensor | None = None,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, arXiv 2310.10505): the baseline is the reward of the greedy response to
    the same prompt, b_i (``reward_baselines``, (B,)).  returns_t = Σ_{s≥t} r_s·m_s (reverse cumsum),
    A_t = returns_t − b_i on valid tokens."""
    reward_baselines = _require("reward_baselines", reward_baselines, "remax")
    response_mask = _require("response_mask", response_mask, "remax")
    mask = response_mask.bool()
    returns = _zero_masked(token_level_rewards, mask).flip(-1).cumsum(-1).flip(-1)
    advantages = _zero_masked(returns - reward_baselines.reshape(-1, 1).to(returns.dtype), mask)
    return advantages, _zero_masked(returns, mask)
