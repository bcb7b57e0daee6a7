"""PRIME: implicit process rewards from a reward model trained online on outcome labels (Cui et al. 2025,
arXiv:2502.01456), as verl-recipe's ``prime`` computes them.

The implicit PRM is a causal LM π_φ (initialised from the policy) beside a frozen reference π_ref.  Its reward of
response token t is the scaled log-ratio (PRIME eq. 3)::

    q_t = log π_φ(y_t | x, y_<t) − log π_ref(y_t | x, y_<t)       r_t = β_train · q_t

and its outcome estimate of a whole response is σ(β_train · Σ_t q_t).  π_φ is trained online on the outcome
labels (``acc`` ∈ [0, 1], from the rule verifier) with binary cross-entropy (PRIME eq. 4, verl-recipe's ``ce``)::

    L_CE(φ) = BCE( σ(β_train · Σ_t q_t),  acc )

The policy's advantage combines two reward sources, each with its own leave-one-out baseline over the ``n``
samples of a prompt (PRIME §3.3, "RLOO with implicit process rewards"), then sums them with their coefficients
(``algorithm.reward_dpo_coef``, ``algorithm.reward_gt_coef``), takes returns-to-go (γ = 1) and whitens them over the
batch's valid tokens.  For a token-level source r (the PRM's r_t on every valid token; the outcome label on the
last valid token only), with m_j the mean of row j's valid entries and n the group size::

    r'_t = r_t · n/(n−1) − (Σ_{j in group} m_j)/(n−1)

(for the one-entry outcome source this is the plain RLOO advantage R_i − mean_{j≠i} R_j).

``prime_granularity=token`` gives every valid token its r_t; ``whole`` puts Σ_t r_t on the last valid token.
``prime_norm=batch_norm`` divides all process rewards by the largest absolute return-to-go in the batch.
"""

from __future__ import annotations

from typing import Any

import torch

from .masked import masked_sum, masked_whiten
from .outcome_advantages import group_ids
from .registries import register_adv_est

__all__ = ["PRIME_GRANULARITIES", "PRIME_NORMS", "implicit_process_rewards", "prime_norm", "compute_ce_dpo_loss_rm",
           "masked_rloo", "last_token_mask", "compute_prime_advantage", "compute_dpo_accuracy"]

PRIME_GRANULARITIES = ("token", "whole")
PRIME_NORMS = ("batch_norm", "none")


def implicit_process_rewards(rm_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, response_mask: torch.Tensor,
                             beta: float, granularity: str = "token") -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_level_rewards, q)``, both (B, R): r_t = β·q_t on valid tokens (``token``), or Σ_t r_t on the last
    valid token (``whole``); q = log π_φ − log π_ref, zero on padding."""
    if granularity not in PRIME_GRANULARITIES:
        raise ValueError(f"reward_model.prime_granularity={granularity!r}: choose one of "
                         f"{', '.join(PRIME_GRANULARITIES)}")
    mask = response_mask.bool()
    q = torch.where(mask, rm_log_prob - ref_log_prob, torch.zeros_like(rm_log_prob))
    r = beta * q
    if granularity == "token":
        return r, q
    last = last_token_mask(response_mask)
    out = torch.zeros_like(r).masked_scatter(last, r.sum(dim=-1)[last.any(dim=1)])
    return out, q


def prime_norm(token_rewards: torch.Tensor, mode: str) -> torch.Tensor:
    """``batch_norm``: divide by the largest |return-to-go| of the batch (+1e-6); ``none``: unchanged."""
    if mode == "none":
        return token_rewards
    if mode != "batch_norm":
        raise ValueError(f"reward_model.prime_norm={mode!r}: choose one of {', '.join(PRIME_NORMS)}")
    to_go = torch.flip(torch.cumsum(torch.flip(token_rewards, dims=[1]), dim=-1), dims=[1])
    return token_rewards / (to_go.abs().max() + 1e-6)


def compute_ce_dpo_loss_rm(q: torch.Tensor, acc: torch.Tensor, response_mask: torch.Tensor, beta: float,
                           reduction: str = "mean") -> torch.Tensor:
    """BCE between the PRM's outcome estimate σ(β·Σ_t q_t) and the label ``acc`` (B,) in [0, 1]."""
    logits = beta * masked_sum(q, response_mask, axis=-1)
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, acc.to(logits.dtype), reduction=reduction)


def last_token_mask(response_mask: torch.Tensor) -> torch.Tensor:
    """(B, R) bool: True at each row's last valid response token (nothing for a row without one)."""
    mask = response_mask.bool()
    last = mask.shape[1] - 1 - torch.flip(mask, dims=[1]).long().argmax(dim=1)
    out = torch.zeros_like(mask)
    rows = torch.arange(mask.shape[0], device=mask.device)
    out[rows, last] = mask.any(dim=1)
    return out


def masked_rloo(rewards: torch.Tensor, mask: torch.Tensor, index: Any) -> torch.Tensor:
    """Leave-one-out centring of a token-level reward source within each prompt's group (module docstring).

    Entries outside ``mask`` are 0.  A group of one sample keeps its rewards unchanged."""
    mask = mask.bool()
    out = torch.where(mask, rewards, torch.zeros_like(rewards))
    counts = mask.float().sum(dim=-1)
    row_means = out.sum(dim=-1) / counts.clamp(min=1.0)
    ids, num_groups = group_ids(index, rewards.shape[0], rewards.device)
    group_size = torch.zeros(num_groups, device=rewards.device).index_add_(0, ids, torch.ones_like(row_means))[ids]
    group_sum = torch.zeros(num_groups, device=rewards.device, dtype=row_means.dtype).index_add_(0, ids, row_means)[ids]
    n = group_size.unsqueeze(-1)
    centred = out * n / (n - 1).clamp(min=1.0) - (group_sum / (group_size - 1).clamp(min=1.0)).unsqueeze(-1)
    centred = torch.where(n > 1, centred, out)
    return torch.where(mask, centred, torch.zeros_like(centred))


@register_adv_est("prime")
@torch.no_grad()
def compute_prime_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    config: Any = None,
    process_rewards: torch.Tensor | None = None,
    acc: torch.Tensor | None = None,
    token_level_scores: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PRIME's advantage (module docstring): ``reward_dpo_coef``·RLOO(process rewards ``process_rewards``) +
    ``reward_gt_coef``·RLOO(outcome ``acc`` on the last token), plus any per-token term the reward stage added on
    top of the scores (the KL penalty of ``algorithm.use_kl_in_reward``: ``token_level_rewards −
    token_level_scores``); returns-to-go, then whitened over the valid tokens."""
    dpo_coef = float(getattr(config, "reward_dpo_coef", 5.0)) if config is not None else 5.0
    gt_coef = float(getattr(config, "reward_gt_coef", 5.0)) if config is not None else 5.0
    mask = response_mask.bool()
    total = torch.zeros_like(token_level_rewards, dtype=torch.float32)
    if process_rewards is not None and dpo_coef != 0.0:
        total = total + dpo_coef * masked_rloo(process_rewards.float(), mask, index)
    if acc is not None and gt_coef != 0.0:
        last = last_token_mask(response_mask)
        outcome = torch.zeros_like(total).masked_scatter(last, acc.float()[last.any(dim=1)])
        total = total + gt_coef * masked_rloo(outcome, last, index)
    if process_rewards is None and acc is None:
        raise ValueError("advantage estimator 'prime' needs 'process_rewards' (the implicit PRM's rewards) or 'acc' (the "
                         "outcome labels) in the batch: run it with the PRIME recipe (hybridflow.recipe.prime)")
    if token_level_scores is not None:  # the KL penalty (or any shaping) the reward stage put on top of the scores
        total = total + (token_level_rewards - token_level_scores).float()
    total = torch.where(mask, total, torch.zeros_like(total))
    returns = torch.flip(torch.cumsum(torch.flip(total, dims=[1]), dim=-1), dims=[1])
    advantages = torch.where(mask, masked_whiten(returns, mask), torch.zeros_like(returns))
    return advantages, returns


def compute_dpo_accuracy(token_rewards: torch.Tensor, acc: torch.Tensor, response_mask: torch.Tensor,
                         index: Any) -> torch.Tensor:
    """How often the PRM orders two samples of a prompt as their labels do, weighted by the label gap; 0.5 for a
    group whose labels are all equal (verl-recipe's ``reward_model/dpo_acc``)."""
    scores = masked_sum(token_rewards, response_mask, axis=-1)
    ids, num_groups = group_ids(index, scores.shape[0], scores.device)
    accs = []
    for g in range(num_groups):
        rows = torch.nonzero(ids == g).flatten()
        s, a = scores[rows], acc[rows].float()
        iu = torch.triu_indices(len(rows), len(rows), offset=1)
        ds = (s.unsqueeze(1) - s.unsqueeze(0))[iu[0], iu[1]]
        da = (a.unsqueeze(1) - a.unsqueeze(0))[iu[0], iu[1]]
        weight = da.abs().sum()
        accs.append(torch.tensor(0.5) if weight == 0 else (((ds > 0) == (da > 0)).float() * da.abs()).sum() / weight)
    return torch.stack(accs).mean()
