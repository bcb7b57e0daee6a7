"""verl's bypass-mode policy loss (``algorithm.rollout_correction.bypass_mode=true``).

Bypass mode keeps two policies instead of three: the rollout's own log-probs μ stand in for π_old (no actor
forward pass before the update), and the correction of the train/rollout mismatch moves into the loss, where it
compares the policy being trained, π_θ, with μ on every micro-batch:

* the IS weights w = min(π_θ/μ, C) (token or sequence level, detached) and the rejection mask (tokens or
  sequences whose ratio leaves the trust band) come from
  :func:`.rollout_correction.compute_rollout_correction_weights` with π_θ in the role of π_old;
* ``loss_type=ppo_clip``: the PPO clipped objective with ratio r = π_θ/μ on the kept tokens.  The ratio already
  is the importance weight and the clip bounds it, so w is *not* multiplied in again (it is still reported);
* ``loss_type=reinforce``: L = −sg(w)·log π_θ·A on the kept tokens (Williams 1992 with truncated IS).

Rejected tokens still count in the mini-batch's token normaliser (it is counted before the forward pass that
decides the rejection), as in verl.  Metrics: the policy loss's own plus ``rollout_corr/*`` and ``actor/ppo_kl``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from .aggregation import agg_loss
from .loss_config import agg_kwargs
from .masked import masked_mean
from .policy_losses import compute_policy_loss_vanilla
from .rollout_correction import compute_rollout_correction_weights

__all__ = ["BYPASS_LOSS_TYPES", "BypassSettings", "compute_policy_loss_bypass_mode"]

BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")


@dataclass(frozen=True)
class BypassSettings:
    """``algorithm.rollout_correction`` as the loss reads it (picklable; travels in the batch's meta_info)."""

    loss_type: str = "ppo_clip"
    rollout_is: Optional[str] = None
    rollout_is_threshold: float | str = 2.0  # a number, or verl 0.9's "lower_upper" (IcePop)
    rollout_is_batch_normalize: bool = False
    rollout_rs: Optional[str] = None
    rollout_rs_threshold: Optional[float | str] = None

    @classmethod
    def from_config(cls, rc: Any) -> "BypassSettings":
        threshold = rc.rollout_is_threshold
        return cls(rc.loss_type, rc.rollout_is, threshold if isinstance(threshold, str) else float(threshold),
                   bool(rc.rollout_is_batch_normalize),
                   rc.rollout_rs, rc.rollout_rs_threshold)


def compute_policy_loss_bypass_mode(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    settings: BypassSettings,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Bypass-mode loss; ``rollout_log_prob`` is μ (the batch's ``old_log_probs`` in bypass mode), ``config`` the
    actor config with the mini-batch's global normalisers (see :mod:`.loss_config`)."""
    if settings.loss_type not in BYPASS_LOSS_TYPES:
        raise ValueError(f"algorithm.rollout_correction.loss_type={settings.loss_type!r}: choose one of "
                         f"{', '.join(BYPASS_LOSS_TYPES)}")
    with torch.no_grad():
        weights, mask, corr_metrics = compute_rollout_correction_weights(
            log_prob.detach(), rollout_log_prob, response_mask,
            rollout_is=settings.rollout_is, rollout_is_threshold=settings.rollout_is_threshold,
            rollout_rs=settings.rollout_rs, rollout_rs_threshold=settings.rollout_rs_threshold,
            rollout_is_batch_normalize=settings.rollout_is_batch_normalize,
        )
    mask = mask.to(response_mask.dtype)
    if settings.loss_type == "ppo_clip":
        loss, metrics = compute_policy_loss_vanilla(rollout_log_prob, log_prob, advantages, mask, loss_agg_mode,
                                                    config, rollout_is_weights=None)
        metrics = dict(metrics)
    else:
        pg_losses = -advantages * log_prob
        if weights is not None:
            pg_losses = pg_losses * weights.detach()
        loss = agg_loss(pg_losses, mask, loss_agg_mode, **agg_kwargs(config))
        with torch.no_grad():
            metrics = {"actor/ppo_kl": masked_mean(rollout_log_prob - log_prob.detach(), mask)}
    metrics.update(corr_metrics)
    return loss, metrics
