"""Policy-gradient losses (``actor.policy_loss.loss_mode``).

Shared signature (verl's)::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
       config=None, rollout_is_weights=None) -> (loss, metrics)

All tensors are (B, R).  ``config`` is the actor config read by attribute (``None`` = verl defaults),
optionally wrapped by :func:`.loss_config.with_global_batch_info` to carry the global normalisers.
``rollout_is_weights`` (truncated importance weights for the train/rollout mismatch) multiply the
per-token loss before aggregation.  ``metrics`` holds detached 0-dim tensors: ``actor/pg_clipfrac``,
``actor/ppo_kl`` (masked mean of log π_old − log π) and ``actor/pg_clipfrac_lower``; the engine
averages them over micro-batches (one host sync per step instead of one per micro-batch).

r_t = exp(clamp(log π − log π_old, −20, 20)) is the token importance ratio throughout.
Clip-Cov / KL-Cov are in :mod:`.cov_losses`.
"""

from __future__ import annotations

from typing import Any

import torch

from .aggregation import agg_loss
from .loss_config import agg_kwargs, clip_range, loss_setting
from .masked import masked_mean
from .registries import register_policy_loss

__all__ = [
    "compute_policy_loss_vanilla",
    "compute_policy_loss_gspo",
    "compute_policy_loss_gpg",
    "compute_policy_loss_cispo",
    "compute_policy_loss_sapo",
    "compute_policy_loss_geo_mean",
    "finish_policy_loss",
    "ppo_metrics",
]

Metrics = dict[str, torch.Tensor]


def _log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    return (log_prob - old_log_prob).clamp(min=-20.0, max=20.0)


def ppo_metrics(clipfrac, ppo_kl, clipfrac_lower, like: torch.Tensor) -> Metrics:
    """The three standard metrics as detached 0-dim tensors (floats become tensors on ``like``'s device)."""

    def as_tensor(x):
        return x.detach().reshape(()) if isinstance(x, torch.Tensor) else torch.tensor(float(x), device=like.device)

    return {
        "actor/pg_clipfrac": as_tensor(clipfrac),
        "actor/ppo_kl": as_tensor(ppo_kl),
        "actor/pg_clipfrac_lower": as_tensor(clipfrac_lower),
    }


def finish_policy_loss(
    pg_losses: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: torch.Tensor | None,
) -> torch.Tensor:
    """Apply rollout IS weights and aggregate with the normalisers carried by ``config``."""
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights.detach()
    return agg_loss(pg_losses, response_mask, loss_agg_mode, **agg_kwargs(config))


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv 1707.06347) with clip-higher and dual-clip.

    L = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)); for A < 0 additionally L = min(L, −A·c) with
    c = ``clip_ratio_c`` (dual-clip PPO, Ye et al. 2019, arXiv 1912.09729) so a huge ratio on a bad
    token cannot produce an unbounded loss.  Asymmetric ε_low/ε_high is DAPO's clip-higher
    (arXiv 2503.14476; paper values 0.2/0.28).
    """
    eps_low, eps_high = clip_range(config)
    clip_c = loss_setting(config, "clip_ratio_c")
    if clip_c <= 1.0:
        raise ValueError(f"actor.clip_ratio_c (dual-clip bound) must be > 1.0, got {clip_c}")
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual_bound = -advantages * clip_c
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(loss_ppo, loss_dual_bound), loss_ppo)
    loss = finish_policy_loss(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    with torch.no_grad():
        metrics = ppo_metrics(
            masked_mean((loss_clipped > loss_unclipped).to(ratio.dtype), response_mask),
            masked_mean(-log_ratio, response_mask),
            masked_mean(((loss_ppo > loss_dual_bound) & negative).to(ratio.dtype), response_mask),
            like=loss,
        )
    return loss, metrics


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """GSPO, token form (Zheng et al. 2025, arXiv 2507.18071, eq. for GSPO-token).

    Sequence ratio s_i = exp(mean_t(log π − log π_old)); token ratio
    s_{i,t} = sg(s_i)·π(y_t)/sg(π(y_t)), i.e. log s_{i,t} = sg(log s_i) + log π − sg(log π), clamped
    at 10; then the PPO clip on s_{i,t} (no dual clip).  The value equals the sequence-level objective
    and the gradient is per token.  Aggregation is always ``seq-mean-token-mean`` (the objective
    averages per sequence); ``loss_agg_mode`` is ignored.
    """
    eps_low, eps_high = clip_range(config)
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = masked_mean(log_ratio, response_mask, axis=-1)
    token_log_ratio = (seq_log_ratio.detach().unsqueeze(-1) + log_prob - log_prob.detach()).clamp(max=10.0)
    ratio = token_log_ratio.exp()
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    loss = finish_policy_loss(pg_losses, response_mask, "seq-mean-token-mean", config, rollout_is_weights)
    with torch.no_grad():
        metrics = ppo_metrics(
            masked_mean((loss_clipped > loss_unclipped).to(ratio.dtype), response_mask),
            masked_mean(-log_ratio, response_mask),
            0.0,
            like=loss,
        )
    return loss, metrics


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """GPG (Chu et al. 2025, arXiv 2504.02546): plain policy gradient L = −log π · A, no ratio, no clip."""
    pg_losses = -log_prob * advantages
    loss = finish_policy_loss(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    with torch.no_grad():
        kl = masked_mean(old_log_prob - log_prob, response_mask)
    return loss, ppo_metrics(0.0, kl, 0.0, like=loss)


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax-M1, arXiv 2506.13585, §3.1): clip the importance weight, not the update —
    L = −sg(clip(r, 1−ε_low, 1+ε_high))·A·log π, so every token keeps a gradient (no token is dropped
    by clipping) while its weight is bounded."""
    eps_low, eps_high = clip_range(config)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    pg_losses = -clipped.detach() * advantages * log_prob
    loss = finish_policy_loss(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    with torch.no_grad():
        metrics = ppo_metrics(
            masked_mean((ratio != clipped).to(ratio.dtype), response_mask),
            masked_mean(-log_ratio, response_mask),
            0.0,
            like=loss,
        )
    return loss, metrics


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """SAPO (Gao et al. 2025, arXiv 2511.20347): a smooth gate instead of the hard clip,
    f(r) = σ(τ(r − 1))·4/τ with τ = ``tau_pos`` for A > 0 and ``tau_neg`` otherwise; L = −f(r)·A.
    At r = 1 the gradient equals the plain policy gradient and it decays smoothly off-policy.
    Aggregation is always ``seq-mean-token-mean`` (as in verl); clip fractions are reported as 0."""
    tau_pos = float(loss_setting(config, "tau_pos"))
    tau_neg = float(loss_setting(config, "tau_neg"))
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"actor.tau_pos and actor.tau_neg must be > 0, got {tau_pos} and {tau_neg}")
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_losses = -gate * advantages
    loss = finish_policy_loss(pg_losses, response_mask, "seq-mean-token-mean", config, rollout_is_weights)
    with torch.no_grad():
        kl = masked_mean(-log_ratio, response_mask)
    return loss, ppo_metrics(0.0, kl, 0.0, like=loss)


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """GMPO (Zhao et al. 2025, arXiv 2507.20673): geometric-mean policy optimisation.

    The token log-ratio is clipped sign-aware to [−ε_low, ε_high] (for A > 0 only an increase is
    clipped, for A < 0 only a decrease), the sequence ratio is exp(mean_t clipped log-ratio), and
    L_i = −Ā_i·ratio_i with Ā_i the sequence's mean token advantage (sequence-level advantages).
    Sequences are averaged (over the global sequence count when given); ``loss_agg_mode`` is ignored.
    ``rollout_is_weights`` are averaged per sequence.
    """
    eps_low, eps_high = clip_range(config)
    mask = response_mask.bool()
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    clamped = log_ratio.clamp(-eps_low, eps_high)
    log_ratio_min = sign * torch.minimum(sign * log_ratio, sign * clamped)
    lengths = response_mask.to(log_ratio.dtype).sum(dim=-1)
    seq_ratio = (torch.where(mask, log_ratio_min, 0.0).sum(-1) / lengths.clamp(min=1.0)).exp()
    seq_adv = torch.where(mask, advantages, 0.0).sum(-1) / lengths.clamp(min=1.0)
    seq_losses = (-seq_adv * seq_ratio).unsqueeze(-1)
    seq_mask = (lengths > 0).unsqueeze(-1).to(response_mask.dtype)
    seq_weights = None
    if rollout_is_weights is not None:
        seq_weights = masked_mean(rollout_is_weights, response_mask, axis=-1).unsqueeze(-1)
    loss = finish_policy_loss(seq_losses, seq_mask, "seq-mean-token-sum", config, seq_weights)
    with torch.no_grad():
        was_clipped = (log_ratio != clamped).to(log_ratio.dtype)
        metrics = ppo_metrics(
            masked_mean(was_clipped * (advantages > 0), response_mask),
            masked_mean(-log_ratio, response_mask),
            masked_mean(was_clipped * (advantages < 0), response_mask),
            like=loss,
        )
    return loss, metrics
