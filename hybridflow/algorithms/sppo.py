"""SPPO: self-play preference optimisation as a squared regression of the policy's log-ratio (Wu et al. 2024,
arXiv:2405.00675, eq. 3.6), in the form verl-recipe's ``sppo`` trains.

The paper regresses ``log(π_θ(y|x) / π_t(y|x))`` onto ``η·(P(y ≻ π_t | x) − 1/2)``: the win rate of y against the
current policy's own samples, centred by its value 1/2 for y ~ π_t.  verl-recipe replaces the win rate with the
response's scalar reward R (a rule or a reward model) and the centring with a *soft mean* of the rewards::

    softmean_β(R) = (1/β)·log( (1/n)·Σ_i exp(β·R_i) )        (β = 0: the arithmetic mean)
    target_i      = η·(R_i − softmean_β(R))                   (advantage estimator ``sppo``)
    loss          = mean_i ( Σ_t (log π_θ − log π_old)(y_i,t) − target_i )²    (policy loss ``sppo``)

where π_old = π_t is the policy that sampled the batch (``old_log_probs``), so the log-ratio starts at 0 and the
first gradient is −2·target_i·∇log π_θ(y_i): a policy gradient with advantage ``target_i``.

**Over what the soft mean runs.**  verl-recipe applies it to the whole batch's rewards at once (a (bs,) vector,
every prompt and every sample together), so that is the default here (``algorithm.sppo_softmean_scope=batch``).
The paper's centring is per prompt (1/2 is the expected win rate of π_t's own samples *for that x*), which
``sppo_softmean_scope=group`` gives: the soft mean over the ``rollout.n`` samples of each prompt.  With a rule
reward the batch form keeps each prompt's difficulty in the target (all samples of an easy prompt are pushed up,
of a hard one down); the group form removes it.  β is verl-recipe's ``algorithm.sppo_eta`` and η its
``actor_rollout_ref.actor.sppo_eta`` (the recipe reuses the name for both).
"""

from __future__ import annotations

from typing import Any

import torch

from .loss_config import agg_kwargs, loss_setting
from .masked import masked_mean, masked_sum
from .outcome_advantages import group_ids
from .registries import register_adv_est, register_policy_loss

__all__ = ["SPPO_SCOPES", "softmean", "compute_sppo_advantage", "compute_policy_loss_sppo"]

SPPO_SCOPES = ("batch", "group")


def softmean(x: torch.Tensor, beta: float, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """(1/β)·log mean exp(β·x) along ``dim`` (stable through logsumexp); the plain mean for β = 0."""
    if beta == 0.0:
        return x.mean(dim=dim, keepdim=keepdim)
    n = x.shape[dim]
    lse = torch.logsumexp(x * beta, dim=dim, keepdim=keepdim)
    return (lse - torch.log(torch.tensor(float(n), dtype=x.dtype, device=x.device))) / beta


def _setting(config: Any, name: str, default: Any) -> Any:
    return default if config is None else getattr(config, name, default)


@register_adv_est("sppo")
@torch.no_grad()
def compute_sppo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``R_i − softmean_β(R)`` broadcast over row i's valid tokens (advantages = returns); β =
    ``algorithm.sppo_eta``, over the batch or each prompt's group (``algorithm.sppo_softmean_scope``)."""
    beta = float(_setting(config, "sppo_eta", 1.0))
    scope = _setting(config, "sppo_softmean_scope", "batch")
    rewards = masked_sum(token_level_rewards, response_mask, axis=-1)
    if scope == "batch":
        centred = rewards - softmean(rewards, beta)
    elif scope == "group":
        ids, num_groups = group_ids(index, rewards.shape[0], rewards.device)
        centred = torch.empty_like(rewards)
        for g in range(num_groups):
            rows = ids == g
            centred[rows] = rewards[rows] - softmean(rewards[rows], beta)
    else:
        raise ValueError(f"algorithm.sppo_softmean_scope={scope!r}: choose one of {', '.join(SPPO_SCOPES)}")
    out = torch.where(response_mask.bool(), centred.unsqueeze(-1), 0.0)
    return out, out


@register_policy_loss("sppo")
def compute_policy_loss_sppo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean over responses of (sequence log-ratio − η·advantage)² (see the module docstring).

    ``advantages`` carries each row's centred reward on its valid tokens (estimator ``sppo``); η is
    ``actor.sppo_eta``.  The mean runs over the mini-batch's non-empty responses whatever ``loss_agg_mode`` says
    (the loss is per sequence), with the global sequence count when the config carries one.
    """
    try:  # verl-recipe reads it with a default (``config.get("sppo_eta", 1.0)``): an actor config without it gets 1
        eta = float(loss_setting(config, "sppo_eta"))
    except AttributeError:
        eta = 1.0
    mask = response_mask.bool()
    log_ratio = masked_sum(log_prob - old_log_prob, mask, axis=-1)
    centred = masked_mean(advantages, mask, axis=-1)
    target = eta * centred
    seq_loss = (log_ratio - target) ** 2
    if rollout_is_weights is not None:  # a sequence-level weight: the mean of the row's token weights
        seq_loss = seq_loss * masked_mean(rollout_is_weights.detach(), mask, axis=-1)
    has_tokens = mask.any(dim=-1)
    seq_loss = torch.where(has_tokens, seq_loss, torch.zeros_like(seq_loss))
    kwargs = agg_kwargs(config)
    n_seq = kwargs.get("global_batch_size")
    n_seq = has_tokens.sum() if n_seq is None else n_seq
    loss = seq_loss.sum() / max(float(n_seq), 1.0) * kwargs.get("dp_size", 1)
    with torch.no_grad():
        rows = has_tokens.float().sum().clamp(min=1.0)
        metrics = {
            "actor/sppo_log_ratio": (torch.where(has_tokens, log_ratio, 0.0).sum() / rows).detach(),
            "actor/sppo_target": (torch.where(has_tokens, target, 0.0).sum() / rows).detach(),
            "actor/ppo_kl": masked_mean(old_log_prob - log_prob, mask).detach(),
        }
    return loss, metrics
