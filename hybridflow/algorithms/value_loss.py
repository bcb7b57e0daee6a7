"""Clipped value-function loss for the PPO critic."""

from __future__ import annotations

import torch

from .aggregation import agg_loss
from .masked import masked_mean

__all__ = ["compute_value_loss"]


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    **normalizers,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO value loss with value clipping (Schulman et al. 2017, arXiv 1707.06347; the clipped form of
    OpenAI baselines' ppo2):

        V_clip = clip(V, V_old − c, V_old + c)
        loss   = ½ · agg( max((V − R)², (V_clip − R)²) )

    ``values`` are the critic's values at rollout time (V_old), ``vpreds`` the current prediction,
    c = ``critic.cliprange_value``.  ``normalizers`` are :func:`.aggregation.agg_loss`'s keyword
    arguments (``global_token_num``, ``global_batch_size``, ``loss_scale_factor``, ``dp_size``).
    Returns ``(vf_loss, vf_clipfrac)``; ``vf_clipfrac`` (metric ``critic/vf_clipfrac``) is the share
    of tokens where the clipped error was the larger one.
    """
    if cliprange_value < 0:
        raise ValueError(f"critic.cliprange_value must be >= 0, got {cliprange_value}")
    clipped = values + (vpreds - values).clamp(-cliprange_value, cliprange_value)
    err_unclipped = (vpreds - returns).square()
    err_clipped = (clipped - returns).square()
    losses = torch.maximum(err_unclipped, err_clipped)
    vf_loss = 0.5 * agg_loss(losses, response_mask, loss_agg_mode, **normalizers)
    with torch.no_grad():
        vf_clipfrac = masked_mean((err_clipped > err_unclipped).to(losses.dtype), response_mask)
    return vf_loss, vf_clipfrac
