"""GDPO: group-decoupled normalisation of several reward components (``algorithm.adv_estimator=gdpo``; Liu et al.
2026, arXiv 2601.05242).

GRPO normalises the *sum* of a response's rewards within its group, so a component with a large spread (accuracy
0/1) drowns one with a small spread (a format bonus of 0.1).  GDPO normalises each component on its own first:

    A_k(i) = (r_k(i) - mean_group r_k) / (std_group r_k + eps)        (GRPO's outcome advantage, per component)
    A(i)   = whiten_batch( sum_k w_k A_k(i) )                         (masked over the batch's response tokens)

The components are the reward function's dict entries named by ``algorithm.gdpo_reward_keys`` (a scorer returning
``{"score": ..., "accuracy_reward": ..., "format_reward": ...}`` -- the reward managers put every entry into the
batch's non-tensor columns); ``algorithm.gdpo_reward_weights`` weighs them (equal when null).  Without keys (a
custom caller) the summed ``token_level_rewards`` is the one component.  ``norm_adv_by_std_in_grpo`` and
``epsilon`` mean what they mean for ``grpo``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .advantages import algo_setting
from .masked import masked_whiten
from .outcome_advantages import compute_grpo_outcome_advantage
from .registries import register_adv_est

__all__ = ["GDPOError", "compute_gdpo_outcome_advantage", "reward_components"]


class GDPOError(ValueError):
    """The batch or the settings do not give GDPO its reward components (the message names the key)."""


def reward_components(non_tensor_batch: dict[str, Any], keys: list[str], response_mask: torch.Tensor
                      ) -> list[torch.Tensor]:
    """Each component as a (B, R) reward on the row's last response token (what GRPO's outcome estimator sums)."""
    mask = response_mask.bool()
    rows = torch.arange(mask.shape[0], device=mask.device)
    last = mask.shape[1] - 1 - torch.flip(mask, dims=[1]).long().argmax(dim=1)
    out = []
    for key in keys:
        if key not in non_tensor_batch:
            raise GDPOError(f"algorithm.gdpo_reward_keys names '{key}', which the reward function did not return "
                            f"(the batch has {sorted(non_tensor_batch)}): return a dict with '{key}' from the "
                            "reward function, or list the keys it returns")
        try:
            values = torch.tensor(np.asarray(non_tensor_batch[key], dtype=np.float32), device=mask.device)
        except (TypeError, ValueError):
            raise GDPOError(f"algorithm.gdpo_reward_keys: the reward component '{key}' holds non-numbers "
                            f"({list(non_tensor_batch[key])[:3]}...); each row needs a number") from None
        component = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        component[rows, last] = values
        out.append(torch.where(mask, component, 0.0))
    return out


def _weights(config: Any, count: int) -> list[float]:
    weights = algo_setting(config, "gdpo_reward_weights")
    if weights is None:
        return [1.0] * count
    weights = [float(w) for w in weights]
    if len(weights) != count:
        raise GDPOError(f"algorithm.gdpo_reward_weights has {len(weights)} entries for {count} "
                        "algorithm.gdpo_reward_keys: give one weight per key (or null for equal weights)")
    return weights


@register_adv_est("gdpo")
@torch.no_grad()
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    non_tensor_batch: dict[str, Any] | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-component GRPO advantages, weighted, summed and whitened over the batch's response tokens."""
    keys = algo_setting(config, "gdpo_reward_keys")
    if keys:
        components = reward_components(non_tensor_batch or {}, list(keys), response_mask)
    else:
        components = [token_level_rewards]
    total = torch.zeros_like(token_level_rewards, dtype=torch.float32)
    for weight, component in zip(_weights(config, len(components)), components):
        adv, _ = compute_grpo_outcome_advantage(component, response_mask, index, epsilon, norm_adv_by_std_in_grpo,
                                                config)
        total = total + weight * adv
    advantages = masked_whiten(total, response_mask) * response_mask
    return advantages, advantages
