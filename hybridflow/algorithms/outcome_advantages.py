"""Outcome-reward advantage estimators that compare the responses of one prompt (a *group*).

R_i = Σ_t token_level_rewards[i, t] is response i's score; its group is the set of rows sharing its
``index`` (the ``uid`` the trainer gives the ``rollout.n`` samples of a prompt).  Each estimator turns
the group's scores into one scalar advantage per response, broadcast over its valid tokens.  The
calling convention is the one described in :mod:`.advantages`; returns equal the advantages.
Positional parameter orders follow verl's functions, so ``epsilon`` is accepted wherever verl accepts
it, even by estimators whose formula does not use it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .advantages import algo_setting
from .masked import masked_whiten
from .registries import AdvantageEstimator, register_adv_est

__all__ = [
    "group_ids",
    "group_mean_std",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_gpg_outcome_advantage",
]


def group_ids(index: Any, batch_size: int, device: torch.device | None = None) -> tuple[torch.Tensor, int]:
    """Map arbitrary hashable group labels to dense ids 0..G−1 (in order of first appearance)."""
    if index is None:
        raise ValueError("group advantage estimators need 'index' (the per-row group id, non-tensor key 'uid')")
    labels = index.tolist() if isinstance(index, (np.ndarray, torch.Tensor)) else list(index)
    if len(labels) != batch_size:
        raise ValueError(f"index has {len(labels)} entries but the batch has {batch_size} rows")
    dense: dict[Any, int] = {}
    ids = [dense.setdefault(label, len(dense)) for label in labels]
    return torch.tensor(ids, dtype=torch.long, device=device), len(dense)


def group_mean_std(scores: torch.Tensor, ids: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, ...]:
    """Per-row group mean, unbiased group std and group size; a singleton group gets mean 0, std 1 (verl)."""
    counts = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device).index_add_(0, ids, torch.ones_like(scores))
    sums = torch.zeros_like(counts).index_add_(0, ids, scores)
    mean = sums / counts
    sq_dev = torch.zeros_like(counts).index_add_(0, ids, (scores - mean[ids]) ** 2)
    std = torch.sqrt(sq_dev / (counts - 1).clamp(min=1.0))
    single = counts == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[ids], std[ids], counts[ids]


def _scores_and_groups(token_level_rewards, response_mask, index):
    scores = torch.where(response_mask.bool(), token_level_rewards, 0.0).sum(dim=-1)
    ids, num_groups = group_ids(index, scores.shape[0], scores.device)
    return scores, ids, num_groups


def _broadcast(adv: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.where(response_mask.bool(), adv.unsqueeze(-1), 0.0)
    return out, out


@register_adv_est(AdvantageEstimator.GRPO)
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, §4.1.2): A_i = (R_i − mean_g)/(std_g + ε)
    with the unbiased group std and ε = 1e-6.  ``norm_adv_by_std_in_grpo=False`` gives Dr.GRPO
    (Liu et al. 2025, arXiv 2503.20783): A_i = R_i − mean_g, which removes the difficulty bias."""
    if norm_adv_by_std_in_grpo is None:
        norm_adv_by_std_in_grpo = algo_setting(config, "norm_adv_by_std_in_grpo")
    scores, ids, num_groups = _scores_and_groups(token_level_rewards, response_mask, index)
    mean, std, _ = group_mean_std(scores, ids, num_groups)
    adv = scores - mean
    if norm_adv_by_std_in_grpo:
        adv = adv / (std + epsilon)
    return _broadcast(adv, response_mask)


@register_adv_est(AdvantageEstimator.GRPO_PASSK)
@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k training (Chen et al. 2025, arXiv 2503.19595): only the best response of each group is
    credited, A = R_max − R_second (÷ (std_g + ε) when ``norm_adv_by_std_in_grpo``); all others get 0.
    Ties go to the first row.  Needs ≥ 2 responses per group."""
    norm = algo_setting(config, "norm_adv_by_std_in_grpo") if norm_adv_by_std_in_grpo is None else norm_adv_by_std_in_grpo
    scores, ids, num_groups = _scores_and_groups(token_level_rewards, response_mask, index)
    _, std, counts = group_mean_std(scores, ids, num_groups)
    if bool((counts < 2).any()):
        raise ValueError("grpo_passk needs at least 2 responses per prompt; set actor_rollout_ref.rollout.n >= 2")
    adv = torch.zeros_like(scores)
    for g in range(num_groups):
        rows = torch.nonzero(ids == g).flatten()
        top = torch.topk(scores[rows], 2, sorted=True)
        best = rows[int(torch.argmax(scores[rows]))]  # argmax returns the first maximal row
        gap = top.values[0] - top.values[1]
        adv[best] = gap / (std[best] + epsilon) if norm else gap
    return _broadcast(adv, response_mask)


@register_adv_est(AdvantageEstimator.RLOO)
@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024, arXiv 2402.14740; Kool et al. 2019): leave-one-out baseline
    A_i = R_i − mean_{j≠i} R_j = n/(n−1)·(R_i − mean_g); a singleton keeps A_i = R_i."""
    scores, ids, num_groups = _scores_and_groups(token_level_rewards, response_mask, index)
    mean, _, counts = group_mean_std(scores, ids, num_groups)
    adv = torch.where(counts > 1, (scores - mean) * counts / (counts - 1).clamp(min=1.0), scores)
    return _broadcast(adv, response_mask)


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline (Hu 2025, arXiv 2501.03262): subtract the group mean (singleton: 0), broadcast
    over tokens, then whiten over the whole batch: A = masked_whiten(R_i − mean_g)·m."""
    scores, ids, num_groups = _scores_and_groups(token_level_rewards, response_mask, index)
    mean, _, _ = group_mean_std(scores, ids, num_groups)
    centred, _ = _broadcast(scores - mean, response_mask)
    adv = torch.where(response_mask.bool(), masked_whiten(centred, response_mask), 0.0)
    return adv, adv


@register_adv_est(AdvantageEstimator.OPO)
@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (Hao et al. 2025, arXiv 2505.23585), the optimal baseline for on-policy outcome rewards:
    A_i = R_i − Σ_j |o_j|·R_j / Σ_j |o_j| (length-weighted group mean); a singleton's baseline is 0."""
    scores, ids, num_groups = _scores_and_groups(token_level_rewards, response_mask, index)
    lengths = response_mask.to(scores.dtype).sum(dim=-1)
    weighted = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device).index_add_(0, ids, lengths * scores)
    total_len = torch.zeros_like(weighted).index_add_(0, ids, lengths)
    counts = torch.zeros_like(weighted).index_add_(0, ids, torch.ones_like(scores))
    baseline = torch.where(counts > 1, weighted / total_len.clamp(min=1.0), torch.zeros_like(weighted))
    return _broadcast(scores - baseline[ids], response_mask)


@register_adv_est(AdvantageEstimator.GPG)
@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float | None = None,
    config: Any = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (Chu et al. 2025, arXiv 2504.02546): A_i = α·(R_i − mean_g)/F_norm with α = B / #{i: R_i ≠ 0}
    (batch-level correction for groups that give no signal) and F_norm = 1; singleton mean 0.
    Pairs with the ``gpg`` policy loss.  ``alpha`` is accepted for verl's signature but, as there,
    always recomputed from the batch."""
    scores, ids, num_groups = _scores_and_groups(token_level_rewards, response_mask, index)
    mean, _, _ = group_mean_std(scores, ids, num_groups)
    alpha = scores.shape[0] / max(int(torch.count_nonzero(scores)), 1)
    return _broadcast(alpha * (scores - mean) / f_norm, response_mask)
